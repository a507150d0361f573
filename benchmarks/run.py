"""Speed benchmarks of leaklab; each writes one JSON file to ``--out`` (see benchmarks/README.md).

    .venv/bin/python benchmarks/run.py --out benchmarks/results            # what `make bench` runs
    .venv/bin/python benchmarks/run.py --out /tmp/bench --quick            # seconds-long smoke run

``inversion_speed``: Inverting Gradients (cosine + TV, Adam) on ConvNet width 64, batch 1, 32x32
photo crops, untrained network, BatchNorm on the client's running statistics -- the ``ig`` case of
``leaklab.experiments.inversion_checks`` (issue 2's acceptance) -- measured through the public
``invert`` call:

* ``single``: iterations per second of one attack, per precision (fp32, bf16 autocast-equivalent);
  ``single_loop_simulator`` is the same attack with the per-instance loop simulator (stock
  autograd) for reference;
* ``batched``: ``instances`` independent attacks (one image and update each) optimised together in
  one ``invert`` call versus the same attacks run one after another; instance-iterations per second
  of both and their ratio;
* ``ceiling``: the floating-point work of one iteration (counted by ``torch.utils.flop_counter``)
  and this machine's measured peak rate (a large matrix product) per precision, hence the share of
  the peak a single attack already uses and the largest speed-up any batching could give.

``room_speed``: QGI in exact mode (issue 4's speed acceptance) on the default perception network (``--arch``),
initialised, single-sample DQN updates from the ViZDoom rooms: samples per minute in settings S2
(depth + box) and S1 (RGB + depth + box), attacked the way ``leaklab attack qgi`` does it (one
process of one torch thread per core), wall clock of the attack phase: the pool's start-up included (spawning
the workers, their imports and first calls; 4.4 s of S2's 23.3 s on 8 samples in session 49), so fewer samples
give a lower rate.

``planning_speed``: seed 003 chapter 2's cost-of-privacy bounds on Example 2 (20 states, 5 actions, T = 10) and its
doublings (T = 20; 10 actions), per k: leaklab's closed form against the thesis' linear programs (one HiGHS solve
per stage, state, action and sense), beside the thesis' seconds (``leaklab.experiments.policy_synthesis.timing``).

``inversion_speed``'s rates use the optimisation loop's own clock (``Reconstruction.seconds``: after set-up and
the prior calibration), after a short warm-up run that pays oneDNN's one-time kernel creation. No speed is
asserted anywhere: the numbers depend on the machine and on what else runs on it, so the file
records the thread count and the load average before and after. Each file says ``"complete": true`` only once its
run has ended: ``inversion_speed.json`` is written after each precision with ``false``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

import torch
from torch.utils.flop_counter import FlopCounterMode

from leaklab.attacks.inversion import InversionConfig, invert
from leaklab.attacks.inversion import attack as attack_module
from leaklab.attacks.inversion.simulate import UpdateSimulator, make_simulator
from leaklab.data import load_images
from leaklab.device import default_device, describe, processor
from leaklab.experiments.inversion_checks import IG_CONFIG
from leaklab.fl import fedsgd_update
from leaklab.io import write_json
from leaklab.models import ModelSpec, build_model
from leaklab.names import ARCH_NAMES, DEFAULT_ARCH
from leaklab.threat import make_view

TARGETS = {"single_iterations_per_second": 9.2, "batched_speedup": 3.0}
ROOM_TARGETS = {"S2_samples_per_minute": 6.0, "S1_samples_per_minute": 1.5}


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _case(instances: int, width: int, image_size: int, seed: int = 0):
    """The IG acceptance case: ``instances`` photo crops, one batch-1 update each, one model."""
    batch = load_images("photos", instances, image_size=image_size, seed=seed)
    spec = ModelSpec(name="convnet", num_classes=batch.num_classes, in_channels=3,
                     image_size=image_size, width=width, mean=batch.mean, std=batch.std)
    net = build_model(spec, seed=seed)
    updates = [fedsgd_update(net, batch.images[i:i + 1], batch.labels[i:i + 1], train_mode=False)
               for i in range(instances)]
    return make_view(spec, net.state_dict(), updates[0].metadata), updates


def _loop_simulator(model, metadata, precision="fp32"):
    return UpdateSimulator(model, metadata, precision)


def _rate(view, updates, config: InversionConfig, device) -> tuple[float, float]:
    """(instance-iterations per second, loop seconds) of one ``invert`` call on ``updates``."""
    recs = invert(view, updates, config, device=device)
    seconds = recs[0].seconds
    return len(updates) * config.iterations / seconds, seconds


def _flops_per_iteration(view, update, config: InversionConfig, device) -> float:
    """Floating-point operations of one optimisation iteration (set-up excluded by differencing)."""
    counts = []
    for iterations in (2, 4):
        counter = FlopCounterMode(display=False)
        with counter:
            invert(view, update, config.model_copy(update={"iterations": iterations}), device=device)
        counts.append(counter.get_total_flops())
    return (counts[1] - counts[0]) / 2


def _peak_flops(dtype: torch.dtype, size: int, device) -> float:
    """Measured floating-point operations per second of a ``size``-square matrix product."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    if device.type == "cuda":  # the warm-up's queued kernels are not the timed ones
        torch.cuda.synchronize()
    repeats, start = 10, time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size ** 3 * repeats / (time.perf_counter() - start)


