"""Seed 001, appendix A.6, Fig. 7: the Bayes adversary's Monte Carlo points, and the attack's per-step hook."""

from __future__ import annotations

import json

import pytest
import torch

from leaklab.errors import LeaklabError
from leaklab.experiments.mc_ablation import McAblationConfig


def test_on_step_sees_every_adam_step_and_ends_at_the_reconstruction():
    from leaklab.attacks.inversion import InversionConfig, invert
    from leaklab.data import load_images
    from leaklab.defenses import parse_defense
    from leaklab.fl import fedsgd_update
    from leaklab.models import ModelSpec, build_model
    from leaklab.threat import Capabilities, make_view

    batch = load_images("digits", 1, 8, seed=0)
    spec = ModelSpec(name="cnn", num_classes=10, in_channels=1, image_size=8, width=4, mean=batch.mean,
                     std=batch.std)
    model = build_model(spec, seed=0)
    update = parse_defense("gaussian:0.1").apply(fedsgd_update(model, batch.images, batch.labels),
                                                 torch.Generator().manual_seed(0))
    view = make_view(spec, model.state_dict(), update.metadata, Capabilities(knows_labels=True, knows_defense=True),
                     defense="gaussian:0.1", labels=batch.labels)
    config = InversionConfig(objective="bayes", optimizer="adam", iterations=5, mc_samples=2, mc_radius=0.5)
    seen = []
    rec = invert(view, update, config, on_step=lambda it, images: seen.append((it, images.clone())))[0]
    assert [it for it, _ in seen] == [1, 2, 3, 4, 5]
    assert seen[0][1].shape == (1, 1, 1, 8, 8) and 0 <= float(seen[0][1].min()) <= float(seen[0][1].max()) <= 1
    assert torch.equal(seen[-1][1][0], rec.images)
    again = invert(view, update, config)[0]  # watching changes nothing
    assert torch.equal(again.images, rec.images)
    with pytest.raises(LeaklabError, match="L-BFGS"):
        invert(view, update, InversionConfig(objective="l2", optimizer="lbfgs", iterations=2, priors={}),
               on_step=lambda it, images: None)


def test_reproduce_mc_ablation_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "mc"
    result = CliRunner().invoke(app, ["reproduce", "mc-ablation", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "mc_ablation.png").stat().st_size > 0
    config = data["config"]
    assert list(data["samples"]) == [str(k) for k in config["samples"]]
    for row in data["samples"].values():
        assert len(row["psnr_mean"]) == config["iterations"] and row["final_psnr"] == row["psnr_mean"][-1]
    from leaklab.data import load_images

    std = load_images("digits", 1, 8, seed=0).std[0]  # delta in normalised units at 28x28, here at 8x8
    assert data["radius_pixels"] == pytest.approx(config["radius"] * std * 8 / 28)
    assert set(data["tuning"]) == {f"lr {lr}, beta {b}" for lr in config["lrs"] for b in config["betas"]}
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["reproduce", "mc-ablation", "--quick", "--out", str(again)]).exit_code == 0
    second = json.loads((again / "results.json").read_text())["samples"]
    assert {k: r["psnr_mean"] for k, r in second.items()} == {k: r["psnr_mean"] for k, r in data["samples"].items()}
    for field, bad in (("samples", [65]), ("samples", [2, 2]), ("lrs", [0.0]), ("lrs", [2e4])):
        with pytest.raises(ValueError):
            McAblationConfig(**{field: bad})
