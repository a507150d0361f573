"""The Dirichlet mechanism of seed 003 (Gohari, thesis 2023) chapter 1: sampling Dir(k p) (Sec. 1.2.3),
delta by Lemma 1.1/1.2 and eq. (1.13), epsilon by Theorem 1.6, gamma for a target delta by (1.23) (read
as the *largest* feasible gamma; see notes-003 section 1.3), accuracy Lemma 1.8. Like the mechanisms of
:mod:`leaklab.privacy.mechanisms` it claims ``epsilon`` and ``delta`` and draws with ``sample(value, rng,
size=None)``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from leaklab.errors import LeaklabError
from leaklab.privacy.mechanisms import check_positive, check_probability

__all__ = ["DirichletMechanism", "adjacent_spread", "dirichlet_epsilon", "dirichlet_epsilon_approx", "dirichlet_delta",
           "dirichlet_gamma", "dirichlet_vertices", "dirichlet_prob_omega1"]


MAX_K = 1e6  # the largest concentration the mechanism's numbers are computed for
# the most protected entries: as far as the delta bound of dirichlet_prob_omega1 was checked against Monte Carlo
# (|W| = 5, 6 and 8: within 1.1 of its standard error, 8e-5 to 1.5e-4; the four-wise term 1e-6 or less)
MAX_W = 8


def _check_dirichlet(eta: float, eta_bar: float, k: float, w: int, b: float | None = None) -> None:
    check_positive("k", k)
    if k > MAX_K:
        raise LeaklabError(f"k must be at most {MAX_K:g} (got {k:g}): at 1e6 epsilon is already 1.5e5, and the Beta "
                           "functions of larger k take minutes or fail")
    _check_domain(eta, eta_bar, w, b)


def _check_domain(eta: float, eta_bar: float, w: int, b: float | None = None) -> None:
    check_positive("eta", eta)
    check_positive("eta_bar", eta_bar)
    if eta + eta_bar >= 1:
        raise LeaklabError(f"the Dirichlet domain needs eta + eta_bar < 1 (got {eta} + {eta_bar})")
    if int(w) != w or not 2 <= w <= MAX_W:
        raise LeaklabError(f"|W| must be an integer from 2 to {MAX_W} (got {w!r}): the delta bound is checked "
                           "against Monte Carlo that far")
    if w * eta > 1 - eta_bar + 1e-12:
        raise LeaklabError(f"the Dirichlet domain is empty: |W| * eta = {w * eta:g} > 1 - eta_bar")
    if b is not None and not (0 < b <= 1):
        raise LeaklabError(f"b must lie in (0, 1] (got {b!r})")
    if b is not None and eta + b / 2 > 1 - eta_bar - eta + 1e-12:
        raise LeaklabError(f"b = {b} is too large for the domain: eta + b/2 must stay <= 1 - eta_bar - eta")


def adjacent_spread(eta: float, eta_bar: float, b: float, w: int) -> float:
    """Half the L1 distance of the farthest b-adjacent pair (Def. 1.1: ``||p - q||_1 <= b``, two W entries apart)
    that moves mass between two W entries of the domain's corner (eta, ..., eta): ``min(b/2, 1 - eta_bar - |W|
    eta)``. 0 where the domain is the single point ``|W| eta = 1 - eta_bar`` (the thesis's eta = eta_bar = 0.25
    panel at |W| = 3), whose claim then holds vacuously: no two of its inputs are adjacent."""
    _check_domain(eta, eta_bar, w, b)
    room = 1 - eta_bar - w * eta
    return min(b / 2, room) if room > 1e-12 else 0.0  # a tiny b is a tiny spread, not a one-point domain


def dirichlet_epsilon(eta: float, eta_bar: float, k: float, b: float, w: int, gamma: float) -> float:
    """epsilon of Theorem 1.6 (seed 003) for the partition parameter gamma:

    log beta(k eta, k(1-eta_bar-eta)) - log beta(k(eta+b/2), k(1-eta_bar-eta-b/2))
    + (k b / 2) log((1 - (|W|-1) gamma) / gamma).
    """
    _check_dirichlet(eta, eta_bar, k, w, b)
    if not (0 < gamma < 1 / w):
        raise LeaklabError(f"gamma must lie in (0, 1/|W|) (got {gamma!r})")
    gamma_part = (special.betaln(k * eta, k * (1 - eta_bar - eta))
                  - special.betaln(k * (eta + b / 2), k * (1 - eta_bar - eta - b / 2)))
    x_part = k * b / 2 * math.log((1 - (w - 1) * gamma) / gamma)
    return float(gamma_part + x_part)


def dirichlet_epsilon_approx(eta: float, eta_bar: float, k: float, b: float, w: int, gamma: float) -> float:
    """The looser closed form of Lemma 1.7 (beta bounds; needs all beta arguments > 1)."""
    a1, b1 = k * eta, k * (1 - eta_bar - eta)
    upper = math.log((a1 + b1 - 1) / ((2 * a1 - 1) * (2 * b1 - 1)))
    lower = 2 - k * (1 - eta_bar)
    return upper - lower + k * b / 2 * math.log((1 - (w - 1) * gamma) / gamma)


def dirichlet_vertices(eta: float, eta_bar: float, w: int) -> np.ndarray:
    """The |W| + 1 vertices of the domain projected on the W-coordinates (notes-003 Sec. 1.3):
    (eta, ..., eta) and (eta, ..., eta) + (1 - eta_bar - |W| eta) e_i."""
    base = np.full(w, float(eta))
    slack = 1 - eta_bar - w * eta
    return np.vstack([base] + [base + slack * np.eye(w)[i] for i in range(w)])


def _gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, wts = np.polynomial.legendre.leggauss(n)
    return (x + 1) / 2, wts / 2


def _prob_all_below(alpha: tuple[float, ...], alpha_rest: float, gamma: float, nodes: int) -> float:
    """P[x_i < gamma for every i] for (x, 1 - sum x) ~ Dirichlet(alpha, alpha_rest), by stick breaking:
    x_1 ~ Beta(a_1, A_1), x_2 = (1 - x_1) Beta(a_2, A_2), ...; each level but the last integrated in the Beta CDF
    variable (so densities with parameters below 1 cause no trouble) with Gauss-Legendre nodes, the last a
    closed-form Beta CDF. ``gamma < 1 / len(alpha)`` keeps the remaining mass positive."""
    a = np.asarray(alpha, dtype=float)
    tails = np.concatenate([np.cumsum(a[::-1])[::-1][1:], [0.0]]) + alpha_rest  # A_j = sum_{l>j} a_l + rest
    s, weight = np.ones(1), np.ones(1)  # remaining mass and weight, one entry per quadrature path
    t, wq = _gauss_legendre(nodes)
    for j in range(a.size - 1):
        span = special.betainc(a[j], tails[j], np.clip(gamma / s, 0, 1))
        u = special.betaincinv(a[j], tails[j], span[:, None] * t[None, :])
        weight = ((weight * span)[:, None] * wq[None, :]).ravel()
        s = (s[:, None] * (1 - u)).ravel()
    return float(np.sum(weight * special.betainc(a[-1], alpha_rest, np.clip(gamma / s, 0, 1))))


# inclusion-exclusion's terms kept: exact for |W| <= 3, Bonferroni's upper bound on the union beyond
BONFERRONI_TERMS = 3


def dirichlet_prob_omega1(alpha_w: Any, alpha_rest: float, gamma: float, nodes: int = 128) -> float:
    """P[x_i >= gamma for all i in W] for (x_W, 1 - sum x_W) ~ Dirichlet(alpha_W, alpha_rest) (Lemma 1.1), or a
    lower bound on it within the four-wise term: one minus the probability that some x_i < gamma, by
    inclusion-exclusion over the subsets S of W of up to :data:`BONFERRONI_TERMS` entries, each term
    P[x_i < gamma for i in S] under the aggregated Dirichlet(alpha_S, rest) (:func:`_prob_all_below`, a
    (|S| - 1)-fold integral). Exact for |W| <= 3; beyond, the sum stops at an odd term, so it bounds the union
    from above (Bonferroni) and the delta it gives errs on the safe side. Until session 54 the |W|-fold integral
    was taken whole, with 8 nodes per level from |W| = 6: its delta came about 1 % under Monte Carlo's at
    |W| = 6 to 8, on the unsafe side. 128 nodes agree with 512 to 1e-7."""
    a = np.asarray(alpha_w, dtype=float)
    total = float(a.sum()) + alpha_rest
    terms: dict[tuple[float, ...], float] = {}  # a subset's term by its parameters (a vertex repeats them)
    union = 0.0
    for size in range(1, min(a.size, BONFERRONI_TERMS) + 1):
        for subset in itertools.combinations(a.tolist(), size):
            key = tuple(sorted(subset))
            if key not in terms:
                terms[key] = _prob_all_below(key, total - sum(key), gamma, nodes)
            union += (-1) ** (size + 1) * terms[key]
    return float(np.clip(1 - union, 0.0, 1.0))


def _dirichlet_prob_mc(alpha_w: Any, alpha_rest: float, gamma: float, samples: int,
                       rng: np.random.Generator) -> float:
    x = rng.dirichlet(np.append(np.asarray(alpha_w, float), alpha_rest), size=samples)
    return float(np.mean(np.all(x[:, :-1] >= gamma, axis=1)))


def dirichlet_delta(eta: float, eta_bar: float, k: float, w: int, gamma: float, *, method: str = "quadrature",
                    samples: int = 2_000_000, rng: np.random.Generator | None = None) -> float:
    """delta = 1 - min over the domain's vertices of P[Dir_k(p) in Omega_1(W)] (eq. 1.13, Thm 1.6;
    the minimum sits on a vertex by the log-concavity of Lemma 1.2). ``method``: "quadrature"
    (deterministic, default) or "montecarlo" (``samples`` draws per vertex)."""
    _check_dirichlet(eta, eta_bar, k, w)
    if not (0 < gamma < 1 / w):
        raise LeaklabError(f"gamma must lie in (0, 1/|W|) (got {gamma!r})")
    probs = []
    seen = set()
    for v in dirichlet_vertices(eta, eta_bar, w):
        alpha_w, alpha_rest = k * v, k * (1 - v.sum())
        key = (tuple(np.round(np.sort(alpha_w), 12)), round(alpha_rest, 12))
        if key in seen:  # P[Omega_1] is symmetric in the W-coordinates
            continue
        seen.add(key)
        if method == "quadrature":
            probs.append(dirichlet_prob_omega1(alpha_w, alpha_rest, gamma))
        elif method == "montecarlo":
            probs.append(_dirichlet_prob_mc(alpha_w, alpha_rest, gamma, samples, rng or np.random.default_rng(0)))
        else:
            raise LeaklabError(f"unknown method {method!r}; choose quadrature or montecarlo")
    return float(1 - min(probs))


def dirichlet_gamma(eta: float, eta_bar: float, k: float, w: int, delta: float) -> float:
    """The largest gamma with dirichlet_delta(gamma) <= delta, by bisection on log gamma.

    Eq. (1.23) of seed 003 writes a *min* over gamma; since P[Omega_1] decreases in gamma the
    feasible set is gamma <= gamma* and epsilon decreases as gamma grows, so the useful solution
    is the largest feasible gamma (notes-003 Sec. 1.3)."""
    check_probability("delta", delta)
    _check_dirichlet(eta, eta_bar, k, w)
    from scipy.optimize import brentq

    hi = (1 / w) * (1 - 1e-9)
    if dirichlet_delta(eta, eta_bar, k, w, hi) <= delta:
        return hi
    lo = 1e-12
    if dirichlet_delta(eta, eta_bar, k, w, lo) > delta:
        raise LeaklabError(f"no gamma of {lo:g} or more reaches delta = {delta} (the search stops there, where "
                           "epsilon is already large); choose a larger delta")
    log_g = brentq(lambda x: dirichlet_delta(eta, eta_bar, k, w, math.exp(x)) - delta,
                   math.log(lo), math.log(hi), xtol=1e-7)
    gamma = math.exp(log_g)
    while dirichlet_delta(eta, eta_bar, k, w, gamma) > delta:  # land on the feasible side
        gamma *= 1 - 1e-6
    return gamma


@dataclass
class DirichletMechanism:
    """Dir_k of seed 003 chapter 1: release x ~ Dirichlet(k p) for p in the simplex interior.

    The privacy claim is for b-adjacent inputs in the domain Delta_{n,W}^{(eta, eta_bar)} (Def. 1.1; W: the first
    ``w`` entries, and ``sample`` refuses a vector outside it):
    ``delta`` is the target (the largest gamma meeting it is found numerically, eq. 1.23) and
    ``epsilon`` follows from Theorem 1.6. E[x] = p and Var[x_i] = p_i(1-p_i)/(k+1) (Lemma 1.8).
    The log-concavity behind the vertex search (Lemma 1.2) needs every Dirichlet parameter >= 1,
    i.e. k * min(eta, eta_bar) >= 1; a smaller k is refused.
    """

    k: float
    eta: float
    eta_bar: float
    b: float
    w: int
    delta: float = 0.05
    scale_factor: float = 1.0
    gamma: float = field(init=False)
    epsilon: float = field(init=False)

    def __post_init__(self) -> None:
        _check_dirichlet(self.eta, self.eta_bar, self.k, self.w, self.b)
        check_positive("scale_factor", self.scale_factor)  # 0 divided by zero at sample, -1 was numpy's error
        if not math.isfinite(self.concentration):  # every draw NaN
            raise LeaklabError(f"k / scale_factor = {self.k:g} / {self.scale_factor:g} overflows: no finite "
                               "concentration samples it")
        if self.k * min(self.eta, self.eta_bar) < 1 - 1e-12:
            raise LeaklabError(f"k * min(eta, eta_bar) = {self.k * min(self.eta, self.eta_bar):g} < 1: "
                               "Lemma 1.2's log-concavity (and so the delta bound) needs it >= 1")
        self.gamma = dirichlet_gamma(self.eta, self.eta_bar, self.k, self.w, self.delta)
        self.epsilon = dirichlet_epsilon(self.eta, self.eta_bar, self.k, self.b, self.w, self.gamma)

    @property
    def concentration(self) -> float:
        """The concentration used for sampling: k / scale_factor. A ``scale_factor`` < 1 (the audit's
        'broken' variant, less noise) samples with a larger concentration than the claim assumes."""
        return self.k / self.scale_factor

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        p = np.asarray(value, dtype=float)
        if p.ndim != 1 or np.any(p <= 0) or abs(p.sum() - 1) > 1e-9:
            raise LeaklabError("the Dirichlet mechanism takes one vector with positive entries summing to 1")
        if p.size < self.w + 1:  # Def. 1.1: |W| protected entries and the rest
            raise LeaklabError(f"the Dirichlet mechanism for |W| = {self.w} takes vectors of {self.w + 1} entries or "
                               f"more (got {p.size})")
        protected = p[:self.w]
        if protected.min() < self.eta - 1e-12 or protected.sum() > 1 - self.eta_bar + 1e-12:
            # outside the domain its epsilon and delta hold for: (0.01, 0.01, 0.01, 0.97) had delta 0.99
            raise LeaklabError(f"the Dirichlet mechanism's claim holds for vectors whose first |W| = {self.w} entries "
                               f"are each at least eta = {self.eta:g} and sum to at most 1 - eta_bar = "
                               f"{1 - self.eta_bar:g} (Def. 1.1)")
        return rng.dirichlet(self.concentration * p, size=size)


