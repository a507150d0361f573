"""``leaklab reproduce rl-membership``: seed 003, chapter 3, the deep-RL task (sections 3.4.1-3.4.3, Figs. 3.3 and
3.4): membership inference of floor maps against PPO agents, a recurrent and a feed-forward one of about equal size.

The thesis' setting: MiniGrid's MultiRoom-N4 (four rooms behind closed doors, the goal in the last, an egocentric
view), victims trained with PPO on a limited set of floor maps (seeds), the attacker drawing maps of its own from
the same simulator; Shokri et al.'s shadow models with one binary classifier on the concatenated per-step answers
and a labelling agent's per-step policy; the attack's accuracy against the training epochs, higher against the RNN
(Fig. 3.4), and, on member maps, the RNN reaching the goal in about 20 steps against about 35 for the FFNN (both
about 35 on unseen maps).

Here (:mod:`leaklab.rl.envs.multi_room`, :mod:`leaklab.rl.agents.ppo`, :mod:`leaklab.attacks.policy_membership`):

* maps: each of ``victims`` victims per network its ``maps`` training maps and as many it never sees; each of
  ``shadows`` shadow models its own ``maps`` training maps and as many others; every set disjoint (seed ranges of
  their own), so the attacker never draws a victim's seed (a seed's map can repeat another's shifted across the
  grid: 4 of 400 two-room maps did, none of 448 three-room maps);
* training: PPO with rl-starter-files' defaults (Adam at ``lr`` 1e-3; ``optimizer="sgd"`` takes eq. 3.7's plain
  SGD instead) for ``frames`` environment steps per model, snapshots at
  the shares ``checkpoints`` of the frames (frames stand in for the thesis' epochs; a snapshot is taken after
  the first update that reaches its share); ``rooms`` rooms (the thesis: 4; PPO's feed-forward agent on 32
  maps earned almost nothing on 4 rooms in two tries of 1.7M and 1.5M frames, mean returns at most 0.03, and learnt
  3 rooms in 100k, hence 3 by default; those tries saw through walls, an earlier version of the environment);
* attack: at each checkpoint, every model queried once on each of its member and non-member maps
  (:func:`~leaklab.attacks.policy_membership.query_policy`, the first ``query_steps`` steps), the classifier trained
  on all shadows' rows of one network, scored on all its victims' members against as many non-members (50% is a
  guess);
* beside it, how the victims play their member and non-member maps: steps to the goal, return (eq. 3.2), the
  answers' entropy (eq. 3.3), and the generalisation gap in return.

The defenses of Sec. 3.5.2 on this task, when asked (the thesis gives no grid, clip, pair count or accountant
settings for them):

* DP-SGD (Fig. 3.8, top): at each of ``dp_noise``, every victim and shadow trained again by PPO under DP-SGD
  (:mod:`leaklab.rl.agents.ppo`: per-chunk clipping to ``dp_clip``; the epsilon of a chunk of the loss, 4 steps for
  the RNN and 1 for the FFNN, the same number for both; a floor map's is group privacy over its chunks, so the two
  networks' epsilons are not a map's and not alike) and attacked after the last frame, the shadows trained alike (the
  attacker knows the defense);
* the Gaussian privacy module (Fig. 3.8, bottom; Table 3.1): Algorithm 3's SensitivitySampler per network with
  ``sampler_pairs`` pairs of sets of ``maps`` floor maps drawn from the simulator (victim0's initialisation and PPO
  seed, so that only the maps differ), then Algorithm 2 at each of ``sigmas`` on every trained victim and shadow,
  with the epsilon of (eps, delta) random DP (Theorem 3.3) at ``delta`` and the sampler's confidence gamma: a map's
  epsilon under victim0's training algorithm (the other models' algorithms differ in their initialisation and seed,
  whose sensitivities are not estimated: their epsilons are indicative only).

Both report the attack and the utility loss of Definition 3.4 with the victims' mean return on their non-member maps
(the validation performance) against the unprotected victims'.

Writes ``OUT/results.json``, ``OUT/rl_membership.png`` (Fig. 3.4) and, for the defenses, ``OUT/rl_dp_sgd.png`` and
``OUT/rl_gpm.png`` (Fig. 3.8) atomically; same seed, same numbers.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import astuple
from pathlib import Path
from typing import Literal

from collections.abc import Callable

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn

from leaklab.attacks.membership import AttackTraining, feature_attack
from leaklab.attacks.policy_membership import Queries, labelling, query_policy
from leaklab.defenses.gpm import gaussian_privacy_module, utility_loss
from leaklab.experiments import ProgressFn
from leaklab.experiments import rnn_figures as figures
from leaklab.fields import PositiveGrid, Seed
from leaklab.io import RESULTS_FILE, RL_MEMBERSHIP_FORMAT, atomic_dir, check_out, write_json
from leaklab.names import PPO_OPTIMIZER_NAMES
from leaklab.privacy.dpsgd import DPConfig
from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
from leaklab.privacy.sensitivity import sensitivity_sampler
from leaklab.rl.agents.ppo import ARCHS, PPOConfig, build_policy, ppo_epsilon, train_ppo
from leaklab.rl.envs.multi_room import MAX_STEPS, FloorMap, floor_map
from leaklab.seeds import stream_seed
from leaklab.words import plural

PLOT_FILE = "rl_membership.png"
DP_SGD_FILE = "rl_dp_sgd.png"
GPM_FILE = "rl_gpm.png"
TASK = "floor maps, PPO"
MAP_SEEDS_PER_RUN = 1_000_000  # map seeds of --seed s lie in [s * this, (s + 1) * this): 40 models x 2 x 10,000 fit
PUBLISHED = {"claim": "the attack is consistently more accurate against the RNN than the FFNN, before and after "
                      "convergence, with zero generalisation gap for both (Fig. 3.4, a figure only); on member maps "
                      "the RNN reaches the goal in about 20 steps, the FFNN in about 35, both about 35 on unseen maps",
             "rooms": 4, "episode_limit": 200,
             "table_3_1_rl": {"RNN": 0.093682, "FFNN": 0.093429}, "gamma_n500": 0.0774,
             "defenses": "RNNs lose more utility than FFNNs under DP-SGD at the same (eps, delta) and under the GPM "
                         "at the same sigma (Fig. 3.8, a figure only); with empirical-sensitivity noise the attack "
                         "falls to about 50% at under 10% utility loss"}


class RlMembershipConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rooms: int = Field(default=3, ge=1, le=10, description="rooms per floor map (the thesis: 4)")
    max_room: int = Field(default=5, ge=4, le=10, description="a room's largest side, walls included")
    maps: int = Field(default=8, ge=2, le=10_000, description="training maps per model (the thesis: not given)")
    victims: int = Field(default=4, ge=1, le=20, description="victims per network, each on maps of its own; the "
                                                              "attack is scored on all their maps")
    shadows: int = Field(default=4, ge=1, le=20, description="shadow models per network (the thesis: not given)")
    frames: int = Field(default=400_000, ge=1, le=100_000_000, description="PPO frames per model")
    checkpoints: list[float] = Field(default_factory=lambda: [0.125, 0.25, 0.5, 1.0], min_length=1,
                                     description="shares of the frames after which every model is attacked")
    query_steps: int = Field(default=48, ge=1, le=200, description="steps of an episode the attack reads")
    envs: int = Field(default=16, ge=1, le=1024, description="PPO's agents stepped together")
    clip: float = Field(default=0.2, gt=0, le=1, description="PPO's clip epsilon, the thesis' regularisation of the RL "
                                                             "task (Fig. 3.7; rl-starter-files' default 0.2)")
    optimizer: Literal[PPO_OPTIMIZER_NAMES] = Field(default="adam", description="PPO's optimiser: rl-starter-files' "
                                                    "Adam, or plain SGD (eq. 3.7's update)")
    lr: float = Field(default=1e-3, gt=0, le=1, description="PPO's learning rate (rl-starter-files' 1e-3, for Adam)")
    dp_noise: PositiveGrid = Field(default_factory=list, max_length=10,
                                  description="DP-SGD's noise multipliers (Fig. 3.8, top); none: no DP-SGD section")
    dp_clip: float = Field(default=1.0, gt=0, description="DP-SGD's per-chunk clipping norm C")
    sigmas: PositiveGrid = Field(default_factory=list, max_length=20,
                                description="the GPM's noise scales (Fig. 3.8, bottom); none: no sampler, no GPM")
    sampler_pairs: int = Field(default=8, ge=2, le=1000, description="Algorithm 3's n (the thesis: 500)")
    delta: float = Field(default=1e-5, gt=0, lt=1)
    attack: AttackTraining = AttackTraining()
    seed: Seed = 0

    @field_validator("checkpoints")
    @classmethod
    def _shares(cls, v: list[float]) -> list[float]:
        if any(not 0 < c <= 1 for c in v) or len(set(v)) != len(v):
            raise ValueError("distinct shares in (0, 1]")
        return sorted(v)

    @model_validator(mode="after")
    def _checkpoints_on_distinct_updates(self) -> "RlMembershipConfig":
        # a snapshot is taken after the first PPO update that reaches its share: two shares on one update would
        # score the same weights twice, with different query draws
        per_update = self.envs * PPOConfig.model_fields["steps_per_update"].default
        updates = [math.ceil(c * self.frames / per_update) for c in self.checkpoints]
        if len(set(updates)) < len(updates):
            raise ValueError(f"checkpoints {self.checkpoints} of {plural(self.frames, 'frame')} fall on the same PPO "
                             f"update ({per_update:,} frames each); train more frames or keep fewer checkpoints")
        return self

    @model_validator(mode="after")
    def _defended_against_the_trained(self) -> "RlMembershipConfig":
        if (self.dp_noise or self.sigmas) and self.checkpoints[-1] != 1.0:
            raise ValueError("the defenses are measured against the fully trained victims: checkpoints must end at 1")
        return self

    @classmethod
    def quick(cls, seed: int = 0) -> "RlMembershipConfig":
        return cls(rooms=2, maps=4, victims=1, shadows=1, frames=1024, checkpoints=[0.5, 1.0], query_steps=8, envs=4,
                   attack=AttackTraining(epochs=5), seed=seed)


def _map_sets(config: RlMembershipConfig) -> dict[str, tuple[list[int], list[int]]]:
    """Per model (``victim0``, ..., ``shadow0``, ...): the seeds of its (member, non-member) maps, all disjoint."""
    base, m = config.seed * MAP_SEEDS_PER_RUN, config.maps
    roles = [f"victim{v}" for v in range(config.victims)] + [f"shadow{s}" for s in range(config.shadows)]
    return {role: (list(range(base + 2 * i * m, base + (2 * i + 1) * m)),
                   list(range(base + (2 * i + 1) * m, base + (2 * i + 2) * m))) for i, role in enumerate(roles)}


class _Run:
    """The maps, their labels and the progress of one reproduction; trains and queries the models."""

    def __init__(self, config: RlMembershipConfig, progress: ProgressFn | None):
        self.config, self.progress = config, progress
        self.sets = _map_sets(config)
        self.maps = {s: floor_map(s, rooms=config.rooms, max_room=config.max_room)
                     for pair in self.sets.values() for s in pair[0] + pair[1]}
        self.labels = dict(zip(self.maps, labelling(list(self.maps.values()))))
        trainings = len(self.sets) * (1 + len(config.dp_noise)) + (2 * config.sampler_pairs if config.sigmas else 0)
        self.total, self.done = trainings * len(ARCHS) * config.frames, 0

    def seed(self, *parts) -> int:
        return stream_seed(self.config.seed, "rl-membership", *parts)

    def train(self, arch: str, role: str, maps: list[FloorMap], privacy: DPConfig | None = None,
              on_update: Callable[[int, nn.Module], None] | None = None, what: str = "") -> tuple[nn.Module, dict]:
        """One model's PPO training (the victim's or shadow's algorithm: its role's initialisation and seed);
        ``on_update(frames, policy)`` after every update; ``what`` names it on the progress bar (default: the role)."""
        config = self.config
        policy = build_policy(arch, self.seed(arch, role, "init"), private=privacy is not None)
        ppo = PPOConfig(frames=config.frames, envs=config.envs, clip=config.clip, optimizer=config.optimizer,
                        lr=config.lr, privacy=privacy, seed=self.seed(arch, role, "ppo"))
        what = what or f"{arch} {role}: {'DP-SGD ' if privacy else ''}PPO"
        history = train_ppo(policy, maps, ppo, on_update=None if on_update is None else lambda f: on_update(f, policy),
                            progress=lambda f, _t, _r: self.tick(self.done + f, what))
        self.done += config.frames
        return policy, history

    def tick(self, done: int, what: str) -> None:
        if self.progress is not None:
            self.progress(what, min(done, self.total), self.total)

    def query(self, policy: nn.Module, arch: str, role: str, *key) -> tuple[Queries, Queries]:
        """``policy`` queried once on each of ``role``'s member and non-member maps (``key``: which snapshot or
        defense, for the actions' random stream)."""
        gen = torch.Generator().manual_seed(self.seed(arch, role, *key, "query"))
        return tuple(query_policy(policy, [self.maps[s] for s in seeds], [self.labels[s] for s in seeds],
                                  self.config.query_steps, gen) for seeds in self.sets[role])

    def trained(self, arch: str, privacy: DPConfig | None = None) -> tuple[dict, dict, dict[str, nn.Module]]:
        """Every model of ``arch`` trained, snapshotted at the checkpoints (the last only under ``privacy``) and
        queried at each: (role -> share -> (frames, member and non-member Queries), histories, final policies)."""
        shares = self.config.checkpoints if privacy is None else [1.0]
        queried: dict[str, dict[float, tuple]] = {}
        histories, finals = {}, {}
        for role, (members, _) in self.sets.items():
            snapshots: dict[float, tuple[int, dict]] = {}  # share -> (frames trained, state)

            def keep(frames: int, policy: nn.Module, snapshots=snapshots) -> None:
                for c in shares:
                    if frames >= c * self.config.frames and c not in snapshots:
                        snapshots[c] = (frames, copy.deepcopy(policy.state_dict()))

            policy, histories[f"{arch} {role}"] = self.train(arch, role, [self.maps[s] for s in members], privacy,
                                                             on_update=keep)
            queried[role] = {}
            for c, (frames, state) in snapshots.items():
                policy.load_state_dict(state)
                key = (c,) if privacy is None else ("dp", privacy.noise_multiplier)
                queried[role][c] = (frames, *self.query(policy, arch, role, *key))
            finals[role] = policy
        return queried, histories, finals

    def dp_sgd(self, unprotected: dict[str, dict]) -> list[dict]:
        """Fig. 3.8, top row, on the RL task: every model trained by DP-SGD PPO at each noise multiplier."""
        config, rows = self.config, []
        for noise in config.dp_noise:
            privacy = DPConfig(noise_multiplier=noise, clip=config.dp_clip, delta=config.delta)
            ppo = PPOConfig(privacy=privacy)
            epsilon = ppo_epsilon(ppo)
            for arch in ARCHS:
                queried, _, _ = self.trained(arch, privacy)
                row = _checkpoint_row(1.0, queried, config)
                rows.append({"arch": arch.upper(), "noise_multiplier": noise, "epsilon": epsilon,
                             "chunk_steps": ppo.recurrence if ARCHS[arch].recurrent else 1, **row,
                             "utility_loss": _utility_loss(row, unprotected[arch])})
        return rows

    def sensitivity_and_gpm(self, finals: dict[str, dict[str, nn.Module]],
                            unprotected: dict[str, dict]) -> tuple[dict, list[dict]]:
        """Table 3.1 and Fig. 3.8, bottom row, on the RL task: each network's SensitivitySampler over sets of
        ``maps`` floor maps drawn from the simulator (the victim's algorithm: victim0's initialisation and seed),
        then the GPM on every trained model at each sigma."""
        config, sampler, rows = self.config, {}, []
        for arch in ARCHS:
            draws = np.random.default_rng(self.seed(arch, "sampler"))
            estimate = sensitivity_sampler(
                lambda seeds, arch=arch: self.train(
                    arch, "victim0", [floor_map(int(s), rooms=config.rooms, max_room=config.max_room) for s in seeds],
                    what=f"{arch} sensitivity sampler: PPO")[0],
                lambda count, i: draws.integers(0, 2**31, count).tolist(), config.sampler_pairs, config.maps)
            sampler[arch.upper()] = {"sensitivity": estimate.sensitivity, "samples": list(estimate.samples),
                                     "gamma": estimate.gamma, "pairs": config.sampler_pairs}
        for sigma in config.sigmas:
            for arch in ARCHS:
                queried = {}
                for role, policy in finals[arch].items():
                    noisy = gaussian_privacy_module(policy, sigma, torch.Generator().manual_seed(
                        self.seed(arch, role, "gpm", sigma)))
                    queried[role] = {1.0: (config.frames, *self.query(noisy, arch, role, "gpm", sigma))}
                row = _checkpoint_row(1.0, queried, config)
                sensitivity = sampler[arch.upper()]["sensitivity"]
                rows.append({"arch": arch.upper(), "sigma": sigma, **row,
                             "utility_loss": _utility_loss(row, unprotected[arch]),
                             "epsilon": analytic_gaussian_epsilon(sigma, config.delta, sensitivity)
                             if sensitivity > 0 else 0.0})
        return sampler, rows


