"""Gradient inversion: optimisation attacks (DLG, Inverting Gradients, the Bayes-optimal adversary of
seed 001), label recovery, exact analytic recovery of fully connected layers and seed 004's two-step attack
(features from the last layer's batch gradient, then images from the features).

The submodules load when one of their names is first used, so that the command line reads
:class:`InversionConfig`'s defaults without loading torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from leaklab.names import OBJECTIVE_NAMES, PRIOR_NAMES

if TYPE_CHECKING:
    from leaklab.attacks.inversion.analytic import linear_input, recover_input
    from leaklab.attacks.inversion.attack import Reconstruction, invert
    from leaklab.attacks.inversion.config import FeatureInversionConfig, InversionConfig
    from leaklab.attacks.inversion.features import FeatureReconstruction, feature_attack, restore_features
    from leaklab.attacks.inversion.labels import recover_labels
    from leaklab.attacks.inversion.objectives import Objective

_MODULE_OF = {"linear_input": "analytic", "recover_input": "analytic", "Reconstruction": "attack", "invert": "attack",
              "InversionConfig": "config", "recover_labels": "labels", "FeatureInversionConfig": "config",
              "FeatureReconstruction": "features", "feature_attack": "features", "restore_features": "features",
              "Objective": "objectives"}

__all__ = ["OBJECTIVE_NAMES", "PRIOR_NAMES", "FeatureInversionConfig", "FeatureReconstruction", "InversionConfig",
           "Objective", "Reconstruction", "feature_attack", "invert", "linear_input", "recover_input", "recover_labels",
           "restore_features"]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
