"""The One Parameter Defense (OPD) of seed 002, chapter 6 (Ye, Shen, Zhu, Liu and Zhou, 2022): a private prediction
interface that changes the confidence vector a classifier returns, never its predicted class.

Phase 1 (Algorithm 12, section 6.3.2): with the scores sorted, ``y_1 <= ... <= y_k``, the range [0, 1) is cut into
``k`` sub-ranges at the midpoints of consecutive scores (``[0, (y_1+y_2)/2)``, ..., ``[(y_{k-1}+y_k)/2, 1)``); each is
discretised uniformly into ``m`` candidates ``lo_i + j rho_i`` (``rho_i = (hi_i - lo_i) / m``, the thesis' ``rho`` for
the inner sub-ranges), and the exponential mechanism picks ``y'_i`` among them with probability proportional to
``exp(eps u / (2 Delta_u))``, ``u = 1 / |y_i - candidate|`` (the thesis prints the candidates as ``(i-1)/k + (j-1)rho``,
a leftover of uniform sub-ranges: leaklab uses the candidates it draws from; a candidate equal to ``y_i`` has infinite
utility and is chosen). The sub-ranges are disjoint and ordered, so ``y'`` keeps the order of ``y`` (Lemma 6.4).

Phase 2 (eq. 6.2, section 6.3.3): ``z = softmax(eps y' / (2 Delta_u))``, order-preserving for ``eps > 0``
(Property 6.1): the argmax, hence accuracy, is unchanged (of tied top scores the first class keeps the top, as
``argmax`` reads it). ``Delta_u`` is 1 in the thesis (``sensitivity``); the
thesis' distortions for eps >= 0.7 (Table 6.2) match a smaller value (notes-002, section 5.6): it is the one knob.

Privacy (Theorem 6.1): each of the ``k`` draws is eps-DP, so a query costs ``k eps``; Theorem 6.3 bounds the queries
of one record under a total budget (:func:`query_bound`). ``eps*`` (section 6.4.2), the eps at which ``z = y``, is
overdetermined (one unknown, ``k`` equations): :func:`matching_eps` fits it by least squares.
"""

from __future__ import annotations

import math

import torch

from leaklab.errors import LeaklabError

MIN_GAP = 1e-12  # |y_i - candidate| floor in the utility: a candidate equal to y_i has (nearly) infinite utility


def _check(y: torch.Tensor) -> None:
    if y.ndim != 2 or y.shape[1] < 2 or not y.is_floating_point():
        raise LeaklabError("OPD takes confidence vectors as a float tensor (N, k) with k >= 2 classes")
    if not bool(torch.isfinite(y).all()) or bool((y < 0).any()) or bool((y > 1).any()):
        raise LeaklabError("OPD takes confidence scores in [0, 1] (softmax outputs)")


def _check_eps(eps: float, sensitivity: float) -> None:
    if not (eps > 0 and math.isfinite(eps)) or not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise LeaklabError(f"OPD needs eps > 0 and a sensitivity > 0, not eps {eps!r}, sensitivity {sensitivity!r}")


def divide_and_modify(y: torch.Tensor, eps: float, generator: torch.Generator, m: int = 5,
                      sensitivity: float = 1.0) -> torch.Tensor:
    """Phase 1 (Algorithm 12): ``y'`` for each row of ``y`` (N, k), in the classes' order, float64."""
    _check(y)
    _check_eps(eps, sensitivity)
    if not 1 <= m <= 10_000:
        raise LeaklabError(f"OPD's granularity m is a count of candidates from 1 to 10,000, not {m!r}")
    # ascending, a tie's lower class ranked higher (as argmax picks it): its class keeps the top of a tied pair
    k = y.shape[1]
    scores, flipped = torch.sort(y.double().flip(1), dim=1, stable=True)
    order = k - 1 - flipped
    mid = (scores[:, 1:] + scores[:, :-1]) / 2
    lo = torch.cat([torch.zeros_like(scores[:, :1]), mid], 1)
    hi = torch.cat([mid, torch.ones_like(scores[:, :1])], 1)
    steps = torch.arange(m, dtype=torch.float64, device=y.device)
    candidates = lo[..., None] + steps * ((hi - lo) / m)[..., None]  # (N, k, m)
    utility = 1 / (scores[..., None] - candidates).abs().clamp_min(MIN_GAP)
    logits = eps * utility / (2 * sensitivity)
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=generator.device)
    gumbel = -torch.log(-torch.log(uniform.to(y.device).clamp_min(torch.finfo(torch.float64).tiny)))
    picked = candidates.gather(2, (logits + gumbel).argmax(2, keepdim=True))[..., 0]  # exponential mechanism
    return torch.empty_like(picked).scatter_(1, order, picked)


def normalise(y_prime: torch.Tensor, eps: float, sensitivity: float = 1.0) -> torch.Tensor:
    """Phase 2 (eq. 6.1 with ``u = y'``): ``softmax(eps y' / (2 sensitivity))`` per row."""
    _check_eps(eps, sensitivity)
    return torch.softmax(eps * y_prime.double() / (2 * sensitivity), dim=1)


def one_parameter_defense(y: torch.Tensor, eps: float, generator: torch.Generator, m: int = 5,
                          sensitivity: float = 1.0) -> torch.Tensor:
    """What the private prediction interface returns for confidence vectors ``y`` (N, k): ``z``, float64."""
    return normalise(divide_and_modify(y, eps, generator, m, sensitivity), eps, sensitivity)


def query_bound(total_eps: float, eps: float, k: int) -> float:
    """Theorem 6.3: the queries of one record that keep the overall level ``total_eps`` when each costs ``k eps``:
    ``total_eps (e^total_eps - 1) / (k eps (e^(k eps) - 1))``."""
    if total_eps <= 0 or eps <= 0 or k < 1:
        raise LeaklabError("the query bound needs a total eps > 0, eps > 0 and k >= 1 classes")
    return total_eps * math.expm1(total_eps) / (k * eps * math.expm1(k * eps))


def matching_eps(y: torch.Tensor, y_prime: torch.Tensor) -> torch.Tensor:
    """``eps*`` per row (section 6.4.2): the eps at which phase 2 gives back ``y`` from ``y'``, fitted by least squares
    to ``ln y_i = (eps / 2) y'_i + c`` (the thesis' eq. 6.5 has one unknown and ``k`` equations); shape (N,). A row
    with a score of 0 has none (a softmax is never 0): inf."""
    _check(y)
    log_y = y.double().clamp_min(torch.finfo(torch.float64).tiny).log()
    yp = y_prime.double()
    centred = yp - yp.mean(1, keepdim=True)
    fitted = 2 * (centred * (log_y - log_y.mean(1, keepdim=True))).sum(1) / (centred * centred).sum(1)
    return torch.where((y == 0).any(1), torch.inf, fitted)
