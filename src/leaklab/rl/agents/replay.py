"""Experience replay for DQN (seed 000 section III: "transitions (s_t, a_t, s_{t+1}, r_t) from the
replay buffer"; Mnih et al. 2015).

Images are stored as 8-bit levels (``round(255 x)``), as DQN stores its frames, so a buffer of
thousands of 150x150 observations fits in memory; boxes, rewards and flags stay exact. Sampling uses
the run's ``numpy`` Generator: uniform with replacement, or Poisson for DP-SGD
(:mod:`leaklab.rl.agents.private`).
"""

from __future__ import annotations

import numpy as np
import torch


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions ``(images, box, action, reward, next_images,
    next_box, done)``; ``done`` is 1 when the episode terminated (no bootstrap), 0 otherwise."""

    def __init__(self, capacity: int, image_shape: tuple[int, ...], box_dim: int):
        self.capacity = capacity
        self.images = np.zeros((capacity, *image_shape), dtype=np.uint8)
        self.next_images = np.zeros((capacity, *image_shape), dtype=np.uint8)
        self.box = np.zeros((capacity, box_dim), dtype=np.float32)
        self.next_box = np.zeros((capacity, box_dim), dtype=np.float32)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.done = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._next = 0

    def __len__(self) -> int:
        return self.size

    @staticmethod
    def _levels(images: torch.Tensor) -> np.ndarray:
        return np.rint(images.clamp(0, 1).numpy() * 255).astype(np.uint8)

    def add(self, images: torch.Tensor, box: torch.Tensor, action: int, reward: float,
            next_images: torch.Tensor, next_box: torch.Tensor, done: bool) -> None:
        i = self._next
        self.images[i], self.next_images[i] = self._levels(images), self._levels(next_images)
        self.box[i], self.next_box[i] = box.numpy(), next_box.numpy()
        self.action[i], self.reward[i], self.done[i] = action, reward, float(done)
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement."""
        return self._take(rng.integers(self.size, size=batch_size))

    def sample_poisson(self, q: float, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """Every stored transition independently with probability ``q`` (Poisson sampling, as DP-SGD's
        accounting needs); the batch may be empty."""
        return self._take(np.flatnonzero(rng.random(self.size) < q))

    def _take(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        def images(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a[idx].astype(np.float32) / 255.0)

        return {"images": images(self.images), "box": torch.from_numpy(self.box[idx]),
                "action": torch.from_numpy(self.action[idx]), "reward": torch.from_numpy(self.reward[idx]),
                "next_images": images(self.next_images), "next_box": torch.from_numpy(self.next_box[idx]),
                "done": torch.from_numpy(self.done[idx])}
