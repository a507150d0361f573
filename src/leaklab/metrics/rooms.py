"""Section V metrics of seed 000 for one update of a room attack (QGI/RGI).

* Images: PSNR and SSIM on the Y channel (BT.601) for RGB and on the single channel for depth, each
  beside its no-information baseline (a constant image at the true mean, :func:`constant_baseline`),
  ``raw`` (the reconstruction as is) and ``paper`` normalised. Paper normalisation (section V): in S1
  the reconstructed RGB is scaled so that its brightest pixel is 1 (255) and the depth by the same
  factor. In S2 there is no RGB image and the paper states no rule; leaklab applies no scaling there,
  so S2 ``paper`` equals ``raw`` (a depth-only rescaling would need the true maximum depth).
* Box: IoU of ``(x1, y1, x2, y2)``; when the true box is degenerate (target not in view: all zeros)
  IoU is undefined and reported as 1 when the recovered box equals it to 1e-3 (under a tenth of a
  pixel at 150 px), else 0. ``box_error``
  is the largest absolute coordinate error.
* Action: 1.0 when correct. RGI: ``action_informative`` is 0 when the true return is exactly 0; then
  the REINFORCE gradient is the entropy term alone, which does not depend on the action
  (``action_informative_correct``: 1.0 when the return is not 0 and the action right, so that a
  batch's means still count samples). Q-values: percentage errors ``ε(x) = 100 |x_rec − x| / |x|`` of the
  predicted and target Q-values (QGI). Reward: absolute error (RGI; the return weighting log π).
* Batches (``B > 1``) have no order: each true sample is matched to a reconstructed one by image
  PSNR (Hungarian assignment, :func:`match_order`), and an update's metrics are the means over its
  samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean

import torch

from leaklab.metrics.image import match_order, scores
from leaklab.metrics.vectors import box_iou, percent_error


def paper_scale(images: torch.Tensor, setting: str) -> torch.Tensor:
    """Seed 000's normalisation of a reconstruction ``[1, C, H, W]`` (see the module docstring)."""
    if setting != "S1":
        return images
    peak = images[:, :3].amax().clamp_min(1e-12)
    return images / peak


def _image_scores(rec: torch.Tensor, truth: torch.Tensor, channel: str, prefix: str) -> dict[str, float]:
    return {f"{prefix}_{key}": float(value) for key, value in scores(rec, truth, channel).items()}


def _box_scores(rec: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    err = float((rec.double() - truth.double()).abs().max())
    degenerate = bool(((truth[2:] - truth[:2]) <= 0).any())
    iou = float(err <= 1e-3) if degenerate else float(box_iou(rec, truth))
    return {"box_iou": iou, "box_error": err}


def room_metrics(rec, truth: Mapping[str, torch.Tensor], setting: str) -> dict[str, float]:
    """All section V metrics of a :class:`RoomReconstruction` against the truth tensors of
    :func:`leaklab.rl.cases.truth_shapes` (``images``, ``box``, ``action``, ``q_pred``, ``q_target``,
    ``reward``); for a batch, each true sample against its matched reconstruction, then the means."""
    n = len(truth["images"])
    if n == 1:
        return _sample_metrics(rec, 0, truth, 0, setting)
    order = match_order(rec.images.detach().float(), truth["images"].float())
    per_sample = [_sample_metrics(rec, int(order[t]), truth, t, setting) for t in range(n)]
    return {key: fmean(m[key] for m in per_sample) for key in per_sample[0]}


def first_match(rec_images: torch.Tensor, truth_images: torch.Tensor) -> int:
    """The index of the reconstructed sample matched to the first true one (a batch has no order)."""
    return int(match_order(rec_images.detach().float(), truth_images.float())[0]) if len(truth_images) > 1 else 0


def matched_first(rec_images: torch.Tensor, truth_images: torch.Tensor) -> torch.Tensor:
    """The reconstructed image ``[1, C, H, W]`` (float, in [0, 1]) matched to the first true sample,
    the one a picture shows beside ``truth_images[:1]``."""
    r = first_match(rec_images, truth_images)
    return rec_images[r:r + 1].detach().float().clamp(0, 1)


def _sample_metrics(rec, r: int, truth: Mapping[str, torch.Tensor], t: int, setting: str) -> dict[str, float]:
    """The metrics of reconstructed sample ``r`` against true sample ``t``."""
    ri, ti = slice(r, r + 1), slice(t, t + 1)
    images, target = rec.images[ri].detach().float(), truth["images"][ti].float()
    out: dict[str, float] = {}
    for norm, x in (("raw", images), ("paper", paper_scale(images, setting))):
        if setting == "S1":
            out.update(_image_scores(x[:, :3], target[:, :3], "y", f"rgb_{norm}"))
        out.update(_image_scores(x[:, -1:], target[:, -1:], "rgb", f"depth_{norm}"))
    out.update(_box_scores(rec.box[r], truth["box"][t]))
    out["action"] = float(int(rec.action[r]) == int(truth["action"][t]))
    if rec.q_pred is not None and "q_pred" in truth:
        out["q_pred_error"] = float(percent_error(rec.q_pred[ri], truth["q_pred"][ti]))
        out["q_target_error"] = float(percent_error(rec.q_target[ri], truth["q_target"][ti]))
    if rec.reward is not None and "reward" in truth:
        out["reward_error"] = float((rec.reward[ri].double() - truth["reward"][ti].double()).abs())
        # a zero return leaves no policy-gradient term: the update carries no trace of the action
        out["action_informative"] = float(float(truth["reward"][t]) != 0.0)
        out["action_informative_correct"] = out["action"] * out["action_informative"]
    if rec.action_identified is not None:
        out["action_identified"] = float(bool(rec.action_identified[r]))
    return out
