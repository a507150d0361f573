"""Seed 002, chapter 5: the grid worlds (section 5.6.1), DP-DRL (Algorithms 9 and 10) and its DQN (Algorithm 11)."""

from __future__ import annotations

import math

import numpy as np
import pydantic
import pytest
import torch

from leaklab.defenses.dp_drl import flips, obfuscate, roulette, scores, selection_probabilities
from leaklab.errors import LeaklabError
from leaklab.rl.agents.grid_dqn import GridDQNConfig, StackedMLP, q_values, train_grid_dqn
from leaklab.rl.envs.grid_world import (NEIGHBOURS, GridBatch, GridMap, connected, distances, observations,
                                        optimal_actions, random_map, reactive_path, two_by_two_walls, violations)

UP, DOWN, LEFT, RIGHT, STAY = range(5)

# A 6x6 map that meets every constraint: two interior walls, start top-left, goal bottom-right.
GOOD = ["######",
        "#....#",
        "#.#..#",
        "#....#",
        "#..#.#",
        "######"]


def _free(rows: list[str]) -> np.ndarray:
    return np.array([[ch == "." for ch in r] for r in rows])


def _good() -> GridMap:
    return GridMap(_free(GOOD), (1, 1), (4, 4))


def _walls_possible(free: np.ndarray) -> list[tuple[int, int]]:
    """Free interior cells that could still become wall without breaking the 2x2 or the connectivity rule."""
    out = []
    for r, c in np.argwhere(free):
        trial = free.copy()
        trial[r, c] = False
        if not two_by_two_walls(trial).any() and connected(trial) and trial.sum() >= 2:
            out.append((int(r), int(c)))
    return out


# ---------------------------------------------------------------------------------------------------- grid world

@pytest.mark.parametrize("shape", [(7, 7), (9, 9), (11, 11), (12, 11)])
def test_random_maps_meet_the_constraints_the_wall_share_and_the_goal_distance(shape):
    h, w = shape
    interior = (h - 2) * (w - 2)
    for seed in range(5):
        grid = random_map(h, w, np.random.default_rng(seed), wall_fraction=0.3)
        assert grid.shape == shape
        assert violations(grid.free, grid.start, grid.goal) == []
        walls = int((~grid.free[1:-1, 1:-1]).sum())
        wanted = round(0.3 * interior)
        assert walls <= wanted and abs(walls / interior - 0.3) <= 0.05
        assert walls == wanted or _walls_possible(grid.free) == []  # short only where no cell can take a wall
        dist = distances(grid.free, grid.start)
        assert dist[grid.goal] >= 0.75 * dist.max() and dist[grid.goal] > 0


def test_a_random_map_asked_for_too_many_walls_stops_only_when_no_cell_can_take_one():
    for seed in range(3):
        grid = random_map(9, 9, np.random.default_rng(seed), wall_fraction=0.9)
        assert violations(grid.free, grid.start, grid.goal) == []
        assert (~grid.free[1:-1, 1:-1]).mean() < 0.9
        assert _walls_possible(grid.free) == []


def test_random_map_is_fixed_by_its_seed():
    a, b = (random_map(11, 11, np.random.default_rng(7)) for _ in range(2))
    assert np.array_equal(a.free, b.free) and a.start == b.start and a.goal == b.goal
    others = [random_map(11, 11, np.random.default_rng(s)) for s in range(8, 12)]
    assert any(not np.array_equal(a.free, o.free) or a.start != o.start for o in others)


@pytest.mark.parametrize("args", [(3, 5, 0.3), (5, 3, 0.3), (7, 7, 1.0), (7, 7, -0.1)])
def test_random_map_refuses_a_tiny_map_or_an_impossible_wall_fraction(args):
    h, w, frac = args
    with pytest.raises(LeaklabError):
        random_map(h, w, np.random.default_rng(0), wall_fraction=frac)


