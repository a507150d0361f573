"""ATS augmentation (leaklab.data.augment): policy strings, each operation against PIL (the reference ATS's code
uses), and the random pipeline (crop, flip, one chain per image)."""

import numpy as np
import PIL.Image
import pytest
import torch
from PIL import ImageEnhance, ImageOps

from leaklab.data import augment as aug
from leaklab.errors import LeaklabError

# PIL truncates its blends to 8 bits (up to 1/255) and rounds the greyscale or smoothed image it blends with
# (a fraction of 1/255 more); leaklab stays in float.
ATOL = 1 / 255 + 1e-3
EXACT = 1e-6  # operations defined on 8-bit values, and translations by whole pixels, match PIL exactly


def _random_pair(rng: np.random.Generator, channels: int, low: int = 0, high: int = 256, size: int = 32,
                 tint: bool = False):
    """A random 8-bit image as PIL sees it and as leaklab does: (C, H, W) float in [0, 1]; ``tint`` darkens the
    green and blue channels (channel means then differ, as in a real photograph)."""
    shape = (size, size, channels) if channels == 3 else (size, size)
    arr = rng.integers(low, high, shape, dtype=np.uint8)
    if tint and channels == 3:
        arr = (arr * np.array([1.0, 0.6, 0.2])).astype(np.uint8)
    return PIL.Image.fromarray(arr), _tensor(PIL.Image.fromarray(arr))


def _smooth_pair(rng: np.random.Generator):
    """A smooth RGB image (waves), where interpolating operations can be compared pixel by pixel."""
    yy, xx = np.mgrid[0:32, 0:32]
    a = rng.normal(size=(3, 3))
    arr = np.stack([127 + 60 * np.sin(xx / 5 * a[c, 0] + yy / 4 * a[c, 1]) + 40 * np.cos(yy / 6 * a[c, 2])
                    for c in range(3)], -1)
    arr = arr.clip(0, 255).astype(np.uint8)
    return PIL.Image.fromarray(arr), _tensor(PIL.Image.fromarray(arr))


def _tensor(img: PIL.Image.Image) -> torch.Tensor:
    arr = torch.from_numpy(np.asarray(img).astype(np.float32) / 255)
    return arr[None] if arr.dim() == 2 else arr.permute(2, 0, 1)


def _fill(img: PIL.Image.Image):
    return 0 if img.mode == "L" else (0, 0, 0)


# --- parse_policy -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "expected"), [
    ("7-4-15", ((7, 4, 15),)),
    ("21-13-3", ((21, 13, 3),)),
    ("21-13-3+7-4-15", ((21, 13, 3), (7, 4, 15))),
    ("0", ((0,),)),
    ("49-0+3", ((49, 0), (3,))),
])
def test_parse_policy_reads_the_seeds_policies(spec, expected):
    assert aug.parse_policy(spec) == expected


@pytest.mark.parametrize(("spec", "named"), [
    ("", "empty"),
    ("   ", "empty"),
    ("7-4+", "chain 2 is empty"),
    ("+7-4", "chain 1 is empty"),
    ("7-x-15", "'x'"),
    ("7--15", "''"),
    ("-1", "''"),
    ("7-4-1.5", "'1.5'"),
    ("7-50-15", "50"),
    ("21-13-3+7-4-150", "150"),
])
def test_parse_policy_rejects_bad_strings(spec, named):
    with pytest.raises(LeaklabError) as info:
        aug.parse_policy(spec)
    message = str(info.value)
    assert "\n" not in message
    assert named in message
    assert "0..49" in message


def test_table_has_the_fifty_sub_policies_of_ats():
    assert len(aug.ATS_TABLE) == 50
    assert aug.ATS_TABLE[7] == (0.7, "translateY", 2)
    assert aug.ATS_TABLE[21] == (0.5, "translateX", 5)
    assert aug.ATS_TABLE[49] == (0.9, "autocontrast", 1)
    assert {name for _, name, _ in aug.ATS_TABLE} <= set(aug._OPERATIONS)


# --- each operation against PIL ----------------------------------------------------------------------------------

