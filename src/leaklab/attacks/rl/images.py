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
  :func:`modality_tv` computes it with its closed-form gradient (:class:`_PooledTV`): on one core,
  forward and backward of an S1 frame took 0.88-1.01 ms against autograd's 1.31-1.46 ms through
  :func:`colour_tv` and :func:`coupled_tv` (session 33, three alternating rounds), the difference about
  5 % of an S1 image-stage step.
* :func:`gaussian_start`: IV-A's Gaussian initialisation; :func:`start_images` a network's batch of it, the
  attacks' no-information images too.
"""

from __future__ import annotations

import torch

from leaklab.attacks.inversion.priors import total_variation
from leaklab.models.perception import PerceptionSpec

CHROMA_TV_WEIGHT = 2.0  # colour_tv's weight of the chroma's TV against the luma's
TV_EPS = 1e-12  # inside each pooled difference's square root: a flat image has a gradient
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
    pooled = lambda d: torch.sqrt((d * d).sum(1) + TV_EPS).flatten(1).mean(1)  # noqa: E731
    return (pooled(dx) + pooled(dy)).sum()


def colour_tv(rgb: torch.Tensor) -> torch.Tensor:
    """``TV(Y) + CHROMA_TV_WEIGHT * TV(Cb, Cr)`` of ``[B, 3, H, W]`` RGB images in BT.601 YCbCr, each
    a :func:`coupled_tv` (the chroma's differences pooled over Cb and Cr)."""
    ycc = torch.einsum("kc,bchw->bkhw", YCBCR.to(rgb), rgb)
    return coupled_tv(ycc[:, :1]) + CHROMA_TV_WEIGHT * coupled_tv(ycc[:, 1:])


class _PooledTV(torch.autograd.Function):
    """``sum_b sum_p w_bp (mean sqrt(sum_{k in p} dx_k^2 + eps) + mean sqrt(sum_{k in p} dy_k^2 + eps))`` of
    ``z = mix x`` (channels mixed per pixel), the channel groups ``p`` the rows of the 0/1 matrix
    ``groups``, the weights ``[B or 1, P]``; backward in closed form: each difference ``d_k`` weighted by
    ``w_bp / (n sqrt(...))``, taken back through the differences and the mix."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mix: torch.Tensor, groups: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        z = torch.einsum("kc,bchw->bkhw", mix, x)
        total = x.new_zeros(())
        scales = []
        for d in (z[..., :, 1:] - z[..., :, :-1], z[..., 1:, :] - z[..., :-1, :]):
            root = torch.einsum("pk,bkhw->bphw", groups, d * d).add_(TV_EPS).sqrt_()
            total = total + (root.flatten(2).mean(2) * weights).sum()
            scales.append(d * torch.einsum("pk,bphw->bkhw", groups,
                                           weights[:, :, None, None] / (root[0, 0].numel() * root)))
        ctx.save_for_backward(mix, *scales)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        mix, tx, ty = ctx.saved_tensors
        gz = tx.new_zeros(tx.shape[:2] + (ty.shape[-2] + 1, tx.shape[-1] + 1))
        gz[..., :, 1:] += tx
        gz[..., :, :-1] -= tx
        gz[..., 1:, :] += ty
        gz[..., :-1, :] -= ty
        return torch.einsum("kc,bkhw->bchw", mix, gz) * grad, None, None, None


def _modality_groups(channels: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mix, groups, weights)`` of :func:`modality_tv`: S1 to Y, Cb, Cr and depth pooled as Y, (Cb, Cr)
    and depth, weighed 1, :data:`CHROMA_TV_WEIGHT` and 1 (``[1, P]``); S2 depth alone."""
    if channels == 1:
        one = torch.ones(1, 1)
        return one.to(like), one.to(like), one.to(like)
    mix = torch.eye(4)
    mix[:3, :3] = YCBCR
    groups = torch.tensor([[1.0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]])
    return mix.to(like), groups.to(like), torch.tensor([[1.0, CHROMA_TV_WEIGHT, 1.0]]).to(like)


def modality_tv(x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`colour_tv` of the RGB channels plus :func:`coupled_tv` of depth for S1 ``[B, 4, H, W]``;
    of depth alone for S2 ``[B, 1, H, W]``; differentiable in ``x`` by its closed-form gradient. ``scale``
    ``[B]`` weighs each image's (a batch whose images have priors of their own, ``exact._prior``)."""
    if x.shape[1] not in (1, 4):
        raise ValueError(f"modality_tv takes S1 (4 channels) or S2 (1 channel) images, not {x.shape[1]} channels")
    mix, groups, weights = _modality_groups(x.shape[1], x)
    return _PooledTV.apply(x, mix, groups, weights if scale is None else scale.to(x)[:, None] * weights)


def gaussian_start(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """IV-A's Gaussian initialisation, centred in the pixel range: ``clip(0.5 + 0.25 N(0, 1), 0, 1)`` (the text
    gives no mean or std: these are leaklab's)."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 + 0.25 * torch.randn(shape, generator=g)).clamp(0, 1)


def start_images(spec: PerceptionSpec, batch: int, seed: int, device: torch.device) -> torch.Tensor:
    """:func:`gaussian_start` for ``batch`` states of ``spec``'s images, on ``device``: where both modes' image stages
    start, and what an attack that reconstructs no images holds."""
    return gaussian_start((batch, spec.in_channels, spec.image_size, spec.image_size), seed).to(device)
