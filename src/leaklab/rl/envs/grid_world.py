"""The grid-world floor plans of seed 002, chapter 5 (section 5.6.1), as the thesis reproduces Pan et al.'s
privacy-leakage attack.

A map is a boolean array, True for free space, False for a wall or an obstacle, with one start and one goal cell.
Its structural constraints (section 5.6.1.2, the attacker's prior knowledge) are checked by :func:`violations`:

* the outermost ring of cells is wall (notes-002 4.5: the table's GRR counts it as known);
* the start and the goal are distinct free cells;
* every free cell reaches every other by the agent's moves (4-connected), so shortest paths are defined;
* a floor plan's walls are one cell thick: no 2x2 window is all wall (every window, the border's included).

The agent moves up, down, left, right or stays (:data:`ACTIONS`); it observes its 8 neighbouring cells
(section 5.6.1.3, :data:`NEIGHBOURS`: up, down, left, right, then the diagonals), 1 for free and 0 for wall.
The reward (section 5.6.2.2) is +1 on reaching the goal, which ends the episode, -0.1 for a move into a wall or
for staying (the agent does not move), 0 for a move into free space. :class:`GridBatch` steps many agents, each
in its own map, at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from leaklab.errors import LeaklabError

ACTIONS = ("up", "down", "left", "right", "stay")
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1), (0, 0)], dtype=np.int64)  # (row, column) per action
NEIGHBOURS = np.array([(-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)], dtype=np.int64)
GOAL_REWARD = 1.0
BUMP_REWARD = -0.1  # into a wall, or "stay"
MIN_SIDE = 4  # a map smaller than 4x4 has at most one interior cell: no start and goal


@dataclass(frozen=True)
class GridMap:
    """A floor plan: ``free[r, c]`` True for free space; ``start`` and ``goal`` as (row, column)."""

    free: np.ndarray
    start: tuple[int, int]
    goal: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return self.free.shape

    def interior(self) -> np.ndarray:
        """The cells the attacker does not know (all but the outer ring), as a boolean mask."""
        mask = np.zeros(self.shape, dtype=bool)
        mask[1:-1, 1:-1] = True
        return mask

    def to_json(self) -> dict:
        return {"rows": ["".join("." if f else "#" for f in row) for row in self.free],
                "start": list(self.start), "goal": list(self.goal)}

    @classmethod
    def from_json(cls, data: dict) -> "GridMap":
        """A map from :meth:`to_json`'s form (``#`` wall, ``.`` free); refused unless it meets the constraints."""
        if not isinstance(data, dict):
            raise LeaklabError("a grid map is an object with its rows, start and goal")
        rows = data.get("rows")
        if not isinstance(rows, list) or not rows or any(not isinstance(r, str) for r in rows) \
                or len({len(r) for r in rows}) != 1 or any(set(r) - {"#", "."} for r in rows):
            raise LeaklabError("a grid map's rows must be equal-length strings of '#' (wall) and '.' (free)")
        cells = [data.get("start"), data.get("goal")]
        if any(not isinstance(c, list) or len(c) != 2 or any(type(v) is not int for v in c) for c in cells):
            raise LeaklabError("a grid map needs its start and goal as [row, column], two whole numbers")
        start, goal = (tuple(c) for c in cells)
        grid = cls(np.array([[ch == "." for ch in r] for r in rows]), start, goal)
        problems = violations(grid.free, grid.start, grid.goal)
        if problems:
            raise LeaklabError(f"the grid map breaks its constraints: {problems[0]}")
        return grid


def _inside(shape: tuple[int, int], cell: tuple[int, int]) -> bool:
    return 0 <= cell[0] < shape[0] and 0 <= cell[1] < shape[1]


