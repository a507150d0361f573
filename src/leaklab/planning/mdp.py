"""Tabular Markov decision processes as seed 003 (Gohari, thesis 2023) chapter 2 writes them (Sec. 2.3):
M = (S, A_s, P, R, T, gamma) with one-step rewards R(s, a), transition vectors P(s, a) on the simplex, a horizon T
(finite, with terminal rewards R_T(s), or infinite and discounted) and the start state s0.

Every state offers the same |A| actions. Policies are deterministic (the maximum over stochastic policies is
attained by a greedy action, Sec. 2.4): an int array ``[T, S]`` of stage decision rules for a finite horizon,
``[S]`` for an infinite one; value functions are ``[T + 1, S]`` (``values[T]`` = R_T) and ``[S]``.
:func:`optimal_policy` solves by backward induction or policy iteration, :func:`evaluate` evaluates exactly.
:func:`random_mdp` and :func:`investment_mdp` are the chapter's two examples (Sec. 2.7).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from leaklab.errors import LeaklabError, check_keys

__all__ = ["TabularMDP", "q_values", "optimal_policy", "check_policy", "evaluate", "random_mdp", "investment_mdp"]

MAX_STATES = 2_000
MAX_TRANSITIONS = 20_000_000  # entries of the [S, A, S] array: 160 MB of float64
MAX_STAGE_VALUES = 2_000_000  # (T + 1) * S: a finite horizon's value and policy tables
MAX_HORIZON = 100_000
MAX_REWARD = 1e100  # |R|, |R_T|: values stay finite for every horizon and discount allowed
ROW_TOLERANCE = 1e-9  # how far a transition vector's sum may be from 1
# an infinite horizon's largest discount: the values solve (I - discount P) v = r, whose condition number grows as
# 1 / (1 - discount); at 1 - 1e-15 one plan in six came out wrong (a singular solve, or values of 1e17 for rewards
# in [0, 1]), none at 1 - 1e-14: this keeps float64's rounding under about 1e-7 of the values
MAX_DISCOUNT = 1 - 1e-9


@dataclass(frozen=True)
class TabularMDP:
    """An MDP M = (S, A, P, R, T, gamma) (seed 003, Sec. 2.3), validated at construction.

    ``transitions[s, a]`` is P(s, a), the distribution of the next state; ``rewards[s, a]`` is R(s, a);
    ``terminal[s]`` is R_T(s) (finite horizon only); ``horizon`` None is an infinite horizon, which needs
    ``discount`` < 1; ``start`` is s0.
    """

    transitions: np.ndarray
    rewards: np.ndarray
    horizon: int | None
    discount: float = 1.0
    terminal: np.ndarray | None = None
    start: int = 0

    def __post_init__(self) -> None:
        p = np.array(self.transitions, dtype=float)
        r = np.array(self.rewards, dtype=float)
        if p.ndim != 3 or p.shape[0] != p.shape[2] or not 1 <= p.shape[0] <= MAX_STATES or p.shape[1] < 1:
            raise LeaklabError(f"transitions are an [S, A, S] array with 1 <= S <= {MAX_STATES} and A >= 1 "
                               f"(got shape {tuple(p.shape)})")
        n, a = p.shape[:2]
        if p.size > MAX_TRANSITIONS:
            raise LeaklabError(f"an MDP has at most {MAX_TRANSITIONS:,} transition probabilities (S * A * S; got "
                               f"{p.size:,})")
        if r.shape != (n, a):
            raise LeaklabError(f"rewards are an [S, A] = [{n}, {a}] array (got shape {tuple(r.shape)})")
        if not (np.isfinite(p).all() and np.isfinite(r).all()) or np.abs(r).max() > MAX_REWARD:
            raise LeaklabError(f"transitions and rewards must be finite, rewards at most {MAX_REWARD:g} in size")
        if p.min() < 0 or np.abs(p.sum(axis=2) - 1).max() > ROW_TOLERANCE:
            raise LeaklabError("every transition vector P(s, a) has nonnegative entries summing to 1")
        if not (isinstance(self.discount, (int, float)) and not isinstance(self.discount, bool)
                and 0 < self.discount <= 1):
            raise LeaklabError(f"the discount is in (0, 1] (got {self.discount!r})")
        if self.horizon is None:
            if self.discount > MAX_DISCOUNT:
                raise LeaklabError(f"an infinite horizon needs a discount of at most 1 - 1e-9 (got {self.discount!r}): "
                                   "closer to 1 its values are lost to rounding; give a finite horizon")
            if self.terminal is not None:
                raise LeaklabError("terminal rewards belong to a finite horizon")
            terminal = None
        else:
            if not (isinstance(self.horizon, int) and not isinstance(self.horizon, bool)
                    and 1 <= self.horizon <= MAX_HORIZON):
                raise LeaklabError(f"the horizon is a whole number from 1 to {MAX_HORIZON}, or None for an infinite "
                                   f"one (got {self.horizon!r})")
            if (self.horizon + 1) * n > MAX_STAGE_VALUES:
                raise LeaklabError(f"(horizon + 1) * states is at most {MAX_STAGE_VALUES:,} (got "
                                   f"{(self.horizon + 1) * n:,})")
            terminal = np.zeros(n) if self.terminal is None else np.array(self.terminal, dtype=float)
            if terminal.shape != (n,) or not np.isfinite(terminal).all() or np.abs(terminal).max() > MAX_REWARD:
                raise LeaklabError(f"terminal rewards are {n} finite numbers, one per state, at most {MAX_REWARD:g} "
                                   "in size")
        if not (isinstance(self.start, (int, np.integer)) and not isinstance(self.start, bool) and 0 <= self.start < n):
            raise LeaklabError(f"the start state is one of 0..{n - 1} (got {self.start!r})")
        for name, value in (("transitions", p), ("rewards", r), ("terminal", terminal)):
            if value is not None:
                value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "start", int(self.start))
        object.__setattr__(self, "discount", float(self.discount))

    @property
    def n_states(self) -> int:
        return self.transitions.shape[0]

    @property
    def n_actions(self) -> int:
        return self.transitions.shape[1]

    def with_transitions(self, transitions: Any) -> "TabularMDP":
        """The same MDP with other transition probabilities (validated): Algorithm 1's M-bar."""
        return dataclasses.replace(self, transitions=transitions)

    def to_json(self) -> dict:
        return {"transitions": self.transitions.tolist(), "rewards": self.rewards.tolist(), "horizon": self.horizon,
                "discount": self.discount,
                "terminal": None if self.terminal is None else self.terminal.tolist(), "start": self.start}

    @classmethod
    def from_json(cls, data: Any) -> "TabularMDP":
        """An MDP from :meth:`to_json`'s dictionary; one-line errors for anything else."""
        required = {"transitions", "rewards", "horizon"}
        if not isinstance(data, dict) or not required <= set(data):
            missing = f" ({', '.join(sorted(required - set(data)))} missing)" if isinstance(data, dict) else ""
            raise LeaklabError(f"an MDP is a JSON object with transitions, rewards and horizon, optionally discount, "
                               f"terminal and start{missing}")
        check_keys(data, required | {"discount", "terminal", "start"}, "an MDP")
        transitions, rewards = _numbers(data["transitions"], "transitions"), _numbers(data["rewards"], "rewards")
        terminal = None if data.get("terminal") is None else _numbers(data["terminal"], "terminal")
        return cls(transitions, rewards, data["horizon"], data.get("discount", 1.0), terminal, data.get("start", 0))


