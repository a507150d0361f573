"""Image reconstruction metrics.

Conventions: images are float tensors (N, C, H, W) with pixel values in [0, 1]; reconstructions are
clipped to [0, 1] before scoring. PSNR uses a data range of 1: ``10 log10(1 / MSE)`` per image, at most
300 dB (an exact reconstruction). SSIM is the Gaussian-window SSIM of Wang et al. (2004) (window 11,
sigma 1.5, K1 = 0.01, K2 = 0.03, data range 1) as torchmetrics computes it: the images are padded by
reflection and the SSIM map is averaged over every pixel, the 5-pixel border included (Wang's code and
scikit-image average only the interior the window fits in). The border makes the two differ: on 32-pixel
photos by up to about 0.2 for a 2-pixel shift (0.19 at most over 16 photos, a review measured), on 150-pixel
room reconstructions by 0.003-0.013 on average (measured in docs/reproductions.md); every SSIM leaklab
publishes is torchmetrics' definition, which :func:`ssim` computes to rounding (tests: within 1e-11; 3e-12 on
bright flat frames). Averaged over channels.
``channel="y"`` scores the luma Y of YCbCr (ITU-R BT.601, studio swing as MATLAB's ``rgb2ycbcr``:
``Y = (16 + 65.481 R + 128.553 G + 24.966 B) / 255``), as super-resolution and seed 000 do; single-channel
images are scored as they are.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment


def rgb_to_y(images: torch.Tensor) -> torch.Tensor:
    """Luma of RGB images in [0, 1] (BT.601 studio swing); single-channel input is returned as is."""
    if images.shape[1] == 1:
        return images
    r, g, b = images[:, 0:1], images[:, 1:2], images[:, 2:3]
    return (16.0 + 65.481 * r + 128.553 * g + 24.966 * b) / 255.0


def _prepare(recon: torch.Tensor, truth: torch.Tensor, channel: str) -> tuple[torch.Tensor, torch.Tensor]:
    if recon.ndim != 4:
        raise ValueError(f"images must be [N, C, H, W], not {tuple(recon.shape)}")
    if recon.shape != truth.shape:
        raise ValueError(f"reconstruction shape {tuple(recon.shape)} != truth shape {tuple(truth.shape)}")
    recon = recon.detach().double().clamp(0, 1)
    truth = truth.detach().double()
    if channel == "y":
        recon, truth = rgb_to_y(recon), rgb_to_y(truth)
    elif channel != "rgb":
        raise ValueError("channel must be 'rgb' or 'y'")
    return recon, truth


def psnr(recon: torch.Tensor, truth: torch.Tensor, channel: str = "rgb") -> torch.Tensor:
    """Per-image PSNR in dB, shape (N,); an exact reconstruction scores 300 dB."""
    recon, truth = _prepare(recon, truth, channel)
    mse = ((recon - truth) ** 2).flatten(1).mean(1).clamp_min(1e-30)
    return 10 * torch.log10(1.0 / mse)


SSIM_WINDOW = 11  # the Gaussian window's taps: torchmetrics' 2 int(3.5 sigma + 0.5) + 1
SSIM_SIGMA = 1.5
SSIM_C1, SSIM_C2 = 0.01 ** 2, 0.03 ** 2  # (K1 L)^2 and (K2 L)^2 at data range L = 1


def _gaussian_window(images: torch.Tensor) -> torch.Tensor:
    """Each channel of ``images`` ``[N, C, H, W]`` averaged by SSIM's Gaussian window, its border reflected:
    by two one-dimensional passes, as the window is the outer product of two (torch 2.13 convolves float64 on the CPU
    by ``aten::_slow_conv2d_forward``, its profiler shows, float32 by oneDNN: torchmetrics' SSIM with its 11 x 11
    window took 81-92 ms per 150-pixel frame, this one 3-5 ms, one core, session 66; an audit scores its frames in
    its main process, beside its attacks)."""
    half = SSIM_WINDOW // 2
    offsets = torch.arange(SSIM_WINDOW, dtype=images.dtype, device=images.device) - half
    taps = torch.exp(-(offsets / SSIM_SIGMA) ** 2 / 2)
    taps = taps / taps.sum()
    n, c, h, w = images.shape
    padded = F.pad(images, (half, half, half, half), mode="reflect").reshape(n * c, 1, h + 2 * half, w + 2 * half)
    return F.conv2d(F.conv2d(padded, taps.view(1, 1, -1, 1)), taps.view(1, 1, 1, -1)).reshape(n, c, h, w)


def ssim(recon: torch.Tensor, truth: torch.Tensor, channel: str = "rgb") -> torch.Tensor:
    """Per-image SSIM, shape (N,), torchmetrics' (module docstring): the mean of Wang et al.'s map
    ``(2 mu_r mu_t + C1)(2 cov + C2) / ((mu_r^2 + mu_t^2 + C1)(var_r + var_t + C2))``, the variances clamped at 0."""
    recon, truth = _prepare(recon, truth, channel)
    mu_r, mu_t, rr, tt, rt = _gaussian_window(
        torch.cat((recon, truth, recon * recon, truth * truth, recon * truth))).split(len(recon))
    var_r, var_t = (rr - mu_r * mu_r).clamp_min(0), (tt - mu_t * mu_t).clamp_min(0)
    maps = (((2 * mu_r * mu_t + SSIM_C1) * (2 * (rt - mu_r * mu_t) + SSIM_C2))
            / ((mu_r * mu_r + mu_t * mu_t + SSIM_C1) * (var_r + var_t + SSIM_C2)))
    return maps.flatten(1).mean(1)


def constant_baseline(truth: torch.Tensor) -> torch.Tensor:
    """The no-information reconstruction: every pixel at the true image's per-channel mean."""
    return truth.mean(dim=(2, 3), keepdim=True).expand_as(truth).clone()


