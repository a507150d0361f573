"""Privacy-engineered policy synthesis and its cost of privacy: seed 003 (Gohari, thesis 2023) chapter 2.

Algorithm 1 (Sec. 2.4): every transition vector P(s, a) of the MDP is released through the Dirichlet mechanism,
P-bar(s, a) ~ Dir(k P(s, a)) (:func:`privatize_transitions`, chapter 1's mechanism), and the policy is synthesised
and evaluated on the privatised MDP M-bar alone (:func:`synthesize_private_policy`); by post-processing (Lemma 2.1)
the output is as private as the mechanism.

The cost of privacy |E[V(s0) | P-bar, k] - V-bar(s0)| is bounded (Theorems 2.4 and 2.6) by the optimistic minus the
pessimistic value of the released policy, evaluated with every P(s, a) free to move within the uncertainty set
(eq. 2.2) P-hat = {beta P1 + (1 - beta) P2 : P1, P2 in the simplex, ||P2 - P-bar(s, a)||_inf <= alpha}, where
alpha = sqrt(log(1/beta) / (2 (k + 1))) is Lemma 2.2's concentration radius (:func:`concentration_radius`; it
fails for vectors with many small entries at small k, so a union-bound radius is offered beside it).

The thesis solves the inner problem min_{p in P-hat} p.v as the linear program (P) of Sec. 2.6 (3|S| variables,
one interior-point solve per stage, state and action). Here it is solved in closed form
(:func:`robust_expectation`): P1 puts its mass on the extreme state, and P2 is a fractional knapsack, starting at
the box's lower ends max(0, P-bar - alpha) and pouring the remaining mass into states in order of value, each up to
min(1, P-bar + alpha); O(|S| log |S|) per vector and vectorised over all (s, a). :func:`robust_expectation_lp` is
the program (P) itself, solved by scipy's HiGHS: the reference the closed form is tested against and timed beside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from leaklab.errors import LeaklabError
from leaklab.planning.mdp import TabularMDP, check_policy, evaluate, optimal_policy
from leaklab.privacy.dirichlet import MAX_K

__all__ = ["PrivateSynthesis", "concentration_radius", "privatize_transitions", "extreme_distribution",
           "robust_expectation",
           "robust_expectation_lp", "robust_evaluation", "synthesize_private_policy"]

Sense = Literal["min", "max"]
FIXED_POINT_TOLERANCE = 1e-12  # the infinite-horizon bounds' Bellman residual, relative to their largest value
MAX_ADVERSARY_STEPS = 1000


def _check_k(k: float) -> None:
    if not (isinstance(k, (int, float)) and not isinstance(k, bool) and math.isfinite(k) and 0 < k <= MAX_K):
        raise LeaklabError(f"the Dirichlet concentration k is in (0, {MAX_K:g}] (got {k!r})")


def _check_k_beta(k: float, beta: float) -> None:
    _check_k(k)
    if not (isinstance(beta, (int, float)) and 0 < beta < 1):
        raise LeaklabError(f"beta, the concentration bound's failure probability, is in (0, 1) (got {beta!r})")


def concentration_radius(k: float, beta: float, states: int | None = None) -> float:
    """Lemma 2.2's alpha = sqrt(log(1/beta) / (2 (k + 1))), with which the thesis claims
    P(||Dir_k(p) - p||_inf >= alpha) <= beta for p in the simplex interior. Its proof bounds one coordinate, one
    side, and drops the maximum over coordinates; leaklab measured it failing for many small entries (p uniform over
    20 states: 9.1% at k = 2, 5.4% at k = 5, against beta = 5%; docs/reproductions.md). ``states`` given: the
    radius with the union bound over both sides of every coordinate, sqrt(log(2 |S| / beta) / (2 (k + 1))), which
    holds for every p (each coordinate is Beta, 1/(4(k + 1))-sub-Gaussian)."""
    _check_k_beta(k, beta)
    if states is not None and not (isinstance(states, int) and states >= 2):
        raise LeaklabError(f"the union bound's state count is a whole number of at least 2 (got {states!r})")
    spread = 1 if states is None else 2 * states
    return math.sqrt(math.log(spread / beta) / (2 * (k + 1)))


def privatize_transitions(transitions: Any, k: float, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 1, step 1: every P(s, a) (the last axis) replaced by a draw of Dir(k P(s, a)), independently.
    The mechanism is defined on the simplex interior, so every entry must be positive (a zero would be released
    as a certain zero: the support is not private)."""
    _check_k(k)
    p = np.asarray(transitions, dtype=float)
    if p.ndim < 1 or p.shape[-1] < 2:
        raise LeaklabError("the Dirichlet mechanism privatises distributions over 2 states or more (a one-state "
                           "MDP's transitions are certain and have nothing to hide)")
    if not np.isfinite(p).all() or p.min() <= 0 \
            or np.abs(p.sum(axis=-1) - 1).max() > 1e-9:
        raise LeaklabError("the Dirichlet mechanism privatises probability vectors with every entry positive and "
                           "summing to 1: mix a vector with zeros with a little of the uniform distribution first")
    rows = p.reshape(-1, p.shape[-1])
    return np.stack([rng.dirichlet(k * row) for row in rows]).reshape(p.shape)


