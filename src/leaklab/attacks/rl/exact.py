"""leaklab's exact room attack (``mode="exact"``), one sample.

Every Linear layer with a bias gives its input exactly: ``dW = delta h^T`` and ``db = delta``, so
``h = db^T dW / ||db||^2`` (:func:`leaklab.attacks.inversion.analytic.linear_input`). That yields the
box (input of ``box.0``), the convolutional features ``f`` (first part of ``head.0``'s input) and the
last layer's input, hence ``Q̂ = W_last h + b_last`` exactly. The error at the features is known too:
``g_f = (W_head0^T db_head0)[:F]``.

The images minimise ``w_f ||conv(x) − f||^2 / ||f||^2 + w_g Σ_l ||∇_{W_l} J̃(x) − G_l||^2 / ||G_l||^2
+ λ_t TV(x)`` (TV pooled over each modality's channels, :func:`leaklab.attacks.rl.images.modality_tv`)
from IV-A's Gaussian start with Adam and cosine annealing, pixels clamped to [0, 1]; ``λ_t`` decays
geometrically from ``tv_weight`` to ``tv_final`` (a strong prior first removes the start's noise, a
weak one last stops biasing the edges). The middle term is eq. 6's error-direction surrogate moved to
the convolution branch, ``J̃(x) = g_f^T conv(x)``, whose weight gradient equals the client's at the
true images. It is matched only for the last convolution of each modality stream
(:func:`exact_streams`, weight ``gradient_weight``), where the error is known exactly (``g_f``
through the ReLU of the known features): the term is a quadratic in the stream's penultimate
activations, 9,216 more equations (``small``, RGB) beside the 7,200 features. Its weight ramps up
linearly from 0 over the run: at full weight from the noisy start it stalls short runs (smooth
synthetic rooms, 300 steps: +2.0 dB over the constant baseline, +9.7 without the term, +13.0 with
the ramp). It is used only on an untouched update (:func:`untouched`): it matches the observed
gradient entry by entry, and even Gaussian noise of σ = 1e-7 turns it against the images (S2, 4
frames: depth below the constant baseline on 3). On 8 real S1 frames, 2,000 steps, full weight
throughout: RGB +1.4 dB and depth +5.3 dB raw over the feature match alone (4 of them with the ramp:
the same within 0.2 dB). Matching earlier layers too diverges (their errors pass the ReLU masks of
the current, wrong images: RGB and depth fell below the constant baseline on 2 frames, even from a
good start).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from leaklab.attacks.inversion.analytic import linear_input, rank_one_residual
from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.images import modality_tv, gaussian_start
from leaklab.attacks.rl.network import linear_names
from leaklab.attacks.rl.optim import Progress, adam
from leaklab.models.perception import ModalityStreams, PerceptionNet, conv_feature_count


@dataclass
class ExactState:
    box: torch.Tensor  # [1, 4]
    features: torch.Tensor  # [1, F]
    last_input: torch.Tensor  # [1, H]


def exact_vectors(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> ExactState:
    """The inputs of ``box.0``, ``head.0`` and the last layer from their gradients, float64."""
    names = linear_names(net)
    h = {n: linear_input(grads[f"{n}.weight"], grads[f"{n}.bias"]).unsqueeze(0) for n in
         ("box.0", "head.0", names[-1])}
    return ExactState(box=h["box.0"], features=h["head.0"][:, :conv_feature_count(net)],
                      last_input=h[names[-1]])


def feature_error(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """``dJ/df = W_head0[:, :F]^T db_head0`` ``[1, F]``: the loss gradient at the conv features."""
    w = net.head[0].weight.detach()[:, :conv_feature_count(net)]
    return (grads["head.0.bias"].to(w.dtype) @ w).unsqueeze(0)


@dataclass
class Stream:
    """One modality stream of the image branch that ends ``Conv2d, ReLU, Flatten``: ``body`` maps
    its ``channels`` of the images to the last convolution's input; its features are
    ``features[offset:offset + size]``."""

    weight_name: str  # the last convolution's weight in the update, e.g. "conv.rgb.4.weight"
    body: nn.Module
    last: nn.Conv2d
    channels: slice
    offset: int
    size: int

    def pre_features(self, images: torch.Tensor) -> torch.Tensor:
        """The stream's flattened features before the ReLU."""
        return self.last(self.body(images[:, self.channels])).flatten(1)


