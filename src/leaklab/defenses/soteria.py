"""Soteria (Sun et al., 2021), one of the three heuristic defenses seed 001 breaks (section 5, appendix A.1).

Soteria perturbs the representation ``r`` a chosen fully connected layer ``l`` reads (eq. 4: the smallest change
of ``r`` that moves a reconstruction most). As the seed observes, to a server that sees neither ``r`` nor its
perturbation the defense is a change of one gradient, ``dW_l``, and the change Sun et al.'s code makes (the seed's
copy of it, ``defense_attacks/soteria``) is a pruning of its columns: for every feature ``f`` of ``r`` it scores

    s_f = sum over the batch's images x of ||d r_f / d x|| / (r_f + 0.1)

(a feature that moves little with the image but carries a large value reveals the image most), and zeroes the
columns of ``dW_l`` whose score lies under the ``rate`` quantile of all scores (linear interpolation, as NumPy's
``percentile``; the seed prunes 80%). Which layer: the seed's text defends ConvBig's largest linear layer
(``classifier.0``), its code the second (``classifier.2``, whose input is the first one's output). The other
layers' gradients, the bias of layer ``l`` included, leave the client unchanged: the seed's attack simply leaves
``dW_l`` out of its objective (:attr:`~leaklab.attacks.inversion.config.InversionConfig.drop`).

Scores are taken with the network as the client holds it (the seed's code: eval mode), with respect to the
normalised image the network's first layer reads (the seed's code differentiates ``(x - mean) / std``; the pixels'
gradient times each channel's std), one batched vector-Jacobian product per chunk of features.
"""

from __future__ import annotations

import torch
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.models.layers import Normalize
from leaklab.threat import ClientUpdate

SHIFT = 0.1  # added to r_f in the score's denominator (Sun et al.'s code)
_CHUNK_ELEMENTS = 1 << 24  # features per vector-Jacobian batch: chunk * images * pixels stays under this


def linear_layer(model: nn.Module, layer: str) -> nn.Linear:
    """The fully connected layer named ``layer`` in ``model``; a one-line error naming the choices otherwise."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if layer not in linears:
        raise LeaklabError(f"Soteria defends a fully connected layer: {layer!r} is not one of this network's "
                           f"({', '.join(linears) or 'it has none'})")
    return linears[layer]


def representation_scores(model: nn.Module, layer: str, images: torch.Tensor) -> torch.Tensor:
    """Soteria's score of each input feature of ``layer``, summed over ``images`` (B, C, H, W); shape (F,), float64."""
    target = linear_layer(model, layer)
    seen: list[torch.Tensor] = []
    hook = target.register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
    x = images.detach().clone().requires_grad_()
    try:
        with torch.enable_grad():
            model(x)
    finally:
        hook.remove()
    r = seen[0]
    b, f = r.shape
    normalize = next((m for m in model.modules() if isinstance(m, Normalize)), None)
    std = 1.0 if normalize is None else normalize.std.to(x.dtype)
    per_feature = max(1, _CHUNK_ELEMENTS // max(1, x.numel()))
    norms = []
    for start in range(0, f, per_feature):
        stop = min(f, start + per_feature)
        picks = torch.zeros(stop - start, b, f, dtype=r.dtype, device=r.device)
        picks[torch.arange(stop - start), :, torch.arange(start, stop)] = 1
        jac = torch.autograd.grad(r, x, grad_outputs=picks, is_grads_batched=True, retain_graph=stop < f)[0]
        norms.append((jac * std).flatten(2).norm(dim=2))  # (chunk, B): ||d r_f / d x_b||, x_b normalised
    norms_t = torch.cat(norms).double()  # (F, B)
    return (norms_t / (r.detach().double().T + SHIFT)).sum(1)


def soteria_mask(model: nn.Module, layer: str, images: torch.Tensor, rate: float) -> torch.Tensor:
    """Which of ``layer``'s weight-gradient columns Soteria keeps (bool, shape (F,)): those whose score is not under
    the ``rate`` quantile. A constant score keeps every column (as the seed's code: no score is under the quantile)."""
    if not 0 < rate < 1:
        raise LeaklabError(f"Soteria's pruning rate is a fraction in (0, 1), not {rate!r}")
    scores = representation_scores(model, layer, images)
    if not bool(torch.isfinite(scores).all()):
        raise LeaklabError(f"Soteria's scores for {layer!r} are not finite (a feature of -0.1 divides by 0): "
                           "defend another layer")
    return scores.abs() >= torch.quantile(scores, rate)


def apply_soteria(update: ClientUpdate, model: nn.Module, layer: str, images: torch.Tensor,
                  rate: float) -> ClientUpdate:
    """``update`` (a FedSGD gradient of ``images``) with Soteria's pruning of ``layer``'s weight gradient."""
    if update.metadata.kind != "fedsgd":
        raise LeaklabError("Soteria prunes a gradient: use --update fedsgd")
    keep = soteria_mask(model, layer, images, rate)
    name = f"{layer}.weight"
    tensors = dict(update.tensors)
    tensors[name] = tensors[name] * keep.to(tensors[name].dtype)
    return update.with_tensors(tensors, update.defense)
