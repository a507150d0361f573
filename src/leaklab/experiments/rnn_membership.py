"""``leaklab reproduce rnn-membership``: seed 003, chapter 3 (Figs. 3.4, 3.6-3.8, Table 3.1) on the image task:
membership inference against a recurrent and a feed-forward classifier of nearly equal size, how long each remembers
its members, and three defenses: activation regularisation, DP-SGD, and the Gaussian privacy module calibrated by the
SensitivitySampler.

The thesis' image task is CIFAR-10 with a 42.7M-parameter ResNet101 and a ReNet; leaklab has no CIFAR-10 offline and
runs the same protocol on MNIST at 16x16 with two small networks: the FFNN :class:`~leaklab.models.vision.MLP`
(64-64, 21,258 parameters) and the RNN :class:`~leaklab.models.vision.RowLSTM` (rows as a sequence, 64 units, 21,642),
Adam at the thesis' learning rates (1e-3 and 1e-2; :mod:`leaklab.experiments.rnn_training`). The data are cut into
disjoint sets: the victim's members and non-members (``members`` each), and the attacker's pools A and B (twice as
many each), from which each of the ``shadows`` shadow models draws its members (from A) and non-members (from B)
(Sec. 3.4.1). Every attack is Shokri et al.'s (:func:`~leaklab.attacks.membership.shadow_models`), its shadows
trained by the victim's algorithm (the attacker knows it, defenses included), scored on as many members as
non-members (50% is a guess).

* Vulnerability (Fig. 3.4): at every epoch count, the victim and the shadows of each architecture trained that long
  (one training, snapshots at the counts: the same networks as separate runs of that length), the attack beside the
  train and test accuracy and the average prediction entropy H_APE (eq. 3.3) on members and non-members.
* Memorisation (Fig. 3.6, Sec. 3.4.3): the members cut into ``memory_chunks`` disjoint chunks in a random order, one
  network trained on each chunk in turn for ``memory_epochs`` epochs; per chunk, the attack trained on the shadows'
  same chunk (trained alike) and scored on the victim's chunk against as many of its non-members, over
  ``memory_runs`` runs; and the victim's accuracy on every chunk after each chunk's training (the top row). The
  thesis leaves the chunk count, the epochs per chunk and the attack's training open; an
  attack per chunk (its attacker knows a record's place in the order) measures what the network still remembers of
  each, as the thesis' separate attack per epoch count does for Fig. 3.4.
* Regularisation (Fig. 3.7, Sec. 3.5.1): at each of ``penalties``, both networks trained to the last epoch count with
  the l2 penalty on their node activations (the text's reading; the section's title says weights).
* DP-SGD (Fig. 3.8, top; eqs. 3.7-3.8): at each of ``dp_noise``, both networks trained by DP-SGD (opacus; the same
  Adam, clip ``dp_clip``, Poisson sampling at rate 1 / ceil(members / batch_size), the last epoch count's epochs;
  :func:`~leaklab.experiments.rnn_training.private_schedule`), so both spend the same (eps, delta), accounted before
  any training; utility loss (Definition 3.4) against the unprotected victim.
* The Gaussian privacy module (Fig. 3.8, bottom; Table 3.1): the SensitivitySampler (Algorithm 3) with
  ``sampler_pairs`` pairs of adjacent training sets of ``members`` records drawn from the data, the victim's training
  algorithm (same initialisation and batch order) to the last epoch count; then the GPM (Algorithm 2) at each of
  ``sigmas`` (the same for both networks), with each architecture's utility loss, the attack's accuracy and the
  epsilon of (eps, delta) random DP (Theorem 3.3) at ``delta`` with the architecture's own estimate and the
  sampler's confidence gamma.

Writes ``OUT/results.json`` and one picture per section (:mod:`leaklab.experiments.rnn_figures`) atomically; same
seed, same numbers.
"""

from __future__ import annotations

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
from leaklab.experiments import rnn_figures as figures
from leaklab.experiments.rnn_training import (PENALISED, Penalised, confidences, prediction_entropy,
                                              private_schedule, train, train_in_turn, train_private)
