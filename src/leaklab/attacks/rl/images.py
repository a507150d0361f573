"""The image prior of seed 000 IV-A: ``λ (TV(s_i) + TV(s_d))``, each image's own total variation
(leaklab's anisotropic TV, :func:`leaklab.attacks.inversion.priors.total_variation`), summed over the
batch; and the Gaussian starting images of IV-A."""

from __future__ import annotations

import torch

from leaklab.attacks.inversion.priors import total_variation


def room_tv(x: torch.Tensor) -> torch.Tensor:
    """``TV(rgb) + TV(depth)`` for S1 inputs ``[B, 4, H, W]``, ``TV(depth)`` for S2 ``[B, 1, H, W]``."""
    if x.shape[1] == 4:
        return (total_variation(x[:, :3]) + total_variation(x[:, 3:])).sum()
    return total_variation(x).sum()


def gaussian_start(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """IV-A's Gaussian initialisation, centred in the pixel range: ``clip(0.5 + 0.25 N(0, 1), 0, 1)``."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 + 0.25 * torch.randn(shape, generator=g)).clamp(0, 1)
