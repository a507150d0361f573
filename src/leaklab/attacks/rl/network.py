"""Simulated gradients of the perception network, without materialising rank-1 weight gradients.

For a Linear layer ``z = W h + b`` the gradient of any objective over a batch is
``dW = sum_b delta_b h_b^T`` and ``db = sum_b delta_b`` with ``delta_b = dJ/dz_b``. Its inner product
with an observed gradient ``G`` is ``sum_b delta_b^T G h_b`` and its squared norm
``sum_{b,b'} (delta_b . delta_b') (h_b . h_b')``: head.0's 256 x (F + 32) weight gradient (F = 7,200
or 14,400 conv features) is never formed.
Convolution weight gradients are small and come from autograd. Both feed the cosine loss of seed
000 eq. 5 and the squared-error loss of DLG (Table II).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from leaklab.models.perception import PerceptionNet


@dataclass
class Trace:
    """A forward pass that kept every Linear layer's input and output (for ``delta = dJ/dz``)."""

    out: torch.Tensor  # [B, A]
    linear: list[tuple[str, torch.Tensor, torch.Tensor]]  # (layer name, input h, output z)


def linear_names(net: PerceptionNet) -> list[str]:
    """Names of the Linear layers of the box branch and the head, in forward order."""
    return [f"{branch}.{i}" for branch in ("box", "head")
            for i, m in enumerate(getattr(net, branch)) if isinstance(m, nn.Linear)]


def conv_names(net: PerceptionNet) -> list[str]:
    return [n for n, _ in net.conv.named_parameters()]


def trace(net: PerceptionNet, features: torch.Tensor, box: torch.Tensor) -> Trace:
    """The network from the flattened convolutional ``features`` ``[B, F]`` and the ``box``."""
    linear: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def run(branch: str, x: torch.Tensor) -> torch.Tensor:
        for i, m in enumerate(getattr(net, branch)):
            y = m(x)
            if isinstance(m, nn.Linear):
                linear.append((f"{branch}.{i}", x, y))
            x = y
        return x

    out = run("head", torch.cat([features, run("box", box)], dim=1))
    return Trace(out=out, linear=linear)


def gradient_stats(net: PerceptionNet, observed: dict[str, torch.Tensor], surrogate: torch.Tensor,
                   linear: list[tuple[str, torch.Tensor, torch.Tensor]], conv_params: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(<g, G>, ||g||^2, ||G||^2)`` summed over the ``linear`` layers of a :class:`Trace` (and the
    convolutions when ``conv_params``) for the gradient ``g`` of the scalar ``surrogate``,
    differentiable in the inputs."""
    convs = [p for _, p in net.conv.named_parameters()] if conv_params else []
    names = conv_names(net) if conv_params else []
    grads = torch.autograd.grad(surrogate, convs + [z for _, _, z in linear], create_graph=True)
    dot = surrogate.new_zeros(())
    sq = surrogate.new_zeros(())
    ref = surrogate.new_zeros((), dtype=torch.float64)  # summed in float64 on the device: no host sync
    for name, g in zip(names, grads[:len(convs)]):
        o = observed[f"conv.{name}"]
        dot, sq, ref = dot + (g * o).sum(), sq + (g * g).sum(), ref + (o * o).sum().double()
    for (name, h, _), delta in zip(linear, grads[len(convs):]):
        gw, gb = observed[f"{name}.weight"], observed[f"{name}.bias"]
        db = delta.sum(0)
        dot = dot + ((delta @ gw) * h).sum() + (db * gb).sum()
        sq = sq + ((delta @ delta.T) * (h @ h.T)).sum() + (db * db).sum()
        ref = ref + ((gw * gw).sum() + (gb * gb).sum()).double()
    return dot, sq, ref.to(surrogate.dtype)


def cosine_loss(dot: torch.Tensor, sq: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Seed 000 eq. 5: ``1 - <g_rec, g> / (||g_rec|| ||g||)``."""
    return 1 - dot / (torch.sqrt(sq * ref) + 1e-30)


def squared_loss(dot: torch.Tensor, sq: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """DLG's ``||g_rec - g||^2`` from the same three sums."""
    return sq - 2 * dot + ref
