"""Building a model from its declared specification (what a server and a client agree on)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.models.vision import CNN, MLP, ConvBig, ConvNet, LeNetDLG, PrecodeMLP, ResNet18
from leaklab.names import MODEL_NAMES


class ModelSpec(BaseModel):
    """Architecture and input normalisation of a model; enough to rebuild it exactly."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Literal[MODEL_NAMES]
    num_classes: int = Field(gt=1, le=100_000)
    in_channels: int = Field(gt=0, le=16)
    image_size: int = Field(ge=8, le=512)
    width: int | None = Field(default=None, gt=0, le=1024)
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @model_validator(mode="after")
    def _channels_match(self) -> "ModelSpec":
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise ValueError("mean and std need one value per input channel")
        if any(s <= 0 for s in self.std):
            raise ValueError("std values must be positive")
        return self


def build_model(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Instantiate the network of ``spec``; ``seed`` fixes the random initialisation."""
    if seed is not None:
        torch.manual_seed(seed)
    common = dict(num_classes=spec.num_classes, in_channels=spec.in_channels,
                  image_size=spec.image_size, mean=spec.mean, std=spec.std)
    if spec.name == "lenet":
        if spec.width is not None:
            raise LeaklabError("lenet is DLG's fixed network; it takes no width")
        return LeNetDLG(**common)
    if spec.name == "convnet":
        if spec.image_size < 9:
            raise LeaklabError("convnet needs images of at least 9x9 pixels (two 3x3 max-pools)")
        return ConvNet(**common, width=spec.width or 64)
    if spec.name == "resnet18":
        return ResNet18(**common, width=spec.width or 64)
    if spec.name == "mlp":
        return MLP(**common, width=spec.width or 500)
    if spec.name == "cnn":
        return CNN(**common, width=spec.width or 32)
    if spec.name == "convbig":
        return ConvBig(**common, width=spec.width or 32)
    if spec.name == "precode":
        return PrecodeMLP(**common, width=spec.width or 500)
    raise LeaklabError(f"unknown model {spec.name!r}; choose one of {', '.join(MODEL_NAMES)}")
