"""Cooperative navigation on a grid: a small cooperative multi-agent task for seed 003 chapter 4's value
factorisations (the thesis uses SMAC's 3m, a StarCraft II scenario that cannot run here).

N agents and N landmarks on a G x G grid, placed at random in distinct cells at the start of an episode. Each
step every agent moves (stay, up, down, left, right; a move off the grid stays). The team shares one reward per
step, minus the sum over landmarks of the Manhattan distance to the nearest agent, divided by N G (as in the
multi-agent particle environment's "simple spread"). An episode lasts ``horizon`` steps; it is won when every
landmark has an agent on it at the end (the thesis' win rate). Agent i observes its own cell (scaled to [0, 1]),
every landmark's offset from it and every other agent's offset (scaled by G): 2 + 2N + 2(N - 1) numbers. The task
is fully observable: each observation determines the others', so a teammate's observations are no secret here and
the privacy layers of PE-VDN protect the agents' data against outsiders and their networks' parameters, not
observations from teammates (SMAC's sight ranges make the thesis' task partial). :class:`NavigationBatch` steps
many independent episodes at once (numpy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leaklab.errors import LeaklabError

__all__ = ["MOVES", "NavigationBatch", "observation_size"]

MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)])  # stay, up, down, left, right


def observation_size(agents: int) -> int:
    return 2 + 2 * agents + 2 * (agents - 1)


@dataclass
class NavigationBatch:
    """``episodes`` independent episodes of ``agents`` agents on a ``size`` x ``size`` grid."""

    episodes: int
    agents: int = 3
    size: int = 5
    horizon: int = 8

    def __post_init__(self) -> None:
        if not (self.episodes >= 1 and 2 <= self.agents and self.size >= 2 and 2 * self.agents <= self.size ** 2
                and self.horizon >= 1):
            raise LeaklabError("cooperative navigation needs 1 or more episodes, 2 or more agents, a grid with room "
                               "for every agent and landmark, and a horizon of 1 or more")
        self.positions = np.zeros((self.episodes, self.agents, 2), dtype=np.int64)
        self.landmarks = np.zeros((self.episodes, self.agents, 2), dtype=np.int64)
        self.t = 0

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        """New episodes; returns the observations ``[episodes, agents, observation_size]``."""
        cells = np.argsort(rng.random((self.episodes, self.size ** 2)), axis=1)[:, :2 * self.agents]
        rows, cols = np.divmod(cells, self.size)
        both = np.stack([rows, cols], axis=-1)
        self.positions, self.landmarks = both[:, :self.agents].copy(), both[:, self.agents:].copy()
        self.t = 0
        return self.observations()

    def observations(self) -> np.ndarray:
        own = self.positions / (self.size - 1)
        to_landmarks = (self.landmarks[:, None, :, :] - self.positions[:, :, None, :]) / self.size
        to_agents = (self.positions[:, None, :, :] - self.positions[:, :, None, :]) / self.size
        others = ~np.eye(self.agents, dtype=bool)
        to_agents = to_agents[:, others].reshape(self.episodes, self.agents, self.agents - 1, 2)
        return np.concatenate([own, to_landmarks.reshape(self.episodes, self.agents, -1),
                               to_agents.reshape(self.episodes, self.agents, -1)], axis=2).astype(np.float32)

    def _coverage(self) -> np.ndarray:
        """Per episode, the sum over landmarks of the distance to the nearest agent."""
        gaps = np.abs(self.landmarks[:, :, None, :] - self.positions[:, None, :, :]).sum(-1)
        return gaps.min(axis=2).sum(axis=1)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, np.ndarray]:
        """Move every agent (``actions`` ``[episodes, agents]``); returns the observations, the team rewards
        ``[episodes]``, whether the episodes ended, and (when they did) whether each was won."""
        self.positions = np.clip(self.positions + MOVES[actions], 0, self.size - 1)
        self.t += 1
        coverage = self._coverage()
        done = self.t >= self.horizon
        return self.observations(), -coverage / (self.agents * self.size), done, coverage == 0
