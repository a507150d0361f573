"""``leaklab reproduce rnn-membership``: seed 003, chapter 3 (Figs. 3.4 and 3.8, Table 3.1) on the image task:
membership inference against a recurrent and a feed-forward classifier of nearly equal size, and the Gaussian
privacy module calibrated by the SensitivitySampler.

The thesis' image task is CIFAR-10 with a 42.7M-parameter ResNet101 and a ReNet; leaklab has no CIFAR-10 offline and
runs the same protocol on MNIST at 16x16 with two small networks: the FFNN :class:`~leaklab.models.vision.MLP`
(64-64, 21,258 parameters) and the RNN :class:`~leaklab.models.vision.RowLSTM` (rows as a sequence, 64 units, 21,642),
Adam at the thesis' learning rates (1e-3 and 1e-2). The data are cut into disjoint sets: the victim's members and
non-members (``members`` each), and the attacker's pools A and B (twice as many each), from which each of the
``shadows`` shadow models draws its members (from A) and non-members (from B) (Sec. 3.4.1).

* Vulnerability (Fig. 3.4): at every epoch count, the victim and the shadows of each architecture trained that long
  (one training, snapshots at the counts: the same networks as separate runs of that length), Shokri et al.'s
  attack (:func:`~leaklab.attacks.membership.shadow_models`) trained on the shadows and scored on the victim's
  members and non-members (50% is a guess), beside the train and test accuracy and the average prediction entropy
  H_APE (eq. 3.3) on members and non-members.
* Defense (Fig. 3.8, bottom; Table 3.1): the SensitivitySampler (Algorithm 3) with ``sampler_pairs`` pairs of
  adjacent training sets of ``members`` records drawn from the data, the victim's training algorithm (same
  initialisation and batch order) to the last epoch count; then the GPM (Algorithm 2) at each of ``sigmas`` (the
  same for both networks), with each architecture's utility loss (Definition 3.4, test accuracy), the attack's
  accuracy (its shadows perturbed the same way: the attacker knows the mechanism) and the epsilon of (eps, delta)
  random DP (Theorem 3.3) at ``delta`` with the architecture's own estimate and the sampler's confidence gamma.

Writes ``OUT/results.json``, ``OUT/membership_vs_epochs.png`` (Fig. 3.4) and ``OUT/gpm_tradeoff.png`` (Fig. 3.8)
atomically; same seed, same numbers.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leaklab import seeds
from leaklab.attacks.membership import AttackTraining, shadow_models
from leaklab.data import load_images
from leaklab.defenses.gpm import gaussian_privacy_module, utility_loss
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.io import RESULTS_FILE, RNN_MEMBERSHIP_FORMAT, atomic_dir, check_out, write_json
from leaklab.metrics import accuracy
from leaklab.models.vision import MLP, RowLSTM
from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
from leaklab.privacy.sensitivity import sensitivity_sampler

EPOCHS_FILE = "membership_vs_epochs.png"
GPM_FILE = "gpm_tradeoff.png"
ARCHS = ("FFNN", "RNN")
PUBLISHED = {  # seed 003: figures only, and Table 3.1's empirical sensitivities (n = 500, CIFAR-10)
    "table_3_1_image": {"RNN": 0.013209, "FFNN": 0.013518},
    "gamma_n500": 0.0774,
    "claims": ["the attack is more accurate against the RNN at every epoch count, in all three tasks",
               "RNNs' training entropy is lower (more confident on members); validation entropy about equal",
               "RNNs lose more utility than FFNNs under the GPM at the same sigma (and under DP-SGD)",
               "with empirical-sensitivity noise the attack falls to about 50% at under 10% utility loss"],
}


class RnnMembershipConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: Literal["mnist", "digits"] = "mnist"
    image_size: int = Field(default=16, ge=8, le=32)
    members: int = Field(default=500, ge=10, le=800, description="the victim's training set (N); as many non-members")
    shadows: int = Field(default=5, ge=1, le=20, description="shadow models (the thesis: 5 for images)")
    epochs: list[int] = Field(default_factory=lambda: [1, 2, 5, 10, 20, 40], min_length=1)
    lr_ffnn: float = Field(default=1e-3, gt=0, description="Adam (the thesis, image task)")
    lr_rnn: float = Field(default=1e-2, gt=0, description="Adam (the thesis, image task)")
    batch_size: int = Field(default=64, ge=1, le=4096)
    sampler_pairs: int = Field(default=20, ge=2, le=1000, description="Algorithm 3's n (the thesis: 500; 1 gives "
                                                                      "a confidence gamma above 1, no guarantee)")
    sigmas: list[float] = Field(default_factory=lambda: [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0], min_length=1,
                                description="the GPM's noise scales (the same for both networks)")
    delta: float = Field(default=1e-5, gt=0, lt=1)
    attack: AttackTraining = AttackTraining(epochs=60)
    seed: Seed = 0

    @field_validator("epochs", "sigmas")
    @classmethod
    def _positive_distinct(cls, v: list) -> list:
        if any(x <= 0 for x in v) or len(set(v)) != len(v):
            raise ValueError("values are distinct and positive")
        return sorted(v)

    @model_validator(mode="after")
    def _one_seed(self) -> "RnnMembershipConfig":
        """The attack networks draw from the run's seed unless their own training is given."""
        if "attack" not in self.model_fields_set:
            self.attack = self.attack.model_copy(update={"seed": self.seed})
        return self

    @classmethod
    def quick(cls, seed: int = 0) -> "RnnMembershipConfig":
        return cls(dataset="digits", image_size=8, members=60, shadows=2, epochs=[1, 3], sampler_pairs=2,
                   sigmas=[0.01, 1.0], attack=AttackTraining(epochs=5, seed=seed), seed=seed)


