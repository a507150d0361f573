"""Membership inference from a deployed classifier's confidence vectors: the two attacks of seed 002, chapter 6
(section 6.5, Table 6.2), which the One Parameter Defense is measured against.

* :func:`ml_leaks`: ML-Leaks (A. Salem, Y. Zhang, M. Humbert, P. Berrang, M. Fritz and M. Backes, "ML-Leaks: Model
  and Data Independent Membership Inference Attacks and Defenses on Machine Learning Models", NDSS 2019). The
  attacker knows no membership: it trains an attack model on a shadow model's answers (the shadow's own members and
  non-members) and applies it to the target's.
* :func:`shadow_models`: R. Shokri, M. Stronati, C. Song and V. Shmatikov, "Membership Inference Attacks Against
  Machine Learning Models", S&P 2017, as seed 003 chapter 3 (Sec. 3.4.1) uses it: shadow models trained like the
  target on the attacker's own data give (confidence vector, one-hot label, membership) triples, and one binary
  classifier on the first two is applied to the target's answers.
* :func:`nsh`: M. Nasr, R. Shokri and A. Houmansadr, "Machine Learning with Membership Privacy using Adversarial
  Regularization", CCS 2018. The attacker knows which of its queries were members and trains on the target's own
  answers, the confidence vector and the class label together.

Both attacks see confidence vectors only, as the prediction API returns them (after any post-processing defense),
and return an accuracy: 0.5 is guessing. The attack networks give a logit: their sigmoid output is folded into the
loss (binary cross-entropy on logits, for numerical stability) and applied at prediction. Every random draw (the
networks' initial weights, the batches' order) follows :attr:`AttackTraining.seed`; the global generator is left
as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.fields import Seed
from leaklab.seeds import stream_seed

__all__ = ["AttackTraining", "check_training", "checked_confidences", "feature_attack", "member_classifier", "ml_leaks",
           "mlp", "nsh", "shadow_models"]

ML_LEAKS_TOP = 3  # ML-Leaks' attack model reads the 3 largest posteriors, sorted in descending order
_BATCHES = "attack-batches"  # the purpose of the stream that orders an attack network's mini-batches


class AttackTraining(BaseModel):
    """How an attack network is trained (Adam on mini-batches, reshuffled every epoch); the thesis gives none of
    these, so they are leaklab's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    epochs: int = Field(default=80, ge=1, le=10_000)
    lr: float = Field(default=1e-3, gt=0, description="Adam's learning rate")
    batch_size: int = Field(default=64, ge=1, le=65_536)
    seed: Seed = 0

    def network(self, build: Callable[[], nn.Module]) -> nn.Module:
        """The network ``build`` makes, its initial weights drawn from ``seed`` (on the CPU; the global generator
        is restored afterwards)."""
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(self.seed)
            return build()

    def batches(self, n: int, device: torch.device | str = "cpu") -> Iterator[torch.Tensor]:
        """The row indices of ``epochs`` epochs of mini-batches of ``n`` rows, reshuffled every epoch by a
        generator of its own, seeded by ``seed``."""
        order = torch.Generator().manual_seed(stream_seed(self.seed, _BATCHES))
        for _ in range(self.epochs):
            yield from torch.randperm(n, generator=order).to(device).split(self.batch_size)


def ml_leaks(shadow_in: torch.Tensor, shadow_out: torch.Tensor, target_in: torch.Tensor, target_out: torch.Tensor,
             training: AttackTraining = AttackTraining()) -> float:
    """ML-Leaks (Salem et al., NDSS 2019), as seed 002 chapter 6 uses it: the attacker trains a shadow model (the
    caller does: same architecture, its own data) and, on the shadow's confidence vectors of its members (label 1,
    ``shadow_in`` (N, k)) and non-members (label 0, ``shadow_out`` (M, k)), an attack model: an MLP on the top-3
    sorted posteriors (descending; when k < 3, zero-padded), one hidden layer of 64 ReLU units, a sigmoid output,
    trained with binary cross-entropy and Adam. Returns the attack's accuracy on the target's members ``target_in``
    and non-members ``target_out`` (predict member when the output > 0.5), each set counting as many as it holds
    (the caller balances them)."""
    check_training(training)
    sets = _confidence_sets({"shadow_in": shadow_in, "shadow_out": shadow_out, "target_in": target_in,
                             "target_out": target_out})
    features = [(_top_posteriors(c),) for c in sets]
    net = member_classifier(lambda: mlp(ML_LEAKS_TOP, 64, 1), features[0], features[1], training)
    return _accuracy(net, features[2], features[3])


