"""Adam with cosine annealing to 0, the optimiser of both stages (seed 000 IV-A says gradient descent and gives
no optimiser, step size or schedule: Adam, its learning rates and the annealing are leaklab's; a constant step
size stalls on a grainy floor, annealing removes it).

On the CPU the loop takes ``torch.optim.Adam``'s own single-tensor update (the one it takes there, torch 2.13) and
``CosineAnnealingLR``'s step sizes itself, the same values to the bit, without the two objects' Python around each
step: on a depth-only (S2) attack behind noise, whose steps are short, that was a fifth of its time, on an
undefended one 6 % (session 68; the equality is tested against the two objects). Elsewhere (CUDA, where the
optimiser takes its multi-tensor path) the two objects run the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Progress = Callable[[int, float], None]

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the CPU loop repeats
EPS = 1e-8


def cosine_rates(lr: float, iterations: int) -> list[float]:
    """The step size of each of ``iterations`` steps under ``torch.optim.lr_scheduler.CosineAnnealingLR``
    (``T_max=iterations``, ``eta_min=0``): its recursive form, float for float."""
    rates = [lr]
    for epoch in range(1, iterations):
        rates.append((1 + math.cos(math.pi * epoch / iterations))
                     / (1 + math.cos(math.pi * (epoch - 1) / iterations)) * rates[-1])
    return rates


def adam(params: list[torch.Tensor], loss: Callable[[float], torch.Tensor], iterations: int, lr: float,
         clamp: list[torch.Tensor] = (), progress: Progress | None = None) -> float:
    """Minimise ``loss(t)`` over ``params`` (leaf tensors requiring grad), ``t = it / iterations`` the
    fraction of the run done; tensors in ``clamp`` are kept in [0, 1] after every step. Returns the
    last loss value (module docstring: on the CPU, torch's update written out)."""
    cpu = all(p.device.type == "cpu" and not p.is_complex() for p in params)
    step = (_written_out if cpu else _torch_objects)(params, lr, iterations)
    value = torch.tensor(float("nan"))
    for it in range(iterations):
        out = loss(it / iterations)
        grads = torch.autograd.grad(out, params)
        with torch.no_grad():
            step(it, grads)
            for p in clamp:
                p.clamp_(0, 1)
        value = out.detach()  # no host sync per step: it would stall a GPU
        if progress and ((it + 1) % 50 == 0 or it + 1 == iterations):
            progress(it + 1, float(value))
    return float(value)


Step = Callable[[int, tuple[torch.Tensor, ...]], None]  # step ``it`` of the run, given the parameters' gradients


def _written_out(params: list[torch.Tensor], lr: float, iterations: int) -> Step:
    """The CPU's step: ``torch.optim.Adam``'s single-tensor update at ``CosineAnnealingLR``'s step sizes."""
    beta1, beta2 = BETAS
    rates = cosine_rates(lr, iterations)
    exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
    exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]

    def step(it: int, grads: tuple[torch.Tensor, ...]) -> None:
        count = float(it + 1)
        step_size = rates[it] / (1 - beta1 ** count)
        bias_correction2_sqrt = (1 - beta2 ** count) ** 0.5
        for p, g, exp_avg, exp_avg_sq in zip(params, grads, exp_avgs, exp_avg_sqs):
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(exp_avg, (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(EPS), value=-step_size)
    return step


def _torch_objects(params: list[torch.Tensor], lr: float, iterations: int) -> Step:
    """The step off the CPU: ``torch.optim.Adam`` and ``CosineAnnealingLR`` themselves."""
    optimiser = torch.optim.Adam(params, lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=iterations, eta_min=0.0)

    def step(it: int, grads: tuple[torch.Tensor, ...]) -> None:
        for p, g in zip(params, grads):
            p.grad = g
        optimiser.step()
        schedule.step()
        optimiser.zero_grad(set_to_none=True)
    return step
