"""PPO actor-critics, feed-forward and recurrent, on the multi-room floor maps (seed 003, chapter 3, section 3.4.2:
the victims, shadows of its deep-RL membership inference, trained with "PPO (rl-starter-files, default params)").

* :class:`FeedForwardPolicy`: the view through two tanh layers, then the action logits and the value;
* :class:`RecurrentPolicy`: the view through a tanh layer into an LSTM cell, then the same two heads; its memory
  carries over the steps of an episode and is cleared at each reset.

The widths are chosen so that both have about the same number of parameters (the thesis' controlled factor:
5,335 and 5,216 there; its input is not given, ours is the 245-value one-hot view of
:mod:`leaklab.rl.envs.multi_room`).

:func:`train_ppo` is PPO with rl-starter-files' defaults (``PPOConfig``): ``envs`` = 16 agents stepped together,
128 steps each per update, discount 0.99, GAE lambda 0.95, clip 0.2 (on the policy ratio and on the value),
entropy weight 0.01, value weight 0.5, 4 epochs of mini-batches of 256 steps, Adam lr 1e-3 (eps 1e-8), gradient
norm clipped to 0.5; the recurrent policy is trained through chunks of ``recurrence`` = 4 steps started from the
memory the rollout held (leaklab's choice: rl-starter-files' default, 1, trains no memory; its torch-ac also shifts
the chunks' starts by half a chunk every other batch, which leaklab does not). Each agent's episode is on a floor
map drawn from the training maps, a new draw at every reset. Same seed, same weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.fields import Seed
from leaklab.rl.envs.multi_room import ACTIONS, CELL_KINDS, MAX_STEPS, VIEW, FloorMap, RoomBatch

OBSERVATION = VIEW * VIEW * len(CELL_KINDS)
Memory = tuple[torch.Tensor, torch.Tensor] | None
# progress(frames done, frames in all, mean return of the episodes finished since the last call)
ProgressFn = Callable[[int, int, float], None]


class FeedForwardPolicy(nn.Module):
    """Two tanh layers of ``hidden`` units, then the action logits and the value."""

    recurrent = False

    def __init__(self, hidden: int = 72):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(OBSERVATION, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.actor = nn.Linear(hidden, len(ACTIONS))
        self.critic = nn.Linear(hidden, 1)

    def initial_memory(self, n: int) -> Memory:
        return None

    def forward(self, obs: torch.Tensor, memory: Memory = None) -> tuple[torch.Tensor, torch.Tensor, Memory]:
        h = self.torso(obs)
        return self.actor(h), self.critic(h).squeeze(-1), None


class RecurrentPolicy(nn.Module):
    """A tanh layer of ``hidden`` units into an LSTM cell of as many, then the action logits and the value."""

    recurrent = True

    def __init__(self, hidden: int = 40):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(OBSERVATION, hidden), nn.Tanh())
        self.cell = nn.LSTMCell(hidden, hidden)
        self.actor = nn.Linear(hidden, len(ACTIONS))
        self.critic = nn.Linear(hidden, 1)

    def initial_memory(self, n: int) -> Memory:
        z = torch.zeros(n, self.cell.hidden_size)
        return z, z.clone()

    def forward(self, obs: torch.Tensor, memory: Memory = None) -> tuple[torch.Tensor, torch.Tensor, Memory]:
        h, c = self.cell(self.embed(obs), memory)
        return self.actor(h), self.critic(h).squeeze(-1), (h, c)


ARCHS = {"ffnn": FeedForwardPolicy, "rnn": RecurrentPolicy}


def build_policy(arch: str, seed: int) -> nn.Module:
    """The ``arch`` policy (``ffnn`` or ``rnn``) with its initial weights drawn from ``seed``."""
    if arch not in ARCHS:
        raise LeaklabError(f"unknown policy {arch!r}; choose from {', '.join(ARCHS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ARCHS[arch]()


class PPOConfig(BaseModel):
    """rl-starter-files' PPO defaults but ``recurrence`` (module docstring); ``frames`` is the training budget in
    environment steps."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    frames: int = Field(default=400_000, ge=1, le=100_000_000)
    envs: int = Field(default=16, ge=1, le=1024)
    steps_per_update: int = Field(default=128, ge=1, le=4096)
    discount: float = Field(default=0.99, gt=0, le=1)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    clip: float = Field(default=0.2, gt=0, le=1)
    entropy: float = Field(default=0.01, ge=0, le=1)
    value: float = Field(default=0.5, ge=0, le=10)
    epochs: int = Field(default=4, ge=1, le=100)
    batch: int = Field(default=256, ge=1, le=1_000_000)
    lr: float = Field(default=1e-3, gt=0, le=1)
    max_grad_norm: float = Field(default=0.5, gt=0)
    recurrence: int = Field(default=4, ge=1, le=128, description="steps a recurrent policy is trained through")
    max_steps: int = Field(default=MAX_STEPS, ge=1, le=10_000, description="an episode's step limit (T)")
    seed: Seed = 0


def _masked(memory: Memory, keep: torch.Tensor) -> Memory:
    return None if memory is None else (memory[0] * keep[:, None], memory[1] * keep[:, None])


