"""The training algorithms A_H of ``leaklab reproduce rnn-membership`` (seed 003, chapter 3): the FFNN and the RNN of
nearly equal size, trained by Adam on mini-batches (Sec. 3.4.2), optionally with the l2 penalty on the node
activations or weights (Sec. 3.5.1), on disjoint batches in turn (the memorisation experiment, Fig. 3.6) or by DP-SGD
(eqs. 3.7-3.8, opacus, Fig. 3.8); and what the victim answers: its confidence vectors and their average prediction
entropy (eq. 3.3).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from leaklab import seeds
from leaklab.models.vision import MLP, RowLSTM
from leaklab.privacy.dpsgd import make_private

if TYPE_CHECKING:
    from leaklab.experiments.rnn_membership import RnnMembershipConfig

Penalised = Literal["activations", "weights"]
PENALISED: tuple[Penalised, ...] = ("activations", "weights")


def build(arch: str, data, seed: int) -> nn.Module:
    """The FFNN or the RNN, its initial weights drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch == "FFNN":
            return MLP(data.num_classes, 1, data.images.shape[-1], data.mean, data.std, width=64, depth=2)
        return RowLSTM(data.num_classes, 1, data.images.shape[-1], data.mean, data.std, hidden=64)


@contextlib.contextmanager
def hidden_activations(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The network's node activations of each forward pass inside the block, appended to the yielded list: the
    outputs of its ReLUs (the FFNN's hidden layers) and the hidden states of its LSTM at every step (the RNN's)."""
    seen: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:
        seen.append(output[0] if isinstance(module, nn.LSTM) else output)

    hooks = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, (nn.ReLU, nn.LSTM))]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _lr(arch: str, config: RnnMembershipConfig) -> float:
    return config.lr_ffnn if arch == "FFNN" else config.lr_rnn


def _epochs(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
            epochs: int, batch_size: int, order: torch.Generator, penalty: float, penalised: Penalised) -> None:
    """``epochs`` passes of mini-batches (reshuffled each by ``order``) minimising the cross-entropy plus
    ``penalty`` times a squared l2 norm (Sec. 3.5.1, whose text penalises "the node activations" and whose title
    says "weight regularization"; the thesis' FFNN framework is Keras, whose l2 regularisers these are):
    ``"activations"``, each sample's node activations (:func:`hidden_activations`), averaged over the batch;
    ``"weights"``, the network's weight matrices and LSTM weights (biases not)."""
    model.train()
    weights = [p for p in model.parameters() if p.dim() >= 2]
    watched = penalty and penalised == "activations"  # hooks only where the penalty reads them
    with hidden_activations(model) if watched else contextlib.nullcontext([]) as seen:
        for _ in range(epochs):
            for batch in torch.randperm(len(images), generator=order).split(batch_size):
                seen.clear()
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images[batch]), labels[batch])
                if watched:
                    loss = loss + penalty * sum(a.square().sum() for a in seen) / len(batch)
                elif penalty:
                    loss = loss + penalty * sum(w.square().sum() for w in weights)
                loss.backward()
                optimizer.step()


def train(arch: str, data, indices: list[int], config: RnnMembershipConfig, seed: int, snapshots: list[int],
          penalty: float = 0.0, penalised: Penalised = "activations") -> dict[int, nn.Module]:
    """A_H: Adam on mini-batches of ``indices`` (reshuffled every epoch by a generator of ``seed``), initial
    weights from ``seed``, the l2 ``penalty`` (0: none) on what ``penalised`` names; a copy of the network after
    each epoch count in ``snapshots``."""
    model = build(arch, data, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=_lr(arch, config))
    order = torch.Generator().manual_seed(seeds.stream_seed(seed, "batches"))
    kept, done = {}, 0
    for epoch in sorted(snapshots):
        _epochs(model, optimizer, data.images[indices], data.labels[indices], epoch - done, config.batch_size,
                order, penalty, penalised)
        done = epoch
        kept[epoch] = copy.deepcopy(model).eval()
    return kept


def train_in_turn(arch: str, data, chunks: list[list[int]], config: RnnMembershipConfig, seed: int,
                  after_chunk: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """The memorisation experiment's training (Fig. 3.6): one network, one Adam, trained on each disjoint chunk in
    the given order for ``config.memory_epochs`` epochs before the next; ``after_chunk(network)`` (in eval mode) after
    each chunk, if given."""
    model = build(arch, data, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=_lr(arch, config))
    order = torch.Generator().manual_seed(seeds.stream_seed(seed, "batches"))
    for chunk in chunks:
        _epochs(model, optimizer, data.images[chunk], data.labels[chunk], config.memory_epochs, config.batch_size,
                order, 0.0, "activations")
        if after_chunk is not None:
            after_chunk(model.eval())
    return model.eval()


def private_schedule(members: int, config: RnnMembershipConfig) -> tuple[float, int]:
    """DP-SGD's sampling rate and step count for a training set of ``members``: opacus' Poisson rate
    1 / ceil(members / batch_size) (:func:`~leaklab.privacy.dpsgd.make_private`) and as many steps as
    ``config.epochs[-1]`` epochs of ceil(members / batch_size) batches. The epsilon they spend depends on nothing
    else, so both networks spend the same."""
    batches = -(-members // config.batch_size)
    return 1 / batches, config.epochs[-1] * batches


def train_private(arch: str, data, indices: list[int], config: RnnMembershipConfig, seed: int,
                  noise_multiplier: float) -> nn.Module:
    """A_H under DP-SGD (eqs. 3.7-3.8) on the :func:`private_schedule`: the same network, initialisation and Adam
    (eq. 3.7 writes the SGD step; the privatised gradient feeds the victim's own optimiser instead, post-processing
    with the same guarantee, so only clipping and noise set it apart from the unprotected training), each sample's
    gradient clipped to ``config.dp_clip`` and Gaussian noise of std ``noise_multiplier * dp_clip`` added to their
    sum. The RNN's LSTM becomes opacus' DPLSTM (the same parameters, per-sample gradients)."""
    from opacus.validators import ModuleValidator

    with torch.random.fork_rng(devices=[]):  # the DPLSTM's own initialisation, overwritten by the LSTM's weights
        model = ModuleValidator.fix(build(arch, data, seed))
    loader = DataLoader(TensorDataset(data.images[indices], data.labels[indices]), batch_size=config.batch_size,
                        generator=seeds.generator(seed, seeds.DP_BATCHES))
    run = make_private(model, torch.optim.Adam(model.parameters(), lr=_lr(arch, config)), loader,
                       clip=config.dp_clip, noise_multiplier=noise_multiplier, seed=seed)
    try:
        run.train(private_schedule(len(indices), config)[1],
                  lambda net, batch: F.cross_entropy(net(batch[0]), batch[1]))
    finally:
        run.close()
    return model.eval()


@torch.no_grad()
def confidences(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The full confidence vectors the victim answers queries with (Sec. 3.3)."""
    return torch.softmax(model.eval()(images), 1)


def prediction_entropy(conf: torch.Tensor) -> float:
    """H_APE (eq. 3.3): the mean entropy of the predicted distributions."""
    return float(-(conf * conf.clamp_min(1e-30).log()).sum(1).mean())
