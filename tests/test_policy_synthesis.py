"""Seed 003, chapter 2: tabular MDPs, Algorithm 1 (privacy-engineered policy synthesis), the cost-of-privacy bounds
of Theorems 2.4 and 2.6, and ``leaklab reproduce policy-synthesis``."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from leaklab.errors import LeaklabError
from leaklab.planning import (TabularMDP, concentration_radius, evaluate, investment_mdp, optimal_policy,
                              privatize_transitions, random_mdp, robust_evaluation, robust_expectation,
                              synthesize_private_policy)
from leaklab.planning.mdp import q_values
from leaklab.planning.private_synthesis import extreme_distribution, robust_expectation_lp


def _rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("sense", ["min", "max"])
def test_closed_form_equals_the_thesis_linear_program(sense):
    rng = _rng(1)
    for i in range(60):
        n = int(rng.integers(2, 12))
        p = rng.dirichlet(np.full(n, rng.uniform(0.2, 3)))
        v = rng.normal(size=n)
        if i % 4 == 0:
            v = np.round(v)  # ties in the values
        alpha, beta = [0.0, 0.05, 0.3, 1.2][i % 4], [0.0, 0.05, 0.5, 1.0][(i // 4) % 4]
        assert robust_expectation(p, v, alpha, beta, sense) == pytest.approx(
            robust_expectation_lp(p, v, alpha, beta, sense), abs=1e-9)


def test_closed_form_edges_and_batching():
    rng = _rng(2)
    p, v = rng.dirichlet(np.ones(6), size=4), rng.normal(size=6)
    assert np.allclose(robust_expectation(p, v, 0.0, 0.0, "min"), p @ v)  # the set is P-bar alone
    assert np.allclose(robust_expectation(p, v, 2.0, 0.0, "min"), v.min())  # the whole simplex
    assert np.allclose(robust_expectation(p, v, 0.0, 1.0, "max"), v.max())
    batched = robust_expectation(p, v, 0.1, 0.05, "max")
    assert batched.shape == (4,) and np.allclose(batched, [robust_expectation(row, v, 0.1, 0.05, "max") for row in p])
    with pytest.raises(LeaklabError, match="sense"):
        robust_expectation(p, v, 0.1, 0.05, "mean")
    with pytest.raises(LeaklabError, match="one number per state"):
        robust_expectation(p, v[:5], 0.1, 0.05, "min")


def test_extreme_distribution_lies_in_the_set():
    rng = _rng(21)
    p, v = rng.dirichlet(np.ones(7), size=5), rng.normal(size=7)
    for alpha, beta, sense in ((0.1, 0.05, "min"), (0.3, 0.2, "max"), (0.0, 0.0, "min")):
        x = extreme_distribution(p, v, alpha, beta, sense)
        assert np.allclose(x.sum(axis=1), 1) and x.min() >= 0
        extreme = np.eye(7)[v.argmin() if sense == "min" else v.argmax()]
        p2 = x - beta * extreme  # (1 - beta) P2
        assert np.abs(p2 - (1 - beta) * p).max() <= (1 - beta) * alpha + 1e-12
        assert np.allclose(x @ v, robust_expectation(p, v, alpha, beta, sense))


def test_concentration_radius_is_lemma_2_2():
    assert concentration_radius(10, 0.05) == pytest.approx(0.3690, abs=1e-4)
    assert concentration_radius(100, 0.05) == pytest.approx(0.1218, abs=1e-4)
    assert concentration_radius(100, 0.01) == pytest.approx(0.1510, abs=1e-4)
    for k, beta in ((0, 0.05), (-1, 0.05), (float("nan"), 0.05), (10, 0), (10, 1)):
        with pytest.raises(LeaklabError):
            concentration_radius(k, beta)


@pytest.mark.parametrize("p", [np.full(2, 0.5), np.array([0.7, 0.2, 0.1])])
def test_lemma_2_2_holds_by_monte_carlo(p):
    """P(||Dir_k(p) - p||_inf >= alpha) <= beta where the sub-Gaussian argument is tightest (two states at 1/2)."""
    rng = _rng(3)
    for k in (2, 10, 100):
        x = rng.dirichlet(k * p, size=20_000)
        share = np.mean(np.abs(x - p).max(axis=1) >= concentration_radius(k, 0.05))
        assert share <= 0.05


def test_lemma_2_2_as_printed_fails_for_many_small_entries_and_the_union_radius_holds():
    """The printed radius drops the maximum over coordinates: p uniform over 20 states at k = 2 exceeds it in ~9%
    of draws (beta 5%); the union-bound radius sqrt(log(2n / beta) / (2 (k + 1))) holds."""
    p, k = np.full(20, 0.05), 2
    deviation = np.abs(_rng(4).dirichlet(k * p, size=20_000) - p).max(axis=1)
    assert np.mean(deviation >= concentration_radius(k, 0.05)) > 0.07
    union = concentration_radius(k, 0.05, states=20)
    assert union == pytest.approx(np.sqrt(np.log(40 / 0.05) / 6))
    for k in (2, 10, 100):
        deviation = np.abs(_rng(5).dirichlet(k * p, size=20_000) - p).max(axis=1)
        assert np.mean(deviation >= concentration_radius(k, 0.05, states=20)) <= 0.05
    with pytest.raises(LeaklabError, match="state count"):
        concentration_radius(k, 0.05, states=1)


def test_privatize_transitions_draws_dirichlet():
    p = np.array([[0.6, 0.3, 0.1]])
    draws = np.stack([privatize_transitions(p, 20, _rng(s))[0] for s in range(3000)])
    assert np.allclose(draws.sum(axis=1), 1) and draws.min() >= 0
    assert np.allclose(draws.mean(axis=0), p[0], atol=0.01)
    assert np.allclose(draws.var(axis=0), p[0] * (1 - p[0]) / 21, rtol=0.1)  # Lemma 1.8: p(1 - p) / (k + 1)
    assert np.array_equal(privatize_transitions(p, 5, _rng(4)), privatize_transitions(p, 5, _rng(4)))
    with pytest.raises(LeaklabError, match="positive"):
        privatize_transitions(np.array([0.5, 0.5, 0.0]), 5, _rng())
    with pytest.raises(LeaklabError, match="concentration"):
        privatize_transitions(p, 0, _rng())


def test_mdp_refuses_bad_input():
    p, r = np.full((2, 1, 2), 0.5), np.zeros((2, 1))
    cases = [(dict(transitions=np.full((2, 1, 3), 1 / 3), rewards=r, horizon=2), "S, A, S"),
             (dict(transitions=p, rewards=np.zeros((2, 2)), horizon=2), "rewards"),
             (dict(transitions=np.full((2, 1, 2), 0.6), rewards=r, horizon=2), "summing to 1"),
             (dict(transitions=p, rewards=r, horizon=None), "discount of at most 1 - 1e-9"),
             # values lost to rounding: one plan in six at this discount was singular or 1e17 for rewards in [0, 1]
             (dict(transitions=p, rewards=r, horizon=None, discount=1 - 1e-15), "discount of at most 1 - 1e-9"),
             (dict(transitions=p, rewards=r, horizon=None, discount=0.9, terminal=[0, 0]), "finite horizon"),
             (dict(transitions=p, rewards=r, horizon=0), "horizon"),
             (dict(transitions=p, rewards=r, horizon=True), "horizon"),
             (dict(transitions=p, rewards=r, horizon=2, terminal=[0.0]), "terminal"),
             (dict(transitions=p, rewards=r, horizon=2, start=2), "start"),
             (dict(transitions=p, rewards=np.full((2, 1), np.inf), horizon=2), "finite")]
    for kwargs, message in cases:
        with pytest.raises(LeaklabError, match=message):
            TabularMDP(**kwargs)


def test_mdp_json_round_trip_and_errors():
    mdp = random_mdp(4, 2, 3, _rng(5))
    again = TabularMDP.from_json(json.loads(json.dumps(mdp.to_json())))
    assert np.array_equal(again.transitions, mdp.transitions) and np.array_equal(again.terminal, mdp.terminal)
    assert again.horizon == 3 and again.start == 0
    for bad in ([], {"transitions": [[[1.0]]]}, {**mdp.to_json(), "extra": 1}, {**mdp.to_json(), "rewards": "x"},
                {**mdp.to_json(), "start": True}, {**mdp.to_json(), "discount": True},
                {**mdp.to_json(), "rewards": [[True, 0.0]] * 4}, {**mdp.to_json(), "rewards": [["0.5", 0.0]] * 4},
                {**mdp.to_json(), "terminal": [10 ** 400] * 4}, {**mdp.to_json(), "rewards": [[1e300, 0.0]] * 4}):
        with pytest.raises(LeaklabError):
            TabularMDP.from_json(bad)
    # the keys that are wrong are named (a misspelt optional key read as a wrong file)
    with pytest.raises(LeaklabError, match=r"^an MDP has 1 unknown key \('gamma'\)"):
        TabularMDP.from_json({**mdp.to_json(), "gamma": 0.9})
    with pytest.raises(LeaklabError, match=r"\(horizon, rewards missing\)$"):
        TabularMDP.from_json({"transitions": [[[1.0]]]})
    deep = 1
    for _ in range(60):  # past numpy's 32 dimensions: its RuntimeError was a traceback
        deep = [deep]
    with pytest.raises(LeaklabError, match="transitions is nested too deeply"):
        TabularMDP.from_json({**mdp.to_json(), "transitions": deep})
    with pytest.raises(LeaklabError, match="2 states or more"):
        privatize_transitions(np.ones((1, 1, 1)), 10, _rng())
    with pytest.raises(ValueError):  # read-only arrays: an MDP cannot change after its checks
        mdp.transitions[0, 0, 0] = 1.0


def test_backward_induction_beats_every_deterministic_policy():
    mdp = random_mdp(3, 2, 2, _rng(6))
    policy, values = optimal_policy(mdp)
    assert np.allclose(evaluate(mdp, policy), values)
    for flat in itertools.product(range(2), repeat=6):
        other = np.array(flat).reshape(2, 3)
        assert (evaluate(mdp, other)[0] <= values[0] + 1e-12).all()


def test_policy_iteration_meets_bellman_optimality():
    mdp = random_mdp(8, 3, None, _rng(7), discount=0.95)
    policy, values = optimal_policy(mdp)
    q = q_values(mdp, values)
    assert np.allclose(q.max(axis=1), values, atol=1e-9)
    assert np.allclose(q[np.arange(8), policy], values, atol=1e-9)
    v = np.zeros(8)
    for _ in range(2000):  # the policy's value by plain iteration equals the linear solve
        v = mdp.rewards[np.arange(8), policy] + 0.95 * mdp.transitions[np.arange(8), policy] @ v
    assert np.allclose(v, evaluate(mdp, policy), atol=1e-8)
    with pytest.raises(LeaklabError, match="policy"):
        evaluate(mdp, policy[:4])


@pytest.mark.parametrize("horizon", [6, None])
def test_bounds_bracket_the_released_value(horizon):
    """Theorems 2.4/2.6: lower <= V-bar <= upper at every stage and state (P-bar lies in its own set)."""
    for seed in range(5):
        mdp = random_mdp(10, 4, horizon, _rng(seed), discount=1.0 if horizon else 0.9)
        for k in (3, 30, 3000):
            out = synthesize_private_policy(mdp, k, _rng(100 + seed))
            assert (out.lower <= out.values + 1e-9).all() and (out.values <= out.upper + 1e-9).all()
            assert out.cost_bound == pytest.approx(out.at_start(out.upper) - out.at_start(out.lower))
            assert out.cost_bound > 0


def test_bounds_widen_with_alpha():
    mdp = random_mdp(10, 3, 5, _rng(8))
    private = mdp.with_transitions(privatize_transitions(mdp.transitions, 50, _rng(9)))
    policy, _ = optimal_policy(private)
    widths = [robust_evaluation(private, policy, a, 0.05, "max")[0, 0] -
              robust_evaluation(private, policy, a, 0.05, "min")[0, 0] for a in (0.0, 0.05, 0.1, 0.3)]
    assert np.all(np.diff(widths) > 0)


def test_infinite_horizon_bounds_are_fixed_points():
    mdp = random_mdp(12, 3, None, _rng(10), discount=0.9)
    out = synthesize_private_policy(mdp, 40, _rng(11))
    p = out.private_mdp
    rows = np.arange(12)
    for values, sense in ((out.lower, "min"), (out.upper, "max")):
        again = p.rewards[rows, out.policy] + 0.9 * robust_expectation(p.transitions[rows, out.policy], values,
                                                                        out.alpha, 0.05, sense)
        assert np.abs(again - values).max() < 1e-9


def test_infinite_horizon_bounds_ignore_actions_the_policy_never_takes():
    """The fixed point is solved exactly: a huge reward on an unused action once inflated the stopping tolerance
    (1e-10 * max |R|) and stopped the iteration after one step, with a bound ten times too small."""
    mdp = random_mdp(20, 5, None, _rng(15), discount=0.9)
    out = synthesize_private_policy(mdp, 100, _rng(16))
    rewards = out.private_mdp.rewards.copy()
    unused = np.ones_like(rewards, dtype=bool)
    unused[np.arange(20), out.policy] = False
    rewards[unused] = -1e12
    loud = TabularMDP(out.private_mdp.transitions, rewards, None, 0.9)
    for sense, values in (("min", out.lower), ("max", out.upper)):
        assert np.allclose(robust_evaluation(loud, out.policy, out.alpha, 0.05, sense), values, atol=1e-9)
        v = values.copy()  # the plain iteration of L1 from far away lands on the same fixed point
        v[:] = 0
        p = out.private_mdp
        for _ in range(600):
            v = p.rewards[np.arange(20), out.policy] + 0.9 * robust_expectation(
                p.transitions[np.arange(20), out.policy], v, out.alpha, 0.05, sense)
        assert np.allclose(v, values, atol=1e-9)


def test_discount_near_one_is_solved_exactly():
    mdp = random_mdp(3, 2, None, _rng(17), discount=0.999999)
    out = synthesize_private_policy(mdp, 50, _rng(18))
    assert (out.lower <= out.values + 1e-6).all() and (out.values <= out.upper + 1e-6).all()
    assert np.isfinite(out.cost_bound)


def test_large_k_recovers_the_optimal_policy_and_is_reproducible():
    mdp = random_mdp(10, 4, 5, _rng(12))
    optimal = optimal_policy(mdp)[1][0, 0]
    out = synthesize_private_policy(mdp, 1e6, _rng(13))
    assert evaluate(mdp, out.policy)[0, 0] == pytest.approx(optimal, abs=1e-3)
    again = synthesize_private_policy(mdp, 1e6, _rng(13))
    assert np.array_equal(out.policy, again.policy) and out.cost_bound == again.cost_bound
    small = [synthesize_private_policy(mdp, k, _rng(14)).cost_bound for k in (2, 20, 200, 2000)]
    assert np.all(np.diff(small) < 0)  # the cost bound falls as k grows
    union = synthesize_private_policy(mdp, 20, _rng(14), union_bound=True)
    assert union.alpha > concentration_radius(20, 0.05) and union.cost_bound > small[1]


def test_investment_mdp_is_in_the_simplex_interior():
    mdp = investment_mdp()
    assert mdp.transitions.min() > 0 and mdp.n_states == 7 and mdp.n_actions == 4
    policy, values = optimal_policy(mdp)
    assert policy[0, 0] in range(4) and values[0, 0] > 0  # buying some startup is worth its price


def test_reproduce_policy_synthesis_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "ps"
    result = CliRunner().invoke(app, ["reproduce", "policy-synthesis", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "cost_of_privacy.png").stat().st_size > 0
    assert [r["example"] for r in data["rows"]] == [e for e in ("investment", "random", "random-infinite")
                                                    for _ in data["config"]["ks"]]
    for row in data["rows"]:
        assert row["lower_mean"] <= row["private_mean"] <= row["upper_mean"] and 0 <= row["bracketed"] <= 1
        assert len(data["runs"][f"{row['example']}/k={row['k']:g}"]) == data["config"]["runs"]
    assert all(t["lp_vs_closed_form_max_difference"] < 1e-9 for t in data["timing"])
    assert TabularMDP.from_json(data["mdps"]["random"]).n_states == data["config"]["states"]
    assert "cost bound" in result.output
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "policy-synthesis", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["rows"] == data["rows"]  # same seed, same numbers
    bad = CliRunner().invoke(app, ["reproduce", "policy-synthesis", "--quick", "--beta", "1", "--out",
                                   str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--beta" in bad.output and not (tmp_path / "x").exists()


def test_plan_private_on_a_users_mdp(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    mdp_file = tmp_path / "mdp.json"
    mdp = investment_mdp()
    mdp_file.write_text(json.dumps(mdp.to_json()))
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["plan", "private", "--mdp", str(mdp_file), "--k", "50", "--seed", "3", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["private"] is False and "not private" in result.output
    private = TabularMDP.from_json({**mdp.to_json(), "transitions": data["private_transitions"]})
    assert not np.allclose(private.transitions, mdp.transitions)  # the released transitions are the privatised ones
    assert np.allclose(evaluate(private, np.array(data["policy"])), data["values"])
    assert data["lower_value"] <= data["private_value"] <= data["upper_value"]
    assert data["cost_bound"] == pytest.approx(data["upper_value"] - data["lower_value"])
    assert "cost of privacy at most" in result.output
    union = CliRunner().invoke(app, ["plan", "private", "--mdp", str(mdp_file), "--k", "50", "--union-bound",
                                     "--seed", "3", "--out", str(tmp_path / "union")])
    assert union.exit_code == 0
    assert json.loads((tmp_path / "union" / "results.json").read_text())["cost_bound"] > data["cost_bound"]
    releases = []
    for name in ("a", "b"):  # no seed: the operating system's entropy, a different release each time
        assert CliRunner().invoke(app, ["plan", "private", "--mdp", str(mdp_file), "--k", "50", "--out",
                                        str(tmp_path / name)]).exit_code == 0
        released = json.loads((tmp_path / name / "results.json").read_text())
        assert released["private"] is True and released["seed"] is None
        releases.append(released["private_transitions"])
    assert releases[0] != releases[1]
    mdp_file.write_text(json.dumps({**mdp.to_json(), "start": 9}))
    bad = CliRunner().invoke(app, ["plan", "private", "--mdp", str(mdp_file), "--k", "50", "--out",
                                   str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "start state" in bad.output and not (tmp_path / "bad").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = CliRunner().invoke(app, ["reproduce", "policy-synthesis", "--quick", "--out", str(foreign)])
    assert refused.exit_code == 2 and (foreign / "notes.txt").read_text() == "mine"
