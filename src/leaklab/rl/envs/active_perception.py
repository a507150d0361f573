"""The active-perception environment of seed 000 ("Your Room is not Private", section III), in ViZDoom.

Section III "Active Perception Task": "the state contains depth image s_d, RGB image s_i, and
coordinate s_c that indicates the position of the target object in the images. The action space is
discrete with seven movement options. [...] the reward is defined by the confidence score obtained
from an object detection model." Section V "Experimental setup": RGB and depth cameras of 150 x 150;
the box is "the 4-dimensional coordinate from the upstream task within the range of [-1, 1]".

The paper's AI2-THOR rooms are replaced by the ViZDoom rooms of :mod:`.layouts`. Definitions:

* **Frames.** ViZDoom renders the smallest 4:3 resolution whose height is at least ``image_size``
  (200 x 150 for the default 150), the centre square (height x height) is cropped and, when its side
  differs from ``image_size``, area-resized to ``image_size``. The renderer runs with
  ``+r_visibility 200`` (no distance darkening beyond the sector light) and the RGB values go
  through the brightness curve ``rgb = (v / 255) ** (1 / 2)`` so that the Doom rooms are not mostly
  black. Depth is ``min(1, v / 64)`` with ``v`` ViZDoom's 8-bit depth-buffer value, which grows by
  one every ~8 map units of distance (measured against the target's true distance): the distance
  divided by a range of 512 map units (about 16 m, the player being 56 units tall), clipped.
* **Target and box.** The target is the layout's decoration; its box is ViZDoom's label rectangle of it
  (``label.x``, ``y``, ``width``, ``height``: the whole sprite's extent on the 200-px-wide screen, the parts
  that something in front of it hides included), clipped to the crop, as ``(x1, y1, x2, y2)`` in [-1, 1]
  (-1 = left/top edge, +1 = right/bottom edge). A review found it 0.02 or more off the bounding box of the
  target's pixels in the labels buffer on 34 of 561 visible frames (6 %, 9 rooms, a random policy): an
  occluded target, or one crossing the crop's edge, whose clipped rectangle can span the crop where a strip of
  it shows (the reward then 0.37 against 0.04). Every figure of docs/reproductions.md uses this box. Copies of
  the decoration elsewhere in the room are not the target. When the target is not in view, the box is
  all zeros and ``info["visible"]`` is False.
* **Reward** (the detection-confidence proxy): ``size * centring`` where ``size = min(1,
  sqrt(area / 0.1))`` with ``area`` the box's fraction of the image (a box covering a tenth of the
  image scores full size) and ``centring = 1 - 0.5 * min(1, |c|)`` with ``c`` the box centre in
  [-1, 1]^2 (1 at the image centre, 0.5 at an edge). The reward is 0 when the target is not visible.
* **Actions** (:data:`ACTIONS`): each is held for 4 game tics: walk forward, walk backward, strafe
  left, strafe right (about 7 map units for a first step, up to about 31 once moving: Doom keeps the
  player's momentum, so the agent speeds up over repeated steps and coasts after them, ``stay`` too: a
  review measured 22, 15, 10 and 7 units over four stays after eight forward steps, about 19 after one),
  turn left by 15 degrees, turn right by 15 degrees, and ``stay`` (no input).
* **Episodes.** Reset draws a start pose from the seed: 64 to 224 map units from the target, on
  open floor at the target's height with a clear line of sight to it, heading at the target within
  +-25 degrees, redrawn until the target is visible; the engine's own seed is drawn from the same
  generator, so a layout and a seed give the same episode bit for bit. No monsters, god mode; ``terminated`` is always
  False, ``truncated`` becomes True after ``max_steps`` steps (or, rarely, when the agent walks
  over a line that ends the map).
"""

import functools
import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
import vizdoom as vzd
from gymnasium import spaces

from leaklab.errors import LeaklabError
from leaklab.names import ROOM_ACTION_NAMES
from leaklab.rl.envs.engine import VIZDOOM, check_own, close_game, start_game
from leaklab.rl.envs.layouts import LAYOUTS, Layout, check_layouts

ACTIONS = ROOM_ACTION_NAMES

