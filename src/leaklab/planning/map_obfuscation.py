"""How an intermediate agent obfuscates its local map before sharing it: seed 002 (Shen, thesis) chapter 4,
Sec. 4.5.2.

* Algorithm 7 (:func:`obfuscate_topology`): the local map's 1K distribution (degree histogram) P(1..d_max), each
  bin plus Laplace(Delta_S d_max / eps) noise (eps / d_max per bin, eps in all), then the map "rewired" to the
  noisy histogram (Mahadevan et al.'s 1K generator; Fig. 4.4(b) keeps the real map and adds fake node (b,6) and
  fake route A~(b,6), so leaklab moves the real map to the target rather than drawing a new graph);
* Algorithm 8 (:func:`route_probabilities`): Q-learning with a policy-gradient step turns the route lengths into
  route-selection probabilities on the walk from entry centre A to exit centre B;
* Eq. 4.2 (:func:`redistribute`): the exponential mechanism's probabilities exp(eps u_i / 2) / sum_j exp(eps u_j / 2)
  replace each node's learned probabilities u; Remark 3's "fixed point" epsilons (:func:`fixed_point_epsilons`);
* Corollary 4.1 (:func:`hidden_nodes`): ceil(Delta_S d_max / eps) nodes whose existence no agent can conclude.

What the thesis leaves open, and leaklab's choices (notes-002, section 3.6):

* Delta_S = 1 as the thesis argues, although removing a node also changes its neighbours' degrees
  (:func:`histogram_sensitivity` measures the true change); logistic centres count in the histogram and are never
  removed (they are public);
* the noisy bins are rounded to whole numbers and clamped at 0; a target with fewer nodes than the map's centres
  plus one gets degree-2 nodes added; the real nodes are matched to the target's degree slots by the assignment of
  least total |degree change| (centres always kept, ties broken at random), the slots left over become fake nodes
  and the real bases left over are dropped; real routes between kept nodes are kept while both ends still need
  degree (in random order), the remaining stubs are paired Havel-Hakimi style (largest need first) by fake routes,
  and stubs no pair can take are left; the result is made connected (Lemma 4.1 claims it is; a 1K rewiring does
  not ensure it) by routes from each other component's lowest-degree node to a random node of the centres'
  component. The realised histogram is recorded; it misses the target in most releases (``leaklab reproduce
  dp-planning`` measures the gap);
* a fake route's length is uniform on [0.5, 1.5] times the mean real length ("random, based on the average");
* Algorithm 8's box is one walk: leaklab runs :data:`EPISODES` walks of at most :data:`MAX_STEPS` routes, reward
  200 / length and Q(v, e) initialised to 100 / length (the thesis' examples), pi(v, .) to 1/length normalised;
  line 10 bootstraps on max Q(v', .) also when v' = B (as printed), and line 15 is Algorithm 4 (the chapter 3
  normalisation: :func:`leaklab.rl.agents.advising.normalize`). As printed, Algorithm 8 does not learn the way to B:
  every step earns a positive reward and B is not absorbing, so a walk that loops is worth more than one that
  arrives (on Fig. 4.4(a)'s map the learned greedy walk never reaches B, :func:`reaches_exit`), and the nodes the
  walks seldom leave keep their 1/length start, whose inverse is the exact length ratios;
* Eq. 4.2 uses the full eps as the thesis' worked example does (u = (0.7, 0.3), eps = 2 gives (0.5987, 0.4013));
  Theorem 4.3's accounting charges eps / k per edge, which the formula does not use.

The released probabilities are a deterministic function of the learned ones; :func:`invert_redistribution`
recovers those exactly, which is what ``leaklab reproduce dp-planning`` measures beside the thesis' claim that the
lengths are "strictly hidden" (Theorem 4.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import linear_sum_assignment

from leaklab.errors import LeaklabError
from leaklab.privacy.mechanisms import ExponentialMechanism, LaplaceMechanism, check_positive
from leaklab.rl.agents.advising import normalize

__all__ = ["degree_histogram", "hidden_nodes", "histogram_sensitivity", "ObfuscatedArea", "obfuscate_topology",
           "RouteLearning", "route_probabilities", "reaches_exit", "redistribute", "invert_redistribution",
           "fixed_point_epsilons"]

EPISODES = 100
MAX_STEPS = 50
FAKE_LENGTH = (0.5, 1.5)  # a fake route's length, as a multiple of the mean real length


def degree_histogram(graph: nx.Graph, d_max: int) -> np.ndarray:
    """The 1K distribution P(1..d_max) (Sec. 4.5.2.1): entry k - 1 counts the nodes of degree k."""
    degrees = np.array([d for _, d in graph.degree()], dtype=int)
    if degrees.size and degrees.max() > d_max:
        raise LeaklabError(f"the map has a node of degree {degrees.max()} above d_max = {d_max}")
    return np.bincount(degrees, minlength=d_max + 1)[1:d_max + 1]


def hidden_nodes(epsilon: float, d_max: int, sensitivity: float = 1.0) -> int:
    """Corollary 4.1: no agent can conclude the existence of any ceil(Delta_S d_max / eps) nodes."""
    return math.ceil(sensitivity * d_max / check_positive("epsilon", epsilon))


def histogram_sensitivity(graph: nx.Graph, d_max: int, removable: list[int] | None = None) -> int:
    """The largest L1 change of P(1..d_max) when one node (of ``removable``, default all) and its routes go:
    the node's own bin and each neighbour's old and new bins (the thesis takes 1)."""
    base = degree_histogram(graph, d_max)
    worst = 0
    for v in graph.nodes if removable is None else removable:
        smaller = graph.copy()
        smaller.remove_node(v)
        worst = max(worst, int(np.abs(degree_histogram(smaller, d_max) - base).sum()))
    return worst


@dataclass
class ObfuscatedArea:
    """Algorithm 7's output: ``graph`` (edges carry ``length`` and ``fake``, nodes ``fake``), the noisy target
    histogram and the histogram the rewiring realised."""

    graph: nx.Graph
    target: np.ndarray
    realised: np.ndarray
    d_max: int


def obfuscate_topology(local: nx.Graph, centres: list[int], epsilon: float, rng: np.random.Generator,
                       sensitivity: float = 1.0) -> ObfuscatedArea:
    """Algorithm 7 on one agent's local map (module docstring for the rewiring). Fake nodes get ids below 0."""
    d_max = max(d for _, d in local.degree())
    histogram = degree_histogram(local, d_max)
    laplace = LaplaceMechanism(epsilon / d_max, sensitivity)  # Lap(Delta_S d_max / eps) on each of d_max bins
    target = np.maximum(np.rint(laplace.sample(histogram, rng)), 0).astype(int)
    shortfall = len(centres) + 1 - int(target.sum())
    if shortfall > 0:
        target[min(1, d_max - 1)] += shortfall
    slots = np.repeat(np.arange(1, d_max + 1), target)
    nodes = list(local.nodes)
    degree = np.array([local.degree(v) for v in nodes])
    cost = np.abs(degree[:, None] - slots[None, :]) + 1e-3 * rng.random((len(nodes), len(slots)))
    cost[[v in centres for v in nodes]] -= 1e6  # the public centres are always matched
    rows, cols = linear_sum_assignment(cost)
    want = {nodes[r]: int(slots[c]) for r, c in zip(rows, cols)}
    fakes = [c for c in range(len(slots)) if c not in set(cols)]
    for k, c in enumerate(fakes):
        want[-(k + 1)] = int(slots[c])
    graph = nx.Graph()
    for v in want:
        graph.add_node(v, fake=v < 0)
    real = [(u, v, d) for u, v, d in local.edges(data="length") if u in want and v in want]
    for i in rng.permutation(len(real)):
        u, v, length = real[i]
        if graph.degree(u) < want[u] and graph.degree(v) < want[v]:
            graph.add_edge(u, v, length=length, fake=False)
    mean = float(np.mean([d for *_, d in local.edges(data="length")]))
    while True:  # Havel-Hakimi on the stubs left
        need = {v: want[v] - graph.degree(v) for v in graph.nodes if want[v] > graph.degree(v)}
        u = max(need, key=lambda v: (need[v], rng.random()), default=None)
        partners = [v for v in need if v != u and not graph.has_edge(u, v)] if u is not None else []
        if not partners:
            break
        v = max(partners, key=lambda w: (need[w], rng.random()))
        graph.add_edge(u, v, length=_fake_length(mean, rng), fake=True)
    components = sorted(nx.connected_components(graph), key=lambda c: -len(set(c) & set(centres)))
    main = sorted(components[0])
    for component in components[1:]:
        lowest = min(sorted(component), key=lambda v: graph.degree(v))
        graph.add_edge(lowest, main[rng.integers(len(main))], length=_fake_length(mean, rng), fake=True)
    realised_max = max(d_max, max(d for _, d in graph.degree()))
    return ObfuscatedArea(graph, target, degree_histogram(graph, realised_max), d_max)