from leaklab.fields import PositiveCounts, PositiveGrid, Seed
from leaklab.io import RESULTS_FILE, RNN_MEMBERSHIP_FORMAT, atomic_dir, check_out, write_json
from leaklab.metrics import accuracy
from leaklab.privacy.dpsgd import spent_epsilon
from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
from leaklab.privacy.sensitivity import sensitivity_sampler

EPOCHS_FILE = "membership_vs_epochs.png"
MEMORISATION_FILE = "memorisation.png"
REGULARISATION_FILE = "regularisation.png"
DP_SGD_FILE = "dp_sgd_tradeoff.png"
GPM_FILE = "gpm_tradeoff.png"
ARCHS = figures.ARCHS
MIN_DP_NOISE = 0.3  # epsilon 267 at the defaults (q = 1/8, 320 steps, delta 1e-5) in 7 s; at 0.2, inf after 22 s
PUBLISHED = {  # seed 003: figures only, and Table 3.1's empirical sensitivities (n = 500, CIFAR-10)
    "table_3_1_image": {"RNN": 0.013209, "FFNN": 0.013518},
    "gamma_n500": 0.0774,
    "claims": ["the attack is more accurate against the RNN at every epoch count, in all three tasks",
               "RNNs' training entropy is lower (more confident on members); validation entropy about equal",
               "trained on batches in turn, the FFNN forgets old batches (attack near 50%), the RNN does not",
               "the FFNN's attack accuracy is highly sensitive to the activation penalty, the RNN's only marginally",
               "RNNs lose more utility than FFNNs under DP-SGD at the same (eps, delta) and under the GPM at the same "
               "sigma",
               "with empirical-sensitivity noise the attack falls to about 50% at under 10% utility loss"],
}


class RnnMembershipConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: Literal["mnist", "digits"] = "mnist"
    image_size: int = Field(default=16, ge=8, le=32)
    members: int = Field(default=500, ge=10, le=800, description="the victim's training set (N); as many non-members")
    shadows: int = Field(default=5, ge=1, le=20, description="shadow models (the thesis: 5 for images)")
    epochs: PositiveCounts = Field(default_factory=lambda: [1, 2, 5, 10, 20, 40], min_length=1)
    lr_ffnn: float = Field(default=1e-3, gt=0, description="Adam (the thesis, image task)")
    lr_rnn: float = Field(default=1e-2, gt=0, description="Adam (the thesis, image task)")
    batch_size: int = Field(default=64, ge=1, le=4096)
    memory_chunks: int = Field(default=5, ge=2, le=20, description="disjoint chunks of the members, trained in turn")
    memory_epochs: int = Field(default=20, ge=1, le=1000, description="epochs on each chunk before the next")
    memory_runs: int = Field(default=3, ge=1, le=20, description="memorisation runs (chunk orders, initialisations)")
    penalties: PositiveGrid = Field(default_factory=lambda: [1e-4, 1e-3, 1e-2, 3e-2, 1e-1], min_length=1,
                                   description="the l2 penalties lambda (the thesis gives no grid)")
    penalised: list[Penalised] = Field(default_factory=lambda: list(PENALISED), min_length=1,
                                       description="what the l2 penalty takes: the text's node activations, the "
                                                   "title's weights, or both")
    dp_noise: PositiveGrid = Field(default_factory=lambda: [0.7, 1.0, 2.0, 4.0], min_length=1,
                                  description=f"DP-SGD's noise multipliers, each >= {MIN_DP_NOISE} (the thesis gives "
                                              "no grid)")
    dp_clip: float = Field(default=1.0, gt=0, description="DP-SGD's per-sample clipping norm C")
    sampler_pairs: int = Field(default=20, ge=2, le=1000, description="Algorithm 3's n (the thesis: 500; 1 gives "
                                                                      "a confidence gamma above 1, no guarantee)")
    sigmas: PositiveGrid = Field(default_factory=lambda: [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0], min_length=1,
                                description="the GPM's noise scales (the same for both networks)")
    delta: float = Field(default=1e-5, gt=0, lt=1)
    attack: AttackTraining = AttackTraining(epochs=60)
    seed: Seed = 0

    @field_validator("penalised")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError("values are distinct")
        return v

    @field_validator("dp_noise")
    @classmethod
    def _accountable(cls, v: list) -> list:
        if min(v) < MIN_DP_NOISE:
            raise ValueError(f"noise multipliers below {MIN_DP_NOISE} spend an epsilon in the hundreds or more, and "
                             "the accountant's grid outgrows this machine's memory")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "RnnMembershipConfig":
        """Every chunk holds a record; the attack networks draw from the run's seed unless their own training is
        given."""
        if self.memory_chunks > self.members:
            raise ValueError(f"memory_chunks ({self.memory_chunks}) exceeds members ({self.members})")
        if "attack" not in self.model_fields_set:
            self.attack = self.attack.model_copy(update={"seed": self.seed})
        return self

    @classmethod
    def quick(cls, seed: int = 0) -> "RnnMembershipConfig":
        return cls(dataset="digits", image_size=8, members=60, shadows=2, epochs=[1, 3], memory_chunks=2,
                   memory_epochs=2, memory_runs=2, penalties=[0.01], dp_noise=[1.0], sampler_pairs=2,
                   sigmas=[0.01, 1.0],
                   attack=AttackTraining(epochs=5, seed=seed), seed=seed)


