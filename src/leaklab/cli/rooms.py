"""Commands on robots' federated RL updates (seed 000): ``leaklab attack qgi|rgi``, ``leaklab env`` and
the main job, ``leaklab audit``.
"""

from __future__ import annotations

import re
import shlex
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from leaklab.cli.app import ATTACKS_KEPT, _guard, app, attack_app, env_app
from leaklab.cli.options import (OutOpt, QuickOpt, SeedOpt, _checked, _choice, _defense_chain, _layouts,
                                 _positive_numbers, _run_out, _seed_opt)
from leaklab.cli.progress import _progress, _resumed
from leaklab.errors import LeaklabError
from leaklab.names import (ARCH_NAMES, AUDIT_KIND_NAMES, DEFAULT_ARCH, DEVICE_PATTERN, POLICY_NAMES,
                           MAX_TRAIN_STEPS, RL_ALGORITHM_NAMES, ROOM_MODE_NAMES, SETTING_NAMES)
from leaklab.words import cosine_text, plural


SettingOpt = Annotated[str, _choice("--setting", SETTING_NAMES, "(S1: RGB + depth + box; S2: depth + box)")]
BOTH_MODES = "both"  # audit --mode: every update attacked in exact and in paper mode
ModeOpt = Annotated[str, _choice("--mode", ROOM_MODE_NAMES, "(exact: leaklab's closed-form recovery, then the "
                                 "images; paper: section IV as written)")]
ArchOpt = Annotated[str, _choice("--arch", ARCH_NAMES, "(the perception network: a conv stream per modality: "
                                 "small, nature at the Nature DQN's widths, wide-rgb: small with its RGB stream "
                                 "64 wide, deep with pooling; stacked: RGB-D in one)")]


def _workers_option(default_words: str) -> typer.models.OptionInfo:
    return typer.Option("--workers", help=f"attack processes ({default_words})",
                        callback=_checked("--workers", lambda v: v >= 0, "0 (one per core) or more"))


WorkersOpt = Annotated[int, _workers_option("0: one per core")]
AuditWorkersOpt = Annotated[int, _workers_option("0: one per core; with --quick, one")]
SamplesOpt = Annotated[int, typer.Option("--samples", help="client updates, each of --batch-size private "
                                                             "transitions")]
LayoutsOpt = Annotated[Optional[str], typer.Option("--layouts", help="client rooms: a count (the first N) "
                                                   "or comma-separated names (default all)",
                                                   callback=_layouts)]
IterationsOpt = Annotated[Optional[int], typer.Option("--iterations", help="image-stage iterations "
                                                      "(default 2000; exact mode's layerwise stage needs "
                                                      "1000, its images are poor under 500)")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda[:N]: where the attacks run "
                                         "(on cuda the worker processes share the GPU)",
                                         callback=_checked("--device", lambda v: re.fullmatch(DEVICE_PATTERN, v),
                                                           "choose cpu or cuda[:N]"))]
TrainStepsOpt = Annotated[int, typer.Option("--train-steps", help="environment steps of training before the "
                                             "round (0: initialised network)",
                                             callback=_checked("--train-steps", lambda v: 0 <= v <= MAX_TRAIN_STEPS,
                                                               f"a whole number from 0 to {MAX_TRAIN_STEPS:,}"))]
RoomDefenseOpt = Annotated[Optional[str], typer.Option("--defense", help="defense chain the clients apply, "
                                                       "e.g. clip:1,gaussian:0.5 (default none)",
                                                       callback=_defense_chain)]


def _room_attack(algorithm: str, setting: str, mode: str, arch: str, samples: int, layouts: str | None,
                 seed: int, iterations: int | None, batch_size: int, train_steps: int, defense: str | None,
                 workers: int, device: str, layerwise: bool, out: Path) -> None:
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.device import require_device
    from leaklab.experiments import room_attack, room_report
    from leaklab.rl.envs.layouts import layouts_arg

    require_device(device)  # before the configs: one plain line for a bad name
    attack = RoomAttackConfig(mode=mode, seed=seed, layerwise=layerwise,
                              **({"iterations": iterations} if iterations is not None else {}))
    config = room_attack.RoomRunConfig(algorithm=algorithm, setting=setting, arch=arch, samples=samples,
                                       layouts=layouts_arg(layouts), batch_size=batch_size,
                                       train_steps=train_steps, defense=defense, attack=attack,
                                       workers=workers, device=device, seed=seed)
    with _progress() as progress:
        results = room_attack.run(config, out, progress=progress)
    s = results["summary"]
    typer.echo(f"wrote {out}: " + _room_summary_line(s, defended=config.defense is not None) + "; "
               + (plural(s["samples"], "sample") if s["transitions"] == s["samples"] else
                  f"{plural(s['samples'], 'update')} of {plural(s['transitions'], 'transition')} in all")
               + f" from {plural(s['layouts'], 'room')}, {s['seconds_per_sample']:.1f} s each"
               + _resumed(s["resumed_samples"], " ({} resumed from an interrupted run)"))
    for notice in (room_report.no_signal_caveat(results["samples"], noun="sample", key="index"),
                   room_report.unread_images_caveat(results["samples"]),
                   room_report.effort_notice(attack.iterations)):  # as asked: an update with nothing to read runs none
        if notice:
            typer.echo(f"warning: {notice}", err=True)


def _percent(value: float | None) -> str:
    return "none" if value is None else f"{value:.3g}%"


def _left_out(undefined: int) -> str:
    """What an error's mean leaves out: the transitions the attack did not read or, for a Q error, whose true
    value is 0 (no % error)."""
    return f" ({plural(undefined, 'transition')} without one left out)" if undefined else ""


def _room_summary_line(s: dict[str, Any], defended: bool, cases: list[dict[str, Any]] | None = None) -> str:
    """What a room-attack summary says leaked: the images against their baselines, box, action, and
    the Q-value or reward errors (``defended``: of updates behind a defense). ``cases``: the rows of an audit of
    saved cases, whose action counts those whose update holds it and whose cosine kept the defended ones, as its
    report's (over them all, one defended case dropped RGI's qualifier for every case and undefended ones' 1s
    joined the median)."""
    from leaklab.experiments import room_attack, room_report

    parts = []
    for image in ("rgb", "depth"):
        if s.get(f"{image}_psnr_mean") is not None:
            parts.append(f"{image} PSNR {s[f'{image}_psnr_mean']:.2f} dB (baseline "
                         f"{s[f'{image}_psnr_baseline_mean']:.2f}), SSIM {s[f'{image}_ssim_mean']:.3f} (baseline "
                         f"{s[f'{image}_ssim_baseline_mean']:.3f})")
    if cases is None:
        action = room_attack.action_share(s, defended)
    else:
        held = room_report.held_actions(cases)
        action = (f"{100 * sum(held) / len(held):.0f}% of {plural(len(held), 'case')} whose update holds it" if held
                  else "none held")
    parts.append(f"box IoU {s['iou_mean']:.4f}, action {action}")
    if "q_target_error_undefined" in s:  # QGI
        parts.append(", ".join(f"{name} error {_percent(s.get(f'{key}_err_mean'))}"
                               f"{_left_out(s[f'{key}_error_undefined'])}"
                               for name, key in (("predicted-Q", "q_pred"), ("target-Q", "q_target"))))
    if "reward_error_undefined" in s:  # RGI
        mean = s.get("reward_abs_err_mean")
        parts.append(f"reward error {'none' if mean is None else f'{mean:.3g}'}"
                     f"{_left_out(s['reward_error_undefined'])}")
    kept = s.get("update_cosine_median") if cases is None else room_report.defended_kept(cases)
    if defended and kept is not None:  # absent where no saved truth records it
        parts.append(f"update kept (cosine with the true one) {cosine_text(kept)}")
    if defended and s.get("feature_cosine_median") is not None:  # read off the updates alone
        parts.append(f"features read (cosine, estimated) {cosine_text(s['feature_cosine_median'])}")
    return "; ".join(parts)


