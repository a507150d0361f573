"""Seed 001, Fig. 4: the Bayes optimal adversary against its approximations on the synthetic Gaussian task."""

from __future__ import annotations

import json
import math

import pytest
import torch

from leaklab.experiments.bayes_ablation import BayesAblationConfig, conditional, log_prior


def test_the_priors_are_unit_variance_gaussian_and_laplace_densities():
    x = torch.tensor([[0.5, -2.0], [0.0, 1.0]])
    gauss = torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(1)
    lap = torch.distributions.Laplace(0.0, 1 / math.sqrt(2)).log_prob(x).sum(1)
    # equal up to each density's constant, which the attack's gradient never sees
    assert torch.allclose(log_prior("gaussian", x) - gauss, (log_prior("gaussian", x) - gauss)[0].expand(2))
    assert torch.allclose(log_prior("laplace", x) - lap, (log_prior("laplace", x) - lap)[0].expand(2))
    assert torch.distributions.Laplace(0.0, 1 / math.sqrt(2)).variance == pytest.approx(1.0)


def test_the_wrong_conditional_has_the_noise_s_variance():
    assert conditional("laplace", 0.1).noise.b == pytest.approx(0.1)
    gaussian = conditional("gaussian", 0.1).noise
    assert gaussian.scale ** 2 == pytest.approx(2 * 0.1 ** 2)  # Laplace(b) has variance 2 b^2


def test_reproduce_bayes_ablation_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "ablation"
    result = CliRunner().invoke(app, ["reproduce", "bayes-ablation", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "bayes_ablation.png").stat().st_size > 0
    attacks = data["attacks"]
    assert [(a["prior"], a["conditional"]) for a in attacks.values()] == [
        ("gaussian", "gaussian"), ("gaussian", "laplace"), ("laplace", "gaussian"), ("laplace", "laplace")]
    assert [a["bayes_optimal"] for a in attacks.values()] == [False, True, False, False]
    bayes = attacks["gaussian prior, laplace conditional"]
    assert bayes["versus_bayes_optimal"] is None
    for a in attacks.values():
        if not a["bayes_optimal"]:  # paired on the same samples: the mean difference is the difference of means
            assert a["versus_bayes_optimal"]["distance_difference"] == pytest.approx(
                a["final_distance"] - bayes["final_distance"], abs=1e-5)
            assert 0 <= a["versus_bayes_optimal"]["bayes_closer_share"] <= 1
    steps = data["config"]["steps"]
    for a in attacks.values():
        assert len(a["distance_mean"]) == steps + 1 and a["final_distance"] == a["distance_mean"][-1]
        assert a["distance_mean"][0] == pytest.approx(attacks["gaussian prior, gaussian conditional"]
                                                      ["distance_mean"][0])  # one start for all
        assert a["final_distance"] < data["no_information_distance"] < a["distance_mean"][0]
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "bayes-ablation", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["attacks"] == attacks
    with pytest.raises(ValueError, match="distinct and positive"):
        BayesAblationConfig(learning_rates=[0.1, 0.1])
