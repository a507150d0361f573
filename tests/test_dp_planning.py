"""Seed 002 chapter 4: logistics maps, Algorithms 7-8, Eq. 4.2 and the planners (leaklab.planning)."""

import json

import networkx as nx
import numpy as np
import pytest

from leaklab.errors import LeaklabError
from leaklab.planning import dp_logistics as dl
from leaklab.planning import map_obfuscation as mo
from leaklab.planning.logistics_map import BASES_PER_AREA, random_logistics_map


def _fig_4_4a() -> nx.Graph:
    """Agent b's map of Fig. 4.4(a): centres A (0) and B (1), bases (b,1)..(b,5) as 2..6, with the degrees the
    thesis counts (A, B, (b,4), (b,5): 2; (b,2), (b,3): 3; (b,1): 4)."""
    g = nx.Graph()
    for u, v, length in [(0, 2, 50), (0, 3, 40), (2, 3, 30), (2, 4, 20), (2, 1, 60), (3, 5, 35), (4, 5, 25),
                         (4, 6, 45), (6, 1, 55)]:
        g.add_edge(u, v, length=float(length))
    return g


def test_random_map_is_a_graph_strips_map():
    m = random_logistics_map(12, np.random.default_rng(0))
    g = m.graph
    assert m.agents == m.centres == 12 and all(len(b) == BASES_PER_AREA for b in m.bases)
    assert nx.is_connected(g) and g.number_of_nodes() == 12 + 12 * BASES_PER_AREA
    for u, v, data in g.edges(data=True):
        assert data["length"] > 0 and data["area"] >= 0
        assert not (m.area_of(u) < 0 and m.area_of(v) < 0)  # no centre-to-centre route
        for node in (u, v):
            assert m.area_of(node) in (-1, data["area"])  # a base's routes stay in its area
    for a in range(m.agents):
        assert nx.is_connected(m.local(a)) and set(m.centres_of(a)) <= set(m.local(a).nodes)
        for b, shared in m.neighbours(a).items():
            assert sorted(m.neighbours(b)[a]) == sorted(shared)
    assert m.capacity_bound() == sum(len(c) for c in m.centre_areas) >= 2 * m.centres
    again = random_logistics_map(12, np.random.default_rng(0))
    assert sorted(g.edges(data="length")) == sorted(again.graph.edges(data="length"))
    with pytest.raises(LeaklabError, match="3 to"):
        random_logistics_map(2, np.random.default_rng(0))


def test_degree_histogram_corollary_and_sensitivity_on_fig_4_4():
    g = _fig_4_4a()
    assert mo.degree_histogram(g, 4).tolist() == [0, 4, 2, 1]
    assert mo.hidden_nodes(0.5, 4) == 8  # Corollary 4.1's example
    # removing (b,1) moves itself and four neighbours: L1 change 5, not the thesis' Delta_S = 1
    assert mo.histogram_sensitivity(g, 4, [2]) == 5
    assert mo.histogram_sensitivity(g, 4) >= 5
    with pytest.raises(LeaklabError, match="d_max"):
        mo.degree_histogram(g, 3)


def test_algorithm_7_keeps_centres_connects_and_is_exact_without_noise():
    g = _fig_4_4a()
    exact = mo.obfuscate_topology(g, [0, 1], 1e9, np.random.default_rng(0))
    assert exact.target.tolist() == [0, 4, 2, 1]
    assert {frozenset(e) for e in exact.graph.edges} == {frozenset(e) for e in g.edges}
    assert not any(f for _, f in exact.graph.nodes(data="fake"))
    sizes = []
    for seed in range(20):
        out = mo.obfuscate_topology(g, [0, 1], 0.5, np.random.default_rng(seed))
        assert {0, 1} <= set(out.graph.nodes) and nx.is_connected(out.graph)
        assert all(length > 0 for *_, length in out.graph.edges(data="length"))
        fake = [v for v, f in out.graph.nodes(data="fake") if f]
        assert all(v < 0 for v in fake) and all(v >= 0 for v in set(out.graph.nodes) - set(fake))
        sizes.append(out.graph.number_of_nodes())
    assert len(set(sizes)) > 3  # Laplace(8) per bin moves the node count


