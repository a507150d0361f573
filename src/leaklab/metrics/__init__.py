"""Metrics comparing reconstructions with the truth (used only by ``leaklab.experiments``)."""

from leaklab.metrics.image import constant_baseline, match_order, psnr, rgb_to_y, scores, ssim
from leaklab.metrics.vectors import accuracy, box_iou, cosine_similarity, percent_error

__all__ = ["accuracy", "box_iou", "constant_baseline", "cosine_similarity", "match_order", "percent_error",
           "psnr", "rgb_to_y", "scores", "ssim"]
