"""Does exact mode's S1 RGB shortfall come from the Gaussian start (variance) or from the prior (bias)?

Each of the first ``--samples`` QGI S1 updates of Table I's exact cell (``leaklab attack qgi
--setting S1 --layouts 12``, same capture and seed) is attacked in exact mode from ``--starts``
Gaussian starts (attack seeds 0, 1, ...), all else at the defaults. If the runs ended far apart,
averaging them would move the estimate towards the posterior mean and raise PSNR; if they end at one
image, the error is the image prior's and no number of restarts helps. Printed and written: per sample,
each start's Y-PSNR (RGB) and PSNR (depth) over the constant baseline, the average image's, and the PSNR
between the starts' own RGB images.

    .venv/bin/python analysis/start_spread.py --samples 8 --starts 3 --out runs/start-spread.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch

from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.experiments.attack_pool import Job, run_jobs
from leaklab.experiments.room_attack import RoomRunConfig, capture_samples
from leaklab.rl.envs.layouts import layouts_arg
from leaklab.metrics.image import constant_baseline, psnr


def gains(images: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """RGB (Y channel) and depth PSNR minus the constant baseline's, raw (no paper normalisation);
    depth alone for S2 images."""
    out = {}
    parts = (("rgb", slice(0, 3), "y"), ("depth", slice(3, 4), "rgb")) if truth.shape[1] == 4 else \
        (("depth", slice(0, 1), "rgb"),)
    for name, part, channel in parts:
        t = truth[:, part]
        out[name] = float(psnr(images[:, part], t, channel) - psnr(constant_baseline(t), t, channel))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = RoomRunConfig(algorithm="qgi", setting="S1", samples=args.samples,
                           layouts=layouts_arg("12"))
    state, samples = capture_samples(config)
    jobs = [Job("qgi", config.spec, state, s.update, RoomAttackConfig(seed=k))
            for s in samples for k in range(args.starts)]
    images: dict[int, torch.Tensor] = {}

    def on_result(i: int, rec) -> None:
        images[i] = rec.images
        print(f"attack {i + 1}/{len(jobs)} done", flush=True)

    run_jobs(jobs, args.workers, on_result)
    rows = []
    for n, s in enumerate(samples):
        runs = [images[n * args.starts + k] for k in range(args.starts)]
        truth = s.truth["images"]
        between = [float(psnr(a[:, :3], b[:, :3], "y")) for a, b in itertools.combinations(runs, 2)]
        rows.append({"sample": s.index, "starts": [gains(r, truth) for r in runs],
                     "average": gains(torch.stack(runs).mean(0), truth),
                     "rgb_psnr_between_starts_min": min(between) if between else None})
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        "rgb_gain_single_mean": statistics.fmean(r["starts"][0]["rgb"] for r in rows),
        "rgb_gain_average_mean": statistics.fmean(r["average"]["rgb"] for r in rows),
        "depth_gain_single_mean": statistics.fmean(r["starts"][0]["depth"] for r in rows),
        "depth_gain_average_mean": statistics.fmean(r["average"]["depth"] for r in rows),
    }
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows, "samples": args.samples,
                                    "starts": args.starts}, indent=1))


if __name__ == "__main__":
    main()
