"""Client updates for image classification: FedSGD (one gradient) and FedAvg (several local steps).

The loss is the mean cross-entropy over the batch, as in seed 001 section 3: the client computes
``grad_theta l(h_theta(x), y)`` (FedSGD) or runs ``local_steps`` SGD steps and sends the weight delta
(FedAvg, McMahan et al. 2017). With ``privacy`` a FedAvg client trains with DP-SGD (local DP, Abadi et
al. 2016) through :func:`leaklab.privacy.dpsgd.train_private` and reports the epsilon it spent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.errors import LeaklabError
from leaklab.fl.adversarial import AdversarialConfig, adversarial_examples
from leaklab.privacy.dpsgd import DPConfig, DPSGDConfig, train_private
from leaklab.threat import ClientUpdate, UpdateMetadata


def _check_batch(images: torch.Tensor, labels: torch.Tensor) -> None:
    if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
        raise LeaklabError("a client batch is images (N, C, H, W) with N labels")
    if not 1 <= len(images) <= 256:
        raise LeaklabError(f"batch size {len(images)} is outside the supported 1..256")


def _loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``model`` on a (mini-)batch, plus the model's ``extra_loss()`` where it has one
    (:class:`~leaklab.models.vision.PrecodeMLP`); a train-mode BatchNorm that sees one value per
    channel (one image whose feature map has shrunk to 1x1, e.g. resnet18 at 8 px) is a one-line error."""
    try:
        loss = F.cross_entropy(model(images), labels)
    except ValueError as e:
        if "more than 1 value per channel" not in str(e):
            raise
        raise LeaklabError(f"a BatchNorm layer in train mode sees one value per channel ({e}); use a batch of "
                           "2 or more images, larger images, or the running statistics (--bn-stats running)") from None
    extra = getattr(model, "extra_loss", None)  # a model's own term of the training loss (PRECODE's KL)
    return loss if extra is None else loss + extra()


@contextmanager
def _client_mode(model: nn.Module, train_mode: bool) -> Iterator[None]:
    """Run the client's computation in ``train_mode`` with autograd on, then give ``model`` back as it
    came: parameters, buffers and its train/eval flag (also when the computation fails)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    was_training = model.training
    model.train(train_mode)
    try:
        with torch.enable_grad():
            yield
    finally:
        model.load_state_dict(state)
        model.train(was_training)


def _inputs(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
            adversarial: AdversarialConfig | None) -> torch.Tensor:
    """What the client trains on: its images, or their adversarial examples when it trains adversarially."""
    return images if adversarial is None else adversarial_examples(model, images, labels, adversarial)


def fedsgd_update(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                  train_mode: bool = True, adversarial: AdversarialConfig | None = None) -> ClientUpdate:
    """The gradient of the mean cross-entropy of ``model`` on the batch, per parameter.

    ``train_mode=True``: BatchNorm normalises with the batch's statistics (the client trains).
    ``train_mode=False``: BatchNorm uses the running statistics the server sent with the model (breaching's
    default when the server provides public buffers). Either way ``model`` comes back as it was
    (parameters, buffers, train/eval flag). ``adversarial``: the client trains adversarially (seed 004), the
    gradient is that of the batch's adversarial examples (:func:`~leaklab.fl.adversarial.adversarial_examples`).
    """
    _check_batch(images, labels)
    params = [p for p in model.parameters() if p.requires_grad]
    inputs = _inputs(model, images, labels, adversarial)
    with _client_mode(model, train_mode):
        grads = torch.autograd.grad(_loss(model, inputs, labels), params)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return ClientUpdate(metadata=UpdateMetadata(kind="fedsgd", batch_size=len(images), train_mode=train_mode),
                        tensors={n: g.detach().clone() for n, g in zip(names, grads)})


def fedavg_update(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, local_lr: float,
                  local_steps: int, local_batch_size: int | None = None,
                  train_mode: bool = True, privacy: DPConfig | None = None, seed: int | None = None,
                  adversarial: AdversarialConfig | None = None) -> ClientUpdate:
    """``local_steps`` SGD steps over the batch in order (mini-batches of ``local_batch_size``,
    cycling), sent as the weight delta. ``model`` itself is not modified; ``train_mode`` as in
    :func:`fedsgd_update`.

    ``privacy``: the steps are DP-SGD steps instead (:func:`leaklab.privacy.dpsgd.train_private`:
    Poisson mini-batches at rate 1 / ceil(batch / ``local_batch_size``), so of expected size at most
    ``local_batch_size``, each sample's gradient clipped,
    Gaussian noise; ``seed`` fixes the batches and the noise, None draws them from the operating system's entropy:
    clients given one seed send the same noise, which the server cancels by subtracting their updates); the
    update's ``privacy`` holds the epsilon spent on the batch. ``adversarial``: each step trains on its
    mini-batch's adversarial examples against the local model of that step (not with ``privacy``)."""
    _check_batch(images, labels)
    if privacy is not None and adversarial is not None:
        raise LeaklabError("a client trains either with DP-SGD or adversarially here, not both")
    meta = UpdateMetadata(kind="fedavg", batch_size=len(images), local_steps=local_steps,
                          local_lr=local_lr, local_batch_size=local_batch_size, train_mode=train_mode)
    if privacy is not None:
        return _private_fedavg(model, images, labels, meta, privacy, seed)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    b = meta.minibatch_size
    with _client_mode(model, train_mode):
        for step in range(local_steps):
            idx = torch.arange(step * b, step * b + b) % len(images)
            params = [p for p in model.parameters() if p.requires_grad]
            loss = _loss(model, _inputs(model, images[idx], labels[idx], adversarial), labels[idx])
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= local_lr * g
        delta = {n: (p.detach() - before[n]).clone() for n, p in model.named_parameters()
                 if p.requires_grad}
    return ClientUpdate(metadata=meta, tensors=delta)


