"""Exact recovery of a fully connected layer's input from its weight and bias gradients.

Phong et al. (2017), the attack seed 001's section 5 breaks PRECODE with (``--model precode``: its variational
bottleneck sits behind the first layer, whose gradient stays exact): for ``y = A x + b`` and one sample,
``dl/dA_i = (dl/db_i) x^T``, so every row with a non-zero bias gradient gives ``x`` exactly. We combine all
rows by least squares, ``x = sum_i (dl/db_i) dl/dA_i / sum_i (dl/db_i)^2``, in float64. The same rule
holds for a FedAvg delta of one local step (both sides are scaled by ``-lr``).
"""

from __future__ import annotations

import torch
from torch import nn

from leaklab.errors import LeaklabError, NoSignal
from leaklab.models import Normalize
from leaklab.threat import ClientUpdate, ServerView


def linear_input(weight_grad: torch.Tensor, bias_grad: torch.Tensor) -> torch.Tensor:
    """The input of a linear layer from its gradients (one sample), float64, shape (in_features,)."""
    w, b = weight_grad.double(), bias_grad.double()
    denom = (b * b).sum()
    if denom <= 0:
        raise NoSignal("the bias gradient is all zero; the layer's input cannot be recovered")
    return (b @ w) / denom


def rank_one_residual(weight_grad: torch.Tensor, bias_grad: torch.Tensor) -> float:
    """``||dW − db h^T|| / ||dW||`` for the input ``h`` of :func:`linear_input`: 0 up to rounding when
    the gradients are one sample's, untouched (2.5e-8 for float32 room updates); noise, a batch or a
    lossy defense lifts it (Gaussian noise of σ = 1e-7 on room updates: 9e-6 and more)."""
    w, b = weight_grad.double(), bias_grad.double()
    h = linear_input(w, b)
    return float(torch.linalg.vector_norm(w - b[:, None] * h[None]) / torch.linalg.vector_norm(w).clamp_min(1e-300))


def first_linear_on_input(model: nn.Module) -> tuple[str, nn.Linear, Normalize | None]:
    """The first parameterised layer if it is fully connected on the (normalised, flattened) input."""
    normalize = None
    for name, module in model.named_modules():
        if isinstance(module, Normalize):
            normalize = module
        elif isinstance(module, nn.Linear):
            return name, module, normalize
        elif any(p.requires_grad for p in module.parameters(recurse=False)):
            break
    raise LeaklabError("analytic recovery needs a model whose first layer is fully connected "
                       "(use --model mlp or precode)")


def recover_input(view: ServerView, update: ClientUpdate) -> torch.Tensor:
    """The client's image, exactly, from the first linear layer's update; shape (1, C, H, W), [0, 1]."""
    meta = update.metadata
    if view.batch_size != 1 or (meta.kind == "fedavg" and meta.local_steps != 1):
        raise LeaklabError(f"analytic recovery is exact for one image and one step; this update has "
                           f"batch size {meta.batch_size} and {meta.local_steps} step(s)")
    name, layer, normalize = first_linear_on_input(view.model)
    flat = linear_input(update.tensors[f"{name}.weight"], update.tensors[f"{name}.bias"])
    c, s = view.spec.in_channels, view.spec.image_size
    if flat.numel() != c * s * s:
        raise LeaklabError("the first linear layer does not take the flattened image as input")
    image = flat.view(1, c, s, s)
    if normalize is not None:
        image = image * normalize.std.double() + normalize.mean.double()
    return image
