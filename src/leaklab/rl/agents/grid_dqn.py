"""Deep Q-learning with DP-DRL in the grid worlds (seed 002, chapter 5, Algorithm 11), many agents at once.

Each of ``K`` agents trains its own Q network (an MLP from the 8 observed cells, and with ``position`` the agent's
cell, to the 5 actions' values, ReLU; the thesis gives only the input and output sizes) in its own map, with or
without DP-DRL (:mod:`leaklab.defenses.dp_drl`) at its own budget. The agents step in lockstep: one batched matrix
product per layer serves all of them (a stacked MLP, :class:`StackedMLP`), which is the same arithmetic as ``K``
separate networks. Per agent, Algorithm 11: observe, obfuscate (DP-DRL agents), act ε-greedily on the obfuscated
observation, store ``(O'(s), a, r, O'(s'))`` (the obfuscated next observation is the one the agent acts on at the
next step), sample a minibatch from its own replay memory and take one step of Adam on the squared TD error
(:func:`leaklab.rl.losses.dqn_loss`); the target network is copied every ``target_sync`` steps. Only the goal ends a
transition without bootstrapping: an episode cut at ``max_steps`` bootstraps from its last state (the printed line
17 would not; the cut is the run's budget, not the environment's end). The unspecified hyper-parameters (notes-002
4.6 item 5) are this module's defaults.

An agent stops after ``episodes`` episodes (an episode ends at the goal or after ``max_steps`` moves); the batch
runs until every agent has. One seed fixes every draw of a batch (the maps, defenses and the batch's order
included): the same call gives the same networks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from leaklab.defenses import dp_drl
from leaklab.rl.envs.grid_world import ACTIONS, NEIGHBOURS, GridBatch, GridMap
from leaklab.rl.losses import dqn_loss

ProgressFn = Callable[[int, int], None]


class GridDQNConfig(BaseModel):
    """Algorithm 11's settings; the thesis' are 100,000 episodes of at most 500 steps, N = 10."""

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(default=1500, ge=1, le=1_000_000)
    max_steps: int = Field(default=500, ge=1, le=100_000)
    hidden: int = Field(default=32, ge=1, le=4096)
    lr: float = Field(default=1e-3, gt=0)
    gamma: float = Field(default=0.99, ge=0, le=1)
    batch_size: int = Field(default=32, ge=1, le=4096)
    buffer_size: int = Field(default=20_000, ge=1, le=10_000_000)
    learning_starts: int = Field(default=500, ge=0, description="an agent's steps before its first update")
    target_sync: int = Field(default=250, ge=1, description="an agent's steps between target copies")
    explore_start: float = Field(default=1.0, ge=0, le=1, description="probability of a random action at first")
    explore_end: float = Field(default=0.1, ge=0, le=1, description="after the decay (the thesis' eps_g = 0.9)")
    explore_episodes: float = Field(default=0.2, gt=0, le=1, description="share of the episodes of the decay")
    n_scale: float = Field(default=dp_drl.DEFAULT_N, gt=1, description="DP-DRL's N")
    position: bool = Field(default=False, description="the agent also observes its (row, column), scaled to [0, 1] "
                                                      "(not the thesis' agent; DP-DRL still flips only the 8 cells)")
    seed: int = 0

    def exploration(self, episode: np.ndarray) -> np.ndarray:
        """The probability of a random action in each agent's ``episode`` (linear decay, then constant)."""
        frac = np.minimum(episode / (self.explore_episodes * self.episodes), 1.0)
        return self.explore_start + frac * (self.explore_end - self.explore_start)


