"""The ``leaklab`` command line (typer). It only parses options and calls ``leaklab.experiments``.

Every command turns a user mistake (:class:`~leaklab.errors.LeaklabError`, or an option value that
the pydantic configs reject) into one line ``error: ...`` on stderr and exit code 2; output folders
are written atomically, so nothing is left half-written in ``--out``. Long work shows a rich
progress bar on stderr when it is a terminal.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from leaklab.errors import LeaklabError, validation_message
from leaklab.fields import MAX_SEED, defense_steps
from leaklab.names import (ACCOUNTANT_NAMES, ARCH_NAMES, AUDIT_KIND_NAMES, AUDIT_TEST_NAMES, BN_STATS_NAMES,
                           DATASET_NAMES, DEVICE_PATTERN, INVERSION_CHECK_NAMES, MECHANISM_ALIASES, MECHANISM_NAMES,
                           MODEL_NAMES, POLICY_NAMES, RL_ALGORITHM_NAMES, ROOM_MODE_NAMES, SETTING_NAMES,
                           TABLE1_CELLS, UPDATE_NAMES)
from leaklab.words import plural


class _OneLineErrors(TyperGroup):
    """The top command group: a mistake click itself finds (an option missing or unknown, a value of the
    wrong type) is one ``error:`` line with exit code 2, as leaklab's own checks are, instead of a boxed
    panel; a command group called without a command still prints its help."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            message = e.format_message().rstrip(".")
            where = f" (see {e.ctx.command_path} --help)" if getattr(e, "ctx", None) is not None else ""
            typer.echo(_error_line(message[:1].lower() + message[1:] + where), err=True)
            sys.exit(2)
        except click.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(name="leaklab", cls=_OneLineErrors, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_show_locals=False,
                  help="A laboratory for privacy leakage in federated learning: capture client updates, "
                       "attack them, and report how much they leak.")


attack_app = typer.Typer(no_args_is_help=True, help="Attack captured client updates.")
reproduce_app = typer.Typer(no_args_is_help=True, help="Reproduce published tables.")
app.add_typer(attack_app, name="attack")
app.add_typer(reproduce_app, name="reproduce")

CAPTURE = "Capture (client side)"
ATTACK = "Attack"


# --------------------------------------------------------------------------------------------
# errors and progress


_OPTION_NAMES = {"priors": "--prior/--tv"}


def _option_name(loc: tuple) -> str:
    field = str(loc[0])
    return _OPTION_NAMES.get(field, "--" + field.replace("_", "-"))


def _error_line(message: str) -> str:
    """A user mistake as the one line the CLI prints: ``error: ...``, on one line whatever the message."""
    return "error: " + " ".join(str(message).split())


def _fail(message: str) -> None:
    typer.echo(_error_line(message), err=True)
    raise typer.Exit(2)


def _checked(flag: str, ok: Callable[[Any], bool], need: str) -> Callable[[Any], Any]:
    """An option callback refusing a value for which ``ok`` is false while the command line is parsed, as
    one ``error:`` line, before torch loads (the configurations' own checks come seconds later, and a
    few commands have none)."""

    def check(value: Any) -> Any:
        if value is not None and not ok(value):
            _fail(f"invalid {flag} (got {value!r}): {need}")
        return value

    return check


def _choice(flag: str, names: tuple[str, ...], help: str = "", aliases: dict[str, str] | None = None,
            **kwargs: Any) -> Any:
    """A ``flag`` option taking one of ``names`` (its help: the names, then ``help``) in any case, ``_`` for
    ``-``, or an alias of one; it passes on the name as spelled in ``names`` (``--setting s1`` gives
    ``S1``, ``--mechanism Randomized_Response`` and ``rr`` give ``randomized-response``)."""
    spelled = {_name_key(n): n for n in names} | {_name_key(a): n for a, n in (aliases or {}).items()}

    def name(value: Any) -> Any:
        if value is None:
            return value
        if _name_key(value) not in spelled:
            _fail(f"invalid {flag} (got {value!r}): choose {' | '.join(names)}")
        return spelled[_name_key(value)]

    return typer.Option(flag, callback=name, help=" | ".join(names) + (f" {help}" if help else ""), **kwargs)


def _name_key(value: Any) -> str:
    return str(value).lower().replace("_", "-")


def _defense_chain(value: str | None) -> str | None:
    """The ``--defense`` callback: refuses a chain that does not parse (:func:`leaklab.fields.defense_steps`)."""
    try:
        defense_steps(value)
    except LeaklabError as e:
        _fail(f"invalid --defense (got {value!r}): {e}")
    return value


def _each(flag: str, ok: Callable[[str], bool], need: str) -> Callable[[Any], Any]:
    """A callback for a repeatable or comma-separated list option: refuses an empty list (:func:`_some`)
    and any item for which ``ok`` is false, while the command line is parsed."""

    def check(values: str | list[str] | None) -> str | list[str] | None:
        _some(flag)(values)
        bad = [item for item in _split(values if isinstance(values, list) else values and [values]) or []
               if not ok(item)]
        if bad:
            _fail(f"invalid {flag} (got {bad[0]!r}): {need}")
        return values

    return check


def _layouts(value: str | None) -> str | None:
    """The ``--layouts`` callback: refuses an empty list, a count out of range and an unknown or repeated
    room (:func:`leaklab.rl.envs.layouts.layouts_arg`); the room table loads without torch or ViZDoom."""
    _some("--layouts")(value)
    from leaklab.rl.envs.layouts import layouts_arg

    try:
        layouts_arg(value)
    except LeaklabError as e:
        _fail(f"invalid --layouts (got {value!r}): {e}")
    return value


def _some(flag: str) -> Callable[[Any], Any]:
    """A callback refusing a list option given only empty values (``--cells ''``, ``--defenses ';'``),
    which would otherwise select everything, the longest run."""
    return _checked(flag, lambda v: any(part.strip(" ,;") for part in (v if isinstance(v, list) else [v])),
                    "give at least one name (leave the option out for all)")


