"""Privacy accounting through the established accountants, behind one interface.

* DP-SGD (the Poisson-subsampled Gaussian mechanism composed ``steps`` times; Abadi et al., CCS
  2016): :func:`dpsgd_epsilon` and, for a target epsilon, :func:`dpsgd_sigma`. The accountants:

  - ``"rdp"``: opacus' Renyi-DP accountant (Mironov 2017; Mironov, Talwar & Zhang 2019),
  - ``"prv"``: opacus' PRV accountant (Gopi, Lee & Wutschitz, NeurIPS 2021; opacus' default),
  - ``"pld"``: dp-accounting's privacy-loss-distribution accountant (Koskela et al. 2020;
    Doroshenko et al. 2022).

  RDP is an upper bound that is loose by ~10% at typical settings; PRV and PLD are numerically
  tight and agree with each other to about 1%.

* Composition of mechanism uses (seed notes-002 section 1.3, sequential composition; here through
  the tight accountants instead of summing epsilons): a :class:`Ledger` records
  dp-accounting ``DpEvent`` objects (:func:`gaussian`, :func:`laplace`, :func:`subsampled_gaussian`,
  or the mechanisms of :mod:`leaklab.privacy.mechanisms` via :meth:`Ledger.spend`), and
  :func:`compose` gives the epsilon of them all for a delta with dp-accounting's ``"rdp"`` or
  ``"pld"`` accountant (opacus' accountants know only the subsampled Gaussian).

Neighbouring datasets differ by adding or removing one record (the relation of opacus and the
default of dp-accounting). No formula is reimplemented here; only the root search for sigma is ours.
An accountant's conversion to (epsilon, delta) can dip below 0 at a large delta (RDP and PRV at q = 0.1,
sigma = 1, 10 steps, delta = 0.99: -3.17 and -4.50); epsilon is never negative, and a guarantee at a
negative epsilon implies the one at 0, so every epsilon here is clamped at 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import dp_accounting as dpa
from dp_accounting import pld as dpa_pld
from dp_accounting import rdp as dpa_rdp
from scipy.optimize import brentq

from leaklab.errors import LeaklabError
from leaklab.names import ACCOUNTANT_NAMES

__all__ = ["COMPOSE_ACCOUNTANTS", "DEFAULT_ACCOUNTANT", "Ledger", "compose", "dpsgd_epsilon",
           "dpsgd_sigma", "gaussian", "laplace", "subsampled_gaussian"]

COMPOSE_ACCOUNTANTS = ("rdp", "pld")
DEFAULT_ACCOUNTANT = "prv"
_MAX_SIGMA = 1e4
SIGMA_RANGE = (1e-6, 1e6)  # the noise multipliers any accountant here takes (1e300 overflowed, 1e-300 divided by 0)
GRID_MIN_SIGMA = 0.05  # prv's and pld's grids grow as sigma shrinks: 47 s for pld at 0.05, out of memory at 0.01
_MIN_SIGMA = 1e-3


def check_dpsgd_args(q: float, sigma: float, steps: int, delta: float) -> None:
    """Raise :class:`LeaklabError` unless DP-SGD's (q, sigma, steps, delta) are in range."""
    if not (0 < q <= 1):
        raise LeaklabError(f"the sampling rate q must lie in (0, 1] (got {q!r})")
    if not (SIGMA_RANGE[0] <= sigma <= SIGMA_RANGE[1]):  # outside it the accountants overflow or divide by 0
        raise LeaklabError(f"the noise multiplier sigma must lie in [{SIGMA_RANGE[0]:g}, {SIGMA_RANGE[1]:g}] "
                           f"(got {sigma!r})")
    if int(steps) != steps or steps < 1:
        raise LeaklabError(f"steps must be a whole number >= 1 (got {steps!r})")
    _check_delta(delta)


def _check_delta(delta: float) -> None:
    if not (0 < delta < 1):
        raise LeaklabError(f"delta must lie in (0, 1) (got {delta!r})")


def _check_accountant(accountant: str, allowed: tuple[str, ...] = ACCOUNTANT_NAMES) -> str:
    name = str(accountant).lower()
    if name not in allowed:
        raise LeaklabError(f"unknown accountant {accountant!r}; choose from {', '.join(allowed)}")
    return name