def test_violations_names_each_broken_constraint():
    good = _good()
    assert violations(good.free, good.start, good.goal) == []

    def only(free, start, goal, words):
        problems = violations(free, start, goal)
        assert len(problems) == 1 and words in problems[0], problems

    border = good.free.copy()
    border[0, 2] = True  # a free border cell, next to the free (1, 2)
    only(border, good.start, good.goal, "outer ring")
    only(good.free, (2, 2), good.goal, "start [2, 2] must be a free cell")
    only(good.free, good.start, (0, 3), "goal [0, 3] must be a free cell")
    only(good.free, good.start, (9, 9), "goal [9, 9] must be a free cell")  # outside the map
    only(good.free, (1, 1), (1, 1), "must differ")
    split = _free(["######",
                   "#..#.#",
                   "#..#.#",
                   "#..#.#",
                   "#..#.#",
                   "######"])
    assert not two_by_two_walls(split).any()
    only(split, (1, 1), (4, 4), "every free cell must reach every other")
    block = np.zeros((7, 7), dtype=bool)
    block[1:-1, 1:-1] = True
    block[2:4, 2:4] = False  # a 2x2 wall block inside, the rest connected
    only(block, (1, 1), (5, 5), "2x2")
    corner = good.free.copy()
    corner[1, 1] = False  # with the border: the window (0, 0)-(1, 1) is all wall
    only(corner, (3, 1), good.goal, "2x2")
    assert len(violations(np.zeros((3, 5), dtype=bool), (1, 1), (1, 2))) == 1


def test_distances_and_optimal_actions_in_a_corridor():
    free = np.zeros((5, 7), dtype=bool)
    free[2, 1:6] = True
    dist = distances(free, (2, 5))
    expected = np.full((5, 7), -1)
    expected[2, 1:6] = [4, 3, 2, 1, 0]
    assert np.array_equal(dist, expected)
    best = optimal_actions(dist)
    assert best.shape == (5, 7, 5)
    want = np.zeros((5, 7, 5), dtype=bool)
    want[2, 1:5, RIGHT] = True  # the only optimal move, everywhere but the goal
    assert np.array_equal(best, want)
    assert not best[2, 5].any() and not best[~free].any() and not best[..., STAY].any()
    assert np.array_equal(distances(free, (0, 0)), np.full((5, 7), -1))  # a wall target: nothing reaches it


def test_optimal_actions_keep_every_shortest_move():
    free = np.zeros((5, 5), dtype=bool)
    free[1:-1, 1:-1] = True
    dist = distances(free, (1, 1))
    rows, cols = np.indices((5, 5))
    assert np.array_equal(dist[1:-1, 1:-1], (rows + cols - 2)[1:-1, 1:-1])
    best = optimal_actions(dist)
    assert best[3, 3].tolist() == [True, False, True, False, False]  # up or left
    assert best[1, 3].tolist() == [False, False, True, False, False]
    assert best[3, 1].tolist() == [True, False, False, False, False]
    assert not best[1, 1].any() and not best[..., STAY].any()


def test_observations_follow_the_neighbour_order():
    assert NEIGHBOURS.tolist() == [[-1, 0], [1, 0], [0, -1], [0, 1], [-1, -1], [-1, 1], [1, -1], [1, 1]]
    free = np.zeros((5, 5), dtype=bool)
    free[2, 2] = True
    for r, c in [(1, 2), (2, 1), (1, 3), (3, 1)]:  # up, left, up-right, down-left free
        free[r, c] = True
    obs = observations(free, np.array([[2, 2], [0, 0], [1, 2]]))
    assert obs.dtype == np.float32 and obs.shape == (3, 8)
    assert obs[0].tolist() == [1, 0, 1, 0, 0, 1, 1, 0]
    assert obs[1].tolist() == [0, 0, 0, 0, 0, 0, 0, 0]  # outside the array counts as wall
    assert obs[2].tolist() == [0, 1, 0, 1, 0, 0, 1, 0]  # (1, 2): down (2, 2), right (1, 3), down-left (2, 1)


