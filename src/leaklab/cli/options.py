"""Option helpers of the command line: one-line errors, option callbacks that check values while
options are parsed (before torch loads), and the options several commands share.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from leaklab.errors import LeaklabError
from leaklab.fields import MAX_SEED, defense_steps


CAPTURE = "Capture (client side)"
ATTACK = "Attack"

_OPTION_NAMES = {"priors": "--prior/--tv", "gaussian_sigmas": "--sigmas", "dp_epsilons": "--epsilons"}


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


def _positive_numbers(flag: str, example: str) -> Callable[[Any], Any]:
    """An option callback turning ``"1e-5,1e-3"`` into ``(1e-05, 0.001)``: distinct positive finite numbers,
    else one ``error:`` line, with ``example`` of a good value, while the command line is parsed."""

    def numbers(value: Any) -> Any:
        if value is None:
            return value
        try:
            parsed = tuple(float(v) for v in str(value).split(","))
        except ValueError:
            parsed = ()
        if not parsed or not all(0 < v < float("inf") for v in parsed) or len(set(parsed)) < len(parsed):
            _fail(f"invalid {flag} (got {value!r}): distinct positive numbers, comma-separated (e.g. {example})")
        return parsed

    return numbers


def _choice(flag: str, names: tuple[str, ...], help: str = "", aliases: dict[str, str] | None = None,
            **kwargs: Any) -> Any:
    """A ``flag`` option taking one of ``names`` (its help: the names, then ``help``) in any case, ``_`` for
    ``-``, or an alias of one; it passes on the name as spelled in ``names`` (``--setting s1`` gives
    ``S1``, ``--mechanism Randomized_Response`` and ``rr`` give ``randomized-response``)."""
    name_of = _spelling(names, aliases)

    def name(value: Any) -> Any:
        if value is None:
            return value
        if name_of(value) is None:
            _fail(f"invalid {flag} (got {value!r}): choose {' | '.join(names)}")
        return name_of(value)

    return typer.Option(flag, callback=name, help=" | ".join(names) + (f" {help}" if help else ""), **kwargs)


def _spelling(names: tuple[str, ...], aliases: dict[str, str] | None = None) -> Callable[[Any], str | None]:
    """The name of ``names`` a typed value means, in any case, ``_`` for ``-``, or an alias of one; None
    when it means none of them."""
    def key(value: Any) -> str:
        return str(value).lower().replace("_", "-")

    spelled = {key(n): n for n in names} | {key(a): n for a, n in (aliases or {}).items()}
    return lambda value: spelled.get(key(value))


def _defense_chain(value: str | None) -> str | None:
    """The ``--defense`` callback: refuses a chain that does not parse (:func:`leaklab.fields.defense_steps`)."""
    try:
        defense_steps(value)
    except LeaklabError as e:
        _fail(f"invalid --defense (got {value!r}): {e}")
    return value


def _each(flag: str, read: Callable[[str], str | None], need: str) -> Callable[[Any], Any]:
    """A callback for a repeatable or comma-separated list option, run while the command line is parsed:
    refuses an empty list (:func:`_some`) and any item ``read`` gives None for; passes on what ``read``
    gives for each item (a list, or one comma-separated string for a single option)."""

    def check(values: str | list[str] | None) -> str | list[str] | None:
        _some(flag)(values)
        if values is None:
            return values
        items = _split(values if isinstance(values, list) else [values]) or []
        read_items = [read(item) for item in items]
        bad = [item for item, got in zip(items, read_items) if got is None]
        if bad:
            _fail(f"invalid {flag} (got {bad[0]!r}): {need}")
        return read_items if isinstance(values, list) else ",".join(read_items)

    return check


def _bounded(largest: int) -> Callable[[str], str | None]:
    """An item reader for :func:`_each`: a whole number (``"²"`` is a digit but not one) up to ``largest``."""
    return lambda item: item if item.isdecimal() and int(item) <= largest else None


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


SeedOpt = Annotated[int, _seed_opt()]


OutOpt = Annotated[Path, typer.Option("--out", help="results folder to write")]
QuickOpt = Annotated[bool, typer.Option("--quick", help="a small, fast version (tests; seconds to a minute)")]


def _run_out(kind: str) -> Any:
    """``--out`` of a command whose results go to a new ``runs/<time>-<kind>`` unless given (:func:`new_run_dir`)."""
    return typer.Option("--out", help=f"results folder (default runs/<time>-{kind})")


def _split(values: list[str] | None, sep: str = ",") -> list[str] | None:
    """A list option's items, repeatable or ``sep``-separated, each once in the order given (``digits,digits``
    was recorded, and run, twice)."""
    if not values:
        return None
    return list(dict.fromkeys(part.strip() for v in values for part in v.split(sep) if part.strip()))
