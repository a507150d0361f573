"""`leaklab reproduce dp-vs-inversion --quick`: both parts run, write their files and are reproducible."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from leaklab.cli import app
from leaklab.errors import LeaklabError
from leaklab.experiments import dp_vs_inversion as dvi


def test_quick_cli_writes_results_and_plot(tmp_path):
    out = tmp_path / "dvi"
    result = CliRunner().invoke(app, ["reproduce", "dp-vs-inversion", "--quick", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "DP-SGD epsilon" in result.stdout and "epsilon    inf" in result.stdout
    data = json.loads((out / "results.json").read_text())
    assert (out / dvi.PLOT_FILE).stat().st_size > 1000
    private = data["utility"]["private"]
    assert 2.9 <= private["epsilon"] <= 3.0 and private["noise_multiplier"] > 0
    assert 0 <= private["accuracy"] <= 1 and 0 <= data["utility"]["non_private"]["accuracy"] <= 1
    rows = data["attack"]["rows"]
    assert [r["epsilon"] for r in rows] == ["inf", "3"]
    assert rows[0]["noise_multiplier"] == 0 and rows[1]["noise_multiplier"] > 1
    # without noise the attack recovers the digit; at epsilon 3 it does no better than a constant image
    assert rows[0]["psnr_mean"] > rows[0]["psnr_baseline_mean"] + 5
    assert rows[1]["psnr_mean"] < rows[1]["psnr_baseline_mean"] + 1
    assert data["acceptance"] == {"epsilon_reached": True, "psnr_degrades_as_epsilon_shrinks": True}


def test_same_seed_same_numbers():
    config = dvi.DpVsInversionConfig.quick().model_copy(update={"attack_epsilons": [8.0], "iterations": 5})
    first, _ = dvi.psnr_vs_epsilon(config)
    second, _ = dvi.psnr_vs_epsilon(config)
    assert first["rows"] == second["rows"]
    other, _ = dvi.psnr_vs_epsilon(config.model_copy(update={"seed": 1}))
    assert other["rows"] != first["rows"]


def test_images_must_fit_the_pool(tmp_path):
    config = dvi.DpVsInversionConfig.quick().model_copy(update={"train_images": 1790})
    with pytest.raises(LeaklabError, match="1797 images"):
        dvi.run(tmp_path / "x", config)
    assert not (tmp_path / "x").exists()
    assert math.isinf(dvi.DpVsInversionConfig().attack_epsilons[0])


def test_no_attack_level_is_refused_before_the_training():
    """An empty list passed, trained DP-SGD and failed in the plot (IndexError)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="attack_epsilons"):
        dvi.DpVsInversionConfig(**{**dvi.DpVsInversionConfig.quick().model_dump(), "attack_epsilons": []})