def _check_event(q: float, noise_multiplier: float, count: int) -> None:
    """Refuse an event's settings that its accountant would read as others (q = 1.5 as 1, 2.7 releases as 2) or
    fail on (a count of 0 divided by zero, a NaN noise)."""
    if not 0 < q <= 1:
        raise LeaklabError(f"the sampling rate q must lie in (0, 1] (got {q!r})")
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise LeaklabError(f"the noise multiplier must be a positive number (got {noise_multiplier!r})")
    if int(count) != count or count < 1:
        raise LeaklabError(f"the count of releases must be a whole number >= 1 (got {count!r})")


def subsampled_gaussian(q: float, noise_multiplier: float, count: int = 1) -> dpa.DpEvent:
    """``count`` steps of DP-SGD: Poisson sampling with rate q, then the Gaussian mechanism."""
    _check_event(q, noise_multiplier, count)
    event: dpa.DpEvent = dpa.GaussianDpEvent(noise_multiplier)
    if q < 1:
        event = dpa.PoissonSampledDpEvent(q, event)
    return dpa.SelfComposedDpEvent(event, int(count)) if count != 1 else event


def gaussian(noise_multiplier: float, count: int = 1) -> dpa.DpEvent:
    """``count`` releases with N(0, (noise_multiplier * l2-sensitivity)^2) noise."""
    return subsampled_gaussian(1.0, noise_multiplier, count)


def laplace(noise_multiplier: float, count: int = 1) -> dpa.DpEvent:
    """``count`` releases with Laplace noise of scale noise_multiplier * l1-sensitivity."""
    _check_event(1.0, noise_multiplier, count)
    event = dpa.LaplaceDpEvent(noise_multiplier)
    return dpa.SelfComposedDpEvent(event, int(count)) if count != 1 else event


def _epsilon(value: float, accountant: str) -> float:
    """An accountant's epsilon, clamped at 0 (module docstring); a :class:`LeaklabError` where it gives no finite
    one (pld's grid resolves no delta under about 1e-15: inf at 1e-16, where rdp gives 3.72 at q 0.01, sigma 1)."""
    if not math.isfinite(value):
        raise LeaklabError(f"the {accountant} accountant gives no finite epsilon here (got {value}); "
                           + ("use the rdp accountant" if accountant != "rdp" else "ask for a larger delta"))
    return max(0.0, float(value))


def _dpa_accountant(name: str) -> dpa.PrivacyAccountant:
    return dpa_rdp.RdpAccountant() if name == "rdp" else dpa_pld.PLDAccountant()


