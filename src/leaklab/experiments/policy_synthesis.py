"""``leaklab reproduce policy-synthesis``: seed 003, chapter 2, Fig. 2.1 and Sec. 2.7's timings: Algorithm 1
(privacy-engineered policy synthesis) and its cost of privacy over a range of Dirichlet concentrations k.

Examples (Sec. 2.7): ``investment``, Example 1 as leaklab designs it (:func:`~leaklab.planning.mdp.investment_mdp`;
the thesis' Fig. 2.2 is a picture the text leaves out), and ``random``, Example 2 (20 states, 5 actions, T = 10,
random transitions and rewards); beside them ``random-infinite``, Example 2's MDP with an infinite horizon and
discount 0.9, for Theorem 2.6 (the thesis shows no infinite-horizon experiment). For every example and k the
algorithm runs ``runs`` times (the thesis: 50) on one MDP, each run a fresh privatisation, and records the released
value V-bar(s0), the bounds lower(s0) and upper(s0), the cost bound upper - lower, and what only the experiment
knows: the released policy's value under the true transitions V(s0) (the thesis' "validation"), the optimal value
V*(s0), the realised cost |V(s0) - V-bar(s0)|, whether V(s0) lies between the bounds (the theorems bound the
posterior mean E[V(s0) | P-bar, k], which needs a prior on P to compute, not the true value), and the share of
transition vectors farther than alpha from the truth (Lemma 2.2 says at most beta in expectation). Each run's
bounds are also computed with the union-bound radius (``union_*``; see
:func:`~leaklab.planning.private_synthesis.concentration_radius`).

Lemma 2.2 is also checked alone by Monte Carlo on the vectors where its sub-Gaussian argument is tightest (two
states at 1/2) and on a spread one. The timing repeats the thesis' (4.88 s per k for Example 2; 9.34 s with T = 20,
9.68 s with 10 actions): the bounds by leaklab's closed form, and by the thesis' linear program (P) solved with
HiGHS once per stage, state, action and sense, as its complexity count has it (the LP bounds are also compared
with the closed form's).

Writes ``OUT/results.json`` and ``OUT/cost_of_privacy.png`` (Fig. 2.1) atomically; same seed, same numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaklab import seeds
from leaklab.experiments import ProgressFn
from leaklab.fields import Seed
from leaklab.io import POLICY_SYNTHESIS_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.planning.mdp import TabularMDP, evaluate, investment_mdp, optimal_policy, random_mdp
from leaklab.planning.private_synthesis import (concentration_radius, robust_evaluation, robust_expectation_lp,
                                                synthesize_private_policy)

FIGURE_FILE = "cost_of_privacy.png"
PUBLISHED = {  # seed 003, Sec. 2.7: no numbers for the values or the cost, only these timings and the trend
    "seconds_per_k": {"T=10, A=5": 4.88, "T=20, A=5": 9.34, "T=10, A=10": 9.68},
    "machine": "3.5 GHz CPU, 24 GB RAM",
    "claim": "the cost of privacy decreases as k grows; the bounds bracket the private and non-private values and "
             "approximate them closely",
}
EXAMPLES = ("investment", "random", "random-infinite")


class PolicySynthesisConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ks: list[float] = Field(default_factory=lambda: [2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
                            min_length=1, description="Dirichlet concentrations (the thesis' grid is not given)")
    runs: int = Field(default=50, ge=1, le=10_000, description="privatisations per example and k")
    beta: float = Field(default=0.05, gt=0, lt=1, description="the concentration bound's failure probability")
    states: int = Field(default=20, ge=2, le=500, description="Example 2's states")
    actions: int = Field(default=5, ge=1, le=100, description="Example 2's actions")
    horizon: int = Field(default=10, ge=1, le=1000, description="Example 2's horizon")
    discount: float = Field(default=0.9, gt=0, lt=1, description="the infinite-horizon variant's discount")
    lemma_draws: int = Field(default=200_000, ge=100, le=10_000_000, description="Monte Carlo draws per Lemma 2.2 "
                                                                                 "check")
    timing_k: float = Field(default=100, gt=0, description="the k the timing runs at")
    timing_lp: bool = Field(default=True, description="also time the thesis' linear programs")
    seed: Seed = 0

    @field_validator("ks")
    @classmethod
    def _ks(cls, v: list[float]) -> list[float]:
        if any(not 0 < k <= 1e6 for k in v) or len(set(v)) != len(v):
            raise ValueError("ks are distinct concentrations in (0, 1e6]")
        return sorted(v)

    @classmethod
    def quick(cls, seed: int = 0) -> "PolicySynthesisConfig":
        return cls(ks=[10, 1000], runs=3, states=6, actions=3, horizon=4, lemma_draws=2000, seed=seed)


def examples(config: PolicySynthesisConfig) -> dict[str, TabularMDP]:
    """The three example MDPs, the random ones drawn from the run's seed."""
    rng = np.random.default_rng(seeds.stream_seed(config.seed, "policy-synthesis", "mdp"))
    finite = random_mdp(config.states, config.actions, config.horizon, rng)
    return {"investment": investment_mdp(), "random": finite,
            "random-infinite": TabularMDP(finite.transitions, finite.rewards, None, config.discount)}


