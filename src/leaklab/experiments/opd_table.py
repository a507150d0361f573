"""``leaklab reproduce opd-table``: seed 002, chapter 6, Table 6.2: the One Parameter Defense against membership
inference and model inversion through a classifier's confidence vectors.

The images of ``data`` (resized to 32x32, as the thesis) are cut into four disjoint sets of ``per_split``: the target's
training set (its members) and test set (non-members), the attacker's training and test sets (the thesis' Table 6.1
names the datasets' whole splits for both sides, which leaves its measured sets empty: leaklab keeps them apart).
The target (:class:`~leaklab.models.vision.InferenceTargetCNN`) trains on its set; the attacker's shadow model, of the
same architecture (its own initialisation and batches), on the attacker's training set. The attack models are
trained on undefended confidence vectors (the thesis: training them on defended ones did not converge) and attack
the defended interface:

* ML-Leaks (:func:`~leaklab.attacks.membership.ml_leaks`): trained on the shadow's members and non-members;
* NSH (:func:`~leaklab.attacks.membership.nsh`): the attacker knows which of its queries were members, here the first
  halves of the target's two sets (the thesis' "D_attack" sets with known membership, which Table 6.1 leaves
  undefined);
* the inversion network (:mod:`leaklab.attacks.model_inversion`): trained on the target's answers for the attacker's
  images.

Both membership attacks are scored on the second halves of the target's sets (balanced: 50% is a guess); the
inversion error (MSE, pixels in [0, 1]) on the target's training and test images. Each row: no defense, or OPD
(:mod:`leaklab.defenses.opd`) at one eps, with train and test accuracy (unchanged by construction), the mean L2
distortion of the confidence vectors and the defense's time per vector. Writes ``OUT/results.json``,
``OUT/opd_table.png`` (Figs. 6.6-6.9: the metrics against eps) and ``OUT/opd_inversions.png`` (Figs. 6.3-6.5)
atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from leaklab import seeds
from leaklab.attacks.membership import AttackTraining, ml_leaks, nsh
from leaklab.attacks.model_inversion import inversion_error, train_inversion
from leaklab.data import load_images
from leaklab.defenses.opd import one_parameter_defense
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.fields import EpsilonGrid, Seed
from leaklab.fl import train_steps
from leaklab.io import OPD_TABLE_FORMAT, RESULTS_FILE, atomic_dir, write_json
from leaklab.metrics import accuracy
from leaklab.models.vision import InferenceTargetCNN

PLOT_FILE = "opd_table.png"
IMAGES_FILE = "opd_inversions.png"
IMAGE_SIZE = 32  # the thesis resizes every dataset to 32x32; the inversion network draws 32x32 images
_POOL = {"mnist": 5000, "digits": 1797}
PUBLISHED = {  # seed 002, Table 6.2, MNIST rows: (conf. distortion, inversion error, ML-Leaks, NSH)
    "mnist": {"none": (0.0, 0.935, 0.704, 0.723), "0.1": (0.948, 0.924, 0.498, 0.503),
              "0.7": (0.783, 0.925, 0.504, 0.509), "1.4": (0.535, 0.927, 0.511, 0.516),
              "2.0": (0.328, 0.928, 0.520, 0.525), "accuracy": "99.94% train, 99.63% test, every row"},
    "claim": "membership inference falls about 20 points on MNIST and Fashion-MNIST, 15 on CIFAR-10, to near 50%",
}


class OpdTableConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data: Literal["mnist", "digits"] = "mnist"
    per_split: int = Field(default=1250, ge=4, le=1250, description="images in each of the four sets")
    width: int = Field(default=32, ge=1, le=256, description="the target's first convolution's channels")
    epochs: int = Field(default=30, ge=1, le=1000, description="the target's and the shadow's training epochs")
    lr: float = Field(default=0.01, gt=0, description="SGD (momentum 0.9) learning rate")
    batch_size: int = Field(default=64, ge=1, le=1024)
    epsilons: EpsilonGrid = Field(default_factory=lambda: [0.1, 0.7, 1.4, 2.0])
    m: int = Field(default=5, ge=1, le=1000, description="OPD's candidates per sub-range")
    sensitivity: float = Field(default=1.0, gt=0, le=100, description="OPD's Delta_u (the thesis: 1)")
    attack: AttackTraining = AttackTraining()
    inversion_width: int = Field(default=32, ge=1, le=256)
    seed: Seed = 0

    @model_validator(mode="after")
    def _one_seed(self) -> "OpdTableConfig":
        """The attack networks draw from the run's seed unless their training is given."""
        if "attack" not in self.model_fields_set:
            self.attack = AttackTraining(seed=self.seed)
        return self

    @classmethod
    def quick(cls, seed: int = 0) -> "OpdTableConfig":
        return cls(data="digits", per_split=60, width=4, epochs=3, epsilons=[0.1, 2.0],
                   attack=AttackTraining(epochs=3, seed=seed), inversion_width=4, seed=seed)


