"""ViZDoom's engine processes for the rooms of :mod:`.active_perception`: started only where they can
run, tied to the Python process that started them, and what a killed process leaves removed by the next.

ViZDoom runs each game's engine as a child process and shares the game's buffers with it in POSIX
shared memory (a tmpfs at /dev/shm on Linux). Measured here (docs/reproductions.md, sessions 23-24):

* an engine that fails to start crashes the Python process waiting in ``game.init()``: ViZDoom 1.3.2's
  ``DoomController::close()``, called on the engine's exit, reads the game state from shared memory not yet
  opened (a null pointer, by gdb; so whenever the engine ends before it has started, however late): one
  trial start in a child process comes first (:func:`_engine_path`), and a Ctrl-C, which a terminal sends
  the engine too, waits until the start is over (:func:`_interrupts_held`);
* an engine that finds /dev/shm full dies of a bus error and takes the process along: at 150 px a game
  holds 0.19 MiB there (0.62 MiB at 300 px) and a layout's first start, which reads the map's objects
  and sectors, peaks at 1.1 to 4.5 MiB over the 17 layouts, so a game does not start with less than
  :data:`_SHARED_MEMORY_NEEDED` free (:func:`_check_shared_memory`);
* an engine outlives a Python process killed or crashed before it closed the game (it ignores SIGTERM)
  and holds the process's terminal or pipe open: on Linux a launcher has the kernel kill it with the
  process (:data:`_TIE_TO_PARENT`);
* the engine reads its settings file at start and writes it on close: the file lives in the process's
  private folder (:func:`_home`), and the games still open at the process's exit are closed before
  that folder goes;
* a new settings file makes the engine create ``./_vizdoom/`` where it works, and it dies (crashing the
  process) when something of that name is in the way: a user's file, or the folder another process's engine
  made a moment before (seen once, two captures started together in one folder; a file crashes every
  start): the launcher starts it in the process's private folder;
* a killed engine leaves its shared memory (0.16 MiB of pages and two message queues) and a killed
  process its folder: the next process to start a game removes them (:func:`_sweep_crashed`);
* a forked child shares its parent's games' message queues, so closing its copy of a game (its destructor
  does, at the child's exit) stops the parent's engine and then waits forever for threads that exist only
  in the parent: a forked child neither closes nor drives them (:func:`close_game`, :func:`check_own`).
"""

import atexit
import contextlib
import ctypes
import functools
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import vizdoom as vzd

from leaklab.errors import LeaklabError
from leaklab.processes import process_gone, process_scope
from leaklab.rl.envs.layouts import LAYOUTS

VIZDOOM = Path(vzd.__file__).parent  # the engine and the WADs it ships

_SHARED_MEMORY = Path("/dev/shm")
_SHARED_MEMORY_NEEDED = 8 << 20  # about twice the largest start measured
# The shared memory of an engine and its game, by instance (ViZDoom 1.3's names); the game removes it on close
_SHARED_NAMES = ("ViZDoomSM{}", "ViZDoomMQCtr{}", "ViZDoomMQDoom{}")
_TRIAL_SECONDS = 120  # a trial start of the engine (``_engine_failure``) that takes longer tells nothing
_UNTOLD = "a trial start in a child process did not end in time"

# Run by the launcher (a shell script) in the process that becomes the engine: have the kernel kill it when the
# thread that started it dies (PR_SET_PDEATHSIG, kept across exec; ViZDoom starts the engine from a thread that
# lives as long as the engine), give up if that thread's process is gone already, note the engine's instance
# in the process's folder where it can (for :func:`_sweep_crashed`), move into that folder (an engine makes
# `./_vizdoom/` where it works, and dies, taking the process along, when something of that name is in its way:
# a file, or the folder another process's engine made a moment before it) and become the engine
_TIE_TO_PARENT = """
import ctypes, os, signal, sys
parent, folder, engine, args = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
if ctypes.CDLL(None).prctl(1, signal.SIGKILL) != 0 or os.getppid() != parent:
    sys.exit(1)
if "+viz_instance_id" in args[:-1]:
    try:
        open(os.path.join(folder, "instance-" + args[args.index("+viz_instance_id") + 1]), "w").close()
    except OSError:
        pass
os.chdir(folder)
os.execv(engine, [engine, *args])
"""

# Run in a child process: start and close one engine (through the launcher ``engine``, when given), then say so
# (what happens after that, e.g. a crash of ViZDoom at the interpreter's exit, does not count)
_ENGINE_PROBE = """
import os, sys, vizdoom as vzd
engine, config, wad, map_name = sys.argv[1:]
game = vzd.DoomGame()
if engine:
    game.set_vizdoom_path(engine)
game.set_doom_config_path(config)
game.set_doom_game_path(wad)
game.set_doom_map(map_name)
game.set_window_visible(False)
game.set_sound_enabled(False)
game.init()
game.close()
print("engine started", flush=True)
os._exit(0)
"""

_OPEN_GAMES: "weakref.WeakKeyDictionary[vzd.DoomGame, int]" = weakref.WeakKeyDictionary()  # game -> its pid