def inversion_speed(out: Path, quick: bool, precisions: list[str], iterations: int,
                    batched_iterations: int, instances: int, log) -> dict:
    width = 16 if quick else 64
    image_size = 32
    device = default_device()
    view, updates = _case(instances, width, image_size)
    base = IG_CONFIG.model_copy(update={"seed": 0})
    result: dict = {
        "benchmark": "inversion_speed",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": quick,
        "device": describe(device),
        "cpu": processor(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average_before": _load(),
        "case": {"attack": "inverting gradients", "model": "convnet", "width": width,
                 "image_size": image_size, "batch_size": 1, "data": "photos", "bn_stats": "running",
                 "objective": base.objective, "priors": base.priors, "optimizer": base.optimizer,
                 "lr": base.lr, "schedule": base.schedule, "iterations": iterations,
                 "instances": instances, "batched_iterations": batched_iterations},
        "simulator": type(make_simulator(view.model, updates[0].metadata)).__name__,
        "targets": TARGETS,
        "single": {}, "single_loop_simulator": {}, "batched": {}, "ceiling": {},
    }
    for precision in precisions:
        cfg = base.model_copy(update={"precision": precision})
        invert(view, updates[0], cfg.model_copy(update={"iterations": 2}), device=device)  # warm-up
        rate, seconds = _rate(view, [updates[0]], cfg.model_copy(update={"iterations": iterations}), device)
        result["single"][precision] = {"iterations_per_second": rate, "seconds": seconds,
                                       "iterations": iterations}
        log(f"single {precision}: {rate:.2f} it/s")

        flops = _flops_per_iteration(view, updates[0], cfg, device)
        peak = _peak_flops(torch.float32 if precision == "fp32" else torch.bfloat16,
                           512 if quick else 2048, device)
        result["ceiling"][precision] = {
            "gflop_per_iteration": flops / 1e9, "peak_gflops": peak / 1e9,
            "single_gflops": rate * flops / 1e9, "single_share_of_peak": rate * flops / peak,
            "max_batched_speedup": peak / (rate * flops)}
        log(f"ceiling {precision}: {flops / 1e9:.1f} GFLOP/iteration; single attack at "
            f"{rate * flops / peak:.0%} of the {peak / 1e9:.0f} GFLOP/s peak: batching can give at most "
            f"{peak / (rate * flops):.2f}x")

        ref_iterations = max(2, iterations // 3)
        with mock.patch.object(attack_module, "make_simulator", _loop_simulator):
            invert(view, updates[0], cfg.model_copy(update={"iterations": 2}), device=device)
            rate, seconds = _rate(view, [updates[0]], cfg.model_copy(update={"iterations": ref_iterations}),
                                  device)
        result["single_loop_simulator"][precision] = {"iterations_per_second": rate, "seconds": seconds,
                                                      "iterations": ref_iterations}
        log(f"single {precision}, loop simulator: {rate:.2f} it/s")

        bcfg = cfg.model_copy(update={"iterations": batched_iterations})
        invert(view, updates, bcfg.model_copy(update={"iterations": 2}), device=device)  # warm-up
        together, together_s = _rate(view, updates, bcfg, device)
        apart_s = sum(_rate(view, [u], bcfg, device)[1] for u in updates)
        apart = instances * batched_iterations / apart_s
        result["batched"][precision] = {
            "instances": instances, "iterations": batched_iterations,
            "batched_instance_iterations_per_second": together, "batched_seconds": together_s,
            "sequential_instance_iterations_per_second": apart, "sequential_seconds": apart_s,
            "speedup": together / apart}
        log(f"batched {precision}: {together:.2f} vs one after another {apart:.2f} "
            f"instance-it/s ({together / apart:.2f}x)")
        write_json(out / "inversion_speed.json", {**result, "complete": False})  # a stopped run's is partial
    result.update(load_average_after=_load(), complete=True)
    write_json(out / "inversion_speed.json", result)
    return result


def room_speed(out: Path, quick: bool, samples: int, log, arch: str = DEFAULT_ARCH) -> dict:
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    workers = attack_pool.worker_count(0, samples)
    result: dict = {
        "benchmark": "room_speed",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": quick, "arch": arch, "device": "cpu", "cpu": processor(), "torch": torch.__version__,
        "workers": workers, "threads_per_worker": 1, "load_average_before": _load(), "targets": ROOM_TARGETS,
        "settings": {}}
    for setting in ("S2", "S1"):
        attack = RoomAttackConfig(mode="exact", **({"iterations": 5} if quick else {}))
        config = room_attack.RoomRunConfig(algorithm="qgi", setting=setting, arch=arch, samples=samples,
                                           attack=attack)
        state, clean = room_attack.capture_samples(config)
        jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]
        seconds: list[float] = []
        start = time.perf_counter()
        attack_pool.run_jobs(jobs, workers, lambda i, rec: seconds.append(rec.seconds))
        wall = time.perf_counter() - start
        result["settings"][setting] = {
            "samples": samples, "iterations": attack.iterations, "wall_seconds": wall,
            "samples_per_minute": 60 * samples / wall,
            "attack_seconds_per_sample": sum(seconds) / len(seconds)}
        log(f"rooms {setting}: {60 * samples / wall:.2f} samples/min ({workers} processes; "
            f"{sum(seconds) / len(seconds):.1f} s per sample in the attack loop)")
    result.update(load_average_after=_load(), complete=True)
    write_json(out / "room_speed.json", result)
    return result


def planning_speed(out: Path, quick: bool, log) -> dict:
    """Seed 003 chapter 2: seconds per k to bound the cost of privacy of Example 2 (20 states, 5 actions, T = 10)
    and its two doublings, by leaklab's closed form and by the thesis' linear programs (HiGHS)."""
    from leaklab.experiments import policy_synthesis

    config = (policy_synthesis.PolicySynthesisConfig.quick() if quick
              else policy_synthesis.PolicySynthesisConfig())
    result: dict = {"benchmark": "planning_speed",
                    "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "quick": quick, "cpu": processor(), "load_average_before": _load(),
                    "published": policy_synthesis.PUBLISHED["seconds_per_k"], "states": config.states,
                    "settings": policy_synthesis.timing(config)}
    for row in result["settings"]:
        log(f"planning {row['setting']}: {1e3 * row['synthesis_and_bounds_seconds']:.2f} ms per k (closed form), "
            f"{row['lp_seconds']:.2f} s (linear programs)")
    result.update(load_average_after=_load(), complete=True)
    write_json(out / "planning_speed.json", result)
    return result


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (0 read as the default, -1 a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run (small network)")
    parser.add_argument("--threads", type=_positive, default=None, help="torch threads (default: torch's; inversion)")
    parser.add_argument("--precisions", default="fp32,bf16", help="inversion")
    parser.add_argument("--iterations", type=_positive, default=None, help="single-attack iterations (inversion)")
    parser.add_argument("--batched-iterations", type=_positive, default=None, help="inversion")
    parser.add_argument("--instances", type=_positive, default=None, help="inversion")
    parser.add_argument("--only", default="inversion,rooms,planning",
                        help="benchmarks to run: inversion, rooms, planning")
    parser.add_argument("--room-samples", type=_positive, default=None, help="samples per setting (rooms)")
    parser.add_argument("--arch", default=DEFAULT_ARCH, choices=ARCH_NAMES, help="perception network (rooms)")
    args = parser.parse_args(argv)
    only = [b for b in args.only.split(",") if b]
    known = {"inversion", "rooms", "planning"}
    if not only or set(only) - known:
        print(f"unknown benchmark {(sorted(set(only) - known) or [args.only])[0]!r}; choose from "
              "inversion, rooms, planning", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    precisions = [p for p in args.precisions.split(",") if p]
    bad = [p for p in precisions if p not in ("fp32", "bf16")]
    if bad:
        print(f"unknown precision {bad[0]!r}; choose from fp32, bf16", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    load, cores = _load(), os.cpu_count() or 1
    if load and torch.get_num_threads() > 1 and load[0] >= 0.75 * cores:
        print(f"warning: load average {load[0]} on {cores} cores: with {torch.get_num_threads()} torch "
              "threads the attack may run tens of times slower (OpenMP threads wait for each other); "
              "consider --threads 1 or an idle machine", file=sys.stderr)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    if "inversion" in only:
        inversion_speed(args.out, args.quick, precisions,
                        iterations=_given(args.iterations, 3 if args.quick else 60),
                        batched_iterations=_given(args.batched_iterations, 2 if args.quick else 15),
                        instances=_given(args.instances, 3 if args.quick else 16), log=log)
    if "rooms" in only:
        room_speed(args.out, args.quick, _given(args.room_samples, 2 if args.quick else 8), log, args.arch)
    if "planning" in only:
        planning_speed(args.out, args.quick, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
