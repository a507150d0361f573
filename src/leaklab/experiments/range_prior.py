"""``leaklab reproduce range-prior``: seed 001, appendix A.4, Table 5: the L2 attack with the TV prior alone against
the TV prior plus the pixel-range term ``L_[0,1] = ||x - clip(x, 0, 1)||_2`` of Geng et al. (2021).

The seed's setting: its Table 2 network on MNIST after 500 training steps, one image's gradient behind each of
Table 2's four defenses, the L2 attack with ``log p(x) = phi L_TV + (1 - phi) L_[0,1]``, the Table 2 grid search
extended to phi; its claim: the range term improves the attack under every defense (by 0.12 to 0.50 dB).

Here: bayes-table2's protocol and code (:mod:`leaklab.experiments.bayes_table2`; the same networks, trained under
the defense they are attacked under, the same defended updates and attack starts for a seed) on the 5,000 real
MNIST digits offline (``digits``, scikit-learn's at 16x16, for a quick look), three attacks on the very same
updates. The seed does not say whether its attacks clamp the pixels; Table 5's left column is its Table 2's L2 column,
which leaklab runs clamped, while the range term has something to do only where the iterates may leave [0, 1]. So
both readings of the baseline are run:

* ``tv``: L2 + TV with Adam's iterates left unclamped (leaklab's reading of the left column that gives the range
  term something to do), searched as Table 2's L2 (:func:`~leaklab.experiments.bayes_table2.search`);
* ``tv_range``: L2 + TV + range, unclamped: from ``tv``'s choice, the range term's relative weight over
  ``range_weights``, then the TV weight times Table 2's ``beta_factors`` at the best range weight (the seed's
  extension of the search to phi). leaklab weighs each term relative to the data term's gradient at the start
  (``prior_scale="relative"``); the range term's gradient is a unit vector, so the relative weights (b_tv, b_range)
  stand for the seed's (beta, phi) with phi = 1 / (1 + (b_range / b_tv) ||grad L_TV(x0)||), one phi per image;
* ``tv_clamped``: L2 + TV with the iterates projected onto [0, 1] after every step (the hard form of the range
  constraint; leaklab's Table 2 attack, the other reading of the left column), searched the same way. It is
  bayes-table2's L2 cell where the tuning images are as many (bayes-table2 tunes on 2, this on ``tune_images``).

Every search selects by mean PSNR on ``tune_images`` images that are not reported. Per defense: each attack's
mean PSNR over ``images`` digits, the per-image differences ``tv_range - tv`` and ``tv_range - tv_clamped`` with
their paired standard errors and win counts, the no-information baseline (each digit's mean grey).

Writes ``OUT/results.json`` and ``OUT/range_prior.png`` (Table 5 as bars) atomically; same seed, same numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab.attacks.inversion import InversionConfig
from leaklab.experiments import ProgressFn
from leaklab.experiments import bayes_table2 as table2
from leaklab.fields import Seed
from leaklab.io import RANGE_PRIOR_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.metrics import constant_baseline, psnr
from leaklab.names import MAX_TRAIN_STEPS
from leaklab.seeds import stream_seed

PLOT_FILE = "range_prior.png"
ATTACK = "l2"
VARIANTS = ("tv", "tv_range", "tv_clamped")
LABELS = {"tv": "L2 + TV", "tv_range": "L2 + TV + range", "tv_clamped": "L2 + TV, clamped"}
# Seed 001, appendix A.4, Table 5: mean PSNR (dB), MNIST, train step 500, the L2 attack without / with L_[0,1].
PUBLISHED = {"gaussian": {"tv": 16.18, "tv_range": 16.30}, "laplace": {"tv": 15.47, "tv_range": 15.76},
             "prune+gaussian": {"tv": 13.15, "tv_range": 13.63}, "prune+laplace": {"tv": 13.60, "tv_range": 14.10}}


class RangePriorConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests (with ``run``'s
    ``quick``, which also takes bayes-table2's miniature network and grid)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: Literal["mnist", "digits"] = "mnist"
    step: int = Field(default=500, ge=0, le=MAX_TRAIN_STEPS, description="training steps under the defense (the "
                                                                         "seed: 500)")
    defenses: list[str] = Field(default_factory=lambda: list(PUBLISHED), min_length=1)
    images: int = Field(default=48, ge=1, le=table2.POOL_OFFSET - table2.EVAL_OFFSET,
                        description="reported digits per defense (the seed: 100)")
    tune_images: int = Field(default=4, ge=1, le=table2.EVAL_OFFSET - table2.TUNE_OFFSET)
    iterations: int = Field(default=100, ge=1, le=100_000, description="Adam steps (bayes-table2's)")
    range_weights: list[float] = Field(default_factory=lambda: [0.003, 0.01, 0.03, 0.1, 0.3], min_length=1,
                                       description="the range term's relative weights searched")
    seed: Seed = 0

    @field_validator("defenses")
    @classmethod
    def _table_defenses(cls, v: list[str]) -> list[str]:
        unknown = [d for d in v if d not in PUBLISHED]
        if unknown or len(set(v)) != len(v):
            raise ValueError(f"distinct defenses of Table 5: {', '.join(PUBLISHED)}")
        return v

    @field_validator("range_weights")
    @classmethod
    def _positive_distinct(cls, v: list[float]) -> list[float]:
        if any(not 0 < w <= 1e6 for w in v) or len(set(v)) != len(v):
            raise ValueError("distinct weights in (0, 1e6]")
        return sorted(v)

    @classmethod
    def quick(cls, seed: int = 0) -> "RangePriorConfig":
        return cls(dataset="digits", step=2, defenses=["gaussian", "prune+laplace"], images=2, tune_images=1,
                   iterations=4, range_weights=[0.1], seed=seed)


def _with_range(tuner: table2.Tuner, tv: InversionConfig, scale: table2.Scale, seed: int,
                weights: list[float]) -> InversionConfig:
    """The ``tv_range`` search from ``tv``'s unclamped choice: the range weight, then the TV weight with it."""
    def config(beta: float, weight: float) -> InversionConfig:
        return table2.attack_config(ATTACK, scale, seed, tv.lr, tv.lr_decay, beta, tv.layer_weighting,
                                    clamp=False, range_weight=weight)

    beta = tv.priors["tv"]
    cfg = tuner.best([config(beta, w) for w in weights])
    weight = cfg.priors["range"]
    return tuner.best([cfg] + [config(beta * f, weight) for f in scale.beta_factors])


