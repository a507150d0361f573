"""The ViZDoom active-perception environment (seed 000, section III "Active Perception Task")."""

import itertools

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
    for after_close in (lambda: env.reset(seed=0), lambda: env.step(0)):  # ViZDoom's own exception said it
        with pytest.raises(LeaklabError, match="engine is closed"):
            after_close()


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
    for taken in (np.array(2), np.int64(2)):  # what the action space holds (np.asarray of a policy's output)
        env.reset(seed=0)
        assert env.action_space.contains(taken) and env.step(taken)[4]["step"] == 1
    for refused in (np.array([2]), np.array(2.0), 2.0, True):  # a bool is an int to isinstance
        with pytest.raises(LeaklabError, match="action"):
            env.step(refused)
    with pytest.raises(LeaklabError, match="max_steps"):
        ActivePerceptionEnv(layout=LAYOUT, max_steps=True)


def test_contact_sheet_writes_a_png_grid(tmp_path):
    out = contact_sheet(tmp_path / "sheet.png", layouts=["e2m6-column", "map07-stalactite"], seed=1)
    image = matplotlib.image.imread(out)
    assert out == tmp_path / "sheet.png" and image.ndim == 3
    height, width = image.shape[:2]
    assert 100 < height < 400 and 300 < width < 1000 and width > 1.5 * height
    with pytest.raises(LeaklabError, match="layout"):
        contact_sheet(tmp_path / "none.png", layouts=[])
