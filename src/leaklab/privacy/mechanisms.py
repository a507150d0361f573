"""Differential-privacy mechanisms with their claimed (epsilon, delta).

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
- Dirichlet mechanism: seed 003 (Gohari, thesis 2023) chapter 1: sampling Dir(k p) (Sec. 1.2.3),
  delta by Lemma 1.1/1.2 and eq. (1.13), epsilon by Theorem 1.6, gamma for a target delta by
  (1.23) (read as the *largest* feasible gamma; see notes-003 section 1.3), accuracy Lemma 1.8.
- Floating-point-safe samplers: Canonne, Kamath & Steinke, "The discrete Gaussian for differential
  privacy", NeurIPS 2020, Algorithms 1-3 (exact, integer/rational arithmetic only), and their
  Theorem 7 for the exact delta of the discrete Gaussian. Naive float Laplace noise leaks through
  the low-order bits of its output (Mironov, CCS 2012); these samplers never touch floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import special

from leaklab.errors import LeaklabError

__all__ = [
    "LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism", "RandomizedResponse",
    "DirichletMechanism", "DiscreteLaplaceMechanism", "DiscreteGaussianMechanism",
    "classic_gaussian_sigma", "analytic_gaussian_sigma", "analytic_gaussian_delta",
    "dirichlet_epsilon", "dirichlet_epsilon_approx", "dirichlet_delta", "dirichlet_gamma",
    "dirichlet_vertices", "dirichlet_prob_omega1",
    "bernoulli_exp", "sample_discrete_laplace", "sample_discrete_gaussian", "discrete_gaussian_delta",
]


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise LeaklabError(f"{name} must be a positive number (got {value!r})")
    return value


def _probability(name: str, value: float) -> float:
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
        _positive("epsilon", self.epsilon)
        _positive("sensitivity", self.sensitivity)
        _positive("scale_factor", self.scale_factor)


@dataclass
class LaplaceMechanism(_PureMechanism):
    """value + Lap(sensitivity / epsilon): epsilon-DP for an l1-sensitivity (Dwork & Roth Thm 3.6).

    ``scale_factor`` < 1 makes a deliberately *broken* mechanism (the noise is smaller than the
    claim needs); the audit must catch it. The claimed epsilon stays the one asked for.
    """

    @property
    def scale(self) -> float:
        return self.scale_factor * self.sensitivity / self.epsilon

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        value = np.asarray(value, dtype=float)
        shape = value.shape if size is None else (size, *value.shape)
        return value + rng.laplace(0.0, self.scale, size=shape)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sigma = sqrt(2 ln(1.25/delta)) * sensitivity / epsilon, valid for epsilon < 1 (Dwork & Roth Thm A.1)."""
    _positive("epsilon", epsilon)
    _probability("delta", delta)
    if epsilon >= 1:
        raise LeaklabError(f"the classic Gaussian calibration holds only for epsilon < 1 (got {epsilon}); "
                           "use the analytic calibration")
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """delta(sigma) of the Gaussian mechanism, exactly (Balle & Wang 2018, Thm 8)."""
    a = sensitivity / (2 * sigma)
    c = epsilon * sigma / sensitivity
    return float(special.ndtr(a - c) - math.exp(epsilon + special.log_ndtr(-a - c)))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest sigma with analytic_gaussian_delta(sigma) <= delta (Balle & Wang 2018), by brentq."""
    from scipy.optimize import brentq

    _positive("epsilon", epsilon)
    _probability("delta", delta)
    _positive("sensitivity", sensitivity)

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
        _positive("scale_factor", self.scale_factor)
        if self.calibration == "analytic":
            base = analytic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
        elif self.calibration == "classic":
            base = classic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
        else:
            raise LeaklabError(f"unknown Gaussian calibration {self.calibration!r}; choose analytic or classic")
        self.sigma = base * self.scale_factor

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
        logits = self.epsilon * u / (2 * self.sensitivity * self.scale_factor)
        return logits - special.logsumexp(logits)

    def probabilities(self, scores: Any) -> np.ndarray:
        return np.exp(self.log_probabilities(scores))

    def sample(self, value: Any, rng: np.random.Generator, size: int | None = None) -> np.ndarray | int:
        p = self.probabilities(value)
        out = rng.choice(p.size, size=size, p=p)
        return int(out) if size is None else out


@dataclass
class RandomizedResponse:
    """k-ary randomized response: keep the true category with probability e^eps / (e^eps + k - 1),
    otherwise report one of the other k - 1 uniformly. epsilon-DP (Warner 1965 for k = 2; Kairouz,
    Oh & Viswanath 2014; Dwork & Roth Sec. 3.2)."""

    epsilon: float
    k: int = 2
    delta: float = 0.0

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon)
        if int(self.k) != self.k or self.k < 2:
            raise LeaklabError(f"randomized response needs k >= 2 categories (got {self.k!r})")
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


# --------------------------------------------------------------------------------------------
# Dirichlet mechanism (seed 003, chapter 1)


def _check_dirichlet(eta: float, eta_bar: float, k: float, w: int, b: float | None = None) -> None:
    _positive("eta", eta)
    _positive("eta_bar", eta_bar)
    _positive("k", k)
    if eta + eta_bar >= 1:
        raise LeaklabError(f"the Dirichlet domain needs eta + eta_bar < 1 (got {eta} + {eta_bar})")
    if int(w) != w or w < 2:
        raise LeaklabError(f"|W| must be an integer >= 2 (got {w!r})")
    if w * eta > 1 - eta_bar + 1e-12:
        raise LeaklabError(f"the Dirichlet domain is empty: |W| * eta = {w * eta:g} > 1 - eta_bar")
    if b is not None and not (0 < b <= 1):
        raise LeaklabError(f"b must lie in (0, 1] (got {b!r})")
    if b is not None and eta + b / 2 > 1 - eta_bar - eta + 1e-12:
        raise LeaklabError(f"b = {b} is too large for the domain: eta + b/2 must stay <= 1 - eta_bar - eta")


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


def dirichlet_prob_omega1(alpha_w: Any, alpha_rest: float, gamma: float, nodes: int | None = None) -> float:
    """P[x_i >= gamma for all i in W] for (x_W, 1 - sum x_W) ~ Dirichlet(alpha_W, alpha_rest).

    Lemma 1.1's |W|-fold integral, computed deterministically by stick breaking: x_1 ~ Beta(a_1,
    A_1), x_2 = (1 - x_1) Beta(a_2, A_2), ...; each level is integrated in the Beta CDF variable
    (so densities with parameters below 1 cause no trouble) with Gauss-Legendre nodes, and the last
    level is a closed-form Beta survival function.
    """
    a = np.asarray(alpha_w, dtype=float)
    m = a.size
    tails = np.concatenate([np.cumsum(a[::-1])[::-1][1:], [0.0]]) + alpha_rest  # A_j = sum_{l>j} a_l + rest
    if nodes is None:  # about 1e-5 absolute error for |W| = 3 (checked against 548 nodes)
        nodes = {1: 1, 2: 128, 3: 96}.get(m, max(8, int(round(2e4 ** (1 / (m - 1))))))
    s = np.ones(1)  # remaining mass, one entry per quadrature path
    weight = np.ones(1)
    t, wq = _gauss_legendre(nodes)
    for j in range(m - 1):
        left = (m - 1 - j) * gamma  # mass the later coordinates of W still need
        lo = np.clip(gamma / s, 0, 1)
        hi = np.clip(1 - left / s, 0, 1)
        c_lo = special.betainc(a[j], tails[j], lo)
        c_hi = special.betainc(a[j], tails[j], hi)
        span = np.maximum(c_hi - c_lo, 0.0)
        c = c_lo[:, None] + span[:, None] * t[None, :]
        u = special.betaincinv(a[j], tails[j], c)
        weight = (weight * span)[:, None] * wq[None, :]
        s = (s[:, None] * (1 - u)).ravel()
        weight = weight.ravel()
        keep = weight > 0
        s, weight = s[keep], weight[keep]
    last = special.betaincc(a[m - 1], alpha_rest, np.clip(gamma / s, 0, 1))
    return float(np.clip(np.sum(weight * last), 0.0, 1.0))


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
    _probability("delta", delta)
    _check_dirichlet(eta, eta_bar, k, w)
    from scipy.optimize import brentq

    hi = (1 / w) * (1 - 1e-9)
    if dirichlet_delta(eta, eta_bar, k, w, hi) <= delta:
        return hi
    lo = 1e-12
    if dirichlet_delta(eta, eta_bar, k, w, lo) > delta:
        raise LeaklabError(f"no gamma reaches delta = {delta}: the mechanism is not (eps, {delta})-DP here")
    log_g = brentq(lambda x: dirichlet_delta(eta, eta_bar, k, w, math.exp(x)) - delta,
                   math.log(lo), math.log(hi), xtol=1e-7)
    gamma = math.exp(log_g)
    while dirichlet_delta(eta, eta_bar, k, w, gamma) > delta:  # land on the feasible side
        gamma *= 1 - 1e-6
    return gamma


@dataclass
class DirichletMechanism:
    """Dir_k of seed 003 chapter 1: release x ~ Dirichlet(k p) for p in the simplex interior.

    The privacy claim is for b-adjacent inputs in the domain Delta_{n,W}^{(eta, eta_bar)} (Def. 1.1):
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
        return rng.dirichlet(self.concentration * p, size=size)


