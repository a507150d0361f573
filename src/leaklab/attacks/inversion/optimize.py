"""The optimisation loop of gradient inversion (seed 001, Algorithm 1).

``R`` independent instances (several client updates times ``restarts``) are optimised together by Adam:
the loss is a sum of per-instance terms, so one backward pass gives every instance its own gradient
(L-BFGS, whose line search and curvature are the whole variable's, runs them one after the other).
For the Bayes adversary each step evaluates ``k`` points drawn uniformly from the L2 ball of radius
``delta`` around the current images (Monte-Carlo estimate of the integral in eq. 3). Adam follows a
learning-rate schedule that ends near 0 (cosine by default: a constant rate stalls on a grainy floor);
L-BFGS (DLG) counts, as DLG does, one ``optimizer.step`` as an iteration: up to ``lbfgs_inner``
(20) inner iterations with a strong-Wolfe line search; the number of loss evaluations is reported too.
The images are clamped to [0, 1] after each Adam step when ``clamp`` is set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from leaklab.attacks.inversion.config import InversionConfig
from leaklab.attacks.inversion.objectives import Objective
from leaklab.attacks.inversion.priors import prior
from leaklab.attacks.inversion.simulate import UpdateSimulator
from leaklab.errors import LeaklabError

Progress = Callable[[int, float], None]


def _norms(grad: torch.Tensor) -> torch.Tensor:
    """Each instance's gradient norm, in the gradient's dtype; in float64 where that overflows (the Bayes
    objective behind Gaussian noise of σ = 1e-10 has float32 entries of 3e19, whose squares made the norm, the
    prior's weight and the loss inf, and the attack "diverged"). Only then: float64 norms round otherwise, and an
    image attack's first weight moved its 60-step PSNR by 0.2 dB."""
    norms = grad.flatten(1).norm(dim=1)
    return norms if bool(torch.isfinite(norms).all()) else grad.flatten(1).double().norm(dim=1).to(grad.dtype)


@dataclass
class OptimisationResult:
    images: torch.Tensor  # (R, B, C, H, W), pixels
    losses: torch.Tensor  # (R,), final objective + prior at the images, no MC noise
    iterations: int
    evaluations: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)


