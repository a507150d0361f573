"""``leaklab reproduce``: the published tables beside ours (docs/reproductions.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from leaklab.cli.app import CELLS_KEPT, CHECKS_KEPT, _guard, reproduce_app
from leaklab.cli.options import (QuickOpt, SeedOpt, _bounded, _checked, _choice, _each, _fail, _positive_numbers,
                                 _run_out, _some, _spelling, _split)
from leaklab.cli.progress import _progress
from leaklab.cli.rooms import ArchOpt, DeviceOpt, IterationsOpt, LayoutsOpt, ModeOpt, WorkersOpt
from leaklab.errors import LeaklabError
from leaklab.names import (DEFAULT_ARCH, INVERSION_CHECK_NAMES, MAX_TRAIN_STEPS, PE_MARL_METHODS, PPO_OPTIMIZER_NAMES,
                           TABLE1_CELLS)
from leaklab.words import plural

MAX_IMAGES = 10_000  # images per setting or check (100,000 were taken and ran until killed)
_images_checked = _checked("--images", lambda v: 1 <= v <= MAX_IMAGES, f"a whole number from 1 to {MAX_IMAGES:,}")
TABLE2_IMAGES = 292  # bayes_table2.POOL_OFFSET - EVAL_OFFSET: its reported images end where the training pool begins


@reproduce_app.command("bayes-table2")
@_guard(stopped=CELLS_KEPT)
def reproduce_bayes_table2(
    quick: QuickOpt = False,
    datasets: Annotated[Optional[list[str]], typer.Option("--datasets", help="repeatable or comma-separated, e.g. "
                                                          "digits,photos", callback=_some("--datasets"))] = None,
    defenses: Annotated[Optional[list[str]], typer.Option("--defenses", help="repeatable; one defense chain each, "
                                                          "chains separated by ';'",
                                                          callback=_some("--defenses"))] = None,
    steps: Annotated[Optional[list[str]], typer.Option("--steps", help="train steps, e.g. 0,500",
                                                       callback=_each("--steps", _bounded(MAX_TRAIN_STEPS),
                                                                      f"whole numbers of train steps up to "
                                                                      f"{MAX_TRAIN_STEPS:,}, e.g. 0,500"))
                     ] = None,
    images: Annotated[Optional[int], typer.Option("--images", help="images per setting", callback=_images_checked)
                      ] = None,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("bayes-table2")] = None,
) -> None:
    """Seed 001 Table 2: Bayes-optimal adversary vs L2/L1/cosine under noise and pruning defenses."""
    from leaklab.experiments import bayes_table2
    from leaklab.io import new_run_dir

    step_values = list(dict.fromkeys(int(s) for s in _split(steps) or [])) or None  # 0,00: one step
    out = out or new_run_dir("bayes-table2")
    # Not atomic on purpose: the experiment writes each finished cell at once and a rerun resumes;
    # it validates its options before it creates anything.
    with _progress() as progress:
        result = bayes_table2.run(out, quick=quick, datasets=_split(datasets),
                                  defenses=_split(defenses, ";"), steps=step_values, images=images,
                                  seed=seed, progress=progress)
    table = result.get("table") if isinstance(result, dict) else None
    typer.echo(f"wrote {out / 'results.json'}")
    if table:
        for dataset, by_defense in table.items():
            for defense_name, by_step in by_defense.items():
                for step, by_attack in by_step.items():
                    cells = ", ".join(f"{a} {v:.2f}" if isinstance(v, (int, float)) else f"{a} {v}"
                                      for a, v in by_attack.items())
                    typer.echo(f"  {dataset:8s} {defense_name:26s} step {step}: {cells}")


PUBLISHED_SAMPLES = 48  # the acceptance protocol of the tables in docs/reproductions.md: samples per cell,
PUBLISHED_LAYOUTS = 12  # from this many rooms or more,
PUBLISHED_ITERATIONS = 300  # and image iterations no fewer than any published table ran (Table II's ablations)


def _published_command(argv: list[str], arch: str) -> str:
    """The command a published table names: ``argv`` without ``--update-docs``, and ``--arch`` spelt
    out where the default chose it (the default network changed in session 31; a command that leaves it
    out would rerun another network)."""
    import shlex

    args = [a for a in argv if a != "--update-docs"]
    if not any(a == "--arch" or a.startswith("--arch=") for a in args):
        args += ["--arch", arch]
    return "leaklab " + " ".join(shlex.quote(a) for a in args)


def _room_table(name: str, out: Path | None, update_docs: bool, samples: int, layouts: tuple[str, ...] | None,
                iterations: int | None, run: Callable[[Path, Any], dict]) -> None:
    from leaklab.experiments import room_report, room_tables
    from leaklab.io import new_run_dir
    from leaklab.rl.envs import LAYOUTS

    rooms = len(layouts or LAYOUTS)
    if update_docs and (samples < PUBLISHED_SAMPLES or rooms < PUBLISHED_LAYOUTS
                        or (iterations is not None and iterations < PUBLISHED_ITERATIONS)):
        given = f"{plural(samples, 'sample')} from {plural(rooms, 'room')}" + (
            f" at {plural(iterations, 'iteration')}" if iterations is not None else "")
        raise LeaklabError(f"--update-docs replaces a published table ({PUBLISHED_SAMPLES} samples per cell or more "
                           f"from {PUBLISHED_LAYOUTS} rooms or more, {PUBLISHED_ITERATIONS} image iterations or more); "
                           f"run {given} without it")
    if update_docs and not room_tables.DOCS.is_file():
        raise LeaklabError(f"{room_tables.DOCS} not found; run --update-docs from the repository root")
    out = out or new_run_dir(name)
    # Not atomic on purpose: every finished cell is kept and a rerun resumes.
    with _progress() as progress:
        result = run(out, progress)
    typer.echo(result["markdown"])
    typer.echo(f"wrote {out / 'results.json'} and {out / 'table.md'}")
    if iterations is not None and (short := room_report.effort_notice(iterations)):  # as the attacks and audit
        typer.echo(f"warning: {short}", err=True)
    if update_docs:
        command = _published_command(sys.argv[1:], result["arch"])
        typer.echo(f"updated {room_tables.update_docs(result['section'], result['markdown'], command)}")


RoomSamplesOpt = Annotated[int, typer.Option("--samples", help="samples per cell")]
UpdateDocsOpt = Annotated[bool, typer.Option("--update-docs", help="write the table into "
                                             "docs/reproductions.md (run from the repository root)")]


@reproduce_app.command("room-table1")
@_guard(stopped=CELLS_KEPT)
def reproduce_room_table1(
    mode: ModeOpt = "paper", samples: RoomSamplesOpt = 48, layouts: LayoutsOpt = None,
    iterations: IterationsOpt = None, arch: ArchOpt = DEFAULT_ARCH,
    seed: SeedOpt = 0,
    workers: WorkersOpt = 0,
    device: DeviceOpt = "cpu",
    cells: Annotated[Optional[str], typer.Option("--cells", help="comma-separated subset of "
                                                 f"{', '.join(TABLE1_CELLS)} (default all)",
                                                 callback=_each("--cells", _spelling(TABLE1_CELLS),
                                                                "choose " + " | ".join(TABLE1_CELLS)))] = None,
    out: Annotated[Optional[Path], _run_out("room-table1")] = None,
    update_docs: UpdateDocsOpt = False,
) -> None:
    """Seed 000 Table I: QGI and RGI in S1 and S2 on the ViZDoom rooms, beside the paper's numbers."""
    from leaklab.experiments import room_tables
    from leaklab.rl.envs.layouts import layouts_arg

    chosen = layouts_arg(layouts)
    _room_table("room-table1", out, update_docs, samples, chosen, iterations, lambda o, p: room_tables.table1(
        o, mode=mode, samples=samples, layouts=chosen, iterations=iterations, arch=arch, seed=seed,
        workers=workers, device=device, progress=p,
        **({"cells": tuple(_split([cells]))} if cells else {})))


