"""DQN on the active-perception task (seed 000 section III; Mnih et al. 2015).

The network estimates ``Q*(s, a)`` (eq. 3) for the seven movements. Training follows Mnih et al.:
ε-greedy exploration with a linear decay, an experience replay buffer, a target network copied from
the online one every ``target_sync`` environment steps, and the mean squared TD error
``(Q̂(s, a) − Q)²`` with ``Q = r + γ (1 − done) max_a' Q_target(s', a')`` (:func:`dqn_loss`),
minimised with Adam. Every episode draws its room layout, so one agent learns all the rooms.
With ``privacy`` set the updates are DP-SGD steps on Poisson samples of the replay buffer
(:mod:`leaklab.rl.agents.private`, which says what the reported epsilon covers).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.models import PerceptionNet, build_perception_net
from leaklab.rl.agents.common import (AgentConfig, ProgressFn, Rooms, TrainHistory, check_net,
                                      observation_tensors, released, reporter)
from leaklab.rl.agents.private import PrivateAgent, make_private_agent
from leaklab.rl.agents.replay import ReplayBuffer
from leaklab.rl.losses import dqn_loss


class DQNConfig(AgentConfig):
    """DQN hyper-parameters (defaults: a short run that shows learning on CPU)."""

    batch_size: int = Field(default=32, ge=1, le=1024)
    buffer_size: int = Field(default=5000, ge=1, le=1_000_000)
    learning_starts: int = Field(default=200, ge=0, description="environment steps before the first update")
    train_every: int = Field(default=1, ge=1, description="environment steps between updates")
    target_sync: int = Field(default=500, ge=1, description="environment steps between target copies")
    eps_start: float = Field(default=1.0, ge=0, le=1)
    eps_end: float = Field(default=0.05, ge=0, le=1)
    eps_decay_steps: int = Field(default=1000, ge=1, description="steps of the linear ε decay")
    max_grad_norm: float | None = Field(default=10.0, gt=0, description="gradient clipping; None: off "
                                        "(not used by DP-SGD, which clips every sample)")

    @model_validator(mode="after")
    def _consistent(self) -> "DQNConfig":
        if self.eps_end > self.eps_start:
            raise ValueError("eps_end must not exceed eps_start (ε decays)")
        if self.batch_size > self.buffer_size:  # the buffer would never hold a batch: no update would run
            raise ValueError(f"batch_size {self.batch_size} exceeds buffer_size {self.buffer_size}")
        return self

    def epsilon(self, step: int) -> float:
        """ε at environment step ``step``: linear from ``eps_start`` to ``eps_end``, then constant."""
        frac = min(step / self.eps_decay_steps, 1.0)
        return self.eps_start + frac * (self.eps_end - self.eps_start)

    def planned_updates(self) -> int:
        """Updates a run takes: the steps from ``learning_starts`` on, every ``train_every``-th, once the
        buffer holds ``batch_size`` transitions."""
        first = max(self.learning_starts, self.batch_size - 1)
        return max(0, (self.steps - 1) // self.train_every - -(-first // self.train_every) + 1)


def epsilon_greedy(net: PerceptionNet, images: torch.Tensor, box: torch.Tensor, epsilon: float,
                   rng: np.random.Generator) -> int:
    """A uniformly random action with probability ``epsilon``, else ``argmax_a Q̂(s, a)``."""
    if rng.random() < epsilon:
        return int(rng.integers(net.spec.num_actions))
    with torch.no_grad():
        return int(net(images[None], box[None]).argmax(dim=1).item())


def td_targets(target_net: PerceptionNet, reward: torch.Tensor, next_images: torch.Tensor,
               next_box: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """``r + γ (1 − done) max_a' Q_target(s', a')``, without gradient."""
    with torch.no_grad():
        q_next = target_net(next_images, next_box).max(dim=1).values
    return reward + gamma * (1.0 - done) * q_next


