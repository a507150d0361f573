"""The ViZDoom active-perception environment (seed 000, section III "Active Perception Task")."""

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import matplotlib.image
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from leaklab.errors import LeaklabError
from leaklab.rl.envs import ACTIONS, ENV_ID, LAYOUTS, ActivePerceptionEnv
from leaklab.rl.envs.active_perception import TURN_DEGREES, reward_from_box
from leaklab.rl.envs.contact_sheet import contact_sheet

LAYOUT = "e1m1-stalactite"
# the mean of the first RGB frame (after the brightness curve) of every layout is above this:
# Doom rooms are dark, and a mostly black frame would make reconstructions look better than they are
BRIGHTNESS_FLOOR = 0.35


@pytest.fixture(scope="module")
def env():
    env = ActivePerceptionEnv(layout=LAYOUT)
    yield env
    env.close()


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in ("rgb", "depth", "box"))


def test_gymnasium_env_checker_passes(env):
    check_env(env, skip_render_check=True)


def test_spaces_and_value_ranges_follow_the_contract(env):
    assert len(ACTIONS) == len(set(ACTIONS)) == 7 and env.action_space == gymnasium.spaces.Discrete(7)
    assert {k: (s.shape, s.dtype) for k, s in env.observation_space.spaces.items()} == {
        "rgb": ((3, 150, 150), np.float32), "depth": ((1, 150, 150), np.float32), "box": ((4,), np.float32)}
    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    assert {"layout", "target", "visible", "step"} <= info.keys() and info["layout"] == LAYOUT
    assert info["target"] == LAYOUTS[LAYOUT].target and info["step"] == 0
    for action in range(7):
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and 0.0 <= reward <= 1.0
        assert terminated is False and info["step"] == action + 1


def test_same_seed_same_episode_and_different_seeds_different_starts(env):
    def rollout(seed):
        obs, info = env.reset(seed=seed)
        steps = [env.step(a)[:2] for a in (0, 4, 2, 6, 1)]
        return obs, info["pose"], steps

    obs_a, pose_a, steps_a = rollout(5)
    obs_b, pose_b, steps_b = rollout(5)
    assert _same(obs_a, obs_b) and pose_a == pose_b
    assert all(_same(oa, ob) and ra == rb for (oa, ra), (ob, rb) in zip(steps_a, steps_b))
    poses = {env.reset(seed=seed)[1]["pose"] for seed in range(4)}
    assert len(poses) == 4


def test_episodes_truncate_at_max_steps_and_never_terminate():
    env = ActivePerceptionEnv(layout=LAYOUT, max_steps=3)
    try:
        env.reset(seed=0)
        flags = [env.step(0)[2:4] for _ in range(3)]
    finally:
        env.close()
    assert flags == [(False, False), (False, False), (False, True)]


def test_every_layout_starts_bright_distinct_and_seeing_its_target():
    assert len(LAYOUTS) >= 12
    frames = {}
    for name in LAYOUTS:
        env = ActivePerceptionEnv(layout=name)
        try:
            obs, info = env.reset(seed=0)
        finally:
            env.close()
        assert info["visible"], name
        rgb = obs["rgb"]
        assert rgb.mean() > BRIGHTNESS_FLOOR, (name, rgb.mean())
        assert (rgb.max(axis=0) < 0.1).mean() < 0.05, name  # not mostly black
        assert rgb.std() > 0.1 and obs["depth"].std() > 0.02, name  # visible structure
        frames[name] = rgb
    for (a, fa), (b, fb) in itertools.combinations(frames.items(), 2):
        assert np.abs(fa - fb).mean() > 0.05, (a, b)


def test_box_is_an_ordered_box_when_visible_and_zeros_when_not(env):
    obs, info = env.reset(seed=2)
    x1, y1, x2, y2 = obs["box"]
    assert info["visible"] and -1 <= x1 < x2 <= 1 and -1 <= y1 < y2 <= 1
    # the start pose faces the target within 25 degrees: half a turn puts it behind the agent
    for _ in range(round(180 / TURN_DEGREES)):
        obs, reward, _, _, info = env.step(ACTIONS.index("turn_left"))
    assert not info["visible"] and reward == 0.0 and np.array_equal(obs["box"], np.zeros(4, np.float32))


def test_walking_to_the_target_enlarges_its_box_and_the_reward_follows_the_box(env):
    obs, info = env.reset(seed=4)

    def area(box):
        return (box[2] - box[0]) * (box[3] - box[1])

    start_area = area(obs["box"])
    for _ in range(2):
        obs, reward, _, _, info = env.step(ACTIONS.index("forward"))
        assert info["visible"] and reward == pytest.approx(reward_from_box(obs["box"], True))
    assert area(obs["box"]) > 1.2 * start_area


