"""The ``leaklab`` application: its command groups, the main callback (``--threads``, ``--version``)
and :func:`_guard`, which turns every user mistake into one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, Optional

import click
import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from leaklab.cli.options import _error_line, _fail, _option_name
from leaklab.names import MAX_THREADS
from leaklab.errors import LeaklabError, validation_message


class _Listing(TyperGroup):
    """A command group whose listing gives each command's first help paragraph as flowing text: typer's rich
    listing kept the docstring's line breaks, and a command's summary broke off mid-line. A paragraph marked
    ``\\b`` (click's: keep my line breaks) is left as written."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None or command.short_help is not None:
            return command
        first = (command.help or "").split("\n\n")[0]
        if first and not first.startswith("\b"):
            command.short_help = " ".join(first.split())
        return command


class _OneLineErrors(_Listing):
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
            if isinstance(e, click.NoSuchOption) and (hint := _option_hint(e)):
                message, where = f"no such option {e.option_name!r}", f"; {hint}"
            typer.echo(_error_line(message[:1].lower() + message[1:] + where), err=True)
            sys.exit(2)
        except click.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _option_hint(error: click.NoSuchOption) -> str:
    """Where an option a command lacks belongs: ``leaklab``'s own (``--threads``) before the command, and saved room
    cases to ``audit --cases`` (``attack qgi --case`` was offered ``--seed``); "" for any other."""
    ctx = error.ctx
    if ctx is None:
        return ""
    root = ctx.find_root()
    own = [p for p in root.command.params if error.option_name in p.opts]
    if ctx is not root and own:
        rest = "" if getattr(own[0], "is_flag", False) else \
            f" VALUE {ctx.command_path.removeprefix(root.command_path).strip()} ..."
        return f"{error.option_name} is leaklab's own option: give it before the command ({root.info_name} " \
               f"{error.option_name}{rest})"
    if error.option_name in ("--case", "--cases") and ctx.command_path.endswith(("attack qgi", "attack rgi")):
        return "saved room cases (leaklab env capture) are attacked by leaklab audit --cases DIR"
    return ""


app = typer.Typer(name="leaklab", cls=_OneLineErrors, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_show_locals=False, suggest_commands=False,
                  help="A laboratory for privacy leakage in federated learning: capture client updates, "
                       "attack them, and report how much they leak.")


def _group(text: str) -> typer.Typer:
    """A command group: its help when run without a command, its commands listed by :class:`_Listing`, and
    click's suggestion for a mistyped one (typer's own repeated it)."""
    return typer.Typer(cls=_Listing, no_args_is_help=True, suggest_commands=False, help=text)


attack_app = _group("Attack captured client updates.")
reproduce_app = _group("Reproduce published tables.")
env_app = _group("The reinforcement-learning environments.")
mechanisms_app = _group("Differential-privacy mechanisms: their epsilon, DP-SGD accounting, and empirical audits.")
mechanisms_epsilon_app = _group("The (epsilon, delta) a mechanism claims.")
mechanisms_account_app = _group("Privacy accounting of repeated mechanism uses (opacus, dp-accounting).")
plan_app = _group("Policies for tabular MDPs whose transition probabilities are private.")
app.add_typer(attack_app, name="attack")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(env_app, name="env")
app.add_typer(mechanisms_app, name="mechanisms")
mechanisms_app.add_typer(mechanisms_epsilon_app, name="epsilon")
mechanisms_app.add_typer(mechanisms_account_app, name="account")
app.add_typer(plan_app, name="plan")


# what an interrupted or terminated command leaves (_guard's ``stopped``)
NOTHING_KEPT = "nothing is left half-written"
CHECKS_KEPT = "--out holds the checks finished so far (a rerun runs every check again)"
ATTACKS_KEPT = ("--out holds no partial results; the room attacks and the room audits keep their finished attacks "
                "beside it, and the same command resumes them (an image audit keeps none)")
CELLS_KEPT = "the finished cells stay in --out, and the same command resumes from them"


def _exit_on_sigterm(stopped: str) -> None:
    """Turn SIGTERM into SystemExit, saying so in one line, so that partial output folders are removed on
    the way out; a SIGTERM more (``timeout`` sends its process group one too) waits for that to finish."""
    import signal
    import threading

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        typer.echo(f"error: terminated; {stopped}", err=True)
        sys.exit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


def _one_line_warnings() -> None:
    """Warnings print as one ``warning: ...`` line, as errors print as one ``error: ...`` line."""
    import warnings

    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"warning: {message}\n"


_run: dict[str, int | None] = {"threads": None}  # this invocation's --threads (the main callback's)


# what the file system says of the paths and space a user gives: their mistake or their machine's, one line
_USERS_FILE_SYSTEM = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS,
                      errno.ELOOP, errno.ENOTDIR}


def _guard(fn: Callable | None = None, *, stopped: str = NOTHING_KEPT) -> Callable:
    """Run a command with the torch thread count of ``--threads``; user mistakes become one ``error:``
    line and exit code 2, and Ctrl-C or SIGTERM one line saying what the command leaves (``stopped``).
    ``@_guard`` or ``@_guard(stopped=...)``."""
    if fn is None:
        return functools.partial(_guard, stopped=stopped)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _exit_on_sigterm(stopped)
        _one_line_warnings()
        try:
            from leaklab.device import configure_threads, crash_tracebacks

            crash_tracebacks()
            configure_threads(_run["threads"])
            return fn(*args, **kwargs)
        except LeaklabError as e:
            _fail(str(e))
        except ValidationError as e:
            _fail(validation_message(e, name=_option_name))
        except MemoryError as e:  # a size the machine cannot hold: one line, as a user's mistake is
            _fail(f"out of memory ({e or 'an allocation failed'}); ask for less or free memory; {stopped}")
        except OSError as e:  # the file system refuses a path the user chose (a name over 255 bytes, say)
            if e.errno not in _USERS_FILE_SYSTEM:
                raise
            _fail(f"{e.strerror}: {e.filename}; {stopped}" if e.filename else f"{e.strerror}; {stopped}")
        except KeyboardInterrupt:
            typer.echo(f"error: interrupted; {stopped}", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _print_version(value: bool) -> None:
    if value:
        from leaklab import __version__

        typer.echo(f"leaklab {__version__}")
        raise typer.Exit()


@app.callback()
def _main(threads: Annotated[Optional[int], typer.Option(
        "--threads", min=1, max=MAX_THREADS, help="torch threads for this run (default: LEAKLAB_THREADS or 1); the rooms' "
                                 "captures and attacks run on one per process whatever it says")] = None,
        show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="print leaklab's version and exit")] = False) -> None:
    """A laboratory for privacy leakage in federated learning."""
    _run["threads"] = threads  # set when a command runs (_guard): help and usage errors load no torch
