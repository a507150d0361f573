"""leaklab: a laboratory for privacy leakage in federated deep learning and reinforcement learning.

The package is organised around one data contract (``leaklab.threat``): an attack sees only what an
honest-but-curious server holds (:class:`~leaklab.threat.ServerView`) and what a client sends
(:class:`~leaklab.threat.ClientUpdate`). Ground truth is compared with reconstructions afterwards,
in ``leaklab.experiments``.
"""

__version__ = "0.1.0"