def _room_command(algorithm: str, doc: str) -> Callable:
    def command(
        out: OutOpt,
        setting: SettingOpt = "S2", mode: ModeOpt = "exact", arch: ArchOpt = DEFAULT_ARCH,
        samples: SamplesOpt = 4, layouts: LayoutsOpt = None,
        seed: Annotated[int, _seed_opt("network, rooms, defense noise and attack seed")] = 0,
        iterations: IterationsOpt = None,
        batch_size: Annotated[int, typer.Option("--batch-size", help="transitions per update (1 or 2; "
                                                                   "RGI reads 2 in exact mode)")] = 1,
        train_steps: TrainStepsOpt = 0,
        defense: RoomDefenseOpt = None,
        workers: WorkersOpt = 0,
        device: DeviceOpt = "cpu",
        layerwise: Annotated[bool, typer.Option("--layerwise/--no-layerwise", help="exact mode: recover "
                                                "each conv stream's penultimate activations exactly and "
                                                "match them")] = True,
    ) -> None:
        _room_attack(algorithm, setting, mode, arch, samples, layouts, seed, iterations, batch_size,
                     train_steps, defense, workers, device, layerwise, out)

    command.__doc__ = doc
    return _guard(command, stopped=ATTACKS_KEPT)


attack_app.command("qgi")(_room_command(
    "qgi", "QGI: reconstruct a DQN client's room (images, box), action and target Q-value from its "
           "gradient (seed 000)."))
attack_app.command("rgi")(_room_command(
    "rgi", "RGI: reconstruct a REINFORCE client's room (images, box), action and reward from its "
           "gradient (seed 000)."))


@env_app.command("contact-sheet")
@_guard
def env_contact_sheet(
    out: Annotated[Path, typer.Option("--out", help="PNG file to write")] = Path("rooms.png"),
    layouts: LayoutsOpt = None,
    seed: Annotated[int, _seed_opt("start poses")] = 0,
) -> None:
    """Every room layout of the active-perception environment: RGB with the target box, and depth."""
    from leaklab.rl.envs.layouts import layouts_arg
    from leaklab.rl.envs.contact_sheet import contact_sheet

    path = contact_sheet(out, layouts_arg(layouts), seed=seed)
    typer.echo(f"wrote {path}")


