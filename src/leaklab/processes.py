"""Which process a process id names, for what a killed process leaves behind: the ViZDoom engines' private
folders (:mod:`leaklab.rl.envs.engine`) and the temporary folders of runs into an ``--out``
(:func:`leaklab.io.atomic_dir`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_scope() -> str:
    """What makes a process id name one process: this boot of this machine (a temporary folder may be
    shared by machines) and this PID namespace (or by containers); '0' for a part that cannot be read."""
    boot = "0"
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "") or "0"
    namespace = 0
    with contextlib.suppress(OSError):
        namespace = os.stat("/proc/self/ns/pid").st_ino
    return f"{boot}.{namespace}"


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` exists in this scope (:func:`process_scope`); one of another user's exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