@reproduce_app.command("room-table2")
@_guard(stopped=CELLS_KEPT)
def reproduce_room_table2(
    samples: RoomSamplesOpt = 48, layouts: LayoutsOpt = None, iterations: IterationsOpt = None,
    arch: ArchOpt = DEFAULT_ARCH, seed: SeedOpt = 0,
    workers: WorkersOpt = 0,
    device: DeviceOpt = "cpu",
    out: Annotated[Optional[Path], _run_out("room-table2")] = None,
    update_docs: UpdateDocsOpt = False,
) -> None:
    """Seed 000 Table II and Fig. 4: objectives and joint vs separate optimisation, and exact mode.

    The joint row runs stage 1's steps plus --iterations in one stage: the separate rows' total."""
    from leaklab.experiments import room_tables
    from leaklab.rl.envs.layouts import layouts_arg

    chosen = layouts_arg(layouts)
    _room_table("room-table2", out, update_docs, samples, chosen, iterations, lambda o, p: room_tables.table2(
        o, samples=samples, layouts=chosen, iterations=iterations, arch=arch, seed=seed, workers=workers,
        device=device, progress=p))


@reproduce_app.command("inversion-checks")
@_guard(stopped=CHECKS_KEPT)
def reproduce_inversion_checks(
    checks: Annotated[Optional[list[str]], typer.Option("--checks", help="dlg, idlg, analytic, ig, ig_batch_stats "
                                                        "(IG on a BatchNorm client in training mode; repeatable or "
                                                        "comma-separated; default all but ig_batch_stats)",
                                                        callback=_each("--checks", _spelling(INVERSION_CHECK_NAMES),
                                                                       "choose " + " | ".join(INVERSION_CHECK_NAMES)))
                      ] = None,
    images: Annotated[Optional[int], typer.Option("--images", help="images of the dlg and analytic checks "
                                                  "(ig: at most 3, 1 with --quick; idlg always 50, 5 with --quick)",
                                                  callback=_images_checked)] = None,
    quick: QuickOpt = False,
    out: Annotated[Optional[Path], _run_out("inversion-checks")] = None,
) -> None:
    """The engine's reference checks: DLG, iDLG labels, analytic MLP recovery, Inverting Gradients."""
    from leaklab.experiments import inversion_checks
    from leaklab.io import new_run_dir

    out = out or new_run_dir("inversion-checks")
    with _progress() as progress:
        result = inversion_checks.run(out, quick=quick, checks=_split(checks), images=images, progress=progress)
    typer.echo(f"wrote {out / 'results.json'}")
    for name, check in result["checks"].items():
        figures = {k: v for k, v in check.items() if k in ("psnr_mean", "psnr_min", "psnr_baseline_mean", "accuracy")}
        typer.echo(f"  {name:9s} " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))