TICS_PER_STEP = 4
TURN_DEGREES = 15.0
BRIGHTNESS_GAMMA = 2.0
DEPTH_RANGE_VALUE = 64.0  # depth-buffer value of 512 map units (the buffer counts ~8 units a step)
FULL_SIZE_AREA = 0.1
START_DISTANCE = (64.0, 224.0)
START_HEADING_JITTER = 25.0
START_TRIES = 200
WALL_CLEARANCE = 24.0  # the Doom player's radius is 16
THING_CLEARANCE = 40.0
STEP_HEIGHT = 24.0
WARMUP_TICS = 8  # the engine ignores turning during the first 7 tics of a map

_RESOLUTIONS = {120: "RES_160X120", 150: "RES_200X150", 192: "RES_256X192", 240: "RES_320X240",
                300: "RES_400X300", 384: "RES_512X384", 480: "RES_640X480"}
_SOLID_CATEGORIES = {"Decoration", "Vegetation", "LightSource", "Hazard"}
# walk forward, walk backward, strafe left, strafe right, turn (degrees per tic, positive = right)
_BUTTONS = [vzd.Button.MOVE_FORWARD, vzd.Button.MOVE_BACKWARD, vzd.Button.MOVE_LEFT,
            vzd.Button.MOVE_RIGHT, vzd.Button.TURN_LEFT_RIGHT_DELTA]
_ACTION_INPUTS = ([1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0],
                  [0, 0, 0, 0, -TURN_DEGREES / TICS_PER_STEP], [0, 0, 0, 0, TURN_DEGREES / TICS_PER_STEP],
                  [0, 0, 0, 0, 0])
_NO_INPUT = [0, 0, 0, 0, 0]
_BRIGHTNESS = ((np.arange(256) / 255.0) ** (1.0 / BRIGHTNESS_GAMMA)).astype(np.float32)


def _new_game(layout: Layout, render_height: int, map_info: bool = False) -> vzd.DoomGame:
    """A headless game of the layout's map, started (:func:`.engine.start_game`); ``map_info`` adds the
    objects and sectors lists."""
    game = vzd.DoomGame()
    game.set_doom_game_path(str(VIZDOOM / layout.wad))
    game.set_doom_map(layout.map)
    game.set_screen_resolution(getattr(vzd.ScreenResolution, _RESOLUTIONS[render_height]))
    game.set_screen_format(vzd.ScreenFormat.RGB24)
    game.set_depth_buffer_enabled(True)
    game.set_labels_buffer_enabled(True)
    game.set_objects_info_enabled(map_info)
    game.set_sectors_info_enabled(map_info)
    game.set_render_hud(False)
    game.set_render_weapon(False)
    game.set_render_crosshair(False)
    game.set_render_messages(False)  # with cl_showsecretmessage 0 below: no text over the room
    game.set_window_visible(False)
    game.set_sound_enabled(False)
    game.set_mode(vzd.Mode.PLAYER)
    game.add_game_args("-nomonsters +sv_cheats 1 +r_visibility 200 +cl_showsecretmessage 0")
    game.set_available_buttons(_BUTTONS)
    game.set_available_game_variables([vzd.GameVariable.POSITION_X, vzd.GameVariable.POSITION_Y,
                                       vzd.GameVariable.POSITION_Z, vzd.GameVariable.ANGLE])
    start_game(game)
    return game


@functools.cache
def _map_geometry(name: str) -> tuple[np.ndarray, np.ndarray, float]:
    """The layout's blocking walls ``[N, 4]`` (segments ``x1, y1, x2, y2``), the positions ``[M, 2]``
    of its solid decorations other than the target, and the target's height (z).

    Read once from a game with the objects and sectors lists; the stepping game runs without them
    because building those lists every step costs more than rendering.
    """
    layout = LAYOUTS[name]
    game = _new_game(layout, min(_RESOLUTIONS), map_info=True)
    try:
        game.new_episode()
        state = game.get_state()
        walls = {(ln.x1, ln.y1, ln.x2, ln.y2) for sector in state.sectors for ln in sector.lines
                 if ln.is_blocking}
        objects = [o for o in state.objects if o.category in _SOLID_CATEGORIES]
    finally:
        close_game(game)
    is_target = [o.name == layout.target and abs(o.position_x - layout.x) < 1
                 and abs(o.position_y - layout.y) < 1 for o in objects]
    if sum(is_target) != 1:
        raise RuntimeError(f"layout {name}: the map has no single {layout.target} at ({layout.x}, {layout.y})")
    target_z = next(o.position_z for o, hit in zip(objects, is_target) if hit)
    solids = [(o.position_x, o.position_y) for o, hit in zip(objects, is_target) if not hit]
    return (np.array(sorted(walls), dtype=np.float64), np.array(solids, dtype=np.float64).reshape(-1, 2),
            float(target_z))


