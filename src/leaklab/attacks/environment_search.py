"""Environment dynamics search by a genetic algorithm: the privacy-leakage attack of Pan et al. (AAMAS 2019, "How
you act tells a lot") that seed 002, chapter 5 reproduces (sections 5.3.1, 5.6.1.2, 5.6.3; Fig. 5.5).

The attacker holds the trained policy (here: the Q network's greedy action and its values for each observation)
and the structural constraints of the floor plan (:mod:`leaklab.rl.envs.grid_world`): the map's size, its outer
wall ring, the start and the goal, connected free space, no all-wall 2x2 block. It keeps a population of candidate
maps meeting the constraints and scores each by how well the target's policy acts in it as the candidate's own
optimal policy would (the thesis: "how similar the action-space probability distribution of the induced optimal
policy is to the target's"). The thesis gives no fitness, population, operators or generations; leaklab's:

* fitness: at every free cell of the candidate but the goal, the target sees the candidate's 8 neighbours there
  and puts probability ``softmax(Q / temperature)`` on the candidate's optimal actions (those one step closer to
  the goal); the fitness is the mean of that probability over the cells. A policy that learnt the true map scores
  it near 1 where its observations are not aliased. (With a policy built from the true map, a fitness over the
  candidate's shortest path alone recovered 57-78% of 9x9 interiors, random maps 60-63%, this one 61-92%.)
* population: random maps under the constraints (the same generator as the truth's, with the start and goal
  fixed); tournament selection of 3, elitism, block crossover (a random rectangle from the second parent), and
  mutation flipping 1 to ``mutation_cells`` interior cells; a child that breaks a constraint is drawn again (up to
  ``retries`` times, then the first parent is kept). Each generation the fittest map also takes its best single
  flip (``polish``). With that policy on four 9x9 maps, populations of 200 recovered three maps whole in 100
  generations; a population of 60 (100 generations) or of 100 (200 generations, no polish), one.

The policy is a function of the 8 binary cells alone (and of its cell, for an agent that also observes its
position), so its answers for all 256 observations (at every cell) are read once (:func:`policy_table`); the search
itself queries no network. The recovered map is the fittest of the last
generation; GRR is its agreement with the truth over all cells, NRR over the interior (section 5.6.3; notes-002
4.5: ``GRR = (B + I NRR) / (B + I)``, start and goal included in the interior).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from leaklab.rl.envs.grid_world import (NEIGHBOURS, GridMap, add_walls, distances, observation_codes, open_plan,
                                        optimal_actions, violations)

_CODES = 1 << len(NEIGHBOURS)  # 256 binary observations


class SearchConfig(BaseModel):
    """The genetic algorithm's settings (leaklab's; the thesis gives none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    population: int = Field(default=200, ge=4, le=10_000)
    generations: int = Field(default=100, ge=0, le=100_000)
    elite: int = Field(default=4, ge=1, description="the fittest kept unchanged each generation")
    tournament: int = Field(default=3, ge=1)
    crossover: float = Field(default=0.7, ge=0, le=1, description="probability a child is a crossover")
    mutation_cells: int = Field(default=3, ge=1, description="a mutation flips 1 to this many interior cells")
    retries: int = Field(default=20, ge=1)
    temperature: float = Field(default=0.01, gt=0, description="of the softmax over the target's Q values")
    polish: bool = Field(default=True, description="each generation, the fittest map takes its best single-cell flip")
    wall_fraction: float = Field(default=0.3, ge=0, lt=1, description="of the initial random maps")
    seed: int = 0


