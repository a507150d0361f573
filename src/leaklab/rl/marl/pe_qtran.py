"""PE-QTRAN, the privacy-engineered QTRAN of seed 003 (Gohari, thesis 2023), chapter 4, Sec. 4.3.3.

QTRAN (Son et al. 2019; Theorem 4.1) trains a team value Q_tot(h_Q) and a state value V(h_V) on the sums of
per-agent encodings, h_Q = sum_i h_Qi(tau_i, a_i) and h_V = sum_i h_Vi(tau_i), with three losses (eqs. 4.25-4.28):

* l_td = (r + gamma (1 - done) Q_tot^-(tau', a-bar') - Q_tot(tau, a))^2, a-bar' the target networks' greedy actions;
* l_opt = (sum_i Q_i(tau_i, a-bar_i) - Q^_tot(tau, a-bar) + V(tau))^2, a-bar the agents' greedy actions;
* l_nopt = (min(sum_i Q_i(tau_i, a_i) - Q^_tot(tau, a) + V(tau), 0))^2 (the thesis' {z}_+ := min(z, 0));

l = l_td + lambda_opt l_opt + lambda_nopt l_nopt, each the mean over the minibatch, Q^_tot without gradient.

PE-QTRAN (eqs. 4.29-4.31): each agent owns its encoders and a share of Q_tot's and V's layers. The first layers are
sums of the agents' own pre-activations, sum_i (h_Qi W1_Qi + b1_Qi) and sum_i (h_Vi W1_Vi + b1_Vi) (round 1, with
the Q value sums of PE-VDN); the second layers' weights and biases are sums of the shares (round 2);
Q_tot = relu(z1) . W2 + b2 and likewise V, one hidden layer of ``hidden`` units as the authors' code (notes-003,
4.4). Every sum goes through :func:`leaklab.privacy.secret_sharing.secure_sum` and is revealed; agent i rebuilds
each as revealed.detach() - own.detach() + own (its second-layer shares through their layers' forward, as DP-SGD's
per-sample gradients need), so its loss has the team's value and a gradient that reaches only its own Q network,
encoders and shares, equal to the centralised QTRAN's (:func:`qtran_loss`) on those parameters.
lambda_opt = 1 and lambda_nopt = 0.1 (the authors' code); the thesis gives none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.rl.marl.pe_qmix import revealed_sum

__all__ = ["QtranShare", "QtranMessages", "qtran_messages", "qtran_loss", "pe_qtran_losses", "secure_target"]

LAMBDA_OPT, LAMBDA_NOPT = 1.0, 0.1


class QtranShare(nn.Module):
    """One agent's encoders h_Qi(tau_i, a_i) (observation and one-hot action) and h_Vi(tau_i), and its shares of
    Q_tot's and V's first layers (on its own encoding) and second layers (summed over the agents)."""

    def __init__(self, observation: int, actions: int, embedding: int = 32, hidden: int = 64):
        super().__init__()
        self.actions = actions
        self.h_q = nn.Sequential(nn.Linear(observation + actions, embedding), nn.ReLU())
        self.h_v = nn.Sequential(nn.Linear(observation, embedding), nn.ReLU())
        self.q1, self.q2 = nn.Linear(embedding, hidden), nn.Linear(hidden, 1)
        self.v1, self.v2 = nn.Linear(embedding, hidden), nn.Linear(hidden, 1)

    def first_q(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Eq. 4.29's term of this agent: h_Qi(tau_i, a_i) W1_Qi + b1_Qi, ``[B, hidden]``."""
        return self.q1(self.h_q(torch.cat([observation, F.one_hot(action, self.actions).to(observation)], 1)))

    def first_v(self, observation: torch.Tensor) -> torch.Tensor:
        """Eq. 4.30's term of this agent, ``[B, hidden]``."""
        return self.v1(self.h_v(observation))

    def second(self) -> tuple[torch.Tensor, ...]:
        """Eq. 4.31's shares: Q_tot's and V's second-layer weights ``[hidden]`` and biases ``[]``."""
        return self.q2.weight[0], self.q2.bias[0], self.v2.weight[0], self.v2.bias[0]


class QtranMessages(NamedTuple):
    """One agent's contributions to a minibatch's sums: the first-layer terms at (tau, a) and (tau, a-bar, without
    gradient) and of V, its Q values at a and a-bar, and its second-layer shares (:meth:`QtranShare.second`); the
    sums over the agents have the same fields."""

    first_q: torch.Tensor
    first_q_best: torch.Tensor
    first_v: torch.Tensor
    q: torch.Tensor
    q_best: torch.Tensor
    w_q: torch.Tensor
    b_q: torch.Tensor
    w_v: torch.Tensor
    b_v: torch.Tensor


