"""Image priors and starts of the room attacks.

* :func:`room_tv`: seed 000 IV-A's ``TV(s_i) + TV(s_d)``, each image's own total variation (leaklab's
  anisotropic TV, :func:`leaklab.attacks.inversion.priors.total_variation`), summed over the batch
  (paper mode).
* :func:`modality_tv`: exact mode's prior, anisotropic total variation whose differences pool the
  channels of one modality (depth on its own; RGB as :func:`colour_tv`). On 4 real S1 frames, 1,500
  steps, the per-modality ``small`` network: depth 38.1 dB raw against 35.8 dB when RGB and depth
  share the pooled differences (RGB 22.7 dB either way).
* :func:`colour_tv`: the RGB frame's prior, the luma's TV plus :data:`CHROMA_TV_WEIGHT` times the
  chroma's (BT.601 YCbCr): colour varies more smoothly than brightness. Table I's 48 S1 frames
  (exact mode, ``small``, session 29) came back 7.84 dB over the constant baseline (Y PSNR, raw)
  against 6.77 with R, G, B pooled (SSIM 0.738 against 0.658, paper normalisation); in the probe that
  chose the weight, 6 of them gained 0.4 to 1.4 dB each at 2, less at 4; an oracle handed the first
  layer's true output and gradient gained 1.4 dB the same way, and none from a weaker pooled TV.
* :func:`gaussian_start`: IV-A's Gaussian initialisation.
"""

from __future__ import annotations

import torch

from leaklab.attacks.inversion.priors import total_variation

CHROMA_TV_WEIGHT = 2.0  # colour_tv's weight of the chroma's TV against the luma's
YCBCR = torch.tensor([[0.299, 0.587, 0.114],  # BT.601: Y, Cb, Cr from R, G, B (analog, no offsets)
                      [-0.168736, -0.331264, 0.5],
                      [0.5, -0.418688, -0.081312]])


def room_tv(x: torch.Tensor) -> torch.Tensor:
    """``TV(rgb) + TV(depth)`` for S1 inputs ``[B, 4, H, W]``, ``TV(depth)`` for S2 ``[B, 1, H, W]``."""
    if x.shape[1] == 4:
        return (total_variation(x[:, :3]) + total_variation(x[:, 3:])).sum()
    return total_variation(x).sum()


def coupled_tv(x: torch.Tensor) -> torch.Tensor:
    """``sum_b mean sqrt(sum_c dx_c^2) + mean sqrt(sum_c dy_c^2)`` of ``[B, C, H, W]`` images: the
    anisotropic TV of :func:`total_variation` with each direction's differences pooled over the
    channels (equal to it for one channel)."""
    dx = x[..., :, 1:] - x[..., :, :-1]
    dy = x[..., 1:, :] - x[..., :-1, :]
    pooled = lambda d: torch.sqrt((d * d).sum(1) + 1e-12).flatten(1).mean(1)  # noqa: E731
    return (pooled(dx) + pooled(dy)).sum()


def colour_tv(rgb: torch.Tensor) -> torch.Tensor:
    """``TV(Y) + CHROMA_TV_WEIGHT * TV(Cb, Cr)`` of ``[B, 3, H, W]`` RGB images in BT.601 YCbCr, each
    a :func:`coupled_tv` (the chroma's differences pooled over Cb and Cr)."""
    ycc = torch.einsum("kc,bchw->bkhw", YCBCR.to(rgb), rgb)
    return coupled_tv(ycc[:, :1]) + CHROMA_TV_WEIGHT * coupled_tv(ycc[:, 1:])


def modality_tv(x: torch.Tensor) -> torch.Tensor:
    """:func:`colour_tv` of the RGB channels plus :func:`coupled_tv` of depth for S1 ``[B, 4, H, W]``;
    of depth alone for S2 ``[B, 1, H, W]``."""
    if x.shape[1] == 4:
        return colour_tv(x[:, :3]) + coupled_tv(x[:, 3:])
    return coupled_tv(x)


def gaussian_start(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """IV-A's Gaussian initialisation, centred in the pixel range: ``clip(0.5 + 0.25 N(0, 1), 0, 1)``."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 + 0.25 * torch.randn(shape, generator=g)).clamp(0, 1)
