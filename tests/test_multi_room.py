"""Seed 003 chapter 3's multi-room floor maps (MiniGrid's MultiRoom rebuilt in numpy) and the PPO agents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leaklab.errors import LeaklabError
from leaklab.rl.envs.multi_room import (ACTIONS, CELL_KINDS, DOOR, EMPTY, GOAL, MAX_STEPS, VIEW, WALL, RoomBatch,
                                        floor_map, optimal_actions, reward)


@pytest.mark.parametrize("rooms", [1, 2, 4])
def test_floor_maps_are_chains_of_rooms_the_goal_reachable(rooms):
    for seed in range(20):
        m = floor_map(seed, rooms=rooms)
        again = floor_map(seed, rooms=rooms)
        assert np.array_equal(m.cells, again.cells) and (m.start, m.direction, m.goal) == \
            (again.start, again.direction, again.goal)
        assert len(m.doors) == rooms - 1
        assert m.cells[m.start[1], m.start[0]] == EMPTY and m.cells[m.goal[1], m.goal[0]] == GOAL
        assert (m.cells[0] == WALL).all() or (m.cells[[0, -1]] != EMPTY).all()
        labels = optimal_actions(m)  # raises when the goal cannot be reached
        assert labels[(*m.start, m.direction, (False,) * len(m.doors))]
    assert not np.array_equal(floor_map(0).cells, floor_map(1).cells)
    with pytest.raises(LeaklabError):
        floor_map(0, rooms=0)


def _placed(m, state) -> RoomBatch:
    batch = RoomBatch([m])
    x, y, direction, opened = state
    batch.pos[0], batch.dir[0] = (x, y), direction
    for (dx, dy), is_open in zip(m.doors, opened):
        batch.open[0, dy, dx] = is_open
    return batch


def _labelled_path(m, labels, state) -> int:
    """Steps to the goal from ``state`` following the labels' first action (the step limit + 1: never)."""
    batch = _placed(m, state)
    for t in range(MAX_STEPS):
        gained, reached, _ = batch.step(np.array([labels[batch.state(0)][0]]))
        if reached[0]:
            assert gained[0] == pytest.approx(reward(batch.steps[0]))
            return t + 1
    return MAX_STEPS + 1


def test_the_labelling_agent_takes_a_shortest_path():
    for seed in range(6):
        m = floor_map(seed, rooms=3)
        labels = optimal_actions(m)
        start = (*m.start, m.direction, (False,) * len(m.doors))
        shortest = _labelled_path(m, labels, start)
        assert shortest >= 2 * len(m.doors) + 1  # toggle and walk through every door, then onto the goal
        after = {}
        for a in range(len(ACTIONS)):  # Bellman: the labelled actions, and only they, start a shortest path
            batch = _placed(m, start)
            batch.step(np.array([a]))
            after[a] = 1 + _labelled_path(m, labels, batch.state(0))
        assert min(after.values()) == shortest
        assert set(labels[start]) == {a for a, n in after.items() if n == shortest}