Sets = list[tuple[list[int], list[int]]]  # per shadow model: (members, non-members)


def _split(config: RnnMembershipConfig) -> dict[str, list[int]]:
    """Disjoint index ranges of the loaded images: the victim's members and non-members, the attacker's pools."""
    n = config.members
    return {"victim_in": list(range(n)), "victim_out": list(range(n, 2 * n)),
            "pool_a": list(range(2 * n, 4 * n)), "pool_b": list(range(4 * n, 6 * n))}


def _shadow_sets(split: dict, config: RnnMembershipConfig) -> Sets:
    rng = np.random.default_rng(seeds.stream_seed(config.seed, "rnn-membership", "shadows"))
    return [(sorted(rng.choice(split["pool_a"], config.members, replace=False).tolist()),
             sorted(rng.choice(split["pool_b"], config.members, replace=False).tolist()))
            for _ in range(config.shadows)]


def _attack(victim, shadows, shadow_sets: Sets, target: tuple[list[int], list[int]], data,
            training: AttackTraining) -> float:
    """Shokri et al.'s attack trained on the shadows' answers on their (members, non-members) and scored on the
    victim's answers on ``target`` (members, non-members)."""
    def answers(model, indices):
        return confidences(model, data.images[indices]), data.labels[indices]

    def stacked(side: int) -> tuple[torch.Tensor, torch.Tensor]:  # every shadow's members (0) or non-members (1)
        pairs = [answers(m, s[side]) for m, s in zip(shadows, shadow_sets)]
        return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])

    return shadow_models(stacked(0), stacked(1), answers(victim, target[0]), answers(victim, target[1]), training)


def _scored(victim, shadows, shadow_sets: Sets, split: dict, data, training: AttackTraining) -> dict:
    """The victim's accuracy and prediction entropy on its members and non-members, and the attack's accuracy."""
    members, others = split["victim_in"], split["victim_out"]
    conf_in, conf_out = confidences(victim, data.images[members]), confidences(victim, data.images[others])
    train_acc = float((conf_in.argmax(1) == data.labels[members]).float().mean())
    test_acc = float((conf_out.argmax(1) == data.labels[others]).float().mean())
    return {"train_accuracy": train_acc, "test_accuracy": test_acc, "generalization_gap": train_acc - test_acc,
            "entropy_members": prediction_entropy(conf_in), "entropy_non_members": prediction_entropy(conf_out),
            "attack_accuracy": _attack(victim, shadows, shadow_sets, (members, others), data, training)}


