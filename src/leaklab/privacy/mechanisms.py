"""Differential-privacy mechanisms with their claimed (epsilon, delta): Laplace, Gaussian (classic and
analytic), the exponential mechanism and randomized response; seed 003's Dirichlet mechanism is in
:mod:`leaklab.privacy.dirichlet`, the exact discrete samplers in :mod:`leaklab.privacy.discrete`.

Every mechanism is a small class with ``epsilon``, ``delta`` (the guarantee it claims) and
``sample(value, rng, size=None)``, where ``rng`` is a :class:`numpy.random.Generator`; ``size``
draws that many independent outputs at once (the audit uses it).

Sources:

- Laplace, Gaussian (classic), exponential mechanism, randomized response: Dwork & Roth, *The
  Algorithmic Foundations of Differential Privacy* (2014), Sec. 3.3, Thm A.1, Sec. 3.4, Sec. 3.2
  (k-ary randomized response: Kairouz, Oh & Viswanath 2014).
- Analytic Gaussian: Balle & Wang, "Improving the Gaussian mechanism for differential privacy",
  ICML 2018, Thm 8 (smallest sigma with
  Phi(D/(2s) - e s/D) - e^e Phi(-D/(2s) - e s/D) <= delta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from leaklab.errors import LeaklabError

__all__ = [
    "LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism", "RandomizedResponse",
    "classic_gaussian_sigma", "analytic_gaussian_sigma", "analytic_gaussian_delta",
]


def check_positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise LeaklabError(f"{name} must be a positive number (got {value!r})")
    return value


def check_probability(name: str, value: float) -> float:
    value = float(value)
    if not 0 < value < 1:
        raise LeaklabError(f"{name} must lie in (0, 1) (got {value!r})")
    return value


# --------------------------------------------------------------------------------------------
# Laplace and Gaussian


@dataclass
class _PureMechanism:
    """The settings of a pure epsilon-DP mechanism calibrated to a sensitivity; ``scale_factor`` < 1
    breaks it on purpose (less randomness than the claim needs) while the claim stays ``epsilon``."""

    epsilon: float
    sensitivity: float = 1.0
    scale_factor: float = 1.0
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        check_positive("sensitivity", self.sensitivity)
        check_positive("scale_factor", self.scale_factor)


def _check_noise_scale(scale: float, what: str) -> None:
    """A noise scale that overflowed (the noise drew ±inf) is refused, naming what it was computed from."""
    if not math.isfinite(scale):
        raise LeaklabError(f"{what} overflows: no finite noise scale calibrates it")


@dataclass
class LaplaceMechanism(_PureMechanism):
    """value + Lap(sensitivity / epsilon): epsilon-DP for an l1-sensitivity (Dwork & Roth Thm 3.6).

    ``scale_factor`` < 1 makes a deliberately *broken* mechanism (the noise is smaller than the
    claim needs); the audit must catch it. The claimed epsilon stays the one asked for.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_noise_scale(self.scale, f"scale_factor · sensitivity / epsilon = {self.scale_factor:g} · "
                                       f"{self.sensitivity:g} / {self.epsilon:g}")

    @property
    def scale(self) -> float:
        return self.scale_factor * self.sensitivity / self.epsilon

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        value = np.asarray(value, dtype=float)
        shape = value.shape if size is None else (size, *value.shape)
        return value + rng.laplace(0.0, self.scale, size=shape)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sigma = sqrt(2 ln(1.25/delta)) * sensitivity / epsilon, valid for epsilon < 1 (Dwork & Roth Thm A.1)."""
    check_positive("epsilon", epsilon)
    check_probability("delta", delta)
    check_positive("sensitivity", sensitivity)  # as the analytic calibration: NaN gave sigma NaN, -1 a numpy error
    if epsilon >= 1:
        raise LeaklabError(f"the classic Gaussian calibration holds only for epsilon < 1 (got {epsilon}); "
                           "use the analytic calibration")
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """delta(sigma) of the Gaussian mechanism, exactly (Balle & Wang 2018, Thm 8)."""
    a = sensitivity / (2 * sigma)
    c = epsilon * sigma / sensitivity
    return float(special.ndtr(a - c) - math.exp(epsilon + special.log_ndtr(-a - c)))


MIN_GAUSSIAN_DELTA = 1e-300  # analytic_gaussian_sigma is exact (mpmath) down to here; at 1e-315 it is not


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest sigma with analytic_gaussian_delta(sigma) <= delta (Balle & Wang 2018), by brentq."""
    from scipy.optimize import brentq

    check_positive("epsilon", epsilon)
    check_probability("delta", delta)
    check_positive("sensitivity", sensitivity)
    if delta < MIN_GAUSSIAN_DELTA:  # subnormal: the tail's delta stops resolving, sigma stuck 1.6% low at 1e-320
        raise LeaklabError(f"delta must be at least {MIN_GAUSSIAN_DELTA:g} for the analytic Gaussian (got {delta:g}): "
                           "float64 does not resolve the Gaussian's tail below it")

    def f(log_s: float) -> float:
        return analytic_gaussian_delta(math.exp(log_s), epsilon, sensitivity) - delta

    lo, hi = math.log(sensitivity) - 10, math.log(sensitivity) + 1
    while f(hi) > 0:
        hi += 2
    while f(lo) < 0:
        lo -= 5
    sigma = math.exp(brentq(f, lo, hi, xtol=1e-13, rtol=1e-13))
    # step up to the first sigma on the safe side of the root
    while analytic_gaussian_delta(sigma, epsilon, sensitivity) > delta:
        sigma = math.nextafter(sigma, math.inf) * (1 + 1e-12)
    return sigma


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest epsilon with analytic_gaussian_delta(sigma, epsilon) <= delta (Balle & Wang 2018), by
    brentq: the exact epsilon of one Gaussian release, the inverse of :func:`analytic_gaussian_sigma`."""
    from scipy.optimize import brentq

    check_positive("sigma", sigma)
    check_probability("delta", delta)
    check_positive("sensitivity", sensitivity)
    if analytic_gaussian_delta(sigma, 0.0, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while analytic_gaussian_delta(sigma, hi, sensitivity) > delta:
        hi *= 2
    epsilon = brentq(lambda e: analytic_gaussian_delta(sigma, e, sensitivity) - delta, 0.0, hi, xtol=1e-13, rtol=1e-13)
    while analytic_gaussian_delta(sigma, epsilon, sensitivity) > delta:  # the safe side of the root
        epsilon = math.nextafter(epsilon, math.inf) * (1 + 1e-12)
    return epsilon


@dataclass
class GaussianMechanism:
    """value + N(0, sigma^2) for an l2-sensitivity; (epsilon, delta)-DP.

    ``calibration``: "analytic" (Balle & Wang 2018; any epsilon) or "classic" (Dwork & Roth Thm A.1,
    epsilon < 1). ``scale_factor`` < 1 breaks the mechanism on purpose (see LaplaceMechanism).
    """

    epsilon: float
    delta: float
    sensitivity: float = 1.0
    calibration: str = "analytic"
    scale_factor: float = 1.0
    sigma: float = field(init=False)

    def __post_init__(self) -> None:
        check_positive("scale_factor", self.scale_factor)
        if self.calibration == "analytic":
            base = analytic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
        elif self.calibration == "classic":
            base = classic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
        else:
            raise LeaklabError(f"unknown Gaussian calibration {self.calibration!r}; choose analytic or classic")
        self.sigma = base * self.scale_factor
        _check_noise_scale(self.sigma, f"sigma · scale_factor = {base:g} · {self.scale_factor:g}")

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        value = np.asarray(value, dtype=float)
        shape = value.shape if size is None else (size, *value.shape)
        return value + rng.normal(0.0, self.sigma, size=shape)


# --------------------------------------------------------------------------------------------
# exponential mechanism and randomized response


@dataclass
class ExponentialMechanism(_PureMechanism):
    """Pick candidate r with probability proportional to exp(epsilon u(r) / (2 sensitivity)).

    ``value`` is the vector of utility scores u(D, r) of the candidates on the data; the sensitivity
    bounds |u(D, r) - u(D', r)| over neighbours D, D' and all r. epsilon-DP (Dwork & Roth Thm 3.10;
    McSherry & Talwar 2007). The output is the index of the chosen candidate.
    """

    def log_probabilities(self, scores: Any) -> np.ndarray:
        u = np.asarray(scores, dtype=float)
        if u.ndim != 1 or u.size == 0 or not np.all(np.isfinite(u)):
            raise LeaklabError("the exponential mechanism needs a non-empty vector of finite utility scores")
        with np.errstate(over="ignore"):
            logits = self.epsilon * u / (2 * self.sensitivity * self.scale_factor)
        if not np.all(np.isfinite(logits)):  # an epsilon of 1e308 overflowed into NaN probabilities
            raise LeaklabError(f"epsilon * utility / (2 sensitivity) overflows at epsilon = {self.epsilon:g}; "
                               "choose a smaller epsilon or scale the utilities down")
        return logits - special.logsumexp(logits)

    def probabilities(self, scores: Any) -> np.ndarray:
        return np.exp(self.log_probabilities(scores))

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray | int:
        p = self.probabilities(value)
        out = rng.choice(p.size, size=size, p=p)
        return int(out) if size is None else out


MAX_CATEGORIES = 2 ** 62  # randomized response draws the other category as an int64


@dataclass
class RandomizedResponse:
    """k-ary randomized response: keep the true category with probability e^eps / (e^eps + k - 1),
    otherwise report one of the other k - 1 uniformly. epsilon-DP (Warner 1965 for k = 2; Kairouz,
    Oh & Viswanath 2014; Dwork & Roth Sec. 3.2)."""

    epsilon: float
    k: int = 2
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_positive("epsilon", self.epsilon)
        if not math.isfinite(self.k) or int(self.k) != self.k or not 2 <= self.k <= MAX_CATEGORIES:
            raise LeaklabError(f"randomized response needs a whole number of categories k from 2 to "
                               f"{MAX_CATEGORIES:,} (got {self.k!r})")
        self.k = int(self.k)

    @property
    def keep_probability(self) -> float:
        return 1.0 / (1.0 + (self.k - 1) * math.exp(-self.epsilon))

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray | int:
        v = np.asarray(value)
        if not np.issubdtype(v.dtype, np.integer) or np.any((v < 0) | (v >= self.k)):
            raise LeaklabError(f"randomized response takes categories 0..{self.k - 1}")
        shape = v.shape if size is None else (size, *v.shape)
        keep = rng.random(shape) < self.keep_probability
        other = (v + rng.integers(1, self.k, size=shape)) % self.k
        out = np.where(keep, v, other)
        return int(out) if out.ndim == 0 else out