def _experiment(module: Any, make: Any, name: str, quick: bool, seed: int, out: Path | None,
                workers: int | None = None, **fields: Any) -> dict:
    """Run the reproduction ``module`` (its ``run(out, config, quick, progress)``) on the config class ``make``'s
    quick or full config for ``seed`` (``fields`` given: set on it; a dict updates a nested config's fields), into
    ``out`` or a fresh ``runs/NAME-...`` folder, with progress bars (``workers`` given: passed on to the run); says
    where it wrote."""
    from leaklab.io import new_run_dir

    config = make.quick(seed) if quick else make(seed=seed)
    if fields:
        merged = config.model_dump()
        for key, value in fields.items():
            merged[key] = {**merged[key], **value} if isinstance(value, dict) else value
        config = make.model_validate(merged)
    out = out or new_run_dir(name)
    with _progress() as progress:
        result = module.run(out, config, quick=quick, progress=progress,
                            **({} if workers is None else {"workers": workers}))
    typer.echo(f"wrote {out / 'results.json'}")
    return result


@reproduce_app.command("bayes-ablation")
@_guard
def reproduce_bayes_ablation(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("bayes-ablation")] = None,
) -> None:
    """Seed 001, Fig. 4: the Bayes optimal adversary (Gaussian prior, Laplacian conditional) against the three
    other pairings on a synthetic Gaussian task behind Laplace noise (--quick: a few samples and steps)."""
    from leaklab.experiments import bayes_ablation

    result = _experiment(bayes_ablation, bayes_ablation.BayesAblationConfig, "bayes-ablation", quick, seed, out)
    for name, a in result["attacks"].items():
        versus = a["versus_bayes_optimal"]
        best = " (Bayes optimal)" if a["bayes_optimal"] else (
            f", {versus['distance_difference']:+.3f} from the Bayes optimal attack's, which is closer on "
            f"{100 * versus['bayes_closer_share']:.0f}% of the samples")
        edge = ", at the grid's edge" if a["learning_rate_at_grid_edge"] else ""
        typer.echo(f"  {name}: distance {a['final_distance']:.3f} after {result['config']['steps']} steps "
                   f"(learning rate {a['learning_rate']:g}{edge}){best}")
    typer.echo(f"  no information (the prior's mean): distance {result['no_information_distance']:.3f}")


@reproduce_app.command("mc-ablation")
@_guard
def reproduce_mc_ablation(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("mc-ablation")] = None,
) -> None:
    """Seed 001, appendix A.6, Fig. 7: the Bayes adversary's Monte Carlo points k against the PSNR over the steps
    (MNIST, Gaussian noise 0.1; --quick: a few tiny digits)."""
    from leaklab.experiments import mc_ablation

    result = _experiment(mc_ablation, mc_ablation.McAblationConfig, "mc-ablation", quick, seed, out)
    steps = result["config"]["iterations"]
    for k, row in result["samples"].items():
        at = sorted({max(1, steps // 4), max(1, steps // 2), steps})
        marks = ", ".join(f"{row['psnr_mean'][s - 1]:.2f}" for s in at)
        typer.echo(f"  k = {k}: PSNR {marks} dB after {', '.join(map(str, at))} of the {steps} steps "
                   f"({1000 * row['seconds_per_iteration']:.0f} ms an iteration)")
    typer.echo(f"  learning rate {result['learning_rate']:g}, TV weight {result['beta_tv']:g} (tuned at k = 1); "
               f"no information: {result['baseline_psnr']:.2f} dB")


@reproduce_app.command("range-prior")
@_guard
def reproduce_range_prior(
    quick: QuickOpt = False,
    dataset: Annotated[Optional[str], _choice("--dataset", ("mnist", "digits"), "(default mnist, the seed's; digits: "
                                              "scikit-learn's at 16x16, 8x8 with --quick)")] = None,
    images: Annotated[Optional[int], typer.Option("--images", help="reported digits per defense (default 48; "
                                                  "--quick: 2)",
                                                  callback=_checked("--images", lambda v: 1 <= v <= TABLE2_IMAGES,
                                                                    f"a whole number from 1 to {TABLE2_IMAGES}"))
                      ] = None,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("range-prior")] = None,
) -> None:
    """Seed 001, appendix A.4, Table 5: the L2 attack with the TV prior alone, with the pixel-range prior added, and
    with its iterates clamped to [0, 1], on MNIST after 500 steps under each of Table 2's defenses (--quick: tiny
    digits, a few steps)."""
    from leaklab.experiments import range_prior

    fields = {key: value for key, value in (("dataset", dataset), ("images", images)) if value is not None}
    result = _experiment(range_prior, range_prior.RangePriorConfig, "range-prior", quick, seed, out, **fields)
    typer.echo("  (the seed's numbers: MNIST after 500 steps, its Table 5)")
    for defense, row in result["defenses"].items():
        means = ", ".join(f"{range_prior.LABELS[v]} {row['psnr_mean'][v]:.2f}" for v in range_prior.VARIANTS)
        paper = row["published"]
        gains = "; ".join(f"range - {name} {d['db']:+.2f}" + ("" if d["paired_se_db"] is None else
                                                             f" +- {d['paired_se_db']:.2f}") + " dB"
                          for name, d in (("TV", row["range_minus_tv"]), ("clamped TV", row["range_minus_clamped"])))
        typer.echo(f"  {defense}: {means} dB; {gains} (seed 001: {paper['tv_range'] - paper['tv']:+.2f}); "
                   f"no information {row['baseline_psnr']:.2f}")


@reproduce_app.command("dp-vs-inversion")
@_guard
def reproduce_dp_vs_inversion(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("dp-vs-inversion")] = None,
) -> None:
    """DP-SGD on MNIST at epsilon 3 (accuracy beside non-private) and inversion PSNR vs epsilon."""
    from leaklab.experiments import dp_vs_inversion

    result = _experiment(dp_vs_inversion, dp_vs_inversion.DpVsInversionConfig, "dp-vs-inversion", quick, seed, out)
    u = result["utility"]
    typer.echo(f"  DP-SGD epsilon {u['private']['epsilon']:.3f} (delta {u['private']['delta']:g}): test accuracy "
               f"{100 * u['private']['accuracy']:.1f}%, non-private {100 * u['non_private']['accuracy']:.1f}%")
    for row in result["attack"]["rows"]:
        typer.echo(f"  epsilon {row['epsilon']:>6s}: PSNR {row['psnr_mean']:6.2f} dB "
                   f"(baseline {row['psnr_baseline_mean']:.2f}), noise multiplier {row['noise_multiplier']:.4g}")


@reproduce_app.command("at-features")
@_guard
def reproduce_at_features(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("at-features")] = None,
) -> None:
    """Seed 004: features, then images, restored from batch gradients of vanilla and adversarially trained
    networks (MNIST, distinct labels per batch; --quick: digits 8x8)."""
    from leaklab.experiments import at_features

    result = _experiment(at_features, at_features.AtFeaturesConfig, "at-features", quick, seed, out)
    for row in result["rows"]:
        restored = ", ".join(f"batch {r['batch_size']}: cosine {r['cosine_mean']:.3f} "
                             f"({100 * r['nearly_perfect']:.0f}% >= {at_features.NEARLY_PERFECT}; nonnegative part "
                             f"{r['nonnegative']['cosine_mean']:.3f})" for r in row["restoration"])
        im = row["images"]
        typer.echo(f"  {row['training']:>10s} (accuracy {100 * row['clean_accuracy']:.1f}%, robust "
                   f"{100 * row['robust_accuracy']:.1f}%): {restored}; images {im['psnr_mean']:.2f} dB "
                   f"(baseline {im['psnr_baseline_mean']:.2f})")


