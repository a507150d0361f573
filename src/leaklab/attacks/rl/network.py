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


class GradientStats:
    """``(<g, G>, ||g||^2, ||G||^2)`` summed over the ``linear`` layers of a :class:`Trace` (and the
    convolutions when ``conv_params``) for the gradient ``g`` of a scalar surrogate, differentiable
    in the inputs; ``G`` is the client's gradient ``observed``. ``||G||^2`` is summed once per set of
    layers: recomputing it at every step cost 3 ms on one core for head.0's weight alone, six times
    the inner product with it."""

    def __init__(self, net: PerceptionNet, observed: dict[str, torch.Tensor], conv_params: bool):
        self.net, self.observed = net, observed
        self.names = conv_names(net) if conv_params else []
        self.convs = [p for _, p in net.conv.named_parameters()] if conv_params else []
        self._ref: dict[tuple[str, ...], torch.Tensor] = {}

    def _observed_norm(self, linear: list[tuple[str, torch.Tensor, torch.Tensor]], dtype: torch.dtype
                       ) -> torch.Tensor:
        key = tuple(name for name, _, _ in linear)
        if key not in self._ref:
            o = self.observed
            ref = torch.zeros((), dtype=torch.float64, device=o[f"{key[0]}.weight"].device)
            for name in self.names:  # summed in float64 on the device: no host sync
                g = o[f"conv.{name}"]
                ref = ref + (g * g).sum().double()
            for name in key:  # a user's Linear layer may have no bias
                ref = ref + sum((g * g).sum() for g in (o[f"{name}.weight"], o.get(f"{name}.bias")) if g is not None
                                ).double()
            self._ref[key] = ref.to(dtype)
        return self._ref[key]

    def __call__(self, surrogate: torch.Tensor, linear: list[tuple[str, torch.Tensor, torch.Tensor]]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grads = torch.autograd.grad(surrogate, self.convs + [z for _, _, z in linear], create_graph=True)
        dot = surrogate.new_zeros(())
        sq = surrogate.new_zeros(())
        for name, g in zip(self.names, grads[:len(self.convs)]):
            o = self.observed[f"conv.{name}"]
            dot, sq = dot + (g * o).sum(), sq + (g * g).sum()
        for (name, h, _), delta in zip(linear, grads[len(self.convs):]):
            dot = dot + ((delta @ self.observed[f"{name}.weight"]) * h).sum()
            sq = sq + ((delta @ delta.T) * (h @ h.T)).sum()
            gb = self.observed.get(f"{name}.bias")
            if gb is not None:  # a user's Linear layer may have none
                db = delta.sum(0)
                dot, sq = dot + (db * gb).sum(), sq + (db * db).sum()
        return dot, sq, self._observed_norm(linear, surrogate.dtype)


def cosine_loss(dot: torch.Tensor, sq: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Seed 000 eq. 5: ``1 - <g_rec, g> / (||g_rec|| ||g||)``."""
    return 1 - dot / (torch.sqrt(sq * ref) + 1e-30)


def squared_loss(dot: torch.Tensor, sq: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """DLG's ``||g_rec - g||^2`` from the same three sums."""
    return sq - 2 * dot + ref
