"""Section V metrics of seed 000 for one update of a room attack (QGI/RGI).

* Images: PSNR and SSIM on the Y channel (BT.601) for RGB and on the single channel for depth, each
  beside its no-information baseline (a constant image at the true mean, :func:`constant_baseline`),
  ``raw`` (the reconstruction as is) and ``paper`` normalised. Paper normalisation (section V): in S1
  the reconstructed RGB is scaled so that its brightest pixel is 1 (255) and the depth by the same
  factor. In S2 there is no RGB image and the paper states no rule; leaklab applies no scaling there,
  so S2 ``paper`` equals ``raw`` (a depth-only rescaling would need the true maximum depth).
  An image whose truth is constant in each channel scores none (NaN): its baseline is the truth itself.
* Box: IoU of ``(x1, y1, x2, y2)``; when the true box is degenerate (target not in view: all zeros)
  IoU is undefined and reported as 1 when the recovered box equals it to 1e-3 (under a tenth of a
  pixel at 150 px), else 0; a sample the attack did not read (``RoomReconstruction.read``), whose zero box
  is its no-information start, scores 0. ``box_error`` is the largest absolute coordinate error.
* Action: 1.0 when correct. RGI: ``action_informative`` is 0 when the true return is exactly 0; then
  the REINFORCE gradient is the entropy term alone, which does not depend on the action
  (``action_informative_correct``: 1.0 when the return is not 0 and the action right, so that a
  batch's means still count samples). Q-values: percentage errors ``ε(x) = 100 |x_rec − x| / |x|`` of the
  predicted and target Q-values (QGI). Reward: absolute error (RGI; the return weighting log π). A sample the
  attack did not read scores neither (NaN): its zero Q-values or reward are no reading.
* Batches (``B > 1``) have no order: each true sample is matched to a reconstructed one by image
  PSNR (Hungarian assignment, :func:`match_order`), and an update's metrics are the means over its
  samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from leaklab.metrics.image import baseline_scores, match_order, psnr, ssim
from leaklab.metrics.vectors import box_iou, mean_of, percent_error


def paper_scale(images: torch.Tensor, setting: str) -> torch.Tensor:
    """Seed 000's normalisation of a reconstruction ``[1, C, H, W]`` (see the module docstring)."""
    if setting != "S1":
        return images
    peak = images[:, :3].amax().clamp_min(1e-12)
    return images / peak


SCORES = ("psnr", "ssim", "psnr_baseline", "ssim_baseline")  # an image's scores under each normalisation


def _image_scores(normalised: Mapping[str, torch.Tensor], truth: torch.Tensor, part: slice, channel: str
                  ) -> dict[str, dict[str, float]]:
    """For each normalisation's reconstruction ``[1, C, H, W]``, the :data:`SCORES` of its channels ``part`` against
    the truth's: PSNR and SSIM beside the baseline's. The baseline does not depend on the normalisation and is scored
    once, and a normalisation that leaves the reconstruction as it is (S2's paper) takes the raw one's scores: the
    default audit scored 360 SSIMs of 150-pixel frames in its main process, beside the attacks, 120 of them
    repeats. None (NaN, left out of every mean) where each channel of the true image is constant: the constant
    baseline (each channel's mean) is then the truth itself, whose 300 dB (a wall filling the depth frame, 1
    transition of 68) swamped a cell's baseline mean and sank its batch's gain, so that its partner's room never
    showed."""
    truth = truth[:, part]
    channels = truth.flatten(2)
    if bool((channels.amax(-1) == channels.amin(-1)).all()):
        return {norm: dict.fromkeys(SCORES, math.nan) for norm in normalised}
    baseline = {key: float(value) for key, value in baseline_scores(truth, channel).items()}
    scored: dict[int, dict[str, float]] = {}  # by the normalised image's identity
    for x in normalised.values():
        if id(x) not in scored:
            rec = x[:, part]
            scored[id(x)] = {"psnr": float(psnr(rec, truth, channel)), "ssim": float(ssim(rec, truth, channel)),
                             **baseline}
    return {norm: dict(scored[id(x)]) for norm, x in normalised.items()}


