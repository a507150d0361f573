"""How well exact mode's estimate of the features it reads behind a defense matches the truth.

Captures ``--samples`` updates as ``leaklab attack qgi|rgi`` does (same seed), puts each behind every defense
chain of ``--defenses`` with the audit's draws, reads the conv features off it in closed form
(``exact.exact_vectors``) and prints, per chain, the server's estimate of their cosine with the client's
(``exact.feature_cosine``, from the update alone) beside the true cosine; then over every update the largest
miss where the true cosine is 0.1 or more and the largest overestimate where it is less (docs/reproductions.md,
"What an update lets through of the features").

    .venv/bin/python analysis/features_read.py --algorithm rgi --setting S1 --arch wide-rgb --samples 8
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from leaklab.attacks.rl import exact as exact_module
from leaklab.errors import NoSignal
from leaklab.experiments.room_audit import dpsgd_defense
from leaklab.rl.capture import defended
from leaklab.threat import make_view

from room_captures import captures

DEFENSES = ";".join(["gaussian:0.001", "gaussian:0.01", "gaussian:0.03", "gaussian:0.1", dpsgd_defense(8),
                     "laplace:0.01", "prune:0.5", "topk:0.1"])


def main() -> None:
    args, config, state, samples = captures(__doc__.splitlines()[0], ("qgi", "rgi"), DEFENSES)
    pairs = []
    for chain in args.defenses.split(";"):
        row = {"defense": chain, "estimated": [], "true": []}
        for sample in samples:
            update = defended(sample.update, chain, config.seed, sample.index)
            net = make_view(config.spec, state, update.metadata).model
            try:
                st = exact_module.exact_vectors(net, {k: v.detach().float() for k, v in update.tensors.items()})
            except NoSignal:  # no bias gradient left to read the features by
                row["estimated"].append(None)
                row["true"].append(None)
                continue
            with torch.no_grad():
                features = net.conv(sample.truth["images"][:1].float()).double()
            estimated = st.cosine()
            true = float(F.cosine_similarity(st.features.double(), features))
            row["estimated"].append(round(estimated, 3))
            row["true"].append(round(true, 3))
            pairs.append((estimated, true))
        print(json.dumps(row), flush=True)
    readable = [abs(e - t) for e, t in pairs if t >= 0.1]
    lost = [e - t for e, t in pairs if t < 0.1]
    print(json.dumps({"algorithm": args.algorithm, "setting": args.setting, "arch": args.arch,
                      "updates": len(pairs), "readable": len(readable),
                      "largest_miss_readable": round(max(readable, default=0.0), 3), "lost": len(lost),
                      "largest_overestimate_lost": round(max(lost, default=0.0), 3)}), flush=True)


if __name__ == "__main__":
    main()