def violations(free: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    """The structural constraints (section 5.6.1.2) ``free`` breaks with this start and goal; empty when none."""
    problems = []
    if free.ndim != 2 or min(free.shape) < MIN_SIDE:
        return [f"a map must be at least {MIN_SIDE}x{MIN_SIDE}, not {'x'.join(map(str, free.shape))}"]
    if free[0].any() or free[-1].any() or free[:, 0].any() or free[:, -1].any():
        problems.append("its outer ring must be wall")
    for name, cell in (("start", start), ("goal", goal)):
        if not _inside(free.shape, cell) or not free[cell]:
            problems.append(f"the {name} {list(cell)} must be a free cell")
    if start == goal:
        problems.append("the start and the goal must differ")
    if not connected(free):
        problems.append("every free cell must reach every other")
    if two_by_two_walls(free).any():
        problems.append("no 2x2 block may be all wall")
    return problems


def two_by_two_walls(free: np.ndarray) -> np.ndarray:
    """``[r, c]`` True where the 2x2 window with top-left corner (r, c) is all wall."""
    wall = ~free
    return wall[:-1, :-1] & wall[1:, :-1] & wall[:-1, 1:] & wall[1:, 1:]


def distances(free: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    """Moves from every cell to ``target`` by breadth-first search (4-connected); -1 where unreachable or wall."""
    dist = np.full(free.shape, -1, dtype=np.int64)
    if not free[target]:
        return dist
    dist[target] = 0
    queue = deque([target])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES[:4]:
            nr, nc = r + dr, c + dc
            if 0 <= nr < free.shape[0] and 0 <= nc < free.shape[1] and free[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def connected(free: np.ndarray) -> bool:
    """Whether every free cell reaches every other by the agent's moves (True for a map with no free cell)."""
    return ndimage.label(free)[1] <= 1  # scipy's default structure is 4-connectivity in 2-D


def optimal_actions(dist: np.ndarray) -> np.ndarray:
    """``[r, c, a]`` True where action ``a`` at free cell (r, c) moves one step closer to the goal whose
    :func:`distances` are ``dist`` (all False at the goal and at walls)."""
    h, w = dist.shape
    padded = np.full((h + 2, w + 2), -1, dtype=np.int64)
    padded[1:-1, 1:-1] = dist
    out = np.zeros((h, w, len(ACTIONS)), dtype=bool)
    for a, (dr, dc) in enumerate(MOVES[:4]):
        nxt = padded[1 + dr:1 + dr + h, 1 + dc:1 + dc + w]
        out[:, :, a] = (dist > 0) & (nxt >= 0) & (nxt == dist - 1)
    return out


def observations(free: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """The 8 neighbour cells of each of ``cells`` ([n, 2] rows and columns of free cells), 1.0 free, 0.0 wall,
    in :data:`NEIGHBOURS`' order: ``[n, 8]`` float32 (a neighbour outside the array counts as wall)."""
    h, w = free.shape
    padded = np.zeros((h + 2, w + 2), dtype=np.float32)
    padded[1:-1, 1:-1] = free
    rows = cells[:, None, 0] + 1 + NEIGHBOURS[None, :, 0]
    cols = cells[:, None, 1] + 1 + NEIGHBOURS[None, :, 1]
    return padded[rows, cols]


def add_walls(free: np.ndarray, rng: np.random.Generator, wanted: int, keep: tuple[tuple[int, int], ...] = ()
              ) -> np.ndarray:
    """``free`` with up to ``wanted`` more walls at random interior cells (never those of ``keep``), each kept only
    if the map still meets the constraints of walls (connected free space, no all-wall 2x2 block)."""
    free = free.copy()
    cells = [tuple(c) for c in np.argwhere(free[1:-1, 1:-1]) + 1]
    cells = [c for c in cells if c not in keep]
    walls = 0
    for i in rng.permutation(len(cells)):
        if walls >= wanted:
            break
        r, c = cells[i]
        free[r, c] = False
        if two_by_two_walls(free[r - 1:r + 2, c - 1:c + 2]).any() or not connected(free) or free.sum() < 2:
            free[r, c] = True
        else:
            walls += 1
    return free


def open_plan(height: int, width: int) -> np.ndarray:
    """A ``height`` x ``width`` map's free cells before any wall but the outer ring's."""
    if min(height, width) < MIN_SIDE:
        raise LeaklabError(f"a grid map must be at least {MIN_SIDE}x{MIN_SIDE}, not {height}x{width}")
    free = np.zeros((height, width), dtype=bool)
    free[1:-1, 1:-1] = True
    return free


def observation_codes(free: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Each cell's :func:`observations` as one whole number in [0, 256): element ``i`` worth ``2**i``."""
    return (observations(free, cells) @ (1 << np.arange(len(NEIGHBOURS)))).astype(np.int64)


def random_map(height: int, width: int, rng: np.random.Generator, wall_fraction: float = 0.3,
               min_distance: float = 0.75, reactive: bool = False, tries: int = 1000) -> GridMap:
    """A random map under the constraints: the interior starts free and walls are added at random cells
    (:func:`add_walls`) until ``wall_fraction`` of the interior is wall or no cell can take one. The start is a
    random free cell, the goal a random free cell at least ``min_distance`` of the farthest free cell's distance from
    it (the thesis' generator is not published; its 12x11 example's shortest path is 17 moves). With ``reactive``,
    maps are drawn again (up to ``tries`` times) until :func:`reactive_path` holds: the thesis' agents, which see
    only their 8 neighbours, walked their maps' shortest paths (Table 5.3's 17 moves), which such a map allows."""
    if not 0 <= wall_fraction < 1:
        raise LeaklabError(f"wall_fraction must lie in [0, 1), not {wall_fraction}")
    for _ in range(tries):
        grid = _draw_map(height, width, rng, wall_fraction, min_distance)
        if not reactive or reactive_path(grid):
            return grid
    raise LeaklabError(f"no {height}x{width} map in {tries} draws lets an agent that sees 8 cells walk a shortest path")


def _draw_map(height: int, width: int, rng: np.random.Generator, wall_fraction: float, min_distance: float
              ) -> GridMap:
    free = open_plan(height, width)
    free = add_walls(free, rng, int(round(wall_fraction * (height - 2) * (width - 2))))
    cells = np.argwhere(free)
    start = tuple(int(v) for v in cells[rng.integers(len(cells))])
    dist = distances(free, start)
    far = np.argwhere(dist >= max(1, int(np.ceil(min_distance * dist.max()))))
    goal = tuple(int(v) for v in far[rng.integers(len(far))])
    return GridMap(free, start, goal)


def reactive_path(grid: GridMap, budget: int = 20_000) -> bool:
    """Whether an agent that sees only its 8 neighbours can walk a shortest path from the start to the goal: some
    shortest path on which every observation seen at two cells is followed by the same move (so one memoryless
    policy walks it). A depth-first search over the shortest paths, given up (False) after ``budget`` cells."""
    dist = distances(grid.free, grid.goal)
    if dist[grid.start] <= 0:
        return False
    best = optimal_actions(dist)
    codes = np.zeros(grid.shape, dtype=np.int64)
    cells = np.argwhere(grid.free)
    codes[grid.free] = observation_codes(grid.free, cells)
    expanded = 0
    stack: list[tuple[tuple[int, int], dict[int, int]]] = [(grid.start, {})]
    while stack and expanded < budget:
        cell, policy = stack.pop()
        if cell == grid.goal:
            return True
        expanded += 1
        code = int(codes[cell])
        moves = [policy[code]] if code in policy else np.flatnonzero(best[cell]).tolist()
        for a in moves:
            if best[cell][a]:
                stack.append(((cell[0] + int(MOVES[a][0]), cell[1] + int(MOVES[a][1])), {**policy, code: a}))
    return False


class GridBatch:
    """``len(maps)`` agents, agent ``k`` in ``maps[k]``, stepped together (vectorised: one call moves all).

    Maps of different sizes are padded with wall to the largest (an agent never leaves its map, and the padding
    is wall as the map's own border is). Episodes end at the goal or after ``max_steps`` moves; :meth:`reset`
    puts the chosen agents back at their starts.
    """

    def __init__(self, maps: list[GridMap], max_steps: int = 500):
        if not maps:
            raise LeaklabError("a grid batch needs at least one map")
        h = max(m.shape[0] for m in maps)
        w = max(m.shape[1] for m in maps)
        self.free = np.zeros((len(maps), h, w), dtype=bool)
        for k, m in enumerate(maps):
            self.free[k, :m.shape[0], :m.shape[1]] = m.free
        self.starts = np.array([m.start for m in maps], dtype=np.int64)
        self.goals = np.array([m.goal for m in maps], dtype=np.int64)
        self.max_steps = max_steps
        self.pos = self.starts.copy()
        self.steps = np.zeros(len(maps), dtype=np.int64)
        padded = np.zeros((len(maps), h + 2, w + 2), dtype=np.float32)
        padded[:, 1:-1, 1:-1] = self.free
        self._padded = padded

    def __len__(self) -> int:
        return len(self.starts)

    def reset(self, which: np.ndarray) -> None:
        """Agents ``which`` (a boolean mask) back at their starts, their step counts at 0."""
        self.pos[which] = self.starts[which]
        self.steps[which] = 0

    def observe(self) -> np.ndarray:
        """Every agent's 8 neighbour cells: ``[K, 8]`` float32 (:func:`observations`)."""
        k = np.arange(len(self))[:, None]
        rows = self.pos[:, None, 0] + 1 + NEIGHBOURS[None, :, 0]
        cols = self.pos[:, None, 1] + 1 + NEIGHBOURS[None, :, 1]
        return self._padded[k, rows, cols]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move every agent by its action; returns ``(reward, reached_goal, truncated)``, each ``[K]``."""
        target = self.pos + MOVES[actions]
        k = np.arange(len(self))
        ok = self.free[k, target[:, 0], target[:, 1]] & (actions != ACTIONS.index("stay"))
        self.pos = np.where(ok[:, None], target, self.pos)
        self.steps += 1
        reached = (self.pos == self.goals).all(axis=1)
        reward = np.where(reached, GOAL_REWARD, np.where(ok, 0.0, BUMP_REWARD))
        truncated = ~reached & (self.steps >= self.max_steps)
        return reward, reached, truncated
