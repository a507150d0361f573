"""Differentially private advising between simultaneously learning agents: seed 002 (Shen, thesis), chapter 3,
Algorithms 3-5, in the cloud-server scenario of :mod:`leaklab.rl.envs.cloud_tasks`.

* Algorithm 3 (:func:`learn`): each agent keeps Q(s, a) and a policy pi(s, .) over its own servers; after the
  reward of the chosen server, Q(s, a) <- (1 - alpha) Q(s, a) + alpha r (the thesis sets Q(s', .) = 0, so gamma
  drops out), then pi(s, a) <- pi(s, a) + xi (Q(s, a) - r-bar) with r-bar = sum_a pi(s, a) Q(s, a), then
  Algorithm 4 (:func:`normalize`; the box's "Algorithm 2" is a typo).
* Algorithm 5 (:func:`simulate` with ``strategy="dp"``): a student with asking budget left looks at its neighbours
  with giving budget left, computes the squared Euclidean distance (eq. 3.1) between its Q(s) and each teacher's
  (:func:`teacher_view`: for a teacher with a different action set, its Q values on the student's servers with
  Laplace(S / eps) noise on every term; a server the teacher lacks counts as Q = 0, and with as many servers and
  one different the teacher's different server stands for the student's), and when the largest distance exceeds
  the threshold d that teacher picks the student's action from its noised Q values; the student learns from the
  reward as in Algorithm 3, and both budgets drop by one. ``strategy="traditional"`` advises only between agents
  with identical sets, without noise; ``"none"`` is Algorithm 3 alone.

Choices where the thesis is silent or inconsistent (notes-002, section 2.6), each documented here:

* line 22 computes r-bar' but never uses it; leaklab reads the advised policy as
  pi'(s, a) = pi_i(s, a) + xi ((Q_i(s, a) + Lap) - r-bar'), normalised by Algorithm 4 before sampling, with pi_i the
  teacher's policy aligned to the student's servers (0 for a server the teacher lacks);
* one noise vector per (teacher, student, epoch) query, used for both the distance and the advised action (what
  the teacher releases once); agents with identical sets add no noise (lines 2-3);
* alpha and xi are not given: alpha = 0.1, xi = 0.05 by default (the no-advice learner then passes the thesis'
  92% at epoch 266, mean of 50 runs, and ends at 99.7%);
* the agents act in a fixed order within an epoch, each seeing the others' tables as they are at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from leaklab.privacy.mechanisms import LaplaceMechanism
from leaklab.rl.envs.cloud_tasks import CloudScenario

__all__ = ["AdvisingConfig", "AdvisingRun", "normalize", "learn", "teacher_view", "convergence_ratio", "simulate"]

CENTRE, LOWER = 0.5, 0.001  # Algorithm 4's mapping centre c_o and lower bound Delta
Strategy = Literal["none", "traditional", "dp"]


def normalize(p: np.ndarray) -> np.ndarray:
    """Algorithm 4 on the last axis: if the smallest entry d is below Delta = 0.001, squash every entry towards
    0.5 by rho = (0.5 - Delta) / (0.5 - d) (the smallest lands on Delta), then divide by the sum."""
    p = np.asarray(p, dtype=float)
    d = p.min(axis=-1, keepdims=True)
    rho = np.where(d < LOWER, (CENTRE - LOWER) / (CENTRE - np.minimum(d, LOWER)), 1.0)
    p = CENTRE - rho * (CENTRE - p)
    return p / p.sum(axis=-1, keepdims=True)


def learn(q: np.ndarray, pi: np.ndarray, action: int, reward: float, alpha: float, xi: float) -> None:
    """Algorithm 3, lines 4-9, on one state's rows ``q`` and ``pi`` (in place)."""
    q[action] = (1 - alpha) * q[action] + alpha * reward
    pi += xi * (q - pi @ q)
    pi[:] = normalize(pi)


