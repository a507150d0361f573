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
* training: PPO with rl-starter-files' defaults for ``frames`` environment steps per model, snapshots at
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

Writes ``OUT/results.json`` and ``OUT/rl_membership.png`` (Fig. 3.4) atomically; same seed, same numbers.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import astuple
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab.attacks.membership import AttackTraining, feature_attack
from leaklab.attacks.policy_membership import Queries, labelling, query_policy
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.io import RESULTS_FILE, RL_MEMBERSHIP_FORMAT, atomic_dir, check_out, write_json
from leaklab.rl.agents.ppo import ARCHS, PPOConfig, build_policy, train_ppo
from leaklab.rl.envs.multi_room import MAX_STEPS, floor_map
from leaklab.seeds import stream_seed

PLOT_FILE = "rl_membership.png"
MAP_SEEDS_PER_RUN = 1_000_000  # map seeds of --seed s lie in [s * this, (s + 1) * this): 40 models x 2 x 10,000 fit
PUBLISHED = {"claim": "the attack is consistently more accurate against the RNN than the FFNN, before and after "
                      "convergence, with zero generalisation gap for both (Fig. 3.4, a figure only); on member maps "
                      "the RNN reaches the goal in about 20 steps, the FFNN in about 35, both about 35 on unseen maps",
             "rooms": 4, "episode_limit": 200}


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
    attack: AttackTraining = AttackTraining()
    seed: Seed = 0

    @field_validator("checkpoints")
    @classmethod
    def _shares(cls, v: list[float]) -> list[float]:
        if any(not 0 < c <= 1 for c in v) or len(set(v)) != len(v):
            raise ValueError("distinct shares in (0, 1]")
        return sorted(v)

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


def run(out: Path, config: RlMembershipConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train every model, attack at every checkpoint, write ``out`` atomically; returns the results."""
    config = config or (RlMembershipConfig.quick() if quick else RlMembershipConfig())
    check_out(out, RL_MEMBERSHIP_FORMAT)
    began = time.perf_counter()
    sets = _map_sets(config)
    maps = {s: floor_map(s, rooms=config.rooms, max_room=config.max_room)
            for pair in sets.values() for s in pair[0] + pair[1]}
    labels = {s: labels_of for s, labels_of in zip(maps, labelling(list(maps.values())))}
    models = len(ARCHS) * len(sets)
    total, done = models * config.frames, 0

    def tick(frames_done: int, what: str) -> None:
        if progress is not None:
            progress(what, done + frames_done, total)

    rows: dict[str, list[dict]] = {}
    histories: dict[str, dict] = {}
    for arch in ARCHS:
        queried: dict[str, dict[float, tuple]] = {}  # role -> share -> (frames, member and non-member Queries)
        for role, (members, others) in sets.items():
            policy = build_policy(arch, stream_seed(config.seed, "rl-membership", arch, role, "init"))
            ppo = PPOConfig(frames=config.frames, envs=config.envs, clip=config.clip,
                            seed=stream_seed(config.seed, "rl-membership", arch, role, "ppo"))
            snapshots: dict[float, tuple[int, dict]] = {}  # share -> (frames trained, state)

            def keep(frames: int, policy=policy, snapshots=snapshots) -> None:
                for c in config.checkpoints:
                    if frames >= c * config.frames and c not in snapshots:
                        snapshots[c] = (frames, copy.deepcopy(policy.state_dict()))

            histories[f"{arch} {role}"] = train_ppo(
                policy, [maps[s] for s in members], ppo, on_update=keep,
                progress=lambda f, _t, _r, arch=arch, role=role: tick(f, f"{arch} {role}: PPO"))
            done += config.frames
            queried[role] = {}
            for c, (frames, state) in snapshots.items():
                policy.load_state_dict(state)
                gen = torch.Generator().manual_seed(stream_seed(config.seed, "rl-membership", arch, role, c, "query"))
                queried[role][c] = (frames, *(query_policy(policy, [maps[s] for s in seeds], [labels[s] for s in seeds],
                                                           config.query_steps, gen) for seeds in (members, others)))
        rows[arch] = [_checkpoint_row(c, queried, config) for c in config.checkpoints]
    with atomic_dir(out, RL_MEMBERSHIP_FORMAT) as tmp:
        results = {"format": RL_MEMBERSHIP_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "map_seeds": {r: {"members": [p[0][0], p[0][-1]],
                                                                               "non_members": [p[1][0], p[1][-1]]}
                                                                           for r, p in sets.items()},
                   "parameters": {arch: sum(p.numel() for p in build_policy(arch, 0).parameters()) for arch in ARCHS},
                   "rows": rows, "training": histories, "published": PUBLISHED,
                   "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows)
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
