"""Candidate inference by shadow policies: the second privacy-leakage attack of Pan et al. (AAMAS 2019, "How you act
tells a lot"), the "membership inference in a DRL setting" scenario that seed 002, chapter 5 (section 5.3.1) names
beside the genetic search it reproduces: the attacker holds the trained policy and a set of candidate transition
dynamics (floor plans) one of which the policy was trained in, trains shadow policies in every candidate with the
target's training algorithm, and learns from them which candidate a policy's behaviour points to.

The thesis gives one sentence and no setting; leaklab's reading (Pan et al.'s classifier is not in the seeds):

* candidates (:func:`candidate_maps`): maps of the true map's shape under the attacker's constraints with the true
  start and goal (:mod:`leaklab.rl.envs.grid_world`; the genetic search's initial population), the true map among
  them at a random place;
* a policy's features (:func:`answer_features`): its answers ``softmax(Q / temperature)`` (the search's
  :func:`~leaklab.attacks.environment_search.policy_table`) to every observation that occurs at a free cell of any
  candidate, the same observations for every policy;
* the classifier (:func:`infer_candidates`): an MLP (features -> 64 -> candidates, ReLU) trained with cross-entropy
  and Adam on the shadows' features labelled by their candidate; a target is assigned the candidate of its largest
  logit. Beside it, :func:`fitness_choice`: the candidate the genetic search's fitness rates highest, which needs no
  shadows (scenario (a)'s fitness applied to the candidate set).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from leaklab.attacks.environment_search import fitness
from leaklab.attacks.membership import AttackTraining, check_training, mlp
from leaklab.errors import LeaklabError
from leaklab.rl.envs.grid_world import GridMap, add_walls, observation_codes, open_plan

__all__ = ["answer_features", "candidate_maps", "fitness_choice", "infer_candidates", "observed_codes"]


def candidate_maps(truth: GridMap, count: int, rng: np.random.Generator, wall_fraction: float = 0.3,
                   tries: int = 1000) -> tuple[list[GridMap], int]:
    """``count`` distinct candidates: ``truth`` and ``count - 1`` random maps of its shape, start and goal under the
    constraints (walls added at random, as the genetic search's population; a map equal to one already drawn, or to
    the truth, is drawn again, up to ``tries`` draws in all), in a random order; returns them and the truth's
    index."""
    if count < 2:
        raise LeaklabError(f"candidate inference needs at least 2 candidates (got {count})")
    keep = (truth.start, truth.goal)
    wanted = int(round(wall_fraction * (truth.shape[0] - 2) * (truth.shape[1] - 2)))
    seen, others = {truth.free.tobytes()}, []
    for _ in range(tries):
        if len(others) == count - 1:
            break
        free = add_walls(open_plan(*truth.shape), rng, wanted, keep)
        if free.tobytes() not in seen:
            seen.add(free.tobytes())
            others.append(GridMap(free, truth.start, truth.goal))
    if len(others) < count - 1:
        raise LeaklabError(f"{tries} draws gave only {len(others) + 1} distinct {truth.shape[0]}x{truth.shape[1]} "
                           f"candidates at wall fraction {wall_fraction}, not {count}: ask for fewer, a larger map or "
                           "more walls")
    where = int(rng.integers(count))
    return others[:where] + [truth] + others[where:], where


def observed_codes(candidates: list[GridMap]) -> np.ndarray:
    """The observations (codes in [0, 256)) that occur at a free cell of any candidate, sorted."""
    return np.unique(np.concatenate([observation_codes(c.free, np.argwhere(c.free)) for c in candidates]))


def answer_features(table: np.ndarray, codes: np.ndarray) -> torch.Tensor:
    """A policy's features: its rows of a :func:`~leaklab.attacks.environment_search.policy_table` (``[256, 5]``) at
    ``codes``, flattened."""
    if table.ndim != 2:
        raise LeaklabError("candidate inference reads an agent that sees its 8 neighbours only (a [256, 5] table)")
    return torch.from_numpy(table[codes].reshape(-1)).float()


def infer_candidates(shadows: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor, candidates: int,
                     training: AttackTraining = AttackTraining()) -> torch.Tensor:
    """The classifier trained on the ``shadows``' features (N, d) with their candidate ``labels`` (N,) in
    ``[0, candidates)``; returns the candidate it assigns to each row of ``targets`` (M, d)."""
    check_training(training)
    if (shadows.ndim != 2 or targets.ndim != 2 or shadows.shape[1] != targets.shape[1] or labels.ndim != 1
            or len(labels) != len(shadows)):
        raise LeaklabError("shadows (N, d) with N labels (N,) and targets (M, d) of the same d")
    if not (shadows.is_floating_point() and targets.is_floating_point() and bool(torch.isfinite(shadows).all())
            and bool(torch.isfinite(targets).all())):
        raise LeaklabError("features must be finite floating-point numbers")
    shadows, targets = shadows.float(), targets.float()
    if labels.dtype != torch.int64 or len(labels) == 0 or labels.min() < 0 or labels.max() >= candidates:
        raise LeaklabError(f"labels are int64 candidate indices in [0, {candidates})")
    net = training.network(lambda: mlp(shadows.shape[1], 64, candidates)).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=training.lr)
    for batch in training.batches(len(shadows)):
        loss = F.cross_entropy(net(shadows[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return net.eval()(targets).argmax(1)


def fitness_choice(table: np.ndarray, candidates: list[GridMap]) -> int:
    """The candidate whose optimal actions the policy (its ``[256, 5]`` table) follows most often: the genetic
    search's :func:`~leaklab.attacks.environment_search.fitness`, without shadows."""
    return int(np.argmax([fitness(c.free, c.start, c.goal, table) for c in candidates]))