def _seed_opt(help: str = "seed of everything the command draws (same seed, same numbers)", flag: str = "--seed",
              **kwargs: Any) -> Any:
    """A seed option: a whole number from 0 to :data:`~leaklab.fields.MAX_SEED`."""
    return typer.Option(flag, callback=_checked(flag, lambda v: 0 <= v <= MAX_SEED,
                                                f"a seed is a whole number from 0 to {MAX_SEED}"), help=help, **kwargs)


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that partial output folders are removed on the way out."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _one_line_warnings() -> None:
    """Warnings print as one ``warning: ...`` line, as errors print as one ``error: ...`` line."""
    import warnings

    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"warning: {message}\n"


_run: dict[str, int | None] = {"threads": None}  # this invocation's --threads (the main callback's)


def _guard(fn: Callable) -> Callable:
    """Run a command with the torch thread count of ``--threads``; user mistakes become one ``error:``
    line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _exit_on_sigterm()
        _one_line_warnings()
        try:
            from leaklab.device import configure_threads

            configure_threads(_run["threads"])
            return fn(*args, **kwargs)
        except LeaklabError as e:
            _fail(str(e))
        except ValidationError as e:
            _fail(validation_message(e, name=_option_name))
        except KeyboardInterrupt:
            typer.echo("error: interrupted; --out holds no partial results (the room attacks and the room audit "
                       "keep their finished attacks beside it, the reproduce commands their finished cells: the "
                       "same command resumes)", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _print_version(value: bool) -> None:
    if value:
        from leaklab import __version__

        typer.echo(f"leaklab {__version__}")
        raise typer.Exit()


@app.callback()
def _main(threads: Annotated[Optional[int], typer.Option(
        "--threads", min=1, help="torch threads for this run (default: LEAKLAB_THREADS or 1)")] = None,
        show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="print leaklab's version and exit")] = False) -> None:
    """A laboratory for privacy leakage in federated learning."""
    _run["threads"] = threads  # set when a command runs (_guard): help and usage errors load no torch


PLAIN_EVERY = 30.0  # seconds between progress lines on a non-interactive stderr (a log file, CI)


def _progress_args(args: tuple, kwargs: dict) -> tuple[str, Any, Any]:
    """``progress(description, completed, total)`` (positional or by keyword) as its three parts."""
    words = [a for a in args if isinstance(a, str)]
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    name = kwargs.get("task") or (words[0] if words else "working")
    completed = kwargs.get("completed", numbers[0] if numbers else None)
    total = kwargs.get("total", numbers[1] if len(numbers) > 1 else None)
    return name, completed, total


def _clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _plain_progress(clock: Callable[[], float] = time.monotonic) -> Callable[..., None]:
    """The progress callback for a non-interactive stderr: one plain line ``description: done/total
    (elapsed, about ... left)`` at most every :data:`PLAIN_EVERY` seconds and when a task completes,
    none in a run's first :data:`PLAIN_EVERY` seconds (a short run stays silent, as its error stays
    one line). The time left is the task's rate since it was first reported, over what remains."""
    start = last = clock()
    said = ""
    first: dict[str, tuple[float, float]] = {}  # task -> (time, completed) when first reported

    def update(*args: Any, **kwargs: Any) -> None:
        nonlocal last, said
        name, completed, total = _progress_args(args, kwargs)
        now = clock()
        if completed is not None:
            first.setdefault(name, (now, completed))
        finished = total is not None and completed is not None and completed >= total
        if now - start < PLAIN_EVERY or not (finished or now - last >= PLAIN_EVERY):
            return
        # a fractional count (a running attack's share) to the tenth below: 0.96 of 1 is not 1/1
        done = f"{math.floor(completed * 10) / 10:g}" if isinstance(completed, float) else f"{completed}"
        line = f"{name}: {done}/{total}" if total is not None else f"{name}: {done}"
        if line == said:  # a task's end told twice (its last step, then its result)
            return
        last, said = now, line
        when = f"{_clock(now - start)} elapsed"
        since, before = first.get(name, (now, completed))
        if total is not None and not finished and completed is not None and completed > before and now > since:
            when += f", about {_clock((total - completed) * (now - since) / (completed - before))} left"
        print(f"{line} ({when})", file=sys.stderr, flush=True)

    return update


