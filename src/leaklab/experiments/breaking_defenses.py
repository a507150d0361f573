"""``leaklab reproduce breaking-defenses``: seed 001, section 6 "Evaluating existing defenses" (Figs. 2, 3 and 5):
three heuristic defenses fall to attacks that model them, early in training.

For every defense, network and training step ``t`` (the network trained ``t`` SGD steps at batch 32 on other images,
under the defense where it changes training) each of ``images`` private images is sent alone, as a FedSGD gradient,
and attacked (:mod:`leaklab.experiments.capture` and :mod:`leaklab.attacks.inversion`):

* Soteria (``convbig``, Table 3; the defended layer's weight gradient pruned at ``soteria_rate``,
  :mod:`leaklab.defenses.soteria`): Inverting Gradients on the whole defended gradient ("direct") against the seed's
  attack, which drops the defended layer's weight from the comparison ("drop", eq. 6).
* ATS (``convnet`` of width ``ats_width``, Table 4, BatchNorm on the server's running statistics as the seed's code;
  the client trains and computes its gradient on images augmented by each policy, :mod:`leaklab.data.augment`):
  Inverting Gradients, scored against the augmented image the gradient is of (as the seed's code).
* PRECODE (``precode``: five layers of 500 and the variational bottleneck): the analytic recovery of the first layer's
  input (Phong et al., :mod:`leaklab.attacks.inversion.analytic`).

Inverting Gradients here is leaklab's (:class:`~leaklab.attacks.inversion.config.InversionConfig`: cosine, relative TV
0.2, Adam annealed to 0) with the iterations of this config; labels are read off the update. Each image is scored
by PSNR and SSIM beside the constant image at its mean (the no-information baseline). Writes ``OUT/results.json``,
``OUT/breaking_defenses.png`` (Fig. 2: PSNR against training steps) and ``OUT/breaking_images.png`` (Fig. 3: the
images at the step nearest 10) atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab.attacks.inversion.analytic import recover_input
from leaklab.attacks.inversion.attack import invert
from leaklab.attacks.inversion.config import InversionConfig
from leaklab.data.augment import parse_policy
from leaklab.experiments import ProgressFn
from leaklab.experiments.capture import Capture, CaptureConfig, capture
from leaklab.fields import Seed
from leaklab.io import BREAKING_DEFENSES_FORMAT, RESULTS_FILE, atomic_dir, write_json
from leaklab.metrics import constant_baseline, psnr, ssim
from leaklab.metrics.vectors import mean_of
from leaklab.names import DATASET_NAMES
from leaklab.threat import make_view

PLOT_FILE = "breaking_defenses.png"
IMAGES_FILE = "breaking_images.png"
PICTURE_STEP = 10  # Fig. 3 shows the images after the 10th training step
PUBLISHED = {  # seed 001, section 6 and Figs. 2-3 (CIFAR-10, batch 1)
    "soteria": "PSNR of the attack that drops the defended layer falls from about 30 dB at step 0 over the first "
               "10 epochs (Fig. 2b); images after 10 steps close to the originals (Fig. 3b)",
    "ats": "PSNR falls over the first 1,000 steps (Fig. 2a); high-quality images for the first 10 to 20 steps, "
           "none reliable at 50 (Fig. 6)",
    "precode": "PSNR > 150 dB in every experiment (exact recovery)",
}


class BreakingDefensesConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data: Literal[DATASET_NAMES] = "photos"
    image_size: int = Field(default=32, ge=8, le=64)
    images: int = Field(default=2, ge=1, le=64, description="private images per cell, one per update")
    train_steps: list[int] = Field(default_factory=lambda: [0, 10, 50], min_length=1)
    soteria_layers: list[str] = Field(default_factory=lambda: ["classifier.0", "classifier.2"], description=(
        "convbig's defended layers: the largest (the seed's text) and the second (its code, Fig. 5d)"))
    soteria_rate: float = Field(default=0.8, gt=0, lt=1)
    soteria_iterations: int = Field(default=2000, ge=1, le=100_000, description="the seed: 4,000")
    ats_policies: list[str] = Field(default_factory=lambda: ["7-4-15", "21-13-3", "21-13-3+7-4-15"])
    ats_width: int = Field(default=64, ge=1, le=256)
    ats_iterations: int = Field(default=300, ge=1, le=100_000, description="the seed: 2,000")
    precode_width: int = Field(default=500, ge=1, le=2000)
    seed: Seed = 0

    @field_validator("train_steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(t < 0 or t > 100_000 for t in v) or len(set(v)) != len(v):
            raise ValueError("train_steps are distinct step counts from 0 to 100,000")
        return sorted(v)

    @field_validator("ats_policies")
    @classmethod
    def _policies(cls, v: list[str]) -> list[str]:
        for policy in v:
            parse_policy(policy)
        return v

    @classmethod
    def quick(cls, seed: int = 0) -> "BreakingDefensesConfig":
        return cls(image_size=16, images=1, train_steps=[0, 2], soteria_iterations=30, ats_policies=["7-4-15"],
                   ats_width=4, ats_iterations=10, precode_width=32, seed=seed)


def _capture(config: BreakingDefensesConfig, step: int, **fields) -> Capture:
    return capture(CaptureConfig(data=config.data, image_size=config.image_size, num_images=config.images,
                                 train_steps=step, seed=config.seed, image_seed=config.seed, **fields))


def _scores(images: torch.Tensor, truth: torch.Tensor) -> dict:
    base = constant_baseline(truth)
    return {"psnr": psnr(images, truth).tolist(), "ssim": ssim(images, truth).tolist(),
            "psnr_baseline": psnr(base, truth).tolist()}


def _attacked(case: Capture, attack: str, inversion: InversionConfig | None) -> tuple[dict, torch.Tensor]:
    """Every update of ``case`` attacked alone; the row's scores and the reconstructions (N, C, H, W)."""
    start, pictures, labels = time.perf_counter(), [], []
    for update, truth_label in zip(case.updates, case.labels):
        view = make_view(case.spec, case.state, update.metadata, case.capabilities)
        if inversion is None:  # float64, as recovered: an exact recovery's PSNR is not float32's rounding
            pictures.append(recover_input(view, update).clamp(0, 1))
        else:
            rec = invert(view, update, inversion)[0]
            pictures.append(rec.images)
            labels.append(bool(torch.equal(rec.labels, truth_label)))
    images = torch.cat(pictures)
    row = {"attack": attack, **_scores(images, case.images.to(images.dtype)),
           "labels_correct": mean_of([float(v) for v in labels]) if labels else None,  # the analytic attack reads none
           "update_cosine": case.kept, "seconds": time.perf_counter() - start}
    row.update({f"{k}_mean": mean_of(row[k]) for k in ("psnr", "ssim", "psnr_baseline")})
    return row, images


