"""The attacks on a classifier's confidence vectors of seed 002 chapter 6 (leaklab.attacks.membership and
leaklab.attacks.model_inversion), on synthetic confidence vectors: members peaked, non-members flat."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from leaklab.attacks.membership import AttackTraining, _top_posteriors, ml_leaks, nsh
from leaklab.attacks.model_inversion import InversionNet, inversion_error, train_inversion
from leaklab.errors import LeaklabError

K = 6
FAST = AttackTraining(epochs=15, lr=3e-3, batch_size=64, seed=3)


def _dirichlet(n: int, alpha: float, seed: int, k: int = K) -> torch.Tensor:
    """``n`` confidence vectors from a symmetric Dirichlet: peaked for a small ``alpha``, flat for a large one."""
    return torch.from_numpy(np.random.default_rng(seed).dirichlet(np.full(k, alpha), n)).float()


def _labelled(n: int, peak: float, seed: int, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` (confidences, labels): a softmax with logit ``peak`` (plus noise) on each row's label."""
    rng = np.random.default_rng(seed)
    labels = torch.from_numpy(rng.integers(0, k, n))
    logits = torch.from_numpy(rng.normal(0, 0.5, (n, k))).float() + peak * nn.functional.one_hot(labels, k)
    return logits.softmax(dim=1), labels


def test_ml_leaks_tells_peaked_members_from_flat_non_members():
    sets = _dirichlet(300, 0.1, 1), _dirichlet(300, 5.0, 2), _dirichlet(200, 0.1, 3), _dirichlet(200, 5.0, 4)
    accuracy = ml_leaks(*sets, training=FAST)
    assert accuracy > 0.9
    assert ml_leaks(*sets, training=FAST) == accuracy  # the same seed, the same number


def test_ml_leaks_guesses_when_both_sets_share_a_distribution():
    sets = _dirichlet(300, 1.0, 1), _dirichlet(300, 1.0, 2), _dirichlet(200, 1.0, 3), _dirichlet(200, 1.0, 4)
    assert 0.35 <= ml_leaks(*sets, training=FAST) <= 0.65


def test_ml_leaks_reads_the_three_largest_posteriors_in_descending_order():
    rows = torch.tensor([[0.05, 0.6, 0.05, 0.3], [0.1, 0.2, 0.3, 0.4]])
    assert torch.equal(_top_posteriors(rows), torch.tensor([[0.6, 0.3, 0.05], [0.4, 0.3, 0.2]]))
    assert torch.equal(_top_posteriors(torch.tensor([[0.25, 0.75]])), torch.tensor([[0.75, 0.25, 0.0]]))


def test_ml_leaks_with_two_classes():
    # k = 2 < 3: the third feature is a zero
    sets = _dirichlet(300, 0.1, 1, k=2), _dirichlet(300, 30.0, 2, k=2), _dirichlet(200, 0.1, 3, k=2), \
        _dirichlet(200, 30.0, 4, k=2)
    assert ml_leaks(*sets, training=FAST) > 0.9


def test_ml_leaks_weighs_unbalanced_shadow_sets_equally():
    # 600 shadow members against 60 non-members, of overlapping distributions: unweighted, the attack called every
    # target row a member (0.5); weighted, it reads 0.75, as with 600 against 600 (0.76)
    sets = _dirichlet(600, 0.3, 1), _dirichlet(60, 1.0, 2), _dirichlet(300, 0.3, 3), _dirichlet(300, 1.0, 4)
    assert ml_leaks(*sets, training=FAST) > 0.65


def test_nsh_tells_confident_members_from_unsure_non_members():
    sets = _labelled(300, 6.0, 1), _labelled(300, 0.5, 2), _labelled(200, 6.0, 3), _labelled(200, 0.5, 4)
    accuracy = nsh(*sets, training=FAST)
    assert accuracy > 0.9
    assert nsh(*sets, training=FAST) == accuracy


