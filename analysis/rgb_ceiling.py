"""How much RGB can any attack get back through the `small` network's first layer with a TV prior?

An oracle handed the true RGB stream's first-layer output (``relu(conv.rgb.0(rgb))``: 16 filters of
8x8x3 at stride 4, i.e. 16 numbers for each 4x4x3 = 48 pixel values, about half of them zeroed by the
ReLU) reconstructs the RGB frame with exact mode's image stage (Adam, cosine annealing, 2,000 steps,
exact mode's RGB prior decaying from 0.1 to 0.003: :func:`~leaklab.attacks.rl.images.colour_tv` since
session 29, TV pooled over R, G, B before): ``--target a1``. Every later layer, feature and
gradient is a function of that output; the only other trace of the frame in the update is the first
layer's own weight gradient ``sum_p delta1_p x_p^T`` (3,072 numbers, linear in the frame), which
``--target update`` adds (the oracle also knows ``delta1``): everything the update holds about the
frame, so no attack with the same prior and optimiser should score above it. ``--target z1`` hands
over the pre-ReLU output instead, which the network never passes on. Scores are Y-channel PSNR beside
the constant baseline on the frames of ``leaklab attack qgi --setting S1`` (same samples, same seed).

    .venv/bin/python analysis/rgb_ceiling.py --target update --out runs/rgb-ceiling-update.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.grad import conv2d_weight

from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.exact import exact_streams, feature_error
from leaklab.attacks.rl.images import colour_tv, gaussian_start
from leaklab.attacks.rl.optim import adam
from leaklab.experiments.room_attack import RoomRunConfig, capture_samples
from leaklab.rl.envs.layouts import layouts_arg
from leaklab.metrics.image import constant_baseline, psnr
from leaklab.models.perception import build_perception_net


def oracle_rgb(layer: torch.nn.Conv2d, rgb: torch.Tensor, target: str, cfg: RoomAttackConfig,
               delta: torch.Tensor | None = None, weight_grad: torch.Tensor | None = None) -> torch.Tensor:
    """The RGB frame from the true first-layer output (``a1``/``update`` after the ReLU, ``z1``
    before); ``update`` also matches ``weight_grad``, the layer's gradient for the output error ``delta``."""
    act = (lambda z: z) if target == "z1" else (lambda z: z.relu())  # noqa: E731
    with torch.no_grad():
        want = act(layer(rgb))
    x = gaussian_start(tuple(rgb.shape), cfg.seed).requires_grad_()

    def loss(done: float) -> torch.Tensor:
        tv = cfg.tv_weight * (cfg.tv_final / cfg.tv_weight) ** done
        total = ((act(layer(x)) - want) ** 2).sum() / (want * want).sum() + tv * colour_tv(x)
        if target == "update":
            rec = conv2d_weight(x, layer.weight.shape, delta, stride=layer.stride, padding=layer.padding)
            total = total + ((rec - weight_grad) ** 2).sum() / (weight_grad * weight_grad).sum()
        return total

    adam([x], loss, cfg.iterations, cfg.lr, clamp=[x])
    return x.detach()


def first_layer_error(net: torch.nn.Module, grads: dict[str, torch.Tensor], rgb: torch.Tensor) -> torch.Tensor:
    """``dJ/dz1`` of the RGB stream's first convolution at the true frame (the client's error)."""
    rgb_stream = exact_streams(net)[0]  # RGB comes first in the features
    g_f = feature_error(net, grads)[:, rgb_stream.offset:rgb_stream.offset + rgb_stream.size]
    stream = net.conv.rgb
    z1 = stream[0](rgb).requires_grad_()
    out = stream[1:](z1)
    return torch.autograd.grad((g_f * out).sum(), z1)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--layouts", default="12")
    parser.add_argument("--target", choices=("a1", "update", "z1"), default="a1")
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
        grads = {k: v.float() for k, v in s.update.tensors.items()}
        delta = first_layer_error(net, grads, rgb) if args.target == "update" else None
        rec = oracle_rgb(net.conv.rgb[0], rgb, args.target, cfg, delta, grads["conv.rgb.0.weight"])
        row = {}
        if delta is not None:  # the oracle's error is the client's: its gradient at the truth is the update's
            layer, observed = net.conv.rgb[0], grads["conv.rgb.0.weight"]
            at_truth = conv2d_weight(rgb, layer.weight.shape, delta, stride=layer.stride, padding=layer.padding)
            row["weight_grad_error_at_truth"] = float((at_truth - observed).norm() / observed.norm())
        rows.append({**row, "index": s.index, "layouts": s.layouts, "rgb_psnr": float(psnr(rec, rgb, "y")),
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
