"""``leaklab reproduce dp-drl``: seed 002, chapter 5, Tables 5.1-5.3 and Fig. 5.5: DP-DRL against the
environment-inference (privacy-leakage) attack on grid-world DQN agents.

For every map size, ``maps`` random floor plans under the structural constraints
(:func:`~leaklab.rl.envs.grid_world.random_map`; the thesis' own maps, Pan et al.'s 12x11 example among them, are
published only as pictures), by default only maps whose shortest path a memoryless agent seeing its 8 neighbours can
walk (the thesis' agents walked theirs), and for every map one DQN agent per defense setting: none, DP-DRL at each
fixed eps, and DP-DRL with the dynamic budget (:mod:`leaklab.rl.agents.grid_dqn`, all agents in one batch). The
attacker then runs the genetic search (:mod:`leaklab.attacks.environment_search`) against each trained policy,
queried with the true observations of its candidates (the defense is training-time only), and scores the recovered
map's GRR and NRR. Beside them, two no-information baselines: ``prior_nrr``, what random maps under the same
constraints recover, and ``free_guess_nrr``, what guessing every interior cell free recovers (the best constant
guess on maps with fewer walls than free cells).

Utility (Table 5.3) on the largest size: episode return and length in the initial stage (the thesis: epochs
300-1000 of 100,000) and the final stage (its last 1,000), and the first episode that reached the goal; leaklab's
runs are shorter, so with fewer than 2,000 episodes the stages are the episodes [15%, 50%) and the second half. The
time per step of DP-DRL's obfuscation and of a whole training step is measured on one agent alone, as the thesis'
(the batch's amortised times are in ``training``).

Writes ``OUT/results.json``, ``OUT/policies.safetensors`` (the trained networks, row ``k`` of each tensor the
agent of ``rows[k]``), ``OUT/recovered_maps.png`` (Table 5.2), ``OUT/nrr_generations.png`` (Fig. 5.5) and
``OUT/learning_curves.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from leaklab import seeds
from leaklab.attacks.environment_search import SearchConfig, SearchResult, policy_table, recovery_rates, search
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn
from leaklab.experiments.attack_pool import start_worker, stop_workers, worker_count
from leaklab.fields import Seed
from leaklab.io import DP_DRL_TABLE_FORMAT, RESULTS_FILE, atomic_dir, save_tensors, write_json
from leaklab.rl.agents.grid_dqn import GridDQNConfig, q_values, train_grid_dqn
from leaklab.rl.envs.grid_world import GridMap, distances, random_map

POLICIES_FILE = "policies.safetensors"
MAPS_FILE = "recovered_maps.png"
NRR_FILE = "nrr_generations.png"
CURVES_FILE = "learning_curves.png"
PUBLISHED = {  # seed 002, Table 5.1: (GRR, NRR) per size and defense; Table 5.3 on the 12x11 map
    "table_5_1": {
        "7x7": {"none": (0.9426, 0.8874), "1.0": (0.9292, 0.8612), "0.7": (0.8939, 0.7920),
                "0.4": (0.8729, 0.7509), "0.1": (0.8482, 0.7025), "dynamic": (0.8519, 0.7097)},
        "9x9": {"none": (0.8729, 0.7899), "1.0": (0.8510, 0.7536), "0.7": (0.8377, 0.7317),
                "0.4": (0.8131, 0.6910), "0.1": (0.8011, 0.6712), "dynamic": (0.8092, 0.6846)},
        "11x11": {"none": (0.8520, 0.7789), "1.0": (0.8387, 0.7590), "0.7": (0.8113, 0.7181),
                  "0.4": (0.7775, 0.6676), "0.1": (0.7665, 0.6512), "dynamic": (0.7727, 0.6605)},
        "12x11": {"none": (0.8417, 0.7678), "1.0": (0.8289, 0.7491), "0.7": (0.7992, 0.7055),
                  "0.4": (0.7688, 0.6609), "0.1": (0.7619, 0.6507), "dynamic": (0.7663, 0.6572)},
    },
    "table_5_3": {  # initial (min, avg, max reward; max, avg, min steps), final (avg, max reward; avg, min steps)
        "none": ((-50, -0.96, 1, 500, 74.63, 17), (0.98, 1, 20.52, 17)),
        "1.0": ((-50, -1.13, 1, 500, 87.35, 17), (0.97, 1, 22.84, 17)),
        "0.7": ((-50, -1.42, 1, 500, 97.17, 17), (0.95, 1, 24.92, 17)),
        "0.4": ((-50, -1.49, 1, 500, 105.42, 17), (0.94, 1, 26.16, 17)),
        "0.1": ((-50, -1.60, 1, 500, 111.91, 17), (0.92, 1, 28.28, 17)),
        "dynamic": ((-50, -1.18, 1, 500, 90.22, 17), (0.96, 1, 23.13, 17)),
        "seconds_per_step": {"obfuscation": 1.62e-05, "drl": 9.26e-04},
    },
    "claim": "DP-DRL lowers the recovery rate by 10-15%; eps 1.0 to 0.1 by up to 10%; dynamic eps close to 0.1",
}


def _fixed_budgets(v: list[float]) -> list[float]:
    if any(not 0 < e <= 100 for e in v) or len(set(v)) != len(v):
        raise ValueError("epsilons are distinct values in (0, 100]")
    return sorted(v, reverse=True)


FixedBudgets = Annotated[list[float], AfterValidator(_fixed_budgets)]  # DP-DRL's fixed eps, largest first


def defense_budgets(epsilons: list[float], dynamic: bool) -> list[float | str | None]:
    """The agents' defenses: none, DP-DRL at each fixed eps, then (``dynamic``) at the dynamic budget."""
    return [None, *epsilons, *(["dynamic"] if dynamic else [])]


class DpDrlTableConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sizes: list[tuple[int, int]] = Field(default_factory=lambda: [(7, 7), (9, 9), (11, 11), (12, 11)], min_length=1)
    maps: int = Field(default=2, ge=1, le=100, description="random maps per size")
    wall_fraction: float = Field(default=0.3, ge=0, lt=1)
    reactive: bool = Field(default=True, description="only maps whose shortest path an agent seeing 8 cells can walk")
    epsilons: FixedBudgets = Field(default_factory=lambda: [1.0, 0.7, 0.4, 0.1])
    dynamic: bool = Field(default=True, description="also DP-DRL with the dynamic budget arctan(d_max - d_min)")
    training: GridDQNConfig = GridDQNConfig()
    search: SearchConfig = SearchConfig()
    seed: Seed = 0

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if any(not (4 <= h <= 40 and 4 <= w <= 40) for h, w in v) or len(set(v)) != len(v):
            raise ValueError("sizes are distinct (rows, columns) pairs between 4 and 40")
        return v

    @model_validator(mode="after")
    def _stages(self) -> "DpDrlTableConfig":
        if self.training.episodes < 2:
            raise ValueError("the utility's two stages need at least 2 episodes")
        return self

    @model_validator(mode="after")
    def _one_seed(self) -> "DpDrlTableConfig":
        """Training and search draw from the run's seed unless their own configs are given."""
        if "training" not in self.model_fields_set:
            self.training = self.training.model_copy(update={"seed": self.seed})
        if "search" not in self.model_fields_set:
            self.search = self.search.model_copy(update={"seed": self.seed})
        return self

    def budgets(self) -> list[float | str | None]:
        return defense_budgets(self.epsilons, self.dynamic)

    @classmethod
    def quick(cls, seed: int = 0) -> "DpDrlTableConfig":
        return cls(sizes=[(6, 6)], maps=1, epsilons=[0.1],
                   training=GridDQNConfig(episodes=40, max_steps=60, learning_starts=50, seed=seed),
                   search=SearchConfig(population=10, generations=4, seed=seed), seed=seed)


def budget_name(budget: float | str | None) -> str:
    return "none" if budget is None else str(budget)