@contextmanager
def _progress() -> Iterator[Callable[..., None]]:
    """A callback ``progress(task, completed, total)`` drawing rich bars on an interactive stderr,
    plain lines (:func:`_plain_progress`) on any other."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = Console(stderr=True)
    if not console.is_terminal:
        yield _plain_progress()
        return
    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
    task: list[Any] = []

    def update(*args: Any, **kwargs: Any) -> None:
        # one bar whose description follows the work
        name, completed, total = _progress_args(args, kwargs)
        if not task:
            task.append(bars.add_task(name, total=total))
        bars.update(task[0], description=name, completed=completed, total=total)

    with bars:
        yield update


def _resumed(count: int, text: str) -> str:
    """``text`` with the count of attacks taken from an interrupted run, or nothing when there were none."""
    return text.format(count) if count else ""


def _echo_summary(out: Path, results: dict) -> None:
    s = results.get("summary", {})
    parts = []
    if s.get("psnr_mean") is not None:
        parts.append(f"PSNR {s['psnr_mean']:.2f} dB (constant-image baseline {s['psnr_baseline_mean']:.2f} dB)")
        parts.append(f"SSIM {s['ssim_mean']:.3f}")
    if s.get("label_accuracy") is not None:
        parts.append(f"labels {100 * s['label_accuracy']:.0f}%")
    parts.append(f"{plural(s['images'], 'image') if 'images' in s else '? images'}, {s.get('seconds', 0):.1f} s")
    typer.echo(f"wrote {out}: " + ", ".join(parts))


# --------------------------------------------------------------------------------------------
# options shared by capture and the one-shot attack

SeedOpt = Annotated[int, _seed_opt()]


def _model_opt(default: str) -> Any:
    return _choice("--model", MODEL_NAMES, f"(default {default})", rich_help_panel=CAPTURE)


def _run_out(kind: str) -> Any:
    """``--out`` of a command whose results go to a new ``runs/<time>-<kind>`` unless given (:func:`new_run_dir`)."""
    return typer.Option("--out", help=f"results folder (default runs/<time>-{kind})")


ModelOpt = Annotated[Optional[str], _model_opt("convnet")]
DataOpt = Annotated[Optional[str], _choice("--data", DATASET_NAMES, "(default photos)", rich_help_panel=CAPTURE)]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-size", help="images per update (default 1)",
                                                 rich_help_panel=CAPTURE)]
NumOpt = Annotated[Optional[int], typer.Option("--num-images",
                                               help="private images in all (a multiple of --batch-size) "
                                                    "(default 1)", rich_help_panel=CAPTURE)]
ImageSeedOpt = Annotated[Optional[int], _seed_opt("which images (default 0)", "--image-seed",
                                                     rich_help_panel=CAPTURE)]
SizeOpt = Annotated[Optional[int], typer.Option("--image-size", help="pixels per side (default 32)",
                                                rich_help_panel=CAPTURE)]
WidthOpt = Annotated[Optional[int], typer.Option("--width", help="model width (convnet 64, resnet18 64, "
                                                 "mlp 500, cnn 32 by default; lenet has none)",
                                                 rich_help_panel=CAPTURE)]
DefenseOpt = Annotated[Optional[str], typer.Option("--defense",
                                                   help="defense chain, e.g. prune:0.5,gaussian:0.1 "
                                                        "(gaussian:σ laplace:b prune:p topk:p clip:c) "
                                                        "(default none)", rich_help_panel=CAPTURE,
                                                   callback=_defense_chain)]
TrainOpt = Annotated[Optional[int], typer.Option("--train-steps", help="SGD steps on other images before "
                                                 "the round (default 0)", rich_help_panel=CAPTURE)]
KnowsLabelsOpt = Annotated[Optional[bool], typer.Option("--knows-labels/--no-knows-labels",
                                                        help="grant the server the labels "
                                                             "(default no)", rich_help_panel=CAPTURE)]
UpdateOpt = Annotated[Optional[str], _choice("--update", UPDATE_NAMES, "(default fedsgd)", rich_help_panel=CAPTURE)]
LocalStepsOpt = Annotated[Optional[int], typer.Option("--local-steps", help="FedAvg local steps "
                                                      "(default 1)", rich_help_panel=CAPTURE)]
BnStatsOpt = Annotated[Optional[str], _choice("--bn-stats", BN_STATS_NAMES, "(BatchNorm statistics on the client; "
                                              "default batch)", rich_help_panel=CAPTURE)]
LocalLrOpt = Annotated[Optional[float], typer.Option("--local-lr", help="FedAvg local learning rate "
                                                     "(default 0.1)", rich_help_panel=CAPTURE)]


CaseOpt = Annotated[Optional[Path], typer.Option("--case", help="case folder from `leaklab capture`; without it, "
                                                "the capture options make one in OUT/case")]
_CAPTURE_FIELDS = ("model", "data", "batch_size", "num_images", "image_seed", "image_size", "width",
                   "defense", "train_steps", "knows_labels", "update", "local_steps", "local_lr", "bn_stats")


def _capture_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The capture options among a command's parameters (the one-shot attack forms)."""
    return {name: options[name] for name in _CAPTURE_FIELDS}


def _capture_config(seed: int | None, **fields: Any):
    from leaklab.experiments.capture import CaptureConfig

    given = {k: v for k, v in fields.items() if v is not None}
    if "local_lr" in given and given.get("update", "fedsgd") == "fedsgd":
        raise LeaklabError("--local-lr applies to FedAvg updates; add --update fedavg")
    if seed is not None:
        given["seed"] = seed
    return CaptureConfig(**given)


# --------------------------------------------------------------------------------------------
# commands


@app.command()
@_guard
def capture(
    out: Annotated[Path, typer.Option("--out", help="case folder to write")],
    model: ModelOpt = None, data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None,
    seed: Annotated[Optional[int], _seed_opt("model initialisation and defense noise (default 0)")] = None,
    train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None, update: UpdateOpt = None,
    local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None, bn_stats: BnStatsOpt = None,
) -> None:
    """Capture what the server sees of a client round (view, model, updates) and the client's truth."""
    from leaklab.experiments import capture as capture_mod

    config = _capture_config(seed, **_capture_fields(locals()))
    result = capture_mod.run(config, out)
    typer.echo(f"wrote {out}: {plural(len(result.updates), 'update')} of {plural(config.batch_size, 'image')}, "
               f"model {result.spec.name}, defense {result.defense or 'none'}")


def _attack_opt(flag: str, text: str, field: str, more: str = "", key: str | None = None) -> Any:
    """An attack option whose help ends with its default (``key``: of a mapping field) and ``more``,
    read from :class:`InversionConfig`, the one place the default is set; a field of named values
    (a ``Literal``) is a :func:`_choice` of those names, ``text`` then saying what it is."""
    from typing import Literal, get_args, get_origin

    from leaklab.attacks.inversion.config import InversionConfig

    value = getattr(InversionConfig(), field)
    default = f"default {value if key is None else value[key]}{more}"
    annotation = InversionConfig.model_fields[field].annotation
    if get_origin(annotation) is Literal:
        return _choice(flag, get_args(annotation), f"({text}; {default})" if text else f"({default})",
                       rich_help_panel=ATTACK)
    return typer.Option(flag, help=f"{text} ({default})", rich_help_panel=ATTACK)