@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize(("name", "enhancer", "op"), [
    ("brightness", ImageEnhance.Brightness, aug._brightness),
    ("sharpness", ImageEnhance.Sharpness, aug._sharpness),
    ("color", ImageEnhance.Color, aug._color),
    ("contrast", ImageEnhance.Contrast, aug._contrast),
])
def test_enhancers_match_pil(name, enhancer, op, sign, channels):
    rng = np.random.default_rng(1)
    for level in (1, 5, 9):
        factor = 1 + aug._MAGNITUDES[name][level] * sign
        for tint in (False, True):
            pil, img = _random_pair(rng, channels, tint=tint)
            expected = _tensor(enhancer(pil).enhance(factor))
            torch.testing.assert_close(op(img, factor), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("sign", [1, -1])
def test_translate_matches_pil(sign, channels):
    rng = np.random.default_rng(2)
    offsets = [aug._MAGNITUDES["translateX"][level] * 32 for level in range(10)] + [0.5, 2.5, 31.5, 40.0]
    for offset in offsets:
        pil, img = _random_pair(rng, channels)
        pixels = offset * sign  # PIL's nearest neighbour rounds a half pixel up, -2.5 to -2
        expected_x = _tensor(pil.transform(pil.size, PIL.Image.AFFINE, (1, 0, pixels, 0, 1, 0), fillcolor=_fill(pil)))
        expected_y = _tensor(pil.transform(pil.size, PIL.Image.AFFINE, (1, 0, 0, 0, 1, pixels), fillcolor=_fill(pil)))
        torch.testing.assert_close(aug._translate_x(img, pixels), expected_x, atol=EXACT, rtol=0)
        torch.testing.assert_close(aug._translate_y(img, pixels), expected_y, atol=EXACT, rtol=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_posterize_solarize_invert_match_pil(channels):
    rng = np.random.default_rng(3)
    for level in range(10):
        pil, img = _random_pair(rng, channels)
        bits = int(aug._MAGNITUDES["posterize"][level])
        threshold = aug._MAGNITUDES["solarize"][level]
        torch.testing.assert_close(aug._posterize(img, bits), _tensor(ImageOps.posterize(pil, bits)),
                                   atol=EXACT, rtol=0)
        torch.testing.assert_close(aug._solarize(img, threshold), _tensor(ImageOps.solarize(pil, threshold)),
                                   atol=EXACT, rtol=0)
        torch.testing.assert_close(aug._invert(img), _tensor(ImageOps.invert(pil)), atol=EXACT, rtol=0)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(("low", "high", "size"), [(0, 256, 32), (60, 130, 32), (0, 256, 20), (90, 94, 25),
                                                   (0, 256, 8), (77, 78, 32)])
def test_autocontrast_and_equalize_match_pil(channels, low, high, size):
    rng = np.random.default_rng(4)
    pil, img = _random_pair(rng, channels, low, high, size)
    torch.testing.assert_close(aug._autocontrast(img), _tensor(ImageOps.autocontrast(pil)), atol=ATOL, rtol=0)
    torch.testing.assert_close(aug._equalize(img), _tensor(ImageOps.equalize(pil)), atol=EXACT, rtol=0)


def test_equalize_matches_pil_on_a_skewed_histogram():
    rng = np.random.default_rng(5)
    arr = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    arr[:20] = 17  # most pixels share one value
    pil = PIL.Image.fromarray(arr)
    torch.testing.assert_close(aug._equalize(_tensor(pil)), _tensor(ImageOps.equalize(pil)), atol=EXACT, rtol=0)


@pytest.mark.parametrize("sign", [1, -1])
def test_shear_is_close_to_pil_on_smooth_images(sign):
    rng = np.random.default_rng(6)
    for level in (2, 5, 9):
        pil, img = _smooth_pair(rng)
        shear = aug._MAGNITUDES["shearX"][level] * sign
        for matrix, op in (((1, shear, 0, 0, 1, 0), aug._shear_x), ((1, 0, 0, shear, 1, 0), aug._shear_y)):
            expected = _tensor(pil.transform(pil.size, PIL.Image.AFFINE, matrix, PIL.Image.BICUBIC,
                                             fillcolor=_fill(pil)))
            torch.testing.assert_close(op(img, shear), expected, atol=3 / 255, rtol=0)  # another bicubic kernel


def test_rotate_is_ats_rotate_with_grey_fill():
    rng = np.random.default_rng(7)
    for level in (2, 5, 9):
        pil, img = _random_pair(rng, 3)
        degrees = aug._MAGNITUDES["rotate"][level]
        turned = pil.convert("RGBA").rotate(degrees)
        expected = _tensor(PIL.Image.composite(turned, PIL.Image.new("RGBA", turned.size, (128,) * 4), turned)
                           .convert("RGB"))
        agree = ((aug._rotate(img, degrees) - expected).abs() <= ATOL).float().mean()
        assert agree > 0.99  # nearest neighbour: a rare pixel centre on a boundary may round the other way


# --- augment -----------------------------------------------------------------------------------------------------

def _batch(n: int = 8, channels: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, channels, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_augment_is_reproducible_from_the_generator():
    images = _batch()
    policy = aug.parse_policy("21-13-3+7-4-15")
    first = aug.augment(images, policy, torch.Generator().manual_seed(3))
    again = aug.augment(images, policy, torch.Generator().manual_seed(3))
    other = aug.augment(images, policy, torch.Generator().manual_seed(4))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_keeps_shape_range_and_input(channels):
    images = _batch(channels=channels)
    before = images.clone()
    everything = tuple((i,) for i in range(len(aug.ATS_TABLE))) + aug.parse_policy("21-13-3+7-4-15")
    out = aug.augment(images, everything, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == images.dtype
    assert out.min() >= 0 and out.max() <= 1
    assert torch.equal(images, before)
    assert not torch.equal(out, images)
    for spec in ("7-4-15", "21-13-3", "21-13-3+7-4-15"):
        out = aug.augment(_batch(32, channels), aug.parse_policy(spec), torch.Generator().manual_seed(1))
        assert out.shape == (32, channels, 32, 32) and out.min() >= 0 and out.max() <= 1


def test_augment_crops_padded_image_and_flips():
    images = _batch(100)
    identity = ((28,),)  # solarize with threshold 256: inverts nothing
    out = aug.augment(images, identity, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    found = set()
    for k in range(len(images)):
        crops = {(top, left): padded[k, :, top:top + 32, left:left + 32] for top in range(9) for left in range(9)}
        matches = [(top, left, flip) for (top, left), crop in crops.items() for flip in (False, True)
                   if torch.equal(out[k], crop.flip(-1) if flip else crop)]
        assert len(matches) == 1
        found.add(matches[0])
    assert {flip for _, _, flip in found} == {False, True}
    assert {top for top, _, _ in found} == {left for _, left, _ in found} == set(range(9))  # padding 4


def test_augment_picks_one_chain_per_image_uniformly():
    images = torch.full((200, 3, 32, 32), 0.2)
    policy = ((29,), (29, 29))  # invert once or twice; the centre pixel is never padding
    out = aug.augment(images, policy, torch.Generator().manual_seed(0))
    centre = out[:, :, 16, 16]
    once = torch.isclose(centre, torch.tensor(0.8)).all(1)
    twice = torch.isclose(centre, torch.tensor(0.2)).all(1)
    assert bool((once | twice).all())
    assert 70 <= int(once.sum()) <= 130


@pytest.mark.parametrize("images", [
    torch.zeros(2, 3, 8, 8, dtype=torch.uint8),
    torch.zeros(3, 8, 8),
    torch.zeros(0, 3, 8, 8),
    torch.zeros(2, 2, 8, 8),
    torch.full((2, 3, 8, 8), 1.5),
    torch.full((2, 1, 8, 8), -0.1),
    torch.full((2, 1, 8, 8), float("nan")),
])
def test_augment_rejects_bad_images(images):
    with pytest.raises(LeaklabError) as info:
        aug.augment(images, ((7,),), torch.Generator())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("policy", [(), ((),), ((7, 50),), ((-1,),), (("7",),)])
def test_augment_rejects_bad_policies(policy):
    with pytest.raises(LeaklabError, match="0..49"):
        aug.augment(_batch(2), policy, torch.Generator())
