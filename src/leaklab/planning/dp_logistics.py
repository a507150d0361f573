"""Differentially private multi-agent planning for logistic-like problems: seed 002 (Shen, thesis) chapter 4's
approach (Algorithm 6, Sec. 4.5), its *No-privacy* twin and the *Best-first* and *Greedy* (GPPP) baselines of
Sec. 4.8.1, simulated on a :class:`~leaklab.planning.logistics_map.LogisticsMap` with every message counted.

*DP-based* (:func:`simulate` with ``approach="dp"``), for a package from base s of agent i to base g of agent j:

1. Step 1 (Sec. 4.5.1): unless i remembers a plan to j (Remark 4, Corollary 4.2), i floods a query: every agent
   forwards it once, on first receipt, to all its neighbours but the sender, in synchronous rounds until j is
   reached (the round completes); j's reply walks the discovery path back. The agents reached form the high-level
   map.
2. Step 2 (Sec. 4.5.2): i asks each intermediate agent for its obfuscated map (a request and a reply; a map once
   received is kept). Each agent obfuscated its map once, at the start (:mod:`~leaklab.planning.map_obfuscation`:
   Algorithm 7, then Algorithm 8 and Eq. 4.2 for every pair of its centres) and sends the same release to everyone
   (the thesis: agents need not re-obfuscate when their network changes).
3. Step 3 (Sec. 4.5.3): i turns each released probability into a pseudo-length, proportional to 1 / p and scaled so
   that a node's routes average i's own mean route length (Alg. 8 initialises pi proportional to 1 / length, so this
   inverts an unlearned map up to scale, and it gives the thesis' example: 0.7 and 0.2 at mean 45 become 20 and 70);
   the leg between two centres of an agent is the shortest pseudo-length path between them (the fixed
   point of the thesis' "RL algorithm similar to Algorithm 8"); i knows its own leg exactly, not j's (the goal base
   is j's private fact: 0 from every centre of j). The shortest high-level route picks the agents; i sends each its
   leg (one message per agent) and remembers the plan. Each agent then moves the package along its real shortest
   local route (Algorithm 6, line 9); the route length is the real one.

*No-privacy* is the same with the real maps shared (exact legs, j's too). *Best-first* (MAFS-like): the holder
takes the package to the centre minimising its local distance plus the public straight-line distance (x 100, the
length scale) from that centre to the nearest centre of j, not back to the centre it came from (unless it has no
other), broadcasts the state to all other agents (m - 1 messages) and the agent at that centre nearest the goal by
the same heuristic takes over; a repeated (holder, centre) is a loop and a failure. *Greedy* (GPPP): the initiator
runs a greedy best-first search over the public centres by the same straight-line heuristic, asking the agents at
each expanded centre for the centres they reach (a query and a reply per agent), then sends each chosen agent its
leg. Neither remembers plans.

Budgets (Sec. 4.6.4), leaklab's reading: a plan may use ``budget`` (C) messages, every sender's together, and
each plan starts afresh. The thesis gives C to each agent, which "ceases to communicate when eps is used up", and
compares C with Theorem 4.5's sum_c lc_c, the messages one goal-finding may take; with a lifetime budget per agent
the success rate would depend on how many packages a run makes, which the thesis does not give. A plan that needs
more than C fails, its messages counted. The thesis couples C to eps (eps / C per message); that does not set the
map noise here (Laplace(d_max / (eps / C)) would have scale 320 at eps 0.5, C = 40): each agent releases one map.

Privacy of a release: Algorithm 7's histogram is eps-DP (with the thesis' Delta_S = 1, which understates the true
change); Eq. 4.2 publishes the exponential mechanism's probabilities rather than a draw from them, a deterministic
function of Algorithm 8's output that :func:`~leaklab.planning.map_obfuscation.invert_redistribution` undoes
exactly, so the route probabilities, released for every ordered pair of an agent's centres, carry no DP guarantee
whatever eps, and the released map keeps the real routes that survive the rewiring.

Packet routing (Sec. 4.7.1, 4.8.2.2): with ``dynamism`` p, before each package every agent on its route loses a
random base with probability p (one whose removal keeps its area connected, never the package's) and gains a new
one with probability p (routes to its two nearest nodes); if a lost base lay on a leg's planned local route,
Best-first and Greedy launch a new finding process (the hop's broadcast or the whole search again), DP-based and
No-privacy re-plan locally at no message cost.

Packages (Sec. 4.8.1): each round every base creates one with probability 0.2, bound for a uniform base of another
agent. Per package: delivered or not, the real route length and the messages its plan used.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal

import networkx as nx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from leaklab.errors import LeaklabError
from leaklab.planning.logistics_map import LENGTH_SCALE, LogisticsMap, route_length
from leaklab.planning.map_obfuscation import (ObfuscatedArea, RouteLearning, obfuscate_topology, redistribute,
                                               route_probabilities)

__all__ = ["Approach", "APPROACHES", "PlanningSetup", "ReleasedArea", "release_area", "pseudo_lengths",
           "PackageOutcome", "discovery_messages", "simulate"]

Approach = Literal["dp", "no-privacy", "best-first", "greedy"]
APPROACHES: tuple[Approach, ...] = ("dp", "no-privacy", "best-first", "greedy")
PACKAGE_PROBABILITY = 0.2


class PlanningSetup(BaseModel):
    """One simulation's settings: eps per agent (Sec. 4.8.1: 0.5), the message budget C of a plan, the rounds of
    package generation, the packet-routing dynamism and Algorithm 8's learning."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon: float = Field(default=0.5, gt=0, le=1e3)  # beyond, Eq. 4.2 underflows to probability 0
    budget: int = Field(default=40, ge=1, le=10_000_000)
    rounds: int = Field(default=5, ge=1, le=10_000)
    dynamism: float = Field(default=0.0, ge=0, le=1)
    learning: RouteLearning = RouteLearning()


