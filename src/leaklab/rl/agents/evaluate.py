"""Greedy evaluation of a trained agent: the returns it collects in fixed episodes, so a caller can
show that training raised them (seed 000 section III, the task's reward is the detector's confidence)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from leaklab.models import PerceptionNet
from leaklab.models.perception import modes_kept
from leaklab.rl.agents.common import Rooms, observation_tensors


def evaluate(net: PerceptionNet, layouts: Sequence[str] | None = None, episodes: int = 4, seed: int = 0,
             max_episode_steps: int = 50) -> list[float]:
    """Undiscounted returns of ``episodes`` episodes (layouts in turn, reset seeds drawn from ``seed``)
    acting by ``argmax`` of the network's outputs (Q-values or policy logits). The same ``seed`` gives
    the same start poses, so two networks can be compared episode by episode. It acts in eval mode and gives the
    network its modes back: a user's BatchNorm statistics stay as they were (its forwards moved them before
    session 54)."""
    spec = net.spec
    rng = np.random.default_rng(seed)
    returns = []
    with (modes_kept(net), Rooms(tuple(layouts) if layouts is not None else None, spec.image_size,
                                 max_episode_steps) as rooms):
        net.eval()
        for i in range(episodes):
            env = rooms.env(rooms.layouts[i % len(rooms.layouts)])
            raw, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            total, done = 0.0, False
            while not done:
                images, box = observation_tensors(raw, spec.setting)
                with torch.no_grad():
                    action = int(net(images[None], box[None]).argmax(dim=1).item())
                raw, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    return returns
