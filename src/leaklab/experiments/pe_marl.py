"""``leaklab reproduce pe-marl``: seed 003, chapter 4 (Figs. 4.12-4.16) on a task that runs here: IQL, VDN, PE-VDN (the
team TD error through additively secret-shared sums), PE-QMIX (each agent's share of the mixer, evaluated layer by
layer through secure sums), PE-QTRAN (each agent's encoders and shares of QTRAN's team and state values), and
PE-VDN, PE-QMIX and PE-QTRAN with DP-SGD at a target (eps, delta) by Theorem 4.2 (the thesis reports no DP PE-QTRAN),
each (or the ``methods`` chosen) trained ``runs`` times on cooperative navigation
(:mod:`leaklab.rl.envs.cooperative_navigation`; the thesis' SMAC 3m needs StarCraft II).

Minibatches of 512 transitions and clipping at 0.1 (measured with 2 agents: at 64 and 1.0, DP-SGD at eps 2.9 never
passed a 6% win rate, the noise drowning per-sample gradients far below the clip; at 512 and 0.1 one run reached
90%). Recorded per method: the greedy win rate and return every ``eval_every`` steps (mean and standard deviation
over the runs), the final values, the seconds per run, and for the DP runs the noise multiplier that reaches the
target and the epsilon spent (Theorem 4.2: one transition of the replay buffer is the unit; the agents accounted
jointly, :mod:`leaklab.rl.marl.team_training`). PE-VDN's gradients equal VDN's up to the secure sum's fixed-point
rounding (10^-5 per term, ``tests/test_pe_marl.py``); their runs drift apart from that rounding on, so beside their
curves the record gives the largest difference between the two.

Writes ``OUT/results.json`` and ``OUT/learning_curves.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from leaklab import seeds
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.io import PE_MARL_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.names import PE_MARL_METHODS
from leaklab.privacy.dpsgd import DPConfig
from leaklab.rl.marl.team_training import TeamConfig, train_team

FIGURE_FILE = "learning_curves.png"
METHODS = PE_MARL_METHODS
PUBLISHED = {  # seed 003, Sec. 4.5 (SMAC 3m; figures only but for these)
    "dp_win_rate": "about 80% for PE-VDN and PE-QMIX at (eps, delta) = (2.90, 4.9e-4), anchor models",
    "claims": ["PE-VDN, PE-QMIX and PE-QTRAN all beat IQL in stability and convergence rate",
               "PE-QTRAN has the best curve; PE-VDN trains about 1.5 times faster in wall-clock"],
}


def _methods(values: list[str]) -> list[str]:
    """The methods chosen, in :data:`METHODS`' order, each once."""
    unknown = [m for m in values if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m in values]


class PeMarlConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    team: TeamConfig = TeamConfig(agents=3, size=4, horizon=6, env_steps=8000, batch=512, eval_every=500)
    runs: int = Field(default=5, ge=1, le=1000, description="training runs per method (seeds)")
    epsilon: float = Field(default=2.90, gt=0, le=100, description="the DP runs' target epsilon (the thesis')")
    delta: float | None = Field(default=None, gt=0, lt=1, description="default: buffer^-1.1 (the thesis' rule)")
    clip: float = Field(default=0.1, gt=0, description="per-sample clipping (the per-sample gradients here are "
                                                       "small: at 1, the noise drowned them)")
    methods: Annotated[list[str], AfterValidator(_methods)] = Field(default_factory=lambda: list(METHODS),
                                                                    min_length=1)
    seed: Seed = 0

    def privacy(self) -> DPConfig:
        delta = self.delta if self.delta is not None else self.team.buffer ** -1.1
        return DPConfig(target_epsilon=self.epsilon, delta=delta, clip=self.clip, accountant="rdp")

    @classmethod
    def quick(cls, seed: int = 0) -> "PeMarlConfig":
        return cls(team=TeamConfig(agents=3, size=4, horizon=3, envs=4, env_steps=60, buffer=80, batch=16,
                                   hidden=16, eval_every=30, eval_episodes=20), runs=1, seed=seed)


def run(out: Path, config: PeMarlConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train every method ``runs`` times; write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (PeMarlConfig.quick() if quick else PeMarlConfig())
    check_out(out, PE_MARL_FORMAT)  # before the work, not after it
    train_team(config.team.model_copy(update={"env_steps": 2}))  # the one-time warm-up, untimed
    start = time.perf_counter()
    rows, done = {}, 0
    for method in config.methods:
        runs = []
        for r in range(config.runs):
            team = config.team.model_copy(update={
                "method": method.removeprefix("dp-"),
                "seed": seeds.stream_seed(config.seed, "pe-marl", r),
                "privacy": config.privacy() if method.startswith("dp-") else None})
            runs.append(train_team(TeamConfig.model_validate(team.model_dump()))[0])
            done += 1
            if progress is not None:
                progress("training runs", done, len(config.methods) * config.runs)
        win, ret = np.array([x.win_rate for x in runs]), np.array([x.returns for x in runs])
        rows[method] = {"eval_steps": runs[0].eval_steps, "win_rate_mean": win.mean(0).tolist(),
                        "win_rate_std": win.std(0).tolist(), "return_mean": ret.mean(0).tolist(),
                        "return_std": ret.std(0).tolist(), "final_win_rate": float(win[:, -1].mean()),
                        "final_win_rate_std": float(win[:, -1].std()), "final_return": float(ret[:, -1].mean()),
                        "best_win_rate": float(win.max(1).mean()),
                        "seconds_per_run": float(np.mean([x.seconds for x in runs])),
                        "updates": runs[0].updates, "privacy": runs[0].privacy,
                        "win_rate_per_run": win.tolist()}
    drift = float(np.abs(np.array(rows["vdn"]["win_rate_per_run"]) - np.array(rows["pe-vdn"]["win_rate_per_run"])
                         ).max()) if {"vdn", "pe-vdn"} <= set(rows) else None
    with atomic_dir(out, PE_MARL_FORMAT) as tmp:
        results = {"format": PE_MARL_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "methods": rows,
                   "vdn_pe_vdn_largest_win_rate_difference": drift, "published": PUBLISHED,
                   "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / FIGURE_FILE, rows)
    return results


def _plot(path: Path, rows: dict) -> None:
    """Figs. 4.12-4.16: win rate and return against the environment steps, mean over the runs."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, 1, 2, figsize=(9, 3.3)) as (fig, (left, right)):
        for method, row in rows.items():
            steps = row["eval_steps"]
            label = method if row["privacy"] is None else \
                f"{method} (eps {row['privacy']['epsilon']:.2f}, delta {row['privacy']['delta']:.1e})"
            for ax, key in ((left, "win_rate"), (right, "return")):
                mean, std = np.array(row[f"{key}_mean"]), np.array(row[f"{key}_std"])
                scale = 100 if key == "win_rate" else 1
                ax.plot(steps, scale * mean, label=label, linewidth=0.9)
                ax.fill_between(steps, scale * (mean - std), scale * (mean + std), alpha=0.15)
        left.set_ylabel("greedy win rate (%)")
        right.set_ylabel("greedy return")
        for ax in (left, right):
            ax.set_xlabel("environment steps (each of the parallel episodes)")
        left.legend(fontsize=7)
        fig.suptitle("privacy-engineered value decomposition (seed 003, Figs. 4.12-4.16; cooperative navigation)",
                     fontsize=9)