def _cells(config: BreakingDefensesConfig) -> list[tuple[str, str, dict, list[tuple[str, InversionConfig | None]]]]:
    """(defense, setting, capture fields, attacks) of every defended network."""
    ig = lambda iterations, **more: InversionConfig(iterations=iterations, seed=config.seed, **more)  # noqa: E731
    cells = [("soteria", layer, {"model": "convbig", "soteria_layer": layer, "soteria_rate": config.soteria_rate},
              [("direct", ig(config.soteria_iterations)),
               ("drop", ig(config.soteria_iterations, drop=[f"{layer}.weight"]))])
             for layer in config.soteria_layers]
    cells += [("ats", policy, {"model": "convnet", "width": config.ats_width, "bn_stats": "running", "ats": policy},
               [("inverting gradients", ig(config.ats_iterations))]) for policy in config.ats_policies]
    cells.append(("precode", "bottleneck", {"model": "precode", "width": config.precode_width},
                  [("analytic", None)]))
    return cells


def run(out: Path, config: BreakingDefensesConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, defend, attack and write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (BreakingDefensesConfig.quick() if quick else BreakingDefensesConfig())
    start = time.perf_counter()
    cells = _cells(config)
    total, done = sum(len(c[3]) for c in cells) * len(config.train_steps), 0
    picture_step = min(config.train_steps, key=lambda t: abs(t - PICTURE_STEP))
    with atomic_dir(out, BREAKING_DEFENSES_FORMAT) as tmp:
        rows, pictures = [], []
        for defense, setting, fields, attacks in cells:
            for step in config.train_steps:
                case = _capture(config, step, **fields)
                for attack, inversion in attacks:
                    row, images = _attacked(case, attack, inversion)
                    rows.append({"defense": defense, "setting": setting, "train_step": step, **row})
                    if step == picture_step:
                        pictures.append((f"{defense} {setting}", attack, case.images, images, row["psnr"]))
                    done += 1
                    if progress:
                        progress(f"{defense} {setting}, step {step}: {attack}", done, total)
        results = {"format": BREAKING_DEFENSES_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "picture_step": picture_step, "rows": rows,
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
        from leaklab.report.plots import image_grid

        grid, captions = [], []
        for setting, attack, truth, images, scores in pictures:
            grid += [("private", truth), (attack, images)]
            captions += [[setting] * len(truth), [f"{p:.1f} dB" for p in scores]]
        image_grid(grid, tmp / IMAGES_FILE, captions=captions, max_cols=max(config.images, 2),
                   title=f"after {picture_step} training steps (PSNR against the private image)")
    return results


def _plot(path: Path, rows: list[dict]) -> None:
    from leaklab.report.plots import saved_figure

    defenses = list(dict.fromkeys(r["defense"] for r in rows))
    with saved_figure(path, 1, len(defenses), figsize=(4.2 * len(defenses), 3.4), squeeze=False) as (fig, axes):
        for ax, defense in zip(axes[0], defenses):
            mine = [r for r in rows if r["defense"] == defense]
            for setting, attack in dict.fromkeys((r["setting"], r["attack"]) for r in mine):
                line = [r for r in mine if (r["setting"], r["attack"]) == (setting, attack)]
                ax.plot([r["train_step"] for r in line], [min(r["psnr_mean"], 160.0) for r in line], "o-",
                        label=f"{setting}: {attack}")
            base = {r["train_step"]: r["psnr_baseline_mean"] for r in mine}
            ax.plot(list(base), list(base.values()), ":", color="grey", label="constant image")
            ax.set_title(defense, fontsize=10)
            ax.set_xlabel("training steps before the round")
            ax.set_ylabel("PSNR (dB; shown at most 160)")
            ax.legend(fontsize=7)
        fig.suptitle("Attacks on heuristic defenses early in training (seed 001, Fig. 2)", fontsize=10)
