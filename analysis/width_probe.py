"""How much does the width of the `small` stack decide what exact mode reads of an S1 RGB frame?

The first ``--samples`` transitions of Table I's QGI exact cell of ``--setting`` (S1 by default:
``leaklab attack qgi --setting S1 --layouts 12``, same rooms and seed) are sent as single-sample DQN
gradients of networks that differ only in the widths of each stream's three convolutions (8/4, 4/2,
3/1 as in ``small``; ``16,32,32`` is ``small`` itself, ``32,64,64`` the widths of the Nature DQN),
each initialised with seed 0, and attacked in exact mode at the defaults. Printed and written: per
network and sample, RGB (Y channel; S1) and depth PSNR over the constant baseline (raw), and the
attack's seconds (S2 tells what a wider default would cost the S2 speed line).

    .venv/bin/python analysis/width_probe.py --samples 8 --widths 16,32,32 --widths 32,64,64 \\
        --out runs/width-probe.json

The widened networks reach the attack's workers as a user's own class would
(``--model-class width_probe:W32_64_64``, this module's :func:`__getattr__`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.experiments.attack_pool import Job, run_jobs
from leaklab.experiments.room_attack import RoomRunConfig
from leaklab.rl.envs.layouts import layouts_arg
from leaklab.models import PerceptionSpec
from leaklab.models.perception import (SMALL_WIDTHS, ModalityStreams, PerceptionNet, build_perception_net,
                                       three_conv_stream)
from leaklab.metrics.image import psnr
from leaklab.metrics.rooms import paper_scale
from leaklab.rl.capture import collect_transitions, dqn_client_update, target_copy

from start_spread import gains  # analysis/, beside this script

def widened(widths: tuple[int, int, int], rgb_only: bool = False) -> type[PerceptionNet]:
    """``small`` (box branch and head as built-in) with each stream's convolutions ``widths`` wide (with
    ``rgb_only``, the RGB stream's alone: the depth stream, and so an S2 network, stays ``small``'s)."""

    def stream(channels: int) -> nn.Sequential:
        wide = not rgb_only or channels == 3
        return three_conv_stream(channels, widths=widths if wide else SMALL_WIDTHS)

    class Widened(PerceptionNet):
        def __init__(self, spec: PerceptionSpec):
            super().__init__(spec)
            self.conv = ModalityStreams(spec.setting, stream)
            with torch.no_grad():
                count = self.conv(torch.zeros(1, spec.in_channels, spec.image_size, spec.image_size)).shape[1]
            self.conv_features = count
            self.head = nn.Sequential(nn.Linear(count + 32, 256), nn.ReLU(), nn.Linear(256, spec.num_actions))

    Widened.__name__ = class_name(widths, rgb_only)
    return Widened


def class_name(widths: tuple[int, int, int], rgb_only: bool = False) -> str:
    return ("R" if rgb_only else "W") + "_".join(map(str, widths))


def __getattr__(name: str) -> type[PerceptionNet]:
    """``W32_64_64`` and the like (``R…``: the RGB stream alone widened): the widened network class, for
    ``model_class`` strings."""
    if name[:1] in "WR" and name[1:].replace("_", "").isdigit() and name.count("_") == 2:
        return widened(tuple(int(w) for w in name[1:].split("_")), rgb_only=name[0] == "R")
    raise AttributeError(name)


def _gains_text(row: dict) -> str:
    return ", ".join(f"{name} {row[key]:+.2f} dB" for key, name in (("rgb", "RGB"), ("depth", "depth"))
                     if key in row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--setting", choices=("S1", "S2"), default="S1")
    parser.add_argument("--widths", action="append", required=True, help="three widths, e.g. 32,64,64")
    parser.add_argument("--rgb-only", action="store_true", help="widen the RGB stream alone (depth stays small)")
    parser.add_argument("--mode", choices=("exact", "paper"), default="exact")
    parser.add_argument("--iterations", type=int, help="image-stage iterations (default: the mode's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    nets = [tuple(int(w) for w in text.split(",")) for text in args.widths]
    if any(len(w) != 3 or min(w) < 1 for w in nets):
        parser.error("--widths takes three positive integers, e.g. 32,64,64")
    # the spawned workers import this module by name
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                             os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(Path(__file__).parent))
    config = RoomRunConfig(algorithm="qgi", setting=args.setting, samples=args.samples, layouts=layouts_arg("12"))
    spec = config.spec
    transitions = collect_transitions(config.layouts, args.samples, spec, seed=config.seed, gamma=config.gamma)
    jobs, truths = [], []
    attack = RoomAttackConfig(mode=args.mode, **({"iterations": args.iterations} if args.iterations else {}))
    for widths in nets:
        model_class = None if widths == SMALL_WIDTHS else f"width_probe:{class_name(widths, args.rgb_only)}"
        net = build_perception_net(spec, seed=config.seed, model_class=model_class)
        target = target_copy(net)
        state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        for i, transition in enumerate(transitions):
            update, truth = dqn_client_update(net, target, [transition], config.gamma)
            jobs.append(Job("qgi", spec, state, update, attack, model_class=model_class))
            truths.append((widths, i, truth["images"]))
    rows: list[dict] = []

    def on_result(i: int, rec) -> None:
        widths, sample, truth = truths[i]
        paper = {} if truth.shape[1] != 4 else {  # Table I's RGB PSNR: the paper's normalisation, not raw
            "rgb_paper_psnr": float(psnr(paper_scale(rec.images, "S1")[:, :3], truth[:, :3], "y"))}
        rows.append({"widths": list(widths), "sample": sample, **gains(rec.images, truth), **paper,
                     "seconds": rec.seconds})
        r = rows[-1]
        print(f"{widths} sample {sample}: {_gains_text(r)} over the baseline ({r['seconds']:.0f} s)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=1))

    run_jobs(jobs, args.workers, on_result)
    summary = []
    for widths in nets:
        mine = [r for r in rows if tuple(r["widths"]) == widths]
        summary.append({"widths": list(widths), **{k: statistics.fmean(r[k] for r in mine)
                                                   for k in ("rgb", "depth", "rgb_paper_psnr", "seconds")
                                                   if k in mine[0]}})
        print(f"{widths}: {_gains_text(summary[-1])} over the baseline, {summary[-1]['seconds']:.1f} s per "
              f"sample ({len(mine)} samples)")
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