@dataclass
class ReleasedArea:
    """What an intermediate agent sends (Fig. 4.4(d)): the obfuscated topology and, per ordered pair of its centres,
    every node's redistributed route probabilities ``{node: (neighbours, probabilities)}``."""

    topology: ObfuscatedArea
    probabilities: dict[tuple[int, int], dict[int, tuple[list[int], np.ndarray]]]
    learned: dict[tuple[int, int], dict[int, tuple[list[int], np.ndarray]]]


def release_area(lmap: LogisticsMap, area: int, epsilon: float, rng: np.random.Generator,
                 learning: RouteLearning | None = None) -> ReleasedArea:
    """Sec. 4.5.2 for one agent: Algorithm 7, then Algorithm 8 from each of its centres to each other one, then
    Eq. 4.2 at every node (``learned`` keeps Algorithm 8's output before Eq. 4.2, for the leakage measurements)."""
    centres = lmap.centres_of(area)
    topology = obfuscate_topology(lmap.local(area), centres, epsilon, rng)
    released, learned = {}, {}
    for a in centres:
        for b in centres:
            if a != b:
                learned[a, b] = route_probabilities(topology.graph, a, b, rng, learning)
                released[a, b] = {v: (order, redistribute(p, epsilon)) for v, (order, p) in learned[a, b].items()}
    return ReleasedArea(topology, released, learned)


def pseudo_lengths(probabilities: dict[int, tuple[list[int], np.ndarray]], mean_length: float) -> nx.DiGraph:
    """Sec. 4.5.3: each directed route's pseudo-length, proportional to 1 / p with every node's routes averaging
    ``mean_length`` (the receiver's own mean route length)."""
    graph = nx.DiGraph()
    for v, (order, p) in probabilities.items():
        inverse = 1.0 / np.asarray(p)
        for u, w in zip(order, mean_length * inverse / inverse.mean()):
            graph.add_edge(v, u, length=float(w))
    return graph


@dataclass
class PackageOutcome:
    """One package: its start and goal bases, whether it arrived, the real route length (NaN if not) and the
    messages its plan used."""

    start: int
    goal: int
    delivered: bool
    length: float
    messages: int


