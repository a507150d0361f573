"""Differential privacy: mechanisms with their claimed (epsilon, delta) and an empirical audit of
those claims. See :mod:`leaklab.privacy.mechanisms` and :mod:`leaklab.privacy.audit`."""

from leaklab.privacy.mechanisms import (DirichletMechanism, DiscreteGaussianMechanism, DiscreteLaplaceMechanism,
                                        ExponentialMechanism, GaussianMechanism, LaplaceMechanism,
                                        RandomizedResponse)

__all__ = ["LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism", "RandomizedResponse",
           "DirichletMechanism", "DiscreteLaplaceMechanism", "DiscreteGaussianMechanism"]