def test_reward_grows_with_size_and_centring_and_stays_in_unit_range():
    small, big = np.array([-0.1, -0.1, 0.1, 0.1]), np.array([-0.3, -0.3, 0.3, 0.3])
    off_centre = small + np.array([0.7, 0.5, 0.7, 0.5])
    assert 0 < reward_from_box(small, True) < reward_from_box(big, True) <= 1
    assert reward_from_box(off_centre, True) < reward_from_box(small, True)
    assert reward_from_box(np.array([-1, -1, 1, 1]), True) == 1.0
    assert reward_from_box(big, False) == 0.0


def test_gymnasium_make_builds_the_env_at_another_image_size():
    env = gymnasium.make(ENV_ID, layout="map18-column", image_size=64, max_steps=5)
    try:
        obs, info = env.reset(seed=0)
        assert obs["rgb"].shape == (3, 64, 64) and obs["depth"].shape == (1, 64, 64)
        assert env.observation_space.contains(obs) and info["layout"] == "map18-column"
    finally:
        env.close()
    env = gymnasium.make(ENV_ID, image_size=64, max_steps=5)  # the registered default room
    try:
        assert env.reset(seed=0)[1]["layout"] == next(iter(LAYOUTS))
    finally:
        env.close()


def test_bad_arguments_raise_leaklab_errors(env):
    with pytest.raises(LeaklabError, match="unknown room layout"):
        ActivePerceptionEnv(layout="kitchen")
    with pytest.raises(LeaklabError, match="image_size"):
        ActivePerceptionEnv(layout=LAYOUT, image_size=1000)
    env.reset(seed=0)
    with pytest.raises(LeaklabError, match="action"):
        env.step(7)


def test_contact_sheet_writes_a_png_grid(tmp_path):
    out = contact_sheet(tmp_path / "sheet.png", layouts=["e2m6-column", "map07-stalactite"], seed=1)
    image = matplotlib.image.imread(out)
    assert out == tmp_path / "sheet.png" and image.ndim == 3
    height, width = image.shape[:2]
    assert 100 < height < 400 and 300 < width < 1000 and width > 1.5 * height
    with pytest.raises(LeaklabError, match="layout"):
        contact_sheet(tmp_path / "none.png", layouts=[])


