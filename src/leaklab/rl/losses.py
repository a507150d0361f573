"""The training objectives of seed 000 section III whose gradients a federated client shares.

Both are means over the batch, so a batch-1 gradient is the single-sample gradient of the paper.
Attacks (white box) use the same functions to simulate a client.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dqn_loss(q_values: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """DQN's mean squared TD error ``mean_b (Q̂(s_b, a_b) − Q_b)²`` (section III after eq. 3, and IV-C2: "the objective
    function is the mean square error"; the target
    ``Q_b = r_b + γ (1 − done_b) max_a' Q_target(s'_b, a')`` is computed by the caller, detached)."""
    q_taken = q_values.gather(1, actions.view(-1, 1)).squeeze(1)
    return F.mse_loss(q_taken, targets.to(q_taken.dtype))


def reinforce_loss(logits: torch.Tensor, actions: torch.Tensor, returns: torch.Tensor,
                   entropy_weight: float) -> torch.Tensor:
    """REINFORCE with an entropy bonus (eq. 4): ``mean_b [−R_b log π(a_b|s_b) − α H(π(·|s_b))]``."""
    log_p = F.log_softmax(logits, dim=1)
    log_p_taken = log_p.gather(1, actions.view(-1, 1)).squeeze(1)
    entropy = -(log_p.exp() * log_p).sum(dim=1)
    return (-returns.to(log_p.dtype) * log_p_taken - entropy_weight * entropy).mean()
