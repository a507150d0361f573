"""The Gaussian privacy module (GPM) of seed 003 (Gohari, thesis 2023), chapter 3, Algorithm 2: a post-training
mechanism that perturbs a trained network's parameters once, theta-tilde = theta + N(0, sigma^2 I), and answers
every query with the perturbed network. Its privacy follows from Theorem 3.1 with the training algorithm's
sensitivity (bounded by Theorem 3.2 or estimated by :func:`leaklab.privacy.sensitivity.sensitivity_sampler`,
Theorem 3.3); changing the privacy level needs no retraining, only a new draw at another sigma.
"""

from __future__ import annotations

import copy
import math

import torch

from leaklab.errors import LeaklabError

__all__ = ["gaussian_privacy_module", "utility_loss"]


@torch.no_grad()
def gaussian_privacy_module(model: torch.nn.Module, sigma: float, generator: torch.Generator) -> torch.nn.Module:
    """Algorithm 2, line 2: a copy of ``model`` whose every parameter has N(0, sigma^2) noise added, drawn once
    from ``generator`` (a secret one for a deployment: whoever knows its seed can remove the noise). ``model`` is
    left as it was; buffers (BatchNorm statistics) are not parameters and stay."""
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
        raise LeaklabError(f"the Gaussian privacy module's sigma is a finite number >= 0 (got {sigma!r})")
    noisy = copy.deepcopy(model)
    for p in noisy.parameters():
        p.add_(sigma * torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device))
    return noisy


def utility_loss(private: float, non_private: float) -> float:
    """Definition 3.4: 1 - M(private predictions) / M(non-private predictions) for a metric M (accuracy here)."""
    if not non_private > 0:
        raise LeaklabError(f"utility loss needs the non-private metric above 0 (got {non_private!r})")
    return 1 - private / non_private
