"""``leaklab reproduce dp-planning``: seed 002, chapter 4, Figs. 4.7-4.11: differentially private multi-agent
planning (DP-based) against No-privacy, Best-first and Greedy (GPPP) on simulated logistics maps and packet-routing
networks, and what the shared maps still tell a curious agent.

Settings (Sec. 4.8.1; :mod:`leaklab.planning.dp_logistics` for the simulation and its documented choices): maps of
10-50 logistic centres with 5 bases per agent, packages created with probability 0.2 per base and round, eps 0.5
per agent, a plan's message budget C = 30 + centres (the thesis: "C = 40 to C = 80 depending on variations in the
map/network size"),
alpha 0.1, gamma 0.9, zeta 0.95; packet routing with dynamism 0.1 (a base leaves, one joins, each with that
probability per agent on a route); eps 0.2-0.8 and dynamism 0.05-0.2 at 10 centres.

Experiments, each on ``maps`` random maps per setting (every approach meets the same map and, where the network is
static, the same packages): the map-size sweep in both scenarios (Figs. 4.7, 4.9), the eps sweep of DP-based in both
(Figs. 4.8, 4.10, with No-privacy beside it) and the dynamism sweep (Fig. 4.11). Recorded per approach: the success
rate (delivered over generated, pooled), the mean real route length of the delivered packages, the messages per
plan, each with its standard error over the maps, and on a static network the route length relative to No-privacy
on the packages both delivered (a paired ratio: an approach that delivers only nearby packages has a short mean
length; the thesis compares unpaired means).

Leakage of the shared maps (the thesis argues privacy by Theorems 4.3-4.4 and implements no attack): per map size
and eps, the released node count against the real one and Corollary 4.1's ceil(d_max / eps), the L1 gap between
the noisy target histogram and the one the rewiring realised, the share of real routes the released map keeps and
of released routes that are real; for every node with two or more kept real routes (per centre pair), whether the
pseudo-lengths a receiver reads off the released probabilities (1 / p, after inverting Eq. 4.2) order those routes
as their true lengths do (pairwise agreement) and give their exact length ratios; the share of centre pairs whose
learned greedy walk reaches the exit centre; the largest error of inverting Eq. 4.2; and the largest L1 change of a
degree histogram when one base goes (the thesis' Delta_S is 1). And Theorem 4.5: the most messages a goal-finding
(flood and reply, no budget) takes on each map, over every pair of agents, against the bound sum_c lc_c.

Writes ``OUT/results.json`` and ``OUT/dp_planning.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from leaklab import seeds
from leaklab.experiments import ProgressFn
from leaklab.fields import EpsilonGrid, Seed
from leaklab.io import DP_PLANNING_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.planning.dp_logistics import (APPROACHES, PlanningSetup, ReleasedArea, discovery_messages,
                                           release_area, simulate)
from leaklab.planning.logistics_map import MAX_CENTRES, LogisticsMap, random_logistics_map
from leaklab.planning.map_obfuscation import (RouteLearning, hidden_nodes, histogram_sensitivity,
                                              invert_redistribution, reaches_exit)

FIGURE_FILE = "dp_planning.png"
SCENARIOS = {"logistics": 0.0, "packet-routing": None}  # None: the config's dynamism
PUBLISHED = {  # seed 002, Secs. 4.8.2-4.8.3: figures only; these are the numbers and trends its text gives
    "dp_vs_best_first": "about 25% shorter routes, 20% less communication, 10% higher success rate",
    "dp_vs_greedy": "about 15% shorter routes, 10% less communication, 5% higher success rate",
    "dp_vs_no_privacy": "about 2-3% longer routes, 2% more communication, 2% lower success rate",
    "map_size": "larger maps: longer routes and more messages, lower success, for every approach",
    "epsilon": "larger eps (0.2 to 0.8, 10 centres): shorter routes, fewer messages, higher success",
    "dynamism": "more dynamism (0.05 to 0.2) costs Best-first and Greedy messages and success, barely DP-based "
                "and No-privacy",
}


def _sizes(values: list[int]) -> list[int]:
    if not values or any(not 3 <= v <= MAX_CENTRES for v in values):
        raise ValueError(f"map sizes are 3 to {MAX_CENTRES} logistic centres")
    return sorted(set(values))


def _dynamisms(values: list[float]) -> list[float]:
    if not values or any(not 0 <= v <= 1 for v in values):
        raise ValueError("dynamisms are probabilities from 0 to 1")
    return sorted(set(values))


class DpPlanningConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    maps: int = Field(default=10, ge=1, le=10_000, description="random maps per setting")
    sizes: Annotated[list[int], AfterValidator(_sizes)] = Field(default_factory=lambda: [10, 20, 30, 40, 50])
    epsilon: float = Field(default=0.5, gt=0, le=1e3)
    epsilons: EpsilonGrid = Field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8])
    sweep_size: int = Field(default=10, ge=3, le=MAX_CENTRES, description="map size of the eps and dynamism sweeps")
    dynamism: float = Field(default=0.1, ge=0, le=1)
    dynamisms: Annotated[list[float], AfterValidator(_dynamisms)] = Field(
        default_factory=lambda: [0.05, 0.1, 0.15, 0.2])
    rounds: int = Field(default=5, ge=1, le=10_000)
    learning: RouteLearning = RouteLearning()
    seed: Seed = 0

    @classmethod
    def quick(cls, seed: int = 0) -> "DpPlanningConfig":
        return cls(maps=1, sizes=[6, 10], epsilons=[0.2, 0.8], dynamisms=[0.1], rounds=2, sweep_size=6,
                   learning=RouteLearning(episodes=10, max_steps=20), seed=seed)

    def setup(self, size: int, epsilon: float, dynamism: float) -> PlanningSetup:
        return PlanningSetup(epsilon=epsilon, budget=30 + size, rounds=self.rounds, dynamism=dynamism,
                             learning=self.learning)


def _leakage(lmap: LogisticsMap, released: dict[int, ReleasedArea], epsilon: float) -> dict:
    """What the released maps of one map tell a receiver (module docstring)."""
    real_nodes, shown_nodes, corollary, kept, real_share, gaps, inversion = [], [], [], [], [], [], 0.0
    agree = pairs = exact = nodes = reached = walks = 0
    for area, release in released.items():
        local, shown = lmap.local(area), release.topology.graph
        real_nodes.append(local.number_of_nodes())
        shown_nodes.append(shown.number_of_nodes())
        corollary.append(hidden_nodes(epsilon, release.topology.d_max))
        target, realised = release.topology.target, release.topology.realised
        width = max(target.size, realised.size)
        gaps.append(int(np.abs(np.pad(target, (0, width - target.size))
                               - np.pad(realised, (0, width - realised.size))).sum()))
        real_edges = {frozenset(e) for e in local.edges}
        shown_edges = {frozenset(e) for e in shown.edges}
        kept.append(len(real_edges & shown_edges) / len(real_edges))
        real_share.append(len(real_edges & shown_edges) / len(shown_edges))
        for (a, b), probabilities in release.probabilities.items():
            walks += 1
            reached += reaches_exit(release.learned[a, b], a, b)
            for v, (order, p) in probabilities.items():
                recovered = invert_redistribution(p, epsilon)
                inversion = max(inversion, float(np.abs(recovered - release.learned[a, b][v][1]).max()))
                real = [(local.edges[v, u]["length"], 1.0 / recovered[k]) for k, u in enumerate(order)
                        if frozenset((u, v)) in real_edges]
                if len(real) < 2:
                    continue
                truth, pseudo = np.array(real).T
                nodes += 1
                exact += bool(np.allclose(pseudo / pseudo[0], truth / truth[0], rtol=1e-6))
                for i in range(len(real)):
                    for j in range(i + 1, len(real)):
                        if truth[i] != truth[j]:
                            pairs += 1
                            agree += (truth[i] < truth[j]) == (pseudo[i] < pseudo[j])
    return {"real_nodes": float(np.mean(real_nodes)), "released_nodes": float(np.mean(shown_nodes)),
            "node_count_abs_error": float(np.mean(np.abs(np.subtract(shown_nodes, real_nodes)))),
            "corollary_4_1_nodes": float(np.mean(corollary)), "histogram_gap": float(np.mean(gaps)),
            "real_routes_kept": float(np.mean(kept)), "released_routes_real": float(np.mean(real_share)),
            "length_order_agreement": agree / pairs if pairs else float("nan"),
            "exact_ratio_share": exact / nodes if nodes else float("nan"),
            "exit_reached_share": reached / walks if walks else float("nan"), "inversion_max_error": inversion}


def _sensitivity(lmap: LogisticsMap) -> int:
    """The largest L1 change of an agent's degree histogram when one of its bases goes (the thesis: 1)."""
    worst = 0
    for area in range(lmap.agents):
        local = lmap.local(area)
        d_max = max(d for _, d in local.degree())
        worst = max(worst, histogram_sensitivity(local, d_max, lmap.bases[area]))
    return worst


