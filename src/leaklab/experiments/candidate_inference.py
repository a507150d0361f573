"""``leaklab reproduce candidate-inference``: seed 002, chapter 5's second environment-inference attack, Pan et al.'s
candidate inference by shadow policies (section 5.3.1; :mod:`leaklab.attacks.candidate_inference`), against the
grid-world DQN agents of ``leaklab reproduce dp-drl`` with and without DP-DRL.

The thesis names the attack and reports no experiment with it, so the setting is leaklab's, on dp-drl's: per trial,
a random floor plan of ``size`` that an agent seeing its 8 neighbours can walk (dp-drl's maps), and ``candidates``
maps of its shape, start and goal drawn under the attacker's constraints, the true one among them. For every defense
(none, DP-DRL at each of ``epsilons``, the dynamic budget) and every candidate: one target agent trained in that
candidate, and ``shadows`` shadow agents trained there by the same algorithm and defense (the attacker knows the
training algorithm, the defense included), all of a trial in one batch (:mod:`leaklab.rl.agents.grid_dqn`, dp-drl's
settings but 600 episodes by default: the batch runs until its slowest agent is done, and with dp-drl's 1,500 an
agent that never reaches the goal, playing every episode to its 500 steps, kept one trial going for over an hour
here). Per trial
and defense the classifier learns from the shadows' answers and names a candidate for each of the targets: every
candidate is the truth of one target, so ``candidates`` targets per trial and defense; a guess is right with
probability 1 / ``candidates`` (the candidates are distinct maps). Beside it the genetic search's fitness choosing
among the same candidates without shadows, and the targets' goal rate over the final half of their episodes (DP-DRL's
cost). The standard errors are binomial over the pooled targets (a trial's targets share its candidates and
classifier, so they are somewhat optimistic). Every draw (maps, DQN, classifier) derives from ``seed``.

Writes ``OUT/results.json`` and ``OUT/candidate_inference.png`` atomically; same seed, same numbers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leaklab.attacks.candidate_inference import (answer_features, candidate_maps, fitness_choice, infer_candidates,
                                                 observed_codes)
from leaklab.attacks.environment_search import policy_table
from leaklab.attacks.membership import AttackTraining
from leaklab.experiments import ProgressFn
from leaklab.experiments.dp_drl_table import FixedBudgets, budget_name, defense_budgets
from leaklab.fields import Seed
from leaklab.io import CANDIDATE_INFERENCE_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json
from leaklab.rl.agents.grid_dqn import GridDQNConfig, q_values, train_grid_dqn
from leaklab.rl.envs.grid_world import random_map
from leaklab.seeds import stream_seed

PLOT_FILE = "candidate_inference.png"
PUBLISHED = {"claim": "the attacker trains shadow policies to identify the target transition dynamics from a set of "
                      "candidates (seed 002, section 5.3.1, after Pan et al.; no experiment reported)"}


class CandidateInferenceConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    size: tuple[int, int] = Field(default=(7, 7), description="the maps' rows and columns, outer walls included")
    trials: int = Field(default=2, ge=1, le=100, description="true maps, each with its own candidates")
    candidates: int = Field(default=4, ge=2, le=20, description="candidate maps per trial, the truth among them")
    shadows: int = Field(default=4, ge=1, le=50, description="shadow agents per candidate and defense")
    wall_fraction: float = Field(default=0.3, ge=0, lt=1)
    epsilons: FixedBudgets = Field(default_factory=lambda: [1.0, 0.1], description="DP-DRL's fixed budgets")
    dynamic: bool = Field(default=True, description="also DP-DRL with the dynamic budget")
    training: GridDQNConfig = GridDQNConfig(episodes=600)  # dp-drl's 1,500: a trial took over an hour here
    temperature: float = Field(default=0.01, gt=0, description="of the softmax over a policy's Q values")
    attack: AttackTraining = AttackTraining(epochs=200, batch_size=16)
    seed: Seed = 0

    @field_validator("size")
    @classmethod
    def _size(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not all(4 <= s <= 40 for s in v):
            raise ValueError("rows and columns between 4 and 40")
        return v

    @model_validator(mode="after")
    def _checked(self) -> "CandidateInferenceConfig":
        if self.training.position:
            raise ValueError("the candidates are told apart by the answers of agents that see their 8 neighbours "
                             "only: training.position must be false")
        if self.training.seed or self.attack.seed:
            raise ValueError("every draw derives from seed: leave training.seed and attack.seed at 0")
        return self

    def budgets(self) -> list[float | str | None]:
        return defense_budgets(self.epsilons, self.dynamic)

    @classmethod
    def quick(cls, seed: int = 0) -> "CandidateInferenceConfig":
        return cls(size=(6, 6), trials=1, candidates=2, shadows=2, epsilons=[0.1], dynamic=False,
                   training=GridDQNConfig(episodes=40, max_steps=60, learning_starts=50),
                   attack=AttackTraining(epochs=20, batch_size=16), seed=seed)


def run(out: Path, config: CandidateInferenceConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Train, attack and write ``out`` atomically; returns the results."""
    config = config or (CandidateInferenceConfig.quick() if quick else CandidateInferenceConfig())
    check_out(out, CANDIDATE_INFERENCE_FORMAT)
    began = time.perf_counter()
    budgets, k, s = config.budgets(), config.candidates, config.shadows
    trials, outcomes = [], {budget_name(b): [] for b in budgets}
    for trial in range(config.trials):
        rng = np.random.default_rng(stream_seed(config.seed, "candidate-inference", trial, "maps"))
        truth = random_map(*config.size, rng, config.wall_fraction, reactive=True)
        candidates, where = candidate_maps(truth, k, rng, config.wall_fraction)
        # agents: per budget, per candidate, the target then its shadows
        agents = [(b, c, role) for b in budgets for c in range(k) for role in range(1 + s)]
        net, training = train_grid_dqn(
            [candidates[c] for _, c, _ in agents], [b for b, _, _ in agents],
            config.training.model_copy(update={"seed": stream_seed(config.seed, "candidate-inference", trial)}),
            progress=None if progress is None else
            lambda done, total, trial=trial: progress(f"trial {trial + 1}/{config.trials}: DQN episodes",
                                                      trial * total + done, config.trials * total))
        codes = observed_codes(candidates)
        tables = [policy_table(lambda x, i=i: q_values(net.agent(i), x), config.temperature)
                  for i in range(len(agents))]
        final = config.training.episodes // 2
        for b in budgets:
            index = [i for i, (budget, _, _) in enumerate(agents) if budget == b]
            target_rows = [i for i in index if agents[i][2] == 0]
            shadow_rows = [i for i in index if agents[i][2] > 0]
            chosen = infer_candidates(
                torch.stack([answer_features(tables[i], codes) for i in shadow_rows]),
                torch.tensor([agents[i][1] for i in shadow_rows]),
                torch.stack([answer_features(tables[i], codes) for i in target_rows]), k,
                config.attack.model_copy(update={"seed": stream_seed(config.seed, "candidate-inference", trial,
                                                                     budget_name(b), "attack")}))
            for i, guess in zip(target_rows, chosen.tolist()):
                outcomes[budget_name(b)].append({
                    "trial": trial, "candidate": agents[i][1], "classifier": guess,
                    "fitness": fitness_choice(tables[i], candidates),
                    "goal_rate": float(np.mean(training.reached[i][final:]))})
        trials.append({"truth": where, "candidates": [c.to_json() for c in candidates], "observations": len(codes)})
    rows = [_row(name, cells, k) for name, cells in outcomes.items()]
    with atomic_dir(out, CANDIDATE_INFERENCE_FORMAT) as tmp:
        results = {"format": CANDIDATE_INFERENCE_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "rows": rows, "targets": outcomes, "trials": trials,
                   "published": PUBLISHED, "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, rows, config)
    return results


def _row(defense: str, cells: list[dict], k: int) -> dict:
    """One defense: the classifier's and the fitness' accuracy over its targets, with binomial standard errors."""
    def rate(key: str) -> tuple[float, float]:
        p = float(np.mean([c[key] == c["candidate"] for c in cells]))
        return p, math.sqrt(p * (1 - p) / len(cells))

    accuracy, accuracy_se = rate("classifier")
    fitness, fitness_se = rate("fitness")
    return {"defense": defense, "targets": len(cells), "chance": 1 / k, "accuracy": accuracy,
            "accuracy_se": accuracy_se, "fitness_accuracy": fitness, "fitness_accuracy_se": fitness_se,
            "goal_rate": float(np.mean([c["goal_rate"] for c in cells]))}


def _plot(path: Path, rows: list[dict], config: CandidateInferenceConfig) -> None:
    """The shadow classifier's and the fitness' accuracy per defense (chance dotted), and the targets' goal rate."""
    from leaklab.report.plots import saved_figure

    title = (f"candidate inference by shadow policies (seed 002 Sec. 5.3.1, Pan et al.): {config.candidates} "
             f"candidates, {config.size[0]}x{config.size[1]}")
    with saved_figure(path, 1, 2, figsize=(9, 3.3), title=title) as (fig, (attack, goal)):
        x = np.arange(len(rows))
        names = [r["defense"] if r["defense"] in ("none", "dynamic") else f"eps {r['defense']}" for r in rows]
        for shift, key, label in ((-0.18, "accuracy", "shadow classifier"), (0.18, "fitness_accuracy", "fitness")):
            attack.bar(x + shift, [100 * r[key] for r in rows], width=0.36, label=label,
                       yerr=[100 * r[f"{key}_se"] for r in rows], capsize=2)
        attack.axhline(100 * rows[0]["chance"], color="grey", linestyle=":", linewidth=0.8, label="a guess")
        attack.set_ylabel("right candidate (%)")
        goal.bar(x, [100 * r["goal_rate"] for r in rows], width=0.5)
        goal.set_ylabel("targets' goal rate, final half (%)")
        for ax in (attack, goal):
            ax.set_xticks(x, names)
            ax.set_xlabel("DP-DRL")
        attack.legend(fontsize=7)
