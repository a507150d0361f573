"""The sensitivity of a training algorithm, bounded or estimated, for the Gaussian privacy module: seed 003 (Gohari,
thesis 2023), chapter 3, Sec. 3.5.2.1.

* :func:`smoothed_sgd_sensitivity_bound`: Theorem 3.2, the worst case for SGD with gradient clipping C and
  randomised smoothing of an L-Lipschitz loss (beta = L / sigma_s), minibatch m, T steps:
  S <= 2 ((1 + eta beta)^T - 1) / ((m - 1) beta) C. It grows exponentially in T, hence the sampler:
* :func:`sensitivity_sampler`: Algorithm 3 (SensitivitySampler, Rubinstein and Alda 2017): n times, draw N + 1
  records from the data source, train on the first N and on them with the N-th replaced by the (N + 1)-th, and
  record the 2-norm distance between the two parameter vectors; the estimate S-bar is the largest.
* :func:`random_dp_confidence`: Theorem 3.3's confidence gamma of (eps, delta)-random DP for an estimate from n
  samples, rho = exp(W_{-1}(-1 / (4n)) / 2) and gamma = rho + sqrt(log(1 / rho) / (2n)) (n = 500: gamma = 0.0774).

With mu = S-bar / sigma, the module's delta(eps) is Theorem 3.1's Gaussian formula
(:func:`leaklab.privacy.mechanisms.analytic_gaussian_delta`), holding with confidence 1 - gamma over the datasets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from scipy import special

from leaklab.errors import LeaklabError

__all__ = ["SensitivityEstimate", "flat_parameters", "random_dp_confidence", "sensitivity_sampler",
           "smoothed_sgd_sensitivity_bound"]


def smoothed_sgd_sensitivity_bound(lr: float, beta: float, steps: int, batch_size: int, clip: float) -> float:
    """Theorem 3.2: 2 ((1 + lr beta)^steps - 1) / ((batch_size - 1) beta) clip (eq. 3.10)."""
    if not (all(math.isfinite(x) and x > 0 for x in (lr, beta, clip)) and isinstance(steps, int) and steps >= 0
            and isinstance(batch_size, int) and batch_size >= 2):
        raise LeaklabError("the bound needs lr, beta and clip > 0, steps >= 0 and a minibatch of 2 or more")
    try:
        growth = math.expm1(steps * math.log1p(lr * beta))
    except OverflowError:
        return math.inf
    return 2 * growth / ((batch_size - 1) * beta) * clip


def random_dp_confidence(n: int) -> tuple[float, float]:
    """Theorem 3.3 (eq. 3.23): (rho, gamma) for a sensitivity estimated from ``n`` samples; the random-DP
    guarantee holds with probability 1 - gamma over the datasets, so it says nothing for n = 1 (gamma 1.07)."""
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise LeaklabError(f"the sampler's sample count is a whole number of at least 1 (got {n!r})")
    rho = math.exp(0.5 * special.lambertw(-1 / (4 * n), k=-1).real)
    return rho, rho + math.sqrt(math.log(1 / rho) / (2 * n))


@dataclass(frozen=True)
class SensitivityEstimate:
    """Algorithm 3's output: every pair's distance ``samples`` and their maximum ``sensitivity`` (S-bar), with
    Theorem 3.3's confidence ``gamma`` for their count."""

    samples: tuple[float, ...]
    sensitivity: float
    gamma: float


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """A network's parameters as one float64 vector (the thesis' theta)."""
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def sensitivity_sampler(train: Callable[[Sequence[int]], torch.nn.Module], draw: Callable[[int, int], Sequence[int]],
                        n: int, size: int, progress: Callable[[int, int], None] | None = None) -> SensitivityEstimate:
    """Algorithm 3: for i = 1..n, ``draw(size + 1, i)`` gives N + 1 records (indices into the data source);
    ``train`` (the algorithm A_H: fixed hyperparameters, initialisation and random seed, so that only the data
    differ) is run on D1 = the first N and on D2 = D1 with its N-th record replaced by the (N + 1)-th; S^(i) is
    the 2-norm of the parameters' difference. S-bar = max_i S^(i)."""
    if not (isinstance(n, int) and n >= 1 and isinstance(size, int) and size >= 1):
        raise LeaklabError("the sampler needs n >= 1 pairs of datasets of N >= 1 records")
    samples = []
    for i in range(n):
        records = list(draw(size + 1, i))
        if len(records) != size + 1:
            raise LeaklabError(f"the data source gave {len(records)} records, not N + 1 = {size + 1}")
        first = flat_parameters(train(records[:size]))
        second = flat_parameters(train(records[:size - 1] + records[size:]))
        samples.append(float(torch.linalg.vector_norm(first - second)))
        if progress is not None:
            progress(i + 1, n)
    return SensitivityEstimate(tuple(samples), max(samples), random_dp_confidence(n)[1])