class _World:
    """The running simulation: the map (which changes under dynamism), budgets, memories and local distances."""

    def __init__(self, lmap: LogisticsMap, setup: PlanningSetup, rng: np.random.Generator):
        self.map, self.setup, self.rng = lmap, setup, rng
        self.left = setup.budget  # the current plan's messages left
        self.messages = 0
        self.plans: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (i, j) -> legs (agent, from, to)
        self.maps: dict[int, set[int]] = {}  # agents whose map agent i holds
        self._next_id = max(lmap.graph.nodes) + 1  # a joining base's id, never one used before
        self._distances: dict[tuple[int, int], dict[int, float]] = {}
        self._paths: dict[tuple[int, int], dict[int, list[int]]] = {}

    def send(self, count: int = 1) -> bool:
        """Spend ``count`` of the plan's messages; False (nothing spent) when too few are left."""
        if self.left < count:
            return False
        self.left -= count
        self.messages += count
        return True

    def local_distance(self, area: int, source: int, target: int) -> float:
        """The agent's real shortest local route (its own plan, Algorithm 6 line 9)."""
        key = (area, source)
        if key not in self._distances:
            self._distances[key], self._paths[key] = nx.single_source_dijkstra(self.map.local(area), source,
                                                                               weight="length")
        return self._distances[key].get(target, np.inf)

    def local_path(self, area: int, source: int, target: int) -> list[int]:
        self.local_distance(area, source, target)
        return self._paths[area, source].get(target, [])

    def heuristic(self, centre: int, goal_area: int) -> float:
        """Public straight-line distance from a centre to the goal agent's nearest centre (length units)."""
        pos = self.map.graph.nodes
        return LENGTH_SCALE * min(float(np.linalg.norm(pos[centre]["pos"] - pos[c]["pos"]))
                                  for c in self.map.centres_of(goal_area))

    def change(self, area: int, keep: set[int]) -> int | None:
        """Packet routing's dynamism in one area: maybe a base leaves (returned), maybe one joins."""
        graph, gone = self.map.graph, None
        local = self.map.local(area)
        if self.rng.random() < self.setup.dynamism:
            cut = set(nx.articulation_points(local))
            candidates = [v for v in self.map.bases[area] if v not in keep and v not in cut]
            if candidates:
                gone = candidates[self.rng.integers(len(candidates))]
                graph.remove_node(gone)
                self.map.bases[area].remove(gone)
        if self.rng.random() < self.setup.dynamism:
            nodes = [v for v in self.map.local(area).nodes]
            pos = np.array([graph.nodes[v]["pos"] for v in nodes])
            new_pos = pos[self.rng.integers(len(nodes))] + self.rng.normal(0, 0.2, size=2)
            new, self._next_id = self._next_id, self._next_id + 1
            graph.add_node(new, area=area, pos=new_pos)
            self.map.bases[area].append(new)
            for k in np.argsort(np.linalg.norm(pos - new_pos, axis=1))[:2]:
                graph.add_edge(new, nodes[k], length=route_length(np.linalg.norm(pos[k] - new_pos)), area=area)
        for key in [k for k in self._distances if k[0] == area]:
            del self._distances[key], self._paths[key]
        return gone


def _flood(world: _World, source: int, goal: int) -> list[int] | None:
    """Step 1: the reached agents (the high-level map) or None if the goal agent was not found."""
    parent = {source: source}
    frontier = [source]
    while frontier and goal not in parent:
        nxt = []
        for x in frontier:
            for y in sorted(world.map.neighbours(x)):
                if y == parent[x] or not world.send():
                    continue
                if y not in parent:
                    parent[y] = x
                    nxt.append(y)
        frontier = nxt
    if goal not in parent:
        return None
    hop = goal
    while hop != source:  # the reply walks back
        if not world.send():
            return None
        hop = parent[hop]
    return list(parent)


def discovery_messages(lmap: LogisticsMap, source: int, goal: int) -> int:
    """Step 1's messages (the flood and the reply) for agent ``source`` to find agent ``goal`` without a budget,
    to set beside Theorem 4.5's bound :meth:`~leaklab.planning.logistics_map.LogisticsMap.capacity_bound`."""
    world = _World(lmap, PlanningSetup(budget=10_000_000), np.random.default_rng(0))
    if _flood(world, source, goal) is None:
        raise LeaklabError(f"agent {goal} is not reachable from agent {source}")
    return world.messages


