import math

import pytest
import torch

from leaklab.metrics import (box_iou, constant_baseline, cosine_similarity, match_order,
                             percent_error, psnr, rgb_to_y, ssim)
from leaklab.metrics.vectors import finite_numbers, mean_of


def test_psnr_of_known_error():
    truth = torch.zeros(1, 1, 8, 8)
    recon = torch.full_like(truth, 0.1)
    assert math.isclose(float(psnr(recon, truth)), 20.0, rel_tol=1e-6)


def test_psnr_clips_reconstruction_to_unit_range():
    truth = torch.ones(1, 3, 8, 8)
    assert float(psnr(truth + 5, truth)) > 200


def test_y_channel_of_white_and_black():
    y = rgb_to_y(torch.stack([torch.ones(3, 2, 2), torch.zeros(3, 2, 2)]))
    assert torch.allclose(y[0], torch.full((1, 2, 2), 235 / 255), atol=1e-6)
    assert torch.allclose(y[1], torch.full((1, 2, 2), 16 / 255), atol=1e-6)


def test_ssim_is_one_for_identical_and_lower_for_noisy():
    g = torch.Generator().manual_seed(0)
    truth = torch.rand(2, 3, 32, 32, generator=g)
    assert torch.allclose(ssim(truth, truth), torch.ones(2, dtype=torch.float64))
    noisy = truth + 0.2 * torch.randn(truth.shape, generator=g)
    assert (ssim(noisy, truth) < 0.9).all()


def test_constant_baseline_is_per_channel_mean():
    truth = torch.rand(1, 3, 8, 8)
    base = constant_baseline(truth)
    assert torch.allclose(base[0, :, 0, 0], truth[0].mean(dim=(1, 2)))


def test_match_order_inverts_a_permutation():
    truth = torch.rand(4, 1, 8, 8)
    perm = torch.tensor([2, 0, 3, 1])
    recon = truth[perm]
    order = match_order(recon, truth)
    assert torch.equal(recon[order], truth)
    # a NaN reconstruction (paper mode's float32 underflow behind clip:1e-11) crashed the assignment
    recon[1] = float("nan")
    order = match_order(recon, truth)
    assert sorted(order.tolist()) == [0, 1, 2, 3] and order.tolist()[0] == 1  # it matches last, here truth 0's


def test_box_iou_and_percent_error_and_cosine():
    assert math.isclose(float(box_iou(torch.tensor([0, 0, 2, 2.]), torch.tensor([1, 1, 3, 3.]))[0]), 1 / 7)
    assert abs(float(percent_error(torch.tensor(1.01, dtype=torch.float64), torch.tensor(1.0))) - 1.0) < 1e-9
    both_zero, off_zero = percent_error(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.0]))
    assert float(both_zero) == 0.0 and math.isinf(float(off_zero))
    assert math.isclose(cosine_similarity([torch.ones(3)], [torch.ones(3)]), 1.0)


def test_mean_of_leaves_out_missing_and_non_finite_values():
    values = [1.0, None, math.inf, 3.0, math.nan]
    assert finite_numbers(values) == [1.0, 3.0]
    assert mean_of(values) == 2.0
    assert mean_of([None, math.inf]) is None


def test_an_exact_copy_of_a_dark_frame_shows_its_room():
    """The paper's normalisation scales the brightest RGB pixel to 1 (depth by the same factor): a dark frame's exact
    copy scored a few dB over the constant baseline and counted as not showing its room."""
    from leaklab.attacks.rl.config import RoomReconstruction
    from leaklab.metrics.rooms import room_metrics

    g = torch.Generator().manual_seed(0)
    images = 0.6 * torch.rand(1, 4, 150, 150, generator=g)  # S1, brightest pixel 0.6
    truth = {"images": images, "box": torch.tensor([[-0.5, -0.5, 0.5, 0.5]]), "action": torch.tensor([2]),
             "q_pred": torch.tensor([0.3]), "q_target": torch.tensor([0.5])}
    rec = RoomReconstruction(images=images.clone(), box=truth["box"].clone(), action=truth["action"].clone(),
                             iterations=0, seconds=0.0, q_pred=truth["q_pred"].clone(), q_target=torch.tensor([0.5]))
    m = room_metrics(rec, truth, "S1")
    assert m["rgb_paper_psnr"] - m["rgb_paper_psnr_baseline"] < 3  # the normalisation's error alone
    assert m["rgb_gain_max"] > 100 and m["depth_gain_max"] > 100