def _tiny_shared_memory(megabytes: float) -> list[str] | None:
    """A command prefix that runs a command with a tmpfs of ``megabytes`` as /dev/shm (a private mount
    namespace), or None where this process may not make one (not root, no ``unshare``)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    mount = f"mount -t tmpfs -o size={int(megabytes * 1024)}k tmpfs /dev/shm"
    if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True).returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"']


def test_an_engine_short_of_shared_memory_is_an_error_before_it_crashes_the_process(monkeypatch):
    """An engine that finds /dev/shm full dies of a bus error, and the Python process waiting in
    `game.init()` with it (a container's /dev/shm is 64 MB unless told otherwise)."""
    from leaklab.rl.envs import active_perception

    monkeypatch.setattr(active_perception, "_SHARED_MEMORY_NEEDED", 1 << 62)
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


def test_the_engines_settings_file_is_the_processs_own_and_leaves_no_trace(tmp_path):
    """The engine writes its settings file on close: it sat under a name shared by every process of a user
    in the temporary folder (written by concurrent processes at once; another user could plant a link
    there); and a new one made an empty `_vizdoom/` in the working directory (a user's first run of
    `leaklab env contact-sheet` left one)."""
    work, temp = tmp_path / "work", tmp_path / "temp"
    work.mkdir()
    temp.mkdir()
    code = ("import os, stat; from leaklab.rl.envs import active_perception as ap; "
            f"game = ap._new_game(ap.LAYOUTS[{LAYOUT!r}], 150); game.close(); "
            "folder = ap._engine_folder(os.getpid()); "
            "print(folder, oct(stat.S_IMODE(folder.stat().st_mode)), sorted(p.name for p in folder.iterdir()))")
    run = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(temp)})
    assert run.returncode == 0, run.stderr
    folder, mode, names = run.stdout.split(maxsplit=2)
    assert Path(folder).parent == temp and mode == "0o700" and "'settings.ini'" in names
    assert not any(work.iterdir()) and not any(temp.iterdir())  # the folder went at the process's exit


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the engine is tied to its process on Linux only")
def test_the_engine_dies_with_a_process_killed_before_it_closed_the_game_and_the_next_sweeps_up(tmp_path):
    """An engine outlived a Python process killed or crashed without closing its game (it ignores SIGTERM),
    and held that process's output pipe open: a `leaklab audit | tail` never ended. The killed pair
    leaves its shared memory and the process its folder: the next process to start engines removes them."""
    from leaklab.rl.envs.active_perception import _pid_namespace, _sweep_crashed

    code = ("import os, signal; from leaklab.rl.envs import ActivePerceptionEnv; "
            f"env = ActivePerceptionEnv(layout={LAYOUT!r}); env.reset(seed=0); print(os.getpid(), flush=True); "
            "input(); os.kill(os.getpid(), signal.SIGKILL)")
    python = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # its engine launcher is left there
    engines = _children(int(python.stdout.readline()))
    args = Path(f"/proc/{engines[0]}/cmdline").read_text().split("\0") if len(engines) == 1 else []
    assert args and "vizdoom" in args[0]
    try:
        python.communicate("\n", timeout=30)
        deadline = time.monotonic() + 10
        while _running(engines[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(engines[0])
        instance = args[args.index("+viz_instance_id") + 1]
        shared = [Path(f"/dev/shm/ViZDoom{name}{instance}") for name in ("SM", "MQCtr", "MQDoom")]
        left = [path.name for path in tmp_path.iterdir()]
        assert all(path.exists() for path in shared) and left[0].startswith(f"leaklab-engine-{_pid_namespace()}-"
                                                                             f"{python.pid}-") and len(left) == 1
        alive = tmp_path / f"leaklab-engine-{_pid_namespace()}-{os.getpid()}-x"  # this process's: kept
        alive.mkdir()
        _sweep_crashed(tmp_path, _pid_namespace())
        assert not any(path.exists() for path in shared) and list(tmp_path.iterdir()) == [alive]
    finally:
        with contextlib.suppress(OSError):
            os.kill(engines[0], signal.SIGKILL)
        for name in ("SM", "MQCtr", "MQDoom"):  # if the sweep failed
            Path(f"/dev/shm/ViZDoom{name}{args[args.index('+viz_instance_id') + 1]}").unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an orphan that no init reaps stays one)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the engine is tied to its process on Linux only")
def test_the_engine_starts_through_the_launcher_only_where_an_engine_started_so(monkeypatch, tmp_path):
    """An engine that fails to start crashes the Python process waiting for it (a segmentation fault in
    ViZDoom), so a child process starts one first: through the launcher, else directly, else an error."""
    from leaklab.rl.envs import active_perception

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the launchers are written there
    find = active_perception._engine_path.__wrapped__  # uncached
    assert Path(find(os.getpid())).name == "vizdoom"  # the launcher, in its own folder
    site = str(tmp_path / "site")
    monkeypatch.syspath_prepend(site)  # the trial imports what this process imports
    probe = f"import sys; {site!r} in sys.path and print('engine started')"
    monkeypatch.setattr(active_perception, "_ENGINE_PROBE", probe)
    assert find(os.getpid()) is not None
    monkeypatch.setattr(active_perception, "_TRIAL_SECONDS", 2)  # a launcher must be seen to work in time
    monkeypatch.setattr(active_perception, "_ENGINE_PROBE", "import sys, time; sys.argv[1] and time.sleep(10); "
                                                            "print('engine started')")
    with pytest.warns(UserWarning, match="without leaklab's launcher .*did not end in time.*outlive this process"):
        assert find(os.getpid()) is None
    monkeypatch.setattr(active_perception, "_ENGINE_PROBE", "import sys; sys.argv[1] or print('engine started')")
    with pytest.warns(UserWarning, match="without leaklab's launcher .*exit status 0"):
        assert find(os.getpid()) is None  # a launcher that cannot start an engine: ViZDoom's own engine
    monkeypatch.setattr(active_perception, "_ENGINE_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(LeaklabError, match="ViZDoom's engine does not start on this machine.*ended with SIGSEGV"):
        find(os.getpid())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the engine is tied to its process on Linux only")
def test_a_forked_process_leaves_its_parents_engine_launcher_alone(tmp_path):
    """A fork's normal exit runs the exit handlers it inherited: the one removing the launcher is its parent's."""
    code = ("import os, sys; from pathlib import Path; from leaklab.rl.envs import active_perception as ap; "
            "launcher = Path(ap._engine_path(os.getpid())); child = os.fork(); "
            "child or sys.exit(0); os.waitpid(child, 0); print(launcher.exists())")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr
