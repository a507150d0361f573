"""Floating-point-safe discrete mechanisms: Canonne, Kamath & Steinke, "The discrete Gaussian for
differential privacy", NeurIPS 2020, Algorithms 1-3 (exact, integer/rational arithmetic only), and their
Theorem 7 for the exact delta of the discrete Gaussian. Naive float Laplace noise leaks through the
low-order bits of its output (Mironov, CCS 2012); these samplers never touch floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from leaklab.errors import LeaklabError
from leaklab.privacy.mechanisms import analytic_gaussian_sigma, check_positive, check_probability

__all__ = ["DiscreteLaplaceMechanism", "DiscreteGaussianMechanism", "bernoulli_exp", "sample_discrete_laplace",
           "sample_discrete_gaussian", "discrete_gaussian_delta"]


def _randbelow(rng: Any, n: int) -> int:
    """A uniform integer in [0, n) for any Python int n, from a numpy Generator (32-bit chunks,
    rejection) or a random.Random."""
    if n <= 0:
        raise ValueError("n must be positive")
    if hasattr(rng, "randrange"):
        return rng.randrange(n)
    bits = n.bit_length()
    chunks = (bits + 31) // 32
    while True:
        r = 0
        for _ in range(chunks):
            r = (r << 32) | int(rng.integers(0, 1 << 32))
        r >>= chunks * 32 - bits
        if r < n:
            return r


def _bernoulli(rng: Any, p: Fraction) -> bool:
    return _randbelow(rng, p.denominator) < p.numerator


def bernoulli_exp(rng: Any, gamma: Fraction) -> bool:
    """Exact Bernoulli(exp(-gamma)) for a rational gamma >= 0 (CKS 2020, Algorithm 1)."""
    gamma = Fraction(gamma)
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    while gamma > 1:
        if not bernoulli_exp(rng, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(rng, gamma / k):
        k += 1
    return k % 2 == 1


def sample_discrete_laplace(rng: Any, scale: Fraction) -> int:
    """Exact draw with P[Y = y] proportional to exp(-|y| / scale), scale = t/s rational
    (CKS 2020, Algorithm 2)."""
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError("scale must be positive")
    t, s = scale.numerator, scale.denominator
    while True:
        u = _randbelow(rng, t)
        if not bernoulli_exp(rng, Fraction(u, t)):
            continue
        v = 0
        while bernoulli_exp(rng, Fraction(1)):
            v += 1
        y = (u + t * v) // s
        negative = _randbelow(rng, 2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def sample_discrete_gaussian(rng: Any, sigma2: Fraction) -> int:
    """Exact draw with P[Y = y] proportional to exp(-y^2 / (2 sigma2)), sigma2 rational
    (CKS 2020, Algorithm 3)."""
    sigma2 = Fraction(sigma2)
    if sigma2 <= 0:
        raise ValueError("sigma2 must be positive")
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = sample_discrete_laplace(rng, Fraction(t))
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp(rng, gamma):
            return y


def _quantize(value: Any, granularity: Fraction | None) -> np.ndarray:
    v = np.asarray(value)
    if granularity is None:
        if not np.issubdtype(v.dtype, np.integer) and not np.all(np.mod(v, 1) == 0):
            raise LeaklabError("discrete noise takes integer values; give a granularity to round to")
        return np.vectorize(int, otypes=[object])(v)
    # round half up, in exact arithmetic: floor(x / g + 1/2) moves by at most ceil(|a - b| / g)
    # between two inputs (Python's round() sends halves to even: 0.5 -> 0, 1.5 -> 2, two units apart)
    half = Fraction(1, 2)
    return np.vectorize(lambda x: math.floor(Fraction(float(x)) / granularity + half), otypes=[object])(v)


def _unquantize(n: Any, granularity: Fraction | None) -> np.ndarray:
    n = np.asarray(n, dtype=object)
    if granularity is None:
        return n.astype(np.int64)
    return np.vectorize(lambda x: float(Fraction(x) * granularity), otypes=[float])(n)


def _noised(value: Any, granularity: Fraction | None, size: int | None, draw: Callable[[], int]) -> np.ndarray:
    """``value`` on the grid of ``granularity`` plus one exact integer ``draw()`` per entry (``size``
    outputs at once when given), back in the value's units."""
    n = _quantize(value, granularity)
    shape = n.shape if size is None else (size, *n.shape)
    noise = np.empty(shape, dtype=object)
    for idx in np.ndindex(shape):
        noise[idx] = draw()
    return _unquantize(n + noise, granularity)


def _effective_sensitivity(sensitivity: Fraction, granularity: Fraction | None, entries: int = 1) -> Fraction:
    """The l1 sensitivity, in units of ``granularity``, of a value of ``entries`` entries rounded to the grid:
    each entry's rounding can add up to one unit, ``|round(a_i/g) - round(b_i/g)| <= ceil(|a_i - b_i| / g)``,
    and a sum of ceilings of parts of ``Delta/g`` is at most ``ceil(Delta/g) + entries - 1`` (three entries
    of 0.4 against 0.6, l1 distance 0.6 at g = 1, land 3 units apart)."""
    if granularity is None:
        return sensitivity
    return Fraction(math.ceil(sensitivity / granularity) + entries - 1)


@dataclass
class DiscreteLaplaceMechanism:
    """value + Y with P[Y = y] ~ exp(-epsilon |y| / sensitivity) on the integers, per entry: epsilon-DP for an
    integer query of l1-sensitivity ``sensitivity``; sampled exactly (CKS 2020). With a
    ``granularity`` g, real values are rounded to multiples of g first (sensitivity ceil(Delta/g)
    in units of g for one entry, ``ceil(Delta/g) + d - 1`` for d entries: ``scale`` is a single value's,
    a vector's noise is wider) and the output is a multiple of g."""

    epsilon: float
    sensitivity: float = 1
    granularity: float | None = None
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("sensitivity", self.sensitivity)
        self._g = None if self.granularity is None else Fraction(check_positive("granularity", self.granularity))
        units = _effective_sensitivity(Fraction(self.sensitivity), self._g)
        self.scale = units / Fraction(self.epsilon)

    def sample(self, value: Any, rng: Any, size: int | None = None) -> np.ndarray:
        entries = np.asarray(value).size
        scale = self.scale if entries == 1 else (
            _effective_sensitivity(Fraction(self.sensitivity), self._g, entries) / Fraction(self.epsilon))
        return _noised(value, self._g, size, lambda: sample_discrete_laplace(rng, scale))


MAX_DELTA_REACH = 20_000_000  # the delta sum's terms either side of 0: 3 float arrays of 0.3 GB; a granularity of
# 1e-6 at epsilon 1 and delta 1e-5 asked for 5e8 (a MemoryError), 1e-5 needs 1.6e7


def discrete_gaussian_delta(sigma2: float, epsilon: float, sensitivity: int = 1) -> float:
    """Exact delta(epsilon) of the discrete Gaussian mechanism for an integer sensitivity
    (CKS 2020, Theorem 7): P[Y > eps s2/D - D/2] - e^eps P[Y > eps s2/D + D/2], Y ~ N_Z(0, s2)."""
    s2 = float(sigma2)
    reach = int(math.ceil(40 * math.sqrt(s2) + abs(epsilon) * s2 / sensitivity + sensitivity)) + 10
    if reach > MAX_DELTA_REACH:
        raise LeaklabError(f"the exact delta of a discrete Gaussian of sigma^2 {s2:.3g} sums {2 * reach + 1:.3g} terms "
                           f"(at most {2 * MAX_DELTA_REACH + 1:.3g}); choose a coarser granularity")
    y = np.arange(-reach, reach + 1, dtype=float)
    logp = -y * y / (2 * s2)
    logp -= special.logsumexp(logp)
    p = np.exp(logp)
    a = epsilon * s2 / sensitivity - sensitivity / 2
    c = epsilon * s2 / sensitivity + sensitivity / 2
    return float(max(0.0, p[y > a].sum() - math.exp(epsilon) * p[y > c].sum()))


@dataclass
class DiscreteGaussianMechanism:
    """value + Y, Y ~ discrete Gaussian N_Z(0, sigma^2), sampled exactly (CKS 2020). sigma^2 is the
    rational (1/10^6 grid) smallest one whose exact delta (Theorem 7) at ``epsilon`` is <= ``delta``;
    ``granularity`` as for DiscreteLaplaceMechanism (the sensitivity, in units of g, must be an
    integer: ceil(Delta/g)). Theorem 7 is a single value's delta: a value of several entries is refused
    (noise each entry with its own share of the budget)."""

    epsilon: float
    delta: float
    sensitivity: float = 1
    granularity: float | None = None

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_probability("delta", self.delta)
        self._g = None if self.granularity is None else Fraction(check_positive("granularity", self.granularity))
        units = _effective_sensitivity(Fraction(check_positive("sensitivity", self.sensitivity)), self._g)
        if units.denominator != 1:
            raise LeaklabError("the discrete Gaussian needs an integer sensitivity (in units of the granularity)")
        self._units = int(units)
        sigma = analytic_gaussian_sigma(self.epsilon, self.delta, self._units)
        lo, hi = (0.25 * sigma) ** 2, (sigma * 1.5) ** 2
        while discrete_gaussian_delta(hi, self.epsilon, self._units) > self.delta:
            hi *= 2
        for _ in range(80):
            mid = (lo + hi) / 2
            if discrete_gaussian_delta(mid, self.epsilon, self._units) <= self.delta:
                hi = mid
            else:
                lo = mid
        s2 = Fraction(math.ceil(hi * 10**6), 10**6)
        self.sigma2 = s2
        self.claimed_delta = discrete_gaussian_delta(float(s2), self.epsilon, self._units)

    def sample(self, value: Any, rng: Any, size: int | None = None) -> np.ndarray:
        if np.asarray(value).size != 1:
            raise LeaklabError(f"the discrete Gaussian's delta (CKS 2020, Theorem 7) is one value's; got "
                               f"{np.asarray(value).size} entries (noise each with its own share of the budget)")
        return _noised(value, self._g, size, lambda: sample_discrete_gaussian(rng, self.sigma2))