@attack_app.command("inversion")
@_guard
def attack_inversion(
    out: Annotated[Path, typer.Option("--out", help="results folder to write")],
    case: CaseOpt = None,
    objective: Annotated[Optional[str], _attack_opt("--objective", "", "objective")] = None,
    optimizer: Annotated[Optional[str], _attack_opt("--optimizer", "", "optimizer")] = None,
    iterations: Annotated[Optional[int], _attack_opt("--iterations", "optimisation steps", "iterations")] = None,
    lr: Annotated[Optional[float], _attack_opt("--lr", "step size", "lr", "; lbfgs 1")] = None,
    schedule: Annotated[Optional[str], _attack_opt("--schedule", "the learning rate's", "schedule")] = None,
    tv: Annotated[Optional[float], _attack_opt("--tv", "total-variation prior weight, 0: off", "priors",
                                               "; lbfgs 0", key="tv")] = None,
    prior: Annotated[Optional[list[str]], typer.Option("--prior", help="NAME=WEIGHT, repeatable "
                                                       "(tv, range, l2)", rich_help_panel=ATTACK)] = None,
    restarts: Annotated[Optional[int], _attack_opt("--restarts", "independent starts, the best kept",
                                                   "restarts")] = None,
    precision: Annotated[Optional[str], _attack_opt("--precision", "", "precision")] = None,
    init: Annotated[Optional[str], _attack_opt("--init", "the starting images", "init")] = None,
    mc_samples: Annotated[Optional[int], _attack_opt("--mc-samples", "k of Algorithm 1 (bayes)", "mc_samples")] = None,
    mc_radius: Annotated[Optional[float], _attack_opt("--mc-radius", "delta of Algorithm 1", "mc_radius")] = None,
    config_file: Annotated[Optional[Path], typer.Option("--config", help="YAML/JSON file of "
                                                        "InversionConfig fields; options override it",
                                                        rich_help_panel=ATTACK)] = None,
    seed: Annotated[Optional[int], _seed_opt("attack seed (and, one-shot, the capture seed) (default 0)")] = None,
    model: ModelOpt = None, data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None, train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None,
    update: UpdateOpt = None, local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None,
    bn_stats: BnStatsOpt = None,
) -> None:
    """Gradient inversion (DLG, Inverting Gradients, Bayes) of every update of a case."""
    from leaklab.experiments import image_attack
    from leaklab.io import read_config

    capture_fields = _capture_fields(locals())
    base = read_config(config_file) if config_file else None
    if base is not None:  # the file's own mistakes named in the file, not as options never typed
        from leaklab.attacks.inversion.config import InversionConfig

        try:  # as written: `restarts: true` is not 1, `seed: 2.0` not 2
            InversionConfig.model_validate(base, strict=True)
            image_attack.inversion_config(base)
        except ValidationError as e:
            raise LeaklabError(validation_message(e, f"--config {config_file}")) from None
    config = image_attack.inversion_config(
        base, objective=objective, optimizer=optimizer, iterations=iterations, lr=lr, schedule=schedule,
        priors=image_attack.parse_priors(prior, tv), restarts=restarts, precision=precision, init=init,
        mc_samples=mc_samples, mc_radius=mc_radius, seed=seed)
    _attack(out, case, "inversion", config, seed, capture_fields)


@attack_app.command("analytic")
@_guard
def attack_analytic(
    out: Annotated[Path, typer.Option("--out", help="results folder to write")],
    case: CaseOpt = None,
    seed: Annotated[Optional[int], _seed_opt("one-shot capture seed (default 0)")] = None,
    model: Annotated[Optional[str], _model_opt("mlp")] = None,
    data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None, train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None,
    update: UpdateOpt = None, local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None,
    bn_stats: BnStatsOpt = None,
) -> None:
    """Exact recovery of the input of a first fully connected layer (MLP, one image per update)."""
    capture_fields = _capture_fields(locals())
    if case is not None and seed is not None:
        raise LeaklabError("--seed is the one-shot capture's seed; the analytic attack of --case draws nothing")
    if case is None and capture_fields["model"] is None and any(v is not None for v in capture_fields.values()):
        capture_fields["model"] = "mlp"  # the one model whose first layer is fully connected
    _attack(out, case, "analytic", None, seed, capture_fields)


def _attack(out: Path, case: Path | None, method: str, config, seed: int | None,
            capture_fields: dict[str, Any]) -> None:
    from leaklab.experiments import image_attack

    given = sorted("--" + k.replace("_", "-") for k, v in capture_fields.items() if v is not None)
    with _progress() as progress:
        if case is not None:
            if given:
                raise LeaklabError(f"--case reads a captured case; capture options ({', '.join(given)}) "
                                   "belong to the one-shot form without --case")
            results = image_attack.run(case, out, method, config, progress=progress)
        else:
            if not given:
                raise LeaklabError("give --case CASE, or capture options (--model, --data, ...) to "
                                   "capture and attack in one go")
            capture_config = _capture_config(seed, **capture_fields)
            results = image_attack.run_oneshot(capture_config, out, method, config, progress=progress)
    _echo_summary(out, results)


# --------------------------------------------------------------------------------------------
# gradient inversion on reinforcement learning (seed 000): QGI and RGI

SettingOpt = Annotated[str, _choice("--setting", SETTING_NAMES, "(S1: RGB + depth + box; S2: depth + box)")]
ModeOpt = Annotated[str, _choice("--mode", ROOM_MODE_NAMES, "(exact: leaklab's closed-form recovery, then the "
                                 "images; paper: section IV as written)")]
ArchOpt = Annotated[str, _choice("--arch", ARCH_NAMES, "(the perception network: a conv stream per modality: "
                                 "small, nature at the Nature DQN's widths, deep with pooling; stacked: RGB-D "
                                 "in one)")]
WorkersOpt = Annotated[int, typer.Option("--workers", help="attack processes (0: one per core; audit --quick: one)",
                                        callback=_checked("--workers", lambda v: v >= 0, "0 (one per core) or more"))]
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
                                             "round (0: initialised network)")]
RoomDefenseOpt = Annotated[Optional[str], typer.Option("--defense", help="defense chain the clients apply, "
                                                       "e.g. clip:1,gaussian:0.5 (default none)",
                                                       callback=_defense_chain)]


def _room_attack(algorithm: str, setting: str, mode: str, arch: str, samples: int, layouts: str | None,
                 seed: int, iterations: int | None, batch_size: int, train_steps: int, defense: str | None,
                 workers: int, device: str, layerwise: bool, out: Path) -> None:
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.device import require_device
    from leaklab.experiments import room_attack
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


