"""Seed 002, chapter 3: the cloud-server scenario, Algorithms 3-5 (learning with normalisation, differentially
private advising) and ``leaklab reproduce dp-advising``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from leaklab.errors import LeaklabError
from leaklab.rl.agents.advising import (AdvisingConfig, convergence_ratio, learn, normalize, simulate,
                                        teacher_view)
from leaklab.rl.envs.cloud_tasks import CloudScenario, differ_by_at_most_one, layout


def test_normalize_is_algorithm_4():
    p = np.array([-0.5, 0.3, 1.2])
    rho = (0.5 - 0.001) / (0.5 + 0.5)
    squashed = 0.5 - rho * (0.5 - p)
    assert squashed.min() == pytest.approx(0.001)
    assert np.allclose(normalize(p), squashed / squashed.sum())
    q = np.array([0.2, 0.3, 0.1])  # smallest entry above Delta: only divided by the sum
    assert np.allclose(normalize(q), q / q.sum())
    batch = normalize(np.array([[-3.0, 0.0, 5.0], [0.25, 0.25, 0.5]]))
    assert np.allclose(batch.sum(axis=1), 1) and (batch > 0).all()
    assert np.all(np.diff(batch[0]) > 0)  # the order of the entries is kept


def test_learn_converges_as_lemma_3_1():
    q, pi = np.zeros(3), np.full(3, 1 / 3)
    for t in range(1, 30):
        learn(q, pi, 1, 2.0, 0.1, 0.05)
        assert q[1] == pytest.approx((0 - 2.0) * 0.9 ** t + 2.0)  # q_t = (q_0 - r)(1 - alpha)^t + r
    assert pi.sum() == pytest.approx(1) and pi.argmax() == 1 and q[0] == q[2] == 0


def test_teacher_view_covers_the_four_cases():
    q, pi = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.1, 0.2, 0.3, 0.4])
    view = teacher_view((0, 1, 2, 3), q, pi, (0, 1, 2, 3))  # identical
    assert np.array_equal(view[0], q) and np.array_equal(view[1], pi)
    view = teacher_view((0, 1, 2, 3), q, pi, (0, 1, 2))  # the teacher has one server more: only shared ones
    assert np.array_equal(view[0], [1, 2, 3])
    view = teacher_view((0, 1, 2), q[:3], pi[:3], (0, 1, 2, 5))  # the teacher lacks server 5: Q = pi = 0
    assert np.array_equal(view[0], [1, 2, 3, 0]) and view[1][3] == 0
    view = teacher_view((0, 1, 2, 7), q, pi, (0, 1, 2, 5))  # one different: the teacher's 7 stands for 5
    assert np.array_equal(view[0], q) and np.array_equal(view[1], pi)


def test_layouts_and_neighbours():
    assert differ_by_at_most_one((0, 1, 2, 3), (0, 1, 2, 4)) and differ_by_at_most_one((0, 1, 2), (0, 1, 2, 3))
    assert not differ_by_at_most_one((0, 1, 2), (0, 1, 2, 3, 4))
    assert not differ_by_at_most_one((0, 1, 2, 3), (0, 1, 4, 5))
    scenario = CloudScenario.make("mixed", np.random.default_rng(0))
    identical, near = scenario.neighbours(True), scenario.neighbours(False)
    for j, sets in enumerate(scenario.action_sets):
        assert all(scenario.action_sets[i] == sets for i in identical[j]) and set(identical[j]) <= set(near[j])
    sizes = {len(s) for s in scenario.action_sets}
    assert sizes == {3, 4, 5}  # a teacher with one server more, one fewer, and as many
    assert len(set(layout("one-different"))) == 9 and {s for t in layout("one-different") for s in t} == set(range(12))
    assert (scenario.rewards.max(axis=1) == 2).all() and (scenario.rewards.argmax(axis=1) < 3).all()
    with pytest.raises(LeaklabError, match="layout"):
        layout("random")


def test_convergence_ratio():
    scenario = CloudScenario.make("identical", np.random.default_rng(1))
    uniform = [np.full((scenario.n_tasks, 4), 0.25) for _ in range(scenario.n_users)]
    assert convergence_ratio(scenario, uniform) == pytest.approx(0.25)
    best = [np.eye(4)[scenario.rewards[:, :4].argmax(axis=1)] for _ in range(scenario.n_users)]
    assert convergence_ratio(scenario, best) == pytest.approx(1.0)


def test_simulate_keeps_budgets_and_is_reproducible():
    scenario = CloudScenario.make("mixed", np.random.default_rng(2))
    config = AdvisingConfig(strategy="dp", epochs=60, budget=5)
    first = simulate(scenario, config, np.random.default_rng(3))
    again = simulate(scenario, config, np.random.default_rng(3))
    assert np.array_equal(first.ratio, again.ratio) and len(first.ratio) == 61
    assert 0 < first.advice.sum() <= 5 * scenario.n_users and first.optimal_advice.sum() <= first.advice.sum()
    alone = simulate(scenario, config.model_copy(update={"strategy": "none"}), np.random.default_rng(3))
    assert alone.advice.sum() == 0
    traditional = simulate(scenario, config.model_copy(update={"strategy": "traditional"}), np.random.default_rng(3))
    assert traditional.advice.sum() <= 5 * 4  # only the four agents with identical sets can give advice


def test_little_noise_advises_well_and_much_noise_advises_at_random():
    """With eps large the noisy distance is the true one and advice waits for a real gap (58% of it optimal here:
    the distance is symmetric, so an ignorant teacher also advises a student that knows); at eps = 0.1 the noise
    alone passes the threshold, every budget is spent, and the advised server is a random one (1 in 4)."""
    shares = {}
    for eps in (1000.0, 0.1):
        advice = optimal = 0
        for seed in range(4):
            scenario = CloudScenario.make("one-different", np.random.default_rng(seed))
            run = simulate(scenario, AdvisingConfig(strategy="dp", epsilon=eps, epochs=150),
                           np.random.default_rng(10 + seed))
            advice, optimal = advice + run.advice.sum(), optimal + run.optimal_advice.sum()
        shares[eps] = optimal / advice
    assert shares[1000.0] > 0.45 and shares[0.1] < 0.32


def test_reproduce_dp_advising_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "adv"
    result = CliRunner().invoke(app, ["reproduce", "dp-advising", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "advising_curves.png").stat().st_size > 0
    assert list(data["experiments"]) == ["experiment_1", "experiment_2", "experiment_3"]
    epochs = data["config"]["epochs"]
    for rows in data["experiments"].values():
        assert rows["no advice"]["advice_total"] == 0
        for row in rows.values():
            assert len(row["ratio_mean"]) == epochs + 1 and len(row["advice_per_epoch"]) == epochs
    assert "points over no advice" in result.output
    for rows in data["experiments"].values():  # a plateau never reached is said so, not printed as None
        epoch = rows["no advice"]["epoch_reaching_plateau"]
        assert ("92% never reached" if epoch is None else f"92% first reached at epoch {epoch}") in result.output
    assert "None" not in result.output
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "dp-advising", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["experiments"] == data["experiments"]
    bad = CliRunner().invoke(app, ["reproduce", "dp-advising", "--quick", "--runs", "0", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--runs" in bad.output and not (tmp_path / "x").exists()