def test_doors_open_by_toggling_and_block_until_then():
    m = floor_map(3, rooms=2)
    (dx, dy), = m.doors
    batch = RoomBatch([m])
    # stand next to the door, facing it, from the room side: find a free neighbour in the first room
    for direction, (ox, oy) in enumerate([(1, 0), (0, 1), (-1, 0), (0, -1)]):
        x, y = dx - ox, dy - oy
        if m.cells[y, x] == EMPTY:
            break
    batch.pos[0] = (x, y)
    batch.dir[0] = direction
    view = batch.observe().reshape(VIEW, VIEW, len(CELL_KINDS))
    assert view[VIEW - 2, VIEW // 2].argmax() == CELL_KINDS.index("closed door")  # one cell ahead
    batch.step(np.array([ACTIONS.index("forward")]))
    assert tuple(batch.pos[0]) == (x, y)  # a closed door blocks
    batch.step(np.array([ACTIONS.index("toggle")]))
    assert batch.open[0, dy, dx]
    assert batch.observe().reshape(VIEW, VIEW, len(CELL_KINDS))[VIEW - 2, VIEW // 2].argmax() == \
        CELL_KINDS.index("open door")
    batch.step(np.array([ACTIONS.index("forward")]))
    assert tuple(batch.pos[0]) == (dx, dy) and m.cells[dy, dx] == DOOR
    batch.reset(np.array([True]))
    assert not batch.open.any() and tuple(batch.pos[0]) == m.start and batch.steps[0] == 0


def test_episodes_are_cut_at_the_step_limit_and_bad_actions_refused():
    batch = RoomBatch([floor_map(0)], max_steps=3)
    for _ in range(2):
        _, reached, truncated = batch.step(np.array([ACTIONS.index("left")]))
        assert not truncated.any() and not reached.any()
    _, _, truncated = batch.step(np.array([ACTIONS.index("left")]))
    assert truncated.all()
    for bad in (np.array([4]), np.array([-1]), np.array([0, 0])):
        with pytest.raises(LeaklabError):
            batch.step(bad)


def test_the_view_turns_with_the_agent():
    m = floor_map(5, rooms=1)
    batch = RoomBatch([m, m, m, m])
    batch.dir[:] = [0, 1, 2, 3]
    views = batch.observe().reshape(4, VIEW, VIEW, len(CELL_KINDS)).argmax(-1)
    x, y = m.start
    for k, (fx, fy) in enumerate([(1, 0), (0, 1), (-1, 0), (0, -1)]):
        ahead = m.cells[y + fy, x + fx]
        kind = {EMPTY: "empty", WALL: "wall", GOAL: "goal", DOOR: "closed door"}[int(ahead)]
        assert views[k, VIEW - 2, VIEW // 2] == CELL_KINDS.index(kind)
        rx, ry = -fy, fx  # the agent's right
        right = m.cells[y + ry, x + rx]
        kind = {EMPTY: "empty", WALL: "wall", GOAL: "goal", DOOR: "closed door"}[int(right)]
        assert views[k, VIEW - 1, VIEW // 2 + 1] == CELL_KINDS.index(kind)
    assert (views[:, VIEW - 1, VIEW // 2] == CELL_KINDS.index("empty")).all()  # the agent's own cell


@pytest.mark.parametrize("arch, frames", [("ffnn", 16384), ("rnn", 32768)])
def test_ppo_learns_a_one_room_map_and_is_reproducible(arch, frames):
    from leaklab.rl.agents.ppo import PPOConfig, build_policy, train_ppo

    maps = [floor_map(s, rooms=1) for s in range(4)]
    config = PPOConfig(frames=frames, envs=8, steps_per_update=64, seed=0)
    policy = build_policy(arch, 0)
    history = train_ppo(policy, maps, config)
    steps = [s for s in history["steps"] if s == s]
    assert np.mean(steps[-3:]) < 0.3 * np.mean(steps[:3])  # a random walk: about 35 steps
    again = build_policy(arch, 0)
    train_ppo(again, maps, config)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), again.state_dict().values()))
    with pytest.raises(LeaklabError):
        train_ppo(build_policy(arch, 0), [], config)


def test_ppo_with_sgd_steps_by_the_gradient_where_adam_steps_by_its_sign():
    """PPOConfig.optimizer="sgd" (eq. 3.7's plain SGD): every step moves every weight by -lr times its (norm-clipped)
    gradient, the second too (no momentum); Adam's first step is lr times the gradient's sign."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from leaklab.rl.agents.ppo import PPOConfig, build_policy, train_ppo

    maps = [floor_map(s, rooms=1) for s in range(2)]

    def steps(optimizer):
        seen = []  # per step: (gradients, weights before, weights after)

        def flat(opt, grad):
            return torch.cat([(p.grad if grad else p).detach().flatten().clone() for g in opt.param_groups
                              for p in g["params"]])

        handles = [register_optimizer_step_pre_hook(lambda opt, *_: seen.append([flat(opt, True), flat(opt, False)])),
                   register_optimizer_step_post_hook(lambda opt, *_: seen[-1].append(flat(opt, False)))]
        try:
            train_ppo(build_policy("ffnn", 0), maps, PPOConfig(frames=128, envs=4, steps_per_update=32, epochs=2,
                                                               batch=128, lr=1e-3, optimizer=optimizer, seed=0))
        finally:
            for h in handles:
                h.remove()
        return seen

    sgd, adam = steps("sgd"), steps("adam")
    assert len(sgd) == len(adam) == 2  # one mini-batch per epoch
    for grad, before, after in sgd:
        assert 0 < grad.norm() <= 0.5 * (1 + 1e-5)  # the gradient's norm clipped to 0.5
        assert torch.allclose(after - before, -1e-3 * grad, rtol=0, atol=5e-8)  # float32 spacing of the weights
    grad, before, after = adam[0]
    step = after - before
    full = grad.abs() > 1e-4  # gradients far above Adam's eps (the one-hot view's zeros: none)
    assert full.float().mean() > 0.2
    assert torch.allclose(step[full], -1e-3 * torch.sign(grad[full]), rtol=0, atol=2e-7)


def test_the_private_recurrent_policy_computes_what_the_plain_one_does():
    from leaklab.rl.agents.ppo import OBSERVATION, build_policy

    plain, private = build_policy("rnn", 0), build_policy("rnn", 0, private=True)
    state = plain.state_dict()  # nn.LSTMCell's weights into opacus' DPLSTMCell's two layers
    cell = {"cell.ih.weight": state["cell.weight_ih"], "cell.ih.bias": state["cell.bias_ih"],
            "cell.hh.weight": state["cell.weight_hh"], "cell.hh.bias": state["cell.bias_hh"]}
    private.load_state_dict({k: v for k, v in state.items() if not k.startswith("cell.")} | cell)
    obs = torch.randn(5, OBSERVATION, generator=torch.Generator().manual_seed(0))
    memory = plain.initial_memory(5)
    for _ in range(3):
        a, b = plain(obs, memory), private(obs, memory)
        assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[2][1], b[2][1], atol=1e-6)
        memory = a[2]
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in private.parameters())


@pytest.mark.parametrize("arch", ["ffnn", "rnn"])
def test_dp_sgd_ppo_clips_every_chunk_and_adds_its_noise(arch):
    from leaklab.privacy.dpsgd import DPConfig
    from leaklab.rl.agents.ppo import PPOConfig, build_policy, train_ppo

    maps = [floor_map(s, rooms=1) for s in range(2)]

    def trained(privacy):
        policy = build_policy(arch, 0, private=privacy is not None)
        start = [p.detach().clone() for p in policy.parameters()]
        train_ppo(policy, maps, PPOConfig(frames=512, envs=4, steps_per_update=64, privacy=privacy, seed=0))
        return [p.detach() for p in policy.parameters()], start

    def moved(privacy):
        end, start = trained(privacy)
        return max((a - b).abs().max().item() for a, b in zip(end, start))

    # a vanishing clip leaves Adam almost nothing to step on; its noise, or no clipping, moves the weights
    assert moved(DPConfig(noise_multiplier=0.0, clip=1e-12)) < 1e-6
    assert moved(DPConfig(noise_multiplier=1e9, clip=1e-12)) > 1e-3
    assert moved(None) > 1e-3
    noisy = DPConfig(noise_multiplier=1.0, clip=1.0)
    first, again = trained(noisy)[0], trained(noisy)[0]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # same seed, same noise


def test_ppo_epsilon_composes_one_gaussian_release_per_epoch():
    from leaklab.privacy.dpsgd import DPConfig
    from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
    from leaklab.rl.agents.ppo import PPOConfig, ppo_epsilon

    config = PPOConfig(epochs=4, privacy=DPConfig(noise_multiplier=2.0, delta=1e-5))
    # four releases of sensitivity 1 at noise 2 are one Gaussian release of sensitivity 2 (Dong, Roth & Su)
    assert ppo_epsilon(config) == pytest.approx(analytic_gaussian_epsilon(2.0, 1e-5, 2.0), rel=1e-3)
    assert ppo_epsilon(config.model_copy(update={"epochs": 1})) < ppo_epsilon(config)
    with pytest.raises(LeaklabError, match="plain PPO"):
        ppo_epsilon(PPOConfig())


def test_walls_and_closed_doors_hide_what_lies_behind_them():
    from leaklab.rl.envs.multi_room import _visible

    empty, wall = CELL_KINDS.index("empty"), CELL_KINDS.index("wall")
    codes = np.full((3, VIEW, VIEW), empty)
    codes[:, VIEW - 3, :] = wall  # a wall across the view two rows ahead
    codes[1, VIEW - 3, VIEW // 2] = CELL_KINDS.index("closed door")
    codes[2, VIEW - 3, VIEW // 2] = CELL_KINDS.index("open door")
    seen = _visible(codes)
    assert seen[:, VIEW - 3:].all()  # the wall itself and everything before it
    assert not seen[:2, :VIEW - 3].any()  # behind a wall, or a closed door in it: hidden
    assert seen[2, VIEW - 4, VIEW // 2]  # through an open door
    open_view = np.full((1, VIEW, VIEW), empty)
    assert _visible(open_view).all()
    m = floor_map(0, rooms=2)
    batch = RoomBatch([m])
    view = batch.observe().reshape(VIEW, VIEW, len(CELL_KINDS))
    assert ((view.sum(-1) == 0) | (view.sum(-1) == 1)).all() and (view.sum(-1) == 0).any()


def test_dp_sgd_refuses_torchs_lstm_cell_and_leaves_no_hooks():
    from leaklab.privacy.dpsgd import DPConfig
    from leaklab.rl.agents.ppo import PPOConfig, build_policy, train_ppo

    maps = [floor_map(0, rooms=1)]
    config = PPOConfig(frames=64, envs=2, steps_per_update=32, privacy=DPConfig(noise_multiplier=1.0))
    plain = build_policy("rnn", 0)
    with pytest.raises(LeaklabError, match="private=True"):
        train_ppo(plain, maps, config)
    private = build_policy("rnn", 0, private=True)
    train_ppo(private, maps, config)
    hooks = sum(len(m._forward_hooks) + len(m._backward_hooks) for m in private.modules())
    leftovers = [name for name, p in private.named_parameters()
                 if p.grad is not None or any(hasattr(p, a) for a in ("grad_sample", "summed_grad"))]
    assert hooks == 0 and leftovers == []
