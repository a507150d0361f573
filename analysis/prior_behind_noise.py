"""Exact mode's image prior behind noise: the TV floor matched to the features' noise ratio (exact method
version 10, ``exact.tv_schedule``) against the configured decay to ``tv_final`` (version 9).

Captures ``--samples`` updates as ``leaklab attack qgi|rgi`` does (same seed), puts each behind every defense
chain of ``--defenses`` with the audit's draws, and attacks each in exact mode twice: as landed, and with the
floor held at ``tv_final`` (``TV_NOISE_CAP`` patched in this process only). Prints per update the noise ratio
read off the update (``feature_noise``) and the true one, and the largest image gain over the constant
baseline (paper normalisation, as the audit's verdicts) of each; then per chain the mean gains, how many
updates show their room (a gain of 3 dB or more) and the largest loss and gain of the matched prior
(docs/reproductions.md, "The images' prior behind noise").

    .venv/bin/python analysis/prior_behind_noise.py --algorithm qgi --setting S1 --arch wide-rgb --samples 8 \\
        --defenses "gaussian:0.001;gaussian:0.01;gaussian:0.03"
"""

from __future__ import annotations

import json
import statistics

import torch

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.attacks.rl import exact as exact_module
from leaklab.experiments import room_attack
from leaklab.experiments.attack_pool import _attack_one
from leaklab.experiments.room_verdicts import image_gains
from leaklab.rl.capture import defended
from leaklab.threat import make_view

from room_captures import captures

SHOWN_DB = 3.0  # the audit's rule: an image this far over its constant baseline shows the room


def _gain(config: room_attack.RoomRunConfig, state: dict, sample: room_attack.Sample, chain: str) -> float:
    job = room_attack.attack_job(config.model_copy(update={"attack": RoomAttackConfig()}), state, sample, chain)
    metrics = room_attack.score(sample, _attack_one(job), config.setting)["metrics"]
    return max(image_gains({"metrics": metrics}))[0]


def main() -> None:
    args, config, state, samples = captures(__doc__.splitlines()[0], ("qgi", "rgi"),
                                            "gaussian:0.001;gaussian:0.01;gaussian:0.03")
    cap = exact_module.TV_NOISE_CAP
    for chain in args.defenses.split(";"):
        rows = []
        for sample in samples:
            update = defended(sample.update, chain, config.seed, sample.index)
            net = make_view(config.spec, state, update.metadata).model
            st = exact_module.exact_vectors(net, {k: v.detach().float() for k, v in update.tensors.items()})
            with torch.no_grad():
                features = net.conv(sample.truth["images"][:1].float()).double()
            row = {"defense": chain, "sample": sample.index, "noise_ratio": st.feature_noise,
                   "true_ratio": float((st.features - features).norm() / features.norm())}
            row["matched_gain_db"] = _gain(config, state, sample, chain)
            exact_module.TV_NOISE_CAP = 0.0  # the floor stays tv_final
            try:
                row["configured_gain_db"] = _gain(config, state, sample, chain)
            finally:
                exact_module.TV_NOISE_CAP = cap
            rows.append(row)
            print(json.dumps(row), flush=True)
        change = [r["matched_gain_db"] - r["configured_gain_db"] for r in rows]
        print(json.dumps({"algorithm": args.algorithm, "setting": args.setting, "arch": args.arch, "defense": chain,
                          "updates": len(rows),
                          **{f"{k}_mean": round(statistics.mean(r[f"{k}_gain_db"] for r in rows), 2)
                             for k in ("configured", "matched")},
                          **{f"{k}_shown": sum(r[f"{k}_gain_db"] >= SHOWN_DB for r in rows)
                             for k in ("configured", "matched")},
                          "largest_loss_db": round(min(change), 2), "largest_gain_db": round(max(change), 2)}),
              flush=True)


if __name__ == "__main__":
    main()