def _numbers(value: Any, name: str) -> np.ndarray:
    """A JSON array of numbers (no booleans, strings or ragged rows) as floats, or a one-line error."""
    try:
        array = np.array(value, dtype=object)
        flat = list(array.flat)
    except (ValueError, RuntimeError):  # past the dimensions numpy iterates (transitions take 3)
        raise LeaklabError(f"an MDP's {name} is nested too deeply for an array") from None
    if not all(type(x) in (int, float) for x in flat):
        raise LeaklabError(f"an MDP's {name} is a rectangular array of numbers (no booleans, strings or ragged rows)")
    try:
        return array.astype(float)
    except OverflowError:
        raise LeaklabError(f"an MDP's {name} holds a number too large for a float") from None


def q_values(mdp: TabularMDP, values: np.ndarray, transitions: np.ndarray | None = None) -> np.ndarray:
    """One Bellman backup, ``[S, A]``: R(s, a) + gamma * sum_s' P(s, a, s') v(s') (``transitions``: another P)."""
    p = mdp.transitions if transitions is None else transitions
    return mdp.rewards + mdp.discount * (p @ values)


def _greedy(q: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """The greedy action per state, the lowest index among ties; ``previous`` kept where it is within rounding of the
    best (policy iteration's stopping rule)."""
    best = q.argmax(axis=1)
    if previous is None:
        return best
    rows = np.arange(q.shape[0])
    slack = 1e-12 * max(1.0, float(np.abs(q).max()))
    return np.where(q[rows, previous] >= q[rows, best] - slack, previous, best)


def optimal_policy(mdp: TabularMDP) -> tuple[np.ndarray, np.ndarray]:
    """An optimal deterministic policy and its values: backward induction for a finite horizon (Sec. 2.4's
    Bellman conditions, V_T = R_T), policy iteration (exact) for an infinite one."""
    if mdp.horizon is not None:
        values = np.empty((mdp.horizon + 1, mdp.n_states))
        policy = np.empty((mdp.horizon, mdp.n_states), dtype=np.int64)
        values[-1] = mdp.terminal
        for t in range(mdp.horizon - 1, -1, -1):
            q = q_values(mdp, values[t + 1])
            policy[t] = _greedy(q)
            values[t] = q[np.arange(mdp.n_states), policy[t]]
        return policy, values
    policy = _greedy(mdp.rewards)
    for _ in range(10_000):  # policy iteration ends after finitely many improvements; far fewer in practice
        values = evaluate(mdp, policy)
        improved = _greedy(q_values(mdp, values), policy)
        if np.array_equal(improved, policy):
            return policy, values
        policy = improved
    raise LeaklabError("policy iteration did not settle in 10,000 improvements")  # pragma: no cover


def check_policy(mdp: TabularMDP, policy: Any) -> np.ndarray:
    """``policy`` as an int array of the shape :func:`evaluate` takes, or a one-line error."""
    pi = np.asarray(policy)
    shape = (mdp.n_states,) if mdp.horizon is None else (mdp.horizon, mdp.n_states)
    if pi.shape != shape or not np.issubdtype(pi.dtype, np.integer) or pi.min() < 0 or pi.max() >= mdp.n_actions:
        raise LeaklabError(f"a policy for this MDP is an int array of shape {list(shape)} with actions "
                           f"0..{mdp.n_actions - 1}")
    return pi


def evaluate(mdp: TabularMDP, policy: Any) -> np.ndarray:
    """The values of a deterministic ``policy`` under ``mdp``: backward recursion (finite horizon, ``[T + 1, S]``)
    or the linear system (I - gamma P_pi) v = r_pi (infinite, ``[S]``)."""
    pi = check_policy(mdp, policy)
    rows = np.arange(mdp.n_states)
    if mdp.horizon is None:
        system = np.eye(mdp.n_states) - mdp.discount * mdp.transitions[rows, pi]
        return np.linalg.solve(system, mdp.rewards[rows, pi])
    values = np.empty((mdp.horizon + 1, mdp.n_states))
    values[-1] = mdp.terminal
    for t in range(mdp.horizon - 1, -1, -1):
        values[t] = mdp.rewards[rows, pi[t]] + mdp.discount * (mdp.transitions[rows, pi[t]] @ values[t + 1])
    return values


def random_mdp(n_states: int, n_actions: int, horizon: int | None, rng: np.random.Generator,
               discount: float = 1.0) -> TabularMDP:
    """Sec. 2.7's Example 2 (the thesis: 20 states, 5 actions, T = 10, everything "generated randomly", the
    distributions unspecified): every P(s, a) uniform on the simplex (Dirichlet(1, ..., 1), so in its interior as the
    Dirichlet mechanism needs), R(s, a) and R_T(s) uniform on [0, 1], s0 = 0."""
    if not (1 <= n_states <= MAX_STATES and n_actions >= 1):
        raise LeaklabError(f"a random MDP has 1 to {MAX_STATES} states and at least one action")
    transitions = rng.dirichlet(np.ones(n_states), size=(n_states, n_actions))
    rewards = rng.uniform(size=(n_states, n_actions))
    terminal = None if horizon is None else rng.uniform(size=n_states)
    return TabularMDP(transitions, rewards, horizon, discount, terminal)


# Example 1's startups (Fig. 2.2 is not in the text): per stage while owned, the chance to succeed, to fail (the
# rest: still running), the price and the revenue per stage
STARTUPS = ((0.30, 0.30, 0.5, 0.1), (0.15, 0.05, 0.8, 0.2), (0.25, 0.15, 0.6, 0.1), (0.40, 0.45, 0.3, 0.0))
INVESTMENT_LEAK = 0.01  # mass spread uniformly over all states, so every P(s, a) is in the simplex interior


def investment_mdp(horizon: int = 6) -> TabularMDP:
    """Sec. 2.7's Example 1 as leaklab designs it (the thesis' Fig. 2.2 is a picture the text does not give): a
    corporation deciding which of four startups to acquire.

    States: 0 deciding, 1-4 owning startup j, 5 success, 6 failure (both absorbing). At state 0 action j buys
    startup j for its price (:data:`STARTUPS`); at every other state the four actions are the same "hold" (one
    action count for every state), which earns the startup's revenue while it runs and 1 per stage after a
    success. Each stage an owned startup succeeds, fails or keeps running with its own probabilities. Terminal
    rewards: 5 for a success, 0.5 for a startup still running, 0 otherwise. Every row is mixed with
    :data:`INVESTMENT_LEAK` of the uniform distribution so that it lies in the simplex interior.
    """
    n, a = 7, len(STARTUPS)
    design = np.zeros((n, a, n))
    rewards = np.zeros((n, a))
    for j, (success, failure, price, revenue) in enumerate(STARTUPS):
        design[0, j, 1 + j] = 1.0
        rewards[0, j] = -price
        design[1 + j, :, 5], design[1 + j, :, 6], design[1 + j, :, 1 + j] = success, failure, 1 - success - failure
        rewards[1 + j] = revenue
    design[5, :, 5] = design[6, :, 6] = 1.0
    rewards[5] = 1.0
    transitions = (1 - INVESTMENT_LEAK) * design + INVESTMENT_LEAK / n
    terminal = np.array([0.0, 0.5, 0.5, 0.5, 0.5, 5.0, 0.0])
    return TabularMDP(transitions, rewards, horizon, 1.0, terminal)

