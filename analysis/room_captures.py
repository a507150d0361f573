"""The command line and the captures that the behind-noise probes share (``box_behind_noise.py``,
``action_behind_noise.py``, ``images_behind_noise.py``): ``--samples`` updates captured as ``leaklab attack``
captures them (same seed), and the defense chains to put them behind."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from leaklab.experiments import room_attack
from leaklab.rl.envs.layouts import layouts_arg


def indices(text: str) -> set[int]:
    """``--only``'s comma-separated indices."""
    return {int(i) for i in text.split(",")}


def captures(description: str, algorithms: tuple[str, ...], defenses: str,
             options: Callable[[argparse.ArgumentParser], None] | None = None
             ) -> tuple[argparse.Namespace, room_attack.RoomRunConfig, dict, list[room_attack.Sample]]:
    """Parse ``--algorithm`` (one of ``algorithms``), ``--setting``, ``--arch``, ``--samples``, ``--layouts``,
    ``--batch-size``, ``--defenses`` (``;``-separated chains, default ``defenses``), ``--only`` (the indices of the
    captured updates to keep) and what ``options`` adds to the parser; capture the updates."""
    parser = argparse.ArgumentParser(description=description)
    if options:
        options(parser)
    parser.add_argument("--algorithm", default=algorithms[0], choices=algorithms)
    parser.add_argument("--setting", default="S2", choices=("S1", "S2"))
    parser.add_argument("--arch", default="small")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--layouts", default="12")
    parser.add_argument("--defenses", default=defenses)
    parser.add_argument("--batch-size", type=int, default=1, choices=(1, 2))
    parser.add_argument("--only", type=indices, default=None,
                        help="comma-separated sample indices to keep (default: all)")
    args = parser.parse_args()
    keep = set(range(args.samples)) if args.only is None else args.only
    if not keep <= set(range(args.samples)):
        parser.error(f"--only: the captured updates are 0 to {args.samples - 1}")
    config = room_attack.RoomRunConfig(algorithm=args.algorithm, setting=args.setting, arch=args.arch,
                                       samples=args.samples, layouts=layouts_arg(args.layouts),
                                       batch_size=args.batch_size)
    state, samples = room_attack.capture_samples(config)
    return args, config, state, [s for s in samples if s.index in keep]
