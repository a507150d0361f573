"""ViZDoom's engine processes (leaklab.rl.envs.engine): started only where they run, tied to the process
that started them, settings in the process's own folder, and what a killed process leaves swept up."""

import collections
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from leaklab.errors import LeaklabError
from leaklab.processes import process_scope
from leaklab.rl.envs import ActivePerceptionEnv, engine

LAYOUT = "e1m1-stalactite"
LINUX = sys.platform.startswith("linux")
Usage = collections.namedtuple("Usage", "total used free")  # what shutil.disk_usage returns


def _python(code: str, tmp_path: Path, **kwargs) -> subprocess.CompletedProcess:
    """``code`` run by a child Python whose temporary folder is ``tmp_path / "temp"``."""
    (tmp_path / "temp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path / "temp")}, **kwargs)


def _tiny_shared_memory(megabytes: float) -> list[str] | None:
    """A command prefix that runs a command with a tmpfs of ``megabytes`` as /dev/shm (a private mount
    namespace), or None where this process may not make one (not root, no ``unshare``)."""
    if not LINUX or os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    mount = f"mount -t tmpfs -o size={int(megabytes * 1024)}k tmpfs /dev/shm"
    if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True).returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"']


def test_an_engine_short_of_shared_memory_is_an_error_before_it_crashes_the_process(monkeypatch):
    """An engine that finds /dev/shm full dies of a bus error, and the Python process waiting in
    `game.init()` with it (a container's /dev/shm is 64 MB unless told otherwise)."""
    monkeypatch.setattr(engine, "_SHARED_MEMORY_NEEDED", 1 << 62)
    with pytest.raises(LeaklabError, match="/dev/shm has .* MiB free and a ViZDoom engine needs"):
        ActivePerceptionEnv(layout=LAYOUT)
    prefix = _tiny_shared_memory(8.6)  # room for the trial start and a few engines
    if prefix is None:
        pytest.skip("a small /dev/shm needs root and unshare")
    code = ("from leaklab.errors import LeaklabError; from leaklab.rl.envs import ActivePerceptionEnv, LAYOUTS\n"
            "envs = []\n"
            "try:\n"
            "    for name in list(LAYOUTS)[:8]:\n"
            "        envs.append(ActivePerceptionEnv(layout=name)); envs[-1].reset(seed=0)\n"
            "except LeaklabError as error:\n"
            "    print(len(envs), error)\n"
            "for env in envs:\n"
            "    env.close()\n")
    run = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    started, message = run.stdout.split(maxsplit=1)
    assert int(started) >= 1 and "MiB free and a ViZDoom engine needs" in message


