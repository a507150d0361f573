"""PE-QMIX, the privacy-engineered QMIX of seed 003 (Gohari, thesis 2023), chapter 4, Sec. 4.3.3, with a
two-layer monotonic mixer (K = 2, as the authors' code).

QMIX mixes the agents' Q values with weights made by hypernetworks of the global state (eqs. 4.15-4.18); PE-QMIX
has no global state: each agent owns an encoder of its own observation and hypernetworks that make its share of the
mixer (Fig. 4.6), and the mixer is evaluated layer by layer through secure sums
(:func:`leaklab.privacy.secret_sharing.secure_sum`):

* round 1 (eq. 4.20): z1 = sum_i (Q_i(tau_i, a_i) |W1_i| + b1_i), agent i contributing its Q value times its own
  row of the first layer plus its bias share;
* round 2 (eq. 4.21): W2 = sum_i |W2_i| and b2 = sum_i b2_i, the second layer's weights and bias summed;
* Q_tot = elu(z1) . W2 + b2 (eq. 4.23; non-negative weights keep it monotonic in every Q_i).

The sums are revealed (by design, so that every agent can build its backward graph: Sec. 4.3.3, item 4). Agent i
rebuilds each sum as revealed.detach() - own.detach() + own, so its loss (eq. 4.19) has the team's value and its
gradient reaches only its own Q network, encoder and hypernetworks, equal to the gradient of a centralised mixer
whose layers are these sums (the split the thesis calls unbiased; the authors' code sums per-agent products in round
2 instead, which biases agent i's gradient through elu(z1): notes-003 4.3).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from leaklab.privacy.secret_sharing import secure_sum

__all__ = ["MixerShare", "mixer_messages", "pe_qmix_losses", "qmix_loss", "revealed_sum", "secure_total"]


class MixerShare(nn.Module):
    """One agent's share of the mixer: an encoder of its observation and the hypernetworks of its first-layer row
    |W1_i| and bias b1_i (``hidden`` each) and of its second-layer weights |W2_i| (``hidden``) and bias b2_i."""

    def __init__(self, observation: int, hidden: int = 32, embedding: int = 64):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(observation, embedding), nn.ReLU())
        self.w1 = nn.Sequential(nn.Linear(embedding, embedding), nn.ReLU(), nn.Linear(embedding, hidden))
        self.b1 = nn.Linear(embedding, hidden)
        self.w2 = nn.Sequential(nn.Linear(embedding, embedding), nn.ReLU(), nn.Linear(embedding, hidden))
        self.b2 = nn.Sequential(nn.Linear(embedding, embedding), nn.ReLU(), nn.Linear(embedding, 1))

    def forward(self, observation: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Agent i's three messages for a batch: Q_i |W1_i| + b1_i ``[B, hidden]``, |W2_i| ``[B, hidden]``,
        b2_i ``[B]``."""
        e = self.encoder(observation)
        return q[:, None] * self.w1(e).abs() + self.b1(e), self.w2(e).abs(), self.b2(e).squeeze(1)


def _mix(first: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (F.elu(first) * weights).sum(1) + bias


def mixer_messages(shares: Sequence[MixerShare], observations: Sequence[torch.Tensor],
                   qs: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
    """Every agent's three messages (see :meth:`MixerShare.forward`)."""
    return [share(o, q) for share, o, q in zip(shares, observations, qs)]


def qmix_loss(messages: Sequence[tuple[torch.Tensor, ...]], target_total: torch.Tensor, reward: torch.Tensor,
              done: torch.Tensor, gamma: float) -> torch.Tensor:
    """The centralised reference: the mixer whose layers are the plain sums of the messages, and eq. 4.19's loss
    against r + gamma (1 - done) Q_tot^- (``target_total``, from the target networks)."""
    total = _mix(*(torch.stack([m[k] for m in messages]).sum(0) for k in range(3)))
    return ((total - (reward + gamma * (1 - done) * target_total.detach())) ** 2).mean()


def revealed_sum(parts: Sequence[torch.Tensor], rng: np.random.Generator) -> torch.Tensor:
    """The sum of the agents' tensors ``parts`` (one each, same shape) as the secure sum reveals it (no gradient)."""
    stacked = torch.stack([p.detach() for p in parts]).double().cpu().numpy()
    return torch.as_tensor(secure_sum(stacked, rng).total, dtype=parts[0].dtype)


def _revealed(messages: Sequence[tuple[torch.Tensor, ...]], rng: np.random.Generator) -> list[torch.Tensor]:
    """The three sums as the secure sums reveal them (detached)."""
    return [revealed_sum([m[k] for m in messages], rng) for k in range(3)]


def secure_total(messages: Sequence[tuple[torch.Tensor, ...]], rng: np.random.Generator) -> torch.Tensor:
    """Q_tot from the revealed sums alone (no gradient): what every agent computes for the target networks."""
    return _mix(*_revealed(messages, rng))


def pe_qmix_losses(messages: Sequence[tuple[torch.Tensor, ...]], target_total: torch.Tensor, reward: torch.Tensor,
                   done: torch.Tensor, gamma: float, rng: np.random.Generator) -> list[torch.Tensor]:
    """Each agent's loss: the mixer rebuilt from the revealed sums with its own messages in the graph."""
    sums = _revealed(messages, rng)
    target = reward + gamma * (1 - done) * target_total.detach()
    losses = []
    for own in messages:
        local = [s - m.detach() + m for s, m in zip(sums, own)]
        losses.append(((_mix(*local) - target) ** 2).mean())
    return losses