def test_nsh_guesses_when_both_sets_share_a_distribution():
    sets = _labelled(300, 2.0, 1), _labelled(300, 2.0, 2), _labelled(200, 2.0, 3), _labelled(200, 2.0, 4)
    assert 0.35 <= nsh(*sets, training=FAST) <= 0.65


def test_the_seed_changes_the_attack_but_not_the_global_generator():
    sets = _dirichlet(100, 0.3, 1), _dirichlet(100, 1.0, 2), _dirichlet(100, 0.3, 3), _dirichlet(100, 1.0, 4)
    state = torch.get_rng_state()
    one = ml_leaks(*sets, training=AttackTraining(epochs=3, lr=1e-2, seed=1))
    two = ml_leaks(*sets, training=AttackTraining(epochs=3, lr=1e-2, seed=2))
    nsh(*[_labelled(50, 2.0, i) for i in range(4)], training=AttackTraining(epochs=1))
    assert torch.equal(torch.get_rng_state(), state)
    assert one != two  # overlapping sets: two seeds' attacks, 3 epochs each, read 0.585 and 0.65


def _nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[0, 0] = float("nan")
    return x


@pytest.mark.parametrize("change, message", [
    (lambda s: (s[0], s[1], s[2], _dirichlet(10, 1.0, 9, k=K + 1)), "same k-class"),
    (lambda s: (s[0], _nan(s[1]), s[2], s[3]), "NaN"),
    (lambda s: (s[0], s[1], s[2][:0], s[3]), "at least one row"),
    (lambda s: (s[0], s[1], s[2][0], s[3]), "2-D"),
    (lambda s: (s[0].double().numpy(), s[1], s[2], s[3]), "torch tensor"),
    (lambda s: (s[0], s[1], s[2], (s[3] * 100).long()), "floats"),
])
def test_ml_leaks_refuses_bad_sets(change, message):
    sets = tuple(_dirichlet(10, 1.0, i) for i in range(4))
    with pytest.raises(LeaklabError, match=message):
        ml_leaks(*change(sets), training=AttackTraining(epochs=1))


@pytest.mark.parametrize("change, message", [
    (lambda s: (s[0], s[1], (s[2][0], torch.full((10,), K)), s[3]), r"class indices in \[0, 5\]"),
    (lambda s: (s[0], s[1], s[2], (s[3][0], -torch.ones(10, dtype=torch.int64))), "class indices"),
    (lambda s: (s[0], (s[1][0], s[1][1].float()), s[2], s[3]), "integer tensor"),
    (lambda s: (s[0], (s[1][0], s[1][1][:5]), s[2], s[3]), "one per confidence vector"),
    (lambda s: ((s[0][0][:, :3], s[0][1]), s[1], s[2], s[3]), "same k-class"),
    (lambda s: (s[0], s[1], s[2], (_nan(s[3][0]), s[3][1])), "NaN"),
    (lambda s: (s[0], (s[1][0][:0], s[1][1][:0]), s[2], s[3]), "at least one row"),
    (lambda s: (s[0][0], s[1], s[2], s[3]), "pair"),
])
def test_nsh_refuses_bad_sets(change, message):
    sets = tuple(_labelled(10, 2.0, i) for i in range(4))
    with pytest.raises(LeaklabError, match=message):
        nsh(*change(sets), training=AttackTraining(epochs=1))


def test_attack_training_is_checked():
    with pytest.raises(ValueError):
        AttackTraining(epochs=0)
    with pytest.raises(ValueError):
        AttackTraining(lr=0)
    with pytest.raises(ValueError):
        AttackTraining(learning_rate=0.1)
    with pytest.raises(LeaklabError, match="AttackTraining"):
        ml_leaks(*(_dirichlet(10, 1.0, i) for i in range(4)), training={"epochs": 1})


