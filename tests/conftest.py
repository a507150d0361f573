"""Test settings: side effects go to a temporary folder (removed at the end); torch uses one thread per test process."""

import atexit
import os
import shutil
import tempfile

_tmp = tempfile.mkdtemp(prefix="leaklab-test-")
_pid = os.getpid()
atexit.register(lambda: os.getpid() == _pid and shutil.rmtree(_tmp, ignore_errors=True))  # not by a fork
for var in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCH_HOME", "FLWR_HOME"):
    os.environ.setdefault(var, os.path.join(_tmp, var.lower()))
os.environ.setdefault("LEAKLAB_DEVICE", "cpu")

import torch  # noqa: E402

torch.set_num_threads(1)
