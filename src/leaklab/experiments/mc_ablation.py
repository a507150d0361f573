"""``leaklab reproduce mc-ablation``: seed 001, appendix A.6, Fig. 7: the Monte Carlo estimate of the Bayes adversary's
objective (Algorithm 1) with k points in the ball B(x, delta), for several k.

The seed's setting: a convolutional network on MNIST at its initial training step, one image's gradient behind
Gaussian noise of std 0.1, delta = 9.0, the PSNR averaged over 100 images at every step of the optimisation; its
claim: more samples converge faster, to a reconstruction closer to the original (a figure only). Here: the 5,000
real MNIST digits offline (28x28; ``digits``, 8x8, for a quick look), the authors' ReLU CNN (``cnn``, width 32)
at its initialisation, ``images`` digits, each attacked alone with its label known (as bayes-table2) by
:func:`~leaklab.attacks.inversion.invert` with the Bayes objective (the defense's exact likelihood), a relative TV
prior, Adam with exponential decay, ``iterations`` steps, at each of ``samples`` (k = 1 is one point drawn in the
ball, as Algorithm 1 and appendix A.7 have it, not the ball's centre). The seed's delta is taken in the
network's normalised input units on 28x28 inputs (its code normalises MNIST): ``radius`` times the dataset's std in
pixel units, scaled by image_size / 28 so that the per-pixel spread stays the same at another size. The seed gives
no learning rate or prior weight: both are chosen for k = 1 on ``tune_images`` digits that are not reported, over
``lrs`` x ``betas``, and kept for every k. Per k and step: the mean PSNR over the images and its standard error,
beside the no-information baseline (each digit's mean grey).

Writes ``OUT/results.json`` and ``OUT/mc_ablation.png`` (Fig. 7) atomically; same seed, same numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab.attacks.inversion import InversionConfig, invert
from leaklab.data import load_images
from leaklab.defenses import parse_defense
from leaklab.experiments import ProgressFn
from leaklab.fields import PositiveCounts, PositiveGrid, Seed
from leaklab.fl import fedsgd_update
from leaklab.io import MC_ABLATION_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.metrics import constant_baseline, psnr
from leaklab.models import ModelSpec, build_model
from leaklab.seeds import stream_seed
from leaklab.threat import Capabilities, make_view

PLOT_FILE = "mc_ablation.png"
SEED_SIZE = 28  # the seed's MNIST, on which its delta is measured
PUBLISHED = {"delta": 9.0, "noise": "gaussian:0.1", "images": 100,
             "claim": "more Monte Carlo samples converge faster to a reconstruction closer to the original (Fig. 7, a "
                      "figure only)"}


class McAblationConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: Literal["mnist", "digits"] = "mnist"
    image_size: int = Field(default=28, ge=8, le=64)
    width: int = Field(default=32, ge=1, le=256, description="the CNN's first convolution's channels")
    noise: float = Field(default=0.1, gt=0, le=100, description="the defense's Gaussian std (the seed: 0.1)")
    samples: PositiveCounts = Field(default_factory=lambda: [1, 2, 4, 8], min_length=1,
                               description="k, the Monte Carlo points per step (the seed's values are a figure's)")
    radius: float = Field(default=9.0, gt=0, le=1e4, description="delta, in normalised units at 28x28 (the seed: 9)")
    images: int = Field(default=20, ge=1, le=1000, description="reported digits (the seed: 100)")
    tune_images: int = Field(default=2, ge=1, le=100)
    iterations: int = Field(default=200, ge=1, le=100_000)
    lrs: PositiveGrid = Field(default_factory=lambda: [0.03, 0.1, 0.3, 1.0], min_length=1,
                             description="Adam's, each <= 1e4")
    betas: PositiveGrid = Field(default_factory=lambda: [0.03, 0.1, 0.3, 1.0], min_length=1,
                               description="the TV prior's relative weights")
    lr_decay: float = Field(default=0.01, gt=0, le=1, description="the learning rate's factor over the whole run")
    seed: Seed = 0

    @field_validator("samples")
    @classmethod
    def _at_most_64(cls, v: list[int]) -> list[int]:
        if max(v) > 64:
            raise ValueError("at most 64 Monte Carlo points a step (the attack's limit)")
        return v

    @field_validator("lrs")
    @classmethod
    def _attack_range(cls, v: list[float]) -> list[float]:
        if max(v) > 1e4:
            raise ValueError("learning rates are at most 1e4 (the attack's limit)")
        return v

    @classmethod
    def quick(cls, seed: int = 0) -> "McAblationConfig":
        return cls(dataset="digits", image_size=8, width=4, samples=[1, 2], images=2, tune_images=1, iterations=4,
                   lrs=[0.1], betas=[0.3], seed=seed)


def _attack_config(config: McAblationConfig, k: int, lr: float, beta: float, radius: float,
                   seed: int) -> InversionConfig:
    return InversionConfig(objective="bayes", optimizer="adam", iterations=config.iterations, lr=lr, schedule="exp",
                           lr_decay=config.lr_decay, priors={"tv": beta}, prior_scale="relative", restarts=1,
                           mc_samples=k, mc_radius=radius, init="gaussian", clamp=True, seed=seed)


def _curves(view_of: Callable, updates: list, truth: torch.Tensor,
            make: Callable[[int], InversionConfig]) -> torch.Tensor:
    """Each image's PSNR after every step, (images, iterations): ``make(i)`` is image i's attack configuration."""
    rows = []
    for i, update in enumerate(updates):
        trace: list[float] = []
        invert(view_of(i), update, make(i),
               on_step=lambda it, images, i=i: trace.append(float(psnr(images[0].cpu(), truth[i:i + 1])[0])))
        rows.append(trace)
    return torch.tensor(rows, dtype=torch.float64)


def run(out: Path, config: McAblationConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Tune at k = 1, attack every image at each k, write ``out`` atomically; returns the results."""
    config = config or (McAblationConfig.quick() if quick else McAblationConfig())
    check_out(out, MC_ABLATION_FORMAT)
    began = time.perf_counter()
    tune = load_images(config.dataset, config.tune_images, config.image_size, seed=config.seed)
    report = load_images(config.dataset, config.images, config.image_size, seed=config.seed,
                         offset=config.tune_images)
    spec = ModelSpec(name="cnn", num_classes=report.num_classes, in_channels=1, image_size=config.image_size,
                     width=config.width, mean=report.mean, std=report.std)
    model = build_model(spec, seed=stream_seed(config.seed, "mc-ablation", "model"))
    state = {key: value.clone() for key, value in model.state_dict().items()}
    defense = f"gaussian:{config.noise}"
    chain = parse_defense(defense)
    radius = config.radius * float(report.std[0]) * config.image_size / SEED_SIZE

    def defended(batch, offset: int) -> list:  # one noise draw per image, the same for every k
        return [chain.apply(fedsgd_update(model, batch.images[i:i + 1], batch.labels[i:i + 1]),
                            torch.Generator().manual_seed(stream_seed(config.seed, "mc-ablation", "noise", offset + i)))
                for i in range(len(batch.images))]

    def view_of(batch, updates):
        return lambda i: make_view(spec, state, updates[i].metadata, Capabilities(knows_labels=True,
                                                                                  knows_defense=True),
                                   defense=defense, labels=batch.labels[i:i + 1])

    tune_updates, report_updates = defended(tune, 0), defended(report, config.tune_images)

    def attack_seed(split: str, i: int) -> int:  # an image's start and ball draws, the same for every k
        return stream_seed(config.seed, "mc-ablation", "attack", split, i)

    grid = [(lr, beta) for lr in config.lrs for beta in config.betas]
    total, done = len(grid) * config.tune_images + len(config.samples) * config.images, 0

    def tick(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress("attacks run", done, total)

    tuning = {}
    for lr, beta in grid:
        curves = _curves(view_of(tune, tune_updates), tune_updates, tune.images,
                         lambda i, lr=lr, beta=beta: _attack_config(config, 1, lr, beta, radius,
                                                                    attack_seed("tune", i)))
        tuning[f"lr {lr}, beta {beta}"] = float(curves[:, -1].mean())
        tick(config.tune_images)
    lr, beta = max(grid, key=lambda p: tuning[f"lr {p[0]}, beta {p[1]}"])
    by_k = {}
    for k in config.samples:
        start = time.perf_counter()
        curves = _curves(view_of(report, report_updates), report_updates, report.images,
                         lambda i, k=k: _attack_config(config, k, lr, beta, radius, attack_seed("report", i)))
        seconds = time.perf_counter() - start
        tick(config.images)
        by_k[str(k)] = {"psnr_mean": curves.mean(0).tolist(),
                        "psnr_se": (curves.std(0) / math.sqrt(config.images)).tolist() if config.images > 1 else None,
                        "final_psnr": float(curves[:, -1].mean()),
                        "seconds_per_iteration": seconds / (config.images * config.iterations)}
    baseline = float(psnr(constant_baseline(report.images), report.images).mean())
    with atomic_dir(out, MC_ABLATION_FORMAT) as tmp:
        results = {"format": MC_ABLATION_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "radius_pixels": radius, "learning_rate": lr,
                   "beta_tv": beta, "tuning": tuning, "samples": by_k, "baseline_psnr": baseline,
                   "published": PUBLISHED, "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, results)
    return results


def _plot(path: Path, results: dict) -> None:
    """Fig. 7: the mean PSNR against the steps, one line per k; the no-information baseline dotted."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, figsize=(6, 3.6)) as (fig, ax):
        for k, row in results["samples"].items():
            steps = range(1, len(row["psnr_mean"]) + 1)
            ax.plot(steps, row["psnr_mean"], label=f"k = {k}")
        ax.axhline(results["baseline_psnr"], color="grey", linestyle=":", linewidth=0.8, label="no information")
        ax.set_xlabel("Adam steps")
        ax.set_ylabel("PSNR (dB), mean over the images")
        ax.legend(fontsize=7)
        ax.set_title("Monte Carlo points of the Bayes adversary (seed 001, Fig. 7)", fontsize=9)
