"""Seed 001, appendix A.4, Table 5: the pixel-range prior beside TV for the L2 attack (bayes-table2's protocol)."""

from __future__ import annotations

import json

import pytest

from leaklab.experiments import bayes_table2 as table2
from leaklab.experiments.range_prior import VARIANTS, RangePriorConfig


def test_search_configurations_name_the_range_weight_and_clamping_only_where_set():
    plain = table2.attack_config("l2", table2.QUICK, 0, 0.1, 0.01, 0.3)
    assert plain.priors == {"tv": 0.3} and plain.clamp
    # Table 2's tuning-log keys are those its earlier runs wrote, so a rerun resumes them
    assert table2.hyperparameters(plain) == {"lr": 0.1, "lr_decay": 0.01, "beta_tv": 0.3, "layer_weighting": "none"}
    ranged = table2.attack_config("l2", table2.QUICK, 0, 0.1, 0.01, 0.3, clamp=False, range_weight=0.03)
    assert ranged.priors == {"tv": 0.3, "range": 0.03} and not ranged.clamp
    assert table2.hyperparameters(ranged) == {**table2.hyperparameters(plain), "beta_range": 0.03, "clamp": False}


def test_reproduce_range_prior_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "rp"
    result = CliRunner().invoke(app, ["reproduce", "range-prior", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "range_prior.png").stat().st_size > 0
    config = RangePriorConfig.quick()
    assert data["config"] == config.model_dump(mode="json") and list(data["defenses"]) == config.defenses
    for defense, row in data["defenses"].items():
        assert set(row["psnr"]) == set(VARIANTS) and all(len(v) == config.images for v in row["psnr"].values())
        chosen = row["hyperparameters"]
        assert "clamp" not in chosen["tv_clamped"] and "beta_range" not in chosen["tv_clamped"]
        assert chosen["tv"]["clamp"] is False and "beta_range" not in chosen["tv"]
        assert chosen["tv_range"]["clamp"] is False and chosen["tv_range"]["beta_range"] in config.range_weights
        tried = [{k: v for k, v in t.items() if k not in ("psnr", "mean")} for t in row["tuning"]]
        assert all(c in tried for c in chosen.values())
        diff = [a - b for a, b in zip(row["psnr"]["tv_range"], row["psnr"]["tv"])]
        assert row["range_minus_tv"]["db"] == pytest.approx(sum(diff) / len(diff))
        assert row["range_minus_tv"]["wins"] == sum(d > 0.01 for d in diff)
    # the clamped attack is bayes-table2's L2 on the same network, updates and starts
    cells = table2.run(tmp_path / "t2", quick=True, datasets=["digits"], defenses=["gaussian"],
                       steps=[config.step], images=config.images, seed=config.seed)["cells"]
    l2 = cells["digits"]["gaussian"][str(config.step)]["l2"]
    assert l2["psnr"] == data["defenses"]["gaussian"]["psnr"]["tv_clamped"]
    assert l2["hyperparameters"] == data["defenses"]["gaussian"]["hyperparameters"]["tv_clamped"]
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "range-prior", "--quick", "--out", str(again)]).exit_code == 0
    assert json.loads((again / "results.json").read_text())["defenses"]["gaussian"]["psnr"] == \
        data["defenses"]["gaussian"]["psnr"]


@pytest.mark.parametrize("field, bad", [("defenses", ["gaussian:0.1"]), ("defenses", ["laplace", "laplace"]),
                                        ("range_weights", [0.0]), ("range_weights", [0.1, 0.1]), ("images", 293)])
def test_range_prior_config_refuses(field, bad):
    with pytest.raises(ValueError):
        RangePriorConfig(**{field: bad})


def test_range_prior_cli_bounds_match_the_table2_protocol():
    from leaklab.cli.reproduce import TABLE2_IMAGES

    assert TABLE2_IMAGES == table2.POOL_OFFSET - table2.EVAL_OFFSET