def _utility_loss(row: dict, unprotected: dict) -> float | None:
    """Definition 3.4 with the victims' mean return on their non-member maps (the validation performance); None
    where the unprotected victims earned nothing there."""
    reference = unprotected["non_members"]["return"]
    return utility_loss(row["non_members"]["return"], reference) if reference > 0 else None


def run(out: Path, config: RlMembershipConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train every model, attack at every checkpoint, defend if asked, write ``out`` atomically; returns the
    results."""
    config = config or (RlMembershipConfig.quick() if quick else RlMembershipConfig())
    check_out(out, RL_MEMBERSHIP_FORMAT)
    began = time.perf_counter()
    work = _Run(config, progress)
    rows: dict[str, list[dict]] = {}
    histories: dict[str, dict] = {}
    finals: dict[str, dict[str, nn.Module]] = {}
    for arch in ARCHS:
        queried, trained, finals[arch] = work.trained(arch)
        histories.update(trained)
        rows[arch] = [_checkpoint_row(c, queried, config) for c in config.checkpoints]
    unprotected = {arch: cells[-1] for arch, cells in rows.items()}
    dp_sgd = work.dp_sgd(unprotected)
    sampler, gpm = work.sensitivity_and_gpm(finals, unprotected) if config.sigmas else ({}, [])
    with atomic_dir(out, RL_MEMBERSHIP_FORMAT) as tmp:
        results = {"format": RL_MEMBERSHIP_FORMAT, "format_version": 2, "quick": quick,
                   "config": config.model_dump(mode="json"), "map_seeds": {r: {"members": [p[0][0], p[0][-1]],
                                                                               "non_members": [p[1][0], p[1][-1]]}
                                                                           for r, p in work.sets.items()},
                   "parameters": {arch: sum(p.numel() for p in build_policy(arch, 0).parameters()) for arch in ARCHS},
                   "rows": rows, "training": histories, "dp_sgd": dp_sgd, "sampler": sampler, "gpm": gpm,
                   "delta": config.delta, "published": PUBLISHED, "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
        if dp_sgd:
            figures.plot_dp_sgd(tmp / DP_SGD_FILE, dp_sgd, TASK, "epsilon of a chunk of the loss (DP-SGD; RNN 4 "
                                                                "steps, FFNN 1)")
        if gpm:
            figures.plot_gpm(tmp / GPM_FILE, gpm, TASK)
    return results


def _joined(queries: list[Queries]) -> Queries:
    return Queries(*(torch.cat(parts) if isinstance(parts[0], torch.Tensor) else np.concatenate(parts)
                     for parts in zip(*(astuple(q) for q in queries))))


def _checkpoint_row(checkpoint: float, queried: dict, config: RlMembershipConfig) -> dict:
    """One network at one checkpoint: the attack's accuracy and how its victims play members and non-members."""
    def side(prefix: str, which: int) -> Queries:
        return _joined([q[checkpoint][which] for role, q in queried.items() if role.startswith(prefix)])

    victim_in, victim_out = side("victim", 1), side("victim", 2)
    accuracy = feature_attack(side("shadow", 1).features, side("shadow", 2).features, victim_in.features,
                              victim_out.features, config.attack)
    frames = queried["victim0"][checkpoint][0]

    def play(q) -> dict:
        reached = q.steps_to_goal <= MAX_STEPS
        return {"success": float(reached.mean()),
                "steps_to_goal": float(q.steps_to_goal[reached].mean()) if reached.any() else None,
                "return": float(q.returns.mean()), "entropy": float(q.entropy.mean())}

    members, others = play(victim_in), play(victim_out)
    scored = len(victim_in.returns) + len(victim_out.returns)
    return {"share": checkpoint, "frames": frames, "attack_accuracy": accuracy,
            "attack_accuracy_se": math.sqrt(accuracy * (1 - accuracy) / scored), "maps_scored": scored,
            "members": members, "non_members": others, "generalization_gap": members["return"] - others["return"]}


def _plot(path: Path, rows: dict[str, list[dict]]) -> None:
    """Fig. 3.4: the attack's accuracy (with its binomial standard error) against the training frames, per network;
    beside it the victims' steps to the goal and the answers' entropy on member (solid) and non-member (dashed)
    maps."""
    from leaklab.report.plots import saved_figure

    title = "membership inference of floor maps against PPO agents (seed 003, Fig. 3.4)"
    with saved_figure(path, 1, 3, figsize=(13, 3.4), title=title) as (fig, (attack, steps, entropy)):
        for arch, cells in rows.items():
            frames = [r["frames"] for r in cells]
            line = attack.errorbar(frames, [100 * r["attack_accuracy"] for r in cells], fmt="o-", capsize=2,
                                   yerr=[100 * r["attack_accuracy_se"] for r in cells], label=arch.upper()).lines[0]
            for side, style in (("members", "o-"), ("non_members", "s--")):
                label = f"{arch.upper()}, {side.replace('_', '-')}"
                steps.plot(frames, [r[side]["steps_to_goal"] or np.nan for r in cells], style,
                           color=line.get_color(), label=label)
                entropy.plot(frames, [r[side]["entropy"] for r in cells], style, color=line.get_color(), label=label)
        attack.axhline(50, color="grey", linestyle=":", linewidth=0.8)
        attack.set_ylabel("attack accuracy (%)")
        steps.set_ylabel("victims' steps to the goal")
        entropy.set_ylabel("prediction entropy H_APE")
        ticks = [r["frames"] for r in next(iter(rows.values()))]
        for ax in (attack, steps, entropy):
            ax.set_xscale("log")
            ax.set_xticks(ticks, [f"{t / 1000:.0f}k" for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("PPO frames")
            ax.legend(fontsize=7)