def _summary(outcomes_per_map: list[list], paired: list[tuple[np.ndarray, np.ndarray]] | None) -> dict:
    """Pooled rates and means with their standard errors over the maps; the paired length ratio when given."""
    delivered = [np.array([o.delivered for o in m]) for m in outcomes_per_map]
    lengths = [np.array([o.length for o in m if o.delivered]) for m in outcomes_per_map]
    messages = [np.array([o.messages for o in m]) for m in outcomes_per_map]

    def error(values: list[float]) -> float | None:
        values = [v for v in values if np.isfinite(v)]
        return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None

    pooled_lengths = np.concatenate(lengths)
    row = {"packages": int(sum(len(d) for d in delivered)),
           "success_rate": float(np.concatenate(delivered).mean()),
           "success_rate_se": error([d.mean() for d in delivered]),
           "route_length": float(pooled_lengths.mean()) if pooled_lengths.size else None,
           "route_length_se": error([x.mean() if x.size else np.nan for x in lengths]),
           "messages_per_plan": float(np.concatenate(messages).mean()),
           "messages_per_plan_se": error([m.mean() for m in messages])}
    if paired is not None:
        mine = np.concatenate([a for a, _ in paired])
        theirs = np.concatenate([b for _, b in paired])
        both = np.isfinite(mine) & np.isfinite(theirs)
        row["length_vs_no_privacy"] = float(mine[both].sum() / theirs[both].sum()) if both.any() else None
        row["paired_packages"] = int(both.sum())
    return row


def run(out: Path, config: DpPlanningConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Run the sweeps; write ``out`` atomically; returns the results (also ``results.json``)."""
    config = config or (DpPlanningConfig.quick() if quick else DpPlanningConfig())
    check_out(out, DP_PLANNING_FORMAT)  # before the work, not after it
    start = time.perf_counter()
    sizes = sorted(set(config.sizes) | {config.sweep_size})
    epsilons = sorted(set(config.epsilons) | {config.epsilon})
    # every (experiment, scenario, setting, approach): one list of outcomes per map
    runs: dict[tuple, list] = {}
    leakage: dict[tuple[int, float], list[dict]] = {}
    sensitivity, discovery = {}, {}
    total, done = config.maps * len(sizes), 0
    for m in range(config.maps):
        for size in sizes:
            lmap = random_logistics_map(size, np.random.default_rng(seeds.stream_seed(config.seed, "map", size, m)))
            sensitivity[size] = max(sensitivity.get(size, 0), _sensitivity(lmap))
            worst = max(discovery_messages(lmap, a, b) for a in range(size) for b in range(size) if a != b)
            discovery.setdefault(size, []).append((worst, lmap.capacity_bound()))
            wanted = epsilons if size == config.sweep_size else [config.epsilon]
            releases = {}
            for eps in wanted:
                rng = np.random.default_rng(seeds.stream_seed(config.seed, "release", size, m, eps))
                releases[eps] = {a: release_area(lmap, a, eps, rng, config.learning) for a in range(lmap.agents)}
                leakage.setdefault((size, eps), []).append(_leakage(lmap, releases[eps], eps))
            settings = []  # (experiment, scenario, x, approaches, eps, dynamism)
            for scenario, dynamism in SCENARIOS.items():
                dynamism = config.dynamism if dynamism is None else dynamism
                if size in config.sizes:
                    settings.append(("map_size", scenario, size, APPROACHES, config.epsilon, dynamism))
                if size == config.sweep_size:
                    settings += [("epsilon", scenario, eps, ("dp", "no-privacy"), eps, dynamism)
                                 for eps in config.epsilons]
            if size == config.sweep_size:
                settings += [("dynamism", "packet-routing", d, APPROACHES, config.epsilon, d) for d in config.dynamisms]
            for experiment, scenario, x, approaches, eps, dynamism in settings:
                stream = seeds.stream_seed(config.seed, "packages", scenario, size, m, dynamism)
                for approach in approaches:
                    outcomes = simulate(lmap, approach, config.setup(size, eps, dynamism),
                                        np.random.default_rng(stream), releases[eps] if approach == "dp" else None)
                    runs.setdefault((experiment, scenario, x, approach), []).append(outcomes)
            done += 1
            if progress is not None:
                progress("maps", done, total)
    experiments: dict = {}
    for (experiment, scenario, x, approach), per_map in runs.items():
        baseline = runs.get((experiment, scenario, x, "no-privacy"))
        paired = None
        if SCENARIOS[scenario] == 0.0 and baseline is not None:
            paired = [(np.array([o.length for o in a]), np.array([o.length for o in b]))
                      for a, b in zip(per_map, baseline)]
        key = f"{scenario}/{experiment}"
        experiments.setdefault(key, {}).setdefault(approach, {})[f"{x:g}"] = _summary(per_map, paired)
    leaks = {f"{size} centres, eps {eps:g}": {"size": size, "epsilon": eps,
                                             **{k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}}
             for (size, eps), rows in sorted(leakage.items())}
    with atomic_dir(out, DP_PLANNING_FORMAT) as tmp:
        results = {"format": DP_PLANNING_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "experiments": experiments, "leakage": leaks,
                   "histogram_sensitivity": {str(k): v for k, v in sorted(sensitivity.items())},
                   "theorem_4_5": {str(k): {"worst_discovery": max(w for w, _ in v),
                                            "worst_over_bound": max(w / b for w, b in v),
                                            "mean_bound": float(np.mean([b for _, b in v]))}
                                   for k, v in sorted(discovery.items())},
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / FIGURE_FILE, experiments)
    return results


def _plot(path: Path, experiments: dict) -> None:
    """Figs. 4.7-4.11: per sweep the route length (relative to No-privacy on the same packages where the network is
    static), messages per plan and success rate against its parameter, one line per approach."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, len(experiments), 3, figsize=(12, 2.8 * len(experiments)), squeeze=False) as (fig, axes):
        for row, (key, by_approach) in zip(axes, sorted(experiments.items())):
            paired = all("length_vs_no_privacy" in r for points in by_approach.values() for r in points.values())
            metrics = (("length_vs_no_privacy", "route length / No-privacy's, same packages") if paired else
                       ("route_length", "route length, delivered packages only"),
                       ("messages_per_plan", "messages per plan"), ("success_rate", "success rate"))
            for ax, (metric, label) in zip(row, metrics):
                for approach, points in by_approach.items():
                    xs = [float(x) for x in points]
                    ys = [np.nan if points[x][metric] is None else points[x][metric] for x in points]
                    ax.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=approach)
                ax.set_title(f"{key}: {label}", fontsize=8)
                ax.set_xlabel(key.split("/")[1].replace("_", " "), fontsize=8)
            row[0].legend(fontsize=7)
        fig.suptitle("DP multi-agent planning (seed 002, Figs. 4.7-4.11; our maps, pooled over the maps)", fontsize=9)