def qtran_messages(shares: Sequence[QtranShare], observations: Sequence[torch.Tensor],
                   actions: Sequence[torch.Tensor], q_values: Sequence[torch.Tensor]) -> list[QtranMessages]:
    """Every agent's messages; ``q_values[i]`` is Q_i(tau_i, .) ``[B, actions]`` with its graph, ``actions[i]`` the
    actions taken."""
    out = []
    for share, o, a, q in zip(shares, observations, actions, q_values):
        best = q.max(1)
        with torch.no_grad():  # it enters Q^_tot alone, whose gradient is stopped (and DP-SGD's per-sample hooks
            first_q_best = share.first_q(o, best.indices)  # pair each forward with a backward)
        out.append(QtranMessages(share.first_q(o, a), first_q_best, share.first_v(o),
                                 q.gather(1, a[:, None]).squeeze(1), best.values, *share.second()))
    return out


def _head(first: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.relu(first) @ weight + bias


def _own_head(first: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """:func:`_head` on the revealed second-layer sums ``weight`` and ``bias`` with the agent's own share ``layer``
    put back in the graph: through the layer's forward, so that DP-SGD's per-sample hooks see it (opacus computes no
    per-sample gradient of a weight used as a plain tensor). Same value and gradients as revealed - own.detach() +
    own."""
    hidden = F.relu(first)
    others = hidden @ (weight - layer.weight[0].detach()) + (bias - layer.bias[0].detach())
    return others + layer(hidden)[:, 0]


def _losses(total: torch.Tensor, v: torch.Tensor, q: torch.Tensor, q_best: torch.Tensor,
            fixed: QtranMessages, target_total: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
            gamma: float) -> torch.Tensor:
    """Eq. 4.28 from Q_tot(tau, a), V(tau), the summed Q values at a and a-bar, and the sums ``fixed`` (for Q^_tot,
    whose gradient is stopped)."""
    fixed_total = _head(fixed.first_q, fixed.w_q, fixed.b_q)
    fixed_best = _head(fixed.first_q_best, fixed.w_q, fixed.b_q)
    td = ((reward + gamma * (1 - done) * target_total.detach() - total) ** 2).mean()
    opt = ((q_best - fixed_best + v) ** 2).mean()
    nopt = (torch.clamp(q - fixed_total + v, max=0.0) ** 2).mean()
    return td + LAMBDA_OPT * opt + LAMBDA_NOPT * nopt


def qtran_loss(messages: Sequence[QtranMessages], target_total: torch.Tensor, reward: torch.Tensor,
               done: torch.Tensor, gamma: float) -> torch.Tensor:
    """Centralised QTRAN on the plain sums of the messages: the reference PE-QTRAN reproduces."""
    sums = QtranMessages(*(torch.stack(parts).sum(0) for parts in zip(*messages)))
    return _losses(_head(sums.first_q, sums.w_q, sums.b_q), _head(sums.first_v, sums.w_v, sums.b_v), sums.q,
                   sums.q_best, QtranMessages(*(x.detach() for x in sums)), target_total, reward, done, gamma)


def pe_qtran_losses(messages: Sequence[QtranMessages], shares: Sequence[QtranShare], target_total: torch.Tensor,
                    reward: torch.Tensor, done: torch.Tensor, gamma: float,
                    rng: np.random.Generator) -> list[torch.Tensor]:
    """Each agent's loss from the revealed sums with its own messages (and, for the second layers, its ``shares``'
    layers) in the graph."""
    if len(shares) != len(messages) or any(m.w_q.data_ptr() != s.q2.weight.data_ptr()
                                           for m, s in zip(messages, shares)):
        raise LeaklabError("pe_qtran_losses needs the shares that made the messages, one per agent, in their order")
    sums = QtranMessages(*(revealed_sum(parts, rng) for parts in zip(*messages)))
    losses = []
    for own, share in zip(messages, shares):
        first_q, first_v, q, q_best = (revealed - mine.detach() + mine for revealed, mine in
                                       ((sums.first_q, own.first_q), (sums.first_v, own.first_v), (sums.q, own.q),
                                        (sums.q_best, own.q_best)))
        losses.append(_losses(_own_head(first_q, sums.w_q, sums.b_q, share.q2),
                              _own_head(first_v, sums.w_v, sums.b_v, share.v2), q, q_best, sums, target_total,
                              reward, done, gamma))
    return losses


def secure_target(shares: Sequence[QtranShare], observations: Sequence[torch.Tensor],
                  actions: Sequence[torch.Tensor], rng: np.random.Generator) -> torch.Tensor:
    """Q_tot^-(tau', a-bar') from the target shares through secure sums (no gradient)."""
    with torch.no_grad():
        first = [s.first_q(o, a) for s, o, a in zip(shares, observations, actions)]
        weights = [s.second()[:2] for s in shares]
        return _head(revealed_sum(first, rng), *(revealed_sum([w[k] for w in weights], rng) for k in range(2)))
