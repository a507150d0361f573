"""Federated learning, client side: the updates a client computes on its private batch."""

from leaklab.fl.adversarial import AdversarialConfig, adversarial_examples
from leaklab.fl.client import fedavg_update, fedsgd_update, train_steps

__all__ = ["AdversarialConfig", "adversarial_examples", "fedavg_update", "fedsgd_update", "train_steps"]
