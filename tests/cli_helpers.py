"""What the command-line tests share: calling `leaklab` in this process, the shape of a user error
(one `error: ...` line, exit code 2, nothing left in --out), and a Ctrl-C pressed during an attack."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from leaklab.cli import app

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
ROOM_FAST = ["--iterations", "3", "--workers", "1"]  # a room attack in seconds, in this process


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_user_error(result, out: Path | None, *words: str) -> str:
    """Exit code 2, one line `error: ...` on stderr naming the problem (each of ``words``), no traceback,
    and (``out`` given) no output folder nor a half-written one beside it; returns the line."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in result.output
    if out is not None:
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return lines[0]


class Interrupt(KeyboardInterrupt):
    """Ctrl-C, pressed by a test while the attack after the first ``after`` runs."""


def interrupt_after(after: int):
    def progress(task, done, total):
        if not task.startswith(("capture", "prepare")) and done > after:
            raise Interrupt
    return progress