def test_grid_map_json_round_trip():
    for grid in (_good(), random_map(12, 11, np.random.default_rng(3))):
        data = grid.to_json()
        assert set("".join(data["rows"])) <= {"#", "."} and len(data["rows"]) == grid.shape[0]
        back = GridMap.from_json(data)
        assert np.array_equal(back.free, grid.free) and back.start == grid.start and back.goal == grid.goal
    assert _good().to_json()["rows"] == GOOD and _good().to_json()["start"] == [1, 1]


@pytest.mark.parametrize("data", [
    {"rows": GOOD[:-1] + ["#####"], "start": [1, 1], "goal": [4, 4]},  # ragged
    {"rows": GOOD[:-1] + ["###x##"], "start": [1, 1], "goal": [4, 4]},  # a bad character
    {"rows": [], "start": [1, 1], "goal": [4, 4]},
    {"rows": GOOD, "goal": [4, 4]},  # no start
    {"rows": GOOD, "start": [1, 1, 1], "goal": [4, 4]},
    {"rows": GOOD, "start": "a", "goal": [4, 4]},
    {"rows": ["#.####"] + GOOD[1:], "start": [1, 1], "goal": [4, 4]},  # a free border cell
    {"rows": GOOD, "start": [2, 2], "goal": [4, 4]},  # the start on a wall
])
def test_grid_map_from_json_refuses_a_bad_map_in_one_line(data):
    with pytest.raises(LeaklabError) as err:
        GridMap.from_json(data)
    assert str(err.value) and "\n" not in str(err.value)


def test_grid_batch_rewards_moves_and_bumps():
    free = _free(GOOD)
    # agent 0 one step above the goal, 1 against the top wall, 2 stays, 3 moves into free space
    maps = [GridMap(free, (3, 4), (4, 4)), GridMap(free, (1, 1), (4, 4)), GridMap(free, (1, 1), (4, 4)),
            GridMap(free, (1, 1), (4, 4))]
    env = GridBatch(maps, max_steps=10)
    reward, reached, truncated = env.step(np.array([DOWN, UP, STAY, RIGHT]))
    assert reward.dtype == np.float64
    assert reward.tolist() == pytest.approx([1.0, -0.1, -0.1, 0.0])
    assert reached.tolist() == [True, False, False, False] and not truncated.any()
    assert env.pos.tolist() == [[4, 4], [1, 1], [1, 1], [1, 2]]
    assert env.steps.tolist() == [1, 1, 1, 1]
    env.reset(reached)
    assert env.pos[0].tolist() == [3, 4] and env.steps.tolist() == [0, 1, 1, 1]
    # (3,4)->(2,4) free; (1,1)->(2,1) free; (1,1)->(1,0) wall; (1,2)->(2,2) wall
    reward, reached, _ = env.step(np.array([UP, DOWN, LEFT, DOWN]))
    assert reward.tolist() == pytest.approx([0.0, 0.0, -0.1, -0.1]) and not reached.any()
    assert env.pos.tolist() == [[2, 4], [2, 1], [1, 1], [1, 2]]


def test_grid_batch_truncates_after_max_steps_unless_at_the_goal():
    free = _free(GOOD)
    env = GridBatch([GridMap(free, (1, 1), (4, 4)), GridMap(free, (1, 4), (4, 4))], max_steps=3)
    for step in range(3):
        _, reached, truncated = env.step(np.array([STAY, DOWN]))
        assert truncated.tolist() == [step == 2, False]
        assert reached.tolist() == [False, step == 2]  # agent 1 reaches the goal on the last step


def test_grid_batch_reset_puts_back_only_the_masked_agents():
    free = _free(GOOD)
    env = GridBatch([GridMap(free, (1, 1), (4, 4))] * 3, max_steps=10)
    env.step(np.array([RIGHT, DOWN, RIGHT]))
    env.step(np.array([RIGHT, DOWN, RIGHT]))
    moved = env.pos.copy()
    env.reset(np.array([True, False, True]))
    assert env.pos.tolist() == [[1, 1], moved[1].tolist(), [1, 1]]
    assert env.steps.tolist() == [0, 2, 0]