def _start(values: np.ndarray, mdp: TabularMDP) -> float:
    return float((values if values.ndim == 1 else values[0])[mdp.start])


def one_run(mdp: TabularMDP, k: float, beta: float, rng: np.random.Generator, optimal: float) -> dict:
    """Algorithm 1 once, with the bounds (Lemma 2.2's radius as printed, and the union-bound radius) and what only
    the experiment can measure against the true MDP."""
    out = synthesize_private_policy(mdp, k, rng, beta)
    true_value = _start(evaluate(mdp, out.policy), mdp)
    lower, upper = out.at_start(out.lower), out.at_start(out.upper)
    union = concentration_radius(k, beta, mdp.n_states)
    union_lower, union_upper = (out.at_start(robust_evaluation(out.private_mdp, out.policy, union, beta, sense))
                                for sense in ("min", "max"))
    far = np.abs(out.private_mdp.transitions - mdp.transitions).max(axis=-1)
    return {"private": out.private_value, "true": true_value, "lower": lower, "upper": upper,
            "bound": out.cost_bound, "cost": abs(true_value - out.private_value), "regret": optimal - true_value,
            "bracketed": bool(lower <= true_value <= upper), "far": float(np.mean(far >= out.alpha)),
            "union_lower": union_lower, "union_upper": union_upper, "union_bound": union_upper - union_lower,
            "union_far": float(np.mean(far >= union))}


def _summary(example: str, k: float, runs: list[dict], optimal: float, alpha: float, union: float) -> dict:
    row: dict = {"example": example, "k": k, "alpha": alpha, "union_alpha": union, "optimal": optimal,
                 "runs": len(runs)}
    for key in ("private", "true", "lower", "upper", "bound", "cost", "regret", "union_lower", "union_upper",
                "union_bound"):
        values = np.array([r[key] for r in runs])
        row[f"{key}_mean"], row[f"{key}_std"] = float(values.mean()), float(values.std())
    for key in ("bracketed", "far", "union_far"):
        row[key] = float(np.mean([r[key] for r in runs]))
    return row


def lemma_check(k: float, beta: float, draws: int, rng: np.random.Generator) -> list[dict]:
    """Lemma 2.2 by Monte Carlo: the share of Dir_k(p) draws with ||Dir_k(p) - p||_inf >= alpha, for p = (1/2, 1/2)
    (where the one-coordinate argument is tightest) and p uniform over 20 states (where dropping the maximum over
    coordinates matters), with the radius as printed and with the union bound."""
    rows = []
    for name, p in (("two states at 1/2", np.full(2, 0.5)), ("uniform over 20", np.full(20, 0.05))):
        deviation = np.abs(rng.dirichlet(k * p, size=draws) - p).max(axis=1)
        alpha, union = concentration_radius(k, beta), concentration_radius(k, beta, p.size)
        rows.append({"k": k, "p": name, "beta": beta, "draws": draws, "alpha": alpha,
                     "exceed": float(np.mean(deviation >= alpha)), "union_alpha": union,
                     "union_exceed": float(np.mean(deviation >= union))})
    return rows


def _lp_bounds(mdp: TabularMDP, policy: np.ndarray, alpha: float, beta: float) -> tuple[float, np.ndarray]:
    """Theorem 2.4's bounds with the linear program (P) solved for every stage, state, action and sense, as the
    thesis counts the work; seconds and the stage-0 bounds ``[2, S]``."""
    start = time.perf_counter()
    bounds = np.tile(mdp.terminal, (2, 1))
    for t in range(mdp.horizon - 1, -1, -1):
        inner = np.array([[[robust_expectation_lp(mdp.transitions[s, a], bounds[i], alpha, beta, sense)
                            for a in range(mdp.n_actions)] for s in range(mdp.n_states)]
                          for i, sense in enumerate(("min", "max"))])
        q = mdp.rewards + mdp.discount * inner
        bounds = q[:, np.arange(mdp.n_states), policy[t]]
    return time.perf_counter() - start, bounds


