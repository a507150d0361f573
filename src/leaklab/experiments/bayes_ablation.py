"""``leaklab reproduce bayes-ablation``: seed 001, section 6, Fig. 4: the Bayes optimal adversary against its
approximations, where the input prior and the defense's noise are known exactly.

The seed's synthetic task: inputs x ~ N(0, I) of ``dim`` = 20 dimensions, labels y = argmax(W x) for a fixed random
matrix W (``classes`` rows), a 2-layer MLP (``dim`` -> ``hidden`` ReLU -> ``classes``, at its initialisation: the
seed gives neither its width nor its training), and each sample's gradient released behind Laplace noise of scale
``noise`` = 0.1, so p(x) is Gaussian and p(g | x) Laplacian. Four attacks maximise log p(g | x) + log p(x) with a
Gaussian or Laplacian prior and a Gaussian or Laplacian conditional; the seed's Bayes optimal adversary is the
Gaussian prior with the Laplacian conditional. The wrong densities are matched to the true ones' variance: the
Laplacian prior of unit variance (scale 1/sqrt 2, :func:`~leaklab.attacks.inversion.priors.l1_norm`), the Gaussian
conditional of the noise's variance (std ``noise`` sqrt 2); the conditionals are the defenses' own likelihoods
(:meth:`leaklab.defenses.updates.DefenseChain.log_prob`). Each attack knows the label (one sample's gradient gives
it away), starts every sample from a draw of N(0, I) and runs ``steps`` Adam steps, the learning rate annealed
linearly to 0, at each of ``learning_rates``; the seed tuned every attack by grid search, so each attack's curve
is at its best rate (chosen on the final distance of the same samples; a rate at the grid's edge is flagged). Per
attack and step: the mean Euclidean distance between the reconstruction and the input over ``samples`` samples,
beside the no-information distance (guessing the prior's mean, 0); per attack, its final distance minus the Bayes
optimal attack's, sample by sample (the same samples and starts).

Writes ``OUT/results.json`` and ``OUT/bayes_ablation.png`` (Fig. 4) atomically; same seed, same numbers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.func import functional_call, grad, vmap

from leaklab import seeds
from leaklab.attacks.inversion.priors import l1_norm, l2_norm
from leaklab.defenses.updates import Laplace, parse_defense
from leaklab.experiments import ProgressFn
from leaklab.fields import PositiveGrid, Seed
from leaklab.io import BAYES_ABLATION_FORMAT, RESULTS_FILE, atomic_dir, check_out, write_json

PLOT_FILE = "bayes_ablation.png"
FORMS = ("gaussian", "laplace")
BAYES_OPTIMAL = ("gaussian", "laplace")  # (prior, conditional) that the task's densities are
PUBLISHED = {"claim": "the Bayes optimal attack (Gaussian prior, Laplacian conditional) converges significantly "
                      "closer to the original input than the other three (Fig. 4, a figure only)"}


class BayesAblationConfig(BaseModel):
    """Every setting of the reproduction; :meth:`quick` is the seconds-long version for tests."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dim: int = Field(default=20, ge=1, le=10_000, description="the input's dimension (the seed: 20)")
    classes: int = Field(default=10, ge=2, le=1000, description="W's rows, the MLP's outputs (the seed gives none)")
    hidden: int = Field(default=100, ge=1, le=10_000, description="the MLP's hidden width (the seed gives none)")
    noise: float = Field(default=0.1, gt=0, le=100, description="the defense's Laplace scale (the seed: 0.1)")
    samples: int = Field(default=100, ge=1, le=100_000)
    steps: int = Field(default=200, ge=1, le=100_000, description="Adam steps (the seed: 200)")
    learning_rates: PositiveGrid = Field(default_factory=lambda: [0.01, 0.03, 0.1, 0.3, 1.0, 3.0], min_length=1)
    seed: Seed = 0

    @classmethod
    def quick(cls, seed: int = 0) -> "BayesAblationConfig":
        return cls(samples=8, steps=20, hidden=16, learning_rates=[0.1], seed=seed)


def log_prior(form: str, x: torch.Tensor) -> torch.Tensor:
    """log p(x) of the unit-variance prior ``form`` per sample (rows of ``x``), up to its constant: Gaussian
    -||x||^2 / 2, Laplacian -sqrt(2) ||x||_1."""
    return -0.5 * l2_norm(x) if form == "gaussian" else -math.sqrt(2) * l1_norm(x)


def conditional(form: str, noise: float):
    """The defense whose likelihood is the attack's p(g | x): Laplace noise of scale ``noise``, or Gaussian noise of
    its variance (std ``noise`` sqrt 2)."""
    return parse_defense(f"laplace:{noise}" if form == "laplace" else f"gaussian:{noise * math.sqrt(2)}")


