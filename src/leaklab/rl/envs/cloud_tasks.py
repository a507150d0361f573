"""The cloud-server scenario of seed 002 (Shen, thesis), chapter 3 (Sec. 3.2.1, Fig. 3.2): users (agents) are
allocated a random task (state) every epoch and run it on one of the servers (actions) they may use; the reward
R(task, server) is 2 on the task's optimal server and 0 on every other (Table 3.5). One epoch is one contextual
bandit step per agent (the thesis sets Q(s', .) = 0, Sec. 3.5.2.1).

The thesis gives the counts (10 users, 12 servers, 10 tasks) and one example of action sets ({A, B, C, D},
{A, B, C, E}, {A, B, D, E}, ...), not the layouts or where the optimal servers are. leaklab's layouts
(:func:`layout`), every agent holding the three "core" servers 0-2 on which every task's optimum lies, so that every
agent can learn every task (the experiments' "same total knowledge"):

* ``identical``: every agent {0, 1, 2, 3} (experiment 1's two reference strategies);
* ``one-different``: agent j holds {0, 1, 2, 3 + (j mod 9)}, all 12 servers in use, any two agents equal or one
  server apart (experiment 1's and 3's differentially private advising);
* ``mixed``: experiment 2's single environment, where only a subset of agents share a set: four agents {0, 1, 2, 3},
  two {0, 1, 2, 3, 4} (one server more), two {0, 1, 2, 3, 5} (as many, one different), two {0, 1, 2} (one fewer),
  so that all four of Algorithm 5's cases occur.

Two agents are neighbours (may advise each other) when their sets are equal or differ in at most one server
(Sec. 3.5.2: one more, one fewer, or as many with one different).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leaklab.errors import LeaklabError

__all__ = ["CloudScenario", "LAYOUTS", "layout", "differ_by_at_most_one"]

LAYOUTS = ("identical", "one-different", "mixed")
CORE = (0, 1, 2)  # the servers every agent holds; every task's optimal server is one of them
OPTIMAL_REWARD = 2.0


def layout(name: str, n_users: int = 10, n_servers: int = 12) -> list[tuple[int, ...]]:
    """The agents' action sets (sorted server indices) of a layout (see the module's docstring)."""
    if name not in LAYOUTS:
        raise LeaklabError(f"the layout is one of {', '.join(LAYOUTS)} (got {name!r})")
    if n_servers < 6 or n_users < 2:
        raise LeaklabError("the layouts need at least 6 servers and 2 users")
    if name == "identical":
        return [(*CORE, 3)] * n_users
    if name == "one-different":
        return [(*CORE, 3 + j % (n_servers - len(CORE))) for j in range(n_users)]
    kinds = [(*CORE, 3), (*CORE, 3, 4), (*CORE, 3, 5), CORE]
    shares = [n_users - 3 * (n_users // 5), n_users // 5, n_users // 5, n_users // 5]
    return [kind for kind, count in zip(kinds, shares) for _ in range(count)]


def differ_by_at_most_one(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Neighbouring action sets: equal, one server more or fewer, or as many with one server different."""
    sa, sb = set(a), set(b)
    return len(sa ^ sb) <= 1 or (len(sa) == len(sb) and len(sa - sb) == 1)


@dataclass(frozen=True)
class CloudScenario:
    """Tasks, servers and the agents' action sets; ``rewards[task, server]`` is 2 on the task's optimal server."""

    action_sets: tuple[tuple[int, ...], ...]
    rewards: np.ndarray

    @classmethod
    def make(cls, layout_name: str, rng: np.random.Generator, n_users: int = 10, n_servers: int = 12,
             n_tasks: int = 10) -> "CloudScenario":
        """A layout's action sets and a reward table whose optimal servers are drawn from the core servers."""
        if n_tasks < 1:
            raise LeaklabError("the scenario needs at least one task")
        sets = tuple(layout(layout_name, n_users, n_servers))
        rewards = np.zeros((n_tasks, n_servers))
        rewards[np.arange(n_tasks), rng.choice(CORE, size=n_tasks)] = OPTIMAL_REWARD
        return cls(sets, rewards)

    @property
    def n_users(self) -> int:
        return len(self.action_sets)

    @property
    def n_tasks(self) -> int:
        return self.rewards.shape[0]

    def neighbours(self, identical_only: bool) -> list[list[int]]:
        """Each agent's possible teachers: agents with the same set (``identical_only``, traditional advising) or
        with a set at most one server apart (differentially private advising)."""
        ok = (lambda a, b: a == b) if identical_only else differ_by_at_most_one
        return [[i for i in range(self.n_users) if i != j and ok(self.action_sets[i], self.action_sets[j])]
                for j in range(self.n_users)]
