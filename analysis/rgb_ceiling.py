"""How much RGB can any attack get back through the `small` network's first layer with a TV prior?

An oracle handed the true RGB stream's first-layer output (``relu(conv.rgb.0(rgb))``: 16 filters of
8x8x3 at stride 4, i.e. 16 numbers for each 4x4x3 = 48 pixel values, about half of them zeroed by the
ReLU) reconstructs the RGB frame with exact mode's image stage (Adam, cosine annealing, 2,000 steps,
TV pooled over R, G, B decaying from 0.1 to 0.003). Every later layer, feature and gradient is a
function of that output, so no gradient attack with the same prior can score above it (up to the
optimiser). ``--target z1`` hands over the pre-ReLU output as well: what the layer's linear part
keeps. Scores are Y-channel PSNR beside the constant baseline, as in docs/reproductions.md.

    .venv/bin/python analysis/rgb_ceiling.py --samples 48 --layouts 12 --target a1 --out runs/rgb-ceiling-a1.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.images import coupled_tv, gaussian_start
from leaklab.attacks.rl.optim import adam
from leaklab.experiments.room_attack import RoomRunConfig, capture_samples, layouts_arg
from leaklab.metrics.image import constant_baseline, psnr
from leaklab.models.perception import build_perception_net


def oracle_rgb(layer: torch.nn.Conv2d, rgb: torch.Tensor, target: str, cfg: RoomAttackConfig) -> torch.Tensor:
    """The RGB frame from the true first-layer output (``a1`` after the ReLU, ``z1`` before)."""
    act = (lambda z: z.relu()) if target == "a1" else (lambda z: z)  # noqa: E731
    with torch.no_grad():
        want = act(layer(rgb))
    x = gaussian_start(tuple(rgb.shape), cfg.seed).requires_grad_()

    def loss(done: float) -> torch.Tensor:
        tv = cfg.tv_weight * (cfg.tv_final / cfg.tv_weight) ** done
        return ((act(layer(x)) - want) ** 2).sum() / (want * want).sum() + tv * coupled_tv(x)

    adam([x], loss, cfg.iterations, cfg.lr, clamp=[x])
    return x.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--layouts", default="12")
    parser.add_argument("--target", choices=("a1", "z1"), default="a1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = RoomRunConfig(setting="S1", samples=args.samples, layouts=layouts_arg(args.layouts), seed=args.seed)
    state, samples = capture_samples(run)  # the same private frames as `leaklab attack qgi --setting S1`
    net = build_perception_net(run.spec)
    net.load_state_dict(state)
    for p in net.parameters():
        p.requires_grad_(False)
    cfg, rows = RoomAttackConfig(), []
    for s in samples:
        rgb = s.truth["images"][:1, :3].float()
        start = time.perf_counter()
        rec = oracle_rgb(net.conv.rgb[0], rgb, args.target, cfg)
        rows.append({"index": s.index, "layouts": s.layouts, "rgb_psnr": float(psnr(rec, rgb, "y")),
                     "rgb_psnr_baseline": float(psnr(constant_baseline(rgb), rgb, "y")),
                     "seconds": time.perf_counter() - start})
        print(json.dumps(rows[-1]), flush=True)
    gains = [r["rgb_psnr"] - r["rgb_psnr_baseline"] for r in rows]
    summary = {"target": args.target, "samples": len(rows), "iterations": cfg.iterations,
               "rgb_psnr_mean": statistics.fmean(r["rgb_psnr"] for r in rows),
               "rgb_psnr_baseline_mean": statistics.fmean(r["rgb_psnr_baseline"] for r in rows),
               "gain_mean": statistics.fmean(gains), "gain_min": min(gains), "gain_max": max(gains),
               "samples_over_10dB": sum(g >= 10 for g in gains)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "samples": rows}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
