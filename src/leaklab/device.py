"""The one place where the compute device and thread count are chosen."""

from __future__ import annotations

import os

import torch


def default_device() -> torch.device:
    """CUDA when a GPU is present (or ``LEAKLAB_DEVICE`` names one), else the CPU."""
    name = os.environ.get("LEAKLAB_DEVICE")
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe(device: torch.device) -> str:
    """A human-readable device name for results files and benchmarks."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"
