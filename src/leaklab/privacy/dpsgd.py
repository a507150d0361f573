"""DP-SGD for federated clients (local DP, through opacus) and for the server (central DP).

* Local DP (Abadi et al., CCS 2016; seed notes-003 section 3.6, eq. 3.7-3.8, and section 4.5): a client
  trains on its own data with per-sample gradients clipped to L2 norm ``clip`` and Gaussian noise of
  std ``noise_multiplier * clip`` added to their sum, on Poisson-sampled batches.
  :func:`make_private` wraps any model/optimizer/data loader with opacus' ``PrivacyEngine`` (for
  one's own training loop) and :class:`PrivateTraining` reports the epsilon spent;
  :func:`train_private` is the whole loop for image classifiers. Loops that draw their own batches
  (a replay buffer, an episode: :mod:`leaklab.rl.agents.private`) take opacus' per-sample gradients
  and DP optimizer from :func:`private_optimizer` and account their steps with :func:`spent_epsilon`.
  :class:`DPConfig` holds the privacy settings every such loop accepts.
* Central DP for federated averaging (DP-FedAvg, McMahan et al., ICLR 2018): the server clips each
  client's update to norm ``clip``, sums, adds N(0, (noise_multiplier * clip)^2) once to the sum and
  divides by the expected number of clients (:class:`CentralDP`). The guarantee is per client
  (neighbouring = one client's data added or removed), accounted with the client sampling rate.
* One release of one clipped, noised per-sample gradient (:func:`clip_and_noise`), calibrated by
  :func:`noise_multiplier_for`: what a batch-1 client of a DP-SGD round sends.

Every epsilon comes from :mod:`leaklab.privacy.accounting`. Clipping and noise of the last two
reuse the update defenses ``clip`` and ``gaussian`` of :mod:`leaklab.defenses`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from leaklab import seeds
from leaklab.defenses import Clip, Gaussian
from leaklab.errors import LeaklabError
from leaklab.models.layers import batchnorm_layers
from leaklab.names import ACCOUNTANT_NAMES
from leaklab.privacy.accounting import DEFAULT_ACCOUNTANT, check_accountable, dpsgd_epsilon, dpsgd_sigma
from leaklab.privacy.mechanisms import analytic_gaussian_epsilon, analytic_gaussian_sigma


def _not_the_empty_batch_note(record: logging.LogRecord) -> bool:
    """opacus logs a warning for every empty Poisson batch, which DP-SGD at a small sampling rate draws
    by design (the step still adds its noise): on a terminal it read as a fault."""
    return "batch is empty" not in record.getMessage()


logging.getLogger("opacus.data_loader").addFilter(_not_the_empty_batch_note)

__all__ = ["CentralDP", "DPConfig", "DPSGDConfig", "PrivateTraining", "clip_and_noise", "make_private",
           "noise_multiplier_for", "private_optimizer", "spent_epsilon", "train_private"]


def noise_multiplier_for(epsilon: float, delta: float, steps: int = 1, q: float = 1.0,
                         accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """The noise multiplier sigma that makes ``steps`` DP-SGD steps at sampling rate ``q``
    (epsilon, delta)-DP; 0 for epsilon = inf.

    With q = 1 the ``steps`` Gaussian releases compose exactly into one Gaussian mechanism of
    sensitivity sqrt(steps) (Dong, Roth & Su 2022, Cor. 3.3), calibrated exactly by the analytic
    Gaussian of Balle & Wang 2018 (the accountants agree with it, but slowly or not at all at the
    small sigmas of large epsilons); otherwise :func:`~leaklab.privacy.accounting.dpsgd_sigma` with
    ``accountant``."""
    if epsilon == math.inf:
        return 0.0
    if q == 1:
        if int(steps) != steps or steps < 1:
            raise LeaklabError(f"steps must be a whole number >= 1 (got {steps!r})")
        return analytic_gaussian_sigma(epsilon, delta, math.sqrt(steps))
    return dpsgd_sigma(q, steps, epsilon, delta, accountant)


def spent_epsilon(q: float, noise_multiplier: float, steps: int, delta: float,
                  accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """Epsilon at ``delta`` spent by ``steps`` DP-SGD steps at sampling rate ``q``: 0 before the
    first step, inf without noise; with q = 1 the exact epsilon of the one Gaussian mechanism they compose into,
    as :func:`noise_multiplier_for` calibrates it (an accountant's is larger: rdp's 1.09 where the target was
    1); else :func:`~leaklab.privacy.accounting.dpsgd_epsilon`."""
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    if q == 1:
        return analytic_gaussian_epsilon(noise_multiplier, delta, math.sqrt(steps))
    return dpsgd_epsilon(q, noise_multiplier, steps, delta, accountant)


def replay_buffer_epsilon(q: float, noise_multiplier: float, buffer_size: int, delta: float,
                          accountant: str = DEFAULT_ACCOUNTANT, inserted_per_step: int = 1) -> float:
    """Seed 003, Theorem 4.2: DP-SGD that starts once a FIFO replay buffer of ``buffer_size`` elements is full, each
    step on a Poisson sample of the buffer at rate ``q``, is (eps, delta)-DP for one element whatever the number of
    steps, eps being that of the steps the element can be sampled in (maximum-overlap parallel composition, Smith et
    al. 2022): ``buffer_size`` with one insertion per step (the theorem), ceil(buffer_size / inserted_per_step) with
    more (:func:`spent_epsilon` of that many steps)."""
    if not (isinstance(buffer_size, int) and buffer_size >= 1 and isinstance(inserted_per_step, int)
            and inserted_per_step >= 1):
        raise LeaklabError("the buffer holds 1 element or more, and 1 or more enter it per step")
    return spent_epsilon(q, noise_multiplier, math.ceil(buffer_size / inserted_per_step), delta, accountant)


def _check_clip_noise(clip: float, noise_multiplier: float) -> None:
    if not (clip > 0 and math.isfinite(clip)):
        raise LeaklabError(f"the clipping norm must be a positive number (got {clip!r})")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise LeaklabError(f"the noise multiplier must be >= 0 (got {noise_multiplier!r})")


def clip_and_noise(tensors: Sequence[torch.Tensor], clip: float, noise_multiplier: float,
                   generator: torch.Generator) -> list[torch.Tensor]:
    """One per-sample gradient (all its tensors as one vector) clipped to L2 norm ``clip``, plus
    N(0, (noise_multiplier * clip)^2) on every entry: the Gaussian mechanism with sensitivity ``clip``
    (add/remove one sample)."""
    _check_clip_noise(clip, noise_multiplier)
    clipped = Clip(clip).apply(list(tensors))
    return Gaussian(noise_multiplier * clip).apply(clipped, generator) if noise_multiplier > 0 else clipped


# --------------------------------------------------------------------------------------------
# central DP for federated averaging


@dataclass
class CentralDP:
    """DP-FedAvg at the server: ``sample_rate`` is the probability that a client takes part in a
    round (clients per round / all clients); ``rounds`` counts the aggregations done."""

    clip: float
    noise_multiplier: float
    sample_rate: float = 1.0
    rounds: int = 0

    def aggregate(self, updates: Sequence[Sequence[torch.Tensor]], generator: torch.Generator,
                  expected_clients: float) -> list[torch.Tensor]:
        """(sum of the clipped updates + noise) / ``expected_clients``: McMahan et al. divide by the
        expected count (sample rate × population), which does not depend on the data; dividing by the
        realised count would, and would void the guarantee of :meth:`epsilon`."""
        if not updates:
            raise LeaklabError("central DP aggregation needs at least one client update")
        if not expected_clients > 0:
            raise LeaklabError(f"expected_clients must be positive (got {expected_clients})")
        clipped = [Clip(self.clip).apply(list(u)) for u in updates]
        total = [torch.stack(parts).sum(0) for parts in zip(*clipped)]
        noised = Gaussian(self.noise_multiplier * self.clip).apply(total, generator)
        self.rounds += 1
        return [t / expected_clients for t in noised]

    def epsilon(self, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """Client-level epsilon after the rounds so far (:func:`spent_epsilon`: 0 before the first, inf
        without noise)."""
        return spent_epsilon(self.sample_rate, self.noise_multiplier, self.rounds, delta, accountant)


# --------------------------------------------------------------------------------------------
# local DP: DP-SGD through opacus


def _check_opacus(model: nn.Module) -> None:
    from opacus.validators import ModuleValidator

    was = model.training
    model.train()
    errors = ModuleValidator.validate(model, strict=False)
    model.train(was)
    if errors:
        kinds = sorted({type(m).__name__ for m in batchnorm_layers(model)})
        fix = (f"replace {', '.join(kinds)} by GroupNorm (opacus.validators.ModuleValidator.fix) or use a model "
               "without it (mlp, cnn, lenet)") if kinds else "see opacus.validators.ModuleValidator"
        raise LeaklabError(f"opacus cannot train this model privately ({str(errors[0]).splitlines()[0]}); {fix}")


@dataclass
class PrivateTraining:
    """The opacus-wrapped model, optimizer and Poisson-sampling data loader of one private training,
    with what its epsilon depends on."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    data_loader: DataLoader
    sample_rate: float
    noise_multiplier: float
    clip: float
    _engine: object

    @property
    def steps(self) -> int:
        """Optimizer steps taken so far (opacus' accountant counts them)."""
        return sum(n for _, _, n in self._engine.accountant.history)

    def epsilon(self, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """Epsilon spent so far at ``delta`` (:func:`spent_epsilon`)."""
        return spent_epsilon(self.sample_rate, self.noise_multiplier, self.steps, delta, accountant)

    def train(self, steps: int, loss: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor],
              progress: Callable[[str, int, int], None] | None = None) -> None:
        """Take optimizer steps until ``steps`` in all, ``loss(model, batch)`` on each Poisson batch
        (an empty batch still takes a noise-only step, as DP-SGD must: its backward pass gives opacus
        empty per-sample gradients)."""
        with warnings.catch_warnings():
            # torch notes that opacus' full backward hooks fire although the inputs need no gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            while self.steps < steps:
                for batch in self.data_loader:
                    self.optimizer.zero_grad(set_to_none=True)
                    loss(self.model, batch).backward()
                    self.optimizer.step()
                    if progress:
                        progress("DP-SGD", self.steps, steps)
                    if self.steps >= steps:
                        return

    def close(self) -> None:
        """Remove opacus' hooks; the original model keeps the trained parameters."""
        self.model.remove_hooks()


