"""leaklab.privacy.dpsgd: the single release, central DP aggregation and opacus DP-SGD training."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.models import ModelSpec, build_model
from leaklab.privacy.accounting import dpsgd_epsilon
from leaklab.privacy.dpsgd import (CentralDP, DPSGDConfig, clip_and_noise, make_private, noise_multiplier_for,
                                   train_private)
from leaklab.privacy.mechanisms import analytic_gaussian_sigma


def _norm(tensors) -> float:
    return float(torch.sqrt(sum((t * t).sum() for t in tensors)))


def test_clip_and_noise_clips_the_whole_gradient_then_adds_sigma_c_noise():
    g = [torch.full((3, 4), 2.0), torch.full((5,), -1.0)]  # norm sqrt(48 + 5)
    clipped = clip_and_noise(g, clip=0.5, noise_multiplier=0.0, generator=torch.Generator().manual_seed(0))
    assert _norm(clipped) == pytest.approx(0.5, rel=1e-5)
    assert torch.allclose(clipped[0] / clipped[0][0, 0], torch.ones(3, 4))  # direction kept
    small = [torch.full((4,), 0.1)]
    assert torch.equal(clip_and_noise(small, 1.0, 0.0, torch.Generator())[0], small[0])  # short ones kept
    big = [torch.zeros(200_000)]
    noisy = clip_and_noise(big, clip=0.5, noise_multiplier=2.0, generator=torch.Generator().manual_seed(1))[0]
    assert float(noisy.std()) == pytest.approx(1.0, rel=0.01)  # sigma * C
    again = clip_and_noise(big, 0.5, 2.0, torch.Generator().manual_seed(1))[0]
    assert torch.equal(noisy, again)
    with pytest.raises(LeaklabError, match="clipping"):
        clip_and_noise(g, clip=0.0, noise_multiplier=1.0, generator=torch.Generator())


def test_noise_multiplier_for_one_release_is_the_analytic_gaussian():
    assert noise_multiplier_for(math.inf, 1e-5) == 0.0
    sigmas = [noise_multiplier_for(eps, 1e-5) for eps in (8.0, 3.0, 1.0)]
    assert sigmas[0] < sigmas[1] < sigmas[2]
    assert sigmas[1] == pytest.approx(analytic_gaussian_sigma(3.0, 1e-5))
    # q = 1 composes exactly: 4 full-batch steps spend what dp-accounting's PLD says
    sigma4 = noise_multiplier_for(3.0, 1e-5, steps=4)
    assert dpsgd_epsilon(1.0, sigma4, 4, 1e-5, "pld") == pytest.approx(3.0, abs=0.01)
    fewer = noise_multiplier_for(3.0, 1e-5, steps=10, q=0.1, accountant="rdp")
    assert fewer < noise_multiplier_for(3.0, 1e-5, steps=100, q=0.1, accountant="rdp")


def test_central_dp_clips_each_client_and_accounts_rounds():
    updates = [[torch.tensor([3.0, 4.0])], [torch.tensor([0.3, 0.4])], [torch.tensor([0.0, -10.0])]]
    dp = CentralDP(clip=1.0, noise_multiplier=0.0, sample_rate=0.1)
    mean = dp.aggregate(updates, torch.Generator(), expected_clients=3)[0]
    assert torch.allclose(mean, torch.tensor([0.6 + 0.3, 0.8 + 0.4 - 1.0]) / 3)
    assert dp.aggregate(updates, torch.Generator(), expected_clients=6)[0] == pytest.approx(mean * 0.5)
    noisy = CentralDP(clip=2.0, noise_multiplier=1.5, sample_rate=0.1)
    zeros = [[torch.zeros(100_000)] for _ in range(4)]
    out = noisy.aggregate(zeros, torch.Generator().manual_seed(0), expected_clients=4)[0]
    assert float(out.std()) == pytest.approx(1.5 * 2.0 / 4, rel=0.02)  # sigma C at the sum, / clients
    for _ in range(9):
        noisy.aggregate(zeros, torch.Generator(), expected_clients=4)
    assert noisy.rounds == 10
    with pytest.raises(LeaklabError, match="expected_clients"):
        noisy.aggregate(zeros, torch.Generator(), expected_clients=0)
    assert noisy.epsilon(1e-5, "rdp") == pytest.approx(dpsgd_epsilon(0.1, 1.5, 10, 1e-5, "rdp"))
    assert CentralDP(1.0, 1.0).epsilon(1e-5) == 0.0
    assert dp.epsilon(1e-5) == math.inf  # rounds without noise (it raised: sigma must be positive)


def _digits(n: int = 64):
    batch = load_images("digits", n, image_size=8, seed=0)
    spec = ModelSpec(name="mlp", num_classes=10, in_channels=1, image_size=8, width=16,
                     mean=batch.mean, std=batch.std)
    return batch, spec


def test_opacus_refuses_batchnorm_with_one_line_naming_the_fix():
    batch, _ = _digits()
    spec = ModelSpec(name="convnet", num_classes=10, in_channels=1, image_size=16, width=4,
                     mean=batch.mean, std=batch.std)
    model = build_model(spec, seed=0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1, 16, 16)), batch_size=2)
    with pytest.raises(LeaklabError, match="GroupNorm") as info:
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, clip=1.0, noise_multiplier=1.0)
    assert "\n" not in str(info.value) and "BatchNorm" in str(info.value)


def test_private_training_clips_per_sample_and_reports_its_epsilon():
    batch, spec = _digits()
    model = build_model(spec, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    # full batch (q = 1), no noise, tiny clip: one step moves the weights by at most lr * clip
    report = train_private(model, batch.images, batch.labels,
                           DPSGDConfig(noise_multiplier=0.0, clip=1e-3, batch_size=64, steps=1, lr=1.0))
    moved = _norm([p.detach() - b for p, b in zip(model.parameters(), before)])
    assert 0 < moved <= 1e-3 * (1 + 1e-4)
    assert report["epsilon"] == math.inf and report["sample_rate"] == 1.0

    config = DPSGDConfig(noise_multiplier=1.2, clip=1.0, batch_size=16, steps=6, lr=0.1, seed=3)
    runs = []
    for _ in range(2):
        model = build_model(spec, seed=0)
        report = train_private(model, batch.images, batch.labels, config)
        runs.append(torch.cat([p.detach().ravel() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1])  # same seed, same numbers
    assert report["steps"] == 6 and report["sample_rate"] == 0.25
    assert report["epsilon"] == pytest.approx(dpsgd_epsilon(0.25, 1.2, 6, 1e-5))
    other = build_model(spec, seed=0)
    train_private(other, batch.images, batch.labels, config.model_copy(update={"seed": 4}))
    assert not torch.equal(torch.cat([p.detach().ravel() for p in other.parameters()]), runs[0])


def test_target_epsilon_is_reached_and_not_exceeded():
    batch, spec = _digits()
    config = DPSGDConfig(target_epsilon=3.0, batch_size=16, steps=8, accountant="rdp")
    report = train_private(build_model(spec, seed=0), batch.images, batch.labels, config)
    assert 2.95 <= report["epsilon"] <= 3.0
    # 186 images in batches of 2: opacus samples at 1/93, though its loader's length, int(93.0 - 1e-14), is 92
    many = load_images("digits", 186, image_size=8, seed=0)
    report = train_private(build_model(spec, seed=0), many.images, many.labels,
                           config.model_copy(update={"batch_size": 2, "steps": 3}))
    assert report["sample_rate"] == 1 / 93
    assert report["epsilon"] == dpsgd_epsilon(1 / 93, report["noise_multiplier"], 3, 1e-5, "rdp") <= 3.0
    # every image in every batch (q = 1): calibrated exactly, and so reported (rdp's accountant said 1.0926 at 1)
    full = config.model_copy(update={"batch_size": len(batch.images), "steps": 5, "target_epsilon": 1.0})
    report = train_private(build_model(spec, seed=0), batch.images, batch.labels, full)
    assert report["sample_rate"] == 1.0 and report["epsilon"] == pytest.approx(1.0, rel=1e-9)
    with pytest.raises(ValidationError, match="exactly one"):
        DPSGDConfig(target_epsilon=3.0, noise_multiplier=1.0)
    with pytest.raises(ValidationError, match="accountant"):
        DPSGDConfig(noise_multiplier=1.0, accountant="gdp")


def test_a_noise_the_accountant_cannot_account_is_refused_before_the_training():
    """σ under prv's grid: the training ran to its end, then failed in the accounting, its network lost."""
    batch, spec = _digits()
    model = build_model(spec, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    for sigma in (0.01, 1e-7):
        with pytest.raises(LeaklabError, match="sigma"):
            train_private(model, batch.images, batch.labels,
                          DPSGDConfig(noise_multiplier=sigma, batch_size=16, steps=3, accountant="prv"))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # refused before any step
    report = train_private(model, batch.images, batch.labels,
                           DPSGDConfig(noise_multiplier=0.01, batch_size=16, steps=1, accountant="rdp"))
    assert math.isfinite(report["epsilon"])