def _room_summary_line(s: dict[str, Any], defended: bool) -> str:
    """What a room-attack summary says leaked: the images against their baselines, box, action, and
    the Q-value or reward errors (``defended``: of updates behind a defense)."""
    from leaklab.experiments import room_attack

    parts = []
    for image in ("rgb", "depth"):
        if s.get(f"{image}_psnr_mean") is not None:
            parts.append(f"{image} PSNR {s[f'{image}_psnr_mean']:.2f} dB (baseline "
                         f"{s[f'{image}_psnr_baseline_mean']:.2f}), SSIM {s[f'{image}_ssim_mean']:.3f}")
    parts.append(f"box IoU {s['iou_mean']:.4f}, action {room_attack.action_share(s, defended)}")
    if s.get("q_target_err_mean") is not None:
        parts.append(f"predicted-Q error {s['q_pred_err_mean']:.3g}%, target-Q error {s['q_target_err_mean']:.3g}%")
    if s.get("reward_abs_err_mean") is not None:
        parts.append(f"reward error {s['reward_abs_err_mean']:.3g}")
    return "; ".join(parts)


def _room_command(algorithm: str, doc: str) -> Callable:
    def command(
        out: Annotated[Path, typer.Option("--out", help="results folder to write")],
        setting: SettingOpt = "S2", mode: ModeOpt = "exact", arch: ArchOpt = "small",
        samples: SamplesOpt = 4, layouts: LayoutsOpt = None,
        seed: Annotated[int, _seed_opt("network, rooms and attack seed")] = 0,
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
    return _guard(command)


attack_app.command("qgi")(_room_command(
    "qgi", "QGI: reconstruct a DQN client's room (images, box), action and target Q-value from its "
           "gradient (seed 000)."))
attack_app.command("rgi")(_room_command(
    "rgi", "RGI: reconstruct a REINFORCE client's room (images, box), action and reward from its "
           "gradient (seed 000)."))


env_app = typer.Typer(no_args_is_help=True, help="The reinforcement-learning environments.")
app.add_typer(env_app, name="env")


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
                                           "small)")] = None,
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
    from leaklab.experiments.room_attack import task_progress
    from leaklab.rl.envs.layouts import layouts_arg
    from leaklab.models import PerceptionSpec
    from leaklab.rl.capture import RoomCaptureConfig, capture_rooms

    if arch is not None and model_class is not None:
        raise LeaklabError("--arch picks one of leaklab's networks, --model-class your own; give one of them")
    if entropy_weight is not None and algorithm != "reinforce":
        raise LeaklabError("--entropy-weight is the REINFORCE clients' alpha; add --algorithm reinforce")
    arch = arch or "small"
    spec = PerceptionSpec(setting=setting, arch=arch)
    config = RoomCaptureConfig(algorithm=algorithm, spec=spec, layouts=layouts_arg(layouts), samples=samples,
                               batch_size=batch_size, train_steps=train_steps, policy=policy,
                               defense=defense, model_class=model_class, seed=seed,
                               **({} if entropy_weight is None else {"entropy_weight": entropy_weight}))
    with _progress() as progress:
        folders = capture_rooms(config, out, task_progress(progress, f"capture {algorithm} {setting}",
                                                           samples * batch_size))
    behind = f", behind {defense}" if config.defense else ""
    network, own = (model_class, f" --model-class {model_class}") if model_class else (f"{arch} network", "")
    typer.echo(f"wrote {out}: {plural(len(folders), algorithm + ' update')} of "
               f"{plural(batch_size, 'transition')}, {setting}, "
               f"{network}{behind} (their states: {out / 'capture.png'}); attack them with "
               f"`leaklab audit --cases {out}{own}`")


def _split(values: list[str] | None, sep: str = ",") -> list[str] | None:
    if not values:
        return None
    return [part.strip() for v in values for part in v.split(sep) if part.strip()]


@reproduce_app.command("bayes-table2")
@_guard
def reproduce_bayes_table2(
    quick: Annotated[bool, typer.Option("--quick", help="a small, fast version (tests)")] = False,
    datasets: Annotated[Optional[list[str]], typer.Option("--datasets", help="repeatable or comma-separated, e.g. "
                                                          "digits,photos", callback=_some("--datasets"))] = None,
    defenses: Annotated[Optional[list[str]], typer.Option("--defenses", help="repeatable; one defense chain each, "
                                                          "chains separated by ';'",
                                                          callback=_some("--defenses"))] = None,
    steps: Annotated[Optional[list[str]], typer.Option("--steps", help="train steps, e.g. 0,500",
                                                       callback=_each("--steps", str.isdigit,
                                                                      "whole numbers of train steps, e.g. 0,500"))
                     ] = None,
    images: Annotated[Optional[int], typer.Option("--images", help="images per setting")] = None,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("bayes-table2")] = None,
) -> None:
    """Seed 001 Table 2: Bayes-optimal adversary vs L2/L1/cosine under noise and pruning defenses."""
    from leaklab.experiments import bayes_table2
    from leaklab.io import new_run_dir

    step_values = [int(s) for s in _split(steps) or []] or None
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


PUBLISHED_SAMPLES = 48  # the acceptance protocol of the tables in docs/reproductions.md


def _room_table(name: str, out: Path | None, update_docs: bool, samples: int,
                run: Callable[[Path, Any], dict]) -> None:
    import shlex

    from leaklab.experiments import room_tables
    from leaklab.io import new_run_dir

    if update_docs and samples < PUBLISHED_SAMPLES:
        raise LeaklabError(f"--update-docs replaces a published table ({PUBLISHED_SAMPLES} samples per cell or "
                           f"more); run {plural(samples, 'sample')} without it")
    if update_docs and not room_tables.DOCS.is_file():
        raise LeaklabError(f"{room_tables.DOCS} not found; run --update-docs from the repository root")
    out = out or new_run_dir(name)
    # Not atomic on purpose: every finished cell is kept and a rerun resumes.
    with _progress() as progress:
        result = run(out, progress)
    typer.echo(result["markdown"])
    typer.echo(f"wrote {out / 'results.json'} and {out / 'table.md'}")
    if update_docs:
        command = "leaklab " + " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--update-docs")
        typer.echo(f"updated {room_tables.update_docs(result['section'], result['markdown'], command)}")