class _Home(NamedTuple):
    """A process's private folder and its identity (device, inode) when it was made."""

    path: Path
    identity: tuple[int, int]


def start_game(game: vzd.DoomGame) -> None:
    """Start ``game``, configured but for its engine and settings file: through the launcher of this
    process where one works, with the settings file in this process's private folder; the game is closed
    at this process's normal exit if it is still open then. Raises a :class:`LeaklabError` where no
    engine starts or /dev/shm is too full for one more."""
    pid = os.getpid()
    home = _home(pid)
    if not _still_ours(home):  # cleaned away during a long run (a temporary-folder cleaner), or replaced
        _home.cache_clear()
        home = _home(pid)
    _check_shared_memory()
    engine = _engine_path(home.path)
    if engine and not os.access(engine, os.X_OK):  # the launcher alone was cleaned away
        _engine_path.cache_clear()
        engine = _engine_path(home.path)
    if engine:
        game.set_vizdoom_path(engine)
    game.set_doom_config_path(str(home.path / "settings.ini"))
    # an engine makes this folder where it works when it writes a new settings file (its search path, never
    # used here): the launcher's engine works in the private folder; ViZDoom's own, here, leaves no trace of it
    search = Path("_vizdoom")
    made = not engine and not search.exists()
    try:
        with _interrupts_held():
            game.init()
            _OPEN_GAMES[game] = pid
    finally:  # (a Ctrl-C held back during the start comes as the block ends)
        if made:
            with contextlib.suppress(OSError):  # not empty, or another process removed it first
                search.rmdir()


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM wait (blocked in this thread) and come after it; the engine
    started from it keeps them blocked for good and ends when its game closes (or, through the launcher,
    with this process). A terminal's Ctrl-C killed an engine that was starting, which crashes the process
    (module docstring): 9 of 12 processes interrupted 2.5 to 4.5 s into starting rooms died of a
    segmentation fault, 0 of 12 now. So a start that hangs ends only with SIGKILL (``timeout -k``). Held
    in this thread only: from another thread's start, a Ctrl-C reaches the main thread at once."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def close_game(game: vzd.DoomGame) -> None:
    """Close ``game``, unless a parent of this process started it (it came with a fork): its engine is the
    parent's, which would stop under it, and the close would wait forever for the parent's threads."""
    if _OPEN_GAMES.get(game, os.getpid()) == os.getpid():
        game.close()


def check_own(game: vzd.DoomGame) -> None:
    """Raise a :class:`LeaklabError` where ``game`` came with a fork from the process that started it: the
    engine answers that process, and a child driving it too would break both; or where it is closed (ViZDoom's
    own exception said so in its words)."""
    owner = _OPEN_GAMES.get(game)
    if owner is not None and owner != os.getpid():
        raise LeaklabError(f"this room's ViZDoom engine belongs to process {owner}, from which this one was "
                           "forked: make a new environment in this process")
    if not game.is_running():
        raise LeaklabError("this room's ViZDoom engine is closed (env.close()): make a new environment")


@functools.cache
def _home(pid: int) -> _Home:
    """Process ``pid``'s private temporary folder (mode 0700): its engine launcher, the launcher's notes
    of the engines it started, and the engines' settings file. Removed at the process's normal exit, after
    its open games are closed (their engines write the settings file as they close), and not by a fork's
    exit; what a killed process leaves (a multiprocessing worker that ends with ``os._exit`` too) goes with
    the next process's :func:`_sweep_crashed`. A settings file under a shared name in the temporary folder
    would be written by concurrent processes at once, and another user could plant a link there."""
    temp, scope = Path(tempfile.gettempdir()), process_scope()
    if sys.platform.startswith("linux"):  # (elsewhere no launcher notes engines, and os.kill(pid, 0) may signal)
        _sweep_crashed(temp, scope)
    path = Path(tempfile.mkdtemp(prefix=f"leaklab-engine-{scope}-{pid}-", dir=temp))
    atexit.register(_close_and_remove, pid, path)
    info = path.lstat()
    return _Home(path, (info.st_dev, info.st_ino))


def _still_ours(home: _Home) -> bool:
    """Whether ``home`` is still the folder :func:`_home` made: the same directory, this user's, private."""
    try:
        info = home.path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) == home.identity
            and info.st_uid == os.geteuid() and not info.st_mode & 0o077)


def _close_and_remove(pid: int, path: Path) -> None:
    """At process ``pid``'s exit: close the games it started that are still open, then remove its folder."""
    if os.getpid() != pid:  # a fork's exit runs the handlers it inherited: these are its parent's
        return
    for game in list(_OPEN_GAMES):
        with contextlib.suppress(Exception):
            close_game(game)
    shutil.rmtree(path, ignore_errors=True)


def _keep_inherited_games() -> None:
    """In a forked child: hold one more reference to every game the parent had than anyone will release, so
    that no game's destructor, which closes it (:func:`close_game`), runs in the child. Measured: a child
    that forked off a process with an open room and exited normally hung in its exit, and the parent's
    engine was gone."""
    for game in list(_OPEN_GAMES):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(game))


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_keep_inherited_games)


