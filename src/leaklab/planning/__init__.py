"""Planning on tabular MDPs with private transition probabilities.

* :mod:`leaklab.planning.mdp`: MDPs (seed 003, Sec. 2.3), their optimal policies and exact evaluation, and the
  chapter's two example MDPs;
* :mod:`leaklab.planning.private_synthesis`: seed 003 chapter 2's Algorithm 1 (privacy-engineered policy synthesis
  through the Dirichlet mechanism) and the cost-of-privacy bounds of Theorems 2.4 and 2.6;
* :mod:`leaklab.planning.logistics_map`, :mod:`leaklab.planning.map_obfuscation` and
  :mod:`leaklab.planning.dp_logistics`: seed 002 chapter 4's differentially private multi-agent planning for
  logistic-like problems (Graph-STRIPS maps, Algorithms 6-8, Eq. 4.2) and its three baselines.
"""

from leaklab.planning.mdp import TabularMDP, evaluate, investment_mdp, optimal_policy, random_mdp
from leaklab.planning.private_synthesis import (PrivateSynthesis, concentration_radius, privatize_transitions,
                                                robust_evaluation, robust_expectation, synthesize_private_policy)

__all__ = ["TabularMDP", "evaluate", "investment_mdp", "optimal_policy", "random_mdp", "PrivateSynthesis",
           "concentration_radius", "privatize_transitions", "robust_evaluation", "robust_expectation",
           "synthesize_private_policy"]
