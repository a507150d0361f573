"""Empirical lower bounds on epsilon: does a mechanism deliver the epsilon it claims? (Not a seed
method: the check leaklab runs on its mechanisms, seed 003's Dirichlet mechanism among them, and DP-SGD.)

Run the mechanism ``runs`` times on each of two neighbouring inputs D and D', map every output to
a scalar score, and distinguish D from D' by a threshold on the score. For an (epsilon, delta)-DP
mechanism every test has FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta
(Kairouz, Oh & Viswanath 2015), so

    eps >= ln((1 - delta - FNR) / FPR)   and   eps >= ln((1 - delta - FPR) / FNR).

The procedure (as in Jagielski, Ullman & Oprea 2020; Nasr et al. 2021): the first half of the runs
picks the threshold, its direction and which of the two inequalities to use (a scan over the score
quantiles); the second, untouched half evaluates that one test, with one-sided Clopper-Pearson
upper bounds on FPR and FNR, each at level 1 - (1 - confidence)/2, so that the reported bound
holds with probability at least ``confidence``. A valid mechanism can then exceed its claim only
with probability below 1 - confidence.

``AuditCase`` builders for the mechanisms of :mod:`leaklab.privacy.mechanisms` and
:mod:`leaklab.privacy.dirichlet` use the exact
log-likelihood ratio of the two output distributions as the score where it is known (the most
powerful test by Neyman-Pearson) and the output itself for additive noise. ``broken=True`` halves
the noise scale (twice the concentration for Dirichlet) while keeping the claim: the audit must
catch it.

DP-SGD training is audited with gradient canaries through the same test (:func:`audit_dpsgd`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from leaklab.errors import LeaklabError
from leaklab.names import AUDIT_TEST_NAMES, MECHANISM_ALIASES, MECHANISM_NAMES
from leaklab.privacy import mechanisms as mech
from leaklab.privacy.dirichlet import DirichletMechanism, adjacent_spread

__all__ = ["AuditCase", "AuditResult", "clopper_pearson", "epsilon_lower_bound", "audit", "audit_case",
           "audit_dpsgd", "canary_batch", "dpsgd_canary_scores"]

MAX_RUNS = 10_000_000  # runs per input: two float64 score arrays of 80 MB each
MAX_CANARIES = 10_000  # per training run: the canaries are rows of an identity matrix of this size (400 MB)
MAX_CANARY_STEPS = 100_000  # runs times steps of the canary audit's DP-SGD trainings (about 1 ms each: minutes)


def clopper_pearson(successes: Any, trials: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds (lower, upper), each holding with probability >= level."""
    x = np.asarray(successes, dtype=float)
    a = 1 - level
    lower = np.where(x > 0, stats.beta.ppf(a, np.maximum(x, 1e-300), trials - x + 1), 0.0)
    upper = np.where(x < trials, stats.beta.ppf(1 - a, x + 1, np.maximum(trials - x, 1e-300)), 1.0)
    return lower, upper


@dataclass
class AuditCase:
    """Two neighbouring inputs of a mechanism, as samplers of scores, and the claim to check."""

    name: str
    claimed_epsilon: float
    claimed_delta: float
    sample_scores: Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]]
    details: dict


@dataclass
class AuditResult:
    mechanism: str
    claimed_epsilon: float
    claimed_delta: float
    epsilon_lower_bound: float
    confidence: float
    runs: int
    fpr_upper: float
    fnr_upper: float
    threshold: float
    details: dict

    def to_dict(self) -> dict:
        return {"mechanism": self.mechanism, "claimed_epsilon": self.claimed_epsilon,
                "claimed_delta": self.claimed_delta, "epsilon_lower_bound": self.epsilon_lower_bound,
                "confidence": self.confidence, "runs": self.runs, "fpr_upper": self.fpr_upper,
                "fnr_upper": self.fnr_upper, "threshold": self.threshold,
                "violated": self.epsilon_lower_bound > self.claimed_epsilon, **self.details}


