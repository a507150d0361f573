"""The server's replay of a client update from candidate images (the forward model of inversion).

An attack optimises ``R`` independent instances at once (restarts, or the MC points of seed 001
Algorithm 1); each instance is a candidate batch ``X[r]`` of shape (B, C, H, W). A simulator returns,
for every parameter, the stacked per-instance update of shape (R, *param.shape), differentiable in
``X`` (second-order autograd):

* FedSGD: ``grad_theta CE(h_theta(X[r]), y)``;
* FedAvg: the weight delta of ``local_steps`` SGD steps on ``X[r]`` in order, unrolled (Geiping et al.
  2020, section 5), differentiable through every step.

BatchNorm layers compute batch statistics in train mode and use the running statistics the server sent in
eval mode (``--bn-stats running``); they never change the running statistics.

:func:`make_simulator` is the one place that chooses how: the instance-batched
:class:`~leaklab.attacks.inversion.grouped.GroupedSimulator` (one pass for all instances, fast
double backward) for FedSGD on the models it supports, else :class:`UpdateSimulator`, which loops
over instances with stock autograd and handles everything (FedAvg unrolling, any module).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, replace_all_batch_norm_modules_

from leaklab.attacks.inversion.grouped import GroupedSimulator, supports
from leaklab.threat import UpdateMetadata


def attack_copy(model: nn.Module, train_mode: bool) -> nn.Module:
    """A copy of ``model`` for replaying updates: BatchNorm uses batch statistics in train mode and
    keeps no running statistics, so replaying never changes the server's model."""
    replica = copy.deepcopy(model)
    replica.train(train_mode)
    if train_mode:
        replace_all_batch_norm_modules_(replica)
    for p in replica.parameters():
        p.requires_grad_(False)
    return replica


class UpdateSimulator:
    """Replays the update a client would send for candidate images, one instance at a time.

    ``precision="bf16"`` runs the network under bfloat16 autocast (AMX/tensor cores); updates are
    returned in float32.
    """

    def __init__(self, model: nn.Module, metadata: UpdateMetadata, precision: str = "fp32"):
        self.metadata = metadata
        self.model = attack_copy(model, metadata.train_mode)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = {n: p.detach() for n, p in self.model.named_parameters()}
        self.buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        self.precision = precision

    def _autocast(self, device: torch.device):
        if self.precision == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _loss(self, params: dict[str, torch.Tensor], images: torch.Tensor,
              labels: torch.Tensor) -> torch.Tensor:
        with self._autocast(images.device):
            logits = functional_call(self.model, (params, self.buffers), (images,))
        loss = F.cross_entropy(logits.float(), labels)
        extra = getattr(self.model, "extra_loss", None)  # the client's loss has it too (leaklab.fl.client)
        return loss if extra is None else loss + extra()

    def _gradient(self, params: dict[str, torch.Tensor], images: torch.Tensor,
                  labels: torch.Tensor) -> list[torch.Tensor]:
        leaves = {n: params[n] if params[n].requires_grad else params[n].detach().requires_grad_()
                  for n in self.names}
        merged = {**params, **leaves}
        loss = self._loss(merged, images, labels)
        return list(torch.autograd.grad(loss, [leaves[n] for n in self.names], create_graph=True))

    def instance(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """The simulated update for one candidate batch, in parameter order."""
        meta = self.metadata
        if meta.kind == "fedsgd":
            return self._gradient(self.params, images, labels)
        params = dict(self.params)
        b = meta.minibatch_size
        for step in range(meta.local_steps):
            idx = torch.arange(step * b, step * b + b, device=images.device) % len(images)
            grads = self._gradient(params, images[idx], labels[idx])
            for n, g in zip(self.names, grads):
                params[n] = params[n] - meta.local_lr * g
        return [params[n] - self.params[n] for n in self.names]

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Stacked per-instance updates for ``images`` (R, B, C, H, W) and ``labels`` (R, B)."""
        per_instance = [self.instance(x, y) for x, y in zip(images, labels)]
        return [torch.stack(parts) for parts in zip(*per_instance)]


def make_simulator(model: nn.Module, metadata: UpdateMetadata,
                   precision: str = "fp32") -> GroupedSimulator | UpdateSimulator:
    """The simulator an attack should use: grouped when it supports ``model`` and ``metadata``
    (FedSGD on LeNet, ConvNet, ResNet-18, MLP, ConvBig), else the per-instance loop. Both return the same
    updates (to float rounding); take the attack's gradient with ``torch.autograd.grad(loss, x)``."""
    if supports(model, metadata):
        return GroupedSimulator(model, metadata, precision)
    return UpdateSimulator(model, metadata, precision)
