"""Reinforcement learning: environments, agents and the losses whose gradients clients share."""