def test_a_shared_memory_without_a_size_limit_is_not_taken_for_a_full_one(monkeypatch):
    """A tmpfs mounted with size=0 has no limit and reports a total of 0."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(0, 0, 0))
    engine._check_shared_memory()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(64 << 20, 63 << 20, 1 << 20))
    with pytest.raises(LeaklabError, match="has 1.0 MiB free"):
        engine._check_shared_memory()


def test_the_engines_settings_file_is_the_processs_own_and_leaves_no_trace(tmp_path):
    """The engine writes its settings file on close: it sat under a name shared by every process of a user
    in the temporary folder (written by concurrent processes at once; another user could plant a link
    there); a new one made an empty `_vizdoom/` in the working directory (a user's first run of `leaklab
    env contact-sheet` left one); and a game still open at the exit wrote it after its folder was gone."""
    work = tmp_path / "work"
    work.mkdir()
    code = ("import os, stat; from leaklab.rl.envs import ActivePerceptionEnv, engine; "
            f"ActivePerceptionEnv(layout={LAYOUT!r}).close(); "
            f"left_open = ActivePerceptionEnv(layout={LAYOUT!r}); "
            "home = engine._home(os.getpid()).path; "
            "print(home, oct(stat.S_IMODE(home.stat().st_mode)), sorted(p.name for p in home.iterdir()))")
    run = _python(code, tmp_path, cwd=work)
    assert run.returncode == 0, run.stderr
    home, mode, names = run.stdout.split(maxsplit=2)
    assert Path(home).parent == tmp_path / "temp" and mode == "0o700" and "'settings.ini'" in names
    assert not any(work.iterdir()) and not any((tmp_path / "temp").iterdir())  # the folder went at the exit
    assert "could not be saved" not in run.stdout + run.stderr  # the open game was closed before it went


@pytest.mark.skipif(not LINUX, reason="the launcher, which starts the engine in the process's folder, is Linux's")
def test_an_engine_works_in_the_processs_folder_not_in_the_users(tmp_path):
    """An engine makes `./_vizdoom/` where it works and dies, crashing the process, when something of that
    name is there: a file, or the folder another process's engine made a moment before (two captures started
    at once in one folder: one died of a segmentation fault, "Failed to create ./_vizdoom/ directory: File
    exists"). A file of that name in the working directory stands for both."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "_vizdoom").write_text("a user's file")
    code = (f"from leaklab.rl.envs import ActivePerceptionEnv; env = ActivePerceptionEnv(layout={LAYOUT!r}); "
            "env.reset(seed=0); env.close(); print('started')")
    run = _python(code, tmp_path, cwd=work)
    assert run.returncode == 0 and run.stdout.strip() == "started", run.stderr[-2000:]
    assert [p.name for p in work.iterdir()] == ["_vizdoom"] and (work / "_vizdoom").read_text() == "a user's file"


def test_a_folder_replaced_under_the_same_name_is_not_taken_for_the_processs_own(tmp_path, monkeypatch):
    """A temporary-folder cleaner may remove the folder during a long run, and anyone may then make one
    under its name, with a launcher in it: the process makes a new folder of its own instead."""
    monkeypatch.setattr(engine.tempfile, "tempdir", str(tmp_path))
    home = engine._home.__wrapped__(os.getpid())
    assert engine._still_ours(home)
    shutil.rmtree(home.path)
    assert not engine._still_ours(home)
    home.path.mkdir(mode=0o755)
    assert not engine._still_ours(home)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat_file.parent.name))
    return found


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an orphan that no init reaps stays one)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.skipif(not LINUX, reason="the engine is tied to its process on Linux only")
def test_the_engine_dies_with_a_process_killed_before_it_closed_the_game_and_the_next_sweeps_up(tmp_path):
    """An engine outlived a Python process killed or crashed without closing its game (it ignores SIGTERM),
    and held that process's output pipe open: a `leaklab audit | tail` never ended. The killed pair
    leaves its shared memory and the process its folder: the next process to start engines removes them."""
    code = ("import os, signal; from leaklab.rl.envs import ActivePerceptionEnv; "
            f"env = ActivePerceptionEnv(layout={LAYOUT!r}); env.reset(seed=0); print(os.getpid(), flush=True); "
            "input(); os.kill(os.getpid(), signal.SIGKILL)")
    python = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # its folder is left there
    engines = _children(int(python.stdout.readline()))
    args = Path(f"/proc/{engines[0]}/cmdline").read_text().split("\0") if len(engines) == 1 else []
    assert args and "vizdoom" in args[0]
    instance = args[args.index("+viz_instance_id") + 1]
    shared = [Path(f"/dev/shm/ViZDoom{name}{instance}") for name in ("SM", "MQCtr", "MQDoom")]
    try:
        python.communicate("\n", timeout=30)
        deadline = time.monotonic() + 10
        while _running(engines[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(engines[0])
        scope = process_scope()
        left = [path.name for path in tmp_path.iterdir()]
        assert all(path.exists() for path in shared) and len(left) == 1
        assert left[0].startswith(f"leaklab-engine-{scope}-{python.pid}-")
        alive = tmp_path / f"leaklab-engine-{scope}-{os.getpid()}-x"  # this process's: kept
        alive.mkdir()
        engine._sweep_crashed(tmp_path, scope)
        assert not any(path.exists() for path in shared) and list(tmp_path.iterdir()) == [alive]
    finally:
        with contextlib.suppress(OSError):
            os.kill(engines[0], signal.SIGKILL)
        for path in shared:  # if the sweep failed
            path.unlink(missing_ok=True)


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.skipif(not LINUX, reason="the sweep runs on Linux only")
def test_the_sweep_removes_only_this_users_plain_files_and_tolerates_sweepers_beside_it(tmp_path, monkeypatch):
    """Instance ids can be read by anyone (an engine's command line), so another user may make a file under
    a noted name; and processes started together (test workers) sweep the same folders at once."""
    shm, temp = tmp_path / "shm", tmp_path / "temp"
    shm.mkdir()
    temp.mkdir()
    monkeypatch.setattr(engine, "_SHARED_MEMORY", shm)
    dead, scope = _dead_pid(), process_scope()
    for i in range(40):
        folder = temp / f"leaklab-engine-{scope}-{dead}-f{i}"
        folder.mkdir(mode=0o700)
        (folder / f"instance-id{i}").touch()
        (shm / f"ViZDoomSMid{i}").write_bytes(b"x")
    (shm / "ViZDoomMQCtrid0").mkdir()  # not a plain file: kept, and no error
    (shm / "ViZDoomMQDoomid1").symlink_to(tmp_path / "elsewhere")
    (temp / f"leaklab-engine-{scope}-{dead}-f1" / "instance-..").touch()  # not an id
    errors = []

    def sweep():
        try:
            engine._sweep_crashed(temp, scope)
        except Exception as error:  # noqa: BLE001 - any error fails the test below
            errors.append(error)

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and not any(temp.iterdir())
    assert sorted(p.name for p in shm.iterdir()) == ["ViZDoomMQCtrid0", "ViZDoomMQDoomid1"]


@pytest.mark.skipif(not LINUX, reason="the engine is tied to its process on Linux only")
def test_the_engine_starts_through_the_launcher_only_where_an_engine_started_so(monkeypatch, tmp_path):
    """An engine that fails to start crashes the Python process waiting for it (a segmentation fault in
    ViZDoom), so a child process starts one first: through the launcher, else directly, else an error."""
    find = engine._engine_path.__wrapped__  # uncached
    assert Path(find(tmp_path)) == tmp_path / "vizdoom"  # the launcher, in the process's folder
    assert stat.S_IMODE((tmp_path / "vizdoom").stat().st_mode) == 0o700
    site = str(tmp_path / "site")
    monkeypatch.syspath_prepend(site)  # the trial imports what this process imports
    probe = f"import sys; {site!r} in sys.path and print('engine started')"
    monkeypatch.setattr(engine, "_ENGINE_PROBE", probe)
    assert find(tmp_path) is not None
    monkeypatch.setattr(engine, "_TRIAL_SECONDS", 2)  # a launcher must be seen to work in time
    monkeypatch.setattr(engine, "_ENGINE_PROBE", "import sys, time; sys.argv[1] and time.sleep(10); "
                                                 "print('engine started')")
    with pytest.warns(UserWarning, match="without leaklab's launcher .*did not end in time.*outlive this process"):
        assert find(tmp_path) is None
    monkeypatch.setattr(engine, "_ENGINE_PROBE", "import sys; sys.argv[1] or print('engine started')")
    with pytest.warns(UserWarning, match="without leaklab's launcher .*exit status 0"):
        assert find(tmp_path) is None  # a launcher that cannot start an engine: ViZDoom's own engine
    monkeypatch.setattr(engine, "_ENGINE_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(LeaklabError, match="ViZDoom's engine does not start on this machine.*ended with SIGSEGV"):
        find(tmp_path)


@pytest.mark.skipif(not LINUX, reason="the engine is tied to its process on Linux only")
def test_a_forked_process_leaves_its_parents_folder_and_games_alone(tmp_path):
    """A fork shares its parent's games' message queues: closing its copy of a game stops the parent's
    engine, and its normal exit ran the games' destructors, which do (the fork hung in its exit and the
    parent in its next step, before the fork hook). Its exit also runs the exit handlers it inherited: the
    one closing the games and removing the folder is its parent's. The fork may not drive the game."""
    code = ("import os, sys; from leaklab.errors import LeaklabError; "
            "from leaklab.rl.envs import ActivePerceptionEnv, engine\n"
            f"env = ActivePerceptionEnv(layout={LAYOUT!r}); env.reset(seed=0)\n"
            "home = engine._home(os.getpid()).path\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    try:\n"
            "        env.step(0)\n"
            "    except LeaklabError as error:\n"
            "        print('child:', error, flush=True)\n"
            "    env.close()\n"
            "    del env\n"
            "    sys.exit(0)\n"
            "os.waitpid(child, 0); env.step(0); env.reset(seed=1)\n"
            "print(home.exists()); env.close()")
    run = _python(code, tmp_path)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and lines[-1] == "True", run.stderr
    assert lines[0].startswith("child: this room's ViZDoom engine belongs to process"), run.stdout


@pytest.mark.skipif(not LINUX, reason="a process group's SIGINT and a held signal mask: Linux")
def test_a_ctrl_c_while_an_engine_starts_interrupts_instead_of_crashing(tmp_path):
    """A terminal's Ctrl-C reaches the engine too: one that died of it while it started crashed the process
    waiting in `game.init()` (9 of 12 CLI runs interrupted 2.5 to 4.5 s in). Here the SIGINT goes to the
    child's own process group 0.1 s into each start. The child takes Python's Ctrl-C handler itself: a
    shell's background job inherits SIGINT ignored, and Python then installs none (the test failed so in
    a fresh clone's `bash .ci/run &`, session 31)."""
    code = ("import os, signal, threading; import vizdoom as vzd\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from leaklab.rl.envs import ActivePerceptionEnv\n"
            "start = vzd.DoomGame.init\n"
            "def init(self):\n"
            "    threading.Timer(0.1, os.killpg, (0, signal.SIGINT)).start()\n"
            "    return start(self)\n"
            "vzd.DoomGame.init = init\n"
            "try:\n"
            f"    ActivePerceptionEnv(layout={LAYOUT!r})\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    run = _python(code, tmp_path, start_new_session=True)
    assert run.returncode == 0 and run.stdout.strip() == "interrupted", (run.returncode, run.stderr[-500:])
