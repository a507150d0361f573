"""Seed 004's two-step attack (Zhang, Chen, Li, "Privacy Leakage of Adversarial Training Models in Federated
Learning Systems"): restore each sample's feature from the last layer's batch gradient, then the image from
its feature.

* Step 1, feature restoration (section 4.2, eqs. 3-4). The cross-entropy gradient of the last layer's weights
  for class ``k`` (a row of torch's ``(classes, features)`` weight, a column ``W[:, k]`` in the paper) is
  ``(1/N) sum_j (p_jk - [y_j = k]) r_j`` over the batch's features ``r_j``. For the sample ``i`` of label
  ``y_i``, alone of its class in the batch, the row of ``y_i`` is ``-(1 - p_i,y_i) r_i + sum_{j != i}
  p_j,y_i r_j``: with the other samples' probabilities on ``y_i`` small, the sign-flipped row is ``r_i`` up to
  a positive factor. Adversarial training keeps ``p_i,y_i`` low on the (adversarial) inputs the client trains
  on, which tightens the approximation: the paper's point. Batch 1 is exact. Two samples of one class share a
  row, their sum, read once; the slot left goes to another class, whose row is no sample's feature (the paper
  assumes distinct labels). Labels come from the view when granted, else
  by eq. 5's rule for distinct labels (:func:`distinct_labels`: the ``N`` rows of smallest entry; leaklab's
  general rule, :func:`~leaklab.attacks.inversion.labels.recover_labels`, which allows a class twice, read 58 % of
  the labels of vanilla MNIST batches of 10, where the ten classes are all present). leaklab's addition
  (:func:`nonnegative_part`): the features of a ReLU or sigmoid network are nonnegative (the premise of eq. 5), so
  a row's negative entries are the other samples' share alone, and dropping them brings the row closer to the
  sample's feature (`leaklab reproduce at-features`, batches of 10: mean cosine 0.57 -> 0.73 at eps 2).
* Step 2, image reconstruction (section 4.3, eq. 6): ``argmin_z (1 - cos(r(z), r_hat)) + lambda TV(z)`` with
  Adam from random starts, the start of lowest loss kept (the paper: lr 0.1, 5,000 steps, TV weight 1e-6 on
  its summed TV at 224 px, 5 starts). ``r(z)`` is the input of the last linear layer with the model in eval
  mode (BatchNorm on its running statistics, so that the samples stay independent). leaklab anneals the
  learning rate to 0 (cosine), which removes the grainy floor a constant rate leaves, and its TV is the mean
  absolute neighbour difference (:func:`~leaklab.attacks.inversion.priors.total_variation`), whence another
  default weight.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.attacks.inversion.config import FeatureInversionConfig
from leaklab.attacks.inversion.labels import class_rows, last_linear
from leaklab.attacks.inversion.priors import total_variation
from leaklab.device import default_device, repeatable
from leaklab.errors import LeaklabError
from leaklab.models import batchnorm_layers
from leaklab.threat import ClientUpdate, ServerView

Progress = Callable[[int, int], None]


@dataclass
class FeatureReconstruction:
    """What the two-step attack recovered from one update."""

    labels: torch.Tensor  # (N,)
    features: torch.Tensor  # (N, D) restored features (eq. 4), float64, up to a positive factor each
    targets: torch.Tensor  # (N, D) what step 2 inverted: their nonnegative parts
    images: torch.Tensor  # (N, C, H, W) in [0, 1]
    loss: torch.Tensor  # (N,) final loss of the kept start
    seconds: float


def _weight_rows(model: nn.Module, update: ClientUpdate) -> torch.Tensor:
    """The last layer's weight-gradient rows (classes, features), float64, without the bias entries."""
    _, layer = last_linear(model)
    return class_rows(model, update)[:, :layer.in_features]


def distinct_labels(model: nn.Module, update: ClientUpdate, batch_size: int) -> torch.Tensor:
    """Eq. 5's labels of a batch of distinct labels: the ``batch_size`` classes whose weight-gradient row holds the
    smallest entries (only a present class's row can go negative), sorted."""
    rows = _weight_rows(model, update)
    if not 1 <= batch_size <= len(rows):
        raise LeaklabError(f"a batch of distinct labels holds 1 to {len(rows)} images (the classes); "
                           f"this one declares {batch_size}")
    return torch.sort(torch.argsort(rows.min(1).values)[:batch_size]).values


