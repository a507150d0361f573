"""ATS augmentation policies: the image transformations of Automated Transformation Search (Gao et al., 2021).

ATS defends federated image training by training on heavily augmented images: each client image goes through a
chain of AutoAugment sub-policies (Cubuk et al., 2019), chosen by a search for chains that make gradient inversion
fail. Seed 001, section 5 (ATS) and appendix A.2, attacks networks trained with the policies ``"7-4-15"``,
``"21-13-3"`` and the hybrid ``"21-13-3+7-4-15"``: these strings are what :func:`parse_policy` reads. A policy
``"a-b-c"`` lists indices into :data:`ATS_TABLE`, applied in order; ``"X+Y"`` holds several chains, and each image
gets ONE of them, chosen uniformly at random.

:data:`ATS_TABLE` is the table of 50 sub-policies of ATS's code (its ``policy.py``), each a probability, an
operation and a magnitude index 0..9; the operations follow that code's ``autoaugment.py``, which applies them to
8-bit PIL images. Here they work on float tensors in [0, 1] and quantise to 8 bits only where an operation is
defined on 8-bit values (posterize, solarize, equalize).

Note on probabilities: ATS's code stores each sub-policy's probability but never uses it, so every operation of a
chosen chain is always applied. leaklab follows the code: the probabilities in :data:`ATS_TABLE` are kept for
reference only.

Before its chain each image gets, as in ATS's training code, a random crop of its own size from the image
zero-padded by 4 pixels on every side, then a horizontal flip with probability 0.5.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from leaklab.errors import LeaklabError

ATS_TABLE: tuple[tuple[float, str, int], ...] = (
    (0.1, "invert", 7), (0.2, "contrast", 6), (0.7, "rotate", 2), (0.3, "translateX", 9), (0.8, "sharpness", 1),
    (0.9, "sharpness", 3), (0.5, "shearY", 2), (0.7, "translateY", 2), (0.5, "autocontrast", 5), (0.9, "equalize", 2),
    (0.2, "shearY", 5), (0.3, "posterize", 5), (0.4, "color", 3), (0.6, "brightness", 5), (0.3, "sharpness", 9),
    (0.7, "brightness", 9), (0.6, "equalize", 5), (0.5, "equalize", 1), (0.6, "contrast", 7), (0.6, "sharpness", 5),
    (0.7, "color", 5), (0.5, "translateX", 5), (0.3, "equalize", 7), (0.4, "autocontrast", 8), (0.4, "translateY", 3),
    (0.2, "sharpness", 6), (0.9, "brightness", 6), (0.2, "color", 8), (0.5, "solarize", 0), (0.0, "invert", 0),
    (0.2, "equalize", 0), (0.6, "autocontrast", 0), (0.2, "equalize", 8), (0.6, "equalize", 4), (0.9, "color", 5),
    (0.6, "equalize", 5), (0.8, "autocontrast", 4), (0.2, "solarize", 4), (0.1, "brightness", 3), (0.7, "color", 0),
    (0.4, "solarize", 1), (0.9, "autocontrast", 0), (0.9, "translateY", 3), (0.7, "translateY", 3),
    (0.9, "autocontrast", 1), (0.8, "solarize", 1), (0.8, "equalize", 5), (0.1, "invert", 0), (0.7, "translateY", 3),
    (0.9, "autocontrast", 1),
)

_PAD = 4  # the random crop's zero padding, in pixels
_ROTATE_FILL = 128 / 255  # ATS rotates with the area outside filled grey
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, PIL's "L" conversion
_SMOOTH = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13  # PIL's ImageFilter.SMOOTH


def _lin(start: float, stop: float) -> tuple[float, ...]:
    return tuple(float(v) for v in np.linspace(start, stop, 10))


_NO_MAGNITUDE = (0.0,) * 10
_MAGNITUDES: dict[str, tuple[float, ...]] = {
    "shearX": _lin(0, 0.3), "shearY": _lin(0, 0.3),
    "translateX": _lin(0, 150 / 331), "translateY": _lin(0, 150 / 331),
    "rotate": _lin(0, 30),
    "color": _lin(0, 0.5), "contrast": _lin(0, 0.5), "sharpness": _lin(0, 0.5), "brightness": _lin(0, 0.5),
    "posterize": tuple(float(round(v)) for v in _lin(8, 4)),
    "solarize": _lin(256, 0),
    "autocontrast": _NO_MAGNITUDE, "equalize": _NO_MAGNITUDE, "invert": _NO_MAGNITUDE,
}


def parse_policy(spec: str) -> tuple[tuple[int, ...], ...]:
    """``"7-4-15"`` -> ``((7, 4, 15),)``; ``"21-13-3+7-4-15"`` -> ``((21, 13, 3), (7, 4, 15))``. Raises
    :class:`LeaklabError` (one line naming the bad part and the valid range 0..49) on anything else (empty,
    non-integers, out of range, empty chain)."""
    def bad(problem: str) -> LeaklabError:
        return LeaklabError(f"bad ATS policy {spec!r}: {problem}; a policy is sub-policy indices "
                            f"0..{len(ATS_TABLE) - 1} joined by '-', several chains joined by '+' "
                            f"(e.g. '21-13-3+7-4-15')")

    if not isinstance(spec, str):
        raise bad("it is not a string")
    if not spec.strip():
        raise bad("it is empty")
    chains = []
    for number, chain in enumerate(spec.split("+"), start=1):
        if not chain.strip():
            raise bad(f"chain {number} is empty")
        indices = []
        for part in chain.split("-"):
            if not re.fullmatch(r"\s*[0-9]+\s*", part):
                raise bad(f"{part!r} in chain {number} is not an index")
            if int(part) >= len(ATS_TABLE):
                raise bad(f"{part.strip()} in chain {number} is out of range")
            indices.append(int(part))
        chains.append(tuple(indices))
    return tuple(chains)


def augment(images: torch.Tensor, policy: tuple[tuple[int, ...], ...], generator: torch.Generator) -> torch.Tensor:
    """Each image: crop with padding 4, flip, then one chain of ``policy`` chosen uniformly, its operations applied in
    order (signs drawn from ``generator``). Returns a new float tensor of the same shape in [0, 1]; ``images``
    untouched. Every random draw comes from ``generator`` (torch), so the same generator state gives the same output.
    """
    _check_images(images)
    _check_policy(policy)
    n, _, height, width = images.shape
    longest = max(len(chain) for chain in policy)
    offsets = torch.randint(0, 2 * _PAD + 1, (n, 2), generator=generator, device=generator.device).tolist()
    flips = (torch.rand(n, generator=generator, device=generator.device) < 0.5).tolist()
    choices = torch.randint(0, len(policy), (n,), generator=generator, device=generator.device).tolist()
    signs = (torch.randint(0, 2, (n, longest), generator=generator, device=generator.device) * 2 - 1).tolist()
    padded = F.pad(images, (_PAD, _PAD, _PAD, _PAD))
    out = []
    for k in range(n):
        top, left = offsets[k]
        img = padded[k, :, top:top + height, left:left + width]
        if flips[k]:
            img = img.flip(-1)
        for index, sign in zip(policy[choices[k]], signs[k]):
            _, name, level = ATS_TABLE[index]
            img = _OPERATIONS[name](img, _MAGNITUDES[name][level], sign)
        out.append(img)
    return torch.stack(out)


def _check_images(images: torch.Tensor) -> None:
    if (not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() != 4
            or images.numel() == 0):
        raise LeaklabError("ATS augments a non-empty float tensor of images (N, C, H, W) with values in [0, 1]")
    if images.shape[1] not in (1, 3):
        raise LeaklabError(f"ATS augments greyscale or RGB images: C must be 1 or 3, not {images.shape[1]}")
    if not bool(((images >= 0) & (images <= 1)).all()):
        raise LeaklabError("ATS augments images with values in [0, 1]; scale the images (not normalised ones)")


def _check_policy(policy: tuple[tuple[int, ...], ...]) -> None:
    valid = bool(policy) and all(
        chain and all(isinstance(i, int) and 0 <= i < len(ATS_TABLE) for i in chain) for chain in policy)
    if not valid:
        raise LeaklabError(f"bad ATS policy {policy!r}: give non-empty chains of indices 0..{len(ATS_TABLE) - 1}, "
                           f"e.g. parse_policy('21-13-3+7-4-15')")


# --- the operations, on one image (C, H, W) in [0, 1] -------------------------------------------------------------

def _grey(img: torch.Tensor) -> torch.Tensor:
    """PIL's "L" conversion, (1, H, W); a 1-channel image is its own greyscale."""
    if img.shape[0] == 1:
        return img
    luma = torch.tensor(_LUMA, dtype=img.dtype, device=img.device)
    return (img * luma[:, None, None]).sum(0, keepdim=True)