def _crosses(p: np.ndarray, q: np.ndarray, walls: np.ndarray) -> bool:
    """Whether segment p-q properly crosses any wall segment."""
    a, b = walls[:, :2], walls[:, 2:]

    def side(u, v, w):
        return (v[..., 0] - u[..., 0]) * (w[..., 1] - u[..., 1]) - (v[..., 1] - u[..., 1]) * (w[..., 0] - u[..., 0])

    return bool(np.any((side(p, q, a) * side(p, q, b) < 0) & (side(a, b, p) * side(a, b, q) < 0)))


def _distance_to_walls(p: np.ndarray, walls: np.ndarray) -> float:
    a, ab = walls[:, :2], walls[:, 2:] - walls[:, :2]
    t = np.clip(((p - a) * ab).sum(1) / np.maximum((ab * ab).sum(1), 1e-9), 0.0, 1.0)
    return float(np.min(np.linalg.norm(a + t[:, None] * ab - p, axis=1)))


def reward_from_box(box: np.ndarray, visible: bool) -> float:
    """The detection-confidence proxy of the module docstring: ``size * centring``, 0 if not visible."""
    if not visible:
        return 0.0
    x1, y1, x2, y2 = (float(v) for v in box)
    area = (x2 - x1) * (y2 - y1) / 4.0
    size = min(1.0, math.sqrt(area / FULL_SIZE_AREA))
    centring = 1.0 - 0.5 * min(1.0, math.hypot((x1 + x2) / 2, (y1 + y2) / 2))
    return size * centring


