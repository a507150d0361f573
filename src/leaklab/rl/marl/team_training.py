"""Training a team of Q-learning agents on cooperative navigation (:mod:`leaklab.rl.envs.cooperative_navigation`)
with independent learners (IQL, the thesis' baseline), centralised VDN, PE-VDN (:mod:`leaklab.rl.marl.pe_vdn`:
the team TD error through a secure sum, each agent updating only its own network), PE-QMIX
(:mod:`leaklab.rl.marl.pe_qmix`: each agent also owns an encoder and hypernetworks making its share of the mixer,
evaluated layer by layer through secure sums), PE-QTRAN (:mod:`leaklab.rl.marl.pe_qtran`: each agent's encoders and
shares of QTRAN's team and state values, the three losses through secure sums), or any of the three PE methods with
DP-SGD on every agent's parameters (its Q network and, for PE-QMIX and PE-QTRAN, its share; the thesis reports no DP
PE-QTRAN): seed 003 (Gohari, thesis 2023), chapter 4, Secs. 4.3-4.4.

Every agent has its own Q network (an MLP on its observation; the thesis' agents add a GRU for SMAC's partial
observations), target network (copied every ``target_sync`` updates) and optimizer. The transitions of
``envs`` parallel episodes go into one FIFO replay buffer whose rows are aligned across agents (one team reward),
one update per environment step. Without DP: Adam at 5e-4 (the thesis) on uniform minibatches. With DP (Sec. 4.4):
each agent's network takes opacus' per-sample clipping and Gaussian noise (:mod:`leaklab.privacy.dpsgd`), then
Adam on the noisy gradients (post-processing; the thesis' SGD at lr 1e-3 with momentum 0.9 and weight decay 0.01,
``dp_optimizer="sgd"``, did not learn this task in 4,000 steps even without noise: measured, win rate under 2%
against Adam's 90%+), the minibatch a Poisson sample of the buffer at
rate batch / buffer with the same indices for every agent (one shared draw), and training starts once the buffer is
full. The epsilon is Theorem 4.2's: a transition stays in the buffer for buffer / envs updates, so the run is
(eps(ceil(buffer / envs)), delta)-DP for one transition whatever its length
(:func:`leaklab.privacy.dpsgd.replay_buffer_epsilon`; the theorem takes one insertion per step, here ``envs``).

The agents are accounted jointly, not one by one as the thesis does: one transition (a row of the team's buffer)
enters every agent's loss, through its own Q value and through the revealed sum, so removing it moves each of the N
agents' clipped sums by up to C: sensitivity sqrt(N) C against independent noise sigma C per agent, i.e. a noise
multiplier of sigma / sqrt(N) for the team's release (and each agent's network depends on the others' through the
data they collect and the sums). Each agent's noise is therefore sqrt(N) times what one mechanism at the target
needs. The exact sums revealed at every update are outside the guarantee (as in the thesis): it covers the
networks.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from leaklab import seeds
from leaklab.fields import Seed
from leaklab.privacy.dpsgd import DPConfig, replay_buffer_epsilon
from leaklab.rl.agents.private import make_private_agent
from leaklab.rl.envs.cooperative_navigation import MOVES, NavigationBatch, observation_size
from leaklab.rl.marl.pe_qmix import MixerShare, mixer_messages, pe_qmix_losses, secure_total
from leaklab.rl.marl.pe_qtran import QtranShare, pe_qtran_losses, qtran_messages, secure_target
from leaklab.rl.marl.pe_vdn import pe_vdn_losses, vdn_loss

__all__ = ["TeamConfig", "TeamRun", "train_team"]

Method = Literal["iql", "vdn", "pe-vdn", "pe-qmix", "pe-qtran"]


class TeamConfig(BaseModel):
    """One team's training; the thesis' settings where it gives them, leaklab's choices otherwise."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    method: Method = "pe-vdn"
    agents: int = Field(default=3, ge=2, le=8)
    size: int = Field(default=5, ge=3, le=20)
    horizon: int = Field(default=8, ge=1, le=100)
    envs: int = Field(default=16, ge=1, le=1024, description="parallel episodes")
    env_steps: int = Field(default=4000, ge=1, le=10_000_000, description="steps of every parallel episode batch")
    buffer: int = Field(default=8000, ge=2, le=1_000_000, description="FIFO replay buffer, transitions")
    batch: int = Field(default=64, ge=1, le=65_536)
    hidden: int = Field(default=64, ge=1, le=4096)
    lr: float = Field(default=5e-4, gt=0, description="Adam without DP (the thesis)")
    gamma: float = Field(default=0.95, gt=0, le=1)
    target_sync: int = Field(default=200, ge=1)
    explore: float = Field(default=0.4, gt=0, le=1, description="share of the steps over which epsilon-greedy "
                                                                "decays from 1 to 0.05")
    eval_every: int = Field(default=250, ge=1, description="environment steps between greedy evaluations")
    eval_episodes: int = Field(default=200, ge=1, le=100_000)
    privacy: DPConfig | None = None
    dp_optimizer: Literal["adam", "sgd"] = Field(
        default="adam", description="with DP: Adam at lr (the noisy gradients post-processed), or the thesis' SGD at "
                                    "dp_lr with momentum 0.9 and weight decay 0.01 (it did not learn this task)")
    dp_lr: float = Field(default=1e-3, gt=0, description="SGD with DP (the thesis)")
    seed: Seed = 0

    @model_validator(mode="after")
    def _sizes(self) -> "TeamConfig":
        if self.batch > self.buffer:
            raise ValueError("the minibatch is at most the buffer")
        if self.privacy is not None and not self.method.startswith("pe-"):
            raise ValueError("DP-SGD is for PE-VDN, PE-QMIX and PE-QTRAN (each agent trains its own network and "
                             "share)")
        if 2 * self.agents > self.size ** 2:
            raise ValueError("the grid has no room for every agent and landmark")
        return self


