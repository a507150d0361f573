"""The one place where the compute device and thread count are chosen."""

from __future__ import annotations

import os
import re

import torch

from leaklab.errors import LeaklabError


def default_device() -> torch.device:
    """CUDA when a GPU is present (or ``LEAKLAB_DEVICE`` names one), else the CPU."""
    name = os.environ.get("LEAKLAB_DEVICE")
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"  # the room attacks' --device values


def require_device(name: str) -> None:
    """Refuse, in one line and before any work, a device name other than ``cpu`` or ``cuda[:N]`` and a
    CUDA device this machine does not have. (The room attacks take their device from ``--device`` and
    default to the CPU: their single-sample optimisations are bound by kernel launches, and worker
    processes sharing one GPU ran slower than as many CPU cores; measured in docs/reproductions.md.)"""
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise LeaklabError(f"--device {name!r}: choose cpu or cuda[:N]")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise LeaklabError(f"--device {name}: no CUDA GPU is available here (use --device cpu)")


def describe(device: torch.device) -> str:
    """A human-readable device name for results files and benchmarks."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count once for the process and return it.

    ``threads`` or the ``LEAKLAB_THREADS`` variable, else 1. Measured here (2-core CPU): the attacks'
    many small double-backward operations ran 4x slower on two threads than on one while another job
    shared the machine, and independent samples parallelise better across processes. One thread also
    keeps results bit-identical from run to run.
    """
    given = os.environ.get("LEAKLAB_THREADS", "1")
    if threads is None and not (given.isdigit() and int(given) >= 1):
        raise LeaklabError(f"LEAKLAB_THREADS={given!r}: give a whole number of threads, at least 1")
    chosen = threads or int(given)
    if chosen < 1:
        raise LeaklabError("the thread count must be at least 1")
    torch.set_num_threads(chosen)
    return chosen
