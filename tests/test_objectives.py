"""The inversion objectives against their formulas (seed 001 section 4: DLG's squared distance, the
Laplacian's absolute distance, Inverting Gradients' cosine), values and gradients, with layer weights."""

import pytest
import torch

from leaklab.attacks.inversion.objectives import Objective, layer_weights
from leaklab.attacks.inversion.priors import total_variation
from leaklab.defenses import parse_defense


def reference(name: str, sim: list[torch.Tensor], obs: list[torch.Tensor], w: list[float]) -> torch.Tensor:
    """Per instance (first dimension), written out plainly."""
    flat = lambda ts: [t.flatten(1) for t in ts]  # noqa: E731
    s, o = flat(sim), flat(obs)
    if name == "l2":
        return sum(wi * ((a - b) ** 2).sum(1) for wi, a, b in zip(w, s, o))
    if name == "l1":
        return sum(wi * (a - b).abs().sum(1) for wi, a, b in zip(w, s, o))
    dot = sum(wi * (a * b).sum(1) for wi, a, b in zip(w, s, o))
    return 1 - dot / torch.sqrt(sum(wi * (a * a).sum(1) for wi, a in zip(w, s))
                                * sum(wi * (b * b).sum(1) for wi, b in zip(w, o)))


@pytest.mark.parametrize("name", ["l2", "l1", "cosine"])
@pytest.mark.parametrize("weighting", ["none", "linear", "exp"])
def test_objective_values_and_gradients_match_their_formulas(name, weighting):
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 4), (2, 5), (2, 6)]  # R = 2 instances, three parameter tensors
    obs = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    sim = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]
    w = layer_weights(len(shapes), weighting)
    got = Objective(name, obs, parse_defense(None), weighting)(sim)
    want = reference(name, sim, obs, w)
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got.sum(), sim), torch.autograd.grad(want.sum(), sim)):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
    # identical updates: nothing to gain
    same = Objective(name, obs, parse_defense(None), weighting)(obs)
    assert torch.allclose(same, torch.zeros(2, dtype=torch.float64), atol=1e-12)


def test_the_cosine_objective_does_not_depend_on_the_gradients_scale():
    """Updates of a well-trained network are small: 1 - cos must not change with the scale (an added 1e-12
    in the denominator made an exact match of norm-1e-7 updates score 0.99)."""
    g = torch.Generator().manual_seed(1)
    obs = [torch.randn(1, 50, generator=g), torch.randn(1, 7, generator=g)]
    sim = [torch.randn(1, 50, generator=g), torch.randn(1, 7, generator=g)]
    at_one = Objective("cosine", obs, parse_defense(None), "none")(sim)
    for scale in (1e-4, 1e-7, 1e-12):
        small = [t * scale for t in obs]
        assert torch.allclose(Objective("cosine", small, parse_defense(None), "none")([t * scale for t in sim]),
                              at_one, atol=1e-5)
        assert float(Objective("cosine", small, parse_defense(None), "none")(small)) == pytest.approx(0.0, abs=1e-6)


def test_layer_weights_and_total_variation():
    assert layer_weights(3, "none") == [1.0, 1.0, 1.0]
    assert layer_weights(3, "linear") == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert layer_weights(3, "exp") == pytest.approx(torch.softmax(torch.tensor([3.0, 2.0, 1.0]), 0).tolist())
    flat = torch.full((1, 3, 4, 4), 0.3)
    assert float(total_variation(flat)) == 0.0
    ramp = torch.arange(4.0).view(1, 1, 1, 4).expand(1, 1, 4, 4)  # steps of 1 along x, none along y
    assert float(total_variation(ramp)) == pytest.approx(1.0)
