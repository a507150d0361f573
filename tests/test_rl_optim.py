"""The room attacks' optimiser: on the CPU, torch.optim.Adam's update and CosineAnnealingLR's step sizes written
out, which must give the two objects' values to the bit (the published reconstructions depend on them)."""

import math

import pytest
import torch

from leaklab.attacks.rl import optim


@pytest.mark.parametrize("iterations", [1, 2, 3, 10, 400])
def test_the_cpu_loop_is_torch_adam_with_cosine_annealing_to_the_bit(iterations, monkeypatch):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 50, generator=g)
    start = torch.rand(3, 50, generator=g), torch.randn(2, 7, generator=g)

    def run(minimise):
        x, b = (t.clone().requires_grad_() for t in start)
        seen = []
        last = minimise([x, b], lambda t: ((x @ a.T).sin().sum() * (1 + t) + (b ** 3).sum() + (x - 0.5).abs().sum()),
                        iterations, 0.1, clamp=[x], progress=lambda it, value: seen.append((it, value)))
        return x.detach(), b.detach(), last, seen

    ours = run(optim.adam)
    with monkeypatch.context() as m:  # the same loop stepped by torch's two objects
        m.setattr(optim, "_written_out", optim._torch_objects)
        torchs = run(optim.adam)
    assert torch.equal(ours[0], torchs[0]) and torch.equal(ours[1], torchs[1])
    assert ours[2] == torchs[2] and ours[3] == torchs[3]
    assert not torch.equal(ours[0], start[0])  # it moved


def test_cosine_rates_are_the_schedulers():
    for iterations in (*range(1, 60), 500, 2000):
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iterations, eta_min=0.0)
        rates = []
        for _ in range(iterations):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            schedule.step()
        assert optim.cosine_rates(0.1, iterations) == rates
    assert math.isclose(optim.cosine_rates(0.1, 2000)[1000], 0.05, rel_tol=1e-9)  # half way: half the rate