def _fake_length(mean: float, rng: np.random.Generator) -> float:
    return round(mean * rng.uniform(*FAKE_LENGTH), 1)


class RouteLearning(BaseModel):
    """Algorithm 8's hyperparameters (Sec. 4.8.1: alpha 0.1, gamma 0.9, zeta 0.95) and leaklab's walk counts."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    alpha: float = Field(default=0.1, gt=0, le=1)
    gamma: float = Field(default=0.9, ge=0, lt=1)
    zeta: float = Field(default=0.95, gt=0, le=100)
    episodes: int = Field(default=EPISODES, ge=1, le=100_000)
    max_steps: int = Field(default=MAX_STEPS, ge=1, le=100_000)


def route_probabilities(graph: nx.Graph, start: int, goal: int, rng: np.random.Generator,
                        learning: RouteLearning | None = None) -> dict[int, tuple[list[int], np.ndarray]]:
    """Algorithm 8 on a map whose edges carry ``length``: per node its neighbours (sorted) and the learned
    probability of taking the route to each."""
    learning = learning or RouteLearning()
    order = {v: sorted(graph.neighbors(v)) for v in graph.nodes}
    inverse = {v: np.array([1.0 / graph.edges[v, u]["length"] for u in order[v]]) for v in graph.nodes}
    q = {v: 100.0 * inverse[v] for v in graph.nodes}
    pi = {v: inverse[v] / inverse[v].sum() for v in graph.nodes}
    for _ in range(learning.episodes):
        v = start
        for _ in range(learning.max_steps):
            if v == goal:
                break
            k = int(rng.choice(len(order[v]), p=pi[v]))
            u = order[v][k]
            reward = 200.0 * inverse[v][k]
            q[v][k] = (1 - learning.alpha) * q[v][k] + learning.alpha * (reward + learning.gamma * q[u].max())
            pi[v] = normalize(pi[v] + learning.zeta * (q[v] - pi[v] @ q[v]))
            v = u
    return {v: (order[v], pi[v]) for v in graph.nodes}


def reaches_exit(probabilities: dict[int, tuple[list[int], np.ndarray]], start: int, goal: int) -> bool:
    """Whether the most probable route from each node, followed from ``start``, reaches ``goal`` (within as many
    steps as there are nodes)."""
    v = start
    for _ in range(len(probabilities)):
        if v == goal:
            return True
        order, p = probabilities[v]
        v = order[int(np.argmax(p))]
    return v == goal


def redistribute(probabilities: np.ndarray, epsilon: float) -> np.ndarray:
    """Eq. 4.2: u'_i = exp(eps u_i / 2) / sum_j exp(eps u_j / 2) (Delta_u = 1)."""
    return ExponentialMechanism(epsilon, 1.0).probabilities(probabilities)


def invert_redistribution(released: np.ndarray, epsilon: float) -> np.ndarray:
    """The learned probabilities back from Eq. 4.2's output: u_i - u_j = (2 / eps) ln(u'_i / u'_j) and sum u = 1
    fix them (an honest-but-curious receiver that knows eps recovers them exactly)."""
    log = np.log(np.asarray(released, dtype=float))
    return 2.0 / check_positive("epsilon", epsilon) * (log - log.mean()) + 1.0 / log.size


def fixed_point_epsilons(probabilities: np.ndarray) -> np.ndarray:
    """Remark 3: eps_i = 2 (k ln u_i - sum_j ln u_j) / (k u_i - sum_j u_j), the eps at which u'_i = u_i (NaN
    where u_i = 1/k, where every eps leaves the ratio to the mean unchanged)."""
    u = np.asarray(probabilities, dtype=float)
    k = u.size
    numerator = 2 * (k * np.log(u) - np.log(u).sum())
    denominator = k * u - u.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(denominator) > 1e-12, numerator / denominator, np.nan)