def test_algorithm_8_learns_valid_distributions_favouring_the_short_route():
    g = nx.Graph()
    for u, v, length in [(0, 2, 50), (0, 3, 40), (2, 1, 50), (3, 1, 40), (2, 3, 30)]:
        g.add_edge(u, v, length=float(length))
    learned = mo.route_probabilities(g, 0, 1, np.random.default_rng(0))
    for v, (order, p) in learned.items():
        assert order == sorted(g.neighbors(v)) and p.sum() == pytest.approx(1) and (p > 0).all() and (p < 1).all()
    order, p = learned[0]
    assert p[order.index(3)] > p[order.index(2)]  # the 40-long route beats the 50-long one


def test_algorithm_8_as_printed_learns_to_loop_not_to_reach_b():
    g = _fig_4_4a()  # A = 0, B = 1
    learned = mo.route_probabilities(g, 0, 1, np.random.default_rng(0))
    assert not mo.reaches_exit(learned, 0, 1)  # positive rewards and no absorbing B: looping pays
    order, p = learned[2]  # (b,1), one route from B
    assert p[order.index(1)] == p.min()
    assert mo.reaches_exit({0: ([1], np.ones(1)), 1: ([0, 2], np.array([0.2, 0.8])), 2: ([1], np.ones(1))}, 0, 2)
    again = mo.route_probabilities(g, 0, 1, np.random.default_rng(0))
    assert all(np.array_equal(again[v][1], learned[v][1]) for v in learned)
    with pytest.raises(ValueError):
        mo.RouteLearning(gamma=1.0)


def test_eq_4_2_example_inversion_and_remark_3():
    released = mo.redistribute(np.array([0.7, 0.3]), 2.0)
    assert released == pytest.approx([0.5987, 0.4013], abs=1e-4)  # the thesis' 0.6 and 0.4
    u = np.array([0.5, 0.3, 0.15, 0.05])
    for eps in (0.1, 0.5, 2.0):
        assert mo.invert_redistribution(mo.redistribute(u, eps), eps) == pytest.approx(u, abs=1e-12)
    assert mo.redistribute(u, 1e-9) == pytest.approx(np.full(4, 0.25), abs=1e-9)
    assert mo.redistribute(u, 1e3)[0] == pytest.approx(1.0)
    two = np.array([0.7, 0.3])
    eps = mo.fixed_point_epsilons(two)
    assert eps[0] == pytest.approx(eps[1]) and mo.redistribute(two, eps[0]) == pytest.approx(two)
    assert np.isnan(mo.fixed_point_epsilons(np.array([0.5, 0.5]))).all()


def test_pseudo_lengths_average_the_receivers_mean():
    lengths = dl.pseudo_lengths({0: ([1, 2], np.array([0.7, 0.2]))}, 45.0)
    a, b = lengths.edges[0, 1]["length"], lengths.edges[0, 2]["length"]
    assert (a + b) / 2 == pytest.approx(45)
    assert a == pytest.approx(20) and b == pytest.approx(70)  # Sec. 4.5.3's example


@pytest.fixture(scope="module")
def small_map():
    lmap = random_logistics_map(8, np.random.default_rng(3))
    learning = mo.RouteLearning(episodes=10, max_steps=20)
    rng = np.random.default_rng(4)
    released = {a: dl.release_area(lmap, a, 0.5, rng, learning) for a in range(lmap.agents)}
    return lmap, released, learning


def test_planners_deliver_along_real_routes_and_respect_the_budget(small_map):
    lmap, released, learning = small_map
    rich = dl.PlanningSetup(budget=10_000, rounds=3, learning=learning)
    shortest = {}
    for approach in dl.APPROACHES:
        outcomes = dl.simulate(lmap, approach, rich, np.random.default_rng(9), released)
        assert outcomes and all(o.messages >= 0 for o in outcomes)
        if approach != "best-first":  # it may loop
            assert all(o.delivered for o in outcomes)
        for o in outcomes:
            if o.delivered:
                best = shortest.setdefault((o.start, o.goal), nx.shortest_path_length(
                    lmap.graph, o.start, o.goal, weight="length"))
                assert o.length >= best - 1e-9
        starts = [(o.start, o.goal) for o in outcomes]
        assert starts == [(o.start, o.goal) for o in dl.simulate(lmap, "greedy", rich, np.random.default_rng(9))]
    broke = dl.PlanningSetup(budget=1, rounds=3, learning=learning)
    for approach in dl.APPROACHES:  # a discovery needs a query and a reply, a broadcast m - 1 messages
        outcomes = dl.simulate(lmap, approach, broke, np.random.default_rng(9), released)
        assert all(o.messages <= 1 for o in outcomes)
        for o in outcomes:  # Greedy reaches a neighbour with its one hand-over
            near = lmap.area_of(o.goal) in lmap.neighbours(lmap.area_of(o.start))
            assert o.delivered == (approach == "greedy" and near)
    with pytest.raises(LeaklabError, match="unknown planning approach"):
        dl.simulate(lmap, "oracle", rich, np.random.default_rng(9))