@reproduce_app.command("breaking-defenses")
@_guard
def reproduce_breaking_defenses(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("breaking-defenses")] = None,
) -> None:
    """Seed 001, section 6: Soteria, ATS and PRECODE attacked early in training (photos 32x32, one image per
    update; --quick: 16x16, small networks)."""
    from leaklab.experiments import breaking_defenses

    result = _experiment(breaking_defenses, breaking_defenses.BreakingDefensesConfig, "breaking-defenses", quick,
                         seed, out)
    for row in result["rows"]:
        typer.echo(f"  {row['defense']:>8s} {row['setting']:>15s} step {row['train_step']:>4d} {row['attack']:>20s}: "
                   f"PSNR {row['psnr_mean']:.2f} dB (constant image {row['psnr_baseline_mean']:.2f}), "
                   f"SSIM {row['ssim_mean']:.3f}")


@reproduce_app.command("opd-table")
@_guard
def reproduce_opd_table(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("opd-table")] = None,
    sensitivity: Annotated[Optional[float], typer.Option(
        "--sensitivity", help="OPD's Delta_u (default 1, the thesis' eq. 6.2; 0.3 gives its Table 6.2 "
                              "distortions)")] = None,
    data: Annotated[Optional[str], _choice("--data", ("mnist", "photos"), "(default mnist; photos: colour crops, the "
                                           "CIFAR-10 stand-in)")] = None,
) -> None:
    """Seed 002, Table 6.2: the One Parameter Defense, MemGuard and Purification against membership inference
    (ML-Leaks, NSH) and model inversion through a classifier's confidence vectors (MNIST; --quick: digits, tiny
    networks)."""
    from leaklab.experiments import opd_table

    fields = {key: value for key, value in (("sensitivity", sensitivity), ("data", data)) if value is not None}
    result = _experiment(opd_table, opd_table.OpdTableConfig, "opd-table", quick, seed, out, **fields)
    for r in result["rows"]:
        typer.echo(f"  {r['defense']:>12s}: accuracy {100 * r['train_accuracy']:.2f}% train, "
                   f"{100 * r['test_accuracy']:.2f}% test; distortion {r['distortion']:.3f}; membership inference "
                   f"ML-Leaks {100 * r['ml_leaks']:.1f}%, NSH {100 * r['nsh']:.1f}%; inversion error (MSE) "
                   f"{r['inversion_error_train']:.4f} members, {r['inversion_error_test']:.4f} non-members; "
                   f"{r['training_seconds']:.1f} s to train, {r['seconds_per_vector']:.2g} s a vector")


