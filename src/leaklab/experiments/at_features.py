"""``leaklab reproduce at-features``: seed 004 (Zhang, Chen, Li), adversarial training makes a federated
client's batch gradient give away each sample's feature, and the features give away the images.

For each training (vanilla, then Madry's L2 adversarial training at each ``eps``, :mod:`leaklab.fl.adversarial`)
the same network is trained from the same initialisation on the same images, then attacked:

* Feature restoration (section 5.2, Figs. 3 and 4 left): each anchor image joins ``batches_per_anchor`` random
  batches of ``N`` images of distinct labels (the paper's assumption); the client sends the FedSGD gradient of
  the batch (of its adversarial examples, when it trains adversarially, at the training's ``eps``); the attacker
  reads the labels off the rows' smallest entries (eq. 5) and takes the anchor's label row as its feature
  (eq. 4). Quality: the cosine with the feature of the input the client trained on, best of the anchor's batches
  (the paper's best case); an anchor whose label was not read scores 0. Beside it, the same for the row's
  nonnegative part (leaklab's reading, :func:`~leaklab.attacks.inversion.features.nonnegative_part`, which the
  image step inverts).
* Image reconstruction (section 5.3, Fig. 5): one batch of ``image_batch_size`` distinct labels attacked end to
  end (:func:`~leaklab.attacks.inversion.features.feature_attack`); PSNR and SSIM against the private (clean)
  images beside the no-information baseline. The paper scores with LPIPS, whose network weights cannot be
  loaded here (no downloads).

The client computes with BatchNorm on the running statistics the server sent (``train_mode=False``), so that a
sample's feature does not depend on its batch. Writes ``OUT/results.json``, ``OUT/at_features.png`` (Figs. 3
and 4) and ``OUT/at_images.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab.attacks.inversion.config import FeatureInversionConfig
from leaklab.attacks.inversion.features import (distinct_labels, feature_attack, feature_map, nonnegative_part,
                                                restore_features)
from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.fl import AdversarialConfig, adversarial_examples, fedsgd_update, train_steps
from leaklab.io import AT_FEATURES_FORMAT, RESULTS_FILE, atomic_dir, write_json
from leaklab.metrics import accuracy, constant_baseline, psnr, ssim
from leaklab.metrics.vectors import mean_of, median_of
from leaklab.models import ModelSpec, build_model
from leaklab.threat import Capabilities, make_view

PLOT_FILE = "at_features.png"
IMAGES_FILE = "at_images.png"
TEST_IMAGES_MIN = 10  # held-out images that score the accuracies, beside the anchors (at most 1,000 are used)
NEARLY_PERFECT = 0.95  # the cosine the paper's "restored nearly perfectly (~1.0 cosine similarity)" is read as
_POOL = {"mnist": 5000, "digits": 1797}
PUBLISHED = {  # seed 004, section 5.2 and Fig. 3 (ImageNet, 5,000 anchors, best of 5 batches of 256)
    "rn18_batch256_nearly_perfect": {"adversarial": "about 3,500 of 5,000 (70%)",
                                     "vanilla": "fewer than 1,000 of 5,000 (under 20%)"},
    "at_batch256_nearly_perfect_range": "at least 1,000 (WRN50x4) to 4,000 (VGG16) of 5,000",
    "trend": "restoration improves as the adversarial training's eps grows (Fig. 4 left) and as the batch shrinks",
    "lpips_rn50_batch256": 0.4424,
}


class AtFeaturesConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data: Literal["mnist", "digits"] = "mnist"
    image_size: int = Field(default=28, ge=8, le=64)
    model: Literal["resnet18", "cnn", "convnet", "mlp"] = "resnet18"
    width: int = Field(default=16, ge=1, le=256)
    train_images: int = Field(default=4000, ge=2)
    train_steps: int = Field(default=200, ge=0, le=100_000)
    lr: float = Field(default=0.05, gt=0, description="SGD (momentum 0.9) learning rate")
    train_batch_size: int = Field(default=64, ge=1, le=1024)
    epsilons: list[float] = Field(default_factory=lambda: [0.0, 1.0, 2.0, 3.0], min_length=1,
                                  description="L2 radii of the adversarial training; 0 is vanilla training")
    pgd_steps: int = Field(default=7, ge=1, le=100)
    batch_sizes: list[int] = Field(default_factory=lambda: [2, 5, 10], min_length=1)
    anchors: int = Field(default=50, ge=1, le=5000)
    batches_per_anchor: int = Field(default=5, ge=1, le=100)
    image_batch_size: int = Field(default=10, ge=1)
    inversion: FeatureInversionConfig = FeatureInversionConfig(iterations=1000, restarts=2)
    seed: Seed = 0

    @field_validator("epsilons")
    @classmethod
    def _epsilons(cls, v: list[float]) -> list[float]:
        if any(e < 0 or e > 1000 for e in v) or len(set(v)) != len(v):
            raise ValueError("epsilons are distinct L2 radii from 0 (vanilla) to 1000")
        return sorted(v)

    @classmethod
    def quick(cls, seed: int = 0) -> "AtFeaturesConfig":
        return cls(data="digits", image_size=8, model="cnn", width=8, train_images=300, train_steps=20,
                   epsilons=[0.0, 1.0], pgd_steps=2, batch_sizes=[3], anchors=4, batches_per_anchor=2,
                   image_batch_size=3, inversion=FeatureInversionConfig(iterations=20, restarts=1), seed=seed)


def _adversarial(config: AtFeaturesConfig, eps: float) -> AdversarialConfig | None:
    return AdversarialConfig(eps=eps, steps=config.pgd_steps) if eps > 0 else None


def _label(eps: float) -> str:
    return "vanilla" if eps == 0 else f"AT eps {eps:g}"


def _distinct_batch(anchor: int, labels: torch.Tensor, size: int, generator: torch.Generator) -> list[int]:
    """The anchor and ``size - 1`` other pool images, all of distinct labels, chosen by ``generator``."""
    chosen, seen = [anchor], {int(labels[anchor])}
    for i in torch.randperm(len(labels), generator=generator).tolist():
        if len(chosen) == size:
            break
        if int(labels[i]) not in seen:
            chosen.append(i)
            seen.add(int(labels[i]))
    return chosen


def restoration(model: torch.nn.Module, config: AtFeaturesConfig, eps: float, pool: torch.Tensor,
                pool_labels: torch.Tensor, size: int, progress: ProgressFn | None = None) -> dict:
    """Best-of-batches cosine of each anchor's restored feature, and how often its label was read (``model`` is
    put in eval mode: the client and the features use the running BatchNorm statistics)."""
    model.eval()
    adversarial = _adversarial(config, eps)
    features = feature_map(model)
    generator = torch.Generator().manual_seed(config.seed * 1000 + size)
    best, kept, labels_read = [], [], 0
    for a in range(config.anchors):
        scores = []
        for _ in range(config.batches_per_anchor):
            idx = _distinct_batch(a, pool_labels, size, generator)
            x, y = pool[idx], pool_labels[idx]
            update = fedsgd_update(model, x, y, train_mode=False, adversarial=adversarial)
            read = distinct_labels(model, update, size)
            if int(y[0]) not in read.tolist():
                scores.append((0.0, 0.0))
                continue
            labels_read += 1
            inputs = x if adversarial is None else adversarial_examples(model, x, y, adversarial)
            with torch.no_grad():
                truth = features(inputs[:1]).double()
            restored = restore_features(model, update, y[:1])
            scores.append((float(F.cosine_similarity(restored, truth)),
                           float(F.cosine_similarity(nonnegative_part(restored), truth))))
        best.append(max(s[0] for s in scores))
        kept.append(max(s[1] for s in scores))
        if progress:
            progress(f"{_label(eps)}, batch {size}", a + 1, config.anchors)
    return {"batch_size": size, "cosine_mean": mean_of(best), "cosine_median": median_of(best),
            "nearly_perfect": mean_of([float(c >= NEARLY_PERFECT) for c in best]),
            "label_read": labels_read / (config.anchors * config.batches_per_anchor), "cosines": best,
            "nonnegative": {"cosine_mean": mean_of(kept), "cosine_median": median_of(kept),
                            "nearly_perfect": mean_of([float(c >= NEARLY_PERFECT) for c in kept]), "cosines": kept}}


def _pairing(read: torch.Tensor, true: torch.Tensor) -> list[int]:
    """For each true label, the index of the reconstruction made for it: the one of its label where it was read,
    the ones of misread labels, in order, for the others (no slot is scored on a stand-in image)."""
    slot = {int(c): i for i, c in enumerate(read)}  # distinct, as eq. 5's rule reads them
    matched = {int(c) for c in true} & set(slot)
    spare = iter(i for c, i in slot.items() if c not in matched)
    return [slot[int(c)] if int(c) in matched else next(spare) for c in true]


def images_from_features(model: torch.nn.Module, spec: ModelSpec, config: AtFeaturesConfig, eps: float,
                         pool: torch.Tensor, pool_labels: torch.Tensor,
                         progress: ProgressFn | None = None) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The whole attack on one batch of distinct labels; returns its row and (truth, reconstruction)."""
    generator = torch.Generator().manual_seed(config.seed)
    idx = _distinct_batch(0, pool_labels, config.image_batch_size, generator)
    x, y = pool[idx], pool_labels[idx]
    update = fedsgd_update(model, x, y, train_mode=False, adversarial=_adversarial(config, eps))
    view = make_view(spec, model.state_dict(), update.metadata, Capabilities())
    rec = feature_attack(view, update, config.inversion, progress=None if progress is None else
                         lambda done, total: progress(f"{_label(eps)}: images", done, total))
    images = rec.images[_pairing(rec.labels, y)]
    p, s, base = psnr(images, x), ssim(images, x), psnr(constant_baseline(x), x)
    return ({"psnr_mean": float(p.mean()), "ssim_mean": float(s.mean()), "psnr_baseline_mean": float(base.mean()),
             "ssim_baseline_mean": float(ssim(constant_baseline(x), x).mean()), "psnr": p.tolist(),
             "labels_correct": float(torch.equal(torch.sort(rec.labels).values, torch.sort(y).values)),
             "seconds": rec.seconds}, x, images)