@env_app.command("capture")
@_guard
def env_capture(
    out: Annotated[Path, typer.Option("--out", help="folder to write the room cases to")],
    algorithm: Annotated[str, _choice("--algorithm", RL_ALGORITHM_NAMES, "(what the clients train)")] = "dqn",
    setting: SettingOpt = "S2",
    arch: Annotated[Optional[str], _choice("--arch", ARCH_NAMES, "(leaklab's perception network; default "
                                           f"{DEFAULT_ARCH})")] = None,
    samples: Annotated[int, typer.Option("--samples", help="client updates, one case folder each")] = 4,
    layouts: LayoutsOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="transitions per update (the room attacks "
                                            "read 1 or 2)")] = 1,
    train_steps: TrainStepsOpt = 0,
    policy: Annotated[str, _choice("--policy", POLICY_NAMES, "(who acts in the private episodes; agent: "
                                   "epsilon-greedy on the network)")] = "random",
    entropy_weight: Annotated[Optional[float], typer.Option("--entropy-weight", help="alpha of eq. 4 "
                                                            "(REINFORCE clients; default 0.01)")] = None,
    defense: RoomDefenseOpt = None,
    model_class: Annotated[Optional[str], typer.Option("--model-class", help="your own perception network, "
                                                       "package.module:Class (default leaklab's --arch)")] = None,
    seed: Annotated[int, _seed_opt("network, rooms and defense noise")] = 0,
) -> None:
    """Capture robots' federated updates in their rooms as case folders for `leaklab audit --cases`.

    Each folder holds what the server sees of one round and, apart, the client's truth."""
    from leaklab.attacks.rl import max_batch
    from leaklab.experiments.attack_pool import task_progress
    from leaklab.models import PerceptionSpec
    from leaklab.rl.capture import RoomCaptureConfig, capture_rooms
    from leaklab.rl.envs.layouts import layouts_arg

    if arch is not None and model_class is not None:
        raise LeaklabError("--arch picks one of leaklab's networks, --model-class your own; give one of them")
    if entropy_weight is not None and algorithm != "reinforce":
        raise LeaklabError("--entropy-weight is the REINFORCE clients' alpha; add --algorithm reinforce")
    arch = arch or DEFAULT_ARCH
    spec = PerceptionSpec(setting=setting, arch=arch)
    config = RoomCaptureConfig(algorithm=algorithm, spec=spec, layouts=layouts_arg(layouts), samples=samples,
                               batch_size=batch_size, train_steps=train_steps, policy=policy,
                               defense=defense, model_class=model_class, seed=seed,
                               **({} if entropy_weight is None else {"entropy_weight": entropy_weight}))
    with _progress() as progress:
        folders = capture_rooms(config, out, task_progress(progress, f"capture {algorithm} {setting}",
                                                           samples * batch_size),
                                task_progress(progress, f"train {algorithm} {setting}", train_steps)
                                if train_steps else None)
    behind = f", behind {defense}" if config.defense else ""
    network, own = (model_class, f" --model-class {model_class}") if model_class else (f"{arch} network", "")
    readable = max_batch("dqn_mse" if algorithm == "dqn" else "reinforce", "exact")
    then = f"; attack them with `leaklab audit --cases {shlex.quote(str(out))}{own}`" if batch_size <= readable else ""
    typer.echo(f"wrote {out}: {plural(len(folders), algorithm + ' update')} of "
               f"{plural(batch_size, 'transition')}, {setting}, {network}{behind} (their states: "
               f"{out / 'capture.png'}){then}")
    if batch_size > readable:
        warnings.warn(f"leaklab's room attacks read updates of at most {readable} transitions (audit --cases "
                      f"refuses these {batch_size}); the cases are for attacks of your own", UserWarning,
                      stacklevel=2)