def _high_level_route(world: _World, legs_of: dict[int, dict[tuple[int, int], float]], source: int, start: int,
                      goal: int, goal_leg: dict[int, float]) -> list[tuple[int, int, int]] | None:
    """The shortest route over the centres: ``legs_of[agent][(a, b)]`` is the estimated leg between two of its
    centres; the source agent's leg from ``start`` is exact; ``goal_leg[c]`` is the estimate from centre c."""
    graph = nx.DiGraph()
    for c in world.map.centres_of(source):
        graph.add_edge("s", c, length=world.local_distance(source, start, c), agent=source)
    for agent, legs in legs_of.items():
        for (a, b), w in legs.items():
            if not graph.has_edge(a, b) or graph.edges[a, b]["length"] > w:
                graph.add_edge(a, b, length=w, agent=agent)
    for c, w in goal_leg.items():
        graph.add_edge(c, "g", length=w, agent=goal)
    try:
        path = nx.dijkstra_path(graph, "s", "g", weight="length")
    except (nx.NetworkXNoPath, nx.NodeNotFound):
        return None
    return [(graph.edges[u, v]["agent"], u, v) for u, v in zip(path, path[1:])]


def _plan_shared(world: _World, released: dict[int, ReleasedArea] | None, source: int, start: int, goal: int,
                 goal_base: int) -> list[tuple[int, int, int]] | None:
    """DP-based (``released`` given) or No-privacy (None): Steps 1-3 or the remembered plan."""
    if (source, goal) in world.plans:
        legs = world.plans[source, goal]
    else:
        reached = _flood(world, source, goal)
        if reached is None:
            return None
        held = world.maps.setdefault(source, set())
        legs_of = {}
        own_mean = float(np.mean([d for *_, d in world.map.local(source).edges(data="length")]))
        for agent in reached:
            if agent in (source, goal):
                continue
            if agent not in held:
                if not world.send(2):
                    continue
                held.add(agent)
            centres = world.map.centres_of(agent)
            if released is None:
                legs_of[agent] = {(a, b): world.local_distance(agent, a, b) for a in centres for b in centres if a != b}
            else:
                legs_of[agent] = {}
                for (a, b), probabilities in released[agent].probabilities.items():
                    pseudo = pseudo_lengths(probabilities, own_mean)
                    legs_of[agent][a, b] = nx.dijkstra_path_length(pseudo, a, b, weight="length")
        goal_leg = {c: 0.0 if released is not None else world.local_distance(goal, c, goal_base)
                    for c in world.map.centres_of(goal)}
        legs = _high_level_route(world, legs_of, source, start, goal, goal_leg)
        if legs is None or not _hand_over(world, legs, source):
            return None
        world.plans[source, goal] = legs  # remembered once its hand-overs went out
        return legs
    return legs if _hand_over(world, legs, source) else None


def _hand_over(world: _World, legs: list[tuple[int, int, int]], source: int) -> bool:
    """The initiator sends every other agent of the plan its leg (one message each)."""
    return all(world.send() for agent in dict.fromkeys(a for a, *_ in legs[1:]) if agent != source)


def _plan_greedy(world: _World, source: int, start: int, goal: int) -> list[tuple[int, int, int]] | None:
    """GPPP's global phase: greedy best-first over the centres by the public heuristic, then the hand-overs."""
    frontier = [(world.heuristic(c, goal), c) for c in world.map.centres_of(source)]
    heapq.heapify(frontier)
    came = {c: ("s", source) for _, c in frontier}
    asked: set[int] = {source}
    while frontier:
        _, c = heapq.heappop(frontier)
        if goal in world.map.centre_areas[c]:
            legs, node = [(goal, c, "g")], c
            while node != "s":
                previous, agent = came[node]
                legs.append((agent, previous, node))
                node = previous
            legs.reverse()
            return legs if _hand_over(world, legs, source) else None
        for agent in world.map.centre_areas[c]:
            if agent in asked:
                continue
            asked.add(agent)
            if not world.send(2):
                continue
            for d in world.map.centres_of(agent):
                if d not in came:
                    came[d] = (c, agent)
                    heapq.heappush(frontier, (world.heuristic(d, goal), d))
    return None


