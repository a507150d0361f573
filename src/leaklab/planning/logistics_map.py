"""Logistics maps in seed 002 (Shen, thesis) chapter 4's Graph-STRIPS model (Sec. 4.4.1): agents (military units)
each own a local area of private bases, public logistic centres join the areas of two or three agents, and every
route (edge) has a length and lies in exactly one area.

The thesis' maps are "similar to Fig. 4.1" and simulated, 10-50 centres with 50-250 bases, and it gives no
generator (notes-002, section 3.6 item 8). :func:`random_logistics_map` is leaklab's: one agent per centre with
five bases each (so 10 centres carry 50 bases, as in Sec. 4.8.1), agents at uniform points of a square of side
sqrt(agents); the centres are the edges of the agents' Euclidean minimum spanning tree plus the shortest non-tree
pair (so the agent graph is connected with one cycle), a centre at the midpoint of its pair, joined with probability
:data:`THIRD_AREA` by a third agent adjacent to either end (then it sits at the three agents' centroid: a centre of
capacity 3); bases uniform in a disc of radius 0.4 around their agent; each area's routes are the Euclidean minimum
spanning tree of its bases and centres plus its :data:`EXTRA_ROUTES` shortest other base pairs or base-centre pairs
(no centre-to-centre route, so a leg crosses private bases); a route's length is 100 times its Euclidean length
(tens, as in the thesis' examples).

Node ids: centres are 0..centres - 1, agent a's bases follow; the map is a :class:`networkx.Graph` whose nodes
carry ``area`` (-1 for a centre) and ``pos``, and whose edges carry ``length`` and ``area``.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import cdist

from leaklab.errors import LeaklabError

__all__ = ["LogisticsMap", "random_logistics_map", "route_length", "MAX_CENTRES"]

MAX_CENTRES = 500
BASES_PER_AREA = 5
THIRD_AREA = 0.3  # probability that a centre joins a third agent
EXTRA_ROUTES = 3  # routes per area beyond its spanning tree
BASE_SPREAD = 0.4  # radius of the disc of an agent's bases around its position
LENGTH_SCALE = 100.0


@dataclass
class LogisticsMap:
    """A Graph-STRIPS map: ``graph`` (every route, its ``length`` and owning ``area``), ``centre_areas[c]`` the
    agents logistic centre c joins (its capacity lc_c is their number), ``bases[a]`` agent a's bases."""

    graph: nx.Graph
    centre_areas: list[tuple[int, ...]]
    bases: list[list[int]]

    @property
    def agents(self) -> int:
        return len(self.bases)

    @property
    def centres(self) -> int:
        return len(self.centre_areas)

    def centres_of(self, area: int) -> list[int]:
        return [c for c, areas in enumerate(self.centre_areas) if area in areas]

    def neighbours(self, area: int) -> dict[int, list[int]]:
        """Agents sharing a centre with ``area`` (Sec. 4.5.1's neighbours), each with the centres they share."""
        out: dict[int, list[int]] = {}
        for c in self.centres_of(area):
            for other in self.centre_areas[c]:
                if other != area:
                    out.setdefault(other, []).append(c)
        return out

    def local(self, area: int) -> nx.Graph:
        """Agent ``area``'s local map: its bases, its centres and its routes, with their lengths (its private
        facts, Definition 4.1)."""
        edges = [(u, v) for u, v, owner in self.graph.edges(data="area") if owner == area]
        return self.graph.edge_subgraph(edges).copy()

    def area_of(self, node: int) -> int:
        return self.graph.nodes[node]["area"]

    def capacity_bound(self) -> int:
        """Theorem 4.5: at most sum_c lc_c messages find a goal agent."""
        return sum(len(areas) for areas in self.centre_areas)


def route_length(distance: float) -> float:
    """A route's length from its endpoints' Euclidean distance (at least 1, one decimal)."""
    return round(LENGTH_SCALE * max(float(distance), 0.01), 1)


def random_logistics_map(centres: int, rng: np.random.Generator) -> LogisticsMap:
    """A random map with ``centres`` logistic centres, as many agents and five bases per agent (module docstring)."""
    if not 3 <= centres <= MAX_CENTRES:
        raise LeaklabError(f"a logistics map has 3 to {MAX_CENTRES} logistic centres (got {centres})")
    n = centres
    points = rng.uniform(0.0, np.sqrt(n), size=(n, 2))
    pair_distance = cdist(points, points)
    tree = minimum_spanning_tree(pair_distance).tocoo()
    pairs = [tuple(sorted((int(i), int(j)))) for i, j in zip(tree.row, tree.col)]
    others = sorted((pair_distance[i, j], i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in pairs)
    pairs.append(others[0][1:])
    centre_areas: list[tuple[int, ...]] = []
    for i, j in pairs:
        adjacent = {k for p in pairs for k in p if i in p or j in p} - {i, j}
        if adjacent and rng.random() < THIRD_AREA:
            third = min(adjacent, key=lambda k: np.linalg.norm(points[k] - (points[i] + points[j]) / 2))
            centre_areas.append((i, j, int(third)))
        else:
            centre_areas.append((i, j))
    graph = nx.Graph()
    for c, areas in enumerate(centre_areas):
        graph.add_node(c, area=-1, pos=points[list(areas)].mean(axis=0))
    bases = []
    for a in range(n):
        radius = BASE_SPREAD * np.sqrt(rng.uniform(size=BASES_PER_AREA))
        angle = rng.uniform(0, 2 * np.pi, size=BASES_PER_AREA)
        ids = list(range(graph.number_of_nodes(), graph.number_of_nodes() + BASES_PER_AREA))
        for k, node in enumerate(ids):
            graph.add_node(node, area=a, pos=points[a] + radius[k] * np.array([np.cos(angle[k]), np.sin(angle[k])]))
        bases.append(ids)
        _add_routes(graph, a, ids + [c for c, areas in enumerate(centre_areas) if a in areas])
    return LogisticsMap(graph, centre_areas, bases)


def _add_routes(graph: nx.Graph, area: int, nodes: list[int]) -> None:
    """Area ``area``'s routes over ``nodes``: the Euclidean minimum spanning tree plus the shortest other pairs
    that are not two centres."""
    pos = np.array([graph.nodes[v]["pos"] for v in nodes])
    d = cdist(pos, pos)
    centre = np.array([graph.nodes[v]["area"] < 0 for v in nodes])
    tree = minimum_spanning_tree(np.where(np.outer(centre, centre), 1e9, d)).tocoo()  # never centre to centre
    chosen = {tuple(sorted((int(i), int(j)))) for i, j in zip(tree.row, tree.col)}
    spare = sorted((d[i, j], i, j) for i in range(len(nodes)) for j in range(i + 1, len(nodes))
                   if (i, j) not in chosen and not (centre[i] and centre[j]))
    chosen |= {(i, j) for _, i, j in spare[:EXTRA_ROUTES]}
    for i, j in sorted(chosen):
        graph.add_edge(nodes[i], nodes[j], length=route_length(d[i, j]), area=area)
