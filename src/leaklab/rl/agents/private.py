"""DP-SGD for the RL agents: per-sample clipping and Gaussian noise on the perception network through
opacus (:func:`leaklab.privacy.dpsgd.private_optimizer`), and the epsilon spent
(:func:`leaklab.privacy.dpsgd.spent_epsilon`; Abadi et al., CCS 2016).

What is protected. A record is one sample of the agent's loss: a replay transition (DQN) or one step
``(s_t, a_t, R_t)`` of an episode (REINFORCE). Neighbouring runs differ in one record replaced by a
null record that adds no gradient (the "zero-out" relation, Kairouz et al., ICML 2021, sec. 2): the
replay buffer and the episodes keep their slots, so every batch differs in at most that record, whose
clipped gradient moves the sum by at most ``clip``: the subsampled Gaussian mechanism that the
add/remove accountants bound. The agent collects its data with its noisy network, so the updates
compose adaptively. A record is not an environment step: one reward enters the return ``R_t`` of every earlier
step of its episode, and one observation is the next state of one DQN transition and the state of the next, so an
environment step's protection is group privacy over up to ``max_episode_steps`` records (REINFORCE) or two (DQN).

* DQN: every update takes a Poisson sample of the replay buffer, each stored transition independently
  with probability ``q = batch_size / buffer_size`` (expected batch ``batch_size`` once the buffer is
  full, fewer while it fills; the noise and the average use ``batch_size``, as opacus does). Ordinary
  DQN samples uniformly with replacement (Mnih et al. 2015): a transition can then occur several times
  in one batch and the Poisson accounting would not hold, hence the different sampler. All updates are
  accounted at ``q``, an upper bound: a transition stays in the buffer for ``buffer_size`` environment
  steps only. Per-sample clipping replaces DQN's ``max_grad_norm``; an empty batch takes a noise-only
  step and records a NaN loss.
* REINFORCE: the update of an episode takes its steps as the batch (``q = 1``), averaged over
  ``max_episode_steps`` (public, so the divisor does not depend on the episode's length). A step enters
  one update only and the other updates do not touch it, so by parallel composition (seed notes-002
  section 1.3) the whole run is as private as one Gaussian release: one accounted step, whatever the
  number of episodes.

What is not protected: the room. Its layout shapes every sample of its episodes; it is the private
asset of seed 000's attacks and of the DP-DRL defense of notes-002 section 4.1, which obfuscates one
observation element per step with the exponential mechanism and accounts no composition over steps
(notes-002 section 4.2, Thm 5.1). A room-level guarantee needs group privacy over all its samples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from leaklab.privacy.dpsgd import DPConfig, private_optimizer, spent_epsilon


@dataclass
class PrivateAgent:
    """The opacus-wrapped network and optimizer of a private agent, with what its epsilon depends on."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    config: DPConfig
    noise_multiplier: float
    sample_rate: float

    def step(self, loss: torch.Tensor) -> None:
        """One DP-SGD step on the mean ``loss`` of a batch (an empty batch takes a noise-only step)."""
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            # torch notes that opacus' full backward hooks fire although the inputs need no gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        self.optimizer.step()

    def finish(self, updates: int, accounted_steps: int) -> dict:
        """Remove opacus' hooks (the network keeps its weights) and report the epsilon spent by
        ``accounted_steps`` steps at the sampling rate, with the settings."""
        self.model.remove_hooks()
        c = self.config
        return {"epsilon": spent_epsilon(self.sample_rate, self.noise_multiplier, accounted_steps, c.delta,
                                         c.accountant),
                "delta": c.delta, "noise_multiplier": self.noise_multiplier, "clip": c.clip,
                "sample_rate": self.sample_rate, "steps": accounted_steps, "updates": updates,
                "accountant": c.accountant}


def make_private_agent(net: nn.Module, optimizer: torch.optim.Optimizer, privacy: DPConfig, *, sample_rate: float,
                       expected_batch_size: int, steps: int, seed: int) -> PrivateAgent:
    """Wrap an agent's network and optimizer for DP-SGD; ``steps`` accounted steps at ``sample_rate``
    calibrate the noise when ``privacy`` names a target epsilon."""
    sigma = privacy.noise_for(sample_rate, steps)
    model, dp_optimizer = private_optimizer(net, optimizer, clip=privacy.clip, noise_multiplier=sigma,
                                            expected_batch_size=expected_batch_size, seed=seed)
    return PrivateAgent(model, dp_optimizer, privacy, sigma, sample_rate)
