"""``leaklab reproduce dp-advising``: seed 002, chapter 3, Figs. 3.4-3.9: differentially private advising between
simultaneously learning agents whose action sets differ, against traditional advising and no advice.

Experiments (Sec. 3.6.1, Table 3.5: 10 users, 12 servers, 10 tasks, reward 2 on a task's optimal server, d = 0.7,
budgets 30, S = 1, 700 epochs), in the layouts of :mod:`leaklab.rl.envs.cloud_tasks`:

1. no advice and traditional advising with identical action sets, DP advising (eps = 1) with every agent one
   server apart (the same total knowledge);
2. all three strategies in one environment where only some agents share a set (``mixed``);
3. DP advising at eps 0.1, 0.4, 0.7, 1 and 2 in experiment 1's layout, beside no advice.

Every strategy runs ``runs`` times (the thesis does not say how often), run r of every strategy on the same reward
table (a paired comparison). Recorded per strategy: the convergence ratio per epoch (mean and standard deviation
over the runs), its difference from no advice (the thesis' "performance comparison" figures) averaged over epochs
1-200, 201-400 and 401-700 with its standard error over the runs, the first epoch at which the mean ratio reaches
92% (the thesis' plateau), the advice given per epoch, and the share of that advice that named the task's optimal
server.

Writes ``OUT/results.json`` and ``OUT/advising_curves.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from leaklab import seeds
from leaklab.experiments import ProgressFn
from leaklab.fields import EpsilonGrid, Seed
from leaklab.io import DP_ADVISING_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.rl.agents.advising import AdvisingConfig, simulate
from leaklab.rl.envs.cloud_tasks import CloudScenario

FIGURE_FILE = "advising_curves.png"
PLATEAU = 0.92
WINDOWS = ((1, 200), (201, 400), (401, 700))
PUBLISHED = {  # seed 002, Sec. 3.6.2: figures only; these are the numbers its text gives
    "experiment_1": "all three strategies converge to about 92%; DP advising fastest, about 7% above traditional RL "
                    "from the start to epoch 200; after epoch 400 it may drop by less than 0.5%",
    "experiment_2": "traditional advising close to traditional RL; DP advising clearly faster",
    "experiment_3": "performance rises with eps; eps = 0.1 worse than traditional RL, with a sharp rise near epoch "
                    "300 when most budgets are spent",
}


class DpAdvisingConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    runs: int = Field(default=50, ge=1, le=10_000, description="simulations per strategy")
    epochs: int = Field(default=700, ge=1, le=100_000)
    users: int = Field(default=10, ge=2, le=1000)
    servers: int = Field(default=12, ge=6, le=1000)
    tasks: int = Field(default=10, ge=1, le=1000)
    epsilons: EpsilonGrid = Field(default_factory=lambda: [0.1, 0.4, 0.7, 1.0, 2.0])
    learner: AdvisingConfig = AdvisingConfig()
    seed: Seed = 0

    @classmethod
    def quick(cls, seed: int = 0) -> "DpAdvisingConfig":
        return cls(runs=2, epochs=30, epsilons=[0.1, 1.0], seed=seed)

    def experiments(self) -> dict[str, list[tuple[str, str, str, float]]]:
        """Per experiment its strategies: (name, strategy, layout, eps)."""
        eps = self.learner.epsilon
        return {"experiment_1": [("no advice", "none", "identical", eps),
                                 ("traditional advising", "traditional", "identical", eps),
                                 ("DP advising", "dp", "one-different", eps)],
                "experiment_2": [("no advice", "none", "mixed", eps),
                                 ("traditional advising", "traditional", "mixed", eps),
                                 ("DP advising", "dp", "mixed", eps)],
                "experiment_3": [("no advice", "none", "identical", eps),
                                 *[(f"DP advising, eps {e:g}", "dp", "one-different", e) for e in self.epsilons]]}


def _strategy(config: DpAdvisingConfig, experiment: str, strategy: str, layout_name: str,
              eps: float) -> tuple[dict, np.ndarray]:
    """One strategy's runs: its row of results and every run's ratios ``[runs, epochs + 1]``."""
    learner = config.learner.model_copy(update={"strategy": strategy, "epsilon": eps, "epochs": config.epochs})
    ratios, advice, optimal = [], [], []
    for r in range(config.runs):
        table_rng = np.random.default_rng(seeds.stream_seed(config.seed, "dp-advising", experiment, r))
        scenario = CloudScenario.make(layout_name, table_rng, config.users, config.servers, config.tasks)
        run = simulate(scenario, learner, np.random.default_rng(
            seeds.stream_seed(config.seed, "dp-advising", experiment, strategy, eps, r)))
        ratios.append(run.ratio)
        advice.append(run.advice)
        optimal.append(run.optimal_advice)
    ratios, advice, optimal = np.array(ratios), np.array(advice), np.array(optimal)
    mean = ratios.mean(axis=0)
    reached = np.flatnonzero(mean >= PLATEAU)
    return {"strategy": strategy, "layout": layout_name, "epsilon": eps if strategy == "dp" else None,
            "ratio_mean": mean.tolist(), "ratio_std": ratios.std(axis=0).tolist(),
            "final_ratio": float(mean[-1]), "epoch_reaching_plateau": int(reached[0]) if len(reached) else None,
            "advice_per_epoch": advice.mean(axis=0).tolist(), "advice_total": float(advice.sum(axis=1).mean()),
            "optimal_advice_share": float(optimal.sum() / advice.sum()) if advice.sum() else None,
            "last_advice_epoch": float(np.mean([np.flatnonzero(a)[-1] + 1 if a.any() else 0 for a in advice]))}, ratios


def run(out: Path, config: DpAdvisingConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Run the three experiments; write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (DpAdvisingConfig.quick() if quick else DpAdvisingConfig())
    check_out(out, DP_ADVISING_FORMAT)  # before the work, not after it
    start = time.perf_counter()
    plan = config.experiments()
    total, done = sum(len(v) for v in plan.values()), 0
    experiments = {}
    for experiment, strategies in plan.items():
        rows, ratios = {}, {}
        for name, strategy, layout_name, eps in strategies:
            rows[name], ratios[name] = _strategy(config, experiment, strategy, layout_name, eps)
            done += 1
            if progress is not None:
                progress("strategies", done, total)
        for name, row in rows.items():  # run r of each strategy shares run r's reward table: paired differences
            gain = ratios[name] - ratios["no advice"]
            windows = {f"epochs {a}-{min(b, config.epochs)}": gain[:, a:b + 1].mean(axis=1)
                       for a, b in WINDOWS if a <= config.epochs}
            row["gain_over_no_advice"] = {k: float(v.mean()) for k, v in windows.items()}
            row["gain_standard_error"] = {k: float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None
                                          for k, v in windows.items()}
        experiments[experiment] = rows
    with atomic_dir(out, DP_ADVISING_FORMAT) as tmp:
        results = {"format": DP_ADVISING_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json", exclude={"learner": {"strategy", "epochs"}}),
                   "plateau": PLATEAU, "experiments": experiments,
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / FIGURE_FILE, experiments)
    return results


def _plot(path: Path, experiments: dict) -> None:
    """Figs. 3.4-3.9: per experiment the convergence ratio per epoch, and its difference from no advice."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, len(experiments), 2, figsize=(10, 3 * len(experiments)), squeeze=False) as (fig, axes):
        for (left, right), (experiment, rows) in zip(axes, experiments.items()):
            base = np.array(rows["no advice"]["ratio_mean"])
            for name, row in rows.items():
                mean = np.array(row["ratio_mean"])
                left.plot(100 * mean, label=name, linewidth=0.9)
                right.plot(100 * (mean - base), label=name, linewidth=0.9)
            left.axhline(100 * PLATEAU, color="grey", linestyle=":", linewidth=0.8)
            left.set_ylabel("convergence ratio (%)")
            right.set_ylabel("minus no advice (points)")
            left.set_title(experiment.replace("_", " "), fontsize=9)
            for ax in (left, right):
                ax.set_xlabel("epoch")
            left.legend(fontsize=7)
        fig.suptitle("differentially private advising (seed 002, Figs. 3.4-3.9; mean over the runs)", fontsize=9)