class StackedMLP:
    """``K`` MLPs ``inputs -> hidden -> hidden -> 5`` (ReLU; 8 inputs, the thesis' agent) as stacked weights, each
    initialised as ``torch.nn.Linear`` is (uniform in ±1/sqrt(fan_in))."""

    def __init__(self, k: int, hidden: int, generator: torch.Generator, inputs: int = len(NEIGHBOURS)):
        sizes = [inputs, hidden, hidden, len(ACTIONS)]
        self.params: list[torch.Tensor] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1 / math.sqrt(fan_in)
            for shape in ((k, fan_in, fan_out), (k, 1, fan_out)):
                self.params.append(((torch.rand(shape, generator=generator) * 2 - 1) * bound).requires_grad_())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Q values ``[K, B, 5]`` of observations ``[K, B, 8]`` (agent ``k``'s network on row ``k``)."""
        for i in range(0, len(self.params), 2):
            x = torch.baddbmm(self.params[i + 1], x, self.params[i])
            if i + 2 < len(self.params):
                x = torch.relu(x)
        return x

    def copy(self) -> "StackedMLP":
        clone = object.__new__(StackedMLP)
        clone.params = [p.detach().clone() for p in self.params]
        return clone

    def load(self, other: "StackedMLP") -> None:
        with torch.no_grad():
            for mine, theirs in zip(self.params, other.params):
                mine.copy_(theirs)

    def agent(self, k: int) -> list[torch.Tensor]:
        """Agent ``k``'s weights and biases, ``[in, out]`` and ``[out]`` alternately (detached copies)."""
        return [p[k].detach().clone() if i % 2 == 0 else p[k, 0].detach().clone() for i, p in enumerate(self.params)]


def q_values(weights: list[torch.Tensor], observations: torch.Tensor) -> torch.Tensor:
    """One agent's Q values ``[n, 5]`` of observations ``[n, 8]`` from :meth:`StackedMLP.agent`'s weights."""
    x = observations
    for i in range(0, len(weights), 2):
        x = x @ weights[i] + weights[i + 1]
        if i + 2 < len(weights):
            x = torch.relu(x)
    return x


class _MaskedAdam:
    """Adam (Kingma and Ba, torch's defaults) on stacked weights, stepping only the agents in a mask, each with
    its own step count (agents that finished, or have not started learning, keep their weights and moments)."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = torch.zeros(params[0].shape[0])

    @torch.no_grad()
    def step(self, mask: torch.Tensor) -> None:
        """One Adam step for the agents in ``mask``, whose gradients are in ``.grad`` (the others' are zero)."""
        b1, b2 = self.betas
        keep = mask.to(self.t.dtype)
        self.t += keep
        t = self.t.clamp(min=1)
        root = (1 - b2 ** t).sqrt().view(-1, 1, 1)
        scale = self.lr * keep.view(-1, 1, 1) * root / (1 - b1 ** t).view(-1, 1, 1)
        decay1 = torch.where(mask, b1, 1.0).view(-1, 1, 1)
        decay2 = torch.where(mask, b2, 1.0).view(-1, 1, 1)
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad
            m.mul_(decay1).add_(g, alpha=1 - b1)
            v.mul_(decay2).addcmul_(g, g, value=1 - b2)
            p.sub_(scale * m / (v.sqrt() + self.eps * root))
            p.grad = None


class GridTraining(BaseModel):
    """What a batch's training measured, per agent: episode returns and lengths, and the time per step."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    returns: list[list[float]]
    lengths: list[list[int]]
    reached: list[list[bool]]  # whether each episode ended at the goal (a return can be <= 0 even then)
    steps: int  # lockstep steps of the batch
    seconds_per_step: float  # the batch's training step (acting, stepping, storing, updating), per agent
    obfuscation_seconds_per_step: float  # DP-DRL's score function and draw, per agent and step (0: none)


def train_grid_dqn(maps: list[GridMap], budgets: list[float | str | None], config: GridDQNConfig,
                   progress: ProgressFn | None = None) -> tuple[StackedMLP, GridTraining]:
    """Train one agent per map: ``budgets[k]`` None (no defense), a float (DP-DRL at that fixed eps) or
    ``"dynamic"``. Returns the stacked networks and what training measured."""
    k_agents = len(maps)
    if len(budgets) != k_agents:
        raise ValueError("one budget per map")
    rng = np.random.default_rng(config.seed)
    torch_gen = torch.Generator().manual_seed(config.seed)
    n_obs = len(NEIGHBOURS) + 2 * config.position
    net = StackedMLP(k_agents, config.hidden, torch_gen, n_obs)
    target = net.copy()
    optimizer = _MaskedAdam(net.params, config.lr)
    env = GridBatch(maps, config.max_steps)
    defended = torch.tensor([b is not None for b in budgets])
    eps = torch.tensor([math.nan if b in (None, "dynamic") else float(b) for b in budgets])
    cap = config.buffer_size
    buf_obs = torch.zeros(k_agents, cap, n_obs)
    buf_next = torch.zeros(k_agents, cap, n_obs)
    buf_action = torch.zeros(k_agents, cap, dtype=torch.int64)
    buf_reward = torch.zeros(k_agents, cap)
    buf_done = torch.zeros(k_agents, cap)
    size = np.zeros(k_agents, dtype=np.int64)
    agent_steps = np.zeros(k_agents, dtype=np.int64)
    episode = np.zeros(k_agents, dtype=np.int64)
    returns: list[list[float]] = [[] for _ in range(k_agents)]
    lengths: list[list[int]] = [[] for _ in range(k_agents)]
    goals: list[list[bool]] = [[] for _ in range(k_agents)]
    ep_return = np.zeros(k_agents)
    rows = torch.arange(k_agents)

    scale = torch.from_numpy(np.array([m.shape for m in maps], dtype=np.float32) - 1)

    def observe(true_obs: np.ndarray) -> tuple[torch.Tensor, float]:
        """The 8 cells (one flipped by DP-DRL for the defended agents), then the position if the agent sees it."""
        cells = torch.from_numpy(true_obs)
        where = torch.from_numpy(env.pos.astype(np.float32)) / scale

        def with_position(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, where[:, None, :].expand(-1, x.shape[1], -1)], dim=2) if config.position else x

        seconds = 0.0
        if defended.any():
            begin = time.perf_counter()
            fake, _, _ = dp_drl.obfuscate(cells, lambda x: net(with_position(x)), eps, rng, config.n_scale)
            cells = torch.where(defended[:, None], fake, cells)
            seconds = time.perf_counter() - begin
        return with_position(cells[:, None, :])[:, 0], seconds

    obs, obf_seconds = observe(env.observe())
    steps = 0
    begin = time.perf_counter()
    while (episode < config.episodes).any():
        active = episode < config.episodes
        explore = config.exploration(episode)
        with torch.no_grad():
            greedy = net(obs[:, None, :])[:, 0].argmax(dim=1).numpy()
        random_action = rng.integers(len(ACTIONS), size=k_agents)
        action = np.where(rng.random(k_agents) < explore, random_action, greedy)
        reward, reached, truncated = env.step(action)
        nxt, seconds = observe(env.observe())
        obf_seconds += seconds
        slot = agent_steps % cap
        act_rows = rows[torch.from_numpy(active)]
        slot_t = torch.from_numpy(slot)[act_rows]
        buf_obs[act_rows, slot_t] = obs[act_rows]
        buf_next[act_rows, slot_t] = nxt[act_rows]
        buf_action[act_rows, slot_t] = torch.from_numpy(action)[act_rows]
        buf_reward[act_rows, slot_t] = torch.from_numpy(reward).float()[act_rows]
        buf_done[act_rows, slot_t] = torch.from_numpy(reached.astype(np.float32))[act_rows]
        agent_steps += active
        size = np.minimum(agent_steps, cap)
        ep_return += np.where(active, reward, 0.0)

        learn = active & (agent_steps > config.learning_starts) & (size >= config.batch_size)
        if learn.any():
            idx = torch.from_numpy((rng.random((k_agents, config.batch_size)) * np.maximum(size, 1)[:, None])
                                   .astype(np.int64))
            pick = rows[:, None], idx
            with torch.no_grad():
                q_next = target(buf_next[pick]).max(dim=2).values
                y = buf_reward[pick] + config.gamma * (1 - buf_done[pick]) * q_next
            q = net(buf_obs[pick])
            mask = torch.from_numpy(learn)
            per_agent = torch.func.vmap(dqn_loss)(q, buf_action[pick], y)
            (per_agent * mask).sum().backward()
            optimizer.step(mask)
        sync = active & (agent_steps % config.target_sync == 0)
        if sync.any():
            with torch.no_grad():
                for mine, theirs in zip(target.params, net.params):
                    mine[torch.from_numpy(sync)] = theirs[torch.from_numpy(sync)]

        ended = active & (reached | truncated)
        for j in np.flatnonzero(ended):
            returns[j].append(round(float(ep_return[j]), 9))  # a sum of tenths, without its float dust
            lengths[j].append(int(env.steps[j]))
            goals[j].append(bool(reached[j]))
        episode += ended
        ep_return[ended] = 0.0
        env.reset(ended)
        if ended.any():
            fresh, seconds = observe(env.observe())
            obf_seconds += seconds
            nxt = torch.where(torch.from_numpy(ended)[:, None], fresh, nxt)
        obs = nxt
        steps += 1
        if progress is not None and ended.any():
            progress(int(np.minimum(episode, config.episodes).sum()), config.episodes * k_agents)
    elapsed = time.perf_counter() - begin
    per_agent_steps = max(int(agent_steps.sum()), 1)
    return net, GridTraining(returns=returns, lengths=lengths, reached=goals, steps=steps,
                             seconds_per_step=elapsed / per_agent_steps,
                             obfuscation_seconds_per_step=obf_seconds / per_agent_steps if defended.any() else 0.0)