def _check_set(p_bar: np.ndarray, values: np.ndarray, alpha: float, beta: float, sense: str) -> None:
    if sense not in ("min", "max"):
        raise LeaklabError(f"sense is 'min' (pessimistic) or 'max' (optimistic), not {sense!r}")
    if values.ndim != 1 or p_bar.shape[-1:] != values.shape:
        raise LeaklabError(f"values are one number per state ({p_bar.shape[-1]}; got shape {tuple(values.shape)})")
    if not (0 <= alpha and 0 <= beta <= 1):
        raise LeaklabError(f"the uncertainty set needs alpha >= 0 and beta in [0, 1] (got {alpha!r}, {beta!r})")


def extreme_distribution(p_bar: Any, values: Any, alpha: float, beta: float, sense: Sense) -> np.ndarray:
    """The distribution in eq. 2.2's set around each vector ``p_bar[..., :]`` that minimises (or maximises)
    p . values, in closed form: beta on the state of extreme value, plus (1 - beta) times the fractional knapsack
    over the box [P-bar - alpha, P-bar + alpha] clipped to [0, 1], intersected with the simplex (start at the box's
    lower ends, pour the remaining mass into states in order of value, each up to its upper end)."""
    p_bar = np.asarray(p_bar, dtype=float)
    v = np.asarray(values, dtype=float)
    _check_set(p_bar, v, alpha, beta, sense)
    order = np.argsort(v if sense == "min" else -v, kind="stable")  # the states that help most first
    low = np.clip(p_bar - alpha, 0.0, 1.0)[..., order]
    room = np.clip(p_bar + alpha, 0.0, 1.0)[..., order] - low
    left = 1.0 - low.sum(axis=-1, keepdims=True)  # >= 0: P-bar itself lies in the box
    before = np.cumsum(room, axis=-1) - room
    p2 = np.empty_like(p_bar)
    p2[..., order] = low + np.clip(left - before, 0.0, room)
    p = (1 - beta) * p2
    p[..., order[0]] += beta
    return p


def robust_expectation(p_bar: Any, values: Any, alpha: float, beta: float, sense: Sense) -> np.ndarray:
    """min (or max) of p . values over p in eq. 2.2's set around each vector ``p_bar[..., :]``
    (:func:`extreme_distribution`'s p . values). Equal to the linear program (P) of Sec. 2.6."""
    return extreme_distribution(p_bar, values, alpha, beta, sense) @ np.asarray(values, dtype=float)


