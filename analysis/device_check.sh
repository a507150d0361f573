#!/bin/sh
# The room audit on a lent GPU machine, step by step, each step's output in $OUT/<step>.log (no pipes: a
# crashed parent's engines kept a `| tail` open for 9 minutes in session 23). Its question: why the
# default `leaklab audit --device cuda` died of a segmentation fault there at c17b940 while `--quick` ran
# (docs/reproductions.md, "The main job on CUDA crashed").
#
# The machine has its own torch (2.11 + CUDA, Python 3.12) and no network. Before the call, on this
# machine, fetch the wheels of the rest into the ignored folder .whl (the device tool carries at most
# 64 MiB: keep vizdoom and the small ones, leave out torch, numpy, scipy, pandas, scikit-*, sympy):
#   .venv/bin/python -m pip download -q -d .whl --python-version 3.12 --only-binary=:all: \
#       -c constraints.txt vizdoom gymnasium typer rich pydantic safetensors jinja2 torchmetrics \
#       dp-accounting opacus matplotlib
#   (then delete .whl/torch-* .whl/nvidia* .whl/triton* and whatever is large and already there)
# and run it with the device tool: command "sh analysis/device_check.sh", carry [".whl"], timeout 560
# (the steps' limits add up to 480 s and 40 s of kill grace).
set -u
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
python3 -m venv --system-site-packages /tmp/dc-venv
PY=/tmp/dc-venv/bin/python
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, note its exit status and /dev/shm
    name=$1 limit=$2
    shift 2
    start=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: exit $? after $(( $(date +%s) - start )) s" >> "$OUT/steps.txt"
    { echo "after $name"; df -k /dev/shm; } >> "$OUT/shm.txt"
}
{ nproc; nvidia-smi; python3 --version; df -h /dev/shm; ulimit -a; cat /proc/sys/vm/overcommit_memory; } \
    > "$OUT/machine.txt" 2>&1
# what the machine lacks comes from .whl (pip keeps what is installed, whatever its version)
step install 120 "$PY" -m pip install --no-index --find-links .whl vizdoom gymnasium typer rich pydantic \
    safetensors jinja2 torchmetrics dp-accounting opacus matplotlib scipy
export PYTHONPATH="$PWD/src" LEAKLAB_THREADS=1
step quick 90 "$PY" -X faulthandler -m leaklab.cli audit --quick --device cuda --out "$OUT/quick"
step capture-cpu 90 "$PY" -X faulthandler -m leaklab.cli audit --iterations 1 --out "$OUT/capture-cpu"
step audit-cuda 180 "$PY" -X faulthandler -m leaklab.cli audit --device cuda --out "$OUT/audit-cuda"
ps -ef > "$OUT/ps.txt"