@reproduce_app.command("dp-drl")
@_guard
def reproduce_dp_drl(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("dp-drl")] = None,
    maps: Annotated[Optional[int], typer.Option("--maps", help="random maps per size (default 2)",
                                                callback=_checked("--maps", lambda v: 1 <= v <= 100,
                                                                  "a whole number from 1 to 100"))] = None,
    episodes: Annotated[Optional[int], typer.Option(
        "--episodes", help="DQN episodes per agent (default 1,500; the thesis: 100,000)",
        callback=_checked("--episodes", lambda v: 2 <= v <= 1_000_000, "a whole number from 2 to 1,000,000"))] = None,
    generations: Annotated[Optional[int], typer.Option(
        "--generations", help="the genetic search's generations (default 100)",
        callback=_checked("--generations", lambda v: 0 <= v <= 100_000, "a whole number from 0 to 100,000"))] = None,
    position: Annotated[bool, typer.Option(
        "--position", help="agents that also observe their (row, column): not the thesis' agent, which sees only its "
                           "8 neighbours")] = False,
    workers: Annotated[int, typer.Option("--workers", help="search processes (0: one per core)", callback=_checked(
        "--workers", lambda v: v >= 0, "0 (one per core) or more"))] = 0,
) -> None:
    """Seed 002, chapter 5 (Tables 5.1-5.3, Fig. 5.5): DP-DRL against the genetic search for a DQN agent's floor
    plan, on random grid maps of 7x7, 9x9, 11x11 and 12x11 (--quick: one 6x6 map, a few episodes)."""
    from leaklab.experiments import dp_drl_table

    fields: dict[str, Any] = {} if maps is None else {"maps": maps}
    training = {**({} if episodes is None else {"episodes": episodes}), **({"position": True} if position else {})}
    if training:
        fields["training"] = training
    if generations is not None:
        fields["search"] = {"generations": generations}
    result = _experiment(dp_drl_table, dp_drl_table.DpDrlTableConfig, "dp-drl", quick, seed, out, workers, **fields)
    for row in result["table"]:
        typer.echo(f"  {row['size']:>5s} {row['defense']:>8s}: GRR {100 * row['grr']:.2f}%, "
                   f"NRR {100 * row['nrr']:.2f}% "
                   f"(no information: random maps {100 * row['prior_nrr']:.2f}%, all free "
                   f"{100 * row['free_guess_nrr']:.2f}%), {plural(row['maps'], 'map')}; final goal rate "
                   f"{100 * row['final_goal_rate']:.0f}%")
    for row in result["utility"]:
        typer.echo(f"  {row['size']:>5s} {row['defense']:>8s}: final stage return {row['final_reward_mean']:.2f}, "
                   f"{row['final_steps_mean']:.1f} steps; initial stage return {row['initial_reward_mean']:.2f}, "
                   f"{row['initial_steps_mean']:.1f} steps")
    t = result["timing"]
    typer.echo(f"  one agent's step with DP-DRL: {t['dp_drl'] * 1e3:.3f} ms, of which the obfuscation "
               f"{t['obfuscation'] * 1e3:.3f} ms and the DQN step {t['drl'] * 1e3:.3f} ms")


@reproduce_app.command("policy-synthesis")
@_guard
def reproduce_policy_synthesis(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("policy-synthesis")] = None,
    runs: Annotated[Optional[int], typer.Option("--runs", help="privatisations per example and k (default 50, the "
                                                               "thesis')", callback=_checked(
        "--runs", lambda v: 1 <= v <= 10_000, "a whole number from 1 to 10,000"))] = None,
    beta: Annotated[Optional[float], typer.Option("--beta", help="the concentration bound's failure probability "
                                                                 "(default 0.05)", callback=_checked(
        "--beta", lambda v: 0 < v < 1, "a number in (0, 1)"))] = None,
) -> None:
    """Seed 003, chapter 2 (Fig. 2.1): Algorithm 1's privately synthesised policies and the bounds on their cost of
    privacy over a range of Dirichlet concentrations k, on an investment MDP and a random one (--quick: small)."""
    from leaklab.experiments import policy_synthesis

    fields = {**({} if runs is None else {"runs": runs}), **({} if beta is None else {"beta": beta})}
    result = _experiment(policy_synthesis, policy_synthesis.PolicySynthesisConfig, "policy-synthesis", quick, seed,
                         out, **fields)
    for r in result["rows"]:
        typer.echo(f"  {r['example']:>15s} k {r['k']:>7g}: released V-bar {r['private_mean']:.3f}, true V "
                   f"{r['true_mean']:.3f} (optimal {r['optimal']:.3f}); bounds [{r['lower_mean']:.3f}, "
                   f"{r['upper_mean']:.3f}]: cost bound {r['bound_mean']:.3f} "
                   f"(union radius {r['union_bound_mean']:.3f}), "
                   f"realised {r['cost_mean']:.3f}; "
                   f"true V bracketed in {100 * r['bracketed']:.0f}% of runs")
    for r in result["lemma_2_2"]:
        typer.echo(f"  Lemma 2.2, k {r['k']:>7g}, {r['p']}: P(||Dir_k(p) - p||_inf >= alpha) {r['exceed']:.4f} "
                   f"(beta {r['beta']:g}); with the union radius {r['union_exceed']:.4f}")
    for t in result["timing"]:
        lp = f"; the thesis' linear programs {t['lp_seconds']:.2f} s" if "lp_seconds" in t else ""
        thesis = policy_synthesis.PUBLISHED["seconds_per_k"].get(t["setting"])
        typer.echo(f"  {t['setting']}: {t['synthesis_and_bounds_seconds'] * 1e3:.2f} ms per k{lp}"
                   + ("" if thesis is None else f" (thesis: {thesis:g} s)"))


