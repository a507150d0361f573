"""leaklab's exact room attack (``mode="exact"``), one sample.

Every Linear layer with a bias gives its input exactly: ``dW = delta h^T`` and ``db = delta``, so
``h = db^T dW / ||db||^2`` (:func:`leaklab.attacks.inversion.analytic.linear_input`). That yields the
box (input of ``box.0``), the convolutional features ``f`` (first part of ``head.0``'s input) and the
last layer's input, hence ``Q̂ = W_last h + b_last`` exactly. The error at the features is known too:
``g_f = (W_head0^T db_head0)[:F]``.

The images minimise ``w_f ||conv(x) − f||^2 / ||f||^2 + λ_t TV(x)`` (TV pooled over each
modality's channels, :func:`leaklab.attacks.rl.images.modality_tv`) from IV-A's Gaussian start with
Adam and cosine annealing, pixels clamped to [0, 1]; ``λ_t`` decays geometrically from ``tv_weight``
to ``tv_final`` (a strong prior first removes the start's noise, a weak one last stops biasing the
edges). Optionally (``gradient_weight``) the error-direction surrogate of eq. 6 moves to the
convolution branch, ``J̃_conv(x) = g_f^T conv(x)``, whose gradient equals the client's convolution
gradients at the true images, and ``1 − cos(∇_conv J̃_conv(x), g_conv)`` is added. Measured on real
ViZDoom frames it stalls the descent from a noisy start (S2, 4 frames, 2,000 steps: 13.1 dB with
it, 43.3 dB without; the constant baseline is 13.7 dB),
so it is off by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leaklab.attacks.inversion.analytic import linear_input
from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.images import modality_tv, gaussian_start
from leaklab.attacks.rl.network import cosine_loss, gradient_stats, linear_names
from leaklab.attacks.rl.optim import Progress, adam
from leaklab.models.perception import PerceptionNet, conv_feature_count


@dataclass
class ExactState:
    box: torch.Tensor  # [1, 4]
    features: torch.Tensor  # [1, F]
    last_input: torch.Tensor  # [1, H]
    outputs: torch.Tensor  # [1, A] = W_last h + b_last (float64)


def exact_vectors(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> ExactState:
    """The inputs of ``box.0``, ``head.0`` and the last layer from their gradients, float64."""
    names = linear_names(net)
    h = {n: linear_input(grads[f"{n}.weight"], grads[f"{n}.bias"]).unsqueeze(0) for n in
         ("box.0", "head.0", names[-1])}
    last = dict(net.named_modules())[names[-1]]
    outputs = h[names[-1]] @ last.weight.detach().double().T + last.bias.detach().double()
    return ExactState(box=h["box.0"], features=h["head.0"][:, :conv_feature_count(net)],
                      last_input=h[names[-1]], outputs=outputs)


def feature_error(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """``dJ/df = W_head0[:, :F]^T db_head0`` ``[1, F]``: the loss gradient at the conv features."""
    w = net.head[0].weight.detach()[:, :conv_feature_count(net)]
    return (grads["head.0.bias"].to(w.dtype) @ w).unsqueeze(0)


def exact_images(net: PerceptionNet, grads: dict[str, torch.Tensor], features: torch.Tensor,
                 cfg: RoomAttackConfig, progress: Progress | None) -> torch.Tensor:
    """Images whose conv features and conv gradients match the exactly known ones."""
    spec = net.spec
    x = gaussian_start((1, spec.in_channels, spec.image_size, spec.image_size), cfg.seed)
    x = x.to(features.device).requires_grad_()
    f = features.float()
    f_norm = (f * f).sum().clamp_min(1e-30)
    g_f = feature_error(net, grads)

    def loss(done: float) -> torch.Tensor:
        out = net.conv(x)
        match = ((out - f) ** 2).sum() / f_norm
        tv_weight = cfg.tv_weight * (cfg.tv_final / cfg.tv_weight) ** done
        total = cfg.feature_weight * match + tv_weight * modality_tv(x)
        if cfg.gradient_weight:
            dot, sq, ref = gradient_stats(net, grads, (g_f * out).sum(), [], conv_params=True)
            total = total + cfg.gradient_weight * cosine_loss(dot, sq, ref)
        return total

    adam([x], loss, cfg.iterations, cfg.lr, clamp=[x], progress=progress)
    return x.detach()
