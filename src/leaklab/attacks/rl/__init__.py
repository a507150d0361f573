"""Gradient inversion on reinforcement learning (seed 000, "Your Room is not Private"): QGI for DQN
and RGI for REINFORCE updates of the multimodal perception network, in two modes (``exact``,
leaklab's closed-form recovery of every linear input, and ``paper``, section IV as written)."""

from leaklab.attacks.rl.attack import max_batch, qgi, rgi
from leaklab.attacks.rl.config import RoomAttackConfig, RoomReconstruction

__all__ = ["RoomAttackConfig", "RoomReconstruction", "max_batch", "qgi", "rgi"]