@reproduce_app.command("dp-advising")
@_guard
def reproduce_dp_advising(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("dp-advising")] = None,
    runs: Annotated[Optional[int], typer.Option(
        "--runs", help="simulations per strategy (default 50)",
        callback=_checked("--runs", lambda v: 1 <= v <= 10_000, "a whole number from 1 to 10,000"))] = None,
) -> None:
    """Seed 002, chapter 3 (Figs. 3.4-3.9): differentially private advising between agents whose servers differ,
    against traditional advising and no advice, in the cloud-server scenario (--quick: 30 epochs, 2 runs)."""
    from leaklab.experiments import dp_advising

    result = _experiment(dp_advising, dp_advising.DpAdvisingConfig, "dp-advising", quick, seed, out,
                         **({} if runs is None else {"runs": runs}))
    for experiment, rows in result["experiments"].items():
        for name, r in rows.items():
            if r["strategy"] == "none":
                epoch = r["epoch_reaching_plateau"]
                reached = "92% never reached" if epoch is None else f"92% first reached at epoch {epoch}"
                typer.echo(f"  {experiment.replace('_', ' ')}, {name:>22s}: final ratio {100 * r['final_ratio']:.2f}%, "
                           f"{reached}")
                continue
            gains = ", ".join(f"{k} {100 * v:+.2f}" + ("" if r["gain_standard_error"][k] is None else
                                                       f" ± {100 * r['gain_standard_error'][k]:.2f}")
                              for k, v in r["gain_over_no_advice"].items())
            good = "" if r["optimal_advice_share"] is None else \
                f", {100 * r['optimal_advice_share']:.0f}% of it the optimal server"
            typer.echo(f"  {experiment.replace('_', ' ')}, {name:>22s}: final ratio {100 * r['final_ratio']:.2f}%, "
                       f"points over no advice: {gains}; advice {r['advice_total']:.0f} per run{good}")


@reproduce_app.command("rnn-membership")
@_guard
def reproduce_rnn_membership(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("rnn-membership")] = None,
    pairs: Annotated[Optional[int], typer.Option("--pairs", help="SensitivitySampler pairs n (default 20; the thesis: "
                                                                 "500)", callback=_checked(
        "--pairs", lambda v: 2 <= v <= 1000, "a whole number from 2 to 1,000 (1 pair guarantees nothing)"))] = None,
) -> None:
    """Seed 003, chapter 3 (Figs. 3.4, 3.6-3.8, Table 3.1) on MNIST: membership inference against an RNN and an FFNN
    of nearly equal size, memorisation of chunks trained in turn, l2 regularisation, DP-SGD, and the Gaussian
    privacy module calibrated by the SensitivitySampler (--quick: digits)."""
    from leaklab.experiments import rnn_membership

    result = _experiment(rnn_membership, rnn_membership.RnnMembershipConfig, "rnn-membership", quick, seed, out,
                         **({} if pairs is None else {"sampler_pairs": pairs}))
    for r in result["vulnerability"]:
        typer.echo(f"  {r['arch']} after {r['epochs']:>3d} epochs: attack {100 * r['attack_accuracy']:.1f}%, "
                   f"accuracy {100 * r['train_accuracy']:.1f}% train / {100 * r['test_accuracy']:.1f}% test, "
                   f"entropy {r['entropy_members']:.3f} members / {r['entropy_non_members']:.3f} non-members")
    for r in result["memorisation"]:
        se = "" if r["attack_accuracy_se"] is None else f" ± {100 * r['attack_accuracy_se']:.1f}"
        typer.echo(f"  memorisation, {r['arch']}, chunk {r['chunk']} ({r['epochs_after']} epochs on later chunks): "
                   f"attack {100 * r['attack_accuracy']:.1f}%{se}, accuracy on it {100 * r['train_accuracy']:.1f}%")
    for r in result["regularisation"]:
        typer.echo(f"  l2 penalty {r['penalty']:.4g} on {r['penalised']}, {r['arch']}: attack "
                   f"{100 * r['attack_accuracy']:.1f}%, accuracy {100 * r['train_accuracy']:.1f}% train / "
                   f"{100 * r['test_accuracy']:.1f}% test")
    for r in result["dp_sgd"]:
        typer.echo(f"  DP-SGD noise {r['noise_multiplier']:.4g} (epsilon {r['epsilon']:.3g} at delta "
                   f"{result['delta']:g}), {r['arch']}: utility loss {100 * r['utility_loss']:.1f}%, attack "
                   f"{100 * r['attack_accuracy']:.1f}%")
    for arch, s in result["sampler"].items():
        typer.echo(f"  {arch}: empirical sensitivity {s['sensitivity']:.4g} from {s['pairs']} pairs (random DP "
                   f"holds with probability 1 - gamma = {1 - s['gamma']:.3f})")
    for r in result["defense"]:
        typer.echo(f"  GPM sigma {r['sigma']:.4g}, {r['arch']}: utility loss {100 * r['utility_loss']:.1f}%, attack "
                   f"{100 * r['attack_accuracy']:.1f}%, epsilon {r['epsilon']:.3g} at delta {result['delta']:g}")


