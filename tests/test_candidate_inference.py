"""Pan et al.'s candidate inference by shadow policies (seed 002, section 5.3.1) and
``leaklab reproduce candidate-inference``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from leaklab.attacks.candidate_inference import (answer_features, candidate_maps, fitness_choice, infer_candidates,
                                                 observed_codes)
from leaklab.attacks.membership import AttackTraining
from leaklab.cli import app
from leaklab.errors import LeaklabError
from leaklab.rl.envs.grid_world import ACTIONS, distances, observation_codes, optimal_actions, random_map, violations


def _truth(seed: int = 0):
    return random_map(7, 7, np.random.default_rng(seed), reactive=True)


def test_candidates_keep_the_truth_start_goal_and_constraints():
    truth = _truth()
    candidates, where = candidate_maps(truth, 5, np.random.default_rng(1))
    assert len(candidates) == 5 and candidates[where] is truth
    for c in candidates:
        assert c.shape == truth.shape and (c.start, c.goal) == (truth.start, truth.goal)
        assert violations(c.free, c.start, c.goal) == []
    assert len({c.free.tobytes() for c in candidates}) == 5
    with pytest.raises(LeaklabError, match="at least 2"):
        candidate_maps(truth, 1, np.random.default_rng(1))


def test_features_are_the_answers_at_every_candidates_observations():
    candidates, _ = candidate_maps(_truth(), 3, np.random.default_rng(2))
    codes = observed_codes(candidates)
    for c in candidates:
        assert set(observation_codes(c.free, np.argwhere(c.free)).tolist()) <= set(codes.tolist())
    table = np.random.default_rng(0).dirichlet(np.ones(len(ACTIONS)), 256)
    features = answer_features(table, codes)
    assert features.shape == (len(codes) * len(ACTIONS),)
    assert torch.allclose(features.reshape(len(codes), -1), torch.from_numpy(table[codes]).float())
    with pytest.raises(LeaklabError, match="8 neighbours"):
        answer_features(np.zeros((7, 7, 256, len(ACTIONS))), codes)


def test_the_classifier_names_the_candidate_of_separable_policies_and_checks_its_input():
    g = torch.Generator().manual_seed(0)
    centres = 3 * torch.randn(3, 10, generator=g)
    labels = torch.arange(3).repeat_interleave(6)
    shadows = centres[labels] + torch.randn(18, 10, generator=g)
    targets = centres + torch.randn(3, 10, generator=g)
    training = AttackTraining(epochs=100, batch_size=8)
    assert infer_candidates(shadows, labels, targets, 3, training).tolist() == [0, 1, 2]
    assert infer_candidates(shadows.double(), labels, targets.double(), 3, training).tolist() == [0, 1, 2]
    for bad_labels in (labels.float(), labels + 1, labels[:-1], labels[:, None]):
        with pytest.raises(LeaklabError):
            infer_candidates(shadows, bad_labels, targets, 3)
    with pytest.raises(LeaklabError, match="finite"):
        infer_candidates(shadows * float("nan"), labels, targets, 3)
    with pytest.raises(LeaklabError):
        infer_candidates(shadows, labels, targets[:, :5], 3)


def test_the_fitness_picks_the_map_whose_optimal_policy_the_target_follows():
    candidates, where = candidate_maps(_truth(3), 4, np.random.default_rng(4))
    truth = candidates[where]
    best = optimal_actions(distances(truth.free, truth.goal))
    cells = np.argwhere(best.any(axis=2))
    table = np.full((256, len(ACTIONS)), 1 / len(ACTIONS))
    for code, (r, c) in zip(observation_codes(truth.free, cells), cells):  # the truth's optimal policy
        table[code] = best[r, c] / best[r, c].sum()
    assert fitness_choice(table, candidates) == where


def test_reproduce_candidate_inference_quick(tmp_path):
    out = tmp_path / "ci"
    result = CliRunner().invoke(app, ["reproduce", "candidate-inference", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "candidate_inference.png").stat().st_size > 0
    config = data["config"]
    assert [r["defense"] for r in data["rows"]] == ["none", "0.1"]
    for r in data["rows"]:
        cells = data["targets"][r["defense"]]
        assert r["targets"] == len(cells) == config["trials"] * config["candidates"]
        assert sorted(c["candidate"] for c in cells) == list(range(config["candidates"]))
        assert r["accuracy"] == pytest.approx(np.mean([c["classifier"] == c["candidate"] for c in cells]))
        assert r["fitness_accuracy"] == pytest.approx(np.mean([c["fitness"] == c["candidate"] for c in cells]))
        assert r["chance"] == 1 / config["candidates"] and 0 <= r["goal_rate"] <= 1
    trial = data["trials"][0]
    assert len(trial["candidates"]) == config["candidates"] and 0 <= trial["truth"] < config["candidates"]
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "candidate-inference", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["targets"] == data["targets"]
    for flag, bad in (("--candidates", "1"), ("--trials", "0"), ("--episodes", "0")):
        refused = CliRunner().invoke(app, ["reproduce", "candidate-inference", "--quick", flag, bad, "--out",
                                           str(tmp_path / "refused")])
        assert refused.exit_code == 2 and f"invalid {flag}" in refused.output and not (tmp_path / "refused").exists()


def test_candidates_are_distinct_or_refused():
    from leaklab.rl.envs.grid_world import GridMap, open_plan

    truth = random_map(6, 6, np.random.default_rng(0), reactive=True)  # the quick run's size
    for seed in range(30):
        candidates, _ = candidate_maps(truth, 4, np.random.default_rng(seed))
        assert len({c.free.tobytes() for c in candidates}) == 4
    small = GridMap(open_plan(4, 4), (1, 1), (2, 2))  # 4x4 has 4 interior cells: only a few maps exist
    with pytest.raises(LeaklabError, match="distinct"):
        candidate_maps(small, 6, np.random.default_rng(0), tries=50)


def test_the_reproduction_refuses_agents_that_see_their_position_and_stray_seeds():
    from leaklab.experiments.candidate_inference import CandidateInferenceConfig
    from leaklab.rl.agents.grid_dqn import GridDQNConfig

    with pytest.raises(ValueError, match="position"):
        CandidateInferenceConfig(training=GridDQNConfig(position=True))
    with pytest.raises(ValueError, match="derives from seed"):
        CandidateInferenceConfig(attack=AttackTraining(seed=3))
