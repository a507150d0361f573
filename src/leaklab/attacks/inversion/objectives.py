"""Gradient-matching objectives: ``-log p(g | x)`` up to constants (seed 001, section 4, Table 1).

Each objective maps the simulated per-instance updates and the observed ones (both tensors of shape
(R, *shape): instance ``r`` may target its own client update) to one loss per instance, shape (R,):

* ``l2``: the Gaussian conditional, DLG (Zhu et al., 2019): ``sum_l w_l ||g_l - o_l||^2``;
* ``l1``: the Laplacian conditional: ``sum_l w_l ||g_l - o_l||_1``;
* ``cosine``: Inverting Gradients (Geiping et al., 2020): ``1 - <g, o>_w / (||g||_w ||o||_w)``;
* ``bayes``: the exact negative log-likelihood of the defense in use (Gaussian, Laplacian, pruning
  mixtures, after clipping), the conditional of the Bayes-optimal adversary (eq. 2). Without a defense
  the update is exact and the Bayes objective is the sigma -> 0 limit of the Gaussian, i.e. ``l2``.

``w_l`` is the per-tensor layer weighting of Geiping et al.: ``none``, ``linear`` or ``exp``
(softmax of decreasing ranks, emphasising the first layers).
"""

from __future__ import annotations

import torch

from leaklab.defenses import DefenseChain
from leaklab.errors import LeaklabError
from leaklab.names import LAYER_WEIGHTING_NAMES, OBJECTIVE_NAMES


def layer_weights(count: int, weighting: str) -> list[float]:
    """Weights of the ``count`` parameter tensors, first layer first. ``exp`` is the softmax of the ranks, so its
    weights sum to 1: Geiping et al.'s (and seed 001's code) divide by the first weight instead, a constant factor
    (1 / 0.632 for many tensors) that relative prior weights cancel but an absolute prior weight does not."""
    if weighting == "none":
        return [1.0] * count
    ranks = torch.arange(count, 0, -1, dtype=torch.float64)
    if weighting == "linear":
        return (ranks / count).tolist()
    if weighting == "exp":
        return torch.softmax(ranks, 0).tolist()
    raise LeaklabError(f"unknown layer weighting {weighting!r}; choose one of {', '.join(LAYER_WEIGHTING_NAMES)}")


def _dense(shape: torch.Size, stride: tuple[int, ...]) -> bool:
    """Whether ``stride`` lays ``shape`` out densely without overlap (a permuted contiguous layout)."""
    expected = 1
    for size, step in sorted((p for p in zip(shape, stride) if p[0] != 1), key=lambda p: p[1]):
        if step != expected:
            return False
        expected *= size
    return True


def _instance_dims(g: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(2, g.ndim))