def stages(episodes: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The initial and final stages' episode ranges (see the module's docstring)."""
    if episodes >= 2000:
        return (300, 1000), (episodes - 1000, episodes)
    return (int(0.15 * episodes), episodes // 2), (episodes // 2, episodes)


def utility(returns: list[float], lengths: list[int], goals: list[bool], episodes: int) -> dict:
    """Table 5.3's statistics of one agent's episodes (``goals``: whether each reached the goal)."""
    (a, b), (c, d) = stages(episodes)
    r, n = np.array(returns), np.array(lengths)
    reached = np.flatnonzero(goals)
    return {"initial": {"reward_min": float(r[a:b].min()), "reward_mean": float(r[a:b].mean()),
                        "reward_max": float(r[a:b].max()), "steps_max": int(n[a:b].max()),
                        "steps_mean": float(n[a:b].mean()), "steps_min": int(n[a:b].min())},
            "final": {"reward_mean": float(r[c:d].mean()), "reward_max": float(r[c:d].max()),
                      "steps_mean": float(n[c:d].mean()), "steps_min": int(n[c:d].min())},
            "first_goal_episode": int(reached[0]) + 1 if len(reached) else None}


def _single_agent_timing(grid: GridMap, config: GridDQNConfig) -> dict:
    """Seconds per step of one agent trained alone with DP-DRL (dynamic budget): the whole step (``dp_drl``), its
    obfuscation, and the rest (``drl``, the step an undefended agent takes), as the thesis' two columns."""
    short = config.model_copy(update={"episodes": 5, "max_steps": 200, "learning_starts": 100})
    _, private = train_grid_dqn([grid], ["dynamic"], short)
    return {"drl": private.seconds_per_step - private.obfuscation_seconds_per_step,
            "dp_drl": private.seconds_per_step, "obfuscation": private.obfuscation_seconds_per_step}


def _search_job(job: tuple) -> SearchResult:
    table, grid, search_config = job
    return search(table, grid.shape, grid.start, grid.goal, search_config, truth=grid.free)


def _searches(jobs: list[tuple], workers: int, done: Callable[[int], None] | None) -> list[SearchResult]:
    """Each job's genetic search, in ``workers`` spawned processes (0: one per usable core), set up as the room
    attacks' workers are (:func:`~leaklab.experiments.attack_pool.start_worker`: Ctrl-C is the parent's, a worker
    ends with its parent); each search has its own seed, so the results do not depend on the number of workers."""
    workers = worker_count(workers, len(jobs))
    if workers == 1:
        results = []
        for job in jobs:
            results.append(_search_job(job))
            if done:
                done(len(results))
        return results
    found: list[SearchResult | None] = [None] * len(jobs)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker,
                               initargs=(None, faulthandler.is_enabled(), os.getpid()))
    try:
        futures = {pool.submit(_search_job, job): k for k, job in enumerate(jobs)}
        for n, future in enumerate(as_completed(futures), start=1):
            found[futures[future]] = future.result()
            if done:
                done(n)
    except (KeyboardInterrupt, SystemExit):
        stop_workers(pool)
        raise
    except BrokenProcessPool:
        raise LeaklabError("a search worker process ended abruptly (killed, for memory say, or crashed); nothing "
                           "is written, and fewer --workers need less memory") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return found