def robust_expectation_lp(p_bar: Any, values: Any, alpha: float, beta: float, sense: Sense) -> float:
    """The inner problem as the thesis states it, the linear program (P) of Sec. 2.6 over (P1, P2, p) in R^{3|S|}
    for one vector ``p_bar``, solved by scipy's HiGHS (the max by negating the objective)."""
    from scipy.optimize import linprog

    p_bar = np.asarray(p_bar, dtype=float)
    v = np.asarray(values, dtype=float)
    _check_set(p_bar, v, alpha, beta, sense)
    if p_bar.ndim != 1:
        raise LeaklabError("the linear program takes one transition vector")
    n = v.size
    sign = 1.0 if sense == "min" else -1.0
    cost = np.concatenate([np.zeros(2 * n), sign * v])
    eye, zeros, ones = np.eye(n), np.zeros((1, n)), np.ones((1, n))
    a_eq = np.block([[ones, zeros, zeros], [zeros, ones, zeros], [zeros, zeros, ones],
                     [beta * eye, (1 - beta) * eye, -eye]])
    b_eq = np.concatenate([np.ones(3), np.zeros(n)])
    bounds = [(0, None)] * n + [(max(0.0, x - alpha), x + alpha) for x in p_bar] + [(0, None)] * n
    solved = linprog(cost, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if solved.status != 0:
        raise LeaklabError(f"the linear program (P) failed: {solved.message}")  # pragma: no cover
    return float(sign * solved.fun)


def robust_evaluation(mdp: TabularMDP, policy: Any, alpha: float, beta: float, sense: Sense) -> np.ndarray:
    """The pessimistic (``sense`` 'min') or optimistic ('max') value of a deterministic ``policy`` when every
    transition vector of ``mdp`` (the privatised M-bar) may move within eq. 2.2's set, chosen anew at each stage:
    Theorem 2.4's recursion from v_T = R_T for a finite horizon (``[T + 1, S]``), Theorem 2.6's fixed point of the
    gamma-contraction L1 (Lemma 2.5) for an infinite one (``[S]``), solved exactly rather than by Sec. 2.6.2's
    iteration (whose step count grows as 1 / (1 - gamma)): the adversary's extreme distributions and the linear
    system they give alternate until the Bellman residual is below :data:`FIXED_POINT_TOLERANCE` times the
    values' size."""
    pi = check_policy(mdp, policy)
    rows = np.arange(mdp.n_states)
    if mdp.horizon is not None:
        values = np.empty((mdp.horizon + 1, mdp.n_states))
        values[-1] = mdp.terminal
        for t in range(mdp.horizon - 1, -1, -1):
            inner = robust_expectation(mdp.transitions[rows, pi[t]], values[t + 1], alpha, beta, sense)
            values[t] = mdp.rewards[rows, pi[t]] + mdp.discount * inner
        return values
    # the fixed point of L1 (Lemma 2.5) exactly: the adversary's choice depends on the values only through their
    # order, so alternate choosing it and solving the linear system it gives (policy iteration for the adversary,
    # monotone and finite)
    p_pi, r_pi = mdp.transitions[rows, pi], mdp.rewards[rows, pi]
    values = evaluate(mdp, pi)
    for _ in range(MAX_ADVERSARY_STEPS):
        chosen = extreme_distribution(p_pi, values, alpha, beta, sense)
        values = np.linalg.solve(np.eye(mdp.n_states) - mdp.discount * chosen, r_pi)
        residual = r_pi + mdp.discount * robust_expectation(p_pi, values, alpha, beta, sense) - values
        if np.abs(residual).max() <= FIXED_POINT_TOLERANCE * max(1.0, float(np.abs(values).max())):
            return values
    raise LeaklabError(f"the robust evaluation did not settle in {MAX_ADVERSARY_STEPS} steps")  # pragma: no cover


@dataclass(frozen=True)
class PrivateSynthesis:
    """Algorithm 1's output and Theorems 2.4/2.6's bounds. ``policy`` and ``values`` (V-bar of the policy under
    M-bar) are what is released; ``lower`` and ``upper`` are the pessimistic and optimistic values over eq. 2.2's set
    (the same shapes as ``values``); ``private_mdp`` is M-bar."""

    k: float
    beta: float
    alpha: float
    private_mdp: TabularMDP
    policy: np.ndarray
    values: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def at_start(self, values: np.ndarray) -> float:
        """A value function's entry for s0 (at stage 0 for a finite horizon)."""
        return float((values if values.ndim == 1 else values[0])[self.private_mdp.start])

    @property
    def private_value(self) -> float:
        """V-bar(s0), the released value."""
        return self.at_start(self.values)

    @property
    def cost_bound(self) -> float:
        """The bound on the cost of privacy, upper(s0) - lower(s0) (Theorems 2.4 and 2.6)."""
        return self.at_start(self.upper) - self.at_start(self.lower)


def synthesize_private_policy(mdp: TabularMDP, k: float, rng: np.random.Generator, beta: float = 0.05,
                              union_bound: bool = False) -> PrivateSynthesis:
    """Algorithm 1 on ``mdp``: privatise every P(s, a) with Dir_k, synthesise an optimal policy of M-bar and its
    value there, never looking at the true P again; then bound the cost of privacy at confidence ``beta``, with
    Lemma 2.2's radius as printed or (``union_bound``) the one that holds for every transition vector
    (:func:`concentration_radius`)."""
    alpha = concentration_radius(k, beta, mdp.n_states if union_bound else None)
    private = mdp.with_transitions(privatize_transitions(mdp.transitions, k, rng))
    policy, values = optimal_policy(private)
    return PrivateSynthesis(k=float(k), beta=float(beta), alpha=alpha, private_mdp=private, policy=policy,
                            values=values, lower=robust_evaluation(private, policy, alpha, beta, "min"),
                            upper=robust_evaluation(private, policy, alpha, beta, "max"))