# --------------------------------------------------------------------------------------------
# exact discrete samplers (Canonne, Kamath & Steinke 2020)


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


def _effective_sensitivity(sensitivity: Fraction, granularity: Fraction | None) -> Fraction:
    # |round(a/g) - round(b/g)| <= ceil(|a - b| / g): rounding can add up to one unit
    if granularity is None:
        return sensitivity
    return Fraction(math.ceil(sensitivity / granularity))


@dataclass
class DiscreteLaplaceMechanism:
    """value + Y with P[Y = y] ~ exp(-epsilon |y| / sensitivity) on the integers: epsilon-DP for an
    integer query of l1-sensitivity ``sensitivity``; sampled exactly (CKS 2020). With a
    ``granularity`` g, real values are rounded to multiples of g first (sensitivity ceil(Delta/g)
    in units of g) and the output is a multiple of g."""

    epsilon: float
    sensitivity: float = 1
    granularity: float | None = None
    delta: float = 0.0

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon)
        _positive("sensitivity", self.sensitivity)
        self._g = None if self.granularity is None else Fraction(_positive("granularity", self.granularity))
        units = _effective_sensitivity(Fraction(self.sensitivity), self._g)
        self.scale = units / Fraction(self.epsilon)

    def sample(self, value: Any, rng: Any, size: int | None = None) -> np.ndarray:
        n = _quantize(value, self._g)
        shape = n.shape if size is None else (size, *n.shape)
        noise = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            noise[idx] = sample_discrete_laplace(rng, self.scale)
        return _unquantize(n + noise, self._g)


def discrete_gaussian_delta(sigma2: float, epsilon: float, sensitivity: int = 1) -> float:
    """Exact delta(epsilon) of the discrete Gaussian mechanism for an integer sensitivity
    (CKS 2020, Theorem 7): P[Y > eps s2/D - D/2] - e^eps P[Y > eps s2/D + D/2], Y ~ N_Z(0, s2)."""
    s2 = float(sigma2)
    reach = int(math.ceil(40 * math.sqrt(s2) + abs(epsilon) * s2 / sensitivity + sensitivity)) + 10
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
    integer: ceil(Delta/g))."""

    epsilon: float
    delta: float
    sensitivity: float = 1
    granularity: float | None = None

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon)
        _probability("delta", self.delta)
        self._g = None if self.granularity is None else Fraction(_positive("granularity", self.granularity))
        units = _effective_sensitivity(Fraction(_positive("sensitivity", self.sensitivity)), self._g)
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
        n = _quantize(value, self._g)
        shape = n.shape if size is None else (size, *n.shape)
        noise = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            noise[idx] = sample_discrete_gaussian(rng, self.sigma2)
        return _unquantize(n + noise, self._g)
