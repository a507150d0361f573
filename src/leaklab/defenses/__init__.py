"""Defenses that transform a client update before it leaves the client."""

from leaklab.defenses.updates import Clip, Defense, DefenseChain, Gaussian, Laplace, Prune, TopK, parse_defense

__all__ = ["Clip", "Defense", "DefenseChain", "Gaussian", "Laplace", "Prune", "TopK", "parse_defense"]
