"""Federated learning, client side: the updates a client computes on its private batch."""

from leaklab.fl.client import fedavg_update, fedsgd_update, train_steps

__all__ = ["fedavg_update", "fedsgd_update", "train_steps"]
