import math

import pytest
import torch

from leaklab.defenses import parse_defense
from leaklab.errors import LeaklabError
from leaklab.threat import ClientUpdate, UpdateMetadata


def update(values):
    return ClientUpdate(metadata=UpdateMetadata(), tensors={"w": values})


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_gaussian_noise_has_the_declared_scale():
    out = parse_defense("gaussian:0.1").apply(update(torch.zeros(200_000)), gen()).tensors["w"]
    assert abs(float(out.std()) - 0.1) < 0.002


def test_laplace_noise_has_the_declared_scale():
    out = parse_defense("laplace:0.1").apply(update(torch.zeros(200_000)), gen()).tensors["w"]
    assert abs(float(out.abs().mean()) - 0.1) < 0.002  # E|X| = b


def test_prune_zeroes_the_declared_fraction():
    out = parse_defense("prune:0.3").apply(update(torch.ones(100_000)), gen()).tensors["w"]
    assert abs(float((out == 0).float().mean()) - 0.3) < 0.01


def test_topk_keeps_the_largest_entries():
    out = parse_defense("topk:0.5").apply(update(torch.tensor([0.1, -3.0, 0.2, 4.0])), gen()).tensors["w"]
    assert out.tolist() == [0.0, -3.0, 0.0, 4.0]


def test_clip_bounds_the_global_norm():
    out = parse_defense("clip:1").apply(update(torch.full((100,), 1.0)), gen()).tensors["w"]
    assert math.isclose(float(out.norm()), 1.0, rel_tol=1e-5)
    # a float16 update's squares overflow float16 (its norm was inf and the update came back all zeros)
    half = parse_defense("clip:1").apply(update(torch.full((100,), 300.0, dtype=torch.float16)), gen()).tensors["w"]
    assert half.dtype == torch.float16 and math.isclose(float(half.float().norm()), 1.0, rel_tol=1e-3)


@pytest.mark.parametrize("spec", ["clip:1,gaussian:0.1", "clip:1,prune:0.5,laplace:0.1"])
def test_a_clipped_likelihood_has_a_gradient_at_a_zero_update(spec):
    """sqrt's gradient at a zero sum of squares was 0/0: every entry of the likelihood's gradient NaN."""
    clean = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    observed = torch.linspace(-0.3, 0.3, 6, dtype=torch.float64)
    parse_defense(spec).log_prob([observed], [clean]).backward()
    assert torch.isfinite(clean.grad).all()


def test_chain_is_seeded_and_records_its_spec():
    chain = parse_defense("prune:0.5,gaussian:0.1")
    a = chain.apply(update(torch.ones(50)), gen(3))
    b = chain.apply(update(torch.ones(50)), gen(3))
    assert torch.equal(a.tensors["w"], b.tensors["w"])
    assert a.defense == "prune:0.5,gaussian:0.1"


@pytest.mark.parametrize("spec", ["gaussian:0.1", "laplace:0.2", "prune:0.5,gaussian:0.1",
                                  "prune:0.5,laplace:0.1", "clip:1,gaussian:0.3"])
def test_log_prob_matches_a_direct_density(spec):
    chain = parse_defense(spec)
    g = gen(1)
    clean = torch.randn(300, generator=g).requires_grad_()
    observed = chain.apply(update(clean.detach()), g).tensors["w"]
    mine = chain.log_prob([observed], [clean])
    p, det, noise = 0.0, clean, chain.steps[-1]
    for step in chain.steps[:-1]:
        if step.name == "prune":
            p = step.p
        else:
            det = step.apply([det])[0]
    if noise.name == "gaussian":
        dist = torch.distributions.Normal(0.0, noise.sigma)
    else:
        dist = torch.distributions.Laplace(0.0, noise.b)
    kept = math.log1p(-p) + dist.log_prob(observed - det) if p else dist.log_prob(observed - det)
    ref = torch.logaddexp(kept, math.log(p) + dist.log_prob(observed)) if p else kept
    ref = ref.sum()
    assert torch.allclose(mine, ref, rtol=1e-5)
    (g_mine,) = torch.autograd.grad(mine, clean)
    (g_ref,) = torch.autograd.grad(ref, clean)
    assert torch.allclose(g_mine, g_ref, rtol=1e-4, atol=1e-4)


def test_chains_without_density_refuse_log_prob():
    with pytest.raises(LeaklabError, match="no density"):
        parse_defense("prune:0.5").log_prob([torch.zeros(3)], [torch.zeros(3)])


@pytest.mark.parametrize("bad", ["noise:0.1", "gaussian", "gaussian:abc", "prune:1.5", "gaussian:-1"])
def test_bad_defense_specs_are_clear_errors(bad):
    with pytest.raises(LeaklabError):
        parse_defense(bad)


def test_the_recorded_spec_reads_back_as_exactly_what_was_applied():
    chain = parse_defense("clip:1.2345678901,gaussian:0.0123456789,laplace:3e-07")
    assert chain.spec == "clip:1.2345678901,gaussian:0.0123456789,laplace:3e-07"
    assert parse_defense(chain.spec).spec == chain.spec
