"""Paper mode's images at other weights of the TV prior than section V's λ = 0.1.

Captures ``--samples`` updates as ``leaklab attack qgi|rgi`` does (same seed) and attacks each, undefended, in
paper mode once per weight of ``--weights``; prints per update and weight the PSNR of every image (the paper's
normalisation) and then each weight's means (docs/reproductions.md, "Table I, paper mode": what the prior's
weight does to the RGI S2 gap).

    .venv/bin/python analysis/paper_prior_weight.py --algorithm rgi --setting S2 --samples 4 \\
        --weights 0,0.001,0.003,0.01,0.03,0.1
"""

from __future__ import annotations

import argparse
import json
import statistics

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.experiments import room_attack
from leaklab.experiments.attack_pool import _attack_one
from leaklab.rl.envs.layouts import layouts_arg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="rgi", choices=("qgi", "rgi"))
    parser.add_argument("--setting", default="S2", choices=("S1", "S2"))
    parser.add_argument("--arch", default="small")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--layouts", default="12")
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--weights", default="0,0.001,0.003,0.01,0.03,0.1")
    args = parser.parse_args()
    config = room_attack.RoomRunConfig(algorithm=args.algorithm, setting=args.setting, arch=args.arch,
                                       samples=args.samples, layouts=layouts_arg(args.layouts))
    state, samples = room_attack.capture_samples(config)
    scores: dict[float, list[dict[str, float]]] = {}
    for weight in (float(w) for w in args.weights.split(",")):
        attack = RoomAttackConfig(mode="paper", iterations=args.iterations, tv_weight=weight)
        weighted = config.model_copy(update={"attack": attack})
        for sample in samples:
            metrics = room_attack.score(sample, _attack_one(room_attack.attack_job(weighted, state, sample, None)),
                                        config.setting)["metrics"]
            row = {k: round(v, 2) for k, v in metrics.items() if k.endswith("_paper_psnr")}
            scores.setdefault(weight, []).append(row)
            print(json.dumps({"tv_weight": weight, "sample": sample.index, **row}), flush=True)
    for weight, rows in scores.items():
        print(json.dumps({"tv_weight": weight, "updates": len(rows),
                          **{f"{k}_mean": round(statistics.mean(r[k] for r in rows), 2) for k in rows[0]}}),
              flush=True)


if __name__ == "__main__":
    main()
