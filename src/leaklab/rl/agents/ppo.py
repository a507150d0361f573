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

DP-SGD (seed 003, Sec. 3.5.2, eqs. 3.7-3.8, the defense of Fig. 3.8 on the RL task; ``PPOConfig.privacy``): every
mini-batch step clips each chunk's gradient to L2 norm ``clip``, adds N(0, (noise_multiplier * clip)^2) to their
sum and divides by the expected chunk count of a mini-batch, ``batch / recurrence`` (opacus' per-sample gradients and
DP optimizer, :func:`leaklab.privacy.dpsgd.private_optimizer`; the per-chunk clipping replaces the gradient-norm
clipping), then Adam steps on the noisy gradient, or with ``optimizer="sgd"`` eq. 3.7's plain SGD (which did not
learn the 3-room task of :mod:`leaklab.experiments.rl_membership` in 400k frames at lr 0.01 to 1, even without DP:
docs/reproductions.md). The
recurrent policy is built with opacus' ``DPLSTMCell`` (``build_policy(..., private=True)``: the LSTM cell's equations
on two linear layers, whose per-sample gradients opacus computes; a policy built without it is refused). What
:func:`ppo_epsilon` protects: a record is one chunk of the loss (an agent's ``recurrence`` steps of one rollout with
their actions, old log-probabilities, advantages and returns and the memory the chunk starts from; a single step for
the feed-forward policy), neighbouring runs differ in one chunk zeroed out (the relation of
:mod:`leaklab.rl.agents.private`). A record is not a step's experience: a step's reward enters the advantages of every
earlier step of its episode in the rollout, and its observation the memory of the later chunks, so one step's data
sits in up to a rollout's worth of records; and the unit differs between the networks (4 steps for the RNN, 1 for the
FFNN, at the defaults). A rollout's chunks are used in ``epochs`` steps, each chunk in one mini-batch per
epoch, and no other rollout uses them: by parallel composition the whole training is as private as ``epochs``
Gaussian releases (no amplification by sampling is claimed: the mini-batches are a shuffled partition, not Poisson
samples). A floor map is not a record: its episodes make many chunks, and a map-level guarantee is group privacy over
all of them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.fields import Seed
from leaklab.names import PPO_OPTIMIZER_NAMES
from leaklab.privacy.dpsgd import DPConfig, private_optimizer, spent_epsilon
from leaklab.rl.envs.multi_room import ACTIONS, CELL_KINDS, MAX_STEPS, VIEW, FloorMap, RoomBatch

OBSERVATION = VIEW * VIEW * len(CELL_KINDS)
Memory = tuple[torch.Tensor, torch.Tensor] | None
# progress(frames done, frames in all, mean return of the episodes finished since the last call)
ProgressFn = Callable[[int, int, float], None]


class FeedForwardPolicy(nn.Module):
    """Two tanh layers of ``hidden`` units, then the action logits and the value (``private`` changes nothing: opacus
    has per-sample gradients for every layer)."""

    recurrent = False
    dp_ready = True

    def __init__(self, hidden: int = 72, private: bool = False):
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
    """A tanh layer of ``hidden`` units into an LSTM cell of as many, then the action logits and the value;
    ``private``: the cell is opacus' ``DPLSTMCell`` (the same equations and parameter count, per-sample gradients for
    DP-SGD; torch's ``LSTMCell`` has none)."""

    recurrent = True

    def __init__(self, hidden: int = 40, private: bool = False):
        super().__init__()
        from opacus.layers.dp_rnn import DPLSTMCell

        self.embed = nn.Sequential(nn.Linear(OBSERVATION, hidden), nn.Tanh())
        self.cell = DPLSTMCell(hidden, hidden, bias=True) if private else nn.LSTMCell(hidden, hidden)
        self.dp_ready = private  # whether DP-SGD can train it (PPOConfig.privacy)
        self.actor = nn.Linear(hidden, len(ACTIONS))
        self.critic = nn.Linear(hidden, 1)

    def initial_memory(self, n: int) -> Memory:
        z = torch.zeros(n, self.cell.hidden_size)
        return z, z.clone()

    def forward(self, obs: torch.Tensor, memory: Memory = None) -> tuple[torch.Tensor, torch.Tensor, Memory]:
        h, c = self.cell(self.embed(obs), memory)
        return self.actor(h), self.critic(h).squeeze(-1), (h, c)


ARCHS = {"ffnn": FeedForwardPolicy, "rnn": RecurrentPolicy}