def _ends_conv_relu_flatten(stream: nn.Module) -> bool:
    tail = list(stream)[-3:] if isinstance(stream, nn.Sequential) else []
    return len(tail) == 3 and all(isinstance(m, k) for m, k in zip(tail, (nn.Conv2d, nn.ReLU, nn.Flatten)))


def exact_streams(net: PerceptionNet) -> list[Stream]:
    """The image branch as :class:`Stream` s (one per modality of :class:`ModalityStreams`, or the
    single stream ``conv`` of ``--arch stacked``); empty, which turns the gradient term off, when a
    stream ends otherwise: ``deep``'s max-pooling hides which input each feature's error reaches
    (routing it by the current images' maxima, `deep` S2 on 4 frames: depth 26.0 dB with the ramped
    term, 25.3 at full weight, 31.1 without it), and a user's own branch may be anything."""
    conv = net.conv
    parts = conv.streams() if isinstance(conv, ModalityStreams) else [("", conv, slice(None))]
    if not all(_ends_conv_relu_flatten(stream) for _, stream, _ in parts):
        return []
    out, offset = [], 0
    probe = torch.zeros(1, net.spec.in_channels, net.spec.image_size, net.spec.image_size,
                        device=next(net.parameters()).device)
    for name, stream, channels in parts:
        index = len(stream) - 3
        size = stream(probe[:, channels]).shape[1]
        prefix = f"conv.{name}." if name else "conv."
        out.append(Stream(f"{prefix}{index}.weight", stream[:index], stream[index], channels, offset, size))
        offset += size
    return out


UNTOUCHED = 1e-6  # largest rank-1 residual of head.0 for an update taken as the exact gradient


def untouched(grads: dict[str, torch.Tensor]) -> bool:
    """Whether the update is one sample's exact gradient (head.0's weight gradient rank-1 to within
    :data:`UNTOUCHED`), as the last-convolution term needs: it matches the observed gradient entry
    by entry, so a defense's noise would be fitted (σ = 1e-5, 4 samples: S2 depth 8.1 dB with the
    term, 27.4 without; the baseline is 15.9)."""
    return rank_one_residual(grads["head.0.weight"], grads["head.0.bias"]) <= UNTOUCHED


def exact_images(net: PerceptionNet, grads: dict[str, torch.Tensor], features: torch.Tensor,
                 cfg: RoomAttackConfig, progress: Progress | None) -> torch.Tensor:
    """Images whose conv features and last-convolution weight gradients match the exact ones."""
    spec = net.spec
    x = gaussian_start((1, spec.in_channels, spec.image_size, spec.image_size), cfg.seed)
    x = x.to(features.device).requires_grad_()
    f = features.float()
    f_norm = (f * f).sum().clamp_min(1e-30)
    g_f = feature_error(net, grads)
    streams = exact_streams(net) if cfg.gradient_weight and untouched(grads) else []
    # the error at each last convolution's output: g_f through the ReLU of the known features
    errors = [(g_f * (f > 0))[:, s.offset:s.offset + s.size] for s in streams]

    def loss(done: float) -> torch.Tensor:
        tv_weight = cfg.tv_weight * (cfg.tv_final / cfg.tv_weight) ** done if cfg.tv_weight else 0.0
        total = tv_weight * modality_tv(x)
        ramp = cfg.gradient_weight * done  # off at the noisy start, where it stalls the descent
        if not streams:
            out = net.conv(x)
        else:
            parts = []
            for s, err in zip(streams, errors):
                z = s.pre_features(x)
                parts.append(z.relu())
                rec, = torch.autograd.grad((err * z).sum(), s.last.weight, create_graph=True)
                ref = grads[s.weight_name]
                total = total + ramp * ((rec - ref) ** 2).sum() / (ref * ref).sum().clamp_min(1e-30)
            out = torch.cat(parts, dim=1)
        return total + cfg.feature_weight * ((out - f) ** 2).sum() / f_norm

    adam([x], loss, cfg.iterations, cfg.lr, clamp=[x], progress=progress)
    return x.detach()