def test_grid_batch_with_maps_of_different_sizes():
    small, large = _good(), random_map(9, 11, np.random.default_rng(0))
    env = GridBatch([small, large], max_steps=100)
    assert env.free.shape == (2, 9, 11) and not env.free[0, 6:].any() and not env.free[0, :, 6:].any()
    # walk the small map's agent to its last free row and column, then push against its edge
    for action in (RIGHT, RIGHT, RIGHT, DOWN, DOWN):
        env.step(np.array([action, STAY]))
    assert env.pos[0].tolist() == [3, 4]
    reward, _, _ = env.step(np.array([RIGHT, STAY]))
    assert env.pos[0].tolist() == [3, 4] and reward[0] == pytest.approx(-0.1)
    env.pos[0] = [1, 4]
    reward, _, _ = env.step(np.array([RIGHT, STAY]))
    assert env.pos[0].tolist() == [1, 4] and reward[0] == pytest.approx(-0.1)
    rng = np.random.default_rng(1)
    env.reset(np.array([True, True]))
    for _ in range(60):
        for k, grid in enumerate((small, large)):
            assert grid.free[tuple(env.pos[k])]  # never off its own free cells
            assert np.array_equal(env.observe()[k], observations(grid.free, env.pos[k:k + 1])[0])
        _, reached, truncated = env.step(rng.integers(5, size=2))
        env.reset(reached | truncated)


def test_grid_batch_needs_a_map():
    with pytest.raises(LeaklabError):
        GridBatch([])


# ---------------------------------------------------------------------------------------------------- DP-DRL

