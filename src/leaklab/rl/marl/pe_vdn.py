"""PE-VDN, the privacy-engineered value decomposition network of seed 003 (Gohari, thesis 2023), chapter 4,
Sec. 4.3.1: each agent keeps its Q network and replay buffer, and the team TD error of VDN (eq. 4.7),

    A = r + sum_i (gamma max_a' Q_i^-(tau_i', a') - Q_i(tau_i, a_i)),

which couples the agents, is assembled by a secure sum (:func:`leaklab.privacy.secret_sharing.secure_sum`) of one
number per agent and sample (the authors' form of eq. 4.9's message): s_i = Q_i(tau_i, a_i) - (r / N +
gamma (1 - done) max_a' Q_i^-(tau_i', a')), whose sum is -A. Agent i's loss is the mean of
(S - s_i.detach() + s_i)^2 with S the revealed sum: its value is the team's squared TD error and its gradient
flows only into agent i's own network, equal to the gradient of centralised VDN's loss for that agent's parameters
(eq. 4.8), up to the fixed-point encoding's 10^-precision per term. All agents must use the same minibatch
indices (their buffers are aligned by episode and step, with one team reward).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from leaklab.errors import LeaklabError
from leaklab.privacy.secret_sharing import FIELD, PRECISION, SecureSum, secure_sum

__all__ = ["pe_vdn_losses", "vdn_loss"]


def _check(chosen: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], reward: torch.Tensor,
           done: torch.Tensor) -> None:
    if len(chosen) < 2 or len(chosen) != len(targets):
        raise LeaklabError("PE-VDN needs 2 agents or more, each with its chosen and target Q values")
    shape = reward.shape
    if any(q.shape != shape for q in (*chosen, *targets)) or done.shape != shape:
        raise LeaklabError(f"every agent's Q values, the reward and the done flags are one number per sample "
                           f"(shape {tuple(shape)})")


def vdn_loss(chosen: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], reward: torch.Tensor,
             done: torch.Tensor, gamma: float) -> torch.Tensor:
    """Centralised VDN's loss (eq. 4.7), the mean over samples of (r + gamma (1 - done) sum_i max Q_i^- -
    sum_i Q_i)^2: the reference PE-VDN reproduces."""
    _check(chosen, targets, reward, done)
    target = reward + gamma * (1 - done) * torch.stack([t.detach() for t in targets]).sum(0)
    return ((torch.stack(list(chosen)).sum(0) - target) ** 2).mean()


def pe_vdn_losses(chosen: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], reward: torch.Tensor,
                  done: torch.Tensor, gamma: float, rng: np.random.Generator, p: int = FIELD,
                  precision: int = PRECISION) -> tuple[list[torch.Tensor], SecureSum]:
    """Each agent's loss, from a secure sum of its messages s_i (see the module's docstring); ``chosen[i]`` is
    Q_i(tau_i, a_i) (with its graph), ``targets[i]`` max_a' Q_i^-(tau_i', a') (from the target network), one per
    sample. Returns the losses (agent i backpropagates the i-th) and the secure sum, whose messages are all any
    agent sees of the others."""
    _check(chosen, targets, reward, done)
    n = len(chosen)
    messages = [q - (reward / n + gamma * (1 - done) * t.detach()) for q, t in zip(chosen, targets)]
    summed = secure_sum(torch.stack([m.detach() for m in messages]).double().cpu().numpy(), rng, p, precision)
    total = torch.as_tensor(summed.total, dtype=messages[0].dtype, device=messages[0].device)
    return [((total - m.detach() + m) ** 2).mean() for m in messages], summed