@app.command()
@_guard(stopped=ATTACKS_KEPT)
def audit(
    out: Annotated[Optional[Path], _run_out("audit")] = None,
    quick: QuickOpt = False,
    full: Annotated[bool, typer.Option("--full", help="the paper-scale protocol (48 samples from every "
                                       "room, S1 and S2, exact and paper mode; about 9 h on 2 cores)")] = False,
    cases: Annotated[Optional[Path], typer.Option("--cases", help="attack your own saved room cases "
                                                  "(folders as `leaklab env capture` writes them) instead")] = None,
    model_class: Annotated[Optional[str], typer.Option("--model-class", help="with --cases: your own "
                                                       "perception network, package.module:Class")] = None,
    mode: Annotated[Optional[str], _choice("--mode", (*ROOM_MODE_NAMES, BOTH_MODES), "(default exact; paper: "
                                           "stronger behind noise, four times as long or more; both: each update "
                                           "attacked in each mode and counted once, as --full does)")] = None,
    arch: Annotated[Optional[str], _choice("--arch", ARCH_NAMES, "(the robots' perception network; default "
                                           f"{DEFAULT_ARCH})")] = None,
    iterations: IterationsOpt = None,
    train_steps: TrainStepsOpt = 0,
    sigmas: Annotated[Optional[str], typer.Option(
        "--sigmas", callback=_positive_numbers("--sigmas", "1e-5,1e-3"), help="the Gaussian defense's noise std "
        "per gradient entry, one audited level each, comma-separated (default 1e-3,3e-2)")] = None,
    epsilons: Annotated[Optional[str], typer.Option(
        "--epsilons", callback=_positive_numbers("--epsilons", "8,1"), help="the DP-SGD defense's ε at δ = 1e-5 "
        "for one step (clip 1, calibrated noise), one audited level each (default 8,1)")] = None,
    earlier: Annotated[Optional[list[Path]], typer.Option(
        "--earlier", help="an earlier audit's folder (repeatable) of the same rooms, network and attacks: its "
        "levels' verdicts count in where the leaks stop and which levels to audit next")] = None,
    kind: Annotated[str, _choice("--kind", AUDIT_KIND_NAMES, "(rooms: federated RL; images: image classifiers, "
                                 "DLG, which takes only --quick, --seed and --out)")] = "rooms",
    workers: AuditWorkersOpt = 0,
    device: DeviceOpt = "cpu",
    seed: SeedOpt = 0,
) -> None:
    """The leakage audit: robots' rooms through their federated DQN/REINFORCE updates, defended or not.

    Writes OUT/report.html (OUT: runs/<time>-audit unless given) and OUT/results.json."""
    from leaklab.io import new_run_dir

    out = out or new_run_dir("audit")
    with _progress() as progress:
        if kind == "images":
            given = [flag for flag, used in (("--full", full), ("--cases", cases), ("--model-class", model_class),
                                             ("--mode", mode), ("--arch", arch), ("--iterations", iterations),
                                             ("--train-steps", train_steps),
                                             ("--sigmas", sigmas), ("--epsilons", epsilons), ("--earlier", earlier),
                                             ("--workers", workers), ("--device", device != "cpu")) if used]
            if given:
                raise LeaklabError(f"{', '.join(given)}: only for --kind rooms (--kind images takes --quick, "
                                   "--seed and --out)")
            _image_audit(out, quick, seed, progress)
            return
        from leaklab.attacks.rl import RoomAttackConfig
        from leaklab.device import require_device
        from leaklab.experiments import room_attack, room_audit, room_report, room_verdicts

        require_device(device)  # before the configs: one plain line for a bad name
        if cases is not None:
            if quick or full:
                raise LeaklabError("--cases attacks the saved updates as they are; drop --quick/--full (for a "
                                   "faster, rougher look: --iterations 1000, half the default)")
            if arch is not None:
                raise LeaklabError("--arch: the cases' view.json names their network (your own: --model-class)")
            if sigmas or epsilons:
                raise LeaklabError("--sigmas/--epsilons: the cases hold the updates as their clients defended them "
                                   "(`leaklab env capture --defense`)")
            if train_steps:
                raise LeaklabError("--train-steps: the cases hold the updates of the network they were captured "
                                   "from (`leaklab env capture --train-steps`)")
            if earlier:
                raise LeaklabError("--earlier: the levels' verdicts come from audits of defense levels; the cases "
                                   "hold their own updates")
            if mode == BOTH_MODES:
                raise LeaklabError("--mode both: an audit of saved cases attacks them in one mode; run it once "
                                   "with --mode exact and once with --mode paper")
            attack = RoomAttackConfig(mode=mode or "exact", seed=seed,
                                      **({"iterations": iterations} if iterations is not None else {}))
            results = room_audit.run_cases(out, cases, attack, workers=workers, progress=progress,
                                           model_class=model_class, device=device)
            s, rows = results["summary"], results["cases"]
            typer.echo(f"wrote {out / 'report.html'}: {plural(s['cases'], 'case')}, {s['scored']} scored"
                       + _resumed(s["resumed_attacks"], ", {} resumed from an interrupted run")
                       + (f"; {_room_summary_line(s, any(map(room_report.maybe_defended, rows)), rows)}"
                          if s["scored"] else ""))
            if blind := room_verdicts.features_read_text(room_report.blind_features(results["cases"])):
                typer.echo(blind)
            if caveat := room_verdicts.noise_caveat([attack.mode], [r["defense"] for r in results["cases"]],
                                                    cases=results["cases"]):
                typer.echo(caveat)
            if short := room_report.effort_notice(attack.iterations):
                typer.echo(f"warning: {short}", err=True)
            return
        if model_class is not None:
            raise LeaklabError("--model-class belongs to --cases (your saved updates of your network)")
        if full and mode is not None:
            raise LeaklabError("--full runs exact and paper mode; drop --mode")
        config = room_audit.default_config(quick=quick, full=full, seed=seed)
        overrides = {k: v for k, v in (("iterations", iterations), ("workers", workers or None), ("arch", arch),
                                       ("train_steps", train_steps or None),
                                       ("gaussian_sigmas", sigmas), ("dp_epsilons", epsilons)) if v is not None}
        overrides["device"] = device
        if mode is not None and not full:
            overrides["modes"] = ROOM_MODE_NAMES if mode == BOTH_MODES else (mode,)
        config = room_audit.AuditConfig(**{**config.model_dump(), **overrides})
        results = room_audit.run(out, config, progress=progress, earlier=earlier or ())
    resumed = results["summary"]["resumed_attacks"]
    typer.echo(f"wrote {out / 'report.html'} ({results['summary']['seconds']:.0f} s"
               + (f"; {plural(resumed, 'attack')} resumed from an interrupted run" if resumed else "") + ")")
    for cell in results["cells"]:
        s = cell["summary"]
        defended = cell["defense_chain"] is not None
        images = ", ".join(f"{im} PSNR {s[f'{im}_psnr_mean']:.2f} dB (baseline {s[f'{im}_psnr_baseline_mean']:.2f})"
                           for im in ("rgb", "depth") if s.get(f"{im}_psnr_mean") is not None)
        typer.echo(f"  {cell['algorithm'].upper()} {cell['setting']} {cell['mode']:5s} {cell['defense']:18s} "
                   f"{images}, box IoU {s['iou_mean']:.3f}, action {room_attack.action_share(s, defended)}"
                   + (f", update kept {cosine_text(s['update_cosine_median'])}" if defended else "")
                   + (f", features read {cosine_text(s['feature_cosine_median'])}"
                      if defended and s.get("feature_cosine_median") is not None else ""))
    typer.echo(room_verdicts.conclusion(room_verdicts.verdicts(results)))
    caveat = room_verdicts.noise_caveat(results["config"]["modes"], [c["defense_chain"] for c in results["cells"]])
    unread = room_report.unread_images_caveat(room_report.exact_rows(results))
    for advice in (caveat, unread, room_verdicts.levels_text(results["summary"])):
        if advice:
            typer.echo(advice)
    if config.iterations is not None and (short := room_report.effort_notice(
            config.iterations, " Rerun without --quick or --iterations for the audit's verdicts.")):
        typer.echo(f"warning: {short}", err=True)


def _image_audit(out: Path, quick: bool, seed: int, progress: Callable[..., None]) -> None:
    from leaklab.experiments import image_audit

    results = image_audit.run(out, quick=quick, seed=seed, progress=progress)
    typer.echo(f"wrote {out / 'report.html'} ({results['summary']['seconds']:.0f} s)")
    for row in results.get("settings", []):
        s = row["summary"]
        typer.echo(f"  {row['scenario']:28s} {row['defense']:26s} PSNR {s['psnr_mean']:6.2f} dB "
                   f"(baseline {s['psnr_baseline_mean']:5.2f}), SSIM {s['ssim_mean']:.3f}"
                   + (f", update kept {cosine_text(s['update_cosine_median'])}" if row["defense"] != "none"
                      else ""))
    if results["quick"]:
        typer.echo(f"warning: {image_audit.QUICK_NOTICE}.", err=True)
