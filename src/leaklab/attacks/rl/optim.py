"""Adam with cosine annealing to 0, the optimiser of both stages (seed 000 IV-A says gradient descent and gives
no optimiser, step size or schedule: Adam, its learning rates and the annealing are leaklab's; a constant step
size stalls on a grainy floor, annealing removes it)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Progress = Callable[[int, float], None]


def adam(params: list[torch.Tensor], loss: Callable[[float], torch.Tensor], iterations: int, lr: float,
         clamp: list[torch.Tensor] = (), progress: Progress | None = None) -> float:
    """Minimise ``loss(t)`` over ``params`` (leaf tensors requiring grad), ``t = it / iterations`` the
    fraction of the run done; tensors in ``clamp`` are kept in [0, 1] after every step. Returns the
    last loss value."""
    optimiser = torch.optim.Adam(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=iterations, eta_min=0.0)
    value = torch.tensor(float("nan"))
    for it in range(iterations):
        optimiser.zero_grad(set_to_none=True)
        out = loss(it / iterations)
        grads = torch.autograd.grad(out, params)
        for p, g in zip(params, grads):
            p.grad = g
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            for p in clamp:
                p.clamp_(0, 1)
        value = out.detach()  # no host sync per step: it would stall a GPU
        if progress and ((it + 1) % 50 == 0 or it + 1 == iterations):
            progress(it + 1, float(value))
    return float(value)