def train_ppo(policy: nn.Module, maps: Sequence[FloorMap], config: PPOConfig, progress: ProgressFn | None = None,
              on_update: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """Train ``policy`` in place on ``maps`` with PPO; returns the history (per update: ``frames``, the mean
    ``return`` and ``steps`` of the episodes finished in it, NaN when none finished). ``on_update(frames)`` is
    called after every update (e.g. to keep snapshots), the policy in eval mode."""
    if not maps:
        raise LeaklabError("PPO needs at least one training map")
    rng = np.random.default_rng(config.seed)
    torch_gen = torch.Generator().manual_seed(config.seed)
    n, t_len = config.envs, config.steps_per_update
    batch = RoomBatch([maps[i] for i in rng.integers(0, len(maps), n)], max_steps=config.max_steps)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr, eps=1e-8)
    memory = policy.initial_memory(n)
    keep = torch.ones(n)  # 0 where the previous step ended the agent's episode
    obs = torch.from_numpy(batch.observe())
    history: dict[str, list[float]] = {"frames": [], "return": [], "steps": []}
    frames = 0
    recurrence = config.recurrence if policy.recurrent else 1
    if t_len % recurrence:
        raise LeaklabError(f"steps per update ({t_len}) must be a multiple of the recurrence ({recurrence})")
    while frames < config.frames:
        o_buf = torch.zeros(t_len, n, OBSERVATION)
        a_buf = torch.zeros(t_len, n, dtype=torch.long)
        logp_buf, v_buf, r_buf, keep_buf = (torch.zeros(t_len, n) for _ in range(4))
        m_buf = None if memory is None else [torch.zeros(t_len, *part.shape) for part in memory]
        finished_returns, finished_steps = [], []
        policy.eval()
        with torch.no_grad():
            for t in range(t_len):
                memory = _masked(memory, keep)
                if m_buf is not None:
                    m_buf[0][t], m_buf[1][t] = memory
                logits, value, memory = policy(obs, memory)
                action = torch.multinomial(F.softmax(logits, -1), 1, generator=torch_gen).squeeze(1)
                reward, reached, truncated = batch.step(action.numpy())
                done = reached | truncated
                o_buf[t], a_buf[t], v_buf[t], keep_buf[t] = obs, action, value, keep
                logp_buf[t] = F.log_softmax(logits, -1).gather(1, action[:, None]).squeeze(1)
                r_buf[t] = torch.from_numpy(reward).float()
                if done.any():
                    finished_returns += reward[done].tolist()
                    finished_steps += batch.steps[done].tolist()
                    batch.load(done, [maps[i] for i in rng.integers(0, len(maps), int(done.sum()))])
                keep = torch.from_numpy(~done).float()
                obs = torch.from_numpy(batch.observe())
            _, next_value, _ = policy(obs, _masked(memory, keep))
        # GAE over the rollout: keep_buf[t + 1] says whether step t's episode went on
        adv = torch.zeros(t_len, n)
        last = torch.zeros(n)
        for t in reversed(range(t_len)):
            nxt_keep = keep if t == t_len - 1 else keep_buf[t + 1]
            nxt_value = next_value if t == t_len - 1 else v_buf[t + 1]
            delta = r_buf[t] + config.discount * nxt_value * nxt_keep - v_buf[t]
            last = delta + config.discount * config.gae_lambda * nxt_keep * last
            adv[t] = last
        ret = adv + v_buf
        _update(policy, optimizer, config, recurrence, torch_gen, o_buf, a_buf, logp_buf, v_buf, adv, ret, keep_buf,
                m_buf)
        frames += t_len * n
        history["frames"].append(frames)
        history["return"].append(float(np.mean(finished_returns)) if finished_returns else float("nan"))
        history["steps"].append(float(np.mean(finished_steps)) if finished_steps else float("nan"))
        policy.eval()
        if on_update is not None:
            on_update(frames)
        if progress is not None:
            progress(min(frames, config.frames), config.frames, history["return"][-1])
    return history


def _update(policy: nn.Module, optimizer: torch.optim.Optimizer, config: PPOConfig, recurrence: int,
            gen: torch.Generator, obs, actions, logp_old, values, adv, returns, keep, memories) -> None:
    """PPO's epochs over one rollout (time-major buffers ``[T, N, ...]``): mini-batches of chunks of
    ``recurrence`` consecutive steps of one agent, the recurrent policy restarted from the memory the rollout held
    at each chunk's start."""
    t_len, n = actions.shape
    starts = [(t, k) for t in range(0, t_len, recurrence) for k in range(n)]
    per_batch = max(1, config.batch // recurrence)
    policy.train()
    for _ in range(config.epochs):
        order = torch.randperm(len(starts), generator=gen).tolist()
        for b in range(0, len(order), per_batch):
            chosen = [starts[i] for i in order[b:b + per_batch]]
            ts = torch.tensor([c[0] for c in chosen])
            ks = torch.tensor([c[1] for c in chosen])
            memory = (memories[0][ts, ks], memories[1][ts, ks]) if memories is not None else None
            loss = torch.zeros(())
            for i in range(recurrence):
                t = ts + i
                memory = _masked(memory, keep[t, ks])
                logits, value, memory = policy(obs[t, ks], memory)
                logp_all = F.log_softmax(logits, -1)
                logp = logp_all.gather(1, actions[t, ks][:, None]).squeeze(1)
                entropy = -(logp_all.exp() * logp_all).sum(1).mean()
                ratio = torch.exp(logp - logp_old[t, ks])
                a = adv[t, ks]
                policy_loss = -torch.min(ratio * a, ratio.clamp(1 - config.clip, 1 + config.clip) * a).mean()
                v_old = values[t, ks]
                v_clipped = v_old + (value - v_old).clamp(-config.clip, config.clip)
                value_loss = torch.max((value - returns[t, ks]) ** 2, (v_clipped - returns[t, ks]) ** 2).mean()
                loss = loss + policy_loss - config.entropy * entropy + config.value * value_loss
            optimizer.zero_grad()
            (loss / recurrence).backward()
            nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