def _task(config: BayesAblationConfig):
    """The network, the inputs, their labels and their released (noised) per-sample gradients."""
    g = torch.Generator().manual_seed(seeds.stream_seed(config.seed, "bayes-ablation", "task"))
    x = torch.randn(config.samples, config.dim, generator=g)
    w = torch.randn(config.classes, config.dim, generator=g)
    y = (x @ w.T).argmax(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds.stream_seed(config.seed, "bayes-ablation", "network"))
        model = nn.Sequential(nn.Linear(config.dim, config.hidden), nn.ReLU(), nn.Linear(config.hidden, config.classes))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))

    def gradients(inputs: torch.Tensor) -> list[torch.Tensor]:
        return list(per_sample(params, inputs, y).values())

    noise = torch.Generator().manual_seed(seeds.stream_seed(config.seed, "bayes-ablation", "defense"))
    released = Laplace(config.noise).apply(gradients(x), noise)
    return x, gradients, released


def _attack(prior: str, cond: str, lr: float, x: torch.Tensor, gradients, released, config: BayesAblationConfig,
            start: torch.Tensor) -> torch.Tensor:
    """One attack's mean distance to the inputs before its first step and after each (steps + 1 values, per sample:
    (steps + 1, samples))."""
    likelihood = conditional(cond, config.noise)
    guess = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([guess], lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / config.steps)
    distances = [(guess.detach() - x).norm(dim=1)]
    for _ in range(config.steps):
        optimizer.zero_grad()
        # the samples are independent problems: their summed objective's gradient is each one's own
        (-(likelihood.log_prob(released, gradients(guess)) + log_prior(prior, guess).sum())).backward()
        optimizer.step()
        schedule.step()
        distances.append((guess.detach() - x).norm(dim=1))
    return torch.stack(distances)


def run(out: Path, config: BayesAblationConfig | None = None, quick: bool = False,
        progress: ProgressFn | None = None) -> dict:
    """Run the four attacks at every learning rate; write ``out`` atomically; returns the results."""
    config = config or (BayesAblationConfig.quick() if quick else BayesAblationConfig())
    check_out(out, BAYES_ABLATION_FORMAT)
    began = time.perf_counter()
    x, gradients, released = _task(config)
    start = torch.randn(x.shape, generator=torch.Generator().manual_seed(
        seeds.stream_seed(config.seed, "bayes-ablation", "start")))
    attacks, finals, done, total = {}, {}, 0, len(FORMS) ** 2 * len(config.learning_rates)
    for prior in FORMS:
        for cond in FORMS:
            by_lr = {}
            for lr in config.learning_rates:
                by_lr[lr] = _attack(prior, cond, lr, x, gradients, released, config, start)
                done += 1
                if progress is not None:
                    progress("attacks run", done, total)
            best = min(by_lr, key=lambda lr: float(by_lr[lr][-1].mean()))
            curve = by_lr[best]
            finals[prior, cond] = curve[-1]
            attacks[f"{prior} prior, {cond} conditional"] = {
                "prior": prior, "conditional": cond, "bayes_optimal": (prior, cond) == BAYES_OPTIMAL,
                "learning_rate": best, "learning_rate_at_grid_edge": best in (config.learning_rates[0],
                                                                              config.learning_rates[-1]),
                "distance_mean": curve.mean(1).tolist(),
                "distance_se": (curve.std(1) / math.sqrt(config.samples)).tolist() if config.samples > 1 else None,
                "final_distance": float(curve[-1].mean()),
                "final_distance_by_learning_rate": {str(lr): float(c[-1].mean()) for lr, c in by_lr.items()}}
    for (prior, cond), final in finals.items():  # the same samples and start: differences are paired
        difference = final - finals[BAYES_OPTIMAL]
        attacks[f"{prior} prior, {cond} conditional"]["versus_bayes_optimal"] = None if (prior, cond) == \
            BAYES_OPTIMAL else {"distance_difference": float(difference.mean()),
                                "difference_se": float(difference.std() / math.sqrt(config.samples))
                                if config.samples > 1 else None,
                                "bayes_closer_share": float((difference > 0).double().mean())}
    with atomic_dir(out, BAYES_ABLATION_FORMAT) as tmp:
        results = {"format": BAYES_ABLATION_FORMAT, "format_version": 1, "quick": quick,
                   "config": config.model_dump(mode="json"), "attacks": attacks,
                   "no_information_distance": float(x.norm(dim=1).mean()), "published": PUBLISHED,
                   "seconds": time.perf_counter() - began}
        write_json(tmp / RESULTS_FILE, results)
        _plot(tmp / PLOT_FILE, results)
    return results


def _plot(path: Path, results: dict) -> None:
    """Fig. 4: each attack's mean distance to the input against the steps."""
    from leaklab.report.plots import saved_figure

    with saved_figure(path, figsize=(6, 3.6)) as (fig, ax):
        for name, a in results["attacks"].items():
            label = f"{name} (lr {a['learning_rate']:g})" + (", Bayes optimal" if a["bayes_optimal"] else "")
            ax.plot(a["distance_mean"], linewidth=2.2 if a["bayes_optimal"] else 1.2, label=label)
        ax.axhline(results["no_information_distance"], color="grey", linestyle=":", linewidth=0.8,
                   label="no information (the prior's mean)")
        ax.set_yscale("log")  # the attacks part in the last steps, an order of magnitude below the start
        ax.set_xlabel("Adam steps")
        ax.set_ylabel("distance to the input (mean L2)")
        ax.legend(fontsize=7)
        ax.set_title("Bayes optimal adversary and its approximations (seed 001, Fig. 4)", fontsize=9)
