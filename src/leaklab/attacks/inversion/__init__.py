"""Gradient inversion: optimisation attacks (DLG, Inverting Gradients, the Bayes-optimal adversary of
seed 001), label recovery and exact analytic recovery of fully connected layers."""

from leaklab.attacks.inversion.analytic import linear_input, recover_input
from leaklab.attacks.inversion.attack import Reconstruction, invert
from leaklab.attacks.inversion.config import InversionConfig
from leaklab.attacks.inversion.labels import recover_labels
from leaklab.attacks.inversion.objectives import OBJECTIVE_NAMES, Objective
from leaklab.attacks.inversion.priors import PRIOR_NAMES

__all__ = ["OBJECTIVE_NAMES", "PRIOR_NAMES", "InversionConfig", "Objective", "Reconstruction",
           "invert", "linear_input", "recover_input", "recover_labels"]