def _schedule(cfg: InversionConfig, optimiser: torch.optim.Optimizer):
    t = cfg.iterations
    if cfg.schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, t) / t)))
    if cfg.schedule == "exp":
        return torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: cfg.lr_decay ** (min(i, t) / t))
    if cfg.schedule == "step":
        return torch.optim.lr_scheduler.MultiStepLR(optimiser, [3 * t // 8, 5 * t // 8, 7 * t // 8], 0.1)
    return torch.optim.lr_scheduler.LambdaLR(optimiser, lambda i: 1.0)


def _initial_images(cfg: InversionConfig, shape: tuple[int, ...], mean: torch.Tensor,
                    std: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random starting images in pixel space: Gaussian in the network's normalised space (as
    DLG/IG), uniform in [0, 1], or the dataset mean with a little noise."""
    if cfg.init == "uniform":
        return torch.rand(shape, generator=generator)
    noise = torch.randn(shape, generator=generator)
    if cfg.init == "mean":
        return mean + 0.01 * noise
    return mean + std * noise


def _ball_points(x: torch.Tensor, k: int, radius: float, generator: torch.Generator) -> torch.Tensor:
    """``k`` points uniform in the L2 ball of ``radius`` around each instance: shape (k*R, ...)."""
    if k == 1 and radius == 0:
        return x
    r = x.shape[0]
    dim = x[0].numel()
    direction = torch.randn((k, *x.shape), generator=generator).to(x.device)
    direction = direction / direction.flatten(2).norm(dim=2).view(k, r, *[1] * (x.ndim - 1))
    length = radius * torch.rand((k, r), generator=generator).to(x.device) ** (1.0 / dim)
    points = x.unsqueeze(0) + direction * length.view(k, r, *[1] * (x.ndim - 1))
    return points.reshape(k * r, *x.shape[1:])


ADAM_GRADIENT_CEILING = 2.0 ** 40  # a first gradient entry over this: Adam's gradients scaled down (_adam_unit)


def _adam_unit(grad: torch.Tensor) -> float:
    """The power of two Adam's gradients are multiplied by, from the first one: 1 unless its largest entry passes
    :data:`ADAM_GRADIENT_CEILING`, then the power that brings it near 1. Behind Gaussian noise of std 3e-11 or less
    the Bayes objective's gradient (``1/σ²`` times the residual) reached 1e24, its square overflowed float32 in
    Adam's second moment and every step was 0: the attack stayed at its start. Adam's step does not depend on the
    gradient's scale (but through its ``eps``), and a power of two changes none of its digits."""
    top = float(grad.abs().max())
    return 2.0 ** -math.floor(math.log2(top)) if math.isfinite(top) and top > ADAM_GRADIENT_CEILING else 1.0


class InversionLoop:
    """Minimises ``objective(simulate(x)) + sum_j w_j prior_j(x)`` over candidate images ``x``."""

    def __init__(self, cfg: InversionConfig, simulator: UpdateSimulator, objective: Objective,
                 labels: torch.Tensor, image_shape: tuple[int, ...], mean: torch.Tensor,
                 std: torch.Tensor, device: torch.device):
        self.cfg, self.simulator, self.objective = cfg, simulator, objective
        self.labels, self.image_shape, self.device = labels.to(device), image_shape, device
        self.mean, self.std = mean, std
        self.priors = {name: prior(name) for name in cfg.priors}
        r = labels.shape[0]  # each instance's own weight (relative scale: set at its own start, _calibrate)
        self.prior_weights = {name: torch.full((r,), float(w), device=device) for name, w in cfg.priors.items()}

    def _terms(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k = x.shape[0] // self.labels.shape[0]
        labels = self.labels.repeat(k, 1) if k > 1 else self.labels
        data = self.objective(self.simulator(x, labels))
        return data, {name: fn(x) for name, fn in self.priors.items()}

    def _calibrate(self, x: torch.Tensor) -> None:
        """Relative prior weights: ``beta * ||grad data|| / ||grad prior||`` at each instance's starting
        images, its own norms (instances are independent: one weight for all tied each update's
        reconstruction to the others attacked in the same call). An update's restarts (the instances are updates
        times ``restarts``, restart-minor: :func:`~leaklab.attacks.inversion.attack.invert`) share the weight set at
        its first start, so that the best of them is chosen on one objective (with a weight each, the lowest
        total loss was not the lowest data term) and the first runs as the update alone would. The ``range``
        term's gradient is a unit vector wherever it acts, and 0 at a start inside [0, 1] (``init`` uniform or
        mean), which weighed it 0 for the whole run: there its norm is taken as 1."""
        if self.cfg.prior_scale != "relative" or not self.priors:
            return
        x = x.detach().requires_grad_()
        data, priors = self._terms(x)
        g_data = _norms(torch.autograd.grad(data.sum(), x, retain_graph=True)[0])
        for name, value in priors.items():
            g_prior = _norms(torch.autograd.grad(value.sum(), x, retain_graph=True)[0])
            if name == "range":
                g_prior = torch.where(g_prior > 0, g_prior, 1.0)
            scale = torch.where(g_prior > 0, g_data / g_prior.clamp_min(torch.finfo(g_prior.dtype).tiny), 0.0)
            scale = scale.view(-1, self.cfg.restarts)[:, :1].expand(-1, self.cfg.restarts).reshape(-1)
            self.prior_weights[name] = (self.cfg.priors[name] * scale.detach().double()).to(scale.dtype)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        """Per-instance loss at ``x`` of shape (k*R, B, C, H, W), averaged over the k points."""
        data, priors = self._terms(x)
        r = self.labels.shape[0]
        k = x.shape[0] // r
        total = data + sum(self.prior_weights[n].repeat(k) * v for n, v in priors.items())
        return total.view(-1, r).mean(0)

    def _instance(self, j: int) -> "InversionLoop":
        """This loop for instance ``j`` alone, with its prior weights."""
        loop = InversionLoop(self.cfg, self.simulator, self.objective.instance(j), self.labels[j:j + 1],
                             self.image_shape, self.mean, self.std, self.device)
        loop.prior_weights = {name: w[j:j + 1] for name, w in self.prior_weights.items()}
        return loop

    def _lbfgs(self, x0: torch.Tensor, progress: Progress) -> tuple[torch.Tensor, int, list[float]]:
        """L-BFGS (DLG) from ``x0``, one instance: its curvature history, line search and step are the whole
        variable's, so instances optimised together were not independent (a restart beside three others ended
        7.6 dB worse than alone). Returns the images, the loss evaluations and the loss after each iteration
        (it stops where the loss is no longer finite)."""
        cfg, x = self.cfg, x0.detach().clone().requires_grad_()
        optimiser = torch.optim.LBFGS([x], lr=cfg.lr, max_iter=cfg.lbfgs_inner, history_size=100,
                                      tolerance_grad=0.0, tolerance_change=0.0, line_search_fn="strong_wolfe")
        evaluations, curve = 0, []

        def closure():
            nonlocal evaluations
            evaluations += 1
            optimiser.zero_grad()
            value = self.loss(x).sum()
            x.grad = torch.autograd.grad(value, x)[0]
            return value

        for it in range(cfg.iterations):
            value = float(optimiser.step(closure).detach())
            if not math.isfinite(value):
                break
            curve.append(value)
            progress(it + 1, value)
        return x.detach(), evaluations, curve

    def run(self, progress: Progress | None = None,
            on_step: Callable[[int, torch.Tensor], None] | None = None) -> OptimisationResult:
        """The optimisation; ``on_step(iteration, images)``, if given, after every Adam step with every instance's
        current images clamped to [0, 1] (detached; L-BFGS refuses it: its steps are line searches)."""
        cfg = self.cfg
        if on_step is not None and cfg.optimizer == "lbfgs":
            raise LeaklabError("on_step follows Adam's steps; L-BFGS takes line searches instead")
        g = torch.Generator().manual_seed(cfg.seed)
        r = self.labels.shape[0]
        x0 = _initial_images(cfg, (r, *self.image_shape), self.mean, self.std, g).to(self.device)
        self._calibrate(x0)
        x = x0.clone().requires_grad_()
        start, history, evaluations = time.perf_counter(), [], 0
        if cfg.optimizer == "lbfgs":  # one instance after the other: see _lbfgs
            runs = []
            for j in range(r):
                def report(it: int, value: float, j: int = j) -> None:  # the instances' iterations, as one bar
                    if progress:
                        progress((j * cfg.iterations + it) / r, value)
                runs.append(self._instance(j)._lbfgs(x[j:j + 1], report))
            x = torch.cat([images for images, _, _ in runs])
            evaluations = sum(n for _, n, _ in runs)
            curves = [curve for _, _, curve in runs]
            history = [(it + 1, sum(c[it] for c in curves if it < len(c)) / sum(it < len(c) for c in curves))
                       for it in range(max(map(len, curves)))]
        else:
            optimiser = torch.optim.Adam([x], lr=cfg.lr)
            scheduler, unit = _schedule(cfg, optimiser), 1.0
            for it in range(cfg.iterations):
                points = _ball_points(x, cfg.mc_samples, cfg.mc_radius, g)
                value = self.loss(points).sum()
                grad = torch.autograd.grad(value, x)[0]
                value = value.detach()
                if it == 0:
                    unit = _adam_unit(grad)
                x.grad = grad.sign() if cfg.signed_gradients else grad if unit == 1 else grad * unit
                optimiser.step()
                scheduler.step()
                evaluations += 1
                if cfg.clamp:
                    with torch.no_grad():
                        x.clamp_(0, 1)
                if (it + 1) % 10 == 0 or it + 1 == cfg.iterations:
                    history.append((it + 1, float(value) / r))
                if on_step is not None:
                    on_step(it + 1, x.detach().clamp(0, 1))
                if progress:  # every step: the first bar showed only after 10 steps (9.5 s on a ConvNet)
                    progress(it + 1, float(value) / r)
        final = x.detach()
        with torch.enable_grad():
            losses = self.loss(final).detach()
        return OptimisationResult(images=final.cpu(), losses=losses.cpu(),
                                  iterations=len(history) if cfg.optimizer == "lbfgs" else cfg.iterations,
                                  evaluations=evaluations, seconds=time.perf_counter() - start,
                                  history=history)