def _confidences(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(images).double(), 1)


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t[:len(t) // 2], t[len(t) // 2:]


def run(out: Path, config: OpdTableConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, defend, attack and write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (OpdTableConfig.quick() if quick else OpdTableConfig())
    start = time.perf_counter()
    n = config.per_split
    if 4 * n > _POOL[config.data]:
        raise LeaklabError(f"{config.data} holds {_POOL[config.data]} images, fewer than four sets of {n}")
    data = load_images(config.data, 4 * n, IMAGE_SIZE, seed=config.seed)
    x = [data.images[i * n:(i + 1) * n] for i in range(4)]
    y = [data.labels[i * n:(i + 1) * n] for i in range(4)]
    steps = config.epochs * -(-n // config.batch_size)
    models = []
    for name, images, labels in (("target", x[0], y[0]), ("shadow", x[2], y[2])):
        # the shadow's own initialisation and batches: a black-box attacker cannot copy the target's
        own = config.seed if name == "target" else seeds.stream_seed(config.seed, "shadow")
        torch.manual_seed(own)
        model = InferenceTargetCNN(data.num_classes, data.images.shape[1], IMAGE_SIZE, data.mean, data.std,
                                   width=config.width)
        train_steps(model, images, labels, steps, lr=config.lr, batch_size=config.batch_size, seed=own,
                    progress=None if progress is None else
                    lambda task, done, total, name=name: progress(f"{name} model: {task}", done, total))
        models.append(model)
    target, shadow = models
    members, outsiders = _confidences(target, x[0]), _confidences(target, x[1])
    shadow_in, shadow_out = _confidences(shadow, x[2]), _confidences(shadow, x[3])
    known_in, scored_in = _halves(members)
    known_out, scored_out = _halves(outsiders)
    labels_in, labels_out = _halves(y[0]), _halves(y[1])
    inverter = train_inversion(_confidences(target, x[2]).float(), x[2], config.attack, width=config.inversion_width)

    one_parameter_defense(members[:2], 1.0, torch.Generator().manual_seed(0))  # warm-up: the first call is not timed
    with atomic_dir(out, OPD_TABLE_FORMAT) as tmp:
        rows, pictures = [], {}
        settings: list[float | None] = [None, *config.epsilons]
        for k, eps in enumerate(settings):
            generator = seeds.generator(config.seed, seeds.DEFENSE, k)
            began = time.perf_counter()
            z_in, z_out = (members, outsiders) if eps is None else (
                one_parameter_defense(members, eps, generator, config.m, config.sensitivity),
                one_parameter_defense(outsiders, eps, generator, config.m, config.sensitivity))
            per_vector = (time.perf_counter() - began) / (2 * n) if eps is not None else 0.0
            z_scored_in, z_scored_out = _halves(z_in)[1], _halves(z_out)[1]  # NSH trains on undefended known ones
            row = {
                "defense": "none" if eps is None else f"OPD eps {eps}", "eps": eps,
                "train_accuracy": float((z_in.argmax(1) == y[0]).double().mean()),
                "test_accuracy": float((z_out.argmax(1) == y[1]).double().mean()),
                "distortion": float(torch.cat([z_in - members, z_out - outsiders]).norm(dim=1).mean()),
                "ml_leaks": ml_leaks(shadow_in.float(), shadow_out.float(), z_scored_in.float(),
                                     z_scored_out.float(), config.attack),
                "nsh": nsh((known_in.float(), labels_in[0]), (known_out.float(), labels_out[0]),
                           (z_scored_in.float(), labels_in[1]), (z_scored_out.float(), labels_out[1]), config.attack),
                "inversion_error_train": inversion_error(inverter, z_in.float(), x[0]),
                "inversion_error_test": inversion_error(inverter, z_out.float(), x[1]),
                "seconds_per_vector": per_vector,
            }
            rows.append(row)
            with torch.no_grad():
                pictures[row["defense"]] = inverter(z_out[:8].float())
            if progress:
                progress("defenses attacked", k + 1, len(settings))
        results = {"format": OPD_TABLE_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"),
                   "target_accuracy": {"train": accuracy(target, x[0], y[0]), "test": accuracy(target, x[1], y[1])},
                   "rows": rows, "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
        from leaklab.report.plots import image_grid

        image_grid([("private (target's test set)", x[1][:8]), *pictures.items()], tmp / IMAGES_FILE, max_cols=8,
                   title="model inversion through the prediction interface")
    return results


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    defended = [r for r in rows if r["eps"] is not None]
    eps = [r["eps"] for r in defended]
    none = rows[0]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for key, label in (("ml_leaks", "ML-Leaks"), ("nsh", "NSH")):
        line, = axes[0].plot(eps, [r[key] for r in defended], "o-", label=label)
        axes[0].axhline(none[key], color=line.get_color(), linestyle=":", linewidth=0.8)
    axes[0].axhline(0.5, color="grey", linewidth=0.8)
    axes[0].set_ylabel("membership inference accuracy")
    axes[0].legend(fontsize=7, title="dotted: no defense", title_fontsize=7)
    axes[1].plot(eps, [r["distortion"] for r in defended], "o-")
    axes[1].set_ylabel("confidence distortion (mean L2)")
    for key, label in (("inversion_error_train", "members"), ("inversion_error_test", "non-members")):
        line, = axes[2].plot(eps, [r[key] for r in defended], "o-", label=label)
        axes[2].axhline(none[key], color=line.get_color(), linestyle=":", linewidth=0.8)
    axes[2].set_ylabel("inversion error (MSE)")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("OPD eps")
    fig.suptitle("One Parameter Defense (seed 002, Table 6.2, Figs. 6.6-6.9)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
