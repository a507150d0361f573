"""DP-SGD in leaklab's other training loops: the RL agents (leaklab.rl.agents.private) and the FedAvg
client (leaklab.fl.fedavg_update), with the epsilon they report; and the non-private paths unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.fl import fedavg_update
from leaklab.models import ModelSpec, PerceptionSpec, build_model, build_perception_net
from leaklab.privacy.accounting import dpsgd_epsilon
from leaklab.privacy.dpsgd import DPConfig, make_private
from leaklab.privacy.mechanisms import analytic_gaussian_epsilon
from leaklab.rl.agents import DQNConfig, ReinforceConfig, ReplayBuffer, td_targets, train_dqn, train_reinforce
from leaklab.rl.agents.private import make_private_agent
from leaklab.rl.capture import collect_transitions
from leaklab.rl.envs import LAYOUTS
from leaklab.rl.losses import dqn_loss

SPEC = PerceptionSpec(setting="S2", image_size=64)
ROOMS = tuple(LAYOUTS)[:2]


def _dqn(seed: int = 5, privacy: DPConfig | None = None, buffer_size: int = 40):
    return train_dqn(DQNConfig(spec=SPEC, layouts=ROOMS, steps=40, learning_starts=20, batch_size=4,
                               buffer_size=buffer_size, target_sync=10**6, lr=1e-3, eps_decay_steps=20, seed=seed,
                               privacy=privacy))


def _reinforce(seed: int = 5, privacy: DPConfig | None = None):
    return train_reinforce(ReinforceConfig(spec=SPEC, layouts=ROOMS, steps=30, max_episode_steps=15, lr=1e-3,
                                           seed=seed, privacy=privacy))


def _digits(n: int = 8):
    batch = load_images("digits", n, image_size=8, seed=0)
    spec = ModelSpec(name="mlp", num_classes=10, in_channels=1, image_size=8, width=16, mean=batch.mean,
                     std=batch.std)
    return batch, spec


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_privacy_off_gives_the_numbers_of_before():
    # recorded with these exact runs at commit f0dd2ee, before DP-SGD entered the loops
    net, history = _dqn()
    assert history.privacy is None and "epsilon" not in history.summary()
    assert history.losses[:3] == pytest.approx([0.1947104036808014, 0.7009909749031067, 0.33990344405174255],
                                               rel=1e-6)
    assert float(net.head[2].bias.detach().sum()) == pytest.approx(0.07646119594573975, rel=1e-6)
    net, history = _reinforce()
    assert history.losses == pytest.approx([5.741642475128174, 8.52182388305664], rel=1e-6)
    assert float(net.head[2].bias.detach().sum()) == pytest.approx(0.042010996490716934, rel=1e-6)
    batch, spec = _digits()
    update = fedavg_update(build_model(spec, seed=0), batch.images, batch.labels, local_lr=0.1, local_steps=3,
                           local_batch_size=4)
    assert update.privacy is None
    assert float(sum(t.sum() for t in update.tensors.values())) == pytest.approx(0.20403285324573517, rel=1e-6)
    # and independently of any recording: plain SGD, mini-batches of 4 in order, cycling over the 8 images
    net = build_model(spec, seed=0)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        idx = torch.arange(4 * step, 4 * step + 4) % 8
        sgd.zero_grad()
        F.cross_entropy(net(batch.images[idx]), batch.labels[idx]).backward()
        sgd.step()
    for name, p in net.named_parameters():
        assert torch.allclose(update.tensors[name], p.detach() - start[name], atol=1e-7), name


def test_private_dqn_reports_the_accountants_epsilon_and_reruns_identically():
    privacy = DPConfig(clip=1.0, noise_multiplier=1.1, delta=1e-5)
    net, history = _dqn(privacy=privacy)
    report = history.privacy
    assert report["sample_rate"] == 4 / 40 and report["updates"] == report["steps"] == history.updates == 20
    assert DQNConfig(steps=40, learning_starts=20, batch_size=4, buffer_size=40).planned_updates() == 20
    assert math.isfinite(report["epsilon"])
    assert report["epsilon"] == pytest.approx(dpsgd_epsilon(0.1, 1.1, 20, 1e-5), rel=1e-9)
    assert history.summary()["epsilon"] == report["epsilon"]
    again, history2 = _dqn(privacy=privacy)
    assert _same_state(net, again) and history2.losses == pytest.approx(history.losses, nan_ok=True)
    other, _ = _dqn(seed=6, privacy=privacy)
    assert not _same_state(net, other)
    plain, _ = _dqn()
    assert not _same_state(net, plain)
    assert not any(module._forward_hooks for module in net.modules())  # opacus' hooks are gone


def test_private_dqn_meets_a_target_epsilon_and_refuses_impossible_settings():
    _, history = _dqn(privacy=DPConfig(target_epsilon=2.0, delta=1e-5))
    # the calibrated sigma is the smallest that keeps the run within the target: spent epsilon lands
    # at the target from below (a sigma too large or too small fails one side)
    assert history.privacy["epsilon"] == pytest.approx(2.0, rel=0.01) and history.privacy["epsilon"] <= 2.0
    for privacy in (DPConfig(noise_multiplier=1.0), None):  # the buffer never holds a batch: no update would run
        with pytest.raises(ValidationError, match="batch_size 4 exceeds buffer_size 3"):
            _dqn(privacy=privacy, buffer_size=3)
    with pytest.raises(ValidationError):
        DPConfig(noise_multiplier=1.0, target_epsilon=1.0)


def test_private_reinforce_counts_one_release_per_sample():
    net, history = _reinforce(privacy=DPConfig(clip=1.0, noise_multiplier=1.0))
    report = history.privacy
    assert report["updates"] == history.updates == len(history.returns) == 2
    assert report["sample_rate"] == 1.0 and report["steps"] == 1
    # one release of one Gaussian mechanism: its exact epsilon (an accountant's, 4.387, is larger)
    assert report["epsilon"] == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-5), rel=1e-9) == 4.3771780956
    assert dpsgd_epsilon(1.0, 1.0, 1, 1e-5) > report["epsilon"]
    again, _ = _reinforce(privacy=DPConfig(clip=1.0, noise_multiplier=1.0))
    assert _same_state(net, again)
    _, history = _reinforce(privacy=DPConfig(target_epsilon=3.0))
    assert history.privacy["epsilon"] == pytest.approx(3.0, rel=1e-9)


@pytest.fixture(scope="module")
def replay():
    buffer = ReplayBuffer(16, (1, 64, 64), 4)
    for tr in collect_transitions(ROOMS, 6, SPEC, seed=3):
        buffer.add(tr.depth, tr.box, tr.action, tr.reward, tr.next_depth, tr.next_box, tr.done)
    return buffer


def _private_grad(batch, noise_multiplier, clip, expected):
    net = build_perception_net(SPEC, seed=0)
    target = build_perception_net(SPEC, seed=0).requires_grad_(False)
    agent = make_private_agent(net, torch.optim.SGD(net.parameters(), lr=0.0),
                               DPConfig(clip=clip, noise_multiplier=noise_multiplier), sample_rate=0.5,
                               expected_batch_size=expected, steps=1, seed=0)
    y = td_targets(target, batch["reward"], batch["next_images"], batch["next_box"], batch["done"], 0.9)
    agent.step(dqn_loss(agent.model(batch["images"], batch["box"]), batch["action"], y))
    grad = [p.grad.detach().clone() for p in net.parameters()]
    agent.finish(1, 1)
    return grad, net, target, y


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def test_private_step_clips_every_sample_gradient(replay):
    batch = replay.sample(4, np.random.default_rng(0))
    clip = 0.05
    grad, net, target, y = _private_grad(batch, 0.0, clip, expected=4)
    # direct computation: each sample's gradient of its own loss, clipped to clip, averaged over 4
    expected = torch.zeros_like(_flat(grad))
    norms = []
    for i in range(4):
        loss = dqn_loss(net(batch["images"][i:i + 1], batch["box"][i:i + 1]), batch["action"][i:i + 1], y[i:i + 1])
        g = _flat(torch.autograd.grad(loss, list(net.parameters())))
        norms.append(float(g.norm()))
        expected += g * min(1.0, clip / (float(g.norm()) + 1e-6)) / 4
    assert max(norms) > clip  # clipping is active
    torch.testing.assert_close(_flat(grad), expected, rtol=1e-4, atol=1e-7)
    assert float(_flat(grad).norm()) <= clip * (1 + 1e-5)


def test_large_noise_dominates_the_private_update(replay):
    batch = replay.sample(4, np.random.default_rng(1))
    clean, *_ = _private_grad(batch, 0.0, 1.0, expected=4)
    noisy, *_ = _private_grad(batch, 1e3, 1.0, expected=4)
    clean, noisy = _flat(clean), _flat(noisy)
    d = clean.numel()
    # noise std sigma * C / expected batch on every entry
    assert float(noisy.norm()) == pytest.approx(1e3 * 1.0 * math.sqrt(d) / 4, rel=0.02)
    assert float(clean.norm()) < 1e-3 * float(noisy.norm())
    assert abs(float(F.cosine_similarity(clean, noisy, dim=0))) < 0.05


def test_empty_poisson_batch_takes_a_noise_step():
    # q = 1/100 over 100 samples: many empty batches; each is a DP-SGD step with noise only
    model = torch.nn.Linear(3, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(100, 3)), batch_size=1,
                                         generator=torch.Generator().manual_seed(0))
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), loader, clip=1.0, noise_multiplier=1.0,
                       seed=0)
    run.train(20, lambda net, b: net(b[0]).mean())
    run.close()
    assert run.steps == 20


def test_private_fedavg_client_spends_epsilon_and_leaves_the_model():
    batch, spec = _digits()
    model = build_model(spec, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    privacy = DPConfig(clip=1.0, noise_multiplier=1.2)
    update = fedavg_update(model, batch.images, batch.labels, local_lr=0.1, local_steps=3, local_batch_size=4,
                           privacy=privacy, seed=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    report = update.privacy
    assert report["sample_rate"] == 0.5 and report["steps"] == 3
    assert report["epsilon"] == pytest.approx(dpsgd_epsilon(0.5, 1.2, 3, 1e-5), rel=1e-9)
    update.validate_against(model)
    again = fedavg_update(model, batch.images, batch.labels, local_lr=0.1, local_steps=3, local_batch_size=4,
                          privacy=privacy, seed=2)
    assert all(torch.equal(update.tensors[k], again.tensors[k]) for k in update.tensors)
    # no noise, tiny clip: one full-batch step moves the weights by at most lr * clip
    tiny = fedavg_update(model, batch.images, batch.labels, local_lr=0.1, local_steps=1,
                         privacy=DPConfig(clip=1e-3, noise_multiplier=0.0))
    moved = float(_flat(list(tiny.tensors.values())).norm())
    assert 0 < moved <= 0.1 * 1e-3 * (1 + 1e-4) and tiny.privacy["epsilon"] == math.inf
    with pytest.raises(LeaklabError, match="train mode"):
        fedavg_update(model, batch.images, batch.labels, local_lr=0.1, local_steps=1, train_mode=False,
                      privacy=privacy)


@pytest.mark.parametrize("train,config", [
    (train_dqn, DQNConfig(spec=SPEC, layouts=ROOMS, steps=40, learning_starts=5, batch_size=4, buffer_size=40,
                          max_episode_steps=20,
                          privacy=DPConfig(noise_multiplier=1.0))),
    (train_reinforce, ReinforceConfig(spec=SPEC, layouts=ROOMS, steps=30, max_episode_steps=15,
                                      privacy=DPConfig(noise_multiplier=1.0)))])
def test_a_private_training_that_fails_leaves_the_callers_network_without_hooks(train, config):
    net = build_perception_net(SPEC, seed=0)

    def interrupt(*_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, progress=interrupt, net=net)
    assert not any(module._forward_hooks or module._backward_hooks for module in net.modules())
