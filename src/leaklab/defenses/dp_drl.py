"""DP-DRL: the exponential mechanism obfuscates one element of a DRL agent's observation at every visited state
(seed 002, chapter 5, section 5.4; Algorithms 9 and 10).

The score function (Algorithm 9) flips each element of the binary observation in turn (section 5.5.2: the element
"transmitting between 0 and 1") and measures ``d_i = ||Q(O'_(i)) - Q(O)||_2``; the element whose flip moves the Q
values least scores highest: ``sr_i = N^(1 - d'_i)`` with ``d'_i = (d_i - d_min) / (d_max - d_min)``. Algorithm 10
then picks the element to flip with probability ``p_i ∝ exp(eps sr_i / (2 S))``, ``S`` the gap between the largest
and the second-largest score, and ``eps`` fixed or dynamic, ``arctan(d_max - d_min)`` (section 5.4.3).

Two cases the thesis leaves open take the formula's limit: when the two largest scores tie (``S = 0``, which
includes ``d_max = d_min``, where every score is ``N``) the choice is uniform over the tied largest scores, as
``exp(eps (sr_i - sr_max) / (2 S))`` gives as ``S`` falls to 0. The probabilities are computed from
``sr_i - sr_max``, so that no exponential overflows. Theorem 5.1's eps covers one obfuscation; the thesis accounts
no composition over the steps of an episode or of training, and neither does this module.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

DEFAULT_N = 10.0  # section 5.6.2.3

QFunction = Callable[[torch.Tensor], torch.Tensor]  # [K, n, 8] observations -> [K, n, actions] values


def flips(observations: torch.Tensor) -> torch.Tensor:
    """``[K, n, n]``: for each of the ``K`` binary observations of ``n`` elements, the ``n`` copies with one element
    flipped (copy ``i`` flips element ``i``)."""
    n = observations.shape[-1]
    eye = torch.eye(n, dtype=observations.dtype, device=observations.device)
    copies = observations[:, None, :].expand(-1, n, -1)
    return copies + eye * (1 - 2 * copies)


def scores(q_values: torch.Tensor, q_flipped: torch.Tensor, n_scale: float = DEFAULT_N
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 9 for ``K`` observations: ``q_values`` ``[K, actions]`` at the true observations, ``q_flipped``
    ``[K, n, actions]`` at their :func:`flips`. Returns the scores ``[K, n]`` and the spread ``d_max - d_min``
    ``[K]`` (all scores ``N`` where the spread is 0)."""
    d = torch.linalg.vector_norm(q_flipped - q_values[:, None, :], dim=-1)
    d_min = d.min(dim=1, keepdim=True).values
    spread = d.max(dim=1, keepdim=True).values - d_min
    normalised = torch.where(spread > 0, (d - d_min) / torch.where(spread > 0, spread, 1), 0)
    return n_scale ** (1 - normalised), spread.squeeze(1)


def selection_probabilities(sr: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Algorithm 10's ``p_i ∝ exp(eps sr_i / (2 S))`` for ``K`` score vectors ``[K, n]`` and budgets ``[K]``, with
    ``S`` the top-two gap of each; the limit (uniform over the tied largest scores) where ``S = 0``."""
    top2 = sr.topk(2, dim=1).values
    gap = (top2[:, 0] - top2[:, 1])[:, None]
    relative = sr - top2[:, :1]  # <= 0
    tied = (relative == 0).to(sr.dtype)
    weights = torch.where(gap > 0, torch.exp(eps[:, None] * relative / (2 * torch.where(gap > 0, gap, 1))), tied)
    return weights / weights.sum(dim=1, keepdim=True)


def roulette(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Algorithm 10's roulette wheel: for each row of probabilities ``p`` ``[K, n]`` and uniform ``u`` ``[K]`` in
    [0, 1), the first element whose cumulative probability exceeds ``u`` times the row's total (so that rounding in
    the sum leaves no gap at the wheel's end, and an element of probability 0 is never drawn)."""
    wheel = p.double().cumsum(dim=1)
    return (wheel <= (u.double() * wheel[:, -1])[:, None]).sum(dim=1)


def obfuscate(observations: torch.Tensor, q_function: QFunction, eps: torch.Tensor | None,
              rng: np.random.Generator, n_scale: float = DEFAULT_N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 10 on ``K`` binary observations ``[K, n]``: each gets one element flipped, drawn by the exponential
    mechanism over Algorithm 9's scores under ``q_function`` (one call on the ``[K, 1 + n, n]`` true and flipped
    observations); an element of probability 0 is never drawn. ``eps`` ``[K]`` the budgets, NaN (or ``eps`` None:
    every one) for the dynamic ``arctan(d_max - d_min)``. The draw is
    a roulette wheel on one uniform number per observation from ``rng``.

    Returns the obfuscated observations ``[K, n]``, the flipped element ``[K]`` and the budget used ``[K]``."""
    k, n = observations.shape
    flipped = flips(observations)
    with torch.no_grad():
        q = q_function(torch.cat([observations[:, None, :], flipped], dim=1))
    sr, spread = scores(q[:, 0], q[:, 1:], n_scale)
    dynamic = torch.atan(spread)
    budget = dynamic if eps is None else torch.where(torch.isnan(eps), dynamic, eps.to(sr.dtype))
    p = selection_probabilities(sr, budget)
    chosen = roulette(p, torch.from_numpy(rng.random(k)))
    return flipped[torch.arange(k), chosen], chosen, budget