def _blend(degenerate: torch.Tensor, img: torch.Tensor, factor: float) -> torch.Tensor:
    """PIL's ``Image.blend(degenerate, img, factor)`` (an ImageEnhance step), clipped to [0, 1]."""
    return (degenerate + factor * (img - degenerate)).clamp(0, 1)


def _to_8bit(img: torch.Tensor) -> torch.Tensor:
    return (img * 255).round().long()


def _affine(img: torch.Tensor, matrix: tuple[float, ...], bicubic: bool, fill: float) -> torch.Tensor:
    """PIL's ``img.transform(size, AFFINE, matrix)``: output pixel centre (x, y) reads the input at
    (a x + b y + c, d x + e y + f), in PIL's coordinates (pixel i spans [i, i + 1)); outside the input, ``fill``.
    Nearest takes the pixel containing that point; bicubic interpolates (torch's kernel, near PIL's)."""
    _, height, width = img.shape
    a, b, c, d, e, f = matrix
    centres = [torch.arange(size, dtype=torch.float64, device=img.device) + 0.5 for size in (height, width)]
    ys, xs = torch.meshgrid(*centres, indexing="ij")
    x_in, y_in = a * xs + b * ys + c, d * xs + e * ys + f
    inside = (x_in >= 0) & (x_in < width) & (y_in >= 0) & (y_in < height)
    if bicubic:
        grid = torch.stack((2 * x_in / width - 1, 2 * y_in / height - 1), dim=-1).to(img.dtype)
        sampled = F.grid_sample(img[None], grid[None], mode="bicubic", padding_mode="border",
                                align_corners=False)[0].clamp(0, 1)
    else:
        cols = x_in.floor().long().clamp(0, width - 1)
        rows = y_in.floor().long().clamp(0, height - 1)
        sampled = img[:, rows, cols]
    return torch.where(inside, sampled, torch.full_like(sampled, fill))