def _box_scores(rec: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    err = float((rec.double() - truth.double()).abs().max())
    degenerate = bool(((truth[2:] - truth[:2]) <= 0).any())
    iou = float(err <= 1e-3) if degenerate else float(box_iou(rec, truth))
    return {"box_iou": iou, "box_error": err}


UNDEFINED_ERRORS = ("q_pred_error", "q_target_error", "reward_error")  # none where the attack read nothing


def room_metrics(rec, truth: Mapping[str, torch.Tensor], setting: str) -> dict[str, float]:
    """All section V metrics of a :class:`RoomReconstruction` against the truth tensors of
    :func:`leaklab.rl.cases.truth_shapes` (``images``, ``box``, ``action``, ``q_pred``, ``q_target``,
    ``reward``); for a batch, the means of :func:`transition_metrics` over their finite values (a transition
    whose true Q-value is 0 has no % error; it does not erase the other's), with ``box_iou_min``, the least
    box IoU of the update's transitions, ``q_pred_error_undefined`` and ``q_target_error_undefined`` (QGI) or
    ``reward_error_undefined`` (RGI), how many have no such error (a sample the attack did not read, or a true
    Q-value of 0: no % error), ``rgb_gain_max`` / ``depth_gain_max``, the largest of the transitions' image gains
    over their constant baselines (:func:`image_gain`: whether an update shows its room; a mean over a batch hid
    one image read well beside its unread mate), and where some true image is constant ``rgb_unscored`` /
    ``depth_unscored``, how many have no image scores (a summary weighs a row's means by the transitions they
    cover: :func:`scored_transitions`)."""
    per_transition = [metrics for _, metrics in transition_metrics(rec, truth, setting)]
    out = {key: _batch_mean([m[key] for m in per_transition]) for key in per_transition[0]}
    out["box_iou_min"] = min(m["box_iou"] for m in per_transition)
    for metric in UNDEFINED_ERRORS:
        if metric in out:
            out[f"{metric}_undefined"] = float(sum(not math.isfinite(m[metric]) for m in per_transition))
    for image in ("rgb", "depth"):
        unscored = sum(not math.isfinite(m.get(f"{image}_paper_psnr", 0.0)) for m in per_transition)
        if unscored:
            out[f"{image}_unscored"] = float(unscored)
        gains = [image_gain(m, image) for m in per_transition if f"{image}_paper_psnr" in m]
        if any(math.isfinite(g) for g in gains):
            out[f"{image}_gain_max"] = max(g for g in gains if math.isfinite(g))
    return out


def image_gain(metrics: Mapping[str, float], image: str) -> float:
    """One transition's ``image`` (``rgb``, ``depth``) gain over its constant baseline (dB), the larger of its raw
    and its paper-normalised score's: the raw one compares like with like with the (un-normalised) baseline, and the
    paper's normalisation (brightest RGB pixel to 1) turns a dark frame's exact copy into an error (+1.8 dB against
    300 raw, on a room whose brightest pixel is 0.67); it forgives a reconstruction's overall brightness, which a
    reader of the picture forgives too. Paper normalisation alone decided until session 53."""
    return max(metrics[f"{image}_{norm}_psnr"] - metrics[f"{image}_{norm}_psnr_baseline"] for norm in ("raw", "paper"))


def scored_transitions(metrics: Mapping[str, float], metric: str, batch: int) -> float:
    """How many of a row's ``batch`` transitions its mean of ``metric`` covers (:func:`room_metrics`): all but
    those without that error (the Q errors and the reward's) or without image scores (``rgb_…``, ``depth_…``)."""
    if metric in UNDEFINED_ERRORS:
        return batch - metrics.get(f"{metric}_undefined", 0.0)
    image = metric.split("_")[0]
    return batch - metrics.get(f"{image}_unscored", 0.0) if image in ("rgb", "depth") else batch


def _batch_mean(values: list[float]) -> float:
    """The mean of the finite ``values``; where none is finite, the first value (infinite or NaN)."""
    mean = mean_of(values)
    return values[0] if mean is None else mean


def transition_metrics(rec, truth: Mapping[str, torch.Tensor], setting: str) -> list[tuple[int, dict[str, float]]]:
    """For each true transition, in the truth's order: the index of the reconstruction matched to it
    (:func:`matched`) and its metrics against it."""
    order = matched(rec.images, truth["images"])
    return [(r, _sample_metrics(rec, r, truth, t, setting)) for t, r in enumerate(order)]


def matched(rec_images: torch.Tensor, truth_images: torch.Tensor) -> list[int]:
    """For each true transition, in order, the index of the reconstruction matched to it (a batch has
    no order: :func:`leaklab.metrics.match_order`)."""
    if len(truth_images) == 1:
        return [0]
    return [int(r) for r in match_order(rec_images.detach().float(), truth_images.float())]


def _sample_metrics(rec, r: int, truth: Mapping[str, torch.Tensor], t: int, setting: str) -> dict[str, float]:
    """The metrics of reconstructed sample ``r`` against true sample ``t``."""
    ri, ti = slice(r, r + 1), slice(t, t + 1)
    images, target = rec.images[ri].detach().float(), truth["images"][ti].float()
    normalised = {"raw": images, "paper": paper_scale(images, setting)}
    parts = {"rgb": (slice(0, 3), "y")} if setting == "S1" else {}
    parts["depth"] = (slice(-1, None), "rgb")
    scored = {image: _image_scores(normalised, target, part, channel) for image, (part, channel) in parts.items()}
    out = {f"{image}_{norm}_{key}": value for norm in normalised for image in scored
           for key, value in scored[image][norm].items()}
    out.update(_box_scores(rec.box[r], truth["box"][t]))
    unread = getattr(rec, "read", None) is not None and not bool(rec.read[r])  # RoomReconstruction.read
    if unread:
        out["box_iou"] = 0.0  # the no-information start's zero box is no box read
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
    if unread:  # its zero Q-values or reward are no reading: against a true 0 they scored an error of 0, a leak
        out.update({key: math.nan for key in UNDEFINED_ERRORS if key in out})
    return out
