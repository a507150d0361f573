"""Real images available offline, resized and normalised in one place (``leaklab.data.images``)."""

from leaklab.data.images import DATASET_NAMES, ImageBatch, among, load_images

__all__ = ["DATASET_NAMES", "ImageBatch", "among", "load_images"]
