"""Adversarial training on the client: Madry et al.'s projected gradient descent in an L2 ball (seed 004,
section 5.1: "Madry's AT with l2 norm bound").

A client that trains adversarially replaces each batch by its adversarial examples before the gradient step,
so what it sends (FedSGD gradient or FedAvg delta) is computed on them: seed 004's attack reconstructs those
examples, which stay within ``eps`` (L2, pixels in [0, 1]) of the private images.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn


class AdversarialConfig(BaseModel):
    """Madry's L2 PGD: ``steps`` steps of length ``step_size`` (default ``2.5 * eps / steps``, the step of
    Madry et al.'s robustness library) along the normalised loss gradient, each projected back into the L2 ball
    of radius ``eps`` around the image and into the pixel range [0, 1]; no random start."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    eps: float = Field(gt=0, le=1000, description="L2 radius of the perturbation, pixels in [0, 1]")
    steps: int = Field(default=7, ge=1, le=1000)
    step_size: float | None = Field(default=None, gt=0, le=1000)

    @property
    def step(self) -> float:
        return self.step_size if self.step_size is not None else 2.5 * self.eps / self.steps


def _per_image(values: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each image of ``values`` (N, ...), shaped to broadcast over it."""
    return values.flatten(1).norm(dim=1).view(-1, *([1] * (values.ndim - 1)))


def adversarial_examples(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                         config: AdversarialConfig) -> torch.Tensor:
    """The PGD adversarial examples of ``images`` (N, C, H, W) in [0, 1] against ``model``'s cross-entropy.

    The examples are searched with the model in eval mode (BatchNorm with its running statistics, so the search
    neither reads nor moves them); ``model`` comes back in the mode it came in, its parameters untouched.
    """
    was_training = model.training
    model.eval()
    delta = torch.zeros_like(images)
    try:
        with torch.enable_grad():
            for _ in range(config.steps):
                delta.requires_grad_(True)
                grad, = torch.autograd.grad(F.cross_entropy(model(images + delta), labels), delta)
                delta = delta.detach() + config.step * grad / _per_image(grad).clamp_min(1e-12)
                norm = _per_image(delta)  # projected onto the ball; a radius under float32's range leaves 0, not NaN
                delta = delta * torch.where(norm > config.eps, config.eps / norm, torch.ones_like(norm))
                delta = (images + delta).clamp(0, 1) - images
    finally:
        model.train(was_training)
    return (images + delta).detach()