def scores(recon: torch.Tensor, truth: torch.Tensor, channel: str = "rgb") -> dict[str, torch.Tensor]:
    """Per-image PSNR and SSIM of ``recon`` and, beside them, of the no-information baseline
    (:func:`baseline_scores`): ``psnr``, ``ssim``, ``psnr_baseline``, ``ssim_baseline``, each (N,)."""
    return {"psnr": psnr(recon, truth, channel), "ssim": ssim(recon, truth, channel),
            **baseline_scores(truth, channel)}


def baseline_scores(truth: torch.Tensor, channel: str = "rgb") -> dict[str, torch.Tensor]:
    """Per-image PSNR and SSIM of the no-information baseline (:func:`constant_baseline`): ``psnr_baseline``,
    ``ssim_baseline``, each (N,); one truth's, whatever reconstructions are scored against it."""
    base = constant_baseline(truth)
    return {"psnr_baseline": psnr(base, truth, channel), "ssim_baseline": ssim(base, truth, channel)}


def match_order(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Permutation ``perm`` such that ``recon[perm[i]]`` best matches ``truth[i]`` (maximum total PSNR,
    Hungarian assignment): a batch reconstruction recovers images in no particular order. A reconstruction with
    NaN pixels matches last (its score stays NaN, as a single sample's; the assignment refused the NaN cost)."""
    n = len(truth)
    if n == 1:
        return torch.zeros(1, dtype=torch.long)
    r = recon.detach().double().clamp(0, 1).flatten(1)
    t = truth.detach().double().flatten(1)
    mse = torch.cdist(t, r) ** 2 / t.shape[1]
    cost = torch.nan_to_num(-10 * torch.log10(mse.clamp_min(1e-30)), nan=-1e9)
    rows, cols = linear_sum_assignment(cost.numpy(), maximize=True)
    perm = np.empty(n, dtype=np.int64)
    perm[rows] = cols
    return torch.from_numpy(perm)