def _sweep_crashed(temp: Path, scope: str) -> None:
    """Remove what this user's dead processes of ``scope`` (:func:`~leaklab.processes.process_scope`) left in
    ``temp`` when they ended
    without their normal exit (killed, crashed): their private folders (:func:`_home`) and the shared
    memory of the engines noted there. Each folder is first renamed for this process, so that of several
    processes sweeping at once one removes it, and a sweeper killed on the way leaves it for the next."""
    for folder in temp.glob(f"leaklab-engine-{scope}-*-*"):
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            if not process_gone(int(folder.name.split("-")[3])):
                continue  # the process lives
        except (ValueError, OSError):
            continue
        claimed = temp / f"leaklab-engine-{scope}-{os.getpid()}-swept{folder.name.rsplit('-', 1)[1]}"
        try:
            folder.rename(claimed)
            notes = [note.name.removeprefix("instance-") for note in claimed.glob("instance-*")]
        except OSError:  # another process claimed it first
            continue
        for instance in notes:
            if instance.isascii() and instance.isalnum():
                for name in _SHARED_NAMES:
                    _remove_own_file(_SHARED_MEMORY / name.format(instance))
        shutil.rmtree(claimed, ignore_errors=True)


def _remove_own_file(path: Path) -> None:
    """Remove ``path`` if it is a plain file of this user's (anything else, or an error, leaves it)."""
    with contextlib.suppress(OSError):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
            path.unlink()


@functools.cache
def _engine_path(folder: Path) -> str | None:
    """What ViZDoom starts as the engine of the process whose private folder is ``folder``: on Linux a
    launcher written there that has the kernel kill the engine when this process dies; None, ViZDoom's
    engine itself, elsewhere or where no engine starts through the launcher (a temporary folder mounted
    noexec, say), with a warning. One engine is started in a child process first, because an engine that
    fails to start crashes the process waiting for it; where none starts, a :class:`LeaklabError` says why."""
    candidates: list[str | None] = [None]
    if sys.platform.startswith("linux") and sys.executable:
        launcher = folder / "vizdoom"
        engine = VIZDOOM / "vizdoom"
        launcher.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S -c {shlex.quote(_TIE_TO_PARENT)} "
                            f"\"$PPID\" {shlex.quote(str(folder))} {shlex.quote(str(engine))} \"$@\"\n")
        launcher.chmod(0o700)
        candidates.insert(0, str(launcher))
    failures = []
    for candidate in candidates:
        failure = _engine_failure(candidate, folder)
        if failure is None or failure == _UNTOLD and candidate is None:  # the launcher must have been seen to work
            if failures:
                warnings.warn(f"ViZDoom's engines start without leaklab's launcher ({failures[0]}), so they outlive "
                              "this process if it is killed", UserWarning, stacklevel=2)
            return candidate
        failures.append(failure)
    raise LeaklabError(f"ViZDoom's engine does not start on this machine, and the rooms need it: {failures[-1]}")


def _engine_failure(engine: str | None, folder: Path) -> str | None:
    """Why an engine started through ``engine`` (None: ViZDoom's own) fails to start, seen from a child
    process working in ``folder`` with its own settings file; None when it starts or when there is no
    interpreter to run the child; :data:`_UNTOLD` when the child outran ``_TRIAL_SECONDS``."""
    if not sys.executable:
        return None
    layout = next(iter(LAYOUTS.values()))
    path = os.pathsep.join(p for p in sys.path if isinstance(p, str))  # the child imports vizdoom as we do
    try:
        run = subprocess.run([sys.executable, "-c", _ENGINE_PROBE, engine or "", str(folder / "trial.ini"),
                              str(VIZDOOM / layout.wad), layout.map],
                             cwd=folder, capture_output=True, text=True, timeout=_TRIAL_SECONDS,
                             env={**os.environ, "PYTHONPATH": path})
    except subprocess.TimeoutExpired:
        return _UNTOLD
    if "engine started" in run.stdout:
        return None
    how = f"exit status {run.returncode}"
    if run.returncode < 0:
        with contextlib.suppress(ValueError):
            how = signal.Signals(-run.returncode).name
    last = run.stderr.strip().splitlines()[-1:]
    return f"a trial start in a child process ended with {how}" + (f" ({last[0]})" if last else "")


def _check_shared_memory() -> None:
    """Raise a :class:`LeaklabError` where too little shared memory is free for one more engine (it would
    crash this process with a bus error instead). Processes starting engines at the same moment may each
    see enough and still fill it together: this makes the crash unlikely, not impossible."""
    try:
        usage = shutil.disk_usage(_SHARED_MEMORY)
    except OSError:  # no /dev/shm (not Linux): nothing to measure
        return
    if usage.total == 0:  # a tmpfs mounted without a size limit reports none
        return
    if usage.free < _SHARED_MEMORY_NEEDED:
        raise LeaklabError(f"{_SHARED_MEMORY} has {usage.free / 2**20:.1f} MiB free and a ViZDoom engine needs about "
                           f"{_SHARED_MEMORY_NEEDED >> 20} MiB of shared memory to start: free some, or give the "
                           "container more (docker run --shm-size 64m)")
