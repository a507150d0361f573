#!/bin/sh
# The room audit on a lent GPU machine, step by step, each step's output in $OUT/<step>.log (no pipes: a
# crashed parent's engines kept a `| tail` open for 9 minutes in session 23). Its question: why the
# default `leaklab audit --device cuda` died of a segmentation fault there at c17b940 while `--quick` ran
# (docs/reproductions.md, "The main job on CUDA crashed"; session 26's run of this script did not see it).
# Its other use: compare the CUDA audit's results.json, cell by cell, with a CPU run of the same code (session
# 32 found the undefended RGI S1 cell 4 dB under the CPU's that way: exact method version 7 fixed it).
#
# The machine has its own torch (2.11 + CUDA, Python 3.12) and no network. Before the call, on this
# machine, fetch the wheels it lacks into the ignored folder .whl (the device tool carries at most 64 MiB):
#   .venv/bin/python -m pip download -q --no-deps -d .whl --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
#       $(grep -iE '^(vizdoom|gymnasium|farama|pydantic|annotated|typing|dp-acc|dm-tree|opacus|mlxtend)' constraints.txt)
# and run it with the device tool: command "sh analysis/device_check.sh", carry [".whl"], timeout 560
# (the steps' limits add up to at most 530 s with the kill grace). At most 8 files come back from $OUT: the
# commands write under /tmp/dc and only the CUDA audit's and the paper attack's results.json come back.
set -u
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, note its exit status and /dev/shm
    name=$1 limit=$2
    shift 2
    start=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    status=$?
    echo "$name: exit $status after $(( $(date +%s) - start )) s" >> "$OUT/steps.txt"
    df -k /dev/shm | tail -1 >> "$OUT/steps.txt"
    return $status
}
{ nproc; nvidia-smi; python3 --version; df -h /dev/shm; ulimit -a; cat /proc/sys/vm/overcommit_memory; } \
    > "$OUT/machine.txt" 2>&1
# what the machine lacks comes from .whl, without its dependencies (the machine's own versions serve)
step install 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" LEAKLAB_THREADS=1 PYTHONUNBUFFERED=1
if step audit-cuda 240 python3 -X faulthandler -m leaklab.cli audit --device cuda --out /tmp/dc/audit-cuda; then
    step quick 60 python3 -X faulthandler -m leaklab.cli audit --quick --device cuda --out /tmp/dc/quick
    # paper mode on the GPU (stage 1's restarts, session 28, had not run there): two S1 samples
    step paper 130 python3 -X faulthandler -m leaklab.cli attack qgi --setting S1 --mode paper --arch wide-rgb \
        --samples 2 --layouts 2 --iterations 200 --workers 2 --device cuda --out /tmp/dc/paper
else  # the native stack of the crash: cuda-gdb stays with the parent and lets the children go
    step audit-gdb 190 cuda-gdb -batch -ex 'set follow-fork-mode parent' -ex 'set detach-on-fork on' \
        -ex 'set pagination off' -ex run -ex 'thread apply all bt 30' --args \
        python3 -m leaklab.cli audit --device cuda --out /tmp/dc/audit-gdb
fi
ps -ef >> "$OUT/steps.txt"
cp /tmp/dc/audit-cuda/results.json "$OUT/audit-cuda-results.json" 2>/dev/null
cp /tmp/dc/paper/results.json "$OUT/paper-results.json" 2>/dev/null