@reproduce_app.command("rl-membership")
@_guard
def reproduce_rl_membership(
    quick: QuickOpt = False,
    rooms: Annotated[Optional[int], typer.Option("--rooms", help="rooms per floor map (default 3; the thesis: 4)",
                                                 callback=_checked("--rooms", lambda v: 1 <= v <= 10,
                                                                   "a whole number from 1 to 10"))] = None,
    frames: Annotated[Optional[int], typer.Option("--frames", help="PPO frames per model (default 400,000; "
                                                  "the attack runs after 1/8, 1/4, 1/2 and all of them; --quick: "
                                                  "1/2 and all)",
                                                  callback=_checked("--frames", lambda v: 1 <= v <= 100_000_000,
                                                                    "a whole number from 1 to 100,000,000"))] = None,
    clip: Annotated[Optional[float], typer.Option("--clip", help="PPO's clip epsilon (default 0.2; the thesis varies "
                                                  "it as the RL task's regularisation)",
                                                  callback=_checked("--clip", lambda v: 0 < v <= 1,
                                                                    "a number in (0, 1]"))] = None,
    optimizer: Annotated[Optional[str], _choice("--optimizer", PPO_OPTIMIZER_NAMES,
                                                "(PPO's optimiser; default adam, rl-starter-files'; sgd: eq. 3.7's "
                                                "plain SGD)")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="PPO's learning rate (default 1e-3)",
                                                callback=_checked("--lr", lambda v: 0 < v <= 1,
                                                                  "a number in (0, 1]"))] = None,
    dp_noise: Annotated[Optional[str], typer.Option(
        "--dp-noise", callback=_positive_numbers("--dp-noise", "0.5,2"), help="DP-SGD's noise multipliers, every "
        "model trained again at each (clip 1; Fig. 3.8 top; default none)")] = None,
    sigmas: Annotated[Optional[str], typer.Option(
        "--sigmas", callback=_positive_numbers("--sigmas", "0.01,0.1"), help="the Gaussian privacy module's noise "
        "scales on the trained models, after the SensitivitySampler (Fig. 3.8 bottom, Table 3.1; default "
        "none)")] = None,
    sampler_pairs: Annotated[Optional[int], typer.Option(
        "--sampler-pairs", help="the SensitivitySampler's pairs of trainings per network (default 8; the thesis: 500)",
        callback=_checked("--sampler-pairs", lambda v: 2 <= v <= 1000, "a whole number from 2 to 1,000"))] = None,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("rl-membership")] = None,
) -> None:
    """Seed 003, chapter 3, Fig. 3.4's deep-RL task: membership inference of floor maps against PPO agents, an RNN
    and an FFNN of equal size, on multi-room maps, and the defenses of Fig. 3.8 if asked (--quick: two rooms, a few
    maps and frames)."""
    from leaklab.experiments import rl_membership

    fields = {key: value for key, value in (("rooms", rooms), ("frames", frames), ("clip", clip),
                                            ("optimizer", optimizer), ("lr", lr), ("dp_noise", dp_noise),
                                            ("sigmas", sigmas), ("sampler_pairs", sampler_pairs))
              if value is not None}
    result = _experiment(rl_membership, rl_membership.RlMembershipConfig, "rl-membership", quick, seed, out, **fields)
    for arch, rows in result["rows"].items():
        for r in rows:
            steps = [r[side]["steps_to_goal"] for side in ("members", "non_members")]
            shown = "/".join("-" if s is None else f"{s:.1f}" for s in steps)
            typer.echo(f"  {arch.upper()} after {r['frames']:,} frames: attack {100 * r['attack_accuracy']:.1f}%; "
                       f"steps to the goal {shown} (members/non-members), success "
                       f"{100 * r['members']['success']:.0f}/{100 * r['non_members']['success']:.0f}%")
    for arch, s in result["sampler"].items():
        typer.echo(f"  {arch}: empirical sensitivity {s['sensitivity']:.4g} from {s['pairs']} pairs (random DP "
                   f"holds with probability 1 - gamma = {1 - s['gamma']:.3f})")
    for r in result["dp_sgd"] + result["gpm"]:
        dp = "noise_multiplier" in r
        name = f"DP-SGD noise {r['noise_multiplier']:.4g}" if dp else f"GPM sigma {r['sigma']:.4g}"
        unit = (f"of a chunk of {plural(r['chunk_steps'], 'step')}" if dp else
                "of a map (random DP, victim0's training algorithm)")
        loss = "-" if r["utility_loss"] is None else f"{100 * r['utility_loss']:.1f}%"
        typer.echo(f"  {name}, {r['arch']}: utility loss {loss}, attack {100 * r['attack_accuracy']:.1f}%, "
                   f"epsilon {r['epsilon']:.3g} {unit} at delta {result['delta']:g}")


@reproduce_app.command("candidate-inference")
@_guard
def reproduce_candidate_inference(
    quick: QuickOpt = False,
    trials: Annotated[Optional[int], typer.Option("--trials", help="true maps, each with its own candidates "
                                                  "(default 2)", callback=_checked(
        "--trials", lambda v: 1 <= v <= 100, "a whole number from 1 to 100"))] = None,
    candidates: Annotated[Optional[int], typer.Option("--candidates", help="candidate maps per trial (default 4)",
                                                      callback=_checked("--candidates", lambda v: 2 <= v <= 20,
                                                                        "a whole number from 2 to 20"))] = None,
    episodes: Annotated[Optional[int], typer.Option(
        "--episodes", help="DQN episodes per agent (default 600; with dp-drl's 1,500 one trial ran over an hour "
                           "here: an agent that never reaches the goal plays every episode to its 500 steps)",
        callback=_checked("--episodes", lambda v: 1 <= v <= 1_000_000, "a whole number from 1 to 1,000,000"))] = None,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("candidate-inference")] = None,
) -> None:
    """Seed 002, chapter 5's second attack (Pan et al.): which of a few candidate floor plans a DQN agent was trained
    in, learnt from shadow agents, with and without DP-DRL (--quick: one 6x6 trial, two candidates, a few
    episodes)."""
    from leaklab.experiments import candidate_inference

    fields: dict[str, Any] = {key: value for key, value in (("trials", trials), ("candidates", candidates))
                              if value is not None}
    if episodes is not None:
        fields["training"] = {"episodes": episodes}
    result = _experiment(candidate_inference, candidate_inference.CandidateInferenceConfig, "candidate-inference",
                         quick, seed, out, **fields)
    for r in result["rows"]:
        typer.echo(f"  {r['defense']:>8s}: shadow classifier {100 * r['accuracy']:.1f}%, fitness "
                   f"{100 * r['fitness_accuracy']:.1f}% (a guess {100 * r['chance']:.0f}%; {r['targets']} targets), "
                   f"targets' final goal rate {100 * r['goal_rate']:.0f}%")