def test_flips_change_exactly_one_element():
    obs = (torch.rand(6, 8, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    kept = obs.clone()
    out = flips(obs)
    assert out.shape == (6, 8, 8) and torch.equal(obs, kept)
    assert set(out.unique().tolist()) <= {0.0, 1.0}
    for i in range(8):
        diff = out[:, i] != obs
        assert diff[:, i].all() and diff.sum().item() == 6
        assert torch.equal(out[:, i, i], 1 - obs[:, i])


def test_scores_by_hand():
    q0 = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    offsets = torch.tensor([[3.0, 4.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    sr, spread = scores(q0, q0[:, None] + offsets[None])  # d = 5, 1, 2, 3
    assert spread.tolist() == pytest.approx([4.0])
    assert sr[0].tolist() == pytest.approx([1.0, 10.0, 10 ** 0.75, 10 ** 0.5])
    sr2, _ = scores(q0, q0[:, None] + offsets[None], n_scale=2.0)
    assert sr2[0].tolist() == pytest.approx([1.0, 2.0, 2 ** 0.75, 2 ** 0.5])
    same = torch.tensor([[[1.0, 0.0], [0.0, -1.0], [0.6, 0.8]]])  # all at distance 1
    sr3, spread3 = scores(torch.zeros(1, 2), same)
    assert sr3.tolist() == [[10.0, 10.0, 10.0]] and spread3.tolist() == [0.0]


def test_selection_probabilities_have_the_top_two_gap_ratio():
    gen = torch.Generator().manual_seed(1)
    sr = 1 + 9 * torch.rand(200, 8, generator=gen, dtype=torch.float64)
    for value in (0.1, 0.5, 1.0, 1.5):
        eps = torch.full((200,), value, dtype=torch.float64)
        p = selection_probabilities(sr, eps)
        assert torch.allclose(p.sum(1), torch.ones(200, dtype=torch.float64))
        order = sr.argsort(dim=1, descending=True)
        top, second = p.gather(1, order[:, :1]), p.gather(1, order[:, 1:2])
        assert torch.allclose(top / second, torch.full_like(top, math.exp(value / 2)))
        assert (p.gather(1, order).diff(dim=1) <= 0).all()  # a higher score, a higher probability
        gap = (sr.gather(1, order[:, :1]) - sr.gather(1, order[:, 1:2]))
        literal = torch.exp(value * (sr - sr.max(1, keepdim=True).values) / (2 * gap))
        assert torch.allclose(p, literal / literal.sum(1, keepdim=True))


def test_selection_probabilities_ties_and_limits():
    sr = torch.tensor([[10.0, 5.0, 10.0, 1.0], [7.0, 7.0, 7.0, 7.0], [3.0, 9.0, 9.0, 9.0]])
    p = selection_probabilities(sr, torch.ones(3))
    assert torch.allclose(p, torch.tensor([[0.5, 0, 0.5, 0], [0.25] * 4, [0, 1 / 3, 1 / 3, 1 / 3]]))
    one = torch.tensor([[10.0, 9.0, 5.0, 1.0]])
    assert selection_probabilities(one, torch.tensor([1e4]))[0, 0] == pytest.approx(1.0)
    assert selection_probabilities(one, torch.tensor([0.0]))[0].tolist() == pytest.approx([0.25] * 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selection_probabilities_stay_finite_with_a_tiny_gap(dtype):
    sr = torch.tensor([[10.0, 10.0 - 1e-9, 5.0, 1.0, 1.0, 9.9, 2.0, 3.0]], dtype=torch.float64).to(dtype)
    p = selection_probabilities(sr, torch.tensor([1.5], dtype=dtype))
    assert torch.isfinite(p).all() and p.sum().item() == pytest.approx(1.0) and (p[0, 2:] == 0).all()
    if dtype == torch.float64:  # the gap survives: the top-two ratio is still exp(eps / 2)
        assert (p[0, 0] / p[0, 1]).item() == pytest.approx(math.exp(0.75))
    else:  # 10 - 1e-9 is 10 in float32: a tie
        assert p[0, :2].tolist() == [0.5, 0.5]


def _linear_q(seed: int = 0):
    w = torch.randn(8, 5, generator=torch.Generator().manual_seed(seed))
    return w, (lambda x: x @ w)


def _relu_q(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(8, 16, generator=gen), torch.randn(16, 5, generator=gen)
    return lambda x: torch.relu(x @ w1 - 0.5) @ w2


def test_obfuscate_draws_by_the_exponential_mechanism():
    w, q_function = _linear_q()
    rows = 20_000
    obs = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]).repeat(rows, 1)
    sr, spread = scores(q_function(obs[:1]), q_function(flips(obs[:1])))
    norms = w.norm(dim=1)  # a linear Q: flipping element i moves the values by +-w[i]
    assert spread.item() == pytest.approx((norms.max() - norms.min()).item(), rel=1e-5)
    for eps in (0.5, 2.0):
        out, chosen, budget = obfuscate(obs, q_function, torch.full((rows,), eps), np.random.default_rng(0))
        assert torch.allclose(budget, torch.full((rows,), eps))
        p = selection_probabilities(sr, torch.tensor([eps]))[0].double()
        freq = torch.bincount(chosen, minlength=8).double() / rows
        err = (p * (1 - p) / rows).sqrt()
        assert ((freq - p).abs() <= 4.5 * err + 1e-9).all(), (freq, p)
        diff = out != obs
        assert (diff.sum(1) == 1).all() and diff[torch.arange(rows), chosen].all()
        assert set(out.unique().tolist()) <= {0.0, 1.0}


def test_obfuscate_dynamic_and_mixed_budgets():
    q_function = _relu_q()
    obs = (torch.rand(50, 8, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    with torch.no_grad():
        _, spread = scores(q_function(obs), q_function(flips(obs)))
    assert spread.unique().numel() > 1  # the rows' spreads differ: the check below is per row
    _, _, budget = obfuscate(obs, q_function, None, np.random.default_rng(0))
    assert torch.allclose(budget, torch.atan(spread))
    assert (budget >= 0).all() and (budget < math.pi / 2).all()
    eps = torch.full((50,), math.nan)
    eps[::2] = 0.3
    _, _, mixed = obfuscate(obs, q_function, eps, np.random.default_rng(0))
    assert torch.allclose(mixed[::2], torch.full((25,), 0.3))
    assert torch.allclose(mixed[1::2], torch.atan(spread[1::2]))


def test_obfuscate_is_fixed_by_the_numpy_seed():
    q_function = _relu_q(1)
    obs = (torch.rand(1000, 8, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    eps = torch.full((1000,), 0.2)
    a = obfuscate(obs, q_function, eps, np.random.default_rng(5))
    b = obfuscate(obs, q_function, eps, np.random.default_rng(5))
    c = obfuscate(obs, q_function, eps, np.random.default_rng(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])


# ---------------------------------------------------------------------------------------------------- grid DQN

def test_stacked_mlp_is_k_separate_networks():
    net = StackedMLP(3, 16, torch.Generator().manual_seed(0))
    x = torch.rand(3, 7, 8, generator=torch.Generator().manual_seed(1))
    batched = net(x)
    assert batched.shape == (3, 7, 5)
    for j in range(3):
        assert torch.allclose(batched[j], q_values(net.agent(j), x[j]), atol=1e-6)
    assert not torch.allclose(batched[0], batched[1])  # each agent its own weights
    again = StackedMLP(3, 16, torch.Generator().manual_seed(0))
    assert all(torch.equal(p, q) for p, q in zip(net.params, again.params))


def test_stacked_mlp_agent_with_one_hidden_unit():
    net = StackedMLP(2, 1, torch.Generator().manual_seed(0))
    x = torch.rand(2, 3, 8)
    assert torch.allclose(net(x)[0], q_values(net.agent(0), x[0]), atol=1e-6)


def _tiny_config(**changes) -> GridDQNConfig:
    settings = dict(episodes=30, max_steps=50, learning_starts=20, batch_size=8, buffer_size=200, hidden=16,
                    target_sync=25, seed=0)
    settings.update(changes)
    return GridDQNConfig(**settings)


def test_train_grid_dqn_runs_and_is_fixed_by_its_seed():
    maps = [random_map(5, 5, np.random.default_rng(s)) for s in (0, 1)]
    config = _tiny_config()
    net, training = train_grid_dqn(maps, [None, 0.5], config)
    assert [len(r) for r in training.returns] == [30, 30] and [len(n) for n in training.lengths] == [30, 30]
    for returns, lengths in zip(training.returns, training.lengths):
        for ret, length in zip(returns, lengths):
            assert -0.1 * 50 - 1e-6 <= ret <= 1.0 + 1e-6 and 1 <= length <= 50
            if length < 50:  # ended at the goal: +1 and at most length - 1 bumps before it
                assert ret >= 1.0 - 0.1 * (length - 1) - 1e-6
    assert training.steps == max(sum(lengths) for lengths in training.lengths)
    assert training.obfuscation_seconds_per_step > 0
    net2, _ = train_grid_dqn(maps, [None, 0.5], config)
    assert all(torch.equal(p, q) for p, q in zip(net.params, net2.params))
    net3, _ = train_grid_dqn(maps, [None, 0.5], _tiny_config(seed=1, episodes=5))
    assert not all(torch.equal(p, q) for p, q in zip(net.params, net3.params))


def test_train_grid_dqn_dynamic_budget_and_no_defense():
    maps = [random_map(5, 5, np.random.default_rng(2))]
    _, dynamic = train_grid_dqn(maps, ["dynamic"], _tiny_config(episodes=3, max_steps=10))
    assert len(dynamic.returns[0]) == 3 and dynamic.obfuscation_seconds_per_step > 0
    _, plain = train_grid_dqn(maps, [None], _tiny_config(episodes=3, max_steps=10))
    assert plain.obfuscation_seconds_per_step == 0.0
    with pytest.raises(ValueError):
        train_grid_dqn(maps, [None, None], _tiny_config(episodes=1))


def test_grid_dqn_config_forbids_unknown_fields():
    with pytest.raises(pydantic.ValidationError):
        GridDQNConfig(episodes=10, epsilon=0.5)
    with pytest.raises(pydantic.ValidationError):
        GridDQNConfig(episodes=0)
    assert GridDQNConfig().n_scale == 10.0


def _walkable_by_brute_force(grid: GridMap) -> bool:
    """Every shortest path enumerated; one whose cells of one observation all take one move."""
    dist = distances(grid.free, grid.goal)
    best = optimal_actions(dist)

    def paths(cell):
        if cell == grid.goal:
            yield []
            return
        for a in np.flatnonzero(best[cell]):
            step = ((-1, 0), (1, 0), (0, -1), (0, 1))[a]
            for rest in paths((cell[0] + step[0], cell[1] + step[1])):
                yield [(cell, a)] + rest

    weights = 1 << np.arange(8)
    for path in paths(grid.start):
        moves = {}
        if all(moves.setdefault(int((observations(grid.free, np.array([c])) @ weights)[0]), a) == a for c, a in path):
            return True
    return False


def test_reactive_path_agrees_with_every_shortest_path_enumerated():
    rng = np.random.default_rng(7)
    answers = []
    for _ in range(40):
        grid = random_map(7, 7, rng)
        answers.append(reactive_path(grid))
        assert answers[-1] == _walkable_by_brute_force(grid)
    assert any(answers) and not all(answers)


def test_random_map_reactive_draws_only_walkable_maps():
    rng = np.random.default_rng(4)
    for size in ((9, 9), (12, 11)):
        for _ in range(5):
            assert reactive_path(random_map(*size, rng, reactive=True))
    seed = next(s for s in range(100) if not reactive_path(random_map(12, 11, np.random.default_rng(s))))
    with pytest.raises(LeaklabError, match="8 cells"):
        random_map(12, 11, np.random.default_rng(seed), reactive=True, tries=1)


def test_train_grid_dqn_with_position_feeds_ten_inputs():
    maps = [random_map(5, 5, np.random.default_rng(s)) for s in (0, 1)]
    net, training = train_grid_dqn(maps, [None, "dynamic"], _tiny_config(position=True))
    assert net.params[0].shape == (2, 10, 16)
    assert [len(r) for r in training.returns] == [30, 30]
    x = torch.rand(2, 3, 10)
    assert torch.allclose(net(x)[1], q_values(net.agent(1), x[1]), atol=1e-6)


def test_roulette_leaves_no_gap_at_the_wheel_end_and_skips_zero_probabilities():
    p = torch.tensor([[0.7, 0.2, 0.1, 0, 0, 0, 0, 0]], dtype=torch.float32)  # sums to 1 - 7.45e-9 in float32
    assert roulette(p, torch.tensor([np.nextafter(1.0, 0.0)])).tolist() == [2]
    assert roulette(p, torch.tensor([0.0])).tolist() == [0]
    assert roulette(p, torch.tensor([0.75])).tolist() == [1]


@pytest.mark.parametrize("data", [
    ["#####"],
    {"rows": GOOD, "start": [float("inf"), 1], "goal": [4, 4]},
    {"rows": GOOD, "start": "11", "goal": [4, 4]},
    {"rows": GOOD, "start": [1.9, 1.2], "goal": [4, 4]},
    {"rows": GOOD, "start": [True, 1], "goal": [4, 4]},
])
def test_grid_map_from_json_refuses_what_is_not_two_whole_numbers(data):
    with pytest.raises(LeaklabError):
        GridMap.from_json(data)


def test_utility_counts_the_first_goal_even_with_a_negative_return():
    from leaklab.experiments.dp_drl_table import utility

    returns = [-1.0, -0.5, 0.6, 1.0]
    goals = [False, True, True, True]  # the second episode reached the goal after 15 bumps
    u = utility(returns, [500, 30, 5, 3], goals, episodes=4)
    assert u["first_goal_episode"] == 2
    assert u["final"]["steps_min"] == 3 and u["initial"]["steps_max"] == 500


def test_observation_codes_weigh_element_i_by_two_to_the_i():
    from leaklab.rl.envs.grid_world import observation_codes

    grid = _good()
    cells = np.argwhere(grid.free)
    expected = [int(sum(int(v) << i for i, v in enumerate(row))) for row in observations(grid.free, cells)]
    assert observation_codes(grid.free, cells).tolist() == expected
    corner = np.array([[1, 1]])  # free below (element 1) and to the right (3); down-right (2, 2) is a wall
    assert observation_codes(grid.free, corner).tolist() == [2 + 8]