def run(out: Path, config: DpDrlTableConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None, workers: int = 1) -> dict:
    """Generate, train, attack (in ``workers`` processes, 0: one per core) and write ``out`` atomically; returns the
    results (also ``results.json``)."""
    config = config or (DpDrlTableConfig.quick() if quick else DpDrlTableConfig())
    start = time.perf_counter()
    map_rng = np.random.default_rng(seeds.stream_seed(config.seed, "grid-maps"))
    grids = [(size, i, random_map(*size, map_rng, config.wall_fraction, reactive=config.reactive))
             for size in config.sizes for i in range(config.maps)]
    budgets = config.budgets()
    agents = [(size, i, grid, b) for size, i, grid in grids for b in budgets]
    net, training = train_grid_dqn(
        [a[2] for a in agents], [a[3] for a in agents], config.training,
        progress=None if progress is None else lambda done, total: progress("DQN episodes", done, total))
    with atomic_dir(out, DP_DRL_TABLE_FORMAT) as tmp:
        rows, recovered = [], {}
        final_stage = stages(config.training.episodes)[1][0]
        jobs = [(policy_table(lambda x, k=k: q_values(net.agent(k), x), config.search.temperature,
                              grid.shape if config.training.position else None), grid,
                 config.search.model_copy(update={"seed": seeds.stream_seed(config.search.seed, "search", k)}))
                for k, (_, _, grid, _) in enumerate(agents)]
        found_all = _searches(jobs, workers, None if progress is None else
                              lambda done: progress("policies attacked", done, len(agents)))
        for k, ((size, i, grid, budget), found) in enumerate(zip(agents, found_all)):
            grr, nrr = recovery_rates(found.recovered.free, grid.free)
            rows.append({"size": f"{size[0]}x{size[1]}", "map": i, "defense": budget_name(budget), "grr": grr,
                         "nrr": nrr, "prior_nrr": found.prior_nrr,
                         "free_guess_nrr": float(grid.free[1:-1, 1:-1].mean()), "fitness": found.fitness[-1],
                         "nrr_per_generation": found.nrr, "shortest_path": int(distances(grid.free, grid.goal)[
                             grid.start]),
                         "utility": utility(training.returns[k], training.lengths[k], training.reached[k],
                                            config.training.episodes),
                         "final_goal_rate": float(np.mean(training.reached[k][final_stage:])),
                         "recovered": found.recovered.to_json()})
            recovered[(size, i, budget_name(budget))] = found.recovered
        results = {"format": DP_DRL_TABLE_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"),
                   "maps": [{"size": f"{s[0]}x{s[1]}", "map": i, **g.to_json()} for s, i, g in grids],
                   "rows": rows, "table": _table(rows, budgets), "utility": _utility_table(rows, budgets),
                   "timing": _single_agent_timing(grids[-1][2], config.training),
                   "training": {"lockstep_steps": training.steps,
                                "seconds_per_agent_step": training.seconds_per_step,
                                "obfuscation_seconds_per_agent_step": training.obfuscation_seconds_per_step},
                   "published": PUBLISHED, "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        save_tensors(tmp / POLICIES_FILE, {f"{'weight' if i % 2 == 0 else 'bias'}{i // 2}": p
                                           for i, p in enumerate(net.params)})
        _plot_maps(tmp / MAPS_FILE, grids, recovered, budgets)
        _plot_nrr(tmp / NRR_FILE, rows, budgets)
        _plot_curves(tmp / CURVES_FILE, rows, training.returns)
    return results


def _table(rows: list[dict], budgets: list) -> list[dict]:
    """Table 5.1: mean GRR, NRR and prior NRR per size and defense, over the size's maps."""
    table = []
    for size in dict.fromkeys(r["size"] for r in rows):
        for b in map(budget_name, budgets):
            cell = [r for r in rows if r["size"] == size and r["defense"] == b]
            table.append({"size": size, "defense": b, "maps": len(cell),
                          **{key: float(np.mean([r[key] for r in cell]))
                             for key in ("grr", "nrr", "prior_nrr", "free_guess_nrr", "final_goal_rate")}})
    return table


def _largest(rows: list[dict]) -> str:
    """The size with the most cells (the first of equals)."""
    return max(dict.fromkeys(r["size"] for r in rows), key=lambda s: int(s.split("x")[0]) * int(s.split("x")[1]))


def _utility_table(rows: list[dict], budgets: list) -> list[dict]:
    """Table 5.3 on the largest size: per defense, the stages' statistics over its maps (min of the minima, mean of
    the means, max of the maxima)."""
    largest = _largest(rows)
    out = []
    for b in map(budget_name, budgets):
        cell = [r["utility"] for r in rows if r["size"] == largest and r["defense"] == b]
        merged = {"size": largest, "defense": b}
        for stage in ("initial", "final"):
            for key in cell[0][stage]:
                values = [u[stage][key] for u in cell]
                merged[f"{stage}_{key}"] = float(min(values) if key.endswith("min") else max(values)
                                                 if key.endswith("max") else np.mean(values))
        firsts = [u["first_goal_episode"] for u in cell]
        merged["first_goal_episode"] = None if None in firsts else float(np.mean(firsts))
        out.append(merged)
    return out