def _shift(img: torch.Tensor, offset: float, dim: int) -> torch.Tensor:
    """Output pixel i reads input pixel i + k along ``dim``, zero outside; k is where PIL's nearest-neighbour
    affine puts an ``offset`` of pixels: floor(offset + 0.5)."""
    k = math.floor(offset + 0.5)
    size = img.shape[dim]
    out = torch.zeros_like(img)
    if abs(k) < size:
        out.narrow(dim, max(-k, 0), size - abs(k)).copy_(img.narrow(dim, max(k, 0), size - abs(k)))
    return out


def _shear_x(img: torch.Tensor, shear: float) -> torch.Tensor:
    return _affine(img, (1, shear, 0, 0, 1, 0), bicubic=True, fill=0.0)


def _shear_y(img: torch.Tensor, shear: float) -> torch.Tensor:
    return _affine(img, (1, 0, 0, shear, 1, 0), bicubic=True, fill=0.0)


def _translate_x(img: torch.Tensor, pixels: float) -> torch.Tensor:
    """PIL's affine (1, 0, pixels, 0, 1, 0): the content moves left by ``pixels`` (right when negative)."""
    return _shift(img, pixels, dim=-1)


def _translate_y(img: torch.Tensor, pixels: float) -> torch.Tensor:
    """PIL's affine (1, 0, 0, 0, 1, pixels): the content moves up by ``pixels`` (down when negative)."""
    return _shift(img, pixels, dim=-2)


def _rotate(img: torch.Tensor, degrees: float) -> torch.Tensor:
    """PIL's ``Image.rotate(degrees)`` (counter-clockwise about the centre, nearest), the outside grey."""
    _, height, width = img.shape
    cos, sin = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    cx, cy = width / 2, height / 2
    matrix = (cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy)
    return _affine(img, matrix, bicubic=False, fill=_ROTATE_FILL)