def shadow_models(shadow_in: tuple[torch.Tensor, torch.Tensor], shadow_out: tuple[torch.Tensor, torch.Tensor],
                  target_in: tuple[torch.Tensor, torch.Tensor], target_out: tuple[torch.Tensor, torch.Tensor],
                  training: AttackTraining = AttackTraining()) -> float:
    """Shokri et al.'s attack with seed 003's single binary classifier (Sec. 3.4.1, step 3): each argument is a
    pair (confidences (N, k), labels (N,) int64); ``shadow_in`` / ``shadow_out`` are the shadow models' answers on
    their members and non-members (all shadows' rows together). The classifier, an MLP on the confidence vector
    concatenated with the one-hot label (2k -> 64 -> 1, ReLU; the thesis leaves it open), is trained with BCE and
    Adam on the shadows' rows and returns its accuracy on the target's members and non-members."""
    check_training(training)
    _, labelled = _labelled_sets({"shadow_in": shadow_in, "shadow_out": shadow_out, "target_in": target_in,
                                  "target_out": target_out})
    return feature_attack(*(torch.cat([c, one_hot], dim=1) for c, one_hot in labelled), training=training)


def feature_attack(shadow_in: torch.Tensor, shadow_out: torch.Tensor, target_in: torch.Tensor,
                   target_out: torch.Tensor, training: AttackTraining = AttackTraining()) -> float:
    """The binary classifier of seed 003's attacks (an MLP d -> 64 -> 1, ReLU) trained with BCE and Adam on the
    shadows' feature rows of members (label 1) and non-members (0), each (N, d); returns its accuracy on the target's
    rows (member where the sigmoid > 0.5), each set counting as many as it holds."""
    check_training(training)
    sets = [_finite_rows(t, name) for t, name in ((shadow_in, "shadow_in"), (shadow_out, "shadow_out"),
                                                  (target_in, "target_in"), (target_out, "target_out"))]
    if len({t.shape[1] for t in sets}) != 1:
        raise LeaklabError(f"every feature set has as many columns (got {', '.join(str(t.shape[1]) for t in sets)})")
    net = member_classifier(lambda: mlp(sets[0].shape[1], 64, 1), (sets[0],), (sets[1],), training)
    return _accuracy(net, (sets[2],), (sets[3],))