def _per_instance(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return v.view(*v.shape, *[1] * (g.ndim - 2))


class _DotAndSquare(torch.autograd.Function):
    """``(<g, o>, <g, g>)`` per instance of ``g`` (k, R, *shape) against ``o`` (R, *shape), summed as
    ``sum`` does (BLAS dot products are faster but lose four digits on long rows); one fused
    backward ``2 g d_square + o d_dot`` instead of autograd's five passes, written in ``g``'s memory
    layout (a channels-last update gets a channels-last gradient: no transposing copies)."""

    @staticmethod
    def forward(ctx, g, o):
        ctx.save_for_backward(g, o)
        dims = _instance_dims(g)
        return (g * o).sum(dims), (g * g).sum(dims)

    @staticmethod
    def backward(ctx, d_dot, d_square):
        g, o = ctx.saved_tensors
        grad = g * _per_instance(2 * d_square, g)
        return grad.addcmul_(o, _per_instance(d_dot, g)), None


class _SquaredDistance(torch.autograd.Function):
    """``||g - o||^2`` per instance of ``g`` (k, R, *shape) against ``o`` (R, *shape); backward
    ``2 (g - o) d``."""

    @staticmethod
    def forward(ctx, g, o):
        diff = g - o
        ctx.save_for_backward(diff)
        return (diff * diff).sum(_instance_dims(g))

    @staticmethod
    def backward(ctx, d_out):
        (diff,) = ctx.saved_tensors
        return diff * _per_instance(2 * d_out, diff), None


class Objective:
    """A data term comparing simulated updates with the observed one, one value per instance. ``weighting``: a
    layer weighting's name, or the weights themselves, one per observed tensor (those the whole update's weighting
    gives the tensors an attack keeps when it drops some: their positions, not their count, set their weights)."""

    def __init__(self, name: str, observed: list[torch.Tensor], defense: DefenseChain,
                 weighting: str | list[float] = "none"):
        if name not in OBJECTIVE_NAMES:
            raise LeaklabError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVE_NAMES)}")
        if name == "bayes" and defense.steps and not defense.has_density:
            raise LeaklabError(f"the bayes objective needs the defense's density; {defense.spec!r} has "
                               "none (use a chain ending in gaussian or laplace noise)")
        self.name = name
        self.observed = observed
        self.defense = defense
        if isinstance(weighting, str):
            self.weights = layer_weights(len(observed), "none" if name == "bayes" else weighting)
        elif len(weighting) == len(observed):
            self.weights = list(weighting)
        else:
            raise LeaklabError(f"{len(weighting)} layer weights for {len(observed)} observed tensors")
        self._observed_norm = torch.sqrt(sum(w * (o * o).flatten(1).sum(1)
                                             for w, o in zip(self.weights, observed)))
        self._relaid: dict[int, torch.Tensor] = {}

    def instance(self, j: int) -> "Objective":
        """The same data term for instance ``j`` alone."""
        return Objective(self.name, [o[j:j + 1] for o in self.observed], self.defense, self.weights)

    def _observed_like(self, i: int, g: torch.Tensor) -> torch.Tensor:
        """Observed tensor ``i`` in the memory layout of the simulated ``g`` (k, R, *shape), copied
        once: element-wise products of operands with different layouts are slower."""
        o = self.observed[i]
        layout = g.stride()[1:]
        if o.stride() == layout or not _dense(o.shape, layout):
            return o
        cached = self._relaid.get(i)
        if cached is None or cached.stride() != layout:
            cached = torch.empty_strided(o.shape, layout, dtype=o.dtype, device=o.device).copy_(o)
            self._relaid[i] = cached
        return cached

    def __call__(self, simulated: list[torch.Tensor]) -> torch.Tensor:
        """Losses of simulated updates of shape (k*R, *shape): k points per instance, instance-minor."""
        r = self.observed[0].shape[0]
        k = simulated[0].shape[0] // r
        sim = [g.view(k, r, *g.shape[1:]) for g in simulated]
        obs = [o.unsqueeze(0) for o in self.observed]
        w = self.weights
        total = lambda t: t.flatten(2).sum(2)  # noqa: E731  (k, R)
        if self.name == "l2" or (self.name == "bayes" and not self.defense.steps):
            out = sum(wi * _SquaredDistance.apply(g, self._observed_like(i, g))
                      for i, (wi, g) in enumerate(zip(w, sim)))
        elif self.name == "l1":
            out = sum(wi * total((g - o).abs()) for wi, g, o in zip(w, sim, obs))
        elif self.name == "cosine":
            parts = [_DotAndSquare.apply(g, self._observed_like(i, g)) for i, g in enumerate(sim)]
            dot = sum(wi * d for wi, (d, _) in zip(w, parts))
            norm = torch.sqrt(sum(wi * sq for wi, (_, sq) in zip(w, parts)))
            # 1 - cos, whatever the gradients' scale: a floor only where a norm is 0 (an added 1e-12 outweighed
            # updates of norm 1e-6, and an exact match scored 0.51)
            out = 1 - dot / (norm * self._observed_norm).clamp_min(torch.finfo(norm.dtype).tiny)
        else:
            out = torch.stack([torch.stack([-self.defense.log_prob([o[0, j] for o in obs], [g[i, j] for g in sim])
                                            for j in range(r)]) for i in range(k)])
        return out.reshape(-1)