def make_private(model: nn.Module, optimizer: torch.optim.Optimizer, data_loader: DataLoader, *,
                 clip: float, noise_multiplier: float, seed: int | None = None) -> PrivateTraining:
    """Wrap a training's model, optimizer and data loader for DP-SGD with opacus (flat per-sample
    clipping to ``clip``, noise multiplier ``noise_multiplier``, Poisson sampling at opacus' rate
    1 / len(data_loader) = 1 / ceil(dataset size / batch size), so the expected batch is the dataset
    size times that, at most the loader's batch size). ``seed`` fixes the noise, from its own stream
    (:mod:`leaklab.seeds`; None: the operating system's entropy, not the global stream the model was initialised
    from); the batches follow the loader's generator (give it one: without, opacus draws them from torch's global
    stream)."""
    from opacus import PrivacyEngine

    _check_clip_noise(clip, noise_multiplier)
    _check_opacus(model)
    model.train()
    with warnings.catch_warnings():  # "secure RNG turned off": seeded noise is what reruns need here
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        noise = seeds.generator(seed, seeds.DP_NOISE)
        module, dp_optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer, data_loader=data_loader, noise_multiplier=noise_multiplier,
            max_grad_norm=clip, poisson_sampling=True, noise_generator=noise)
    # the rate opacus samples at is the given loader's; its own loader's length, int(1 / rate), can be one short
    return PrivateTraining(module, dp_optimizer, loader, 1 / len(data_loader), noise_multiplier, clip, engine)