RoomSamplesOpt = Annotated[int, typer.Option("--samples", help="samples per cell")]
UpdateDocsOpt = Annotated[bool, typer.Option("--update-docs", help="write the table into "
                                             "docs/reproductions.md (run from the repository root)")]


@reproduce_app.command("room-table1")
@_guard
def reproduce_room_table1(
    mode: ModeOpt = "paper", samples: RoomSamplesOpt = 48, layouts: LayoutsOpt = None,
    iterations: IterationsOpt = None, arch: ArchOpt = "small",
    seed: SeedOpt = 0,
    workers: WorkersOpt = 0,
    device: DeviceOpt = "cpu",
    cells: Annotated[Optional[str], typer.Option("--cells", help="comma-separated subset of "
                                                 f"{', '.join(TABLE1_CELLS)} (default all)",
                                                 callback=_each("--cells", TABLE1_CELLS.__contains__,
                                                                "choose " + " | ".join(TABLE1_CELLS)))] = None,
    out: Annotated[Optional[Path], _run_out("room-table1")] = None,
    update_docs: UpdateDocsOpt = False,
) -> None:
    """Seed 000 Table I: QGI and RGI in S1 and S2 on the ViZDoom rooms, beside the paper's numbers."""
    from leaklab.experiments import room_tables
    from leaklab.rl.envs.layouts import layouts_arg

    chosen = layouts_arg(layouts)
    _room_table("room-table1", out, update_docs, samples, lambda o, p: room_tables.table1(
        o, mode=mode, samples=samples, layouts=chosen, iterations=iterations, arch=arch, seed=seed,
        workers=workers, device=device, progress=p,
        **({"cells": tuple(_split([cells]))} if cells else {})))


@reproduce_app.command("room-table2")
@_guard
def reproduce_room_table2(
    samples: RoomSamplesOpt = 48, layouts: LayoutsOpt = None, iterations: IterationsOpt = None,
    arch: ArchOpt = "small", seed: SeedOpt = 0,
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
    _room_table("room-table2", out, update_docs, samples, lambda o, p: room_tables.table2(
        o, samples=samples, layouts=chosen, iterations=iterations, arch=arch, seed=seed, workers=workers,
        device=device, progress=p))


@reproduce_app.command("inversion-checks")
@_guard
def reproduce_inversion_checks(
    checks: Annotated[Optional[list[str]], typer.Option("--checks", help="dlg, idlg, analytic, ig, ig_batch_stats "
                                                        "(IG on a BatchNorm client in training mode; repeatable or "
                                                        "comma-separated; default all but ig_batch_stats)",
                                                        callback=_each("--checks", INVERSION_CHECK_NAMES.__contains__,
                                                                       "choose " + " | ".join(INVERSION_CHECK_NAMES)))
                      ] = None,
    images: Annotated[Optional[int], typer.Option("--images", help="images of the dlg and analytic checks "
                                                  "(ig: at most 3; idlg always 50, 5 with --quick)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="a small, fast version (tests)")] = False,
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


@reproduce_app.command("dp-vs-inversion")
@_guard
def reproduce_dp_vs_inversion(
    quick: Annotated[bool, typer.Option("--quick", help="a seconds-long version (tests)")] = False,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], _run_out("dp-vs-inversion")] = None,
) -> None:
    """DP-SGD on MNIST at epsilon 3 (accuracy beside non-private) and inversion PSNR vs epsilon."""
    from leaklab.experiments import dp_vs_inversion
    from leaklab.io import new_run_dir

    make = dp_vs_inversion.DpVsInversionConfig
    config = make.quick(seed) if quick else make(seed=seed)
    out = out or new_run_dir("dp-vs-inversion")
    with _progress() as progress:
        result = dp_vs_inversion.run(out, config, quick=quick, progress=progress)
    u = result["utility"]
    typer.echo(f"wrote {out / 'results.json'}")
    typer.echo(f"  DP-SGD epsilon {u['private']['epsilon']:.3f} (delta {u['private']['delta']:g}): test accuracy "
               f"{100 * u['private']['accuracy']:.1f}%, non-private {100 * u['non_private']['accuracy']:.1f}%")
    for row in result["attack"]["rows"]:
        typer.echo(f"  epsilon {row['epsilon']:>6s}: PSNR {row['psnr_mean']:6.2f} dB "
                   f"(baseline {row['psnr_baseline_mean']:.2f}), noise multiplier {row['noise_multiplier']:.4g}")


@app.command()
@_guard
def audit(
    out: Annotated[Optional[Path], _run_out("audit")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="a seconds-long version (tests)")] = False,
    full: Annotated[bool, typer.Option("--full", help="the paper-scale protocol (48 samples from every "
                                       "room, S1 and S2, exact and paper mode; about 7 h on 2 cores)")] = False,
    cases: Annotated[Optional[Path], typer.Option("--cases", help="attack your own saved room cases "
                                                  "(folders as `leaklab env capture` writes them) instead")] = None,
    model_class: Annotated[Optional[str], typer.Option("--model-class", help="with --cases: your own "
                                                       "perception network, package.module:Class")] = None,
    mode: Annotated[Optional[str], _choice("--mode", ROOM_MODE_NAMES, "(default exact; --full runs both)")] = None,
    arch: Annotated[Optional[str], _choice("--arch", ARCH_NAMES, "(the robots' perception network; default "
                                           "small)")] = None,
    iterations: IterationsOpt = None,
    kind: Annotated[str, _choice("--kind", AUDIT_KIND_NAMES, "(rooms: federated RL; images: image classifiers, "
                                 "DLG, which takes only --quick, --seed and --out)")] = "rooms",
    workers: WorkersOpt = 0,
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
                                             ("--workers", workers), ("--device", device != "cpu")) if used]
            if given:
                raise LeaklabError(f"{', '.join(given)}: only for --kind rooms (--kind images takes --quick, "
                                   "--seed and --out)")
            _image_audit(out, quick, seed, progress)
            return
        from leaklab.attacks.rl import RoomAttackConfig
        from leaklab.device import require_device
        from leaklab.experiments import room_attack, room_audit

        require_device(device)  # before the configs: one plain line for a bad name
        if cases is not None:
            if quick or full:
                raise LeaklabError("--cases attacks the saved updates as they are; drop --quick/--full (for a "
                                   "faster, rougher look: --iterations 1000, half the default)")
            if arch is not None:
                raise LeaklabError("--arch: the cases' view.json names their network (your own: --model-class)")
            attack = RoomAttackConfig(mode=mode or "exact", seed=seed,
                                      **({"iterations": iterations} if iterations is not None else {}))
            results = room_audit.run_cases(out, cases, attack, workers=workers, progress=progress,
                                           model_class=model_class, device=device)
            s = results["summary"]
            typer.echo(f"wrote {out / 'report.html'}: {plural(s['cases'], 'case')}, {s['scored']} scored"
                       + _resumed(s["resumed_attacks"], ", {} resumed from an interrupted run")
                       + (f"; {_room_summary_line(s, any(r['defense'] for r in results['cases']))}"
                          if s["scored"] else ""))
            return
        if model_class is not None:
            raise LeaklabError("--model-class belongs to --cases (your saved updates of your network)")
        if full and mode is not None:
            raise LeaklabError("--full runs exact and paper mode; drop --mode")
        config = room_audit.default_config(quick=quick, full=full, seed=seed)
        overrides = {k: v for k, v in (("iterations", iterations), ("workers", workers or None), ("arch", arch))
                     if v is not None}
        overrides["device"] = device
        if mode is not None and not full:
            overrides["modes"] = (mode,)
        config = room_audit.AuditConfig(**{**config.model_dump(), **overrides})
        results = room_audit.run(out, config, progress=progress)
    typer.echo(f"wrote {out / 'report.html'} ({results['summary']['seconds']:.0f} s"
               + _resumed(results["summary"]["resumed_attacks"], "; {} attacks resumed from an interrupted run") + ")")
    for cell in results["cells"]:
        s = cell["summary"]
        images = ", ".join(f"{im} PSNR {s[f'{im}_psnr_mean']:.2f} dB (baseline {s[f'{im}_psnr_baseline_mean']:.2f})"
                           for im in ("rgb", "depth") if s.get(f"{im}_psnr_mean") is not None)
        typer.echo(f"  {cell['algorithm'].upper()} {cell['setting']} {cell['mode']:5s} {cell['defense']:18s} "
                   f"{images}, box IoU {s['iou_mean']:.3f}, "
                   f"action {room_attack.action_share(s, cell['defense_chain'] is not None)}")


