"""Update defenses and their likelihoods (seed 001, sections 4 and 6).

Each defense maps the clean update (all parameters' tensors, seen as one vector) to what the client
sends. A chain such as ``prune:0.5,gaussian:0.1`` applies its steps left to right. Where the chain has a
density, :meth:`DefenseChain.log_prob` gives ``log p(g | clean)``, the conditional the Bayes-optimal
adversary maximises (seed 001 eq. 2):

* deterministic steps (``clip:c`` global L2-norm clipping, ``topk:p`` magnitude pruning of the fraction
  ``p`` smallest entries) move the mean: they are applied to the clean update inside the likelihood;
* ``prune:p`` zeroes each entry independently with probability ``p``;
* the final noise step, ``gaussian:sigma`` or ``laplace:b``, adds i.i.d. noise to every entry.

With random pruning before the noise each entry follows a two-component mixture,
``p * N(0, s) + (1 - p) * N(clean, s)`` (Laplace likewise). Its negative log-likelihood has the closed-form
gradient ``-w * score(o - clean)``, where ``w`` is the posterior probability that the entry was kept;
:class:`_MixtureNLL` implements it directly, at half the cost of autograd through ``logaddexp``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from leaklab.errors import LeaklabError
from leaklab.fields import defense_steps
from leaklab.threat import ClientUpdate


class Defense(ABC):
    """One step of a defense chain, acting on the update as a whole (a list of tensors)."""

    name: str

    @abstractmethod
    def apply(self, tensors: list[torch.Tensor], generator: torch.Generator) -> list[torch.Tensor]:
        """The defended tensors."""

    @property
    @abstractmethod
    def spec(self) -> str:
        """The ``name:parameter`` form of this step."""


def _number(x: float) -> str:
    """``x`` as the shortest text that reads back as the same float (a spec names what was applied)."""
    return repr(float(x))

@dataclass(frozen=True)
class Gaussian(Defense):
    """Adds ``N(0, sigma^2)`` to every entry (with clipping first, the DP-SGD mechanism)."""

    sigma: float
    name = "gaussian"

    @property
    def scale(self) -> float:
        """The noise's scale, its std (as :attr:`Laplace.scale`)."""
        return self.sigma

    def apply(self, tensors, generator):
        return [t + self.sigma * torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)
                for t in tensors]

    @property
    def spec(self):
        return f"gaussian:{_number(self.sigma)}"


@dataclass(frozen=True)
class Laplace(Defense):
    """Adds i.i.d. Laplace noise of scale ``b`` to every entry."""

    b: float
    name = "laplace"

    @property
    def scale(self) -> float:
        """The noise's scale ``b`` (as :attr:`Gaussian.scale`)."""
        return self.b

    def apply(self, tensors, generator):
        out = []
        for t in tensors:
            u = torch.rand(t.shape, generator=generator, dtype=torch.float64) - 0.5
            noise = -self.b * torch.sign(u) * torch.log1p(-2 * u.abs())
            out.append(t + noise.to(t.dtype).to(t.device))
        return out

    @property
    def spec(self):
        return f"laplace:{_number(self.b)}"


@dataclass(frozen=True)
class Prune(Defense):
    """Random pruning: each entry is set to 0 independently with probability ``p``."""

    p: float
    name = "prune"

    def apply(self, tensors, generator):
        return [t * (torch.rand(t.shape, generator=generator) >= self.p).to(t.dtype).to(t.device)
                for t in tensors]

    @property
    def spec(self):
        return f"prune:{_number(self.p)}"


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


@dataclass(frozen=True)
class TopK(Defense):
    """Magnitude pruning: the fraction ``p`` of entries with the smallest |value| is set to 0, and any entry
    tied with the largest of them (a threshold on |value|: ties, rare but for exact zeros, go together)."""

    p: float
    name = "topk"

    def apply(self, tensors, generator=None):
        flat = _flat(tensors)
        drop = int(round(self.p * flat.numel()))
        if drop == 0:
            return list(tensors)
        threshold = flat.detach().abs().kthvalue(drop).values
        return [t * (t.detach().abs() > threshold).to(t.dtype) for t in tensors]

    @property
    def spec(self):
        return f"topk:{_number(self.p)}"


@dataclass(frozen=True)
class Clip(Defense):
    """Scales the whole update down to global L2 norm at most ``c`` (DP-SGD's clipping step)."""

    c: float
    name = "clip"

    def apply(self, tensors, generator=None):
        # summed in float32 at least: a float16 update's squares overflowed to inf and the factor zeroed it
        wide = [t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]
        # the floor leaves every norm alone but a zero update's, where sqrt's gradient would be 0/0 (a likelihood's NaN)
        norm = torch.sqrt(sum((t * t).sum() for t in wide).clamp_min(1e-30))
        factor = torch.clamp(self.c / (norm + 1e-12), max=1.0)
        return [t * factor for t in tensors]

    @property
    def spec(self):
        return f"clip:{_number(self.c)}"