def _color(img: torch.Tensor, factor: float) -> torch.Tensor:
    """ImageEnhance.Color: blend with the greyscale image; the identity on a 1-channel image."""
    return _blend(_grey(img), img, factor)


def _contrast(img: torch.Tensor, factor: float) -> torch.Tensor:
    """ImageEnhance.Contrast: blend with the mean of the greyscale image."""
    return _blend(_grey(img).mean(), img, factor)


def _sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    """ImageEnhance.Sharpness: blend with the image smoothed by PIL's SMOOTH kernel, border pixels unsmoothed."""
    kernel = _SMOOTH.to(img)[None, None]
    smooth = F.conv2d(img[:, None], kernel, padding=1)[:, 0]
    degenerate = img.clone()
    degenerate[:, 1:-1, 1:-1] = smooth[:, 1:-1, 1:-1]
    return _blend(degenerate, img, factor)


def _brightness(img: torch.Tensor, factor: float) -> torch.Tensor:
    """ImageEnhance.Brightness: blend with black."""
    return _blend(torch.zeros_like(img), img, factor)


def _posterize(img: torch.Tensor, bits: int) -> torch.Tensor:
    """ImageOps.posterize: keep the top ``bits`` bits of each 8-bit value."""
    mask = 256 - 2 ** (8 - bits)
    return (_to_8bit(img) & mask).to(img.dtype) / 255


def _solarize(img: torch.Tensor, threshold: float) -> torch.Tensor:
    """ImageOps.solarize: invert the pixels whose 8-bit value is at least ``threshold``."""
    return torch.where(_to_8bit(img) >= threshold, 1 - img, img)


def _autocontrast(img: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast: stretch each channel's min..max to 0..1; a constant channel is left as it is."""
    low = img.amin(dim=(1, 2), keepdim=True)
    span = img.amax(dim=(1, 2), keepdim=True) - low
    stretched = (img - low) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, stretched, img)


def _equalize(img: torch.Tensor) -> torch.Tensor:
    """ImageOps.equalize, channel by channel on the 8-bit values: PIL's lookup table from the histogram, with
    step = (pixels - count of the brightest value present) // 255; a channel with step 0 is left as it is."""
    values = _to_8bit(img)
    out = img.clone()
    for channel in range(img.shape[0]):
        hist = torch.bincount(values[channel].flatten(), minlength=256)
        step = int(hist.sum() - hist[hist > 0][-1]) // 255
        if step:
            below = torch.cumsum(hist, 0) - hist
            lut = ((step // 2 + below) // step).clamp(max=255)
            out[channel] = lut[values[channel]].to(img.dtype) / 255
    return out


def _invert(img: torch.Tensor) -> torch.Tensor:
    return 1 - img


# Each operation as ATS's code draws it: magnitude m from _MAGNITUDES, a random sign s of +1 or -1 where it has one.
_OPERATIONS: dict[str, Callable[[torch.Tensor, float, int], torch.Tensor]] = {
    "shearX": lambda img, m, s: _shear_x(img, m * s),
    "shearY": lambda img, m, s: _shear_y(img, m * s),
    "translateX": lambda img, m, s: _translate_x(img, m * img.shape[-1] * s),
    "translateY": lambda img, m, s: _translate_y(img, m * img.shape[-2] * s),
    "rotate": lambda img, m, s: _rotate(img, m),
    "color": lambda img, m, s: _color(img, 1 + m * s),
    "contrast": lambda img, m, s: _contrast(img, 1 + m * s),
    "sharpness": lambda img, m, s: _sharpness(img, 1 + m * s),
    "brightness": lambda img, m, s: _brightness(img, 1 + m * s),
    "posterize": lambda img, m, s: _posterize(img, int(m)),
    "solarize": lambda img, m, s: _solarize(img, m),
    "autocontrast": lambda img, m, s: _autocontrast(img),
    "equalize": lambda img, m, s: _equalize(img),
    "invert": lambda img, m, s: _invert(img),
}
