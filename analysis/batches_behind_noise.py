"""Exact mode on batches of two behind noise: whether the update's samples separate, and what they leak.

Captures ``--samples`` updates of ``--batch-size`` transitions (default 2) as ``leaklab attack qgi|rgi --batch-size
2`` does (same seed), puts each behind every defense chain of ``--defenses`` with the audit's draws and attacks it as
the command would (exact mode, falling back to the paper's optimisation where exact mode cannot read the update;
``--mode paper``: the paper's method on every update, QGI only). Prints per update whether exact mode read it in
closed form (``exact``), whether it read one sample alone (``alone``; a blend of the two where not ``exact``,
``leaklab.attacks.rl.exact.blended``), whether the attack read nothing (``no_signal``), the features' estimated cosine
and their true one (the mean cosine of the features exact mode separates with the samples'), the largest image gain
over the constant baseline of the update's best transition (paper normalisation, as the audit's verdicts:
``…_gain_max``; until session 52 the mean over its samples), the box IoU and the action's accuracy, the means over its
samples, and each true sample's gain and box IoU (``sample_gains_db``, ``sample_box_iou``, RGI's
``sample_reward_error``); then per chain how many updates exact mode read, how many read nothing and the means
(docs/reproductions.md, "A batch of two behind noise"). ``--iterations 2`` skips the image stage's work for the closed
forms alone (the image columns are then the start's).

    .venv/bin/python analysis/batches_behind_noise.py --algorithm rgi --samples 6 --layouts 6 \\
        --defenses "gaussian:0.00001;gaussian:0.0001;gaussian:0.001;gaussian:0.01"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.attacks.rl.exact import reinforce_batch_errors, separated_vectors
from leaklab.attacks.rl.same_action import exact_dqn_errors
from leaklab.experiments import room_attack
from leaklab.experiments.attack_pool import _attack_one
from leaklab.experiments.room_verdicts import image_gains
from leaklab.metrics.rooms import transition_metrics
from leaklab.rl.capture import defended
from leaklab.threat import make_view

from room_captures import captures

SHOWN_DB = 3.0  # the audit's rule: an image this far over its constant baseline shows the room


def _true_cosine(config: room_attack.RoomRunConfig, state: dict, sample: room_attack.Sample, chain: str
                 ) -> float | None:
    """The mean cosine of the conv features exact mode separates off the defended update with the true
    samples' (each matched to the true sample it is closest to); None where it does not separate them."""
    update = defended(sample.update, chain, config.seed, sample.index)
    net = make_view(config.spec, state, update.metadata).model
    grads = {k: v.detach().float() for k, v in update.tensors.items()}
    hidden = None
    if config.algorithm == "qgi":
        _, deltas, hidden = exact_dqn_errors(net, grads, len(sample.truth["action"]))
    else:
        deltas = reinforce_batch_errors(net, grads)
    st = None if deltas is None else separated_vectors(net, grads, deltas, hidden)
    if st is None:
        return None
    with torch.no_grad():
        true = net.conv(sample.truth["images"].float()).double()
    return float(F.cosine_similarity(st.features[:, None], true[None], dim=-1).max(1).values.mean())


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", default="exact", choices=("exact", "paper"))
    parser.add_argument("--iterations", type=int, default=None,
                        help="image-stage steps (default the attack's; 2 reads the closed forms alone)")


def main() -> None:
    if "--batch-size" not in sys.argv:
        sys.argv += ["--batch-size", "2"]
    args, config, state, samples = captures(
        __doc__.splitlines()[0], ("qgi", "rgi"), "gaussian:0.00001;gaussian:0.0001;gaussian:0.001;gaussian:0.01",
        _options)
    attack = RoomAttackConfig(mode=args.mode, **({} if args.iterations is None else {"iterations": args.iterations}))
    config = config.model_copy(update={"attack": attack})
    for chain in args.defenses.split(";"):
        rows = []
        for sample in samples:
            rec = _attack_one(room_attack.attack_job(config, state, sample, chain))
            metrics = room_attack.score(sample, rec, config.setting)["metrics"]
            each = [m for _, m in transition_metrics(rec, sample.truth, config.setting)]
            rows.append({"defense": chain, "sample": sample.index, "exact": "features" in rec.exact,
                         "alone": rec.read is not None and not rec.no_signal, "no_signal": rec.no_signal,
                         "feature_cosine": rec.feature_cosine,
                         "true_feature_cosine": _true_cosine(config, state, sample, chain),
                         "gain_db": round(max(image_gains({"metrics": metrics}))[0], 2),
                         "box_iou": round(metrics["box_iou"], 4), "action": metrics["action"],
                         "sample_gains_db": [round(max(image_gains({"metrics": m}))[0], 2) for m in each],
                         "sample_box_iou": [round(m["box_iou"], 4) for m in each],
                         "sample_reward_error": [round(m["reward_error"], 4) for m in each if "reward_error" in m]})
            print(json.dumps(rows[-1]), flush=True)
        print(json.dumps({"algorithm": args.algorithm, "setting": args.setting, "arch": args.arch, "defense": chain,
                          "updates": len(rows), "exact": sum(r["exact"] for r in rows),
                          "alone": sum(r["alone"] for r in rows),
                          "blends": sum(r["alone"] and not r["exact"] for r in rows),
                          "no_signal": sum(r["no_signal"] for r in rows),
                          "shown": sum(r["gain_db"] >= SHOWN_DB for r in rows),
                          **{f"{k}_mean": round(statistics.mean(r[k] for r in rows), 3)
                             for k in ("gain_db", "box_iou", "action")}}), flush=True)


if __name__ == "__main__":
    main()