def _image_audit(out: Path, quick: bool, seed: int, progress: Callable[..., None]) -> None:
    from leaklab.experiments import image_audit

    results = image_audit.run(out, quick=quick, seed=seed, progress=progress)
    typer.echo(f"wrote {out / 'report.html'} ({results['summary']['seconds']:.0f} s)")
    for row in results.get("settings", []):
        s = row["summary"]
        typer.echo(f"  {row['scenario']:28s} {row['defense']:26s} PSNR {s['psnr_mean']:6.2f} dB "
                   f"(baseline {s['psnr_baseline_mean']:5.2f}), SSIM {s['ssim_mean']:.3f}")


# --------------------------------------------------------------------------------------------
# differential-privacy mechanisms (leaklab.privacy)

mechanisms_app = typer.Typer(no_args_is_help=True, help="Differential-privacy mechanisms: their epsilon, "
                                                        "DP-SGD accounting, and empirical audits.")
mechanisms_epsilon_app = typer.Typer(no_args_is_help=True, help="The (epsilon, delta) a mechanism claims.")
mechanisms_account_app = typer.Typer(no_args_is_help=True, help="Privacy accounting of repeated mechanism "
                                                                "uses (opacus, dp-accounting).")
app.add_typer(mechanisms_app, name="mechanisms")
mechanisms_app.add_typer(mechanisms_epsilon_app, name="epsilon")
mechanisms_app.add_typer(mechanisms_account_app, name="account")

JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object on stdout (for scripts)")]


def _echo_json(payload: dict) -> None:
    import json

    typer.echo(json.dumps(payload, indent=2, sort_keys=True))


@mechanisms_epsilon_app.command("dirichlet")
@_guard
def mechanisms_epsilon_dirichlet(
    eta: Annotated[float, typer.Option("--eta", help="lower bound on every protected entry p_i, i in W")],
    eta_bar: Annotated[float, typer.Option("--eta-bar", help="mass kept outside W: sum_W p_i <= 1 - eta_bar")],
    k: Annotated[float, typer.Option("--k", help="concentration: the output is Dirichlet(k p)")],
    b: Annotated[float, typer.Option("--b", help="adjacency: ||p - q||_1 <= b")] = 0.1,
    w: Annotated[int, typer.Option("--w", help="|W|, the number of protected entries")] = 3,
    delta: Annotated[float, typer.Option("--delta", help="target delta")] = 0.05,
    as_json: JsonOpt = False,
) -> None:
    """Epsilon of the Dirichlet mechanism (seed 003, Theorem 1.6) at a target delta."""
    from leaklab.privacy.mechanisms import DirichletMechanism, dirichlet_epsilon_approx

    m = DirichletMechanism(k=k, eta=eta, eta_bar=eta_bar, b=b, w=w, delta=delta)
    approx = dirichlet_epsilon_approx(eta, eta_bar, k, b, w, m.gamma)
    payload = {"mechanism": "dirichlet", "k": k, "eta": eta, "eta_bar": eta_bar, "b": b, "w": w,
               "delta": delta, "gamma": m.gamma, "epsilon": m.epsilon, "epsilon_approx": approx}
    if as_json:
        _echo_json(payload)
        return
    typer.echo(f"Dirichlet mechanism k={k:g}, eta={eta:g}, eta_bar={eta_bar:g}, b={b:g}, |W|={w}: "
               f"epsilon {m.epsilon:.4f} at delta {delta:g} (gamma {m.gamma:.5g}; Lemma 1.7 bound {approx:.4f})")