def build(arch: str, data, seed: int) -> torch.nn.Module:
    """The FFNN or the RNN, its initial weights drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch == "FFNN":
            return MLP(data.num_classes, 1, data.images.shape[-1], data.mean, data.std, width=64, depth=2)
        return RowLSTM(data.num_classes, 1, data.images.shape[-1], data.mean, data.std, hidden=64)


def train(arch: str, data, indices: list[int], config: RnnMembershipConfig, seed: int,
          snapshots: list[int]) -> dict[int, torch.nn.Module]:
    """The training algorithm A_H: Adam on mini-batches of ``indices`` (reshuffled every epoch by a generator of
    ``seed``), initial weights from ``seed``; a copy of the network after each epoch count in ``snapshots``."""
    model = build(arch, data, seed)
    images, labels = data.images[indices], data.labels[indices]
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr_ffnn if arch == "FFNN" else config.lr_rnn)
    order = torch.Generator().manual_seed(seeds.stream_seed(seed, "batches"))
    kept = {}
    model.train()
    for epoch in range(1, max(snapshots) + 1):
        for batch in torch.randperm(len(indices), generator=order).split(config.batch_size):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images[batch]), labels[batch]).backward()
            optimizer.step()
        if epoch in snapshots:
            kept[epoch] = copy.deepcopy(model).eval()
    return kept


@torch.no_grad()
def confidences(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    return torch.softmax(model.eval()(images), 1)


def prediction_entropy(conf: torch.Tensor) -> float:
    """H_APE (eq. 3.3): the mean entropy of the predicted distributions."""
    return float(-(conf * conf.clamp_min(1e-30).log()).sum(1).mean())


def _split(config: RnnMembershipConfig) -> dict[str, list[int]]:
    """Disjoint index ranges of the loaded images: the victim's members and non-members, the attacker's pools."""
    n = config.members
    return {"victim_in": list(range(n)), "victim_out": list(range(n, 2 * n)),
            "pool_a": list(range(2 * n, 4 * n)), "pool_b": list(range(4 * n, 6 * n))}


def _shadow_sets(split: dict, config: RnnMembershipConfig) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seeds.stream_seed(config.seed, "rnn-membership", "shadows"))
    return [(sorted(rng.choice(split["pool_a"], config.members, replace=False).tolist()),
             sorted(rng.choice(split["pool_b"], config.members, replace=False).tolist()))
            for _ in range(config.shadows)]


def _attack(victim, shadows, shadow_sets, split, data, training: AttackTraining) -> float:
    def answers(model, indices):
        return confidences(model, data.images[indices]), data.labels[indices]

    def stacked(side: int) -> tuple[torch.Tensor, torch.Tensor]:  # every shadow's members (0) or non-members (1)
        pairs = [answers(m, s[side]) for m, s in zip(shadows, shadow_sets)]
        return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])

    return shadow_models(stacked(0), stacked(1), answers(victim, split["victim_in"]),
                         answers(victim, split["victim_out"]), training)


def run(out: Path, config: RnnMembershipConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, attack, estimate the sensitivity, defend; write ``out`` atomically; returns the results."""
    config = config or (RnnMembershipConfig.quick() if quick else RnnMembershipConfig())
    check_out(out, RNN_MEMBERSHIP_FORMAT)  # before the work, not after it
    start = time.perf_counter()
    data = load_images(config.dataset, 6 * config.members, config.image_size,
                       seed=seeds.stream_seed(config.seed, "rnn-membership", "data"))
    split = _split(config)
    shadow_sets = _shadow_sets(split, config)
    last = config.epochs[-1]
    steps = len(ARCHS) * (1 + config.shadows + 2 * config.sampler_pairs)
    done = 0

    def tick(count: int = 1) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress("networks trained", done, steps)

    vulnerability, final = [], {}
    for arch in ARCHS:
        victim = train(arch, data, split["victim_in"], config, seeds.stream_seed(config.seed, arch, "victim"),
                       config.epochs)
        tick()
        shadows = []
        for k, (members, _) in enumerate(shadow_sets):
            shadows.append(train(arch, data, members, config, seeds.stream_seed(config.seed, arch, "shadow", k),
                                 config.epochs))
            tick()
        for epoch in config.epochs:
            model = victim[epoch]
            conf_in = confidences(model, data.images[split["victim_in"]])
            conf_out = confidences(model, data.images[split["victim_out"]])
            train_acc = float((conf_in.argmax(1) == data.labels[split["victim_in"]]).float().mean())
            test_acc = float((conf_out.argmax(1) == data.labels[split["victim_out"]]).float().mean())
            vulnerability.append({
                "arch": arch, "epochs": epoch, "train_accuracy": train_acc, "test_accuracy": test_acc,
                "generalization_gap": train_acc - test_acc, "entropy_members": prediction_entropy(conf_in),
                "entropy_non_members": prediction_entropy(conf_out),
                "attack_accuracy": _attack(model, [s[epoch] for s in shadows], shadow_sets, split, data,
                                           config.attack)})
        final[arch] = (victim[last], [s[last] for s in shadows])
    sampler = {}
    for arch in ARCHS:
        draws = np.random.default_rng(seeds.stream_seed(config.seed, arch, "sampler"))
        estimate = sensitivity_sampler(
            lambda idx, arch=arch: train(arch, data, list(idx), config, seeds.stream_seed(config.seed, arch,
                                                                                             "victim"), [last])[last],
            lambda count, i: draws.choice(len(data.images), count, replace=False).tolist(),
            config.sampler_pairs, config.members, progress=lambda i, n: tick(2))  # two networks per pair
        sampler[arch] = {"sensitivity": estimate.sensitivity, "samples": list(estimate.samples),
                         "gamma": estimate.gamma, "pairs": config.sampler_pairs}
    defense = []
    for sigma in config.sigmas:
        for arch in ARCHS:
            victim, shadows = final[arch]
            noise = torch.Generator().manual_seed(seeds.stream_seed(config.seed, arch, "gpm", sigma))
            noisy = gaussian_privacy_module(victim, sigma, noise)
            noisy_shadows = [gaussian_privacy_module(s, sigma, noise) for s in shadows]
            test = split["victim_out"]
            clean_acc = accuracy(victim, data.images[test], data.labels[test])
            noisy_acc = accuracy(noisy, data.images[test], data.labels[test])
            defense.append({"arch": arch, "sigma": sigma, "test_accuracy": noisy_acc,
                            "utility_loss": utility_loss(noisy_acc, clean_acc),
                            "attack_accuracy": _attack(noisy, noisy_shadows, shadow_sets, split, data, config.attack),
                            "epsilon": analytic_gaussian_epsilon(sigma, config.delta, sampler[arch]["sensitivity"])
                            if sampler[arch]["sensitivity"] > 0 else 0.0})
    parameters = {arch: sum(p.numel() for p in final[arch][0].parameters()) for arch in ARCHS}
    with atomic_dir(out, RNN_MEMBERSHIP_FORMAT) as tmp:
        results = {"format": RNN_MEMBERSHIP_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "parameters": parameters,
                   "vulnerability": vulnerability, "sampler": sampler, "defense": defense, "delta": config.delta,
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot_epochs(tmp / EPOCHS_FILE, vulnerability)
        _plot_defense(tmp / GPM_FILE, defense)
    return results


def _plot_epochs(path: Path, rows: list[dict]) -> None:
    """Fig. 3.4: the attack's accuracy and the prediction entropies against the training epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.3))
    for arch in ARCHS:
        cell = [r for r in rows if r["arch"] == arch]
        epochs = [r["epochs"] for r in cell]
        line = left.plot(epochs, [100 * r["attack_accuracy"] for r in cell], "o-", label=arch)[0]
        right.plot(epochs, [r["entropy_members"] for r in cell], "o-", color=line.get_color(),
                   label=f"{arch}, members")
        right.plot(epochs, [r["entropy_non_members"] for r in cell], "s:", color=line.get_color(),
                   label=f"{arch}, non-members")
    left.axhline(50, color="grey", linestyle=":", linewidth=0.8)
    left.set_ylabel("attack accuracy (%)")
    right.set_ylabel("prediction entropy H_APE")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("training epochs")
        ax.legend(fontsize=7)
    fig.suptitle("membership inference against an RNN and an FFNN (seed 003, Fig. 3.4; MNIST)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_defense(path: Path, rows: list[dict]) -> None:
    """Fig. 3.8, bottom row: the GPM's utility loss and the attack's accuracy against sigma."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.3))
    for arch in ARCHS:
        cell = [r for r in rows if r["arch"] == arch]
        sigmas = [r["sigma"] for r in cell]
        left.plot(sigmas, [100 * r["utility_loss"] for r in cell], "o-", label=arch)
        right.plot(sigmas, [100 * r["attack_accuracy"] for r in cell], "o-", label=arch)
    right.axhline(50, color="grey", linestyle=":", linewidth=0.8)
    left.set_ylabel("utility loss (%)")
    right.set_ylabel("attack accuracy (%)")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("GPM sigma")
        ax.legend(fontsize=7)
    fig.suptitle("the Gaussian privacy module (seed 003, Fig. 3.8 bottom; MNIST)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