def _finite_rows(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.ndim != 2 or len(value) == 0 or value.shape[1] == 0:
        raise LeaklabError(f"{name} must be a non-empty 2-d tensor of feature rows")
    if not value.is_floating_point() or not bool(torch.isfinite(value).all()):
        raise LeaklabError(f"{name} must hold finite floating-point features")
    return value


def nsh(train_in: tuple[torch.Tensor, torch.Tensor], train_out: tuple[torch.Tensor, torch.Tensor],
        test_in: tuple[torch.Tensor, torch.Tensor], test_out: tuple[torch.Tensor, torch.Tensor],
        training: AttackTraining = AttackTraining()) -> float:
    """Nasr, Shokri and Houmansadr (CCS 2018), as seed 002 chapter 6 uses it: the attacker knows which of its queries
    were members and trains on the target's own answers. Each argument is a pair (confidences (N, k), labels (N,)
    int64 class indices). Three networks: on the confidence vector, k -> 1024 -> 512 -> 64; on the one-hot label,
    k -> 512 -> 64; on their concatenation, 128 -> 256 -> 64 -> 1 with a sigmoid (ReLU between layers; the thesis'
    "100" input is Nasr's class count, here k; its "256" after the concatenation is taken as the first hidden width,
    64 + 64 = 128 being the input). Trained end to end with BCE and Adam on train_in (1) / train_out (0); returns
    the accuracy on test_in / test_out."""
    check_training(training)
    k, sets = _labelled_sets({"train_in": train_in, "train_out": train_out, "test_in": test_in, "test_out": test_out})
    net = member_classifier(lambda: _NshNet(k), sets[0], sets[1], training)
    return _accuracy(net, sets[2], sets[3])


def _labelled_sets(pairs: dict[str, object]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The named (confidences, labels) pairs checked: the class count k and, per pair, the confidences and the
    one-hot labels."""
    for name, pair in pairs.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            got = f"{len(pair)} items" if isinstance(pair, (tuple, list)) else type(pair).__name__
            raise LeaklabError(f"{name} must be a pair (confidences (N, k), labels (N,)); got {got}")
    confidences = _confidence_sets({name: pair[0] for name, pair in pairs.items()})
    k = confidences[0].shape[1]
    return k, [(c, F.one_hot(_labels(pair[1], c, k, name), k).float())
               for c, (name, pair) in zip(confidences, pairs.items())]


class _NshNet(nn.Module):
    """Nasr et al.'s attack network: a confidence branch and a label branch, joined by a third network that gives
    the membership logit (the sigmoid is applied by the loss and at prediction)."""

    def __init__(self, k: int):
        super().__init__()
        self.confidence = mlp(k, 1024, 512, 64, last_relu=True)
        self.label = mlp(k, 512, 64, last_relu=True)
        self.joint = mlp(128, 256, 64, 1)

    def forward(self, confidences: torch.Tensor, one_hot: torch.Tensor) -> torch.Tensor:
        return self.joint(torch.cat([self.confidence(confidences), self.label(one_hot)], dim=1))


def mlp(*widths: int, last_relu: bool = False) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (and after the last with ``last_relu``)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _top_posteriors(confidences: torch.Tensor) -> torch.Tensor:
    """ML-Leaks' features: the 3 largest entries of each row in descending order, zeros after the k-th when k < 3."""
    top = confidences.sort(dim=1, descending=True).values[:, :ML_LEAKS_TOP]
    return F.pad(top, (0, ML_LEAKS_TOP - top.shape[1]))


def member_classifier(build: Callable[[], nn.Module], members: Sequence[torch.Tensor],
                      non_members: Sequence[torch.Tensor], training: AttackTraining) -> nn.Module:
    """A network from ``build`` (its initial weights drawn from ``training.seed``) trained to tell ``members``
    (label 1) from ``non_members`` (label 0), each a tuple of the network's inputs: binary cross-entropy on its
    logit, weighted so that both sets count equally, and Adam on mini-batches reshuffled every epoch."""
    device = members[0].device
    net = training.network(build).to(device).train()
    inputs = [torch.cat([m, n]) for m, n in zip(members, non_members)]
    n_in, n_out = len(members[0]), len(non_members[0])
    targets = torch.cat([torch.ones(n_in), torch.zeros(n_out)]).to(device)
    # mean weight 1: each set weighs half of the total, whatever its size
    weights = torch.cat([torch.full((n_in,), (n_in + n_out) / (2 * n_in)),
                         torch.full((n_out,), (n_in + n_out) / (2 * n_out))]).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=training.lr)
    for batch in training.batches(n_in + n_out, device):
        logits = net(*(x[batch] for x in inputs)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, targets[batch], weight=weights[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net.eval()


@torch.no_grad()
def _accuracy(net: nn.Module, members: Sequence[torch.Tensor], non_members: Sequence[torch.Tensor]) -> float:
    """The share of rows ``net`` (in eval mode) gets right, predicting member where its sigmoid output > 0.5."""
    hits_in = (torch.sigmoid(net(*members).squeeze(1)) > 0.5).sum().item()
    hits_out = (torch.sigmoid(net(*non_members).squeeze(1)) <= 0.5).sum().item()
    return (hits_in + hits_out) / (len(members[0]) + len(non_members[0]))


def check_training(training: object) -> None:
    """Refuse a ``training`` other than an :class:`AttackTraining` (a dict would fail later, far from the cause)."""
    if not isinstance(training, AttackTraining):
        raise LeaklabError(f"training must be an AttackTraining (got {type(training).__name__})")


def _confidence_sets(sets: dict[str, object]) -> list[torch.Tensor]:
    """The named sets of confidence vectors, checked: 2-D float tensors with one k, finite, at least one row each;
    returned detached, on the first set's device."""
    checked = [checked_confidences(value, name) for name, value in sets.items()]
    first = next(iter(sets))
    k = checked[0].shape[1]
    for name, c in zip(sets, checked):
        if c.shape[1] != k:
            raise LeaklabError(f"{name} has {c.shape[1]} classes per row and {first} {k}: every set must come from "
                               "the same k-class classifier")
    return [c.to(checked[0].device) for c in checked]


def checked_confidences(value: object, name: str) -> torch.Tensor:
    """``value`` checked as a set of confidence vectors (a 2-D float tensor, (N, k), N and k >= 1, finite), detached
    and in float32 (the attack networks'); else a :class:`~leaklab.errors.LeaklabError` naming it as ``name``."""
    if not isinstance(value, torch.Tensor):
        raise LeaklabError(f"{name} must be a torch tensor of confidence vectors (N, k); got {type(value).__name__}")
    if not value.is_floating_point():
        raise LeaklabError(f"{name} must hold floats (confidence vectors); got {value.dtype}")
    if value.ndim != 2 or 0 in value.shape:
        raise LeaklabError(f"{name} must be a 2-D tensor (N, k) with at least one row and one class; got shape "
                           f"{tuple(value.shape)}")
    value = value.detach().float()
    if not torch.isfinite(value).all():
        raise LeaklabError(f"{name} holds NaN or infinite values (in float32); confidence vectors must be finite")
    return value


def _labels(value: object, confidences: torch.Tensor, k: int, name: str) -> torch.Tensor:
    """``value`` checked as the class labels of the rows of ``confidences``: integers in [0, k), one per row."""
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex() or \
            value.dtype == torch.bool:
        what = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise LeaklabError(f"{name}'s labels must be an integer tensor of class indices (int64); got {what}")
    if value.shape != (len(confidences),):
        raise LeaklabError(f"{name}'s labels must have shape ({len(confidences)},), one per confidence vector; got "
                           f"{tuple(value.shape)}")
    if ((value < 0) | (value >= k)).any():
        raise LeaklabError(f"{name}'s labels must be class indices in [0, {k - 1}]; got values from "
                           f"{value.min().item()} to {value.max().item()}")
    return value.detach().to(confidences.device, torch.int64)
