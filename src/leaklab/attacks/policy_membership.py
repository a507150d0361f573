"""Membership inference against a trained policy (seed 003, chapter 3, section 3.4.1, the deep-RL task): was this
floor map among the policy's training maps?

The attacker queries the policy (black box: its action distribution for each observation it is shown) along an
episode on the map, choosing each next action by sampling the policy's answer, and pairs every answer with its
labelling agent's policy at the same state (:func:`~leaklab.rl.envs.multi_room.optimal_actions`: the uniform
distribution over the actions on a shortest path to the goal). :func:`query_policy` returns, per map, the
concatenation over the first ``steps`` steps of (the policy's distribution, the label), zeros after the episode
ended: the thesis' "concatenation of the per-step confidence vectors" and "of one-hot labels", the row its
binary classifier (:func:`~leaklab.attacks.membership.feature_attack`) reads. It also returns how each episode went
(steps to the goal within the episode limit, the return of eq. 3.2, and the mean entropy of the answers, eq. 3.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.rl.envs.multi_room import ACTIONS, FloorMap, RoomBatch, State, optimal_actions

Labels = dict[State, tuple[int, ...]]


@dataclass(frozen=True)
class Queries:
    """What querying a policy on some maps gave: ``features`` (maps, steps * 2 * actions); per map ``steps_to_goal``
    (the episode limit + 1 where it was not reached), ``returns`` (eq. 3.2) and ``entropy`` (the mean entropy of the
    policy's answers over the episode's steps, eq. 3.3)."""

    features: torch.Tensor
    steps_to_goal: np.ndarray
    returns: np.ndarray
    entropy: np.ndarray


def labelling(maps: Sequence[FloorMap]) -> list[Labels]:
    """The labelling agent's shortest-path actions on each map (computed once per map, reused for every query)."""
    return [optimal_actions(m) for m in maps]


@torch.no_grad()
def query_policy(policy: nn.Module, maps: Sequence[FloorMap], labels: Sequence[Labels], steps: int,
                 generator: torch.Generator, max_steps: int | None = None) -> Queries:
    """One episode of ``policy`` on each of ``maps`` (all at once), up to ``max_steps`` steps (default: the
    environment's), actions sampled from its answers with ``generator``; features from the first ``steps``."""
    if not maps or len(labels) != len(maps):
        raise LeaklabError("one labelling per map, at least one map")
    batch = RoomBatch(list(maps)) if max_steps is None else RoomBatch(list(maps), max_steps=max_steps)
    n, a = len(maps), len(ACTIONS)
    if not 1 <= steps <= batch.max_steps:
        raise LeaklabError(f"features from 1 to {batch.max_steps} steps (got {steps})")
    policy.eval()
    memory = policy.initial_memory(n)
    features = torch.zeros(n, steps, 2, a)
    alive = np.ones(n, dtype=bool)
    steps_to_goal = np.full(n, batch.max_steps + 1)
    returns = np.zeros(n)
    entropy_sum, entropy_count = np.zeros(n), np.zeros(n)
    for t in range(batch.max_steps):
        logits, _, memory = policy(torch.from_numpy(batch.observe()), memory)
        probs = F.softmax(logits, -1)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(1).numpy()
        entropy_sum += np.where(alive, entropy, 0.0)
        entropy_count += alive
        if t < steps:
            for k in np.flatnonzero(alive):
                best = labels[k].get(batch.state(k), ())
                features[k, t, 0] = probs[k]
                if best:
                    features[k, t, 1, list(best)] = 1.0 / len(best)
        action = torch.multinomial(probs, 1, generator=generator).squeeze(1).numpy()
        reward, reached, truncated = batch.step(action)
        newly = alive & reached
        steps_to_goal[newly] = batch.steps[newly]
        returns[newly] = reward[newly]
        alive &= ~(reached | truncated)
        if not alive.any():
            break
    return Queries(features=features.reshape(n, -1), steps_to_goal=steps_to_goal, returns=returns,
                   entropy=entropy_sum / np.maximum(entropy_count, 1))