def _bounds(flag_a: np.ndarray, flag_b: np.ndarray, n_a: int, n_b: int, delta: float,
            level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For tests flagging 'D-prime': FP = flags on D's runs, FN = misses on D'-runs.
    Returns (eps bound form 1, eps bound form 2, (fpr_u, fnr_u) stacked)."""
    _, fpr_u = clopper_pearson(flag_a, n_a, level)
    _, fnr_u = clopper_pearson(n_b - flag_b, n_b, level)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.log(np.maximum(1 - delta - fnr_u, 0) / fpr_u)
        e2 = np.log(np.maximum(1 - delta - fpr_u, 0) / fnr_u)
    e1 = np.where(np.isfinite(e1), e1, -np.inf)
    e2 = np.where(np.isfinite(e2), e2, -np.inf)
    return e1, e2, np.stack([fpr_u, fnr_u])


def _counts(sorted_scores: np.ndarray, thresholds: np.ndarray, direction: int) -> np.ndarray:
    """How many scores are flagged by 'score >= t' (direction +1) or 'score <= t' (-1)."""
    if direction > 0:
        return sorted_scores.size - np.searchsorted(sorted_scores, thresholds, side="left")
    return np.searchsorted(sorted_scores, thresholds, side="right")


def _scan(a: np.ndarray, b: np.ndarray, delta: float, confidence: float, max_thresholds: int) -> dict:
    """All runs, every threshold: Bonferroni over the 2 x 2 x T Clopper-Pearson bounds."""
    a, b = np.sort(a), np.sort(b)
    pooled = np.concatenate([a, b])
    candidates = np.unique(pooled)
    if candidates.size > max_thresholds:
        candidates = np.unique(np.quantile(pooled, np.linspace(0, 1, max_thresholds)))
    level = 1 - (1 - confidence) / (4 * candidates.size)
    best = {"epsilon_lower_bound": 0.0, "fpr_upper": 1.0, "fnr_upper": 1.0, "threshold": float(candidates[0]),
            "direction": 1, "form": 1}
    for direction in (1, -1):
        e1, e2, rates = _bounds(_counts(a, candidates, direction), _counts(b, candidates, direction),
                                a.size, b.size, delta, level)
        for form, e in ((1, e1), (2, e2)):
            i = int(np.argmax(e))
            if e[i] > best["epsilon_lower_bound"]:
                best = {"epsilon_lower_bound": float(e[i]), "fpr_upper": float(rates[0, i]),
                        "fnr_upper": float(rates[1, i]), "threshold": float(candidates[i]),
                        "direction": direction, "form": form}
    return best


def epsilon_lower_bound(scores_a: np.ndarray, scores_b: np.ndarray, delta: float = 0.0,
                        confidence: float = 0.95, max_thresholds: int = 2000, test: str = "split") -> dict:
    """The lower bound on epsilon from scores of runs on D (``scores_a``) and D' (``scores_b``).

    ``test="split"`` (default): the first half of each picks the test, the second half evaluates it
    (module docstring). ``test="scan"``: every threshold on all runs, the Clopper-Pearson levels
    corrected (Bonferroni) for the number of thresholds tried (at most 200 quantiles)."""
    a = np.asarray(scores_a, dtype=float).ravel()
    b = np.asarray(scores_b, dtype=float).ravel()
    if a.size < 4 or b.size < 4:
        raise LeaklabError("the audit needs at least 4 runs on each input")
    if test == "scan":
        return _scan(a, b, delta, confidence, min(max_thresholds, 200))
    if test != "split":
        raise LeaklabError(f"unknown test {test!r}; choose {' or '.join(AUDIT_TEST_NAMES)}")
    level = 1 - (1 - confidence) / 2
    ha, hb = a.size // 2, b.size // 2
    sel_a, ev_a = np.sort(a[:ha]), np.sort(a[ha:])
    sel_b, ev_b = np.sort(b[:hb]), np.sort(b[hb:])
    pooled = np.concatenate([sel_a, sel_b])
    candidates = np.unique(pooled)
    if candidates.size > max_thresholds:
        candidates = np.unique(np.quantile(pooled, np.linspace(0, 1, max_thresholds)))
    best = (-np.inf, 0.0, 1, 0)
    for direction in (1, -1):
        e1, e2, _ = _bounds(_counts(sel_a, candidates, direction), _counts(sel_b, candidates, direction),
                            sel_a.size, sel_b.size, delta, level)
        for form, e in ((1, e1), (2, e2)):
            i = int(np.argmax(e))
            if e[i] > best[0]:
                best = (float(e[i]), float(candidates[i]), direction, form)
    _, threshold, direction, form = best
    t = np.array([threshold])
    e1, e2, rates = _bounds(_counts(ev_a, t, direction), _counts(ev_b, t, direction), ev_a.size, ev_b.size,
                            delta, level)
    eps = float((e1 if form == 1 else e2)[0])
    return {"epsilon_lower_bound": max(eps, 0.0), "fpr_upper": float(rates[0, 0]),
            "fnr_upper": float(rates[1, 0]), "threshold": threshold, "direction": direction, "form": form}


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise LeaklabError(f"confidence must lie in (0, 1) (got {confidence})")


def audit(case: AuditCase, runs: int = 100_000, seed: int = 0, confidence: float = 0.95,
          test: str = "split") -> AuditResult:
    """Audit one case: ``runs`` runs on each input; ``test``: split or scan (epsilon_lower_bound)."""
    if not 4 <= runs <= MAX_RUNS:
        raise LeaklabError(f"--runs must be from 4 to {MAX_RUNS:,} (got {runs})")
    _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    scores_a, scores_b = case.sample_scores(runs, rng)
    found = epsilon_lower_bound(scores_a, scores_b, case.claimed_delta, confidence, test=test)
    return AuditResult(mechanism=case.name, claimed_epsilon=case.claimed_epsilon,
                       claimed_delta=case.claimed_delta, epsilon_lower_bound=found["epsilon_lower_bound"],
                       confidence=confidence, runs=runs, fpr_upper=found["fpr_upper"],
                       fnr_upper=found["fnr_upper"], threshold=found["threshold"],
                       details={**case.details, "test": test})


# --------------------------------------------------------------------------------------------
# cases for the mechanisms


def _laplace(epsilon: float, broken: bool) -> AuditCase:
    m = mech.LaplaceMechanism(epsilon, sensitivity=1.0, scale_factor=0.5 if broken else 1.0)
    return AuditCase("laplace", m.epsilon, 0.0,
                     lambda n, rng: (m.sample(0.0, rng, n), m.sample(1.0, rng, n)),
                     {"inputs": [0.0, 1.0], "noise_scale": m.scale})


def _gaussian(epsilon: float, broken: bool, delta: float | None = None) -> AuditCase:
    m = mech.GaussianMechanism(epsilon, 1e-5 if delta is None else delta, scale_factor=0.5 if broken else 1.0)
    return AuditCase("gaussian", m.epsilon, m.delta,
                     lambda n, rng: (m.sample(0.0, rng, n), m.sample(1.0, rng, n)),
                     {"inputs": [0.0, 1.0], "sigma": m.sigma, "calibration": m.calibration})


def _exponential(epsilon: float, broken: bool, candidates: int = 10) -> AuditCase:
    # u and u' differ by the sensitivity on every candidate: +1 on candidate 0, -1 elsewhere
    m = mech.ExponentialMechanism(epsilon, 1.0, scale_factor=0.5 if broken else 1.0)
    u = np.zeros(candidates)
    u2 = -np.ones(candidates)
    u2[0] = 1.0
    llr = m.log_probabilities(u) - m.log_probabilities(u2)
    return AuditCase("exponential", m.epsilon, 0.0,
                     lambda n, rng: (llr[m.sample(u, rng, n)], llr[m.sample(u2, rng, n)]),
                     {"candidates": candidates, "score": "log-likelihood ratio"})


def _randomized_response(epsilon: float, broken: bool, k: float = 4) -> AuditCase:
    if not math.isfinite(k) or int(k) != k or not 2 <= k <= mech.MAX_CATEGORIES:
        raise LeaklabError(f"--k for randomized-response is a whole number of categories from 2 to "
                           f"{mech.MAX_CATEGORIES:,} (got {k:g})")
    k = int(k)
    m = mech.RandomizedResponse(epsilon, k)
    real = mech.RandomizedResponse(2 * epsilon, k) if broken else m
    return AuditCase("randomized-response", m.epsilon, 0.0,
                     lambda n, rng: ((real.sample(np.int64(0), rng, n) == 0).astype(float),
                                     (real.sample(np.int64(1), rng, n) == 0).astype(float)),
                     {"k": k, "inputs": [0, 1], "broken_epsilon": 2 * epsilon if broken else None})


def _dirichlet(epsilon: float | None, broken: bool, delta: float | None = None, k: float = 6.7,
               eta: float = 0.15, eta_bar: float = 0.15, b: float = 0.1, w: int = 3) -> AuditCase:
    if epsilon is not None:
        raise LeaklabError("the Dirichlet mechanism's epsilon follows from --k, --eta, --eta-bar, --b, --w and "
                           "--delta; leave out --epsilon")
    spread = adjacent_spread(eta, eta_bar, b, w)
    if not spread:  # before the gamma search (seconds)
        raise LeaklabError(f"this Dirichlet domain is one point (|W| eta = 1 - eta_bar = {1 - eta_bar:g}): no two of "
                           "its inputs are b-adjacent, so there is nothing to audit")
    m = DirichletMechanism(k, eta, eta_bar, b, w, 0.05 if delta is None else delta,
                           scale_factor=0.5 if broken else 1.0)
    # the worst case of Theorem 1.6's Gamma part: p_i = eta + b/2 vs q_i = eta on a W-coordinate (eta + the spread
    # where the domain is narrower than b/2)
    p = np.full(w + 1, eta)
    p[0] += spread
    p[-1] = 1 - p[:-1].sum()
    q = p.copy()
    q[0], q[1] = p[1], p[0]
    kk = m.concentration
    dalpha = kk * (p - q)

    def sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        xa, xb = m.sample(p, rng, n), m.sample(q, rng, n)
        # log pdf(x | p) - log pdf(x | q) = sum (alpha_p - alpha_q) log x + const (const cancels)
        return np.log(xa) @ dalpha, np.log(xb) @ dalpha

    return AuditCase("dirichlet", m.epsilon, m.delta, sample,
                     {"k": k, "eta": eta, "eta_bar": eta_bar, "b": b, "w": w, "gamma": m.gamma,
                      "inputs": [p.tolist(), q.tolist()], "score": "log-likelihood ratio"})


_BUILDERS = {"laplace": _laplace, "gaussian": _gaussian, "exponential": _exponential,
             "randomized-response": _randomized_response, "dirichlet": _dirichlet}


def audit_case(mechanism: str, epsilon: float | None = None, *, broken: bool = False, **options: Any) -> AuditCase:
    """The audit case of a named mechanism (:data:`~leaklab.names.MECHANISM_NAMES`, or an alias) at a
    claimed epsilon; ``broken`` halves its noise. Options: ``delta`` (gaussian 1e-5, dirichlet 0.05),
    ``k``/``eta``/``eta_bar``/``b``/``w`` (dirichlet), ``candidates`` (exponential), ``k`` (randomized
    response categories)."""
    name = mechanism.lower().replace("_", "-")
    name = MECHANISM_ALIASES.get(name, name)
    if name not in _BUILDERS:
        raise LeaklabError(f"unknown mechanism {mechanism!r}; choose from {', '.join(MECHANISM_NAMES)}")
    if name != "dirichlet":
        if epsilon is None:
            raise LeaklabError(f"give --epsilon for the {name} mechanism")
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise LeaklabError(f"--epsilon must be a positive number (got {epsilon})")
    options = {k: v for k, v in options.items() if v is not None}
    def takes(builder: Callable) -> set[str]:
        return set(inspect.signature(builder).parameters) - {"epsilon", "broken"}

    unused = sorted(o for o in options if o not in takes(_BUILDERS[name]))
    if unused:  # an option the mechanism has no use for was silently ignored (--delta for laplace)
        owners = sorted(m for m, builder in _BUILDERS.items() if unused[0] in takes(builder))
        raise LeaklabError(f"{', '.join('--' + o.replace('_', '-') for o in unused)}: not an option of the {name} "
                           f"mechanism (--{unused[0].replace('_', '-')} is {' and '.join(owners)}'s); leave it out")
    return _BUILDERS[name](epsilon, broken, **options)


# --------------------------------------------------------------------------------------------
# canary audit of DP-SGD training


def dpsgd_canary_scores(q: float, noise_multiplier: float, steps: int, *, canaries: int = 1000, runs: int = 10,
                        clip: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scores of gradient canaries in real DP-SGD trainings (opacus, :func:`leaklab.privacy.dpsgd.make_private`).

    The Dirac gradient canary of Nasr et al., "Tight auditing of differentially private machine
    learning", USENIX Security 2023 (Sec. 4): canary j is a sample whose gradient is ``2 clip e_j``
    (clipped to ``clip e_j``): a linear model without bias on inputs ``2 clip e_j`` with the loss
    ``mean(model(x))``. Each run trains a fresh zero-initialised model on a random half of the
    ``canaries`` (the others are left out) for ``steps`` steps at sampling rate ``q``; the adversary
    sees the final model only and scores canary j by ``-w_j B / (lr clip)`` = (times j was sampled)
    + N(0, steps sigma^2). Because each canary moves only its own coordinate and the noise is i.i.d.
    per coordinate, the ``canaries`` coordinates of one run are independent draws of the
    in-or-out experiment for one sample (the observation behind Steinke, Nasr & Jagielski, "Privacy
    auditing with one (1) training run", NeurIPS 2023, here with the two-sample test of this module
    instead of their bound). Returns (scores of left-out canaries, scores of inserted ones), each
    ``runs * canaries / 2`` long.
    """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from leaklab.privacy.dpsgd import make_private

    _check_canary_work(runs, steps)
    half = canaries // 2
    batch = canary_batch(q, canaries)[0]
    out_scores, in_scores = [], []
    for r in range(runs):
        g = torch.Generator().manual_seed(seed * 1_000_003 + r)
        order = torch.randperm(canaries, generator=g)
        inserted, left_out = order[:half], order[half:]
        data = TensorDataset(2 * clip * torch.eye(canaries)[inserted])
        model = nn.Linear(canaries, 1, bias=False)
        nn.init.zeros_(model.weight)
        loader = DataLoader(data, batch_size=batch, generator=g)
        run = make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), loader, clip=clip,
                           noise_multiplier=noise_multiplier, seed=seed * 1_000_003 + r)
        run.train(steps, lambda net, batch: net(batch[0]).mean())
        run.close()
        score = (-model.weight.detach()[0] * run.optimizer.expected_batch_size / clip).double().numpy()
        out_scores.append(score[left_out.numpy()])
        in_scores.append(score[inserted.numpy()])
    return np.concatenate(out_scores), np.concatenate(in_scores)


