"""Metrics on vectors: boxes, scalar predictions, gradients."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable

import torch


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of ``images`` whose most probable class under ``model`` (put in eval mode) is their label."""
    model.eval()
    with torch.no_grad():
        return float((model(images).argmax(1) == labels).float().mean())


def box_iou(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Intersection over union of axis-aligned boxes ``(x1, y1, x2, y2)``, row by row, shape (N,).

    Coordinates may be in any common frame (seed 000 uses [-1, 1]); a degenerate union gives 0.
    """
    pred, truth = pred.double().reshape(-1, 4), truth.double().reshape(-1, 4)
    lo = torch.maximum(pred[:, :2], truth[:, :2])
    hi = torch.minimum(pred[:, 2:], truth[:, 2:])
    inter = (hi - lo).clamp_min(0).prod(1)
    area = lambda b: (b[:, 2:] - b[:, :2]).clamp_min(0).prod(1)  # noqa: E731
    union = area(pred) + area(truth) - inter
    return torch.where(union > 0, inter / union.clamp_min(1e-300), torch.zeros_like(union))


def percent_error(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Seed 000 section V's percentage error ``ε(x) = 100 * |x_rec - x| / |x|`` element-wise (infinite
    where the truth is 0 and the prediction is not, 0 where both are 0)."""
    pred, truth = pred.double(), truth.double()
    diff = (pred - truth).abs()
    return torch.where(diff == 0, torch.zeros_like(diff), 100 * diff / truth.abs())


def _flat(t: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """A tensor, or a list of tensors laid end to end, as one flat vector."""
    return torch.cat([x.reshape(-1) for x in t]) if isinstance(t, (list, tuple)) else t.reshape(-1)


def cosine_similarity(a: list[torch.Tensor] | torch.Tensor, b: list[torch.Tensor] | torch.Tensor) -> float:
    """Cosine similarity of two vectors, or of two lists of tensors seen as one vector each (in [-1, 1]: rounding
    gave 1.000000000000001)."""
    va, vb = _flat(a).double(), _flat(b).double()
    return float(((va @ vb) / (va.norm() * vb.norm()).clamp_min(1e-300)).clamp(-1.0, 1.0))


def update_cosine(true: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> float:
    """The cosine of a sent update with the true one, both as parameter name -> tensor (the same names):
    what a defense leaves of the update's direction; exactly 1 when every tensor was sent as it is (a clip that
    never reached its norm read 0.99999999999995)."""
    names = sorted(true)
    if all(sent[n] is true[n] or torch.equal(sent[n], true[n]) for n in names):
        return 1.0
    return cosine_similarity([true[n] for n in names], [sent[n] for n in names])


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the numbers among ``values`` (None where there are none), e.g. one defense's cosine
    over the attacks or scenarios that recorded one."""
    numbers = [v for v in values if v is not None]
    return statistics.median(numbers) if numbers else None


def finite_numbers(values: Iterable[float | None]) -> list[float]:
    """The finite numbers among ``values``: None (not recorded) and infinities or NaN left out, e.g. the
    relative error of an exactly zero target."""
    return [v for v in values if v is not None and math.isfinite(v)]


def mean_of(values: Iterable[float | None], weights: Iterable[float] | None = None) -> float | None:
    """The mean of :func:`finite_numbers` of ``values`` (None where there are none, or none weighs anything), each
    weighed by its entry of ``weights`` (default: equally), e.g. a batch update's means by its number of
    transitions (a NaN reconstruction's finite baseline covers none: every row such raised StatisticsError)."""
    pairs = [(v, w) for v, w in zip(values, itertools.repeat(1.0) if weights is None else weights)
             if v is not None and math.isfinite(v) and w > 0]
    return statistics.fmean([v for v, _ in pairs], [w for _, w in pairs]) if pairs else None
