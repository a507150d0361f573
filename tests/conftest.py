"""Test settings: side effects go to temporary folders; torch uses one thread per test process."""

import os
import tempfile

_tmp = tempfile.mkdtemp(prefix="leaklab-test-")
for var in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCH_HOME", "FLWR_HOME"):
    os.environ.setdefault(var, os.path.join(_tmp, var.lower()))
os.environ.setdefault("LEAKLAB_DEVICE", "cpu")

import torch  # noqa: E402

torch.set_num_threads(1)
