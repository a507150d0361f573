"""Seed 003, chapter 3's deep-RL membership inference: querying a policy on floor maps, the binary attack, and
``leaklab reproduce rl-membership``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from leaklab.attacks.membership import AttackTraining, feature_attack
from leaklab.attacks.policy_membership import labelling, query_policy
from leaklab.errors import LeaklabError
from leaklab.experiments.rl_membership import RlMembershipConfig, _map_sets
from leaklab.rl.agents.ppo import build_policy
from leaklab.rl.envs.multi_room import ACTIONS, floor_map


class _Labelled(nn.Module):
    """A stand-in policy that plays the first of given actions, then always 'left' (turns in place)."""

    recurrent = False

    def __init__(self, script: list[int]):
        super().__init__()
        self.script, self.t = script, 0

    def initial_memory(self, n):
        return None

    def forward(self, obs, memory=None):
        a = self.script[self.t] if self.t < len(self.script) else 0
        self.t += 1
        logits = torch.full((len(obs), len(ACTIONS)), -30.0)
        logits[:, a] = 30.0
        return logits, torch.zeros(len(obs)), None


def test_queries_pair_each_answer_with_the_labelling_agents_policy_and_stop_at_the_goal():
    m = floor_map(2, rooms=1)
    labels = labelling([m])
    state = (*m.start, m.direction, ())
    # follow the labels from the start: a scripted shortest path
    from leaklab.rl.envs.multi_room import RoomBatch

    batch, script = RoomBatch([m]), []
    while True:
        s = batch.state(0)
        if s not in labels[0]:
            break
        script.append(labels[0][s][0])
        _, reached, _ = batch.step(np.array([script[-1]]))
        if reached[0]:
            break
    q = query_policy(_Labelled(script), [m], labels, steps=len(script) + 3, generator=torch.Generator())
    rows = q.features.reshape(len(script) + 3, 2, len(ACTIONS))
    assert q.steps_to_goal[0] == len(script) and q.returns[0] == pytest.approx(1 - 0.9 * len(script) / 200)
    assert torch.allclose(rows[:len(script), 0].sum(1), torch.ones(len(script)))
    assert torch.allclose(rows[:len(script), 1].sum(1), torch.ones(len(script)))
    for t, a in enumerate(script):  # the scripted action is optimal and the policy said so
        assert rows[t, 1, a] > 0 and rows[t, 0, a] > 0.99
    assert (rows[len(script):] == 0).all()  # after the goal: zeros
    assert labels[0][state]
    with pytest.raises(LeaklabError):
        query_policy(_Labelled(script), [m], labels, steps=0, generator=torch.Generator())


def test_recurrent_queries_are_reproducible():
    maps = [floor_map(s, rooms=2) for s in range(3)]
    labels = labelling(maps)
    policy = build_policy("rnn", 0)
    a = query_policy(policy, maps, labels, 10, torch.Generator().manual_seed(1))
    b = query_policy(policy, maps, labels, 10, torch.Generator().manual_seed(1))
    assert torch.equal(a.features, b.features) and (a.steps_to_goal == b.steps_to_goal).all()
    assert a.features.shape == (3, 10 * 2 * len(ACTIONS))


def test_feature_attack_tells_separable_sets_apart_and_not_identical_ones():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    training = AttackTraining(epochs=20)
    assert feature_attack(x[:100] + 3, x[100:200], x[200:300] + 3, x[300:], training) > 0.95
    same = feature_attack(x[:100], x[100:200], x[200:300], x[300:], training)
    assert 0.35 < same < 0.65
    with pytest.raises(LeaklabError, match="columns"):
        feature_attack(x[:10], x[10:20, :5], x[20:30], x[30:40], training)
    with pytest.raises(LeaklabError, match="finite"):
        feature_attack(x[:10] * float("nan"), x[10:20], x[20:30], x[30:40], training)


def test_map_sets_are_disjoint_and_move_with_the_seed():
    config = RlMembershipConfig(maps=5, victims=2, shadows=3)
    sets = _map_sets(config)
    assert list(sets) == ["victim0", "victim1", "shadow0", "shadow1", "shadow2"]
    seeds = [s for pair in sets.values() for side in pair for s in side]
    assert len(seeds) == len(set(seeds)) == 5 * 2 * 5
    other = [s for pair in _map_sets(config.model_copy(update={"seed": 1})).values() for side in pair for s in side]
    assert not set(seeds) & set(other)


def test_reproduce_rl_membership_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "rlm"
    result = CliRunner().invoke(app, ["reproduce", "rl-membership", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "rl_membership.png").stat().st_size > 0
    config = RlMembershipConfig.quick()
    assert list(data["rows"]) == ["ffnn", "rnn"]
    for rows in data["rows"].values():
        assert [r["share"] for r in rows] == config.checkpoints
        assert [r["frames"] for r in rows] == sorted(r["frames"] for r in rows)
        assert all(0 <= r["attack_accuracy"] <= 1 for r in rows)
        for r in rows:
            assert r["generalization_gap"] == pytest.approx(r["members"]["return"] - r["non_members"]["return"])
            assert r["maps_scored"] == 2 * config.maps * config.victims
            assert r["attack_accuracy_se"] == pytest.approx(
                (r["attack_accuracy"] * (1 - r["attack_accuracy"]) / r["maps_scored"]) ** 0.5)
    counts = data["parameters"]
    assert abs(counts["ffnn"] - counts["rnn"]) < 0.02 * counts["ffnn"]  # the thesis' controlled factor
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "rl-membership", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["rows"] == data["rows"]
    clipped = tmp_path / "clipped"
    assert CliRunner().invoke(app, ["reproduce", "rl-membership", "--quick", "--clip", "0.01", "--out",
                                    str(clipped)]).exit_code == 0
    other = json.loads((clipped / "results.json").read_text())
    assert other["config"]["clip"] == 0.01 and data["config"]["clip"] == 0.2
    assert other["training"] != data["training"]  # PPO trained with the other clip
    sgd = tmp_path / "sgd"
    assert CliRunner().invoke(app, ["reproduce", "rl-membership", "--quick", "--optimizer", "SGD", "--lr", "0.05",
                                    "--out", str(sgd)]).exit_code == 0
    plain = json.loads((sgd / "results.json").read_text())
    assert (plain["config"]["optimizer"], plain["config"]["lr"]) == ("sgd", 0.05)
    assert (data["config"]["optimizer"], data["config"]["lr"]) == ("adam", 1e-3)
    assert plain["training"] != data["training"]  # PPO trained by plain SGD
    for field, bad in (("checkpoints", [0.0]), ("checkpoints", [1.5]), ("checkpoints", [0.5, 0.5]), ("maps", 1),
                       ("clip", 0.0), ("frames", 1)):  # 1 frame: every checkpoint on PPO's first update
        with pytest.raises(ValueError):
            RlMembershipConfig(**{field: bad})
    for flag, bad in (("--dp-noise", "0,1"), ("--sigmas", "0.1,0.1"), ("--sampler-pairs", "1"),
                      ("--optimizer", "rmsprop"), ("--lr", "0")):
        refused = CliRunner().invoke(app, ["reproduce", "rl-membership", "--quick", flag, bad, "--out",
                                           str(tmp_path / "refused")])
        assert refused.exit_code == 2 and f"invalid {flag}" in refused.output and not (tmp_path / "refused").exists()


def test_the_defenses_of_fig_3_8_on_the_rl_task(tmp_path):
    from leaklab.experiments.rl_membership import run
    from leaklab.privacy.dpsgd import DPConfig
    from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
    from leaklab.privacy.sensitivity import random_dp_confidence
    from leaklab.rl.agents.ppo import PPOConfig, ppo_epsilon

    config = RlMembershipConfig.quick().model_copy(update={"dp_noise": [1.0], "sigmas": [0.01, 0.1],
                                                           "sampler_pairs": 2, "checkpoints": [1.0]})
    data = run(tmp_path / "defended", RlMembershipConfig.model_validate(config.model_dump()))
    assert all((tmp_path / "defended" / name).stat().st_size > 0 for name in ("rl_dp_sgd.png", "rl_gpm.png"))
    unprotected = {arch.upper(): rows[-1]["non_members"]["return"] for arch, rows in data["rows"].items()}
    epsilon = ppo_epsilon(PPOConfig(privacy=DPConfig(noise_multiplier=1.0)))
    assert [(r["arch"], r["noise_multiplier"]) for r in data["dp_sgd"]] == [("FFNN", 1.0), ("RNN", 1.0)]
    for r in data["dp_sgd"] + data["gpm"]:
        assert r["maps_scored"] == 2 * config.maps * config.victims and 0 <= r["attack_accuracy"] <= 1
        expected = 1 - r["non_members"]["return"] / unprotected[r["arch"]] if unprotected[r["arch"]] > 0 else None
        assert r["utility_loss"] == pytest.approx(expected)
    assert all(r["epsilon"] == pytest.approx(epsilon) for r in data["dp_sgd"])
    for arch, s in data["sampler"].items():
        assert len(s["samples"]) == 2 and s["sensitivity"] == max(s["samples"]) > 0
        assert s["gamma"] == pytest.approx(random_dp_confidence(2)[1])
    assert [(r["arch"], r["sigma"]) for r in data["gpm"]] == [("FFNN", 0.01), ("RNN", 0.01), ("FFNN", 0.1),
                                                              ("RNN", 0.1)]
    for r in data["gpm"]:
        sensitivity = data["sampler"][r["arch"]]["sensitivity"]
        assert r["epsilon"] == pytest.approx(analytic_gaussian_epsilon(r["sigma"], data["delta"], sensitivity))
    for field, bad in (("dp_noise", [0.0]), ("sigmas", [0.1, 0.1]), ("sampler_pairs", 1)):
        with pytest.raises(ValueError):
            RlMembershipConfig(**{field: bad})
    with pytest.raises(ValueError, match="fully trained"):
        RlMembershipConfig(checkpoints=[0.5], sigmas=[0.1])