def _check_canary_work(runs: int, steps: int) -> None:
    """Refuse a canary audit of no run or of more than :data:`MAX_CANARY_STEPS` training steps in all (1e6 runs
    ran on, unbounded)."""
    if runs < 1:
        raise LeaklabError(f"the canary audit needs at least one run (got {runs})")
    if runs * steps > MAX_CANARY_STEPS:
        raise LeaklabError(f"the canary audit trains --runs times --steps DP-SGD steps, at most {MAX_CANARY_STEPS:,} "
                           f"(got {runs:,} x {steps:,})")


def canary_batch(q: float, canaries: int) -> tuple[int, float]:
    """The batch size the canary trainings use for sampling rate ``q`` over half of ``canaries``, and
    the rate opacus then realises (one over the number of batches, ``1 / ceil(half / batch)``): the
    rate the claim must be computed at (``q`` = 0.7 over 1,000 canaries runs at 0.5)."""
    if not 2 <= canaries <= MAX_CANARIES or canaries % 2:
        raise LeaklabError(f"the canary audit needs an even number of canaries from 2 to {MAX_CANARIES:,} "
                           f"(got {canaries})")
    half = canaries // 2
    batch = max(1, round(q * half))
    return batch, 1 / math.ceil(half / batch)


def audit_dpsgd(q: float, noise_multiplier: float, steps: int, delta: float = 1e-5, *, canaries: int = 1000,
                runs: int = 10, seed: int = 0, confidence: float = 0.95, test: str = "split",
                broken: bool = False, accountant: str | None = None) -> AuditResult:
    """Empirical lower bound on the epsilon of DP-SGD training from gradient canaries
    (:func:`dpsgd_canary_scores`), against the epsilon the accountant claims for (``q``,
    ``noise_multiplier``, ``steps``, ``delta``), ``q`` taken as the rate the trainings realise
    (:func:`canary_batch`; ``details["sample_rate"]``). ``broken=True`` trains with half the noise and keeps
    the claim. The final-model, summed-score adversary is weak when ``q < 1``: tight bounds need
    q = 1 (Nasr et al. 2023, Sec. 5)."""
    from leaklab.privacy.accounting import DEFAULT_ACCOUNTANT, check_dpsgd_args, dpsgd_epsilon

    _check_confidence(confidence)
    check_dpsgd_args(q, noise_multiplier, steps, delta)  # before q is turned into the realised rate
    _check_canary_work(runs, steps)  # before the claim's accounting (seconds at many steps)
    rate = canary_batch(q, canaries)[1]  # what the trainings realise, which the claim is about
    claimed = dpsgd_epsilon(rate, noise_multiplier, steps, delta, accountant or DEFAULT_ACCOUNTANT)
    trained = noise_multiplier * (0.5 if broken else 1.0)
    out_scores, in_scores = dpsgd_canary_scores(q, trained, steps, canaries=canaries, runs=runs, seed=seed)
    found = epsilon_lower_bound(out_scores, in_scores, delta, confidence, test=test)
    return AuditResult(mechanism="dpsgd", claimed_epsilon=claimed, claimed_delta=delta,
                       epsilon_lower_bound=found["epsilon_lower_bound"], confidence=confidence,
                       runs=out_scores.size, fpr_upper=found["fpr_upper"], fnr_upper=found["fnr_upper"],
                       threshold=found["threshold"],
                       details={"q": q, "sample_rate": rate, "noise_multiplier": noise_multiplier,
                                "steps": steps, "canaries": canaries,
                                "training_runs": runs, "broken": broken, "trained_noise_multiplier": trained,
                                "accountant": accountant or DEFAULT_ACCOUNTANT, "test": test})