def run(out: Path, config: AtFeaturesConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, attack and write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (AtFeaturesConfig.quick() if quick else AtFeaturesConfig())
    pool_size = _POOL[config.data] - config.train_images
    if pool_size < config.anchors + TEST_IMAGES_MIN:
        raise LeaklabError(f"{config.data} holds {_POOL[config.data]} images: {config.train_images} train images "
                           f"leave {pool_size}, fewer than the {config.anchors} anchors and {TEST_IMAGES_MIN} test "
                           "images")
    if max(config.batch_sizes + [config.image_batch_size]) > 10:
        raise LeaklabError(f"{config.data} has 10 classes: a batch of distinct labels holds at most 10 images")
    start = time.perf_counter()
    data = load_images(config.data, _POOL[config.data], config.image_size, seed=config.seed)
    x, y = data.images[:config.train_images], data.labels[:config.train_images]
    pool, pool_labels = data.images[config.train_images:], data.labels[config.train_images:]
    spec = ModelSpec(name=config.model, num_classes=data.num_classes, in_channels=data.images.shape[1],
                     image_size=config.image_size, width=config.width, mean=data.mean, std=data.std)
    strongest = _adversarial(config, max(max(config.epsilons), 1.0))
    with atomic_dir(out, AT_FEATURES_FORMAT) as tmp:
        rows, pictures = [], {}
        for eps in config.epsilons:
            began = time.perf_counter()
            model = build_model(spec, seed=config.seed)
            train_steps(model, x, y, config.train_steps, lr=config.lr, batch_size=config.train_batch_size,
                        seed=config.seed, adversarial=_adversarial(config, eps),
                        progress=None if progress is None else
                        lambda task, done, total, eps=eps: progress(f"{_label(eps)}: {task}", done, total))
            trained = time.perf_counter() - began
            test = pool[config.anchors:][:1000], pool_labels[config.anchors:][:1000]
            row = {"eps": eps, "training": _label(eps), "train_seconds": trained,
                   "clean_accuracy": accuracy(model, *test),
                   "robust_accuracy": accuracy(model, adversarial_examples(model, *test, strongest), test[1]),
                   "restoration": [restoration(model, config, eps, pool, pool_labels, n, progress)
                                   for n in config.batch_sizes]}
            row["images"], truth, pictures[_label(eps)] = images_from_features(model, spec, config, eps, pool,
                                                                               pool_labels, progress)
            pictures["private"] = truth
            rows.append(row)
        results = {"format": AT_FEATURES_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "robust_accuracy_eps": strongest.eps,
                   "nearly_perfect_cosine": NEARLY_PERFECT, "rows": rows, "published": PUBLISHED,
                   "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
        from leaklab.report.plots import image_grid

        captions = [None, *([f"{p:.1f} dB" for p in r["images"]["psnr"]] for r in rows)]
        image_grid([("private", pictures["private"]), *((r["training"], pictures[r["training"]]) for r in rows)],
                   tmp / IMAGES_FILE, captions=captions, max_cols=10,
                   title="images from restored features (PSNR against the private image)")
    return results


def _plot(path: Path, rows: list[dict]) -> None:
    from leaklab.report.plots import saved_figure

    sizes = [r["batch_size"] for r in rows[0]["restoration"]]
    with saved_figure(path, 1, len(sizes) + 1, figsize=(3.4 * (len(sizes) + 1), 3.2)) as (fig, axes):
        for ax, k in zip(axes, range(len(sizes))):
            for row in rows:
                cell = row["restoration"][k]
                cos = sorted(cell["cosines"], reverse=True)
                line, = ax.plot(range(1, len(cos) + 1), cos, label=row["training"])
                kept = sorted(cell["nonnegative"]["cosines"], reverse=True)
                ax.plot(range(1, len(kept) + 1), kept, "--", color=line.get_color(), linewidth=0.8)
            ax.set_title(f"batch of {sizes[k]} (Fig. 3; dashed: rows' nonnegative part)", fontsize=8)
            ax.set_xlabel("anchors, best restored first")
            ax.set_ylabel("cosine with the true feature")
            ax.set_ylim(-1.05, 1.05)
        axes[0].legend(fontsize=7)
        ax = axes[-1]
        for k, size in enumerate(sizes):
            ax.plot([r["eps"] for r in rows], [r["restoration"][k]["cosine_mean"] for r in rows], "o-",
                    label=f"batch {size}")
        ax.set_xlabel("adversarial training eps (0: vanilla)")
        ax.set_ylabel("mean cosine")
        ax.set_title("restoration vs eps (Fig. 4 left)", fontsize=9)
        ax.legend(fontsize=7)
