"""Prediction purification (Z. Yang, B. Shao, B. Xuan, E.-C. Chang and F. Zhang, "Defending Model Inversion and
Membership Inference Attacks via Prediction Purification", arXiv 2005.03915, 2020), the model-inversion baseline of
seed 002, chapter 6 (Sec. 6.5.2, Table 6.2): an autoencoder between the classifier and the API reshapes every
confidence vector it returns.

The purifier is the thesis' autoencoder [k, 7, 4, 7, k] (the thesis' [10, 7, 4, 7, 10] for 10 classes), ReLU and
batch normalisation in its hidden layers and a softmax at its output, trained to reconstruct the target's confidence
vectors of a reference set the defender holds outside the target's training set (squared error, Adam): fitted to
non-members' answers through a four-unit bottleneck, it maps every answer to one like theirs, reducing the
dispersion the attacks read. The adversarial specialisation the paper adds is not part of the thesis' description
and not built. The predicted class can change (the thesis: 99.94% -> 99.87% train accuracy on MNIST).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.attacks.membership import AttackTraining, check_training, checked_confidences
from leaklab.errors import LeaklabError

__all__ = ["PURIFIER_WIDTHS", "Purifier", "train_purifier"]

PURIFIER_WIDTHS = (7, 4, 7)  # the hidden layers between k and k, seed 002 Sec. 6.5.2


class Purifier(nn.Module):
    """The autoencoder: confidence vectors (N, k) in, purified confidence vectors (N, k) out."""

    def __init__(self, k: int):
        super().__init__()
        layers: list[nn.Module] = []
        fan_in = k
        for width in PURIFIER_WIDTHS:
            layers += [nn.Linear(fan_in, width), nn.BatchNorm1d(width), nn.ReLU()]
            fan_in = width
        layers.append(nn.Linear(fan_in, k))
        self.net = nn.Sequential(*layers)

    def forward(self, confidences: torch.Tensor) -> torch.Tensor:
        return self.net(confidences).softmax(1)

    @torch.no_grad()
    def purify(self, confidences: torch.Tensor) -> torch.Tensor:
        """The vectors the API returns (the purifier in eval mode), in the dtype they came in."""
        return self.eval()(checked_confidences(confidences, "confidences")).to(confidences.dtype)


def train_purifier(reference: torch.Tensor, training: AttackTraining) -> Purifier:
    """A :class:`Purifier` trained on the defender's reference vectors (N, k), N >= 2: ``training.epochs`` epochs of
    Adam at ``training.lr`` on mini-batches of ``training.batch_size`` (at least 2: batch normalisation needs two;
    a last batch of one vector is skipped), initial weights and order from ``training.seed``
    (:class:`~leaklab.attacks.membership.AttackTraining`)."""
    check_training(training)
    reference = checked_confidences(reference, "reference")
    if len(reference) < 2 or training.batch_size < 2:
        raise LeaklabError("the purifier trains on batches of at least 2 vectors (batch normalisation); got "
                           f"{len(reference)} reference vectors and batch size {training.batch_size}")
    purifier = training.network(lambda: Purifier(reference.shape[1])).train()
    optimizer = torch.optim.Adam(purifier.parameters(), lr=training.lr)
    for batch in training.batches(len(reference)):
        if len(batch) < 2:
            continue
        optimizer.zero_grad()
        F.mse_loss(purifier(reference[batch]), reference[batch]).backward()
        optimizer.step()
    return purifier.eval()