def timing(config: PolicySynthesisConfig) -> list[dict]:
    """Seconds per k to bound the cost of privacy of Example 2 and its two doublings (Sec. 2.7)."""
    rows = []
    for horizon, actions in ((config.horizon, config.actions), (2 * config.horizon, config.actions),
                             (config.horizon, 2 * config.actions)):
        draw = seeds.stream_seed(config.seed, "policy-synthesis", "timing", horizon, actions)
        mdp = random_mdp(config.states, actions, horizon, np.random.default_rng(draw))
        seconds = []
        for _ in range(3):  # the fastest of three identical runs
            start = time.perf_counter()
            out = synthesize_private_policy(mdp, config.timing_k, np.random.default_rng(draw + 1), config.beta)
            seconds.append(time.perf_counter() - start)
        row = {"setting": f"T={horizon}, A={actions}", "states": config.states, "k": config.timing_k,
               "synthesis_and_bounds_seconds": min(seconds)}
        if config.timing_lp:
            seconds, bounds = _lp_bounds(out.private_mdp, out.policy, out.alpha, config.beta)
            row["lp_seconds"] = seconds
            row["lp_linear_programs"] = 2 * horizon * config.states * actions
            row["lp_vs_closed_form_max_difference"] = float(max(np.abs(bounds[0] - out.lower[0]).max(),
                                                                np.abs(bounds[1] - out.upper[0]).max()))
        rows.append(row)
    return rows


def run(out: Path, config: PolicySynthesisConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Run every example at every k, the Lemma 2.2 check and the timing; write ``out`` atomically; returns the
    results (also ``results.json``)."""
    config = config or (PolicySynthesisConfig.quick() if quick else PolicySynthesisConfig())
    check_out(out, POLICY_SYNTHESIS_FORMAT)  # before the work, not after it
    start = time.perf_counter()
    mdps = examples(config)
    rows, per_run = [], {}
    total = len(EXAMPLES) * len(config.ks)
    for name, mdp in mdps.items():
        optimal = _start(optimal_policy(mdp)[1], mdp)
        for i, k in enumerate(config.ks):
            runs = [one_run(mdp, k, config.beta, np.random.default_rng(
                seeds.stream_seed(config.seed, "policy-synthesis", name, i, r)), optimal) for r in range(config.runs)]
            rows.append(_summary(name, k, runs, optimal, concentration_radius(k, config.beta),
                                 concentration_radius(k, config.beta, mdp.n_states)))
            per_run[f"{name}/k={k:g}"] = runs
            if progress is not None:
                progress("examples x k", len(rows), total)
    lemma_rng = np.random.default_rng(seeds.stream_seed(config.seed, "policy-synthesis", "lemma"))
    lemma = [row for k in config.ks for row in lemma_check(k, config.beta, config.lemma_draws, lemma_rng)]
    if progress is not None:
        progress("timing", 0, 1)
    timings = timing(config)
    if progress is not None:
        progress("timing", 1, 1)
    with atomic_dir(out, POLICY_SYNTHESIS_FORMAT) as tmp:
        results = {"format": POLICY_SYNTHESIS_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"),
                   "mdps": {name: mdp.to_json() for name, mdp in mdps.items() if name != "random-infinite"},
                   "rows": rows, "lemma_2_2": lemma, "timing": timings, "runs": per_run, "published": PUBLISHED,
                   "seconds": time.perf_counter() - start}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / FIGURE_FILE, rows)
    return results


def _plot(path: Path, rows: list[dict]) -> None:
    """Fig. 2.1: each example's values against k (mean and standard deviation over the runs), and the cost of
    privacy's bound beside the realised cost."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, 1, len(EXAMPLES) + 1, figsize=(4 * (len(EXAMPLES) + 1), 3.3)) as (fig, axes):
        for ax, name in zip(axes, EXAMPLES):
            cell = [r for r in rows if r["example"] == name]
            ks = [r["k"] for r in cell]
            for key, label, style in (("upper", "optimistic bound", "^-"),
                                      ("private", "released V-bar (private)", "o-"),
                                      ("true", "V under the true P", "s-"), ("lower", "pessimistic bound", "v-")):
                ax.errorbar(ks, [r[f"{key}_mean"] for r in cell], yerr=[r[f"{key}_std"] for r in cell], fmt=style,
                            markersize=3, linewidth=0.9, capsize=2, label=label)
            ax.axhline(cell[0]["optimal"], color="grey", linestyle="--", linewidth=0.8, label="optimal V* (true P)")
            ax.set_xscale("log")
            ax.set_xlabel("k")
            ax.set_ylabel("value at s0")
            ax.set_title(name, fontsize=9)
        axes[0].legend(fontsize=6)
        ax = axes[-1]
        for name in EXAMPLES:
            cell = [r for r in rows if r["example"] == name]
            line = ax.plot([r["k"] for r in cell], [r["bound_mean"] for r in cell], "o-", markersize=3, linewidth=0.9,
                           label=f"{name}: bound")[0]
            ax.plot([r["k"] for r in cell], [r["union_bound_mean"] for r in cell], "--", color=line.get_color(),
                    linewidth=0.9, label=f"{name}: bound, union radius")
            ax.plot([r["k"] for r in cell], [r["cost_mean"] for r in cell], ":", color=line.get_color(), linewidth=0.9,
                    label=f"{name}: |V - V-bar|")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("k")
        ax.set_ylabel("cost of privacy")
        ax.legend(fontsize=6)
        fig.suptitle("privacy-engineered policy synthesis (seed 003, Fig. 2.1)", fontsize=9)