_DETERMINISTIC = (TopK, Clip)
_NOISE = (Gaussian, Laplace)


class _MixtureNLL(torch.autograd.Function):
    """Sum over entries of ``-log(p * f(o) + (1 - p) * f(o - c))`` for a zero-centred noise density
    ``f`` (Gaussian or Laplace), with the closed-form gradient in ``c``."""

    @staticmethod
    def forward(ctx, observed, clean, p, scale, laplace):
        r_kept = observed - clean
        if laplace:
            log_f_kept = -r_kept.abs() / scale
            log_f_pruned = -observed.abs() / scale
        else:
            log_f_kept = -0.5 * (r_kept / scale) ** 2
            log_f_pruned = -0.5 * (observed / scale) ** 2
        a = math.log1p(-p) + log_f_kept
        b = math.log(p) + log_f_pruned
        total = torch.logaddexp(a, b)
        ctx.save_for_backward(r_kept, torch.exp(a - total))
        ctx.scale, ctx.laplace = scale, laplace
        const = math.log(2 * scale) if laplace else 0.5 * math.log(2 * math.pi * scale ** 2)
        return (-total).sum() + const * observed.numel()

    @staticmethod
    def backward(ctx, grad_out):
        r_kept, kept_posterior = ctx.saved_tensors
        score = torch.sign(r_kept) / ctx.scale if ctx.laplace else r_kept / ctx.scale ** 2
        return None, -grad_out * kept_posterior * score, None, None, None


class DefenseChain:
    """A sequence of defense steps applied left to right; the empty chain sends the clean update."""

    def __init__(self, steps: Sequence[Defense] = ()):
        self.steps = list(steps)

    @property
    def spec(self) -> str | None:
        return ",".join(s.spec for s in self.steps) or None

    def apply(self, update: ClientUpdate, generator: torch.Generator) -> ClientUpdate:
        """The defended update (new tensors; the input is not modified)."""
        names = list(update.tensors)
        tensors = [update.tensors[n] for n in names]
        for step in self.steps:
            tensors = step.apply(tensors, generator)
        combined = ",".join(filter(None, [update.defense, self.spec]))
        return update.with_tensors(dict(zip(names, tensors)), combined or None)

    def _parts(self) -> tuple[list[Defense], Prune | None, Defense | None]:
        steps = list(self.steps)
        noise = steps.pop() if steps and isinstance(steps[-1], _NOISE) else None
        prune = steps.pop() if steps and isinstance(steps[-1], Prune) else None
        return steps, prune, noise

    @property
    def has_density(self) -> bool:
        """True for chains ``[clip|topk]* [prune]? (gaussian|laplace)``: their likelihood is exact."""
        det, _prune, noise = self._parts()
        return noise is not None and all(isinstance(s, _DETERMINISTIC) for s in det)

    @property
    def noise(self) -> Gaussian | Laplace | None:
        """The chain's final noise step, if it ends in one."""
        return self._parts()[2]

    def log_prob(self, observed: Sequence[torch.Tensor], clean: Sequence[torch.Tensor]) -> torch.Tensor:
        """``log p(observed | clean)``, summed over all entries; differentiable in ``clean``."""
        if not self.has_density:
            raise LeaklabError(f"defense {self.spec or 'none'!r} has no density; the Bayes objective "
                               "needs a chain ending in gaussian or laplace noise")
        det, prune, noise = self._parts()
        for step in det:
            clean = step.apply(list(clean))
        o, c = _flat(observed), _flat(clean)
        laplace, scale = isinstance(noise, Laplace), noise.scale
        if prune is not None and prune.p > 0:
            return -_MixtureNLL.apply(o, c, prune.p, scale, laplace)
        n = o.numel()
        if laplace:
            return -(o - c).abs().sum() / scale - n * math.log(2 * scale)
        return -0.5 * ((o - c) ** 2).sum() / scale ** 2 - 0.5 * n * math.log(2 * math.pi * scale ** 2)


def parse_defense(spec: str | None) -> DefenseChain:
    """Parse ``"prune:0.5,gaussian:0.1"`` (:func:`leaklab.fields.defense_steps`); an empty string or
    ``"none"`` is the empty chain."""
    return DefenseChain([_STEPS[name](value) for name, value in defense_steps(spec)])


_STEPS = {"gaussian": Gaussian, "laplace": Laplace, "prune": Prune, "topk": TopK, "clip": Clip}
