"""Differential privacy: mechanisms with their claimed (epsilon, delta) (:mod:`leaklab.privacy.mechanisms`,
seed 003's Dirichlet mechanism in :mod:`leaklab.privacy.dirichlet`, exact discrete samplers in
:mod:`leaklab.privacy.discrete`), privacy accounting of DP-SGD and of composed mechanism uses
(:mod:`leaklab.privacy.accounting`), DP-SGD for clients and central DP for federated averaging
(:mod:`leaklab.privacy.dpsgd`), and empirical audits of the claims (:mod:`leaklab.privacy.audit`)."""

from leaklab.privacy.dirichlet import DirichletMechanism
from leaklab.privacy.discrete import DiscreteGaussianMechanism, DiscreteLaplaceMechanism
from leaklab.privacy.mechanisms import ExponentialMechanism, GaussianMechanism, LaplaceMechanism, RandomizedResponse

__all__ = ["LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism", "RandomizedResponse",
           "DirichletMechanism", "DiscreteLaplaceMechanism", "DiscreteGaussianMechanism"]