def _untrained(num_classes: int, channels: int, width: int) -> InversionNet:
    """A fresh inversion network, its weights drawn from seed 0 (the global generator is given back)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return InversionNet(num_classes, channels, width)


def test_inversion_net_gives_images_in_the_unit_range():
    net = _untrained(K, 3, 4).eval()
    with torch.no_grad():
        assert net(_dirichlet(5, 1.0, 0)).shape == (5, 3, 32, 32)
        for bias in (-50.0, 50.0):  # pushed to either end, the output stays in [0, 1] and reaches it
            net.blocks[-1][0].bias.fill_(bias)
            out = net(_dirichlet(5, 1.0, 0))
            assert out.min() >= 0 and out.max() <= 1
            assert (out - float(bias > 0)).abs().max() < 1e-6
    with pytest.raises(LeaklabError, match="width"):
        InversionNet(K, 1, width=0)


def _templates_problem(n: int, seed: int, k: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Confidence vectors that are one-hot-ish (a noisy softmax peaked on a class) and, for each, its class's fixed
    template image: the image is a function of the confidence vector."""
    templates = torch.from_numpy(np.random.default_rng(0).random((k, 1, 32, 32))).float()
    confidences, labels = _labelled(n, 4.0, seed, k=k)
    return confidences, templates[labels]


def test_train_inversion_learns_a_mapping_an_untrained_net_does_not_know():
    confidences, images = _templates_problem(128, 1)
    held_out = _templates_problem(64, 2)
    state = torch.get_rng_state()
    training = AttackTraining(epochs=25, lr=1e-2, batch_size=32)
    net = train_inversion(confidences, images, training, width=8)
    assert not net.training and torch.equal(torch.get_rng_state(), state)
    trained = inversion_error(net, *held_out)
    untrained = inversion_error(_untrained(4, 1, 8), *held_out)
    assert trained < 0.2 * untrained
    assert inversion_error(train_inversion(confidences, images, training, width=8), *held_out) == trained


class _Echo(nn.Module):
    """A stand-in inversion network whose answer is fixed images."""

    def __init__(self, images: torch.Tensor):
        super().__init__()
        self.images = images

    def forward(self, confidences: torch.Tensor) -> torch.Tensor:
        return self.images[:len(confidences)]


def test_inversion_error_is_the_mean_squared_error_per_pixel():
    confidences, images = _templates_problem(6, 1)
    assert inversion_error(_Echo(images), confidences, images) == 0
    shifted = (images * 0.5 + 0.25)
    expected = (shifted - images).square().mean().item()
    assert inversion_error(_Echo(shifted), confidences, images) == pytest.approx(expected, rel=1e-6)


def test_inversion_error_keeps_the_network_modes():
    net = _untrained(4, 1, 4).train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    inversion_error(net, *_templates_problem(8, 1))
    assert net.training and all(m.training for m in net.modules())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())  # no BatchNorm statistics updated


@pytest.mark.parametrize("change, message", [
    (lambda c, i: (c, i * 2), r"\[0, 1\]"),
    (lambda c, i: (c, i[:, :, :16, :16]), "shape"),
    (lambda c, i: (c, i[:-1]), "one per confidence vector"),
    (lambda c, i: (c, i[:, 0]), "shape"),
    (lambda c, i: (_nan(c), i), "NaN"),
    (lambda c, i: (c[:0], i[:0]), "at least one row"),
    (lambda c, i: (c, (i * 255).to(torch.uint8)), "float tensor"),
])
def test_inversion_refuses_bad_inputs(change, message):
    confidences, images = change(*_templates_problem(8, 1))
    with pytest.raises(LeaklabError, match=message):
        train_inversion(confidences, images, AttackTraining(epochs=1), width=2)
    with pytest.raises(LeaklabError, match=message):
        inversion_error(InversionNet(4, 1, width=2), confidences, images)


def test_inversion_error_refuses_a_network_for_other_classes():
    with pytest.raises(LeaklabError, match="5 classes"):
        inversion_error(InversionNet(5, 1, width=2), *_templates_problem(8, 1))