def _chunks(indices: list[int], count: int, rng: np.random.Generator) -> list[list[int]]:
    """``indices`` in a random order cut into ``count`` disjoint chunks of (nearly) equal size."""
    return [chunk.tolist() for chunk in np.array_split(rng.permutation(indices), count)]


class _Run:
    """One reproduction: the data, the splits, the progress count; each section a method."""

    def __init__(self, config: RnnMembershipConfig, progress: ProgressFn | None):
        self.config = config
        self.progress = progress
        self.data = load_images(config.dataset, 6 * config.members, config.image_size,
                                seed=seeds.stream_seed(config.seed, "rnn-membership", "data"))
        self.split = _split(config)
        self.shadow_sets = _shadow_sets(self.split, config)
        networks = 1 + config.shadows  # a victim and its shadows, per architecture and setting
        settings = (1 + config.memory_runs + len(config.penalties) * len(config.penalised)
                    + len(config.dp_noise))  # vulnerability, memorisation, regularisation, DP-SGD
        self.steps = len(ARCHS) * (networks * settings + 2 * config.sampler_pairs)
        self.done = 0
        self.unprotected_accuracy: dict[str, float] = {}  # each last-epoch victim's test accuracy, the reference
        rate, steps = private_schedule(config.members, config)  # accounted before any training
        self.dp_spent = {noise: {"epsilon": spent_epsilon(rate, noise, steps, config.delta), "sample_rate": rate,
                                 "steps": steps} for noise in config.dp_noise}

    def tick(self, count: int = 1) -> None:
        self.done += count
        if self.progress is not None:
            self.progress("networks trained", self.done, self.steps)

    def seed(self, arch: str, *role: object) -> int:
        return seeds.stream_seed(self.config.seed, arch, *role)

    def accuracy(self, model, indices: list[int]) -> float:
        return accuracy(model, self.data.images[indices], self.data.labels[indices])

    def victim_and_shadows(self, arch: str, trainer, victim_data=None, shadow_data=None, role: tuple = (),
                           victim_trainer=None) -> tuple[object, list]:
        """``trainer(data, seed)`` run for the victim (``victim_trainer`` instead, if given: one that watches it)
        and for each shadow; their data default to their members, their seeds are those of the unprotected networks
        unless ``role`` names others."""
        victim_data = self.split["victim_in"] if victim_data is None else victim_data
        shadow_data = [members for members, _ in self.shadow_sets] if shadow_data is None else shadow_data
        victim = (victim_trainer or trainer)(victim_data, self.seed(arch, *role, "victim"))
        self.tick()
        shadows = []
        for k, own in enumerate(shadow_data):
            shadows.append(trainer(own, self.seed(arch, *role, "shadow", k)))
            self.tick()
        return victim, shadows

    def vulnerability(self) -> tuple[list[dict], dict]:
        """Fig. 3.4; also the last epoch count's networks of each architecture, the other sections' reference."""
        config, rows, final = self.config, [], {}
        for arch in ARCHS:
            victim, shadows = self.victim_and_shadows(
                arch, lambda idx, seed, arch=arch: train(arch, self.data, idx, config, seed, config.epochs))
            for epoch in config.epochs:
                rows.append({"arch": arch, "epochs": epoch, **_scored(victim[epoch], [s[epoch] for s in shadows],
                                                                      self.shadow_sets, self.split, self.data,
                                                                      config.attack)})
            final[arch] = (victim[config.epochs[-1]], [s[config.epochs[-1]] for s in shadows])
            self.unprotected_accuracy[arch] = self.accuracy(final[arch][0], self.split["victim_out"])
        return rows, final

    def memorisation(self) -> tuple[list[dict], dict]:
        """Fig. 3.6: each network trained on its members' chunks in turn, ``memory_runs`` times (each run its own
        chunks, order and initialisations); the attack per chunk, its accuracy averaged over the runs (bottom row);
        the victim's accuracy on every chunk and on its non-members after each chunk's training, averaged over the
        runs (top row)."""
        config, chunks = self.config, self.config.memory_chunks
        scores = {(arch, k): [] for arch in ARCHS for k in range(chunks)}
        during = {arch: [] for arch in ARCHS}  # per run: after each chunk, the accuracy on every chunk and on tests
        for run in range(config.memory_runs):
            rng = np.random.default_rng(seeds.stream_seed(config.seed, "rnn-membership", "memorisation", run))
            victim_chunks = (_chunks(self.split["victim_in"], chunks, rng), _chunks(self.split["victim_out"], chunks,
                                                                                     rng))
            shadow_chunks = [(_chunks(members, chunks, rng), _chunks(others, chunks, rng))
                             for members, others in self.shadow_sets]
            for arch in ARCHS:
                seen: list[list[float]] = []

                def measure(model, chunks_in=victim_chunks[0], seen=seen) -> None:  # Fig. 3.6, top row
                    seen.append([self.accuracy(model, c) for c in chunks_in + [self.split["victim_out"]]])

                victim, shadows = self.victim_and_shadows(
                    arch, lambda parts, seed, arch=arch: train_in_turn(arch, self.data, parts, config, seed),
                    victim_chunks[0], [c[0] for c in shadow_chunks], role=("memorisation", run),
                    victim_trainer=lambda parts, seed, arch=arch, measure=measure: train_in_turn(
                        arch, self.data, parts, config, seed, measure))
                during[arch].append(seen)
                for k in range(chunks):
                    members = victim_chunks[0][k]
                    conf = confidences(victim, self.data.images[members])
                    scores[arch, k].append((
                        self.accuracy(victim, members), prediction_entropy(conf),
                        _attack(victim, shadows, [(c[0][k], c[1][k]) for c in shadow_chunks],
                                (members, victim_chunks[1][k]), self.data, config.attack)))
        rows = []
        for (arch, k), runs in scores.items():
            attack = [r[2] for r in runs]
            rows.append({"arch": arch, "chunk": k + 1, "epochs_after": config.memory_epochs * (chunks - 1 - k),
                         "train_accuracy": float(np.mean([r[0] for r in runs])),
                         "entropy_members": float(np.mean([r[1] for r in runs])),
                         "attack_accuracy": float(np.mean(attack)), "attack_accuracy_runs": attack,
                         "attack_accuracy_se": float(np.std(attack, ddof=1) / np.sqrt(len(attack)))
                         if len(attack) > 1 else None})
        curves = {arch: {"chunk_accuracy": np.mean(during[arch], axis=0)[:, :chunks].tolist(),
                         "test_accuracy": np.mean(during[arch], axis=0)[:, chunks].tolist()} for arch in ARCHS}
        return rows, curves

    def regularisation(self) -> list[dict]:
        """Fig. 3.7: both networks trained with each l2 penalty on each of ``penalised``."""
        config, rows, last = self.config, [], self.config.epochs[-1]
        for penalised in config.penalised:
            for penalty in config.penalties:
                for arch in ARCHS:
                    victim, shadows = self.victim_and_shadows(
                        arch, lambda idx, seed, arch=arch: train(arch, self.data, idx, config, seed, [last], penalty,
                                                                 penalised)[last])
                    rows.append({"arch": arch, "penalised": penalised, "penalty": penalty,
                                 **_scored(victim, shadows, self.shadow_sets, self.split, self.data, config.attack)})
        return rows

    def dp_sgd(self) -> list[dict]:
        """Fig. 3.8, top row: both networks trained by DP-SGD at each noise multiplier."""
        config, rows = self.config, []
        for noise in config.dp_noise:
            for arch in ARCHS:
                victim, shadows = self.victim_and_shadows(
                    arch, lambda idx, seed, arch=arch: train_private(arch, self.data, idx, config, seed, noise))
                scored = _scored(victim, shadows, self.shadow_sets, self.split, self.data, config.attack)
                rows.append({"arch": arch, "noise_multiplier": noise, **self.dp_spent[noise], **scored,
                             "utility_loss": utility_loss(scored["test_accuracy"], self.unprotected_accuracy[arch])})
        return rows

    def sensitivity_and_gpm(self, final: dict) -> tuple[dict, list[dict]]:
        """Table 3.1 and Fig. 3.8, bottom row: each architecture's SensitivitySampler, then the GPM at each sigma."""
        config, data, last, sampler, rows = self.config, self.data, self.config.epochs[-1], {}, []
        for arch in ARCHS:
            draws = np.random.default_rng(self.seed(arch, "sampler"))
            estimate = sensitivity_sampler(
                lambda idx, arch=arch: train(arch, data, list(idx), config, self.seed(arch, "victim"), [last])[last],
                lambda count, i: draws.choice(len(data.images), count, replace=False).tolist(),
                config.sampler_pairs, config.members, progress=lambda i, n: self.tick(2))  # two networks per pair
            sampler[arch] = {"sensitivity": estimate.sensitivity, "samples": list(estimate.samples),
                             "gamma": estimate.gamma, "pairs": config.sampler_pairs}
        test = self.split["victim_out"]
        for sigma in config.sigmas:
            for arch in ARCHS:
                victim, shadows = final[arch]
                noise = torch.Generator().manual_seed(self.seed(arch, "gpm", sigma))
                noisy = gaussian_privacy_module(victim, sigma, noise)
                noisy_shadows = [gaussian_privacy_module(s, sigma, noise) for s in shadows]
                noisy_acc = self.accuracy(noisy, test)
                rows.append({"arch": arch, "sigma": sigma, "test_accuracy": noisy_acc,
                             "utility_loss": utility_loss(noisy_acc, self.unprotected_accuracy[arch]),
                             "attack_accuracy": _attack(noisy, noisy_shadows, self.shadow_sets,
                                                        (self.split["victim_in"], test), data, config.attack),
                             "epsilon": analytic_gaussian_epsilon(sigma, config.delta, sampler[arch]["sensitivity"])
                             if sampler[arch]["sensitivity"] > 0 else 0.0})
        return sampler, rows