def _run_best_first(world: _World, start: int, goal: int, goal_base: int) -> float | None:
    """Best-first: the hops to the goal agent and its last leg; the real length, or None on a loop or silence."""
    holder, node, arrived, seen, length = world.map.area_of(start), start, None, set(), 0.0
    while holder != goal:
        options = [c for c in world.map.centres_of(holder) if c != arrived] or [arrived]
        c = min(options, key=lambda c: (world.local_distance(holder, node, c) + world.heuristic(c, goal), c))
        if (holder, c) in seen or not world.send(world.map.agents - 1):
            return None
        seen.add((holder, c))
        if world.setup.dynamism:
            planned = world.local_path(holder, node, c)
            if world.change(holder, {node, c, start, goal_base}) in planned and \
                    not world.send(world.map.agents - 1):
                return None  # the broken route's new finding process could not be broadcast
        length += world.local_distance(holder, node, c)
        takers = [a for a in world.map.centre_areas[c] if a != holder]
        holder = min(takers, key=lambda a: (min(world.heuristic(d, goal) for d in world.map.centres_of(a)), a))
        node, arrived = c, c
    return length + world.local_distance(goal, node, goal_base)


def _execute(world: _World, legs: list[tuple[int, int, int]], start: int, goal_base: int,
             replan: int | None) -> float | None:
    """Each agent moves the package along its real shortest local route; under dynamism an agent may lose a base
    first, and a broken planned route costs the plan ``replan`` more messages (None: local re-planning)."""
    points = [start if u == "s" else u for _, u, _ in legs] + [goal_base]
    length = 0.0
    for (agent, *_), a, b in zip(legs, points, points[1:]):
        if world.setup.dynamism:
            planned = world.local_path(agent, a, b)
            gone = world.change(agent, {a, b, start, goal_base})
            if gone is not None and gone in planned and replan is not None and not world.send(replan):
                return None
        length += world.local_distance(agent, a, b)
    return length


def simulate(lmap: LogisticsMap, approach: Approach, setup: PlanningSetup, rng: np.random.Generator,
             released: dict[int, ReleasedArea] | None = None) -> list[PackageOutcome]:
    """Every package of ``setup.rounds`` rounds, planned and delivered by ``approach`` (module docstring).
    ``released`` (DP-based only) are the agents' obfuscated maps; :func:`release_area` makes them when None."""
    if approach not in APPROACHES:
        raise LeaklabError(f"unknown planning approach {approach!r}; choose one of {', '.join(APPROACHES)}")
    packages, dynamics = (np.random.default_rng(s) for s in rng.integers(2 ** 63, size=2))
    world = _World(LogisticsMap(lmap.graph.copy(), list(lmap.centre_areas), [list(b) for b in lmap.bases]),
                   setup, dynamics)  # every approach meets the same packages from the same rng
    if approach == "dp" and released is None:
        released = {a: release_area(lmap, a, setup.epsilon, dynamics, setup.learning) for a in range(lmap.agents)}
    outcomes = []
    for _ in range(setup.rounds):
        for start in [b for bases in world.map.bases for b in bases]:
            if start not in world.map.graph or packages.random() >= PACKAGE_PROBABILITY:
                continue
            source = world.map.area_of(start)
            goal = int(packages.choice([a for a in range(lmap.agents) if a != source]))
            goal_base = world.map.bases[goal][packages.integers(len(world.map.bases[goal]))]
            before, world.left = world.messages, setup.budget
            if approach == "best-first":
                length = _run_best_first(world, start, goal, goal_base)
            else:
                if approach == "greedy":
                    legs = _plan_greedy(world, source, start, goal)
                else:
                    legs = _plan_shared(world, released if approach == "dp" else None, source, start, goal,
                                        goal_base)
                replan = world.messages - before if approach == "greedy" else None
                length = None if legs is None else _execute(world, legs, start, goal_base, replan)
            outcomes.append(PackageOutcome(start, goal_base, length is not None,
                                           np.nan if length is None else length, world.messages - before))
    return outcomes
