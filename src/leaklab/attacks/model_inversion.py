"""Model inversion from a deployed classifier's confidence vectors: the attack of seed 002, chapter 6 (section 6.5,
Table 6.2's inversion error), which the One Parameter Defense is measured against.

Z. Yang, J. Zhang, E.-C. Chang and Z. Liang, "Neural Network Inversion in Adversarial Setting via Background
Knowledge Alignment", CCS 2019: the attacker queries the target with its own images (same distribution as the
training data), collects the confidence vectors, and trains an inversion network G with ``G(F(x)) ~ x``; G then
reconstructs the images behind other vectors. The thesis describes G as four transposed-convolution blocks whose
first three end in a sigmoid; Yang et al.'s network ends them in BatchNorm and Tanh and only the last in a sigmoid,
which :class:`InversionNet` follows. Its input is the whole confidence vector (Yang et al. also try truncating it).

The attacker's images are 32x32 in [0, 1] (the thesis resizes MNIST, Fashion-MNIST and CIFAR10 to 32x32); the
inversion error is the mean squared error per pixel. Training draws (initial weights, batch order) follow
:attr:`~leaklab.attacks.membership.AttackTraining.seed`; the global generator is left as it was.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from leaklab.attacks.membership import AttackTraining, check_training, checked_confidences
from leaklab.errors import LeaklabError

__all__ = ["IMAGE_SIZE", "InversionNet", "inversion_error", "train_inversion"]

IMAGE_SIZE = 32  # the side of the images the inversion network gives
_EVAL_ROWS = 1024  # rows per forward pass when measuring the error (a width-64 network holds ~0.2 MB per row)


class InversionNet(nn.Module):
    """Yang et al. (CCS 2019)'s inversion network, as seed 002 chapter 6 describes it: four transposed-convolution
    blocks from the confidence vector (k) to an image (channels, 32, 32): a k -> (8w, 4, 4) transposed conv (kernel 4,
    stride 1), then (8w -> 4w, 8x8), (4w -> 2w, 16x16) each kernel 4 stride 2 padding 1 with BatchNorm and Tanh
    after each of the first three blocks, and (2w -> channels, 32x32) with a sigmoid; ``width`` w default 64."""

    def __init__(self, num_classes: int, channels: int, width: int = 64):
        super().__init__()
        for name, value in (("num_classes", num_classes), ("channels", channels), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LeaklabError(f"the inversion network's {name} must be a whole number >= 1 (got {value!r})")
        self.num_classes, self.channels, self.width = num_classes, channels, width
        self.blocks = nn.Sequential(
            _block(num_classes, 8 * width, stride=1, padding=0),  # 1x1 -> 4x4
            _block(8 * width, 4 * width),  # 8x8
            _block(4 * width, 2 * width),  # 16x16
            nn.Sequential(nn.ConvTranspose2d(2 * width, channels, 4, stride=2, padding=1), nn.Sigmoid()),  # 32x32
        )

    def forward(self, confidences: torch.Tensor) -> torch.Tensor:
        """Images (N, channels, 32, 32) in [0, 1] from confidence vectors (N, num_classes)."""
        return self.blocks(confidences[:, :, None, None])


def _block(fan_in: int, fan_out: int, stride: int = 2, padding: int = 1) -> nn.Sequential:
    """A transposed convolution (kernel 4) followed by BatchNorm and Tanh."""
    return nn.Sequential(nn.ConvTranspose2d(fan_in, fan_out, 4, stride=stride, padding=padding),
                         nn.BatchNorm2d(fan_out), nn.Tanh())


def train_inversion(confidences: torch.Tensor, images: torch.Tensor, training: AttackTraining = AttackTraining(),
                    width: int = 64) -> InversionNet:
    """The attacker's inversion network trained on its own data: its queries' confidence vectors (N, k) and the
    images (N, C, 32, 32) in [0, 1]; MSE loss, Adam(lr, betas (0.5, 0.999)); returns the network in eval mode."""
    check_training(training)
    confidences = checked_confidences(confidences, "confidences")
    images = _checked_images(images, len(confidences)).to(confidences.device)
    net = training.network(lambda: InversionNet(confidences.shape[1], images.shape[1], width))
    net.to(confidences.device).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=training.lr, betas=(0.5, 0.999))
    for batch in training.batches(len(confidences), confidences.device):
        loss = F.mse_loss(net(confidences[batch]), images[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return net.eval()


@torch.no_grad()
def inversion_error(net: nn.Module, confidences: torch.Tensor, images: torch.Tensor) -> float:
    """Mean squared error between net(confidences) and the images (per pixel, pixels in [0, 1]). ``net`` runs in
    eval mode (BatchNorm on its running statistics); its modes are given back afterwards."""
    if not isinstance(net, nn.Module):
        raise LeaklabError(f"net must be a torch module (an InversionNet); got {type(net).__name__}")
    confidences = checked_confidences(confidences, "confidences")
    images = _checked_images(images, len(confidences))
    if isinstance(net, InversionNet) and (net.num_classes, net.channels) != (confidences.shape[1], images.shape[1]):
        raise LeaklabError(f"the inversion network maps {net.num_classes} classes to {net.channels}-channel images; "
                           f"got {confidences.shape[1]} classes and {images.shape[1]}-channel images")
    parameter = next(net.parameters(), None)
    device = parameter.device if parameter is not None else confidences.device
    modes = [(m, m.training) for m in net.modules()]
    net.eval()
    try:
        squared = 0.0
        for rows, truth in zip(confidences.split(_EVAL_ROWS), images.split(_EVAL_ROWS)):
            out = net(rows.to(device))
            if out.shape != truth.shape:
                raise LeaklabError(f"the inversion network gave images of shape {tuple(out.shape)} for "
                                   f"{tuple(truth.shape)}")
            squared += (out.float() - truth.to(device)).square().sum().item()
    finally:
        for m, training in modes:
            m.training = training
    return squared / images.numel()


def _checked_images(value: object, rows: int) -> torch.Tensor:
    """``value`` checked as the images behind ``rows`` confidence vectors: a float tensor (rows, C, 32, 32), finite,
    in [0, 1]; detached, in float32."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        what = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise LeaklabError(f"images must be a float tensor (N, C, {IMAGE_SIZE}, {IMAGE_SIZE}) in [0, 1]; got {what}")
    if value.ndim != 4 or value.shape[0] != rows or value.shape[1] < 1 or \
            value.shape[2:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise LeaklabError(f"images must have shape ({rows}, C, {IMAGE_SIZE}, {IMAGE_SIZE}), one per confidence "
                           f"vector, C >= 1; got {tuple(value.shape)}")
    value = value.detach().float()
    if not torch.isfinite(value).all():
        raise LeaklabError("images hold NaN or infinite values; pixels must lie in [0, 1]")
    if value.min() < 0 or value.max() > 1:
        raise LeaklabError(f"image pixels must lie in [0, 1]; got values from {value.min().item():.4g} to "
                           f"{value.max().item():.4g} (scale them: 8-bit images divided by 255)")
    return value
