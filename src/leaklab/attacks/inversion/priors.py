"""Image priors ``-log p(x)`` up to constants (seed 001, section 4 and appendix A.4).

Each maps candidate images of shape (R, B, C, H, W), pixels in [0, 1], to one value per instance (R,):

* ``tv``: anisotropic total variation, the mean absolute difference of horizontal and vertical
  neighbours (as Geiping et al. 2020);
* ``range``: the pixel-range term ``||x - clip(x, 0, 1)||_2`` of Geng et al. (2021);
* ``l2``: the squared L2 norm of the image, ``||x||_2^2`` (GradInversion's norm prior; a Gaussian prior);
* ``l1``: the L1 norm of the image, ``||x||_1`` (a Laplacian prior centred on 0: on pixels in [0, 1] it pulls every
  pixel towards black, as ``l2`` does; seed 001's Fig. 4 ablation compares the two on zero-mean inputs).
"""

from __future__ import annotations

import torch

from leaklab.errors import LeaklabError
from leaklab.names import PRIOR_NAMES


def total_variation(x: torch.Tensor) -> torch.Tensor:
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    return dx + dy


def pixel_range(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(((x - x.clamp(0, 1)) ** 2).flatten(1).sum(1) + 1e-12)


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    return (x ** 2).flatten(1).sum(1)


def l1_norm(x: torch.Tensor) -> torch.Tensor:
    return x.abs().flatten(1).sum(1)


_PRIORS = {"tv": total_variation, "range": pixel_range, "l2": l2_norm, "l1": l1_norm}


def prior(name: str):
    """The prior function called ``name``."""
    if name not in _PRIORS:
        raise LeaklabError(f"unknown prior {name!r}; choose from {', '.join(PRIOR_NAMES)}")
    return _PRIORS[name]
