"""Madry's L2 PGD and the adversarially training client (seed 004, section 5.1)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.fl import AdversarialConfig, adversarial_examples, fedavg_update, fedsgd_update, train_steps
from leaklab.models import ModelSpec, build_model
from leaklab.privacy.dpsgd import DPConfig


def _setup(name: str = "cnn", n: int = 6):
    data = load_images("digits", n, 8, seed=0)
    spec = ModelSpec(name=name, num_classes=10, in_channels=1, image_size=8, width=4, mean=data.mean, std=data.std)
    return build_model(spec, seed=0), data.images, data.labels


def test_pgd_stays_in_the_ball_and_pixel_range_and_raises_the_loss():
    model, x, y = _setup()
    config = AdversarialConfig(eps=0.5, steps=5)
    adv = adversarial_examples(model, x, y, config)
    assert (adv - x).flatten(1).norm(dim=1).max() <= 0.5 + 1e-5
    assert adv.min() >= 0 and adv.max() <= 1
    with torch.no_grad():
        assert F.cross_entropy(model(adv), y) > F.cross_entropy(model(x), y) + 0.01
    assert config.step == pytest.approx(2.5 * 0.5 / 5)


def test_pgd_gives_the_model_back_as_it_came():
    model, x, y = _setup("resnet18")
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    adversarial_examples(model, x, y, AdversarialConfig(eps=0.3, steps=2))
    assert model.training
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # BatchNorm statistics too


def test_adversarial_client_sends_the_gradient_of_its_adversarial_examples():
    model, x, y = _setup()
    config = AdversarialConfig(eps=0.5, steps=3)
    sent = fedsgd_update(model, x, y, adversarial=config)
    direct = fedsgd_update(model, adversarial_examples(model, x, y, config), y)
    clean = fedsgd_update(model, x, y)
    assert all(torch.equal(sent.tensors[k], direct.tensors[k]) for k in sent.tensors)
    assert not all(torch.equal(sent.tensors[k], clean.tensors[k]) for k in sent.tensors)
    delta = fedavg_update(model, x, y, local_lr=0.1, local_steps=1, adversarial=config)
    assert all(torch.allclose(delta.tensors[k], -0.1 * direct.tensors[k], atol=1e-6) for k in sent.tensors)


def test_adversarial_training_is_repeatable_and_differs_from_vanilla():
    def trained(adversarial):
        model, x, y = _setup(n=64)
        return train_steps(model, x, y, 5, lr=0.05, batch_size=16, seed=1, adversarial=adversarial)

    config = AdversarialConfig(eps=0.5, steps=2)
    a, b, v = trained(config), trained(config), trained(None)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), v.parameters()))


def test_bad_settings_are_refused():
    with pytest.raises(ValidationError):
        AdversarialConfig(eps=0)
    with pytest.raises(ValidationError):
        AdversarialConfig(eps=float("nan"))
    model, x, y = _setup()
    with pytest.raises(LeaklabError, match="either with DP-SGD or adversarially"):
        fedavg_update(model, x, y, local_lr=0.1, local_steps=1, privacy=DPConfig(noise_multiplier=1.0),
                      adversarial=AdversarialConfig(eps=0.5))


def test_a_radius_under_float32s_range_leaves_the_images_as_they_are():
    model, x, y = _setup()
    adv = adversarial_examples(model, x, y, AdversarialConfig(eps=1e-46, steps=2))
    assert torch.isfinite(adv).all() and torch.allclose(adv, x)


def test_training_reports_each_step():
    model, x, y = _setup(n=16)
    seen = []
    train_steps(model, x, y, 3, adversarial=AdversarialConfig(eps=0.1, steps=1),
                progress=lambda task, done, total: seen.append((task, done, total)))
    assert seen == [("adversarial training", 1, 3), ("adversarial training", 2, 3), ("adversarial training", 3, 3)]
