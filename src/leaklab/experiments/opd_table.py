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

Every metric is measured on the second halves of the target's two sets, records no attack and no defense trained
on: both membership attacks' accuracy (balanced: 50% is a guess), the inversion error (MSE, pixels in [0, 1]), the
accuracy and the distortion. Each row: no defense, OPD
(:mod:`leaklab.defenses.opd`) at one eps, or one of the thesis' two baselines, MemGuard
(:mod:`leaklab.defenses.memguard`: its classifier trained on the target's answers for the first halves of its two
sets, the members and non-members the defender knows) and Purification (:mod:`leaklab.defenses.purification`: the
purifier trained on the target's answers for the first half of its test set, the defender's reference set); with
train and test accuracy, the mean L2 distortion of the confidence vectors, the defense's training time and its time
per query (answered one at a time). Writes ``OUT/results.json``,
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
from leaklab.defenses.memguard import train_memguard
from leaklab.defenses.opd import one_parameter_defense
from leaklab.defenses.purification import train_purifier
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.fields import EpsilonGrid, Seed
from leaklab.fl import train_steps
from leaklab.io import OPD_TABLE_FORMAT, RESULTS_FILE, atomic_dir, write_json
from leaklab.metrics import accuracy
from leaklab.models.vision import InferenceTargetCNN

PLOT_FILE = "opd_table.png"
IMAGES_FILE = "opd_inversions.png"
TIMED_QUERIES = 20  # vectors answered one at a time for a defense's time per query
IMAGE_SIZE = 32  # the thesis resizes every dataset to 32x32; the inversion network draws 32x32 images
_POOL = {"mnist": 5000, "digits": 1797, "photos": 1_000_000}  # photos: crops of ten photographs
PUBLISHED = {  # seed 002, Table 6.2, MNIST rows: (conf. distortion, inversion error, ML-Leaks, NSH)
    "mnist": {"none": (0.0, 0.935, 0.704, 0.723), "0.1": (0.948, 0.924, 0.498, 0.503),
              "0.7": (0.783, 0.925, 0.504, 0.509), "1.4": (0.535, 0.927, 0.511, 0.516),
              "2.0": (0.328, 0.928, 0.520, 0.525), "MemGuard": (0.392, 0.908, 0.572, 0.553),
              "Purification": (0.287, 0.925, 0.655, 0.682),
              "accuracy": "99.94% train, 99.63% test, every row but Purification's 99.87% and 99.55%",
              "hours_to_train": {"MemGuard": 1.02, "Purification": 6.31},
              "seconds_per_vector": {"OPD": 7e-05, "MemGuard": 2.53, "Purification": 1.22e-04}},
    "claim": "membership inference falls about 20 points on MNIST and Fashion-MNIST, 15 on CIFAR-10, to near 50%",
}


class OpdTableConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    data: Literal["mnist", "digits", "photos"] = Field(default="mnist", description="photos: the CIFAR-10 stand-in "
                                                                                   "(32x32 colour crops)")
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
    memguard: AttackTraining = Field(default=AttackTraining(), description="MemGuard's classifier's training")
    memguard_budget: float = Field(default=1.0, ge=0, le=2, description="MemGuard's expected L1 distortion (the "
                                                                           "thesis gives none)")
    purifier: AttackTraining = Field(default=AttackTraining(epochs=300), description="the purifier's training")
    seed: Seed = 0

    @model_validator(mode="after")
    def _one_seed(self) -> "OpdTableConfig":
        """The attack and defense networks draw from the run's seed unless their training is given."""
        if "attack" not in self.model_fields_set:
            self.attack = self.attack.model_copy(update={"seed": self.seed})
        for name in ("memguard", "purifier"):  # the defender's own streams, not the attacker's batches
            if name not in self.model_fields_set:
                setattr(self, name, getattr(self, name).model_copy(update={"seed": seeds.stream_seed(self.seed,
                                                                                                     name)}))
        if self.purifier.batch_size < 2:
            raise ValueError("the purifier trains on batches of at least 2 vectors (batch normalisation)")
        return self

    @classmethod
    def quick(cls, seed: int = 0) -> "OpdTableConfig":
        return cls(data="digits", per_split=60, width=4, epochs=3, epsilons=[0.1, 2.0],
                   attack=AttackTraining(epochs=3, seed=seed), inversion_width=4,
                   memguard=AttackTraining(epochs=3, seed=seeds.stream_seed(seed, "memguard")),
                   purifier=AttackTraining(epochs=20, seed=seeds.stream_seed(seed, "purifier")),
                   seed=seed)


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

    defenses = _defenses(config, known_in, known_out)
    x_in, x_out = _halves(x[0])[1], _halves(x[1])[1]  # the records every metric is measured on
    with atomic_dir(out, OPD_TABLE_FORMAT) as tmp:
        rows, pictures = [], {}
        for k, (name, eps, defend, training_seconds) in enumerate(defenses):
            generator = seeds.generator(config.seed, seeds.DEFENSE, k)
            z_in, z_out = defend(scored_in, generator), defend(scored_out, generator)
            row = {
                "defense": name, "eps": eps,
                "train_accuracy": float((z_in.argmax(1) == labels_in[1]).double().mean()),
                "test_accuracy": float((z_out.argmax(1) == labels_out[1]).double().mean()),
                "distortion": float(torch.cat([z_in - scored_in, z_out - scored_out]).norm(dim=1).mean()),
                "ml_leaks": ml_leaks(shadow_in.float(), shadow_out.float(), z_in.float(), z_out.float(),
                                     config.attack),
                "nsh": nsh((known_in.float(), labels_in[0]), (known_out.float(), labels_out[0]),
                           (z_in.float(), labels_in[1]), (z_out.float(), labels_out[1]), config.attack),
                "inversion_error_train": inversion_error(inverter, z_in.float(), x_in),
                "inversion_error_test": inversion_error(inverter, z_out.float(), x_out),
                "seconds_per_vector": 0.0 if name == "none" else _seconds_per_query(defend, scored_in, config.seed),
                "training_seconds": training_seconds,
            }
            rows.append(row)
            with torch.no_grad():
                pictures[row["defense"]] = inverter(z_out[:8].float())
            if progress:
                progress("defenses attacked", k + 1, len(defenses))
        results = {"format": OPD_TABLE_FORMAT, "format_version": 2, "quick": quick,
                   "config": config.model_dump(mode="json"),
                   "target_accuracy": {"train": accuracy(target, x[0], y[0]), "test": accuracy(target, x[1], y[1])},
                   "rows": rows, "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
        from leaklab.report.plots import image_grid

        image_grid([("private (target's test set)", x_out[:8]), *pictures.items()], tmp / IMAGES_FILE, max_cols=8,
                   title="model inversion through the prediction interface")
    return results


def _seconds_per_query(defend, vectors: torch.Tensor, seed: int) -> float:
    """The defense's mean time to answer one query, over ``TIMED_QUERIES`` vectors answered one at a time (the
    thesis' "Test (s)"; a batch would share MemGuard's optimisation among its vectors)."""
    generator = seeds.generator(seed, "opd-table-timing")
    defend(vectors[:1], generator)  # warm-up: the first call is not timed
    began = time.perf_counter()
    for vector in vectors[:TIMED_QUERIES]:
        defend(vector[None], generator)
    return (time.perf_counter() - began) / min(TIMED_QUERIES, len(vectors))


def _defenses(config: OpdTableConfig, known_in: torch.Tensor, known_out: torch.Tensor) -> list[tuple]:
    """Every row's defense: (name, eps or None, defend(confidences, generator), seconds its training took): none,
    OPD at each eps, MemGuard and Purification trained on the target's answers the defender knows."""
    rows: list[tuple] = [("none", None, lambda y, generator: y, 0.0)]
    rows += [(f"OPD eps {eps}", eps, lambda y, generator, eps=eps: one_parameter_defense(
        y, eps, generator, config.m, config.sensitivity), 0.0) for eps in config.epsilons]
    began = time.perf_counter()
    memguard = train_memguard(known_in, known_out, config.memguard, budget=config.memguard_budget)
    rows.append(("MemGuard", None, memguard.defend, time.perf_counter() - began))
    began = time.perf_counter()
    purifier = train_purifier(known_out, config.purifier)
    rows.append(("Purification", None, lambda y, generator: purifier.purify(y), time.perf_counter() - began))
    return rows


def _plot(path: Path, rows: list[dict]) -> None:
    from leaklab.report.plots import saved_figure

    defended = [r for r in rows if r["defense"].startswith("OPD")]
    eps = [r["eps"] for r in defended]
    none = rows[0]
    with saved_figure(path, 1, 4, figsize=(14, 3.2), gridspec_kw={"width_ratios": [1, 1, 1, 1.2]}) as (fig, axes):
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
        for ax in axes[:3]:
            ax.set_xlabel("OPD eps")
        names = [r["defense"].replace("OPD eps ", "OPD ") for r in rows]
        places = range(len(rows))
        axes[3].bar([p - 0.2 for p in places], [r["ml_leaks"] for r in rows], 0.4, label="ML-Leaks")
        axes[3].bar([p + 0.2 for p in places], [r["nsh"] for r in rows], 0.4, label="NSH")
        axes[3].axhline(0.5, color="grey", linewidth=0.8)
        scores = [r[key] for r in rows for key in ("ml_leaks", "nsh")]
        axes[3].set_ylim(min(0.4, min(scores) - 0.02), max(0.6, max(scores) + 0.02))
        axes[3].set_xticks(list(places), names, rotation=45, ha="right", fontsize=7)
        axes[3].set_ylabel("membership inference accuracy")
        axes[3].legend(fontsize=7)
        fig.suptitle("One Parameter Defense and the thesis' baselines (seed 002, Table 6.2, Figs. 6.6-6.9)",
                     fontsize=10)