def private_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, *, clip: float, noise_multiplier: float,
                      expected_batch_size: int, seed: int | None = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """opacus' per-sample gradients (``GradSampleModule``) and ``DPOptimizer`` for a loop that draws
    its own batches: every step clips each sample's gradient of the mean loss to L2 norm ``clip``,
    adds N(0, (noise_multiplier * clip)^2) to their sum and divides by ``expected_batch_size``, the
    same step as :func:`make_private`'s. The caller accounts its steps with the sampling rate of its
    batches (:func:`spent_epsilon`). ``seed`` fixes the noise, from its own stream (:mod:`leaklab.seeds`; None:
    the operating system's entropy).
    Returns (wrapped model, DP optimizer); the wrapped model's ``remove_hooks()`` ends the training."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    _check_clip_noise(clip, noise_multiplier)
    _check_opacus(model)
    model.train()
    noise = seeds.generator(seed, seeds.DP_NOISE)
    return GradSampleModule(model), DPOptimizer(optimizer, noise_multiplier=noise_multiplier, max_grad_norm=clip,
                                                expected_batch_size=expected_batch_size, generator=noise)


class DPConfig(BaseModel):
    """Privacy settings of a DP-SGD training: clipping norm and either ``noise_multiplier`` or
    ``target_epsilon`` at ``delta`` (the noise multiplier is then the smallest that reaches it,
    :meth:`noise_for`), with the accountant that reports epsilon."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    clip: float = Field(default=1.0, gt=0)
    noise_multiplier: float | None = Field(default=None, ge=0)
    target_epsilon: float | None = Field(default=None, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    accountant: Literal[ACCOUNTANT_NAMES] = DEFAULT_ACCOUNTANT

    @model_validator(mode="after")
    def _one_noise(self) -> "DPConfig":
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        return self

    def noise_for(self, q: float, steps: int) -> float:
        """``noise_multiplier``, or the one that spends ``target_epsilon`` in ``steps`` steps at
        sampling rate ``q`` (:func:`noise_multiplier_for`); a given one the accountant cannot account at ``q`` is
        refused here, before the training (:func:`~leaklab.privacy.accounting.check_accountable`; ``q`` = 1 takes
        any, :func:`spent_epsilon`)."""
        if self.noise_multiplier is not None:
            if self.noise_multiplier > 0 and q < 1:
                check_accountable(q, self.noise_multiplier, max(steps, 1), self.delta, self.accountant)
            return self.noise_multiplier
        return noise_multiplier_for(self.target_epsilon, self.delta, steps, q, self.accountant)


class DPSGDConfig(DPConfig):
    """A DP-SGD training of a classifier (:func:`train_private`): the privacy settings, Poisson
    batches, steps and the SGD optimiser."""

    batch_size: int = Field(default=256, ge=1, description="loader batch size; Poisson sampling at rate "
                            "1 / ceil(dataset size / batch_size)")
    steps: int = Field(default=500, ge=1)
    lr: float = Field(default=0.5, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    seed: int | None = Field(default=None, description="fixes the batches and the noise (their own streams of it, "
                             "leaklab.seeds); None: drawn from the operating system's entropy, not repeatable")


def train_private(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, config: DPSGDConfig,
                  progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Train ``model`` in place with DP-SGD (cross-entropy, SGD) on a client's data for
    ``config.steps`` steps; returns the epsilon spent at ``config.delta`` with the settings."""
    n = len(images)
    if n != len(labels) or n < 2:
        raise LeaklabError("private training needs at least 2 images with one label each")
    if config.batch_size > n:
        raise LeaklabError(f"batch size {config.batch_size} exceeds the {n} training images")
    loader = DataLoader(TensorDataset(images, labels), batch_size=config.batch_size,
                        generator=seeds.generator(config.seed, seeds.DP_BATCHES))
    q = 1 / len(loader)  # opacus' Poisson sampling rate
    sigma = config.noise_for(q, config.steps)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    run = make_private(model, optimizer, loader, clip=config.clip, noise_multiplier=sigma, seed=config.seed)
    try:
        run.train(config.steps, lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), progress)
    finally:
        run.close()
    return {"epsilon": run.epsilon(config.delta, config.accountant), "delta": config.delta,
            "noise_multiplier": sigma, "clip": config.clip, "sample_rate": q, "steps": run.steps,
            "accountant": config.accountant}

