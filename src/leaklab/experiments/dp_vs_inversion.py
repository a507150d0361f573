"""``leaklab reproduce dp-vs-inversion``: what an epsilon of DP-SGD buys against gradient inversion,
and what it costs in accuracy (issue 3, "the attacks meet DP").

* Utility: the same classifier trained on MNIST digits (``leaklab.data``, 3,900 training and 1,000
  test images by default) with DP-SGD through opacus to ``epsilon`` at ``delta``
  (:func:`leaklab.privacy.dpsgd.train_private`; the noise multiplier is the smallest that reaches
  epsilon after ``steps`` steps) and without privacy (ordinary SGD with momentum,
  :func:`leaklab.fl.train_steps`), test accuracy side by side.
* Attack: a client's DP-SGD message for one image (batch 1, so the per-sample gradient is the
  update) is clipped to ``clip`` and noised with the noise multiplier of one (epsilon, delta)
  release (:func:`~leaklab.privacy.dpsgd.clip_and_noise`, :func:`~leaklab.privacy.dpsgd.noise_multiplier_for`);
  Inverting Gradients (cosine objective with a total-variation prior, Geiping et al. 2020; the
  default :class:`~leaklab.attacks.inversion.InversionConfig`) attacks it at the untrained model of
  the first round, with the labels granted (as in seed 001's experiments). PSNR against the true
  image, beside the no-information baseline (a constant image at the true mean), per epsilon.

Writes ``OUT/results.json`` and ``OUT/dp_vs_inversion.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from leaklab import seeds
from leaklab.attacks.inversion import InversionConfig, invert
from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.fl import fedsgd_update, train_steps
from leaklab.io import DP_VS_INVERSION_FORMAT, RESULTS_FILE, atomic_dir, write_json
from leaklab.metrics import accuracy, constant_baseline, psnr, ssim
from leaklab.models import ModelSpec, build_model
from leaklab.privacy.dpsgd import DPSGDConfig, clip_and_noise, noise_multiplier_for, train_private
from leaklab.threat import Capabilities, make_view

PLOT_FILE = "dp_vs_inversion.png"
_POOL = {"mnist": 5000, "digits": 1797}


class DpVsInversionConfig(BaseModel):
    """Every setting of the experiment; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid")

    data: Literal["mnist", "digits"] = "mnist"
    image_size: int = Field(default=28, ge=8, le=64)
    model: Literal["mlp", "cnn"] = "mlp"
    width: int = Field(default=128, ge=1)
    train_images: int = Field(default=3900, ge=2)
    test_images: int = Field(default=1000, ge=1)
    epsilon: float = Field(default=3.0, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    clip: float = Field(default=1.0, gt=0)
    batch_size: int = Field(default=256, ge=1)
    steps: int = Field(default=300, ge=1)
    lr: float = Field(default=0.5, gt=0, description="DP-SGD learning rate")
    sgd_lr: float = Field(default=0.05, gt=0, description="non-private SGD (momentum 0.9) learning rate")
    attack_epsilons: list[float] = Field(default_factory=lambda: [math.inf, 1e4, 1e3, 100.0, 8.0, 3.0, 1.0],
                                         min_length=1)  # none failed after the training, in the plot
    attack_images: int = Field(default=4, ge=1, le=64)
    iterations: int = Field(default=300, ge=1)
    seed: Seed = 0

    @classmethod
    def quick(cls, seed: int = 0) -> "DpVsInversionConfig":
        return cls(data="digits", image_size=8, width=32, train_images=300, test_images=100, steps=20,
                   batch_size=64, attack_epsilons=[math.inf, 3.0], attack_images=1, iterations=20, seed=seed)


def utility(config: DpVsInversionConfig, progress: ProgressFn | None = None) -> dict:
    """Test accuracy of DP-SGD at (epsilon, delta) and of non-private SGD, same model and data."""
    n = config.train_images + config.test_images
    data = load_images(config.data, n, config.image_size, seed=config.seed)
    x, y = data.images[:config.train_images], data.labels[:config.train_images]
    xt, yt = data.images[config.train_images:], data.labels[config.train_images:]
    spec = _spec(config, data)
    start = time.perf_counter()
    private = build_model(spec, seed=config.seed)
    report = train_private(private, x, y, DPSGDConfig(
        clip=config.clip, target_epsilon=config.epsilon, delta=config.delta, batch_size=config.batch_size,
        steps=config.steps, lr=config.lr, seed=config.seed), progress=progress)
    private_seconds = time.perf_counter() - start
    start = time.perf_counter()
    plain = train_steps(build_model(spec, seed=config.seed), x, y, config.steps, lr=config.sgd_lr,
                        batch_size=config.batch_size, seed=config.seed)
    return {"private": {**report, "accuracy": accuracy(private, xt, yt), "seconds": private_seconds},
            "non_private": {"accuracy": accuracy(plain, xt, yt), "steps": config.steps, "lr": config.sgd_lr,
                            "seconds": time.perf_counter() - start},
            "train_images": config.train_images, "test_images": config.test_images}


def _spec(config: DpVsInversionConfig, data) -> ModelSpec:
    return ModelSpec(name=config.model, num_classes=data.num_classes, in_channels=data.images.shape[1],
                     image_size=config.image_size, width=config.width, mean=data.mean, std=data.std)


def psnr_vs_epsilon(config: DpVsInversionConfig, progress: ProgressFn | None = None) -> tuple[dict, dict]:
    """Inverting Gradients against one clipped, noised per-sample gradient at each epsilon.
    Returns (rows for results.json, images for the plot)."""
    offset = config.train_images + config.test_images
    data = load_images(config.data, config.attack_images, config.image_size, seed=config.seed, offset=offset)
    spec = _spec(config, data)
    model = build_model(spec, seed=config.seed)
    attack = InversionConfig(iterations=config.iterations, seed=config.seed)
    baseline = psnr(constant_baseline(data.images), data.images)
    rows, pictures = [], {}
    epsilons = sorted(config.attack_epsilons, reverse=True)
    total = len(epsilons) * config.attack_images
    for e, epsilon in enumerate(epsilons):
        sigma = noise_multiplier_for(epsilon, config.delta)
        defense = f"clip:{config.clip:g}" + (f",gaussian:{sigma * config.clip:g}" if sigma > 0 else "")
        generator = seeds.generator(config.seed, seeds.DEFENSE)
        recs = []
        for i in range(config.attack_images):
            x, y = data.images[i:i + 1], data.labels[i:i + 1]
            clean = fedsgd_update(model, x, y)
            names = list(clean.tensors)
            noised = clip_and_noise([clean.tensors[k] for k in names], config.clip, sigma, generator)
            update = clean.with_tensors(dict(zip(names, noised)), defense)
            view = make_view(spec, model.state_dict(), update.metadata, Capabilities(knows_labels=True),
                             defense=defense, labels=y)
            recs.append(invert(view, update, attack.model_copy(update={"seed": config.seed + i}))[0].images)
            if progress:
                progress("inversion", e * config.attack_images + i + 1, total)
        images = torch.cat(recs).float()
        p, s = psnr(images, data.images), ssim(images, data.images)
        rows.append({"epsilon": _label(epsilon), "delta": config.delta, "noise_multiplier": sigma, "defense": defense,
                     "psnr_mean": float(p.mean()), "psnr": p.tolist(), "ssim_mean": float(s.mean()),
                     "psnr_baseline_mean": float(baseline.mean())})
        pictures[_label(epsilon)] = images
    return {"rows": rows, "images": config.attack_images, "attack": attack.model_dump(mode="json"),
            "labels_known": True, "model_round": 0}, {"truth": data.images, **pictures}


def _label(epsilon: float) -> str:
    return "inf" if epsilon == math.inf else f"{epsilon:g}"


def _plot(path: Path, results: dict, pictures: dict) -> None:
    from leaklab.report.plots import saved_figure

    rows = results["attack"]["rows"]
    truth = pictures["truth"]
    k = min(len(truth), 4)
    with saved_figure(path, figsize=(max(6.0, 1.1 * len(rows) + 4), 3.2 + 1.1 * k), axes=False) as (fig, _):
        grid = fig.add_gridspec(k + 2, len(rows) + 1)
        ax = fig.add_subplot(grid[:2, :])
        ax.plot(range(len(rows)), [r["psnr_mean"] for r in rows], "o-", label="Inverting Gradients")
        ax.plot(range(len(rows)), [r["psnr_baseline_mean"] for r in rows], "--", color="grey",
                label="constant image (no information)")
        ax.set_xticks(range(len(rows)), [r["epsilon"] for r in rows])
        ax.set_xlabel(f"epsilon of the released gradient (delta {rows[0]['delta']:g})")
        ax.set_ylabel("PSNR (dB)")
        u = results["utility"]
        ax.set_title(f"DP-SGD at epsilon {u['private']['epsilon']:.2f}: test accuracy "
                     f"{100 * u['private']['accuracy']:.1f}% (non-private {100 * u['non_private']['accuracy']:.1f}%)",
                     fontsize=9)
        ax.legend(fontsize=8)
        for i in range(k):
            for j, key in enumerate(["truth", *(r["epsilon"] for r in rows)]):
                a = fig.add_subplot(grid[2 + i, j])
                a.imshow(pictures[key][i].permute(1, 2, 0).squeeze(-1).clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
                a.set_xticks([])
                a.set_yticks([])
                if i == 0:
                    a.set_title("truth" if key == "truth" else f"ε {key}", fontsize=8)


def run(out: Path, config: DpVsInversionConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Run both parts and write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (DpVsInversionConfig.quick() if quick else DpVsInversionConfig())
    if config.train_images + config.test_images + config.attack_images > _POOL[config.data]:
        raise LeaklabError(f"{config.data} holds {_POOL[config.data]} images: train + test + attack images "
                           "must fit in it")
    start = time.perf_counter()
    with atomic_dir(out, DP_VS_INVERSION_FORMAT) as tmp:
        results = {"format": DP_VS_INVERSION_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json")}
        results["utility"] = utility(config, progress)
        results["attack"], pictures = psnr_vs_epsilon(config, progress)
        rows = results["attack"]["rows"]
        results["acceptance"] = {
            "epsilon_reached": results["utility"]["private"]["epsilon"] <= config.epsilon,
            "psnr_degrades_as_epsilon_shrinks": all(a["psnr_mean"] >= b["psnr_mean"] - 0.5
                                                    for a, b in zip(rows, rows[1:])),
        }
        results["seconds"] = time.perf_counter() - start
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, results, pictures)
    return results