class ActivePerceptionEnv(gym.Env):
    """Find a good view of the target object in a ViZDoom room (seed 000, section III)."""

    metadata = {"render_modes": []}

    def __init__(self, layout: str, image_size: int = 150, max_steps: int = 50):
        check_layouts((layout,))
        if not isinstance(image_size, int) or not 32 <= image_size <= 480:
            raise LeaklabError(f"image_size must be an integer in [32, 480], got {image_size!r}")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise LeaklabError(f"max_steps must be a positive integer, got {max_steps!r}")
        self.layout = LAYOUTS[layout]
        self.image_size = image_size
        self.max_steps = max_steps
        self._crop = min(h for h in _RESOLUTIONS if h >= image_size)
        s = image_size
        self.observation_space = spaces.Dict({
            "rgb": spaces.Box(0.0, 1.0, (3, s, s), np.float32),
            "depth": spaces.Box(0.0, 1.0, (1, s, s), np.float32),
            "box": spaces.Box(-1.0, 1.0, (4,), np.float32),
        })
        self.action_space = spaces.Discrete(len(ACTIONS))
        self._game = _new_game(self.layout, self._crop)
        self._walls, self._solids, self._target_z = _map_geometry(layout)
        self._obs: dict[str, np.ndarray] | None = None
        self._visible = False
        self._pose = (0.0, 0.0, 0.0)  # (x, y, angle in degrees) of the player in map units
        self._step = 0

    # ---------------------------------------------------------------------------------------
    # frames

    def _target_box(self, state) -> tuple[np.ndarray, bool]:
        """The target's box in [-1, 1] crop coordinates and whether any of its pixels is visible."""
        h = self._crop
        left = (state.screen_buffer.shape[1] - h) / 2
        for label in state.labels:
            if (label.object_name == self.layout.target
                    and abs(label.object_position_x - self.layout.x) < 1
                    and abs(label.object_position_y - self.layout.y) < 1):
                x1 = min(max(label.x - left, 0), h)
                x2 = min(max(label.x + label.width - left, 0), h)
                y1, y2 = min(label.y, h), min(label.y + label.height, h)
                if x2 > x1 and y2 > y1:
                    return np.array([x1, y1, x2, y2], dtype=np.float32) * (2.0 / h) - 1.0, True
        return np.zeros(4, dtype=np.float32), False

    def _observe(self, state) -> dict[str, np.ndarray]:
        h = self._crop
        left = (state.screen_buffer.shape[1] - h) // 2
        rgb = _BRIGHTNESS[state.screen_buffer[:, left:left + h]].transpose(2, 0, 1)
        depth = np.minimum(state.depth_buffer[None, :, left:left + h] / np.float32(DEPTH_RANGE_VALUE), np.float32(1.0))
        if h != self.image_size:
            size = (self.image_size, self.image_size)
            rgb = F.interpolate(torch.from_numpy(np.ascontiguousarray(rgb))[None], size=size, mode="area")[0].numpy()
            depth = F.interpolate(torch.from_numpy(depth)[None], size=size, mode="area")[0].numpy()
        box, self._visible = self._target_box(state)
        x, y, _, angle = state.game_variables
        self._pose = (float(x), float(y), float(angle))
        return {"rgb": np.ascontiguousarray(rgb), "depth": np.ascontiguousarray(depth), "box": box}

    def _info(self) -> dict:
        return {"layout": self.layout.name, "target": self.layout.target, "visible": self._visible,
                "step": self._step, "pose": self._pose}

    # ---------------------------------------------------------------------------------------
    # start poses

    def _turn_to(self, heading: float) -> bool:
        for _ in range(4):
            angle = self._game.get_state().game_variables[3]
            delta = (angle - heading + 180.0) % 360.0 - 180.0
            if abs(delta) < 0.5:
                return True
            self._game.make_action([0, 0, 0, 0, delta])
        return False

    def _try_pose(self, target: np.ndarray) -> bool:
        """Draw one start pose; move the player there and return True if it is valid."""
        rng = self.np_random
        distance, direction = rng.uniform(*START_DISTANCE), rng.uniform(0.0, 2 * math.pi)
        jitter = rng.uniform(-START_HEADING_JITTER, START_HEADING_JITTER)
        p = target + distance * np.array([math.cos(direction), math.sin(direction)])
        if (_crosses(p, target, self._walls) or _distance_to_walls(p, self._walls) < WALL_CLEARANCE
                or np.any(np.linalg.norm(self._solids - p, axis=1) < THING_CLEARANCE)):
            return False
        self._game.send_game_command(f"warp {p[0]:.3f} {p[1]:.3f}")
        self._game.make_action(_NO_INPUT)
        x, y, z, _ = self._game.get_state().game_variables
        if abs(x - p[0]) > 1 or abs(y - p[1]) > 1 or abs(z - self._target_z) > STEP_HEIGHT:
            return False
        heading = math.degrees(math.atan2(target[1] - p[1], target[0] - p[0])) + jitter
        if not self._turn_to(heading % 360.0):
            return False
        return self._target_box(self._game.get_state())[1]

    # ---------------------------------------------------------------------------------------
    # gymnasium API

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        game = self._game
        check_own(game)
        game.set_seed(int(self.np_random.integers(2**31 - 1)))
        game.new_episode()
        game.send_game_command("god")
        game.make_action(_NO_INPUT, WARMUP_TICS)
        target = np.array([self.layout.x, self.layout.y])
        if not any(self._try_pose(target) for _ in range(START_TRIES)):
            raise RuntimeError(f"layout {self.layout.name}: no start pose sees the target")
        self._step = 0
        self._obs = self._observe(game.get_state())
        return self._obs, self._info()

    def step(self, action):
        if self._obs is None:
            raise LeaklabError("step() called before reset(); call env.reset(seed=...) first")
        if isinstance(action, np.ndarray) and action.shape == () and np.issubdtype(action.dtype, np.integer):
            action = action[()]  # a 0-d integer array, which the action space contains too
        if not isinstance(action, (int, np.integer)) or isinstance(action, bool) or not 0 <= action < len(ACTIONS):
            raise LeaklabError(f"action must be an integer in range({len(ACTIONS)}), got {action!r}")
        check_own(self._game)
        self._game.make_action(_ACTION_INPUTS[int(action)], TICS_PER_STEP)
        self._step += 1
        truncated = self._step >= self.max_steps
        if self._game.is_episode_finished():
            truncated = True  # the agent walked over a line that ends the map; keep the last view
        else:
            self._obs = self._observe(self._game.get_state())
        reward = reward_from_box(self._obs["box"], self._visible)
        return self._obs, reward, False, truncated, self._info()

    def close(self):
        close_game(self._game)