def _label(defense: str) -> str:
    return {"none": "no defense", "dynamic": "dynamic eps"}.get(defense, f"eps {defense}")


def _draw(ax, grid: GridMap, truth: GridMap | None, title: str) -> None:
    picture = np.where(grid.free, 0.92, 0.15)[..., None].repeat(3, axis=2)
    if truth is not None:  # wrongly recovered cells in orange
        picture[grid.free != truth.free] = (1.0, 0.55, 0.0)
    picture[grid.start] = (0.1, 0.7, 0.2)
    picture[grid.goal] = (0.85, 0.1, 0.1)
    ax.imshow(picture, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_maps(path: Path, grids: list, recovered: dict, budgets: list) -> None:
    from leaklab.report.plots import saved_figure

    shown = [b for b in map(budget_name, budgets) if b in ("none", "dynamic")]
    smallest = [b for b in map(budget_name, budgets) if b not in ("none", "dynamic")][-1:]
    columns = [shown[0], *smallest, *shown[1:]]
    firsts = [(s, g) for s, i, g in grids if i == 0]
    with saved_figure(path, len(firsts), 1 + len(columns), figsize=(2.2 * (1 + len(columns)), 2.3 * len(firsts)),
                      squeeze=False) as (fig, axes):
        for row, (size, grid) in zip(axes, firsts):
            _draw(row[0], grid, None, f"{size[0]}x{size[1]} truth")
            for ax, b in zip(row[1:], columns):
                found = recovered[(size, 0, b)]
                _, nrr = recovery_rates(found.free, grid.free)
                _draw(ax, found, grid, f"{_label(b)} (NRR {100 * nrr:.0f}%)")
        fig.suptitle("recovered floor plans (seed 002, Table 5.2): orange = wrong; green start, red goal", fontsize=9)


def _plot_nrr(path: Path, rows: list[dict], budgets: list) -> None:
    from leaklab.report.plots import saved_figure

    sizes = list(dict.fromkeys(r["size"] for r in rows))
    with saved_figure(path, 1, len(sizes), figsize=(max(5.5, 3.4 * len(sizes)), 3), squeeze=False) as (fig, axes):
        for ax, size in zip(axes[0], sizes):
            for b in map(budget_name, budgets):
                curves = np.array([r["nrr_per_generation"] for r in rows if r["size"] == size and r["defense"] == b])
                ax.plot(100 * curves.mean(axis=0), label=_label(b), marker="o" if curves.shape[1] == 1 else None)
            for key, style in (("prior_nrr", ":"), ("free_guess_nrr", "--")):
                ax.axhline(100 * np.mean([r[key] for r in rows if r["size"] == size]), color="grey", linestyle=style,
                           linewidth=0.8)
            ax.set_title(size, fontsize=9)
            ax.set_xlabel("generation")
            ax.set_ylabel("NRR of the fittest map (%)")
        axes[0][0].legend(fontsize=7, title="dotted: random maps; dashed: all free", title_fontsize=7, loc="best")
        fig.suptitle("the genetic search against each policy (seed 002, Fig. 5.5)", fontsize=9)


def _plot_curves(path: Path, rows: list[dict], returns: list[list[float]]) -> None:
    from leaklab.report.plots import saved_figure

    largest = _largest(rows)
    with saved_figure(path, figsize=(6, 3.2)) as (fig, ax):
        for b in dict.fromkeys(r["defense"] for r in rows):
            curves = np.array([returns[k] for k, r in enumerate(rows) if r["size"] == largest and r["defense"] == b])
            mean = curves.mean(axis=0)
            window = max(1, len(mean) // 50)
            smooth = np.convolve(mean, np.ones(window) / window, mode="valid")
            ax.plot(np.arange(len(smooth)) + window, smooth, label=_label(b), linewidth=0.9)
        ax.set_xlabel("episode")
        ax.set_ylabel(f"return (moving mean of {max(1, len(returns[0]) // 50)})")
        ax.set_title(f"DQN on the {largest} maps with and without DP-DRL (seed 002, Table 5.3)", fontsize=9)
        ax.legend(fontsize=7)
