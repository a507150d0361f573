"""Exact mode's images behind noise, as landed against one of its parts undone.

``--against unscaled-prior`` (exact method version 12 against 11) attacks with the TV floor at the features'
noise ratio instead of that ratio times the image's pixels per conv feature (``exact.tv_schedule``);
``--against raw-features`` (version 11 against 10 when run at 31c46ed) with the conv features as the closed
form reads them, shrunk by the noise on ``head.0``'s bias gradient, instead of corrected
(``exact.noised_features``); ``--against configured-prior`` (version 10 against 9 when run at 0331cf7) with
the TV floor held at ``tv_final`` instead of matched to the features' noise ratio.

Captures ``--samples`` updates as ``leaklab attack qgi|rgi`` does (same seed), puts each behind every defense
chain of ``--defenses`` with the audit's draws, and attacks each in exact mode twice, as landed and with the
part undone (patched in this process only). Prints per update the noise ratio read off the update and the
true one, and the largest image gain over the constant baseline (paper normalisation, as the audit's verdicts)
of each; then per chain the mean gains, how many updates show their room (a gain of 3 dB or more) and the
largest loss and gain of the landed attack (docs/reproductions.md, "The images' prior behind noise", "The
features' scale behind noise" and "The prior's weight per pixel behind noise").

    .venv/bin/python analysis/images_behind_noise.py --algorithm qgi --setting S1 --arch wide-rgb --samples 8 \\
        --defenses "gaussian:0.001;gaussian:0.01;gaussian:0.03"
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

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


@contextmanager
def _raw_features() -> Iterator[None]:
    """The features as ``head.0``'s closed form reads them, with the ratio ``noised_features`` reads."""
    corrected = exact_module.noised_features

    def raw(weight_grad, bias_grad, inputs, count):
        return inputs[:count].double(), corrected(weight_grad, bias_grad, inputs, count)[1]

    exact_module.noised_features = raw
    try:
        yield
    finally:
        exact_module.noised_features = corrected


@contextmanager
def _unscaled_prior() -> Iterator[None]:
    """The TV floor at the features' noise ratio, as for one pixel per feature."""
    scaled = exact_module.tv_schedule
    exact_module.tv_schedule = lambda cfg, noise, pixels_per_feature: scaled(cfg, noise, 1.0)
    try:
        yield
    finally:
        exact_module.tv_schedule = scaled


@contextmanager
def _configured_prior() -> Iterator[None]:
    """The TV floor held at ``tv_final``."""
    cap = exact_module.TV_NOISE_CAP
    exact_module.TV_NOISE_CAP = 0.0
    try:
        yield
    finally:
        exact_module.TV_NOISE_CAP = cap


# what --against undoes
UNDONE: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "unscaled-prior": _unscaled_prior, "raw-features": _raw_features, "configured-prior": _configured_prior}


def _gain(config: room_attack.RoomRunConfig, state: dict, sample: room_attack.Sample, chain: str) -> float:
    job = room_attack.attack_job(config.model_copy(update={"attack": RoomAttackConfig()}), state, sample, chain)
    metrics = room_attack.score(sample, _attack_one(job), config.setting)["metrics"]
    return max(image_gains({"metrics": metrics}))[0]


def main() -> None:
    args, config, state, samples = captures(
        __doc__.splitlines()[0], ("qgi", "rgi"), "gaussian:0.001;gaussian:0.01;gaussian:0.03",
        lambda parser: parser.add_argument("--against", default="unscaled-prior", choices=tuple(UNDONE)))
    against = args.against
    for chain in args.defenses.split(";"):
        rows = []
        for sample in samples:
            update = defended(sample.update, chain, config.seed, sample.index)
            net = make_view(config.spec, state, update.metadata).model
            st = exact_module.exact_vectors(net, {k: v.detach().float() for k, v in update.tensors.items()})
            with torch.no_grad():
                features = net.conv(sample.truth["images"][:1].float()).double()
            row = {"defense": chain, "sample": sample.index, "noise_ratio": st.feature_noise[0],
                   "true_ratio": float((st.features - features).norm() / features.norm()),
                   "landed_gain_db": _gain(config, state, sample, chain)}
            with UNDONE[against]():
                row[f"{against}_gain_db"] = _gain(config, state, sample, chain)
            rows.append(row)
            print(json.dumps(row), flush=True)
        change = [r["landed_gain_db"] - r[f"{against}_gain_db"] for r in rows]
        print(json.dumps({"algorithm": args.algorithm, "setting": args.setting, "arch": args.arch, "defense": chain,
                          "updates": len(rows),
                          **{f"{k}_mean": round(statistics.mean(r[f"{k}_gain_db"] for r in rows), 2)
                             for k in (against, "landed")},
                          **{f"{k}_shown": sum(r[f"{k}_gain_db"] >= SHOWN_DB for r in rows)
                             for k in (against, "landed")},
                          "largest_loss_db": round(min(change), 2), "largest_gain_db": round(max(change), 2)}),
              flush=True)


if __name__ == "__main__":
    main()