def restore_features(model: nn.Module, update: ClientUpdate, labels: torch.Tensor) -> torch.Tensor:
    """Step 1: the restored feature of each label's sample, ``(N, D)`` float64, the sign-flipped weight row of
    its class (eq. 4)."""
    rows = _weight_rows(model, update)
    if labels.ndim != 1 or not len(labels) or labels.min() < 0 or labels.max() >= len(rows):
        raise LeaklabError(f"labels must be class indices of the last layer (0..{len(rows) - 1})")
    return -rows[labels]


def nonnegative_part(features: torch.Tensor) -> torch.Tensor:
    """Each restored feature (N, D) with its negative entries set to 0; a row with no positive entry is kept as it is
    (its label was misread: nothing of it is a sample's feature, and a zero row has no direction)."""
    kept = features.clamp_min(0)
    return torch.where((kept > 0).any(1, keepdim=True), kept, features)


def feature_map(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``r(x)``: the input of ``model``'s last linear layer for images ``x`` (N, C, H, W) in [0, 1]; ``model``
    must be in eval mode when it is called."""
    _, layer = last_linear(model)

    def features(x: torch.Tensor) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        hook = layer.register_forward_hook(lambda _m, inputs, _out: seen.append(inputs[0]))
        try:
            model(x)
        finally:
            hook.remove()
        return seen[-1].flatten(1)

    return features


def invert_features(model: nn.Module, targets: torch.Tensor, shape: tuple[int, int, int],
                    config: FeatureInversionConfig, progress: Progress | None = None) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """Step 2: images ``(N, *shape)`` whose features point along ``targets`` (N, D); returns them with each
    one's final loss. All starts of all samples are optimised together as one batch."""
    n, r = len(targets), config.restarts
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(config.seed)
    z = torch.rand((r * n, *shape), generator=generator).to(device).requires_grad_(True)
    goal = targets.float().to(device).repeat(r, 1)
    features = feature_map(model)
    optimizer = torch.optim.Adam([z], lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda t: 0.5 * (1 + math.cos(math.pi * t / config.iterations)))
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)  # the optimisation needs the images' gradient alone
    was_training = model.training
    model.eval()
    try:
        for step in range(config.iterations):
            optimizer.zero_grad()
            loss = _loss(features(z), goal, z, config.tv)
            loss.sum().backward()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                z.clamp_(0, 1)
            if progress:
                progress(step + 1, config.iterations)
        with torch.no_grad():
            final = _loss(features(z), goal, z, config.tv).view(r, n)
    finally:
        model.train(was_training)
        for p in trainable:
            p.requires_grad_(True)
    best = torch.argmin(torch.nan_to_num(final, nan=math.inf), 0)
    images = z.detach().view(r, n, *shape)[best, torch.arange(n)]
    return images.cpu(), final[best, torch.arange(n)].cpu()


def _loss(features: torch.Tensor, goal: torch.Tensor, z: torch.Tensor, tv: float) -> torch.Tensor:
    return 1 - F.cosine_similarity(features, goal, dim=1, eps=1e-12) + tv * total_variation(z)


def feature_attack(view: ServerView, update: ClientUpdate, config: FeatureInversionConfig,
                   progress: Progress | None = None, device: torch.device | None = None) -> FeatureReconstruction:
    """Seed 004's attack on one client update: labels, restored features, then the images."""
    update.validate_against(view.model)
    if update.metadata.train_mode and batchnorm_layers(view.model):
        raise LeaklabError("the update was computed with the batch's BatchNorm statistics, which the attack cannot "
                           "reproduce for one image's features; attack updates computed on the running statistics "
                           "(capture with --bn-stats running), or a network without BatchNorm")
    if view.batch_size != update.metadata.batch_size:
        raise LeaklabError(f"the view declares batch size {view.batch_size}, the update {update.metadata.batch_size}")
    start = time.perf_counter()
    model = view.model
    labels = view.labels.clone() if view.labels is not None else distinct_labels(model, update, view.batch_size)
    features = restore_features(model, update, labels)
    targets = nonnegative_part(features)
    device = device or default_device()
    with repeatable(device):
        c, s = view.spec.in_channels, view.spec.image_size
        images, loss = invert_features(model.to(device), targets, (c, s, s), config, progress)
    return FeatureReconstruction(labels=labels, features=features, targets=targets, images=images, loss=loss,
                                 seconds=time.perf_counter() - start)