@reproduce_app.command("pe-marl")
@_guard
def reproduce_pe_marl(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("pe-marl")] = None,
    runs: Annotated[Optional[int], typer.Option(
        "--runs", help="training runs per method (default 5)",
        callback=_checked("--runs", lambda v: 1 <= v <= 1000, "a whole number from 1 to 1,000"))] = None,
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="the DP runs' target epsilon (default 2.90, "
                                                                       "the thesis')", callback=_checked(
        "--epsilon", lambda v: 0 < v <= 100, "a number in (0, 100]"))] = None,
    methods: Annotated[Optional[list[str]], typer.Option(
        "--methods", help="repeatable or comma-separated, e.g. pe-qmix,pe-qtran (default all: iql, vdn, pe-vdn, "
                          "pe-qmix, pe-qtran, dp-pe-vdn, dp-pe-qmix, dp-pe-qtran)", callback=_each(
            "--methods", _spelling(PE_MARL_METHODS),
            "methods among " + ", ".join(PE_MARL_METHODS)))] = None,
) -> None:
    """Seed 003, chapter 4 (Figs. 4.12-4.16): IQL, VDN, PE-VDN (secret-shared team TD error), PE-QMIX, PE-QTRAN, and
    the three PE methods with DP-SGD (Theorem 4.2) on cooperative navigation (--quick: a few steps)."""
    if epsilon is not None and methods is not None and not any(m.startswith("dp-") for m in _split(methods)):
        _fail("--epsilon sets the dp- runs, which --methods leaves out")
    from leaklab.experiments import pe_marl

    fields = {**({} if runs is None else {"runs": runs}), **({} if epsilon is None else {"epsilon": epsilon}),
              **({} if methods is None else {"methods": _split(methods)})}
    result = _experiment(pe_marl, pe_marl.PeMarlConfig, "pe-marl", quick, seed, out, **fields)
    width = max(map(len, result["methods"]))
    for method, r in result["methods"].items():
        dp = "" if r["privacy"] is None else \
            f"; ({r['privacy']['epsilon']:.2f}, {r['privacy']['delta']:.2g})-DP, noise multiplier " \
            f"{r['privacy']['noise_multiplier']:.3g}"
        typer.echo(f"  {method:>{width}s}: final win rate {100 * r['final_win_rate']:.1f}% ± "
                   f"{100 * r['final_win_rate_std']:.1f} (best {100 * r['best_win_rate']:.1f}%), return "
                   f"{r['final_return']:.3f}, {r['seconds_per_run']:.1f} s per run{dp}")


@reproduce_app.command("dp-planning")
@_guard
def reproduce_dp_planning(
    quick: QuickOpt = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("dp-planning")] = None,
    maps: Annotated[Optional[int], typer.Option(
        "--maps", help="random maps per setting (default 10)",
        callback=_checked("--maps", lambda v: 1 <= v <= 10_000, "a whole number from 1 to 10,000"))] = None,
) -> None:
    """Seed 002, chapter 4 (Figs. 4.7-4.11): DP multi-agent planning against No-privacy, Best-first and Greedy on
    logistics maps and packet-routing networks, and what the shared maps leak (--quick: two small maps)."""
    from leaklab.experiments import dp_planning

    result = _experiment(dp_planning, dp_planning.DpPlanningConfig, "dp-planning", quick, seed, out,
                         **({} if maps is None else {"maps": maps}))
    for key, by_approach in sorted(result["experiments"].items()):
        for approach, points in by_approach.items():
            cells = "; ".join(
                f"{x}: {100 * r['success_rate']:.0f}% delivered, length (delivered only) "
                + ("-" if r["route_length"] is None else f"{r['route_length']:.0f}")
                + f", {r['messages_per_plan']:.1f} msgs"
                + ("" if r.get("length_vs_no_privacy") is None else
                   f", x{r['length_vs_no_privacy']:.3f} No-privacy's on the same packages")
                for x, r in points.items())
            typer.echo(f"  {key} {approach:>10s}: {cells}")
    for name, r in result["leakage"].items():
        typer.echo(f"  leakage, {name}: {r['released_nodes']:.1f} nodes shown for {r['real_nodes']:.1f} "
                   f"(Corollary 4.1: {r['corollary_4_1_nodes']:.1f} hidden), {100 * r['real_routes_kept']:.0f}% of "
                   f"real routes kept; routes ordered by length {100 * r['length_order_agreement']:.0f}%, exact "
                   f"length ratios at {100 * r['exact_ratio_share']:.0f}% of nodes; Eq. 4.2 inverted to "
                   f"{r['inversion_max_error']:.1e}; Algorithm 8's walk reaches the exit for "
                   f"{100 * r['exit_reached_share']:.0f}% of centre pairs")
    typer.echo("  degree-histogram change when one base goes (thesis: 1): "
               + ", ".join(f"{k} centres {v}" for k, v in result["histogram_sensitivity"].items()))
    typer.echo("  Theorem 4.5, most discovery messages over the bound sum lc: "
               + ", ".join(f"{k} centres {r['worst_discovery']} ({r['worst_over_bound']:.2f} of it)"
                           for k, r in result["theorem_4_5"].items()))
