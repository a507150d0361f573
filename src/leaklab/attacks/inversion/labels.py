"""Label recovery from the last linear layer's update (the label step the attacks of seed 001 take
from the literature it cites: iDLG, Zhao et al. 2020).

For cross-entropy the gradient of the last layer's weight row ``i`` is ``sum_n (p_ni - y_ni) h_n``
and of its bias ``sum_n (p_ni - y_ni)``. With non-negative features ``h`` (after ReLU or sigmoid) only
the rows of the true labels can have a negative sum.

* batch 1, iDLG (Zhao et al., 2020): the label is the row with the most negative sum (exact);
* batch B, the last-layer sign method (Wainakh et al., 2022, "LLG"): every class whose row sum is
  negative is present; remaining slots repeat those classes, most negative first.

A FedAvg weight delta is ``-lr`` times a sum of gradients, so its sign is flipped before use.
"""

from __future__ import annotations

import torch
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.threat import ClientUpdate


def last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The name and module of the model's last fully connected layer."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not found:
        raise LeaklabError("label recovery needs a model whose output layer is fully connected")
    return found[-1]


def class_scores(model: nn.Module, update: ClientUpdate) -> torch.Tensor:
    """Per-class row sums of the last layer's gradient (plus its bias gradient), shape (classes,)."""
    name, layer = last_linear(model)
    weight = update.tensors[f"{name}.weight"].double()
    scores = weight.sum(1)
    if layer.bias is not None:
        scores = scores + update.tensors[f"{name}.bias"].double()
    return -scores if update.metadata.kind == "fedavg" else scores


def recover_labels(model: nn.Module, update: ClientUpdate, batch_size: int) -> torch.Tensor:
    """Labels of the client's batch, sorted by class index (a batch has no intrinsic order)."""
    scores = class_scores(model, update)
    order = torch.argsort(scores)
    if batch_size == 1:
        return order[:1]
    negatives = [int(c) for c in order if scores[c] < 0][:batch_size]
    pool = negatives or [int(order[0])]
    extra = [pool[i % len(pool)] for i in range(batch_size - len(negatives))]
    return torch.tensor(sorted(negatives + extra), dtype=torch.long)