def compose(events: Iterable[dpa.DpEvent], delta: float, accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of all ``events`` applied to the same data (adaptive composition),
    with dp-accounting's ``"rdp"`` or ``"pld"`` accountant."""
    _check_delta(delta)
    acc = _dpa_accountant(_check_accountant(accountant, COMPOSE_ACCOUNTANTS))
    events = list(events)
    if not events:
        return 0.0
    event = dpa.ComposedDpEvent(events)
    if not acc.supports(event):
        raise LeaklabError(f"the {accountant} accountant cannot compose {event!r}")
    try:
        acc.compose(event)
        epsilon = acc.get_epsilon(delta)
    except (ValueError, OverflowError, MemoryError) as e:  # pld's grid past its sizes: 1e19 and 1e20 steps
        raise LeaklabError(f"the {accountant} accountant cannot compose these events ({type(e).__name__}: {e}); "
                           + ("use the rdp accountant" if accountant != "rdp" else "compose fewer")) from None
    return _epsilon(epsilon, accountant)


def check_accountable(q: float, sigma: float, steps: int, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> str:
    """The accountant's name, or a :class:`LeaklabError` where it cannot give DP-SGD's epsilon at these settings:
    what :func:`dpsgd_epsilon` checks before its work, which a training checks before it starts (it failed after
    its last step, its network lost)."""
    check_dpsgd_args(q, sigma, steps, delta)
    name = _check_accountant(accountant)
    if name != "rdp" and sigma < GRID_MIN_SIGMA:
        raise LeaklabError(f"the {name} accountant's grid grows as sigma shrinks: below {GRID_MIN_SIGMA:g} it runs "
                           f"out of memory or time (got sigma {sigma:g}); use the rdp accountant")
    return name


def dpsgd_epsilon(q: float, sigma: float, steps: int, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """Epsilon of DP-SGD with sampling rate ``q``, noise multiplier ``sigma`` (noise std / clipping
    norm) after ``steps`` steps, at ``delta``, by the named accountant (module docstring)."""
    name = check_accountable(q, sigma, steps, delta, accountant)
    if name == "pld":
        return compose([subsampled_gaussian(q, sigma, steps)], delta, "pld")
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism=name)
    acc.history = [(float(sigma), float(q), int(steps))]
    with warnings.catch_warnings():  # numerical notes of the PRV discretisation at extreme settings
        warnings.simplefilter("ignore")
        try:
            return _epsilon(acc.get_epsilon(delta=delta), name)
        except (RuntimeError, ValueError) as e:  # the PRV discretisation fails far from typical settings
            raise LeaklabError(f"the {name} accountant fails at q={q:g}, sigma={sigma:g}, steps={steps} "
                               f"({e}); use the rdp accountant") from None
        except MemoryError:  # its grid grows with steps / sigma: 84 GiB at sigma 1e-3, 345 GiB at 1e8 steps
            raise LeaklabError(f"the {name} accountant needs more memory than there is at q={q:g}, sigma={sigma:g}, "
                               f"steps={steps}; use the rdp accountant") from None


def dpsgd_sigma(q: float, steps: int, epsilon: float, delta: float, accountant: str = DEFAULT_ACCOUNTANT,
                rtol: float = 1e-3) -> float:
    """The smallest noise multiplier (to relative ``rtol``, on the safe side) with which DP-SGD
    (``q``, ``steps``) spends at most ``epsilon`` at ``delta`` by the named accountant; Brent's
    method on log sigma (epsilon decreases with sigma)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise LeaklabError(f"the target epsilon must be a positive number (got {epsilon!r})")
    check_dpsgd_args(q, 1.0, steps, delta)
    name = _check_accountant(accountant)

    def gap(log_sigma: float) -> float:
        return dpsgd_epsilon(q, math.exp(log_sigma), steps, delta, accountant) - epsilon

    step = math.log(4.0)
    lo, hi = math.log(0.25), math.log(4.0)
    while gap(hi) > 0:
        lo, hi = hi, hi + step
        if hi > math.log(_MAX_SIGMA):
            floor = "" if name != "rdp" else (  # RDP orders up to 63 bound its epsilon from below, whatever sigma
                f"; the rdp accountant's epsilon stays at {dpsgd_epsilon(q, _MAX_SIGMA, steps, delta, name):.3g} or "
                "more at this delta however large the noise: use the pld or prv accountant")
            raise LeaklabError(f"epsilon {epsilon} at delta {delta} needs a noise multiplier above "
                               f"{_MAX_SIGMA:g}{floor}")
    while gap(lo) < 0:
        lo, hi = lo - step, lo
        if lo < math.log(_MIN_SIGMA):
            raise LeaklabError(f"epsilon {epsilon} at delta {delta} holds with a noise multiplier below "
                               f"{_MIN_SIGMA:g}; ask for a smaller epsilon or delta")
    tol = math.log1p(rtol) / 4
    sigma = math.exp(brentq(gap, lo, hi, xtol=tol, rtol=1e-15) + 2 * tol)
    while dpsgd_epsilon(q, sigma, steps, delta, accountant) > epsilon:  # the safe side of the root
        sigma *= 1 + rtol / 2
    return sigma


@dataclass
class Ledger:
    """The uses of mechanisms on one dataset, in order; ``epsilon(delta)`` composes them."""

    events: list[dpa.DpEvent] = field(default_factory=list)

    def record(self, event: dpa.DpEvent) -> "Ledger":
        self.events.append(event)
        return self

    def spend(self, mechanism: object, count: int = 1) -> "Ledger":
        """Record ``count`` uses of a Laplace or Gaussian mechanism of :mod:`leaklab.privacy.mechanisms`
        (their noise relative to their sensitivity)."""
        from leaklab.privacy.mechanisms import GaussianMechanism, LaplaceMechanism

        if isinstance(mechanism, LaplaceMechanism):
            return self.record(laplace(mechanism.scale / mechanism.sensitivity, count))
        if isinstance(mechanism, GaussianMechanism):
            return self.record(gaussian(mechanism.sigma / mechanism.sensitivity, count))
        raise LeaklabError(f"the ledger composes Laplace and Gaussian mechanisms, not {type(mechanism).__name__}; "
                           "record a dp_accounting DpEvent for others")

    def epsilon(self, delta: float, accountant: str = "pld") -> float:
        return compose(self.events, delta, accountant)