@mechanisms_account_app.command("dpsgd")
@_guard
def mechanisms_account_dpsgd(
    q: Annotated[float, typer.Option("--q", help="sampling rate (expected batch size / dataset size), in (0, 1]")],
    sigma: Annotated[float, typer.Option("--sigma", help="noise multiplier: noise std / clipping norm")],
    steps: Annotated[int, typer.Option("--steps", help="DP-SGD steps")],
    delta: Annotated[float, typer.Option("--delta", help="target delta, in (0, 1)")] = 1e-5,
    accountant: Annotated[str, _choice("--accountant", ACCOUNTANT_NAMES,
                                       "(rdp, prv: opacus' accountants; pld: dp-accounting's)")] = "prv",
    as_json: JsonOpt = False,
) -> None:
    """Epsilon spent by DP-SGD (Poisson-subsampled Gaussian mechanism, composed over the steps)."""
    from leaklab.privacy.accounting import dpsgd_epsilon

    epsilon = dpsgd_epsilon(q, sigma, steps, delta, accountant)
    payload = {"mechanism": "dpsgd", "q": q, "sigma": sigma, "steps": steps, "delta": delta,
               "accountant": accountant, "epsilon": epsilon}
    if as_json:
        _echo_json(payload)
        return
    typer.echo(f"DP-SGD q={q:g}, sigma={sigma:g}, {plural(steps, 'step')}: epsilon {epsilon:.4f} at delta {delta:g} "
               f"({accountant} accountant)")


@mechanisms_app.command("audit")
@_guard
def mechanisms_audit(
    mechanism: Annotated[str, _choice("--mechanism", (*MECHANISM_NAMES, "dpsgd"), aliases=MECHANISM_ALIASES)],
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="claimed epsilon (not for dirichlet, "
                                                     "whose follows from --k ..., nor dpsgd, from --q ...)")] = None,
    delta: Annotated[Optional[float], typer.Option("--delta", help="claimed delta (gaussian 1e-5, "
                                                   "dirichlet 0.05, dpsgd 1e-5)")] = None,
    runs: Annotated[Optional[int], typer.Option("--runs", help="runs on each of the two inputs (100000); "
                                                "dpsgd: training runs (10)")] = None,
    seed: SeedOpt = 0,
    confidence: Annotated[float, typer.Option("--confidence", help="of the lower bound")] = 0.95,
    test: Annotated[str, _choice("--test", AUDIT_TEST_NAMES, "(split: threshold chosen on half the runs; scan: "
                                 "all thresholds, Bonferroni-corrected)")] = "split",
    broken: Annotated[bool, typer.Option("--broken", help="halve the noise scale, keep the claim "
                                         "(the audit should catch it)")] = False,
    k: Annotated[Optional[float], typer.Option("--k", help="dirichlet concentration (6.7) or "
                                               "randomized-response categories (4)")] = None,
    eta: Annotated[Optional[float], typer.Option("--eta", help="dirichlet (0.15)")] = None,
    eta_bar: Annotated[Optional[float], typer.Option("--eta-bar", help="dirichlet (0.15)")] = None,
    b: Annotated[Optional[float], typer.Option("--b", help="dirichlet (0.1)")] = None,
    w: Annotated[Optional[int], typer.Option("--w", help="dirichlet (3)")] = None,
    q: Annotated[Optional[float], typer.Option("--q", help="dpsgd sampling rate, in (0, 1]")] = None,
    sigma: Annotated[Optional[float], typer.Option("--sigma", help="dpsgd noise multiplier")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="dpsgd training steps")] = None,
    canaries: Annotated[Optional[int], typer.Option("--canaries", help="dpsgd gradient canaries per "
                                                    "training run (even; default 1000)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Empirical lower bound on epsilon (Clopper-Pearson) from runs on two neighbouring inputs.

    dpsgd: from gradient canaries in opacus DP-SGD trainings."""
    from leaklab.privacy.audit import audit, audit_case, audit_dpsgd

    dpsgd = {"--q": q, "--sigma": sigma, "--steps": steps, "--canaries": canaries}
    if mechanism == "dpsgd":
        others = {"--epsilon": epsilon, "--k": k, "--eta": eta, "--eta-bar": eta_bar, "--b": b, "--w": w}
        if any(v is not None for v in others.values()):
            given = ", ".join(o for o, v in others.items() if v is not None)
            raise LeaklabError(f"--mechanism dpsgd takes no {given}: its epsilon follows from --q, --sigma, "
                               "--steps and --delta")
        missing = [o for o, v in dpsgd.items() if v is None and o != "--canaries"]
        if missing:
            raise LeaklabError(f"--mechanism dpsgd needs {', '.join(missing)}")
        result = audit_dpsgd(q, sigma, steps, 1e-5 if delta is None else delta,
                             canaries=1000 if canaries is None else canaries,
                             runs=10 if runs is None else runs, seed=seed, confidence=confidence, test=test,
                             broken=broken)
    else:
        if any(v is not None for v in dpsgd.values()):
            raise LeaklabError(f"{', '.join(o for o, v in dpsgd.items() if v is not None)}: only for "
                               "--mechanism dpsgd")
        case = audit_case(mechanism, epsilon, broken=broken, delta=delta, eta=eta, eta_bar=eta_bar, b=b, w=w, k=k)
        result = audit(case, runs=100_000 if runs is None else runs, seed=seed, confidence=confidence, test=test)
    payload = result.to_dict()
    payload["broken"] = broken
    if as_json:
        _echo_json(payload)
        return
    verdict = "VIOLATED" if payload["violated"] else "consistent"
    d = result.details
    source = (f"{result.runs} canary scores per side ({plural(d['training_runs'], 'training run')} of "
              f"{d['canaries']} canaries)") if result.mechanism == "dpsgd" else f"{result.runs} runs per input"
    typer.echo(f"{result.mechanism}{' (broken)' if broken else ''}: claimed epsilon {result.claimed_epsilon:.4g} "
               f"(delta {result.claimed_delta:g}); audited lower bound {result.epsilon_lower_bound:.4f} "
               f"at confidence {result.confidence:g} from {source}: {verdict}")


def main() -> None:  # pragma: no cover - console entry for `python -m leaklab.cli`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
