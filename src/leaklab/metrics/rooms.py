"""Section V metrics of seed 000 for one sample of a room attack (QGI/RGI).

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
  the REINFORCE gradient is the entropy term alone, which does not depend on the action. Q-values: percentage errors ``ε(x) = 100 |x_rec − x| / |x|`` of the
  predicted and target Q-values (QGI). Reward: absolute error (RGI; the return weighting log π).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from leaklab.metrics.image import constant_baseline, psnr, ssim
from leaklab.metrics.vectors import box_iou, percent_error


def paper_scale(images: torch.Tensor, setting: str) -> torch.Tensor:
    """Seed 000's normalisation of a reconstruction ``[1, C, H, W]`` (see the module docstring)."""
    if setting != "S1":
        return images
    peak = images[:, :3].amax().clamp_min(1e-12)
    return images / peak


def _image_scores(rec: torch.Tensor, truth: torch.Tensor, channel: str, prefix: str) -> dict[str, float]:
    base = constant_baseline(truth)
    return {f"{prefix}_psnr": float(psnr(rec, truth, channel)), f"{prefix}_ssim": float(ssim(rec, truth, channel)),
            f"{prefix}_psnr_baseline": float(psnr(base, truth, channel)),
            f"{prefix}_ssim_baseline": float(ssim(base, truth, channel))}


def _box_scores(rec: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    err = float((rec.double() - truth.double()).abs().max())
    degenerate = bool(((truth[2:] - truth[:2]) <= 0).any())
    iou = float(err <= 1e-3) if degenerate else float(box_iou(rec, truth))
    return {"box_iou": iou, "box_error": err}


def room_metrics(rec, truth: Mapping[str, torch.Tensor], setting: str, index: int = 0) -> dict[str, float]:
    """All section V metrics of sample ``index`` of a :class:`RoomReconstruction` against the truth
    tensors of :func:`leaklab.rl.cases.truth_shapes` (``images``, ``box``, ``action``, ``q_pred``,
    ``q_target``, ``reward``)."""
    i = slice(index, index + 1)
    images, target = rec.images[i].detach().float(), truth["images"][i].float()
    out: dict[str, float] = {}
    for norm, x in (("raw", images), ("paper", paper_scale(images, setting))):
        if setting == "S1":
            out.update(_image_scores(x[:, :3], target[:, :3], "y", f"rgb_{norm}"))
        out.update(_image_scores(x[:, -1:], target[:, -1:], "rgb", f"depth_{norm}"))
    out.update(_box_scores(rec.box[index], truth["box"][index]))
    out["action"] = float(int(rec.action[index]) == int(truth["action"][index]))
    if rec.q_pred is not None and "q_pred" in truth:
        out["q_pred_error"] = float(percent_error(rec.q_pred[i], truth["q_pred"][i]))
        out["q_target_error"] = float(percent_error(rec.q_target[i], truth["q_target"][i]))
    if rec.reward is not None and "reward" in truth:
        out["reward_error"] = float((rec.reward[i].double() - truth["reward"][i].double()).abs())
        # a zero return leaves no policy-gradient term: the update carries no trace of the action
        out["action_informative"] = float(float(truth["reward"][index]) != 0.0)
    if rec.action_identified is not None:
        out["action_identified"] = float(bool(rec.action_identified[index]))
    return out
