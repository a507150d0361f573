"""Defenses that transform a client update before it leaves the client."""

from leaklab.defenses.updates import (DEFENSE_NAMES, Clip, Defense, DefenseChain, DefenseOption, Gaussian,
                                      Laplace, Prune, TopK, checked_defense, parse_defense)

__all__ = ["DEFENSE_NAMES", "Clip", "Defense", "DefenseChain", "DefenseOption", "Gaussian", "Laplace", "Prune",
           "TopK", "checked_defense", "parse_defense"]