def test_ssim_is_torchmetrics_ssim():
    from torchmetrics.functional.image import structural_similarity_index_measure

    g = torch.Generator().manual_seed(1)
    for shape in ((2, 3, 32, 32), (1, 1, 150, 150), (3, 2, 17, 40)):
        for truth in (torch.rand(shape, generator=g, dtype=torch.float64) ** 3,  # dark, textured frames
                      0.97 + 1e-3 * torch.rand(shape, generator=g, dtype=torch.float64)):  # bright, nearly flat
            for noise in (0.0, 1e-4, 0.05, 0.5):
                recon = (truth + noise * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0, 1)
                reference = structural_similarity_index_measure(recon, truth, data_range=1.0, reduction="none")
                assert torch.allclose(ssim(recon, truth), reference, rtol=0, atol=1e-11)
    flat = torch.full((1, 1, 12, 12), 0.7, dtype=torch.float64)  # a constant image: no variance anywhere
    assert math.isclose(float(ssim(flat, flat)), 1.0, abs_tol=1e-11)
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        ssim(flat[0], flat[0])


def _room_case(images: torch.Tensor, **truth_fields):
    """A truth of one transition and its exact copy as a reconstruction (the metrics' own inputs, no attack)."""
    from leaklab.attacks.rl.config import RoomReconstruction

    truth = {"images": images, "box": torch.tensor([[-0.5, -0.5, 0.5, 0.5]]), "action": torch.tensor([2]),
             **truth_fields}
    rec = RoomReconstruction(images=images.clone(), box=truth["box"].clone(), action=truth["action"].clone(),
                             iterations=0, seconds=0.0, reward=truth.get("reward"))
    return truth, rec


def test_paper_normalisation_takes_the_rgb_peak_for_both_images():
    """S1: the reconstruction is divided by its brightest RGB pixel, depth by the same factor, whatever the depth's
    own peak (seed 000 section V); RGB is scored on its Y channel; S2's paper scores are the raw ones."""
    from leaklab.metrics.rooms import room_metrics

    g = torch.Generator().manual_seed(1)
    images = torch.cat([0.3 * torch.rand(1, 3, 40, 40, generator=g), 0.9 * torch.rand(1, 1, 40, 40, generator=g)], 1)
    truth, rec = _room_case(images)
    rec.images = (images * 0.8 + 0.05 * torch.rand(images.shape, generator=g)).clamp(0, 1)
    m = room_metrics(rec, truth, "S1")
    scaled = rec.images / rec.images[:, :3].amax()
    assert m["rgb_paper_psnr"] == pytest.approx(float(psnr(scaled[:, :3], images[:, :3], "y")))
    assert m["depth_paper_psnr"] == pytest.approx(float(psnr(scaled[:, 3:], images[:, 3:])))
    assert m["rgb_raw_psnr"] == pytest.approx(float(psnr(rec.images[:, :3], images[:, :3], "y")))
    assert m["rgb_raw_psnr"] != pytest.approx(float(psnr(rec.images[:, :3], images[:, :3], "rgb")))
    depth, rec2 = _room_case(images[:, 3:])
    rec2.images = 0.5 * images[:, 3:]  # a dark depth frame: no scaling in S2
    s2 = room_metrics(rec2, depth, "S2")
    assert s2["depth_paper_psnr"] == s2["depth_raw_psnr"] == pytest.approx(float(psnr(rec2.images, images[:, 3:])))
    assert s2["depth_paper_ssim"] == s2["depth_raw_ssim"]


def test_an_empty_true_box_is_found_within_a_thousandth_and_the_box_error_is_the_largest():
    from leaklab.metrics.rooms import room_metrics

    truth, rec = _room_case(torch.rand(1, 1, 20, 20, generator=torch.Generator().manual_seed(2)))
    truth["box"] = torch.zeros(1, 4)  # the target out of view
    for error, iou in ((5e-4, 1.0), (0.01, 0.0)):
        rec.box = torch.tensor([[error, 0.0, 0.0, 0.0]])
        assert room_metrics(rec, truth, "S2")["box_iou"] == iou
    truth["box"] = torch.tensor([[-0.5, -0.5, 0.5, 0.5]])
    rec.box = torch.tensor([[-0.5, -0.49, 0.3, 0.5]])
    assert room_metrics(rec, truth, "S2")["box_error"] == pytest.approx(0.2)


def test_rgi_counts_a_right_action_as_informative_only_where_the_return_is_not_zero():
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(1, 1, 20, 20, generator=torch.Generator().manual_seed(3))
    for reward, counted in ((0.0, 0.0), (0.5, 1.0)):
        truth, rec = _room_case(images, reward=torch.tensor([reward]))
        m = room_metrics(rec, truth, "S2")
        assert m["action"] == 1.0 and m["action_informative"] == counted == m["action_informative_correct"]