def teacher_view(teacher_set: tuple[int, ...], q: np.ndarray, pi: np.ndarray,
                 student_set: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's Q(s) and pi(s) on the student's servers (Algorithm 5, lines 2-12): its own entries for the
    servers both hold; a server only the student holds gets the teacher's different server's entries when both
    hold as many (line 12), else Q = 0 and pi = 0 (line 8: the missing action at its initial value)."""
    index = {server: k for k, server in enumerate(teacher_set)}
    extra = [server for server in teacher_set if server not in set(student_set)]
    substitute = index[extra[0]] if len(teacher_set) == len(student_set) and len(extra) == 1 else None
    view_q, view_pi = np.zeros(len(student_set)), np.zeros(len(student_set))
    for k, server in enumerate(student_set):
        source = index.get(server, substitute)
        if source is not None:
            view_q[k], view_pi[k] = q[source], pi[source]
    return view_q, view_pi


def convergence_ratio(scenario: CloudScenario, policies: list[np.ndarray]) -> float:
    """The thesis' convergence ratio: over agents and tasks, the mean of sum_k pi(s, a_k) R(s, a_k) divided by the
    largest reward among the agent's servers (pairs whose servers all earn 0 are left out)."""
    ratios = []
    for servers, pi in zip(scenario.action_sets, policies):
        rewards = scenario.rewards[:, list(servers)]
        best = rewards.max(axis=1)
        keep = best > 0
        ratios.append(((pi * rewards).sum(axis=1)[keep] / best[keep]))
    return float(np.concatenate(ratios).mean())


class AdvisingConfig(BaseModel):
    """One strategy's settings (Table 3.5 where it gives them)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    strategy: Strategy = "dp"
    epsilon: float = Field(default=1.0, gt=0, le=1000, description="the Laplace noise's budget per advice")
    sensitivity: float = Field(default=1.0, gt=0, description="S (the thesis: 1)")
    threshold: float = Field(default=0.7, ge=0, description="the distance d that triggers advice")
    budget: int = Field(default=30, ge=0, le=1_000_000, description="b_ask = b_give per agent")
    alpha: float = Field(default=0.1, gt=0, lt=1, description="Q learning rate (not given by the thesis)")
    xi: float = Field(default=0.05, gt=0, le=10, description="policy learning rate (not given by the thesis)")
    epochs: int = Field(default=700, ge=1, le=1_000_000)


@dataclass
class AdvisingRun:
    """One simulation: the convergence ratio before the first epoch and after each (``epochs + 1`` values), the
    advice given in each epoch, and how much of it named the task's optimal server."""

    ratio: np.ndarray
    advice: np.ndarray
    optimal_advice: np.ndarray


def simulate(scenario: CloudScenario, config: AdvisingConfig, rng: np.random.Generator) -> AdvisingRun:
    """Run ``config.epochs`` epochs of every agent learning (Algorithm 3) or being advised (Algorithm 5)."""
    sets = scenario.action_sets
    q = [np.zeros((scenario.n_tasks, len(s))) for s in sets]
    pi = [np.full((scenario.n_tasks, len(s)), 1 / len(s)) for s in sets]
    neighbours = scenario.neighbours(identical_only=config.strategy == "traditional")
    noise = LaplaceMechanism(config.epsilon, config.sensitivity)
    ask = np.full(scenario.n_users, config.budget)
    give = np.full(scenario.n_users, config.budget)
    ratio, advice = [convergence_ratio(scenario, pi)], np.zeros(config.epochs, dtype=np.int64)
    optimal_advice = np.zeros(config.epochs, dtype=np.int64)
    for epoch in range(config.epochs):
        for j in range(scenario.n_users):
            task = int(rng.integers(scenario.n_tasks))
            chosen = None
            if config.strategy != "none" and ask[j] > 0:
                best, best_distance, best_view = None, -np.inf, None
                for i in neighbours[j]:
                    if give[i] <= 0:
                        continue
                    view_q, view_pi = teacher_view(sets[i], q[i][task], pi[i][task], sets[j])
                    if sets[i] != sets[j]:
                        view_q = noise.sample(view_q, rng)
                    distance = float(((view_q - q[j][task]) ** 2).sum())
                    if distance > best_distance:
                        best, best_distance, best_view = i, distance, (view_q, view_pi)
                if best is not None and best_distance > config.threshold:
                    view_q, view_pi = best_view
                    advised = normalize(view_pi + config.xi * (view_q - view_pi @ view_q))
                    chosen = int(rng.choice(len(sets[j]), p=advised))
                    ask[j] -= 1
                    give[best] -= 1
                    advice[epoch] += 1
                    optimal_advice[epoch] += scenario.rewards[task, sets[j][chosen]] == scenario.rewards[task].max()
            if chosen is None:
                chosen = int(rng.choice(len(sets[j]), p=pi[j][task]))
            learn(q[j][task], pi[j][task], chosen, float(scenario.rewards[task, sets[j][chosen]]), config.alpha,
                  config.xi)
        ratio.append(convergence_ratio(scenario, pi))
    return AdvisingRun(np.array(ratio), advice, optimal_advice)
