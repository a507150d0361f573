"""The one exception type for user mistakes.

Anything a user can get wrong (a bad file, an unknown name, a shape that does not fit the model)
raises :class:`LeaklabError` with a one-line message that names the problem and the fix. The CLI
prints that line and exits with code 2; no traceback is shown for such errors.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError


class LeaklabError(ValueError):
    """A user-facing error: one line naming the problem and how to fix it."""


def check_keys(data: dict, allowed: set[str], where: str) -> None:
    """Refuse a JSON object with a key outside ``allowed``, naming it: a misspelt optional key (``"defence"``,
    ``"gamma"``) was read as absent."""
    unknown = sorted(map(str, set(data) - allowed))
    if unknown:
        from leaklab.words import plural

        raise LeaklabError(f"{where} has {plural(len(unknown), 'unknown key')} ({', '.join(map(repr, unknown))}); "
                           f"it may hold {', '.join(sorted(allowed))} (docs/formats.md)")


class ModelClassError(LeaklabError):
    """The user's own network class (``--model-class``) is at fault, whatever file or case it was built
    for: its message names the class, and callers pass it on without naming the file."""


class NoSignal(LeaklabError):
    """The update lacks a gradient an attack step reads (an all-zero bias gradient, e.g. after a
    pruning defense): the room attacks then report that they recovered nothing instead of failing."""


def _short(value: object, most: int = 80) -> str:
    """``value`` as Python writes it, cut to ``most`` characters (a 2 MB value in a case file was printed whole in
    its error line), with the length of what was cut: its text's, or its digits'."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most - 20]}… ({len(str(value)):,} characters)"


def validation_message(error: ValidationError, what: str = "", name: Callable[[tuple], str] | None = None) -> str:
    """One line for a pydantic error, its first problem: ``WHAT: invalid FIELD (got VALUE): PROBLEM``, where
    FIELD is ``name(loc)`` (the CLI names its option) or the field's dotted path; a rule across several
    fields (a model validator) has no FIELD."""
    first = error.errors()[0]
    msg = " ".join(str(first.get("msg", "invalid value")).split()).removeprefix("Value error, ")
    more = f"; and {error.error_count() - 1} more problem(s)" if error.error_count() > 1 else ""
    prefix = f"{what}: " if what else ""
    loc = tuple(first.get("loc") or ())
    if not loc:
        return f"{prefix}{msg}{more}"
    got = first.get("input")
    if isinstance(got, tuple):  # a comma-separated option, as typed
        got = ",".join(map(str, got))
    shown = f" (got {_short(got)})" if got is not None and not isinstance(got, (dict, list)) else ""
    field = name(loc) if name else f"field {'.'.join(map(str, loc))!r}"
    return f"{prefix}invalid {field}{shown}: {msg}{more}"