class SearchResult(BaseModel):
    """The recovered map, and per generation the best fitness and the best map's NRR (when the truth was given)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    recovered: GridMap
    fitness: list[float]
    nrr: list[float]
    prior_nrr: float | None  # the initial random population's mean NRR: what the constraints alone recover


def policy_table(q_function: Callable[[torch.Tensor], torch.Tensor], temperature: float,
                 shape: tuple[int, int] | None = None) -> np.ndarray:
    """The target's action probabilities ``softmax(Q / temperature)`` for every binary observation: ``[256, 5]``
    (row = the observation's code, element ``i`` worth ``2**i``); with ``shape``, for an agent that also observes its
    position (:class:`~leaklab.rl.agents.grid_dqn.GridDQNConfig`'s ``position``), ``[rows, columns, 256, 5]``, the
    observation at every cell of a map of that shape."""
    codes = np.arange(_CODES)
    obs = torch.from_numpy(((codes[:, None] >> np.arange(len(NEIGHBOURS))) & 1).astype(np.float32))
    if shape is not None:
        h, w = shape
        where = torch.from_numpy(np.stack(np.meshgrid(np.arange(h) / (h - 1), np.arange(w) / (w - 1), indexing="ij"),
                                          axis=-1).astype(np.float32))  # [h, w, 2]
        obs = torch.cat([obs.expand(h, w, -1, -1), where[:, :, None, :].expand(-1, -1, _CODES, -1)], dim=-1)
        obs = obs.reshape(-1, len(NEIGHBOURS) + 2)
    with torch.no_grad():
        table = torch.softmax(q_function(obs).double() / temperature, dim=-1).numpy()
    return table if shape is None else table.reshape(*shape, _CODES, -1)


def fitness(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int], table: np.ndarray) -> float:
    """The mean, over the candidate's free cells but the goal, of the probability the target's policy (seeing the
    candidate's 8 neighbours there) puts on the candidate's optimal actions; 0 when the start cannot reach the
    goal."""
    dist = distances(free, goal)
    if dist[start] <= 0:
        return 0.0
    best = optimal_actions(dist)
    cells = np.argwhere(dist > 0)
    codes = observation_codes(free, cells)
    probs = table[codes] if table.ndim == 2 else table[cells[:, 0], cells[:, 1], codes]
    return float((probs * best[cells[:, 0], cells[:, 1]]).sum(axis=1).mean())


def recovery_rates(recovered: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(GRR, NRR): the share of all cells, and of the interior's, whose wall or free value is recovered."""
    same = recovered == truth
    return float(same.mean()), float(same[1:-1, 1:-1].mean())


def _valid(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    return not violations(free, start, goal)


def _crossover(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = a.shape
    r0, r1 = sorted(rng.integers(1, h - 1, size=2))
    c0, c1 = sorted(rng.integers(1, w - 1, size=2))
    child = a.copy()
    child[r0:r1 + 1, c0:c1 + 1] = b[r0:r1 + 1, c0:c1 + 1]
    return child


def _mutate(a: np.ndarray, start: tuple[int, int], goal: tuple[int, int], cells: int,
            rng: np.random.Generator) -> np.ndarray:
    child = a.copy()
    h, w = a.shape
    for _ in range(int(rng.integers(1, cells + 1))):
        r, c = int(rng.integers(1, h - 1)), int(rng.integers(1, w - 1))
        if (r, c) not in (start, goal):
            child[r, c] = not child[r, c]
    return child


def _polish(free: np.ndarray, score: float, start: tuple[int, int], goal: tuple[int, int], table: np.ndarray
            ) -> tuple[np.ndarray, float]:
    """``free`` with the single interior flip (of those meeting the constraints) that raises its fitness most, or
    unchanged when none does."""
    best, best_score = free, score
    for r, c in np.argwhere(free[1:-1, 1:-1] | ~free[1:-1, 1:-1]) + 1:
        if (r, c) in (start, goal):
            continue
        candidate = free.copy()
        candidate[r, c] = not candidate[r, c]
        if _valid(candidate, start, goal):
            value = fitness(candidate, start, goal, table)
            if value > best_score:
                best, best_score = candidate, value
    return best, best_score


def search(table: np.ndarray, shape: tuple[int, int], start: tuple[int, int], goal: tuple[int, int],
           config: SearchConfig = SearchConfig(), truth: np.ndarray | None = None) -> SearchResult:
    """Run the genetic algorithm against the policy whose :func:`policy_table` is ``table`` on a map of ``shape``
    with this start and goal. With ``truth`` (the true free cells), record the best map's NRR per generation."""
    rng = np.random.default_rng(config.seed)
    base = open_plan(*shape)
    keep = (start, goal)
    wanted = int(round(config.wall_fraction * (shape[0] - 2) * (shape[1] - 2)))
    population = [add_walls(base, rng, wanted, keep) for _ in range(config.population)]
    scores = np.array([fitness(p, start, goal, table) for p in population])
    history, nrr = [], []
    prior_nrr = None if truth is None else float(np.mean([recovery_rates(p, truth)[1] for p in population]))

    def record() -> None:
        history.append(float(scores.max()))
        if truth is not None:
            nrr.append(recovery_rates(population[int(scores.argmax())], truth)[1])

    def pick() -> np.ndarray:
        contenders = rng.integers(len(population), size=config.tournament)
        return population[int(contenders[np.argmax(scores[contenders])])]

    record()
    elite = min(config.elite, config.population)
    for generation in range(config.generations):
        order = np.argsort(-scores, kind="stable")
        children = [population[i] for i in order[:elite]]
        while len(children) < config.population:
            first = pick()
            child = first
            for _ in range(config.retries):
                candidate = _crossover(first, pick(), rng) if rng.random() < config.crossover else first
                candidate = _mutate(candidate, start, goal, config.mutation_cells, rng)
                if _valid(candidate, start, goal):
                    child = candidate
                    break
            children.append(child)
        population = children
        scores = np.array([fitness(p, start, goal, table) for p in population])
        if config.polish:
            top = int(scores.argmax())
            population[top], scores[top] = _polish(population[top], float(scores[top]), start, goal, table)
        record()
    best = population[int(scores.argmax())]
    return SearchResult(recovered=GridMap(best, start, goal), fitness=history, nrr=nrr, prior_nrr=prior_nrr)
