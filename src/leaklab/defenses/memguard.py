"""MemGuard (J. Jia, A. Salem, M. Backes, Y. Zhang and N. Z. Gong, "MemGuard: Defending against Black-Box Membership
Inference Attacks via Adversarial Examples", CCS 2019), the membership-inference baseline of seed 002, chapter 6
(Sec. 6.5.2, Table 6.2): the defender turns every confidence vector it returns into an adversarial example for its
own membership classifier, without changing the predicted class.

* The defender's classifier (:func:`train_memguard`): the thesis' [256, 128, 64] ReLU layers and a sigmoid output,
  trained on the target's answers for records the defender knows to be members and non-members; it reads the
  vector sorted in descending order (leaklab's choice: the thesis leaves the input open).
* Phase I (the paper's Algorithm 1, with the settings of the authors' code as a public port of it reads), for each
  vector ``s`` of logits ``z`` (``log s``: the same softmax): gradient steps of length ``step`` (the gradient normalised per vector) on the noise ``e`` of the
  logits, minimising ``|h(softmax(z + e))| + c2 ReLU(max_{j != l} (z + e)_j - (z + e)_l) + c3 ||softmax(z + e) -
  s||_1``, with ``h`` the classifier's logit (0 is its guess, 0.5) and ``l`` the predicted class; a search succeeds
  once ``h`` changes sign with ``l`` still on top, within ``max_iter`` steps. Starting at c3 = 0.1, each success is
  searched again from ``e = 0`` with c3 ten times larger (less distortion), up to ``c3_max``; the last success is
  the noise. A vector with no success, or whose noise leaves ``|h|`` larger than it was, gets none.
* Phase II: the noise ``r`` found is added with probability ``min(1, budget / ||r||_1)`` (otherwise none), so the
  expected L1 distortion stays within ``budget``.

The predicted class never changes, so accuracy is the undefended one; the cost is an optimisation per query.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.attacks.membership import AttackTraining, check_training, checked_confidences, member_classifier, mlp
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
    """A trained MemGuard: the defender's membership classifier (taken as a float64 copy) of ``classes``-class
    confidence vectors, and Phase I/II's settings (the original code's: 300 steps of length 0.1, c2 = 10, c3 from
    0.1 up to 1e5)."""

    classifier: nn.Module
    classes: int
    budget: float = 1.0
    max_iter: int = 300
    step: float = 0.1
    c2: float = 10.0
    c3: float = 0.1
    c3_max: float = 1e5

    def __post_init__(self) -> None:
        if not (self.budget >= 0 and isinstance(self.max_iter, int) and self.max_iter >= 1 and self.step > 0
                and self.c2 >= 0 and 0 < self.c3 <= self.c3_max and self.classes >= 2):
            raise LeaklabError("MemGuard takes classes >= 2, a budget >= 0, a whole max_iter >= 1, step > 0, c2 >= 0 "
                               "and 0 < c3 <= c3_max")
        self.classifier = copy.deepcopy(self.classifier).double().eval()  # Phase I's steps in float64
        for p in self.classifier.parameters():
            p.requires_grad_(False)

    def _search(self, z: torch.Tensor, s: torch.Tensor, label: torch.Tensor, start: torch.Tensor,
                c3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One search of Phase I at each row's ``c3``: (the vectors found, which rows found one)."""
        found, ok = s.clone(), torch.zeros(len(s), dtype=torch.bool)
        rows = torch.arange(len(s))
        others = F.one_hot(label, s.shape[1]).bool()
        e = torch.zeros_like(z)
        for _ in range(self.max_iter):
            if len(rows) == 0:
                break
            e.requires_grad_(True)
            logits = z[rows] + e
            moved = logits.softmax(1)
            h = self.classifier(moved).squeeze(1)
            top = logits.gather(1, label[rows, None]).squeeze(1)
            rival = logits.masked_fill(others[rows], -torch.inf).amax(1)
            loss = h.abs() + self.c2 * F.relu(rival - top) + c3[rows] * (moved - s[rows]).abs().sum(1)
            grad, = torch.autograd.grad(loss.sum(), e)
            with torch.no_grad():
                done = (h * start[rows] <= 0) & (top > rival)
                found[rows[done]], ok[rows[done]] = moved[done], True
                e = (e - self.step * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-30))[~done]
                rows = rows[~done]
        return found, ok

    def adversarial(self, confidences: torch.Tensor) -> torch.Tensor:
        """Phase I: each vector moved across the classifier's boundary with its class kept, by searches at c3 =
        0.1, 1, 10, ... (each success retried ten times as averse to distortion, up to ``c3_max``; the last success
        kept); a vector with no success, or whose move leaves the classifier further from its guess than it was,
        is returned as it came."""
        checked_confidences(confidences, "confidences")
        if confidences.shape[1] != self.classes:
            raise LeaklabError(f"this MemGuard defends {self.classes}-class confidence vectors; got "
                               f"{confidences.shape[1]} classes")
        s = confidences.detach().double()
        z = s.clamp_min(1e-30).log()
        label = s.argmax(1)
        with torch.no_grad():
            start = self.classifier(s).squeeze(1)
        best, moved = s.clone(), torch.zeros(len(s), dtype=torch.bool)
        c3 = torch.full((len(s),), self.c3, dtype=torch.float64)
        active = torch.arange(len(s))
        while len(active):
            found, ok = self._search(z[active], s[active], label[active], start[active], c3)
            best[active[ok]], moved[active[ok]] = found[ok], True
            c3 = c3[ok] * 10
            active = active[ok][c3 <= self.c3_max]
            c3 = c3[c3 <= self.c3_max]
        with torch.no_grad():
            moved &= self.classifier(best).squeeze(1).abs() <= start.abs()
        return torch.where(moved[:, None], best.to(confidences.dtype), confidences)

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
    check_training(training)
    members = checked_confidences(members, "members")
    non_members = checked_confidences(non_members, "non_members")
    k = members.shape[1]
    if non_members.shape[1] != k:
        raise LeaklabError(f"members have {k} classes per row and non_members {non_members.shape[1]}")
    net = member_classifier(lambda: _SortedInput(mlp(k, *MEMGUARD_WIDTHS, 1)), (members,), (non_members,), training)
    return MemGuard(net, k, **settings)
