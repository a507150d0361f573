"""The one place where the compute device and thread count are chosen, and a process set up to say where
it crashed."""

from __future__ import annotations

import faulthandler
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from leaklab.errors import LeaklabError
from leaklab.names import DEVICE_PATTERN, MAX_THREADS


_ENV_DEVICES_CHECKED: set[str] = set()


def default_device() -> torch.device:
    """CUDA when a GPU is present (or ``LEAKLAB_DEVICE`` names one), else the CPU."""
    name = os.environ.get("LEAKLAB_DEVICE")
    if name:
        # a bad name was a traceback from torch; checked once a process (a CUDA check starts a child process)
        if name not in _ENV_DEVICES_CHECKED:
            require_device(name, "LEAKLAB_DEVICE")
            _ENV_DEVICES_CHECKED.add(name)
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")




def require_device(name: str, what: str = "--device") -> None:
    """Refuse, in one line and before any work, a device name other than ``cpu`` or ``cuda[:N]`` and a
    CUDA device this machine does not have. (The room attacks take their device from ``--device`` and
    default to the CPU: their single-sample optimisations are bound by kernel launches, and worker
    processes sharing one GPU ran slower than as many CPU cores; measured in docs/reproductions.md.)"""
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise LeaklabError(f"{what} {name!r}: choose cpu or cuda[:N]")
    if not name.startswith("cuda"):
        return
    # CUDA stays uninitialised in this process (the rooms' capture then starts ViZDoom's engines from it by
    # fork, which torch warns an initialised CUDA does not survive): NVML counts the GPUs, a child tries CUDA
    count = torch.cuda.device_count()
    if count == 0 or not _cuda_works():
        raise LeaklabError(f"{what} {name}: no CUDA GPU is available here (use {what} cpu)")
    index = int(name.partition(":")[2] or 0)
    if index >= count:
        seen = "only cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise LeaklabError(f"{what} {name}: this process sees {count} CUDA GPU{'s' if count > 1 else ''} ({seen})")


def _cuda_works() -> bool:
    """Whether CUDA starts, asked of a child process (NVML also counts GPUs CUDA cannot use: a driver older
    than torch's CUDA, a GPU held in exclusive mode)."""
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextmanager
def repeatable(device: torch.device | str) -> Iterator[None]:
    """Within the block, CUDA work on ``device`` gives the same numbers for the same seed: torch's
    deterministic algorithms (cuDNN's included; an operation without one raises) and cuBLAS's fixed
    workspace; and cuDNN's convolutions compute in float32, not in TF32 (torch's default there: 10-bit
    mantissas, where the attacks match gradients to float32's rounding). Nothing changes on the CPU,
    whose single-threaded kernels already repeat bit for bit on one host (not across processors:
    :func:`processor`). The room and image attacks run inside it. On the lent H100 (torch 2.11) two
    runs of the same room attack differed by up to 0.19 dB without it and were identical with it, as
    were the image attacks on LeNet, ConvNet, ResNet-18 and the CNN; measured in
    docs/reproductions.md. The previous settings come back on exit."""
    if torch.device(device).type != "cuda":
        yield
        return
    # cuBLAS reads it when its handle is created: the attack's worker sets it before any CUDA work
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    conv = torch.backends.cudnn.conv
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark, conv.fp32_precision)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.benchmark = before[1]
        conv.fp32_precision = before[2]


def processor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU as ``/proc/cpuinfo`` names it, with its family, model and widest vector unit, e.g.
    ``AMD EPYC (family 25 model 17, avx512)``: two hosts of one machine kind sold under one name gave
    the same attacks different float32 results (exact-mode Table I means up to 0.44 dB apart, session
    12), so results files say which processor computed them."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor is enough
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown"
    flags = set(fields.get("flags", "").split())
    vector = next((unit for flag, unit in (("amx_tile", "amx"), ("avx512f", "avx512"), ("avx2", "avx2"))
                   if flag in flags), "")
    model = " ".join(f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model"))
                     if key in fields)
    details = ", ".join(d for d in (model, vector) if d)
    name = fields.get("model name") or platform.processor() or "unknown"
    return f"{name} ({details})" if details else name


def versions() -> dict[str, str]:
    """The software that computed a result (leaklab, torch, Python), for its results file."""
    import leaklab

    return {"leaklab": leaklab.__version__, "torch": torch.__version__, "python": platform.python_version()}


def describe(device: torch.device) -> str:
    """A human-readable device name for results files and benchmarks."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'' if threads == 1 else 's'}), {processor()}"


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
    if not 1 <= chosen <= MAX_THREADS:
        raise LeaklabError(f"the thread count must be from 1 to {MAX_THREADS} (got {chosen})")
    torch.set_num_threads(chosen)
    return chosen


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op threads at 1 within the block, the caller's count back on exit. The CPU kernels'
    rounding depends on the thread count (a convolution's weight gradient summed in other blocks), so a
    room capture or attack run inside it gives the same numbers bit for bit whatever the caller set: an S1
    client update captured with 2 threads differed from the 1-thread one in the first convolutions'
    gradients, and one attack on it by 0.5 dB (docs/reproductions.md, "The caller's thread count")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def crash_tracebacks() -> None:
    """Have a crash in native code (a segmentation fault or bus error, e.g. in ViZDoom's engine start) print
    the Python traceback of every thread, for a bug report, unless a fault handler is on already."""
    if not faulthandler.is_enabled() and sys.__stderr__ is not None:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