def train_dqn(config: DQNConfig, progress: bool | ProgressFn | None = None,
              net: PerceptionNet | None = None) -> tuple[PerceptionNet, TrainHistory]:
    """Train a DQN agent for ``config.steps`` environment steps; same config and torch thread count, same
    weights (the CPU kernels' rounding depends on the thread count: :func:`leaklab.device.one_thread`).

    ``net`` continues training an existing network (of ``config.spec``); by default a fresh one is
    built with ``config.seed``. Returns the online network and the :class:`TrainHistory`.
    """
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    spec = config.spec
    net = check_net(net, spec) if net is not None else build_perception_net(spec, seed=config.seed)
    target = copy.deepcopy(net).requires_grad_(False)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    private = _private(net, optimizer, config) if config.privacy is not None else None
    model = private.model if private else net
    buffer = ReplayBuffer(config.buffer_size, (spec.in_channels, spec.image_size, spec.image_size),
                          spec.box_dim)
    rooms = Rooms(config.layouts, spec.image_size, config.max_episode_steps)
    history = TrainHistory()
    start = time.perf_counter()
    obs = None
    with released(rooms, private), reporter(progress, config.steps, "DQN") as report:
        for step in range(config.steps):
            if obs is None:
                layout, reset_seed = rooms.draw(rng)
                env = rooms.env(layout)
                raw, _ = env.reset(seed=reset_seed)
                obs = observation_tensors(raw, spec.setting)
                ep_return, ep_len = 0.0, 0
            action = epsilon_greedy(net, *obs, config.epsilon(step), rng)
            raw, reward, terminated, truncated, _ = env.step(action)
            next_obs = observation_tensors(raw, spec.setting)
            buffer.add(obs[0], obs[1], action, float(reward), next_obs[0], next_obs[1], terminated)
            ep_return, ep_len, obs = ep_return + float(reward), ep_len + 1, next_obs
            history.env_steps += 1

            if step >= config.learning_starts and len(buffer) >= config.batch_size and \
                    step % config.train_every == 0:
                batch = buffer.sample_poisson(private.sample_rate, rng) if private else \
                    buffer.sample(config.batch_size, rng)
                history.losses.append(_update(model, target, optimizer, batch, config, private))
                history.updates += 1
            if (step + 1) % config.target_sync == 0:
                target.load_state_dict(net.state_dict())
            if terminated or truncated:
                history.end_episode(ep_return, ep_len, layout)
                report(step + 1, config.steps, {"episode": len(history.returns), "return": ep_return,
                                                "layout": layout})
                obs = None
    if private:
        history.privacy = private.finish(history.updates, history.updates)
    history.seconds = time.perf_counter() - start
    return net, history


def _private(net: PerceptionNet, optimizer: torch.optim.Optimizer, config: DQNConfig) -> PrivateAgent:
    """DP-SGD at the sampling rate batch_size / buffer_size (:mod:`leaklab.rl.agents.private`)."""
    planned = config.planned_updates()
    if planned == 0 and config.privacy.target_epsilon is not None:
        raise LeaklabError("this DQN run takes no update (steps <= learning_starts); no noise to calibrate")
    return make_private_agent(net, optimizer, config.privacy, sample_rate=config.batch_size / config.buffer_size,
                              expected_batch_size=config.batch_size, steps=planned, seed=config.seed)


def _update(net: nn.Module, target: PerceptionNet, optimizer: torch.optim.Optimizer,
            batch: dict[str, torch.Tensor], config: DQNConfig, private: PrivateAgent | None = None) -> float:
    y = td_targets(target, batch["reward"], batch["next_images"], batch["next_box"], batch["done"],
                   config.gamma)
    loss = dqn_loss(net(batch["images"], batch["box"]), batch["action"], y)
    if private:
        private.step(loss)
        return float(loss.detach())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(net.parameters(), config.max_grad_norm)
    optimizer.step()
    return float(loss.detach())
