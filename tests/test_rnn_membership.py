"""Seed 003, chapter 3: the sensitivity bound and sampler (Theorem 3.2, Algorithm 3, Theorem 3.3), the Gaussian
privacy module (Algorithm 2), Shokri et al.'s shadow-model attack, the RNN classifier, and ``leaklab reproduce
rnn-membership``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from leaklab.attacks.membership import AttackTraining, shadow_models
from leaklab.defenses.gpm import gaussian_privacy_module, utility_loss
from leaklab.errors import LeaklabError
from leaklab.models.vision import MLP, RowLSTM
from leaklab.privacy.sensitivity import (flat_parameters, random_dp_confidence, sensitivity_sampler,
                                         smoothed_sgd_sensitivity_bound)


def test_random_dp_confidence_is_theorem_3_3():
    rho, gamma = random_dp_confidence(500)
    assert rho == pytest.approx(0.007109, abs=1e-6) and gamma == pytest.approx(0.0774, abs=1e-4)  # "gamma < 0.08"
    assert 0 < rho < 1 and random_dp_confidence(5000)[1] < gamma  # more samples, more confidence
    with pytest.raises(LeaklabError):
        random_dp_confidence(0)


def test_smoothed_sgd_bound_is_theorem_3_2():
    assert smoothed_sgd_sensitivity_bound(0.1, 2.0, 3, 11, 1.0) == pytest.approx(2 * (1.2 ** 3 - 1) / (10 * 2.0))
    # the recursion of eq. 3.20 from d_0 = 0 stays below the closed form
    d = 0.0
    for _ in range(50):
        d = 2 * 0.1 * 1.0 / 11 + (1 + 0.1 * (1 - 1 / 11) * 2.0) * d
    assert d <= smoothed_sgd_sensitivity_bound(0.1, 2.0, 50, 11, 1.0)
    assert smoothed_sgd_sensitivity_bound(1.0, 1e3, 10 ** 6, 32, 1.0) == math.inf
    with pytest.raises(LeaklabError):
        smoothed_sgd_sensitivity_bound(0.1, 2.0, 3, 1, 1.0)


def test_sensitivity_sampler_replaces_the_nth_record():
    """A_H = the mean of the records: neighbouring datasets differ by (x_{N+1} - x_N) / N, known exactly."""
    values = torch.arange(100, dtype=torch.float64) ** 1.5
    seen = []

    def train(records):
        seen.append(list(records))
        model = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(float(values[list(records)].mean()))
        return model

    draws = {0: [3, 9, 4, 20], 1: [50, 7, 8, 99]}
    estimate = sensitivity_sampler(train, lambda count, i: draws[i][:count], n=2, size=3)
    assert seen == [[3, 9, 4], [3, 9, 20], [50, 7, 8], [50, 7, 99]]
    expected = [float(abs(values[20] - values[4]) / 3), float(abs(values[99] - values[8]) / 3)]
    assert estimate.samples == pytest.approx(expected, rel=1e-6) and estimate.sensitivity == max(estimate.samples)
    assert estimate.gamma == pytest.approx(random_dp_confidence(2)[1])
    with pytest.raises(LeaklabError, match="N \\+ 1"):
        sensitivity_sampler(train, lambda count, i: [1, 2], n=1, size=3)


def test_gaussian_privacy_module_perturbs_a_copy_once():
    model = MLP(10, 1, 8, (0.5,), (0.25,), width=16, depth=1)
    before = flat_parameters(model).clone()
    noisy = gaussian_privacy_module(model, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(flat_parameters(model), before)  # the trained network is left as it was
    noise = flat_parameters(noisy) - before
    assert noise.std().item() == pytest.approx(0.3, rel=0.1) and abs(noise.mean().item()) < 0.03
    again = gaussian_privacy_module(model, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(flat_parameters(again), flat_parameters(noisy))
    assert torch.equal(flat_parameters(gaussian_privacy_module(model, 0.0, torch.Generator())), before)
    assert utility_loss(0.9, 1.0) == pytest.approx(0.1)
    with pytest.raises(LeaklabError):
        gaussian_privacy_module(model, -1.0, torch.Generator())


def test_row_lstm_reads_rows_as_a_sequence():
    net = RowLSTM(10, 1, 16, (0.5,), (0.25,), hidden=64)
    assert sum(p.numel() for p in net.parameters()) == 21_642
    assert sum(p.numel() for p in MLP(10, 1, 16, (0.5,), (0.25,), width=64, depth=2).parameters()) == 21_258
    x = torch.rand(2, 1, 16, 16)
    flipped = x.flip(2)  # the order of the rows matters to a recurrent network
    assert net(x).shape == (2, 10) and not torch.allclose(net(x), net(flipped))


def test_shadow_models_attack_separates_confident_members():
    g = torch.Generator().manual_seed(0)

    def answers(n, confident):
        labels = torch.randint(0, 4, (n,), generator=g)
        logits = torch.randn(n, 4, generator=g)
        logits[torch.arange(n), labels] += 6.0 if confident else 0.5
        return torch.softmax(logits, 1), labels

    accuracy = shadow_models(answers(200, True), answers(200, False), answers(100, True), answers(100, False),
                             AttackTraining(epochs=30))
    assert accuracy > 0.9
    same = shadow_models(answers(200, True), answers(200, True), answers(100, True), answers(100, True),
                         AttackTraining(epochs=30))
    assert 0.35 < same < 0.65  # nothing to tell apart: a guess
    with pytest.raises(LeaklabError, match="pair"):
        shadow_models(answers(10, True)[0], answers(10, False), answers(10, True), answers(10, False))


def test_reproduce_rnn_membership_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "rnn"
    result = CliRunner().invoke(app, ["reproduce", "rnn-membership", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    for name in ("membership_vs_epochs.png", "memorisation.png", "regularisation.png", "dp_sgd_tradeoff.png",
                 "gpm_tradeoff.png"):
        assert (out / name).stat().st_size > 0
    config = data["config"]
    assert [(r["arch"], r["epochs"]) for r in data["vulnerability"]] == [
        (a, e) for a in ("FFNN", "RNN") for e in config["epochs"]]
    assert [(r["arch"], r["chunk"], r["epochs_after"]) for r in data["memorisation"]] == [
        (a, k + 1, config["memory_epochs"] * (config["memory_chunks"] - 1 - k)) for a in ("FFNN", "RNN")
        for k in range(config["memory_chunks"])]
    chunks = config["memory_chunks"]
    for curves in data["memorisation_curves"].values():  # after each chunk: every chunk's accuracy, the tests'
        assert [len(a) for a in curves["chunk_accuracy"]] == [chunks] * chunks
        assert len(curves["test_accuracy"]) == chunks
        assert all(0 <= a <= 1 for row in curves["chunk_accuracy"] for a in row)
    for r in data["memorisation"]:  # after the last chunk: the victim the attack was scored on
        assert data["memorisation_curves"][r["arch"]]["chunk_accuracy"][-1][r["chunk"] - 1] == pytest.approx(
            r["train_accuracy"])
        assert len(r["attack_accuracy_runs"]) == config["memory_runs"] == 2
        assert r["attack_accuracy"] == pytest.approx(sum(r["attack_accuracy_runs"]) / 2)
    assert [(r["arch"], r["penalised"], r["penalty"]) for r in data["regularisation"]] == [
        (a, k, p) for k in ("activations", "weights") for p in config["penalties"] for a in ("FFNN", "RNN")]
    dp = data["dp_sgd"]
    assert [(r["arch"], r["noise_multiplier"]) for r in dp] == [(a, n) for n in config["dp_noise"] for a in ("FFNN",
                                                                                                            "RNN")]
    from leaklab.privacy.dpsgd import spent_epsilon

    batches = -(-config["members"] // config["batch_size"])
    for r in dp:  # both networks spend the same (eps, delta), the accountant's for the schedule
        assert (r["sample_rate"], r["steps"]) == (1 / batches, config["epochs"][-1] * batches)
        assert r["epsilon"] == pytest.approx(spent_epsilon(1 / batches, r["noise_multiplier"], r["steps"],
                                                           config["delta"])) and r["epsilon"] > 0
    for rows in (data["memorisation"], data["regularisation"], dp):
        assert all(0 <= r["attack_accuracy"] <= 1 for r in rows)
    for arch, s in data["sampler"].items():
        assert len(s["samples"]) == config["sampler_pairs"] and s["sensitivity"] == max(s["samples"]) > 0
    assert len(data["defense"]) == 2 * len(config["sigmas"])
    assert all(0 <= r["attack_accuracy"] <= 1 and r["epsilon"] > 0 for r in data["defense"])
    assert "empirical sensitivity" in result.output
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "rnn-membership", "--quick", "--out", str(again)]).exit_code == 0
    second = json.loads((again / "results.json").read_text())
    for key in ("vulnerability", "memorisation", "memorisation_curves", "regularisation", "dp_sgd", "sampler",
                "defense"):
        assert second[key] == data[key], key
    bad = CliRunner().invoke(app, ["reproduce", "rnn-membership", "--quick", "--pairs", "0", "--out",
                                   str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--pairs" in bad.output and not (tmp_path / "x").exists()


def test_config_seeds_the_attack_and_refuses_one_pair():
    from leaklab.experiments.rnn_membership import RnnMembershipConfig

    assert RnnMembershipConfig(seed=7).attack.seed == 7 and RnnMembershipConfig.quick(7).attack.seed == 7
    assert RnnMembershipConfig(seed=7, attack=AttackTraining(seed=3)).attack.seed == 3
    with pytest.raises(ValueError):
        RnnMembershipConfig(sampler_pairs=1)
    with pytest.raises(ValueError, match="memory_chunks"):
        RnnMembershipConfig(members=10, memory_chunks=11)
    for field in ("penalties", "dp_noise"):
        with pytest.raises(ValueError, match="distinct and positive"):
            RnnMembershipConfig(**{field: [0.0, 1.0]})
    with pytest.raises(ValueError, match="distinct"):
        RnnMembershipConfig(penalised=["weights", "weights"])
    assert random_dp_confidence(1)[1] > 1  # one pair: no guarantee
    with pytest.raises(LeaklabError):
        smoothed_sgd_sensitivity_bound(math.inf, 1.0, 0, 2, 1.0)


def test_out_under_a_file_is_refused_before_the_work(tmp_path):
    from leaklab.io import check_out

    (tmp_path / "afile").write_text("x")
    with pytest.raises(LeaklabError, match="cannot create the folder .*afile is a file"):
        check_out(tmp_path / "afile" / "sub" / "out", "leaklab.rnn-membership")
    assert check_out(tmp_path / "new" / "out", "leaklab.rnn-membership") == tmp_path / "new" / "out"


def _training_setup():
    from leaklab.data import load_images
    from leaklab.experiments.rnn_membership import RnnMembershipConfig

    config = RnnMembershipConfig(dataset="digits", image_size=8, members=40, batch_size=16, epochs=[1, 3],
                                 memory_epochs=2)
    return config, load_images("digits", 80, 8, seed=1)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_training_snapshots_and_chunks_match_separate_runs():
    from leaklab.experiments.rnn_training import train, train_in_turn

    config, data = _training_setup()
    members = list(range(40))
    for arch in ("FFNN", "RNN"):
        kept = train(arch, data, members, config, 5, [1, 3])
        assert torch.equal(_flat(kept[3]), _flat(train(arch, data, members, config, 5, [3])[3]))
        assert not torch.equal(_flat(kept[1]), _flat(kept[3]))
        # one chunk trained for memory_epochs epochs is the ordinary training of that length
        once = train_in_turn(arch, data, [members], config, 5)
        assert torch.equal(_flat(once), _flat(train(arch, data, members, config, 5, [2])[2]))
        halves = [members[:20], members[20:]]
        assert not torch.equal(_flat(train_in_turn(arch, data, halves, config, 5)),
                               _flat(train_in_turn(arch, data, halves[::-1], config, 5)))  # the order matters


def test_l2_penalties_shrink_what_they_penalise():
    from leaklab.experiments.rnn_training import hidden_activations, train

    config, data = _training_setup()
    for arch, widths in (("FFNN", [(8, 64), (8, 64)]), ("RNN", [(8, 8, 64)])):
        activations, weights = [], []
        for penalty, penalised in ((0.0, "activations"), (1.0, "activations"), (1.0, "weights")):
            model = train(arch, data, list(range(40)), config, 5, [30], penalty, penalised)[30]
            with hidden_activations(model) as seen, torch.no_grad():
                model(data.images[:8])
            assert [tuple(a.shape) for a in seen] == widths  # ReLU outputs; the LSTM's state at every row
            activations.append(sum(float(a.square().sum()) for a in seen))
            weights.append(sum(float(p.detach().square().sum()) for p in model.parameters() if p.dim() >= 2))
        assert activations[1] < 0.5 * activations[0] and weights[2] < 0.5 * weights[0]
        assert not model._forward_hooks and not any(m._forward_hooks for m in model.modules())  # hooks removed


def test_private_training_follows_its_schedule():
    from leaklab.experiments.rnn_training import build, private_schedule, train_private

    config, data = _training_setup()
    config = config.model_copy(update={"dp_clip": 0.5})
    assert private_schedule(40, config) == (1 / 3, 9)  # 3 epochs of ceil(40 / 16) batches, Poisson rate 1/3
    state = torch.random.get_rng_state()
    for arch in ("FFNN", "RNN"):
        model = train_private(arch, data, list(range(40)), config, 5, 1.0)
        again = train_private(arch, data, list(range(40)), config, 5, 1.0)
        assert torch.equal(_flat(model), _flat(again))  # the same seed, the same noise and batches
        assert not torch.equal(_flat(model), _flat(build(arch, data, 5)))  # it trained
        assert model(data.images[:4]).shape == (4, 10)
        assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in build(arch, data, 5).parameters())
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator untouched


def test_noise_too_small_to_account_is_refused_before_the_work():
    from leaklab.experiments.rnn_membership import RnnMembershipConfig

    with pytest.raises(ValueError, match="noise multipliers below"):
        RnnMembershipConfig(dp_noise=[0.1, 1.0])


def test_a_defense_plot_names_an_undefined_utility_loss_in_its_legend(tmp_path, monkeypatch):
    """A network whose utility loss is undefined (its unprotected victims earned nothing) was an empty legend
    entry beside a line of nothing; the legend now says so."""
    from matplotlib.axes import Axes

    from leaklab.experiments import rnn_figures

    legends = []
    original = Axes.legend

    def recorded(ax, *args, **kwargs):
        legend = original(ax, *args, **kwargs)
        legends.append([t.get_text() for t in legend.get_texts()])
        return legend

    monkeypatch.setattr(Axes, "legend", recorded)
    rows = [{"arch": arch, "epsilon": eps, "utility_loss": None if arch == "FFNN" else 0.1 * eps,
             "attack_accuracy": 0.5} for arch in ("FFNN", "RNN") for eps in (1.0, 4.0)]
    rnn_figures.plot_dp_sgd(tmp_path / "dp.png", rows, task="test")
    assert legends == [["FFNN (undefined)", "RNN"], ["FFNN", "RNN"]]
    assert (tmp_path / "dp.png").stat().st_size > 0
