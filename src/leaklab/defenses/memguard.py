"""MemGuard (J. Jia, A. Salem, M. Backes, Y. Zhang and N. Z. Gong, "MemGuard: Defending against Black-Box Membership
Inference Attacks via Adversarial Examples", CCS 2019), the membership-inference baseline of seed 002, chapter 6
(Sec. 6.5.2, Table 6.2): the defender turns every confidence vector it returns into an adversarial example for its
own membership classifier, without changing the predicted class.

* The defender's classifier (:func:`train_memguard`): the thesis' [256, 128, 64] ReLU layers and a sigmoid output,
  trained on the target's answers for records the defender knows to be members and non-members; it reads the
  vector sorted in descending order (leaklab's choice: the thesis and the paper leave the input open, and the
  attacks it stands for read sorted posteriors or their classes' order).
* Phase I (the paper's Algorithm 1), for each vector ``s`` of logits ``z`` (``log s``: the same softmax): gradient
  steps of length ``step`` (the gradient normalised per vector) on the noise ``e`` of the logits, minimising
  ``|h(softmax(z + e))| + c2 ReLU(max_{j != l} (z + e)_j - (z + e)_l) + c3 ||softmax(z + e) - s||_2``, with ``h`` the
  classifier's logit (0 is its guess, 0.5) and ``l`` the predicted class; a vector is done once ``h`` changes sign
  with ``l`` still on top; those not done within ``max_iter`` steps start again from ``e = 0`` with ``c3`` ten times
  smaller, ``rounds`` times in all; a vector never done gets no noise.
* Phase II: the noise ``r`` found is added with probability ``min(1, budget / ||r||_1)`` (otherwise none), so the
  expected L1 distortion stays within ``budget``.

The predicted class never changes, so accuracy is the undefended one; the cost is an optimisation per query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.attacks.membership import AttackTraining, checked_confidences, member_classifier, mlp
from leaklab.errors import LeaklabError

__all__ = ["MEMGUARD_WIDTHS", "MemGuard", "train_memguard"]

MEMGUARD_WIDTHS = (256, 128, 64)  # the defender's classifier, seed 002 Sec. 6.5.2


class _SortedInput(nn.Module):
    """The classifier on the vector sorted in descending order."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, confidences: torch.Tensor) -> torch.Tensor:
        return self.net(confidences.sort(dim=1, descending=True).values)


@dataclass
class MemGuard:
    """A trained MemGuard: the defender's membership classifier and Phase I/II's settings (the paper's defaults
    where it gives them: 300 steps, c2 = 10, c3 = 0.1 divided by ten each round)."""

    classifier: nn.Module
    budget: float = 1.0
    max_iter: int = 300
    step: float = 0.1
    c2: float = 10.0
    c3: float = 0.1
    rounds: int = 3

    def __post_init__(self) -> None:
        if not self.budget >= 0 or self.max_iter < 1 or not self.step > 0 or self.rounds < 1:
            raise LeaklabError("MemGuard takes a budget >= 0, max_iter >= 1, step > 0 and rounds >= 1")
        self.classifier = self.classifier.double().eval()  # Phase I's steps in float64
        for p in self.classifier.parameters():
            p.requires_grad_(False)

    def adversarial(self, confidences: torch.Tensor) -> torch.Tensor:
        """Phase I: each vector moved to the far side of the classifier's boundary, its class kept (a vector for
        which no such move was found is returned as it was)."""
        s = checked_confidences(confidences, "confidences").double()
        z = s.clamp_min(1e-30).log()
        label = s.argmax(1)
        others = F.one_hot(label, s.shape[1]).bool()
        classifier = self.classifier
        with torch.no_grad():
            start = classifier(s).squeeze(1)
        found = s.clone()
        todo = torch.ones(len(s), dtype=torch.bool)
        c3 = self.c3
        for _ in range(self.rounds):
            rows = todo.nonzero().squeeze(1)
            e = torch.zeros_like(z[rows])
            for _ in range(self.max_iter):
                if len(rows) == 0:
                    break
                e.requires_grad_(True)
                logits = z[rows] + e
                moved = logits.softmax(1)
                h = classifier(moved).squeeze(1)
                top = logits.gather(1, label[rows, None]).squeeze(1)
                rival = logits.masked_fill(others[rows], -torch.inf).amax(1)
                loss = h.abs() + self.c2 * F.relu(rival - top) + c3 * (moved - s[rows]).norm(dim=1)
                grad, = torch.autograd.grad(loss.sum(), e)
                with torch.no_grad():
                    done = (h * start[rows] <= 0) & (top > rival)
                    found[rows[done]] = moved[done]
                    todo[rows[done]] = False
                    e = (e - self.step * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-30))[~done]
                    rows = rows[~done]
            c3 /= 10
        return found.to(confidences.dtype)

    def defend(self, confidences: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Phases I and II: the vectors to return, each noised with probability min(1, budget / ||r||_1)."""
        noisy = self.adversarial(confidences)
        distortion = (noisy - confidences).abs().sum(1)
        keep = torch.rand(len(confidences), generator=generator, dtype=torch.float64) < \
            (self.budget / distortion.double().clamp_min(1e-30)).clamp(max=1.0)
        return torch.where(keep[:, None], noisy, confidences)


def train_memguard(members: torch.Tensor, non_members: torch.Tensor, training: AttackTraining, **settings) -> MemGuard:
    """The defender's classifier trained on the target's confidence vectors of known members and non-members
    (:func:`~leaklab.attacks.membership.member_classifier`); ``settings`` are :class:`MemGuard`'s."""
    members = checked_confidences(members, "members")
    non_members = checked_confidences(non_members, "non_members")
    k = members.shape[1]
    if non_members.shape[1] != k:
        raise LeaklabError(f"members have {k} classes per row and non_members {non_members.shape[1]}")
    net = member_classifier(lambda: _SortedInput(mlp(k, *MEMGUARD_WIDTHS, 1)), (members,), (non_members,), training)
    return MemGuard(net, **settings)