def _private_fedavg(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, meta: UpdateMetadata,
                    privacy: DPConfig, seed: int | None) -> ClientUpdate:
    if not meta.train_mode:
        raise LeaklabError("a DP-SGD client trains in train mode; use train_mode=True with privacy")
    local = copy.deepcopy(model)
    settings = {k: getattr(privacy, k) for k in DPConfig.model_fields}  # a DPSGDConfig's training fields are the
    # update's (they clashed: a TypeError)
    report = train_private(local, images, labels, DPSGDConfig(
        **settings, batch_size=meta.minibatch_size, steps=meta.local_steps, lr=meta.local_lr, seed=seed))
    before = dict(model.named_parameters())
    delta = {n: (p.detach() - before[n].detach()).clone() for n, p in local.named_parameters() if p.requires_grad}
    return ClientUpdate(metadata=meta, tensors=delta, privacy=report)


def train_steps(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int,
                lr: float = 0.01, batch_size: int = 32, seed: int = 0,
                adversarial: AdversarialConfig | None = None,
                progress: Callable[[str, int, int], None] | None = None,
                augment: Callable[[torch.Tensor], torch.Tensor] | None = None) -> nn.Module:
    """Ordinary training of ``model`` in place (SGD with momentum 0.9) for ``steps`` mini-batches
    drawn from ``images``; used to attack a network "at train step N" (seed 001 Table 2). Its DP-SGD
    counterpart, reporting the epsilon spent, is :func:`leaklab.privacy.dpsgd.train_private`.
    ``adversarial``: Madry's adversarial training (seed 004), each mini-batch replaced by its adversarial
    examples against the model of that step. ``augment``: each mini-batch is replaced by ``augment(mini-batch)``
    (ATS, seed 001 section 5: :func:`leaklab.data.augment.augment`). ``progress(task, step, steps)`` is told of each
    step."""
    if steps <= 0:
        return model
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    task = "adversarial training" if adversarial is not None else "training"
    for step in range(steps):
        idx = torch.randint(0, len(images), (min(batch_size, len(images)),), generator=g)
        opt.zero_grad()
        batch = images[idx] if augment is None else augment(images[idx])
        _loss(model, _inputs(model, batch, labels[idx], adversarial), labels[idx]).backward()
        opt.step()
        if progress:
            progress(task, step + 1, steps)
    return model
