"""The multi-room floor maps of seed 003, chapter 3 (section 3.4.2, Fig. 3.3): MiniGrid's MultiRoom task, rebuilt
here in numpy (MiniGrid itself needs pygame, which clashes with the ViZDoom stack's pygame-ce).

A floor map (:func:`floor_map`, one per seed, as the thesis' attacker "feeds a randomly generated seed number to the
toolkit's simulator") is a chain of ``rooms`` rectangular rooms, each ``4``..``max_room`` cells a side walls
included, placed as MiniGrid's ``MultiRoomEnv._placeRoom`` places them: the first room at a random spot of a
``size`` x ``size`` grid, each next one through a door in a wall of the previous one (not the wall it was entered
by), not overlapping the rooms before it; a seed whose chain comes out shorter is drawn again from the same
generator (MiniGrid keeps the longest of its tries). Doors start closed (not locked). The agent starts in a random
free cell of the first room facing a random direction, the goal is a random free cell of the last room.

The agent (:class:`RoomBatch`, many agents each in its own map, stepped together) turns left, turns right, moves
forward into an empty cell, an open door or the goal, or toggles the door in front of it (:data:`ACTIONS`, the four
of MiniGrid's seven that this task uses). It sees the 7 x 7 cells ahead of it (MiniGrid's egocentric view: itself at
the bottom centre facing up; cells outside the grid and outside every room read as wall, its own cell as empty),
one-hot per cell: wall, closed door, open door, goal, empty (:data:`CELL_KINDS`); cells hidden behind walls and
closed doors read all zero (MiniGrid's occlusion, ``see_through_walls=False``, the stock MultiRoom's). Reaching
the goal ends the episode with reward ``1 - 0.9 t / T`` (eq. 3.2, t the steps taken, T = ``max_steps``), anything
else gives 0; an episode is cut after ``max_steps`` = 200 steps (the thesis' T).

:func:`optimal_actions` is the attacker's labelling agent: in every state of a map, the actions on a shortest path
to the goal (breadth-first search over position, direction and doors), so a labelling agent needs no training.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from leaklab.errors import LeaklabError

ACTIONS = ("left", "right", "forward", "toggle")
LEFT, RIGHT, FORWARD, TOGGLE = range(len(ACTIONS))
CELL_KINDS = ("wall", "closed door", "open door", "goal", "empty")
SEEN_WALL, SEEN_CLOSED, SEEN_OPEN, SEEN_GOAL, SEEN_EMPTY = range(len(CELL_KINDS))  # a view's codes
EMPTY, WALL, DOOR, GOAL = 0, 1, 2, 3  # a map's cell codes (a door's open state is kept apart)
VIEW = 7
DIRECTIONS = np.array([(1, 0), (0, 1), (-1, 0), (0, -1)], dtype=np.int64)  # (dx, dy): east, south, west, north
MAX_STEPS = 200  # the thesis' T (eq. 3.2)
STEP_PENALTY = 0.9  # the thesis' "gamma" of eq. 3.2
MIN_ROOM = 4
State = tuple[int, int, int, tuple[bool, ...]]  # (x, y, direction, doors open)
PLACEMENT_TRIES = 8  # exit doors tried per room (MiniGrid's)
CHAIN_TRIES = 10_000  # chains drawn before a grid is declared too small (MiniGrid draws forever)


@dataclass(frozen=True)
class FloorMap:
    """One floor map: ``cells[y, x]`` (:data:`EMPTY`, :data:`WALL`, :data:`DOOR`, :data:`GOAL`), the agent's
    ``start`` (x, y), ``direction`` (0 east, 1 south, 2 west, 3 north) and the ``goal`` (x, y)."""

    cells: np.ndarray
    start: tuple[int, int]
    direction: int
    goal: tuple[int, int]
    seed: int

    @property
    def doors(self) -> list[tuple[int, int]]:
        ys, xs = np.nonzero(self.cells == DOOR)
        return list(zip(xs.tolist(), ys.tolist()))


@dataclass(frozen=True)
class _Room:
    top: tuple[int, int]
    size: tuple[int, int]
    entry: tuple[int, int]


def _place(rng: np.random.Generator, left: int, rooms: list[_Room], max_room: int, grid: int, entry_wall: int,
           entry: tuple[int, int]) -> bool:
    """MiniGrid's ``_placeRoom``: a room entered at ``entry`` through its wall ``entry_wall`` (0 right, 1 south, 2
    left, 3 north), then the next ``left - 1`` rooms through its other walls."""
    sx, sy = int(rng.integers(MIN_ROOM, max_room + 1)), int(rng.integers(MIN_ROOM, max_room + 1))
    x, y = entry
    if not rooms:
        tx, ty = x, y
    elif entry_wall == 0:
        tx, ty = x - sx + 1, int(rng.integers(y - sy + 2, y))
    elif entry_wall == 1:
        tx, ty = int(rng.integers(x - sx + 2, x)), y - sy + 1
    elif entry_wall == 2:
        tx, ty = x, int(rng.integers(y - sy + 2, y))
    else:
        tx, ty = int(rng.integers(x - sx + 2, x)), y
    if tx < 0 or ty < 0 or tx + sx > grid or ty + sy >= grid:
        return False
    for r in rooms[:-1]:  # rooms share walls with the one before them only
        if not (tx + sx < r.top[0] or r.top[0] + r.size[0] <= tx or ty + sy < r.top[1] or r.top[1] + r.size[1] <= ty):
            return False
    rooms.append(_Room((tx, ty), (sx, sy), entry))
    if left == 1:
        return True
    for _ in range(PLACEMENT_TRIES):
        exit_wall = int(rng.choice(sorted({0, 1, 2, 3} - {entry_wall})))
        if exit_wall == 0:
            door = (tx + sx - 1, ty + int(rng.integers(1, sy - 1)))
        elif exit_wall == 1:
            door = (tx + int(rng.integers(1, sx - 1)), ty + sy - 1)
        elif exit_wall == 2:
            door = (tx, ty + int(rng.integers(1, sy - 1)))
        else:
            door = (tx + int(rng.integers(1, sx - 1)), ty)
        if _place(rng, left - 1, rooms, max_room, grid, (exit_wall + 2) % 4, door):
            break
    return True


def floor_map(seed: int, rooms: int = 4, max_room: int = 5, size: int = 25) -> FloorMap:
    """The floor map of ``seed``: ``rooms`` rooms of at most ``max_room`` cells a side in a ``size`` grid (the
    thesis' MultiRoom-N4: 4 rooms; MiniGrid's N4 rooms are at most 5 a side in a 25 x 25 grid)."""
    if not 1 <= rooms <= 10 or not MIN_ROOM <= max_room <= 10 or not max_room < size <= 64:
        raise LeaklabError(f"a floor map has 1 to 10 rooms of {MIN_ROOM} to 10 cells a side in a grid wider than a "
                           f"room, up to 64 (got {rooms} rooms, {max_room} a side, grid {size})")
    rng = np.random.default_rng([seed, rooms, max_room, size])
    chain: list[_Room] = []
    for _ in range(CHAIN_TRIES):
        if len(chain) == rooms:
            break
        chain = []
        entry = (int(rng.integers(0, size - 2)), int(rng.integers(0, size - 2)))
        _place(rng, rooms, chain, max_room, size, 2, entry)
    if len(chain) < rooms:
        raise LeaklabError(f"no chain of {rooms} rooms fits a {size} x {size} grid in {CHAIN_TRIES:,} tries")
    cells = np.full((size, size), -1, dtype=np.int8)  # -1: outside every room (drawn as wall below)
    for k, r in enumerate(chain):
        (tx, ty), (sx, sy) = r.top, r.size
        cells[ty:ty + sy, tx:tx + sx] = np.where(cells[ty:ty + sy, tx:tx + sx] == DOOR, DOOR, WALL)
        cells[ty + 1:ty + sy - 1, tx + 1:tx + sx - 1] = EMPTY
        if k > 0:
            cells[r.entry[1], r.entry[0]] = DOOR
    cells[cells < 0] = WALL

    def free_cell(room: _Room) -> tuple[int, int]:
        (tx, ty), (sx, sy) = room.top, room.size
        while True:
            x, y = int(rng.integers(tx + 1, tx + sx - 1)), int(rng.integers(ty + 1, ty + sy - 1))
            if cells[y, x] == EMPTY:
                return x, y

    start = free_cell(chain[0])
    direction = int(rng.integers(0, 4))
    goal = free_cell(chain[-1])
    while goal == start:
        goal = free_cell(chain[-1])
    cells[goal[1], goal[0]] = GOAL
    return FloorMap(cells=cells, start=start, direction=direction, goal=goal, seed=seed)


def _visible(codes: np.ndarray) -> np.ndarray:
    """MiniGrid's ``Grid.process_vis`` on views ``[K, 7, 7]`` (rows from the far end, the agent at the bottom
    centre): what the agent sees, spreading from its cell row by row towards the far end, sideways and one row on,
    through every cell but walls and closed doors."""
    clear = (codes != SEEN_WALL) & (codes != SEEN_CLOSED)
    seen = np.zeros(codes.shape, dtype=bool)
    seen[:, VIEW - 1, VIEW // 2] = True
    for j in range(VIEW - 1, -1, -1):
        for columns, step in ((range(VIEW - 1), 1), (range(VIEW - 1, 0, -1), -1)):
            for i in columns:
                go = seen[:, j, i] & clear[:, j, i]
                seen[:, j, i + step] |= go
                if j > 0:
                    seen[:, j - 1, i + step] |= go
                    seen[:, j - 1, i] |= go
    return seen


def _front(pos: np.ndarray, direction: np.ndarray) -> np.ndarray:
    return pos + DIRECTIONS[direction]


def reward(steps: np.ndarray | int, max_steps: int = MAX_STEPS) -> np.ndarray:
    """Eq. 3.2: the reward for reaching the goal after ``steps`` steps."""
    return 1.0 - STEP_PENALTY * np.asarray(steps, dtype=np.float64) / max_steps


class RoomBatch:
    """``len(maps)`` agents, agent ``k`` in ``maps[k]`` (all of one grid size), stepped together.

    :meth:`observe` gives each agent's view, ``[K, 7 * 7 * 5]`` float32 one-hot cells (:data:`CELL_KINDS`);
    :meth:`step` moves every agent; :meth:`reset` puts chosen agents back at their maps' starts with every door
    closed, or into other maps (:meth:`load`)."""

    def __init__(self, maps: list[FloorMap], max_steps: int = MAX_STEPS):
        if not maps:
            raise LeaklabError("a room batch needs at least one map")
        if len({m.cells.shape for m in maps}) != 1:
            raise LeaklabError("every map of a room batch has the same grid size")
        self.max_steps = max_steps
        self.size = maps[0].cells.shape[0]
        k = len(maps)
        self.cells = np.zeros((k, self.size, self.size), dtype=np.int8)
        self.open = np.zeros((k, self.size, self.size), dtype=bool)
        self.pos = np.zeros((k, 2), dtype=np.int64)
        self.dir = np.zeros(k, dtype=np.int64)
        self.steps = np.zeros(k, dtype=np.int64)
        self.maps = list(maps)
        self.load(np.ones(k, dtype=bool), maps)
        fwd = np.arange(VIEW - 1, -1, -1)  # view row j (0 top) lies VIEW-1-j cells ahead
        side = np.arange(VIEW) - VIEW // 2  # view column i lies i-3 cells to the right
        self._ahead = np.broadcast_to(fwd[:, None], (VIEW, VIEW))
        self._right = np.broadcast_to(side[None, :], (VIEW, VIEW))

    def __len__(self) -> int:
        return len(self.pos)

    def load(self, which: np.ndarray, maps: list[FloorMap]) -> None:
        """Agents ``which`` (a boolean mask) into ``maps`` (one per chosen agent), at their starts."""
        for k, m in zip(np.flatnonzero(which), maps):
            if m.cells.shape != (self.size, self.size):
                raise LeaklabError("every map of a room batch has the same grid size")
            self.maps[k] = m
            self.cells[k] = m.cells
        self.reset(which)

    def reset(self, which: np.ndarray) -> None:
        """Agents ``which`` back at their maps' starts, facing the start direction, every door closed."""
        idx = np.flatnonzero(which)
        self.open[idx] = False
        self.pos[idx] = [self.maps[k].start for k in idx]
        self.dir[idx] = [self.maps[k].direction for k in idx]
        self.steps[idx] = 0

    def state(self, k: int) -> State:
        """Agent ``k``'s state as :func:`optimal_actions` keys it: ``(x, y, direction, doors open)``, the doors in
        :attr:`FloorMap.doors` order."""
        return (int(self.pos[k, 0]), int(self.pos[k, 1]), int(self.dir[k]),
                tuple(bool(self.open[k, y, x]) for x, y in self.maps[k].doors))

    def _cell_codes(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each looked-at cell as an index of :data:`CELL_KINDS` (outside the grid: wall)."""
        k = np.arange(len(self)).reshape((-1,) + (1,) * (x.ndim - 1))
        inside = (x >= 0) & (y >= 0) & (x < self.size) & (y < self.size)
        xc, yc = np.clip(x, 0, self.size - 1), np.clip(y, 0, self.size - 1)
        cell = self.cells[k, yc, xc]
        kind = np.select([cell == WALL, (cell == DOOR) & ~self.open[k, yc, xc], cell == DOOR, cell == GOAL],
                         [SEEN_WALL, SEEN_CLOSED, SEEN_OPEN, SEEN_GOAL], default=SEEN_EMPTY)
        return np.where(inside, kind, SEEN_WALL)

    def observe(self) -> np.ndarray:
        """Every agent's 7 x 7 egocentric view, one-hot per cell: ``[K, 245]`` float32."""
        f = DIRECTIONS[self.dir]  # (dx, dy) ahead
        r = np.stack([-f[:, 1], f[:, 0]], 1)  # to the agent's right
        x = self.pos[:, 0, None, None] + f[:, 0, None, None] * self._ahead + r[:, 0, None, None] * self._right
        y = self.pos[:, 1, None, None] + f[:, 1, None, None] * self._ahead + r[:, 1, None, None] * self._right
        codes = self._cell_codes(x, y)
        codes[:, VIEW - 1, VIEW // 2] = SEEN_EMPTY  # its own cell, a doorway too (MiniGrid's)
        seen = _visible(codes)
        return (np.eye(len(CELL_KINDS), dtype=np.float32)[codes] * seen[..., None]).reshape(len(self), -1)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply one action per agent; returns ``(reward, reached_goal, truncated)``, each ``[K]``."""
        actions = np.asarray(actions, dtype=np.int64)
        if actions.shape != (len(self),) or actions.min(initial=0) < 0 or actions.max(initial=0) >= len(ACTIONS):
            raise LeaklabError(f"one action per agent, each in 0..{len(ACTIONS) - 1}")
        k = np.arange(len(self))
        self.steps += 1
        self.dir = np.where(actions == LEFT, (self.dir - 1) % 4,
                            np.where(actions == RIGHT, (self.dir + 1) % 4, self.dir))
        fx, fy = _front(self.pos, self.dir).T
        inside = (fx >= 0) & (fy >= 0) & (fx < self.size) & (fy < self.size)
        fxc, fyc = np.clip(fx, 0, self.size - 1), np.clip(fy, 0, self.size - 1)
        ahead = np.where(inside, self.cells[k, fyc, fxc], WALL)
        door = ahead == DOOR
        passable = (ahead == EMPTY) | (ahead == GOAL) | (door & self.open[k, fyc, fxc])
        move = (actions == FORWARD) & passable
        self.pos = np.where(move[:, None], np.stack([fxc, fyc], 1), self.pos)
        toggle = (actions == TOGGLE) & door
        self.open[k[toggle], fyc[toggle], fxc[toggle]] ^= True
        reached = move & (ahead == GOAL)
        gained = np.where(reached, reward(self.steps, self.max_steps), 0.0)
        truncated = ~reached & (self.steps >= self.max_steps)
        return gained, reached, truncated


def optimal_actions(floor: FloorMap) -> dict[State, tuple[int, ...]]:
    """The labelling agent: for every state reachable from the start, ``(x, y, direction, doors open)`` with the doors
    in :attr:`FloorMap.doors` order, the actions that start a shortest path to the goal (BFS backwards from the goal
    over the reachable states)."""
    doors = floor.doors
    index = {d: i for i, d in enumerate(doors)}
    size = floor.cells.shape[0]

    def successors(state):
        x, y, d, opened = state
        out = [(x, y, (d - 1) % 4, opened), (x, y, (d + 1) % 4, opened)]
        fx, fy = x + int(DIRECTIONS[d][0]), y + int(DIRECTIONS[d][1])
        cell = floor.cells[fy, fx] if 0 <= fx < size and 0 <= fy < size else WALL
        if cell in (EMPTY, GOAL) or (cell == DOOR and opened[index[(fx, fy)]]):
            out.append((fx, fy, d, opened))
        else:
            out.append(state)
        if cell == DOOR:
            i = index[(fx, fy)]
            out.append((x, y, d, opened[:i] + (not opened[i],) + opened[i + 1:]))
        else:
            out.append(state)
        return out

    start = (*floor.start, floor.direction, (False,) * len(doors))
    edges, seen, queue = {}, {start}, deque([start])
    while queue:  # every state reachable from the start, with its successor per action
        s = queue.popleft()
        if (s[0], s[1]) == floor.goal:
            continue  # the episode ends there
        edges[s] = successors(s)
        for t in edges[s]:
            if t not in seen:
                seen.add(t)
                queue.append(t)
    parents: dict = {}
    for s, succ in edges.items():
        for t in succ:
            parents.setdefault(t, []).append(s)
    dist = {s: 0 for s in seen if (s[0], s[1]) == floor.goal}
    queue = deque(dist)
    while queue:
        t = queue.popleft()
        for s in parents.get(t, []):
            if s not in dist:
                dist[s] = dist[t] + 1
                queue.append(s)
    if start not in dist:
        raise LeaklabError(f"floor map {floor.seed}: the goal cannot be reached")
    return {s: tuple(a for a, t in enumerate(succ) if dist.get(t, -1) == dist[s] - 1)
            for s, succ in edges.items() if s in dist}
