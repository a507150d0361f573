"""Small building blocks shared by the models."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def batchnorm_layers(model: nn.Module) -> list[nn.Module]:
    """The BatchNorm layers of ``model`` (of any dimension), in module order."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


class Normalize(nn.Module):
    """Maps [0, 1] pixels to ``(x - mean) / std`` per channel; mean and std are buffers."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
