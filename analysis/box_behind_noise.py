"""The target's box behind noise: ``box.0``'s closed form against exact mode's box (``exact_vectors``: on a
defended update the box fitted to every Linear layer it feeds, ``leaklab.attacks.rl.box_fit``).

Captures ``--samples`` updates as ``leaklab attack qgi|rgi`` does (same seed), puts each behind every
defense chain of ``--defenses`` (``;``-separated; ``none`` for the update as it is) with the audit's draws,
and prints per chain the mean box IoU by the results' rule (a target out of view counts only when the
recovered box is within 1e-3 of its empty box), over all updates and over those whose target is in view,
and the most seconds ``exact_vectors`` took (docs/reproductions.md, "The box behind noise").

    .venv/bin/python analysis/box_behind_noise.py --algorithm rgi --setting S2 --samples 48 --arch small \\
        --defenses "none;gaussian:0.001;gaussian:0.03;clip:1,gaussian:0.600229"
"""

from __future__ import annotations

import json
import statistics
import time

from leaklab.attacks.inversion.analytic import linear_input
from leaklab.attacks.rl.exact import exact_vectors
from leaklab.metrics.rooms import _box_scores
from leaklab.rl.capture import defended
from leaklab.threat import make_view

from room_captures import captures


def main() -> None:
    args, config, state, samples = captures(__doc__.splitlines()[0], ("qgi", "rgi"),
                                            "none;gaussian:0.001;gaussian:0.01;gaussian:0.03")
    for chain in args.defenses.split(";"):
        rows = []
        for sample in samples:
            update = defended(sample.update, None if chain == "none" else chain, config.seed, sample.index)
            net = make_view(config.spec, state, update.metadata).model
            grads = {k: v.detach().float() for k, v in update.tensors.items()}
            truth = sample.truth["box"].double().reshape(-1)
            start = time.perf_counter()
            box = exact_vectors(net, grads).box[0]
            seconds = time.perf_counter() - start
            closed = linear_input(grads["box.0.weight"], grads["box.0.bias"])
            rows.append({"in_view": bool((truth[2:] > truth[:2]).all()), "seconds": seconds,
                         "closed": _box_scores(closed, truth)["box_iou"], "exact": _box_scores(box, truth)["box_iou"]})
        seen = [r for r in rows if r["in_view"]]
        mean = lambda rs, key: statistics.mean(r[key] for r in rs) if rs else float("nan")  # noqa: E731
        print(json.dumps({"algorithm": args.algorithm, "setting": args.setting, "arch": args.arch, "defense": chain,
                          "updates": len(rows), "in_view": len(seen),
                          "closed_iou": round(mean(rows, "closed"), 4), "exact_iou": round(mean(rows, "exact"), 4),
                          "closed_iou_in_view": round(mean(seen, "closed"), 4),
                          "exact_iou_in_view": round(mean(seen, "exact"), 4),
                          "seconds_max": round(max(r["seconds"] for r in rows), 3)}), flush=True)


if __name__ == "__main__":
    main()