def run(out: Path, config: RnnMembershipConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, attack, defend; write ``out`` atomically; returns the results."""
    config = config or (RnnMembershipConfig.quick() if quick else RnnMembershipConfig())
    check_out(out, RNN_MEMBERSHIP_FORMAT)  # before the work, not after it
    start = time.perf_counter()
    work = _Run(config, progress)
    vulnerability, final = work.vulnerability()
    memorisation, memorisation_curves = work.memorisation()
    regularisation = work.regularisation()
    dp_sgd = work.dp_sgd()
    sampler, defense = work.sensitivity_and_gpm(final)
    parameters = {arch: sum(p.numel() for p in final[arch][0].parameters()) for arch in ARCHS}
    with atomic_dir(out, RNN_MEMBERSHIP_FORMAT) as tmp:
        results = {"format": RNN_MEMBERSHIP_FORMAT, "format_version": 2, "quick": quick,
                   "config": config.model_dump(mode="json"), "parameters": parameters,
                   "vulnerability": vulnerability, "memorisation": memorisation,
                   "memorisation_curves": memorisation_curves, "regularisation": regularisation,
                   "dp_sgd": dp_sgd, "sampler": sampler, "defense": defense, "delta": config.delta,
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        figures.plot_epochs(tmp / EPOCHS_FILE, vulnerability)
        figures.plot_memorisation(tmp / MEMORISATION_FILE, memorisation, memorisation_curves)
        unprotected = {r["arch"]: r for r in vulnerability if r["epochs"] == config.epochs[-1]}
        figures.plot_regularisation(tmp / REGULARISATION_FILE, regularisation, unprotected)
        figures.plot_dp_sgd(tmp / DP_SGD_FILE, dp_sgd)
        figures.plot_gpm(tmp / GPM_FILE, defense)
    return results
