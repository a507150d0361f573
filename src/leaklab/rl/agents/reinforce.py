"""REINFORCE with an entropy bonus on the active-perception task (seed 000 section III, eq. 4).

The network's outputs are the logits of the policy ``π_θ(·|s)``. After each episode the client
computes the discounted returns ``R_t = Σ_{t'≥t} γ^{t'−t} r_{t'}`` and takes one Adam step on
``mean_t [−R_t log π(a_t|s_t) − α H(π(·|s_t))]`` (:func:`reinforce_loss`). Actions are sampled from
the policy with a ``torch.Generator`` seeded by the run, so the same seed gives the same episodes.
With ``privacy`` set the update is a DP-SGD step on the episode's steps as samples
(:mod:`leaklab.rl.agents.private`, which says what the reported epsilon covers).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from pydantic import Field

from leaklab.fields import EntropyWeight
from leaklab.models import PerceptionNet, build_perception_net
from leaklab.rl.agents.common import (AgentConfig, ProgressFn, Rooms, TrainHistory, check_net,
                                      observation_tensors, released, reporter)
from leaklab.rl.agents.private import make_private_agent
from leaklab.rl.losses import reinforce_loss


class ReinforceConfig(AgentConfig):
    """REINFORCE hyper-parameters; ``steps`` is a budget of environment steps, rounded up to whole
    episodes."""

    entropy_weight: EntropyWeight = Field(default=0.01, description="α of eq. 4")


def discounted_returns(rewards: Sequence[float], gamma: float) -> torch.Tensor:
    """``R_t = Σ_{t'=t}^{T} γ^{t'−t} r_{t'}`` for every step of one episode (float32)."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return torch.from_numpy(out.astype(np.float32))


def sample_action(net: PerceptionNet, images: torch.Tensor, box: torch.Tensor,
                  generator: torch.Generator) -> int:
    """An action drawn from ``π_θ(·|s)``."""
    with torch.no_grad():
        probs = torch.softmax(net(images[None], box[None]), dim=1)[0]
    return int(torch.multinomial(probs, 1, generator=generator).item())


def train_reinforce(config: ReinforceConfig, progress: bool | ProgressFn | None = None,
                    net: PerceptionNet | None = None) -> tuple[PerceptionNet, TrainHistory]:
    """Train a REINFORCE agent for at least ``config.steps`` environment steps (whole episodes); same config and
    torch thread count, same weights (as :func:`leaklab.rl.agents.dqn.train_dqn`).

    ``net`` continues training an existing network; by default a fresh one is built with
    ``config.seed``. Returns the policy network and the :class:`TrainHistory` (one update per episode).
    """
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    spec = config.spec
    net = check_net(net, spec) if net is not None else build_perception_net(spec, seed=config.seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    # q = 1, one accounted step: every step of an episode enters that episode's update only
    private = make_private_agent(net, optimizer, config.privacy, sample_rate=1.0,
                                 expected_batch_size=config.max_episode_steps, steps=1,
                                 seed=config.seed) if config.privacy is not None else None
    model = private.model if private else net
    rooms = Rooms(config.layouts, spec.image_size, config.max_episode_steps)
    history = TrainHistory()
    start = time.perf_counter()
    with released(rooms, private), reporter(progress, config.steps, "REINFORCE") as report:
        while history.env_steps < config.steps:
            layout, reset_seed = rooms.draw(rng)
            env = rooms.env(layout)
            raw, _ = env.reset(seed=reset_seed)
            images, boxes, actions, rewards = [], [], [], []
            done = False
            while not done:
                obs = observation_tensors(raw, spec.setting)
                action = sample_action(net, *obs, generator)
                raw, reward, terminated, truncated, _ = env.step(action)
                images.append(obs[0])
                boxes.append(obs[1])
                actions.append(action)
                rewards.append(float(reward))
                done = terminated or truncated
            history.env_steps += len(rewards)
            loss = reinforce_loss(model(torch.stack(images), torch.stack(boxes)), torch.tensor(actions),
                                  discounted_returns(rewards, config.gamma), config.entropy_weight)
            if private:
                private.step(loss)
            else:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            history.losses.append(float(loss.detach()))
            history.updates += 1
            history.end_episode(sum(rewards), len(rewards), layout)
            report(min(history.env_steps, config.steps), config.steps,
                   {"episode": len(history.returns), "return": history.returns[-1], "layout": layout})
    if private:
        history.privacy = private.finish(history.updates, min(history.updates, 1))
    history.seconds = time.perf_counter() - start
    return net, history