def _paired(a: list[float], b: list[float]) -> dict:
    """``a - b`` image by image: the mean, its standard error, and on how many images ``a`` wins by > 0.01 dB."""
    diff = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    se = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else None
    return {"db": float(diff.mean()), "paired_se_db": se, "wins": int((diff > 0.01).sum()), "images": len(diff)}


def run(out: Path, config: RangePriorConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Search and attack under every defense, write ``out`` atomically; returns the results."""
    config = config or (RangePriorConfig.quick() if quick else RangePriorConfig())
    check_out(out, RANGE_PRIOR_FORMAT)
    began = time.perf_counter()
    scale = replace(table2.QUICK if quick else table2.FULL, images=config.images, tune_images=config.tune_images,
                    iterations=config.iterations)
    ds, step = config.dataset, config.step
    table2.tuned_and_reported(ds, scale, config.seed)  # a seed that draws one image into both is refused first
    searched = 2 * scale.tune_count(ATTACK) + len(config.range_weights) + len(scale.beta_factors)
    per_defense = searched * scale.tune_images + len(VARIANTS) * scale.images
    total, done = per_defense * len(config.defenses), 0

    def tick(count: int, what: str) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(what, min(done, total), total)

    rows = {}
    for n, defense in enumerate(config.defenses):
        t0 = time.perf_counter()
        tick(0, f"{defense}: training the network under the defense")
        case = table2.build_case(ds, step, defense, scale, config.seed)
        tune = table2.defended_updates(case, "tune", ds, defense, step, config.seed)
        report = table2.defended_updates(case, "eval", ds, defense, step, config.seed)
        seed = stream_seed(config.seed, ds, step, "attack")  # bayes-table2's attack starts
        tuner = table2.Tuner(None, "", lambda cfg: table2.attack_psnr(case, tune, case.tune[1], case.tune[0],
                                                                      defense, cfg),
                             lambda: tick(scale.tune_images, f"{defense}: search"))
        chosen = {"tv_clamped": table2.search(ATTACK, scale, seed, tuner),
                  "tv": table2.search(ATTACK, scale, seed, tuner, clamp=False)}
        chosen["tv_range"] = _with_range(tuner, chosen["tv"], scale, seed, config.range_weights)
        values = {}
        for variant in VARIANTS:
            values[variant] = table2.attack_psnr(case, report, case.evaluate[1], case.evaluate[0], defense,
                                                 chosen[variant])
            tick(scale.images, f"{defense}: {LABELS[variant]} on the reported digits")
        done = (n + 1) * per_defense  # the search skips configurations tried twice: the bound is reached here
        floor = psnr(constant_baseline(case.evaluate[0]), case.evaluate[0])
        rows[defense] = {
            "psnr_mean": {v: sum(values[v]) / len(values[v]) for v in VARIANTS},
            "psnr": values,
            "hyperparameters": {v: table2.hyperparameters(chosen[v]) for v in VARIANTS},
            "range_minus_tv": _paired(values["tv_range"], values["tv"]),
            "range_minus_clamped": _paired(values["tv_range"], values["tv_clamped"]),
            "baseline_psnr": float(floor.mean()),
            "train_accuracy": case.train_accuracy,
            "tuning": tuner.tried(),
            "published": PUBLISHED[defense],
            "seconds": time.perf_counter() - t0,
        }
    with atomic_dir(out, RANGE_PRIOR_FORMAT) as tmp:
        results = {"format": RANGE_PRIOR_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "scale": asdict(scale), "defenses": rows,
                   "published": {"table": "seed 001, appendix A.4, Table 5 (MNIST, step 500, L2)",
                                 "psnr_mean": PUBLISHED,
                                 "claim": "the range term improves the L2 attack under every defense"},
                   "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, results)
    return results


def _plot(path: Path, results: dict) -> None:
    """Left, Table 5 as bars: each attack's mean PSNR per defense, the published two columns as black ticks (the
    left column's over both readings of it), the no-information baseline as a grey dash. Right, what the range term
    adds, digit by digit: the mean difference from the TV-only attack and from the clamped one, with its paired
    standard error; the published difference as black ticks."""
    from leaklab.report.plots import saved_figure

    rows = results["defenses"]
    places = range(len(rows))
    title = "The pixel-range prior (seed 001, appendix A.4, Table 5)"
    with saved_figure(path, 1, 2, figsize=(11, 3.8), title=title, gridspec_kw={"width_ratios": [3, 2]}) as (
            fig, (left, right)):
        width = 0.8 / len(VARIANTS)
        for j, variant in enumerate(VARIANTS):
            xs = [i - 0.4 + width * (j + 0.5) for i in places]
            left.bar(xs, [r["psnr_mean"][variant] for r in rows.values()], width * 0.9, label=LABELS[variant])
            paper = [r["published"]["tv" if variant == "tv_clamped" else variant] for r in rows.values()]
            left.scatter(xs, paper, marker="_", s=160, color="black", zorder=3, label="seed 001" if j == 0 else None)
        left.scatter(places, [r["baseline_psnr"] for r in rows.values()], marker="_", s=600, color="grey", zorder=3,
                     label="no information")
        left.set_ylabel("PSNR (dB), mean over the digits")
        left.set_ylim(bottom=0)
        left.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        for offset, key, label in ((-0.12, "range_minus_tv", "range - TV"),
                                   (0.12, "range_minus_clamped", "range - clamped TV")):
            diffs = [r[key] for r in rows.values()]
            right.errorbar([p + offset for p in places], [d["db"] for d in diffs], fmt="o", capsize=3, label=label,
                           yerr=[d["paired_se_db"] or 0.0 for d in diffs])
        published = [r["published"]["tv_range"] - r["published"]["tv"] for r in rows.values()]
        for offset in (-0.12, 0.12):
            right.scatter([p + offset for p in places], published, marker="_", s=160, color="black", zorder=3,
                          label="seed 001: range - TV" if offset < 0 else None)
        right.axhline(0, color="grey", linewidth=0.8)
        right.set_ylabel("difference (dB), +- paired SE")
        right.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        for ax in (left, right):
            ax.set_xticks(list(places), list(rows), fontsize=8)