def build_policy(arch: str, seed: int, private: bool = False) -> nn.Module:
    """The ``arch`` policy (``ffnn`` or ``rnn``) with its initial weights drawn from ``seed``; ``private`` for one
    that DP-SGD trains (``PPOConfig.privacy``)."""
    if arch not in ARCHS:
        raise LeaklabError(f"unknown policy {arch!r}; choose from {', '.join(ARCHS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ARCHS[arch](private=private)


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
    optimizer: Literal[PPO_OPTIMIZER_NAMES] = Field(
        default="adam", description="adam: rl-starter-files' Adam (eps 1e-8); sgd: plain SGD, eq. 3.7's update")
    max_grad_norm: float = Field(default=0.5, gt=0)
    recurrence: int = Field(default=4, ge=1, le=128, description="steps a recurrent policy is trained through")
    max_steps: int = Field(default=MAX_STEPS, ge=1, le=10_000, description="an episode's step limit (T)")
    privacy: DPConfig | None = Field(default=None, description="DP-SGD's settings (module docstring); None: plain PPO")
    seed: Seed = 0


def ppo_epsilon(config: PPOConfig) -> float:
    """The epsilon at ``config.privacy.delta`` of a chunk of a DP-SGD PPO training (module docstring): ``epochs``
    Gaussian releases at the noise multiplier."""
    if config.privacy is None:
        raise LeaklabError("plain PPO spends no accounted epsilon (PPOConfig.privacy is None)")
    c = config.privacy
    return spent_epsilon(1.0, c.noise_for(1.0, config.epochs), config.epochs, c.delta, c.accountant)


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
    recurrence = config.recurrence if policy.recurrent else 1
    if t_len % recurrence:
        raise LeaklabError(f"steps per update ({t_len}) must be a multiple of the recurrence ({recurrence})")
    optimizer = (torch.optim.Adam(policy.parameters(), lr=config.lr, eps=1e-8) if config.optimizer == "adam"
                 else torch.optim.SGD(policy.parameters(), lr=config.lr))
    learner = policy
    if config.privacy is not None:
        if not policy.dp_ready:
            raise LeaklabError("DP-SGD needs per-sample gradients, which torch's LSTM cell lacks: build the policy "
                               "with build_policy(..., private=True)")
        learner, optimizer = private_optimizer(policy, optimizer, clip=config.privacy.clip,
                                               noise_multiplier=config.privacy.noise_for(1.0, config.epochs),
                                               expected_batch_size=max(1, config.batch // recurrence),
                                               seed=config.seed)
    try:
        memory = policy.initial_memory(n)
        keep = torch.ones(n)  # 0 where the previous step ended the agent's episode
        obs = torch.from_numpy(batch.observe())
        history: dict[str, list[float]] = {"frames": [], "return": [], "steps": []}
        frames = 0
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
            _update(learner, optimizer, config, recurrence, torch_gen, o_buf, a_buf, logp_buf, v_buf, adv, ret,
                    keep_buf, m_buf)
            frames += t_len * n
            history["frames"].append(frames)
            history["return"].append(float(np.mean(finished_returns)) if finished_returns else float("nan"))
            history["steps"].append(float(np.mean(finished_steps)) if finished_steps else float("nan"))
            policy.eval()
            if on_update is not None:
                on_update(frames)
            if progress is not None:
                progress(min(frames, config.frames), config.frames, history["return"][-1])
    finally:  # also when the training fails: the caller's policy is left without opacus' hooks
        if learner is not policy:
            _release(learner, policy)
    return history


def _release(learner: nn.Module, policy: nn.Module) -> None:
    """Remove opacus' hooks and what it left on the parameters (per-sample and summed gradients)."""
    learner.cleanup()
    for p in policy.parameters():
        if hasattr(p, "summed_grad"):
            del p.summed_grad
        p.grad = None


def _update(policy: nn.Module, optimizer: torch.optim.Optimizer, config: PPOConfig, recurrence: int,
            gen: torch.Generator, obs, actions, logp_old, values, adv, returns, keep, memories) -> None:
    """PPO's epochs over one rollout (time-major buffers ``[T, N, ...]``): mini-batches of chunks of
    ``recurrence`` consecutive steps of one agent, the recurrent policy restarted from the memory the rollout held
    at each chunk's start. Under DP-SGD (``config.privacy``) ``policy`` and ``optimizer`` are opacus', which clip
    each chunk's gradient instead of the batch's norm."""
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
            with warnings.catch_warnings():
                # torch notes that opacus' full backward hooks fire although the inputs need no gradient
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                (loss / recurrence).backward()
            if config.privacy is None:
                nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
