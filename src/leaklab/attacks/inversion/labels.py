"""Label recovery from the last linear layer's update (the label step the attacks of seed 001 take
from the literature it cites: iDLG, Zhao et al. 2020; seed 004, section 4.2, eq. 5).

For cross-entropy the gradient of the last layer's weight row ``i`` is ``sum_n (p_ni - y_ni) h_n``
and of its bias ``sum_n (p_ni - y_ni)``. With non-negative features ``h`` (after ReLU or sigmoid) only
the rows of the true labels can hold a negative entry.

* batch 1, iDLG (Zhao et al., 2020): the label is the row with the most negative sum (exact);
* batch B, seed 004: every class whose row (its bias entry with it) holds a negative entry is present; a class
  twice leaves fewer than B, and the remaining slots repeat those classes, most negative row sum first. Where
  more than B rows hold one (noise, or features that go negative), the B of most negative row sum, or those
  whose sum is negative where fewer (the last-layer sign method, Wainakh et al., 2022, "LLG"). The row sum
  alone dropped present classes: another sample's large probability on a class, times its features, can
  outweigh the class's own sample (on 10 photo batches of 4, LeNet at initialisation: 2 of 37 present classes
  missed, 4 on ConvNet; the negative entries missed none).

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


def class_rows(model: nn.Module, update: ClientUpdate) -> torch.Tensor:
    """The last layer's gradient rows with their bias entries, shape (classes, features [+ 1]), float64, in the
    gradient's sign (a FedAvg delta's flipped)."""
    name, layer = last_linear(model)
    rows = update.tensors[f"{name}.weight"].double()
    if layer.bias is not None:
        rows = torch.cat([rows, update.tensors[f"{name}.bias"].double()[:, None]], 1)
    return -rows if update.metadata.kind == "fedavg" else rows


def recover_labels(model: nn.Module, update: ClientUpdate, batch_size: int) -> torch.Tensor:
    """Labels of the client's batch, sorted by class index (a batch has no intrinsic order)."""
    rows = class_rows(model, update)
    scores = rows.sum(1)
    order = [int(c) for c in torch.argsort(scores)]
    if batch_size == 1:
        return torch.tensor(order[:1], dtype=torch.long)
    present = [c for c in order if rows[c].min() < 0]
    if len(present) > batch_size:
        present = [c for c in order if scores[c] < 0][:batch_size]
    pool = present or order[:1]
    extra = [pool[i % len(pool)] for i in range(batch_size - len(present))]
    return torch.tensor(sorted(present + extra), dtype=torch.long)