@dataclass
class TeamRun:
    """Greedy evaluations every ``eval_every`` steps (``eval_steps``, ``win_rate``, ``returns``), the updates made,
    the seconds, and the privacy spent (None without DP)."""

    eval_steps: list[int] = field(default_factory=list)
    win_rate: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    updates: int = 0
    seconds: float = 0.0
    privacy: dict | None = None


class _AgentParts(nn.Module):
    """An agent's Q network and share (PE-QMIX's mixer share, PE-QTRAN's encoders and value shares) as one module,
    for one DP-SGD optimizer over both: it acts as the Q network; the share is called directly (opacus' per-sample
    hooks sit on the share's layers all the same, each layer called through its forward)."""

    def __init__(self, net: nn.Module, share: nn.Module):
        super().__init__()
        self.net, self.share = net, share

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation)


def _net(config: TeamConfig) -> nn.Module:
    return nn.Sequential(nn.Linear(observation_size(config.agents), config.hidden), nn.ReLU(),
                         nn.Linear(config.hidden, config.hidden), nn.ReLU(), nn.Linear(config.hidden, len(MOVES)))


@torch.no_grad()
def _greedy(nets: list[nn.Module], obs: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(obs)
    return np.stack([net(x[:, i]).argmax(1).numpy() for i, net in enumerate(nets)], axis=1)


def evaluate(nets: list[nn.Module], config: TeamConfig, rng: np.random.Generator) -> tuple[float, float]:
    """Greedy play of ``eval_episodes`` fresh episodes: the share won and the mean return."""
    batch = NavigationBatch(config.eval_episodes, config.agents, config.size, config.horizon)
    obs, total, done = batch.reset(rng), np.zeros(config.eval_episodes), False
    while not done:
        obs, reward, done, won = batch.step(_greedy(nets, obs))
        total += reward
    return float(won.mean()), float(total.mean())


def train_team(config: TeamConfig, progress: Callable[[int, int], None] | None = None) -> tuple[TeamRun, list]:
    """Train the team; returns the run's record and the agents' networks."""
    start = time.perf_counter()
    rng = np.random.default_rng(seeds.stream_seed(config.seed, "team", "environment"))
    eval_rng_seed = seeds.stream_seed(config.seed, "team", "evaluation")
    sum_rng = np.random.default_rng(seeds.stream_seed(config.seed, "team", "secret-shares"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds.stream_seed(config.seed, "team", "networks"))
        nets = [_net(config) for _ in range(config.agents)]
        share = {"pe-qmix": lambda: MixerShare(observation_size(config.agents)),
                 "pe-qtran": lambda: QtranShare(observation_size(config.agents), len(MOVES))}.get(config.method)
        mixers = [share() for _ in range(config.agents)] if share is not None else []
    targets = [copy.deepcopy(n).eval() for n in nets]
    target_mixers = [copy.deepcopy(m).eval() for m in mixers]
    private, models, optimizers = [], nets, None
    if config.privacy is not None:
        q, windows = config.batch / config.buffer, math.ceil(config.buffer / config.envs)
        joint = config.privacy.noise_for(q, windows)  # the team's noise multiplier
        per_agent = config.privacy.model_copy(update={"noise_multiplier": math.sqrt(config.agents) * joint,
                                                      "target_epsilon": None})
        for i, net in enumerate(nets):
            own = _AgentParts(net, mixers[i]) if mixers else net  # the agent's Q network and its mixer share
            optimizer = torch.optim.Adam(own.parameters(), lr=config.lr) if config.dp_optimizer == "adam" else \
                torch.optim.SGD(own.parameters(), lr=config.dp_lr, momentum=0.9, weight_decay=0.01)
            private.append(make_private_agent(own, optimizer, per_agent, sample_rate=q,
                                              expected_batch_size=config.batch, steps=windows,
                                              seed=seeds.stream_seed(config.seed, "team", "dp-noise", i)))
        models = [p.model for p in private]
    else:
        optimizers = [torch.optim.Adam([*n.parameters(), *(mixers[i].parameters() if mixers else ())], lr=config.lr)
                      for i, n in enumerate(nets)]
    obs_size = observation_size(config.agents)
    buf = {"obs": np.zeros((config.buffer, config.agents, obs_size), np.float32),
           "next": np.zeros((config.buffer, config.agents, obs_size), np.float32),
           "action": np.zeros((config.buffer, config.agents), np.int64),
           "reward": np.zeros(config.buffer, np.float32), "done": np.zeros(config.buffer, np.float32)}
    stored, cursor = 0, 0
    env = NavigationBatch(config.envs, config.agents, config.size, config.horizon)
    obs = env.reset(rng)
    run = TeamRun()
    for step in range(1, config.env_steps + 1):
        explore = max(0.05, 1 - 0.95 * step / (config.explore * config.env_steps))
        actions = _greedy(nets, obs)
        random = rng.random(actions.shape) < explore
        actions[random] = rng.integers(0, len(MOVES), random.sum())
        nxt, reward, done, _ = env.step(actions)
        rows = (cursor + np.arange(config.envs)) % config.buffer
        buf["obs"][rows], buf["next"][rows], buf["action"][rows] = obs, nxt, actions
        buf["reward"][rows], buf["done"][rows] = reward, float(done)
        cursor, stored = (cursor + config.envs) % config.buffer, min(config.buffer, stored + config.envs)
        obs = env.reset(rng) if done else nxt
        ready = stored == config.buffer if private else stored >= config.batch
        if ready:
            if private:
                picked = np.flatnonzero(rng.random(stored) < config.batch / config.buffer)
            else:
                picked = rng.choice(stored, config.batch, replace=False)
            _update(models, targets, (mixers, target_mixers), optimizers, private,
                    {k: torch.from_numpy(v[picked]) for k, v in buf.items()}, config, sum_rng)
            run.updates += 1
            if run.updates % config.target_sync == 0:
                for net, target in zip([*nets, *mixers], [*targets, *target_mixers]):
                    target.load_state_dict(net.state_dict())
        if step % config.eval_every == 0 or step == config.env_steps:
            win, ret = evaluate(nets, config, np.random.default_rng(eval_rng_seed))
            run.eval_steps.append(step)
            run.win_rate.append(win)
            run.returns.append(ret)
        if progress is not None:
            progress(step, config.env_steps)
    if private:
        for p in private:
            p.model.remove_hooks()
        c = config.privacy
        sigma = private[0].noise_multiplier
        joint = sigma / math.sqrt(config.agents)
        run.privacy = {"epsilon": replay_buffer_epsilon(config.batch / config.buffer, joint, config.buffer, c.delta,
                                                        c.accountant, inserted_per_step=config.envs),
                       "delta": c.delta, "noise_multiplier": sigma, "joint_noise_multiplier": joint, "clip": c.clip,
                       "sample_rate": config.batch / config.buffer,
                       "accounted_steps": math.ceil(config.buffer / config.envs), "updates": run.updates,
                       "accountant": c.accountant}
    run.seconds = time.perf_counter() - start
    return run, nets


def _update(models: list[nn.Module], targets: list[nn.Module], mixing: tuple[list, list], optimizers: list | None,
            private: list, batch: dict[str, torch.Tensor], config: TeamConfig, sum_rng: np.random.Generator) -> None:
    obs, nxt, actions = batch["obs"], batch["next"], batch["action"]
    q_values = [m(obs[:, i]) for i, m in enumerate(models)]
    chosen = [q.gather(1, actions[:, i:i + 1]).squeeze(1) for i, q in enumerate(q_values)]
    with torch.no_grad():
        target_best = [t(nxt[:, i]).max(1) for i, t in enumerate(targets)]
    target_max = [b.values for b in target_best]
    reward, done = batch["reward"], batch["done"]
    agents = range(config.agents)
    if config.method == "pe-qtran":
        shares, target_shares = mixing
        target_total = secure_target(target_shares, [nxt[:, i] for i in agents],
                                     [b.indices for b in target_best], sum_rng)
        messages = qtran_messages(shares, [obs[:, i] for i in agents], [actions[:, i] for i in agents], q_values)
        losses = pe_qtran_losses(messages, shares, target_total, reward, done, config.gamma, sum_rng)
    elif config.method == "pe-qmix":
        mixers, target_mixers = mixing
        with torch.no_grad():
            target_total = secure_total(mixer_messages(target_mixers, [nxt[:, i] for i in range(config.agents)],
                                                       target_max), sum_rng)
        messages = mixer_messages(mixers, [obs[:, i] for i in range(config.agents)], chosen)
        losses = pe_qmix_losses(messages, target_total, reward, done, config.gamma, sum_rng)
    elif config.method == "iql":
        losses = [((q - (reward + config.gamma * (1 - done) * t)) ** 2).mean() for q, t in zip(chosen, target_max)]
    elif config.method == "vdn":
        losses = [vdn_loss(chosen, target_max, reward, done, config.gamma)]
    else:
        losses, _ = pe_vdn_losses(chosen, target_max, reward, done, config.gamma, sum_rng)
    if private:  # (DP-SGD is the PE methods': the config refuses it for the others)
        for agent, loss in zip(private, losses):
            agent.step(loss)
        return
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    for loss in losses:
        loss.backward()
    for opt in optimizers:
        opt.step()
