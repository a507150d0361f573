"""Progress on stderr: a rich bar on a terminal, a plain line every :data:`PLAIN_EVERY` seconds
elsewhere (a log file, CI).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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
    one line). The time left is the task's rate since its count first moved, over what remains, or since its
    first report while it has moved only once (a task counting whole steps from 1 would otherwise wait a step
    longer for its estimate): from its first report alone, the default audit's first line said 1:40:31 left of an 8-minute
    run (session 66), its workers' start-up (8 s before the first attack's first report) counted as work. No
    estimate until the count has moved by a whole step (a twentieth of a count under 20) from where it is rated."""
    start = last = clock()
    said = ""
    first: dict[str, tuple[float, float]] = {}  # task -> (time, completed) when first reported
    moved: dict[str, tuple[float, float]] = {}  # task -> (time, completed) when its count first moved from there

    def update(*args: Any, **kwargs: Any) -> None:
        nonlocal last, said
        name, completed, total = _progress_args(args, kwargs)
        now = clock()
        if completed is not None and first.setdefault(name, (now, completed))[1] != completed:
            moved.setdefault(name, (now, completed))
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
        if total is not None and not finished and completed is not None:
            anchors = [anchor for anchor in (moved.get(name), first.get(name)) if anchor is not None]
            # from a whole step's move on (a twentieth of a short count's): the audit's attacks reporting their first
            # steps, 0.05 of one in the first 30 s, said 3:30:50 left of a 10-minute run (session 69)
            least = min(1.0, total / 20)
            rated = [(t, c) for t, c in anchors if completed - c >= least and now > t]
            if rated:
                since, before = rated[0]
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
    with bars:
        yield _bar_progress(bars)


def _bar_progress(bars: Any) -> Callable[..., None]:
    """The progress callback drawing rich bars (a ``rich.progress.Progress``): one bar whose description
    follows the work (the reproductions name each step of one count), and a new one when work goes on
    after the bar is full. A full bar stops its clock for good: the attacks after a capture, drawn on
    the capture's bar, showed 0:00:00 elapsed and left throughout."""
    bar: dict[str, Any] = {"task": None, "full": False}

    def update(*args: Any, **kwargs: Any) -> None:
        name, completed, total = _progress_args(args, kwargs)
        full = total is not None and completed is not None and completed >= total
        if bar["task"] is None or bar["full"] and not full:
            bar["task"] = bars.add_task(name, total=total)
        bars.update(bar["task"], description=name, completed=completed, total=total)
        bar["full"] = full

    return update


def _resumed(count: int, text: str) -> str:
    """``text`` with the count of attacks taken from an interrupted run, or nothing when there were none."""
    return text.format(count) if count else ""