def test_discovery_stays_within_theorem_4_5(small_map):
    lmap = small_map[0]
    counts = [dl.discovery_messages(lmap, a, b) for a in range(lmap.agents) for b in range(lmap.agents) if a != b]
    assert min(counts) >= 2 and max(counts) <= lmap.capacity_bound()  # a query and a reply at least


def test_remembered_plans_cost_only_hand_overs(small_map):
    lmap, released, learning = small_map
    setup = dl.PlanningSetup(budget=10_000, rounds=20, learning=learning)
    outcomes = dl.simulate(lmap, "dp", setup, np.random.default_rng(1), released)
    first, later = {}, []
    for o in outcomes:
        pair = (lmap.area_of(o.start), lmap.area_of(o.goal))
        if pair in first:
            later.append(o.messages)
        else:
            first[pair] = o.messages
    assert later and max(later) < max(first.values())  # Corollary 4.2: no second discovery
    assert max(later) <= lmap.agents - 1


def test_dynamism_changes_the_network_and_stays_reproducible(small_map):
    lmap, released, learning = small_map
    setup = dl.PlanningSetup(budget=10_000, rounds=5, dynamism=0.5, learning=learning)
    one = dl.simulate(lmap, "greedy", setup, np.random.default_rng(2))
    two = dl.simulate(lmap, "greedy", setup, np.random.default_rng(2))
    assert [(o.start, o.goal, o.length, o.messages) for o in one] == [(o.start, o.goal, o.length, o.messages)
                                                                      for o in two]
    static = dl.simulate(lmap, "greedy", setup.model_copy(update={"dynamism": 0.0}), np.random.default_rng(2))
    assert any(o.start >= lmap.graph.number_of_nodes() for o in one) or \
        [o.length for o in one] != [o.length for o in static]
    assert lmap.graph.number_of_nodes() == 8 + 8 * BASES_PER_AREA  # the caller's map is untouched


def test_reproduce_dp_planning_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "dpp"
    result = CliRunner().invoke(app, ["reproduce", "dp-planning", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "dp_planning.png").stat().st_size > 0
    assert set(data["experiments"]) == {"logistics/map_size", "logistics/epsilon", "packet-routing/map_size",
                                        "packet-routing/epsilon", "packet-routing/dynamism"}
    assert set(data["experiments"]["logistics/map_size"]) == set(dl.APPROACHES)
    for row in data["experiments"]["logistics/map_size"]["no-privacy"].values():
        assert row["length_vs_no_privacy"] == 1.0
    assert set(data["experiments"]["logistics/epsilon"]) == {"dp", "no-privacy"}
    for row in data["experiments"]["logistics/epsilon"]["dp"].values():
        assert row["length_vs_no_privacy"] >= 0.5
    for leak in data["leakage"].values():
        assert leak["inversion_max_error"] < 1e-9 and 0 <= leak["real_routes_kept"] <= 1
        for share in ("length_order_agreement", "exact_ratio_share", "exit_reached_share"):
            assert 0 <= leak[share] <= 1
        assert leak["exact_ratio_share"] > 0.2  # unvisited nodes keep 1/length: their ratios come back exactly
    assert all(v > 1 for v in data["histogram_sensitivity"].values())
    assert all(0 < row["worst_over_bound"] <= 1 for row in data["theorem_4_5"].values())
    assert "routes ordered by length" in result.output
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "dp-planning", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["experiments"] == data["experiments"]
    bad = CliRunner().invoke(app, ["reproduce", "dp-planning", "--quick", "--maps", "0", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--maps" in bad.output and not (tmp_path / "x").exists()


def test_config_refuses_bad_sweeps():
    from pydantic import ValidationError

    from leaklab.experiments.dp_planning import DpPlanningConfig

    assert DpPlanningConfig(sizes=[20, 10, 10]).sizes == [10, 20]
    for bad in ({"sizes": [2]}, {"sizes": []}, {"dynamisms": [1.5]}, {"epsilons": [0.0]}):
        with pytest.raises(ValidationError):
            DpPlanningConfig(**bad)
