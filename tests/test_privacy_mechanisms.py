"""leaklab.privacy.mechanisms, .dirichlet and .discrete: calibrations, the Dirichlet mechanism of seed 003
chapter 1, and the exact discrete samplers (empirical distributions against their pmfs)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from leaklab.errors import LeaklabError
from leaklab.privacy import dirichlet as D
from leaklab.privacy import discrete as Q
from leaklab.privacy import mechanisms as M


def test_classic_gaussian_sigma_formula():
    assert M.classic_gaussian_sigma(0.5, 1e-5, 2.0) == pytest.approx(math.sqrt(2 * math.log(1.25e5)) * 4)
    with pytest.raises(LeaklabError):
        M.classic_gaussian_sigma(1.0, 1e-5)


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-6)])
def test_analytic_gaussian_is_the_smallest_sigma(eps, delta):
    s = M.analytic_gaussian_sigma(eps, delta)
    assert M.analytic_gaussian_delta(s, eps) <= delta
    assert M.analytic_gaussian_delta(s * (1 - 1e-6), eps) > delta
    if eps < 1:  # the analytic calibration beats the classic one
        assert s < M.classic_gaussian_sigma(eps, delta)


def test_analytic_gaussian_refuses_a_subnormal_delta():
    """At delta 1e-320 sigma stuck at 37.69 where the exact one is 38.29 (its true delta 4e6 times the claim)."""
    assert M.analytic_gaussian_sigma(1.0, 1e-300) > M.analytic_gaussian_sigma(1.0, 1e-290)
    with pytest.raises(LeaklabError, match="at least 1e-300"):
        M.analytic_gaussian_sigma(1.0, 1e-320)


def test_a_noise_scale_that_overflows_or_a_zero_dirichlet_factor_is_refused():
    """Laplace(1e-320) drew ±inf noise; a Dirichlet scale factor of 0 divided by zero when sampling."""
    from leaklab.privacy.dirichlet import DirichletMechanism

    for make in (lambda: M.LaplaceMechanism(1e-320), lambda: M.LaplaceMechanism(1e-10, sensitivity=1e300),
                 lambda: M.LaplaceMechanism(0.5, scale_factor=1e308),
                 lambda: M.GaussianMechanism(1.0, 1e-5, scale_factor=1e308)):
        with pytest.raises(LeaklabError, match="overflows: no finite noise scale"):
            make()
    with pytest.raises(LeaklabError, match="scale_factor must be a positive number"):
        DirichletMechanism(6.7, 0.15, 0.15, 0.1, 3, scale_factor=0)
    with pytest.raises(LeaklabError, match="no finite concentration"):
        DirichletMechanism(6.7, 0.15, 0.15, 0.1, 3, scale_factor=1e-320)
    # the exponential mechanism has no noise scale: a tiny epsilon is a uniform choice, not an error
    assert M.ExponentialMechanism(1e-320).probabilities([0.0, 1.0, 2.0]) == pytest.approx([1 / 3] * 3)


def test_laplace_and_gaussian_noise_scales():
    rng = np.random.default_rng(0)
    lap = M.LaplaceMechanism(0.5, sensitivity=2.0)
    x = lap.sample(3.0, rng, 200_000)
    assert lap.scale == 4.0 and abs(np.median(x) - 3.0) < 0.05 and abs(np.mean(np.abs(x - 3)) - 4) < 0.05
    g = M.GaussianMechanism(1.0, 1e-5)
    y = g.sample(np.zeros(3), rng, 100_000)
    assert y.shape == (100_000, 3) and abs(y.std() / g.sigma - 1) < 0.01
    assert M.LaplaceMechanism(1.0, scale_factor=0.5).scale == 0.5


def test_exponential_mechanism_probabilities_and_sampling():
    m = M.ExponentialMechanism(2.0, sensitivity=1.0)
    u = np.array([0.0, 1.0, 3.0])
    p = m.probabilities(u)
    expect = np.exp(u) / np.exp(u).sum()  # eps u / (2 sensitivity) = u
    np.testing.assert_allclose(p, expect)
    draws = m.sample(u, np.random.default_rng(1), 100_000)
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / 1e5, expect, atol=0.005)
    assert isinstance(m.sample(u, np.random.default_rng(1)), int)


def test_randomized_response_keeps_with_the_right_probability():
    m = M.RandomizedResponse(1.0, k=4)
    out = m.sample(np.int64(2), np.random.default_rng(2), 200_000)
    freq = np.bincount(out, minlength=4) / out.size
    keep = math.e / (math.e + 3)
    assert freq[2] == pytest.approx(keep, abs=0.004)
    np.testing.assert_allclose(np.delete(freq, 2), (1 - keep) / 3, atol=0.004)
    with pytest.raises(LeaklabError):
        m.sample(np.int64(4), np.random.default_rng(0))
    for k in (math.nan, math.inf, 1e19, 1, 2.5):  # nan, inf and 1e19 were tracebacks (int(), int64 draws)
        with pytest.raises(LeaklabError, match="whole number of categories"):
            M.RandomizedResponse(1.0, k=k)


# ---------------------------------------------------------------- Dirichlet (seed 003 ch. 1)

# Fig. 1.1 settings; the independent recomputation of notes-003 section 1 (Monte Carlo, 2e6 samples)
FIG_1_1 = [(0.15, 6.7, 2.516), (0.20, 5.1, 1.693), (0.25, 4.1, 1.202)]


@pytest.mark.parametrize("eta,k,expected", FIG_1_1)
def test_dirichlet_epsilon_theorem_1_6_matches_the_recomputation(eta, k, expected):
    m = D.DirichletMechanism(k=k, eta=eta, eta_bar=eta, b=0.1, w=3, delta=0.05)
    assert m.epsilon == pytest.approx(expected, abs=0.02)
    assert D.dirichlet_delta(eta, eta, k, 3, m.gamma) <= 0.05 + 1e-9
    # the Lemma 1.7 closed form is a looser (larger) epsilon
    assert D.dirichlet_epsilon_approx(eta, eta, k, 0.1, 3, m.gamma) > m.epsilon


def test_dirichlet_delta_quadrature_agrees_with_monte_carlo():
    eta, k, gamma = 0.2, 5.1, 0.01
    exact = D.dirichlet_delta(eta, eta, k, 3, gamma)
    mc = D.dirichlet_delta(eta, eta, k, 3, gamma, method="montecarlo", samples=200_000,
                           rng=np.random.default_rng(3))
    assert exact == pytest.approx(mc, abs=0.002)
    # two protected coordinates: closed form by inclusion-exclusion is not simple; compare MC as well
    exact2 = D.dirichlet_delta(0.2, 0.3, 6.0, 2, 0.02)
    mc2 = D.dirichlet_delta(0.2, 0.3, 6.0, 2, 0.02, method="montecarlo", samples=200_000,
                            rng=np.random.default_rng(4))
    assert exact2 == pytest.approx(mc2, abs=0.002)


def test_dirichlet_delta_for_eight_protected_entries_agrees_with_monte_carlo():
    """With |W| = 8 the whole 8-fold integral at 8 nodes a level gave delta 0.0500 where 4e6 draws give 0.0506
    (unsafe); inclusion-exclusion's three terms bound it from above within the four-wise term."""
    m = D.DirichletMechanism(10, 0.1, 0.1, 0.1, 8, 0.05)
    vertex = D.dirichlet_vertices(0.1, 0.1, 8)[0]  # (eta, ..., eta): the binding one
    alpha, rest = 10 * vertex, 10 * (1 - vertex.sum())
    rng = np.random.default_rng(0)
    drawn = np.mean([D._dirichlet_prob_mc(alpha, rest, m.gamma, 1_000_000, rng) for _ in range(4)])  # std 1.1e-4
    bound = D.dirichlet_prob_omega1(alpha, rest, m.gamma)
    assert 1 - bound == pytest.approx(0.05, abs=1e-6) and abs(bound - drawn) < 2.5e-4
    assert bound == pytest.approx(D.dirichlet_prob_omega1(alpha, rest, m.gamma, nodes=512), abs=1e-7)


def test_dirichlet_delta_decreases_with_gamma_and_epsilon_with_delta():
    d = [D.dirichlet_delta(0.15, 0.15, 6.7, 3, g) for g in (0.001, 0.003, 0.01)]
    assert d[0] < d[1] < d[2]
    e = [D.dirichlet_epsilon(0.15, 0.15, 6.7, 0.1, 3, g) for g in (0.001, 0.003, 0.01)]
    assert e[0] > e[1] > e[2]


def test_dirichlet_sampling_mean_and_variance_lemma_1_8():
    k = 6.7
    p = np.array([0.2, 0.15, 0.15, 0.5])
    m = D.DirichletMechanism(k=k, eta=0.15, eta_bar=0.15, b=0.1, w=3)
    x = m.sample(p, np.random.default_rng(5), 200_000)
    assert x.shape == (200_000, 4) and np.allclose(x.sum(axis=1), 1)
    np.testing.assert_allclose(x.mean(axis=0), p, atol=0.003)
    np.testing.assert_allclose(x.var(axis=0), p * (1 - p) / (k + 1), rtol=0.02)
    assert np.all(x.var(axis=0) <= 1.02 / (4 * (k + 1)))  # worst case p_i = 1/2


def test_dirichlet_rejects_bad_settings():
    with pytest.raises(LeaklabError):
        D.DirichletMechanism(k=3.0, eta=0.15, eta_bar=0.15, b=0.1, w=3)  # k eta < 1
    with pytest.raises(LeaklabError):
        D.DirichletMechanism(k=6.7, eta=0.3, eta_bar=0.15, b=0.1, w=3)  # empty domain
    with pytest.raises(LeaklabError):
        D.DirichletMechanism(k=6.7, eta=0.15, eta_bar=0.15, b=0.1, w=3).sample(np.array([0.5, 0.5, 0.0]),
                                                                              np.random.default_rng(0))
    with pytest.raises(LeaklabError, match="4 entries or more"):  # |W| = 3 protected entries and the rest
        D.DirichletMechanism(k=6.7, eta=0.15, eta_bar=0.15, b=0.1, w=3).sample(np.array([0.5, 0.5]),
                                                                              np.random.default_rng(0))
    with pytest.raises(LeaklabError, match="no gamma of 1e-12 or more reaches delta = 1e-11"):
        D.dirichlet_gamma(0.15, 0.15, 6.7, 3, 1e-11)
    # outside Def. 1.1's domain the claimed (epsilon, delta) do not hold (here a W entry under gamma 99 % of draws)
    m = D.DirichletMechanism(k=6.7, eta=0.15, eta_bar=0.15, b=0.1, w=3)
    for p in ([0.01, 0.01, 0.01, 0.97], [0.3, 0.3, 0.3, 0.1]):
        with pytest.raises(LeaklabError, match="Def. 1.1"):
            m.sample(np.array(p), np.random.default_rng(0))


def test_mechanisms_refuse_values_their_formulas_cannot_take():
    """The classic Gaussian calibration took a NaN sensitivity (sigma NaN) and a negative one (numpy's error on
    sampling); the exponential mechanism turned epsilon = 1e308 into NaN probabilities."""
    for sensitivity in (math.nan, -1.0):
        with pytest.raises(LeaklabError, match="sensitivity"):
            M.classic_gaussian_sigma(0.5, 1e-5, sensitivity)
    with pytest.raises(LeaklabError, match="overflows"):
        M.ExponentialMechanism(1e308).probabilities([0.0, 10.0])


# ---------------------------------------------------------------- exact discrete samplers


def test_bernoulli_exp_is_exact_in_distribution():
    rng = random.Random(0)
    for gamma in (Fraction(1, 3), Fraction(5, 2)):
        hits = sum(Q.bernoulli_exp(rng, gamma) for _ in range(40_000))
        assert hits / 40_000 == pytest.approx(math.exp(-gamma), abs=0.008)


def _chi_square_p(draws: np.ndarray, pmf: dict[int, float]) -> float:
    support = sorted(pmf)
    observed = np.array([np.sum(draws == y) for y in support], dtype=float)
    expected = np.array([pmf[y] for y in support]) * draws.size
    tail = draws.size - observed.sum()
    observed = np.append(observed, tail)
    expected = np.append(expected, draws.size - expected.sum())
    keep = expected > 5
    return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


def test_discrete_laplace_matches_its_pmf():
    rng = np.random.default_rng(6)  # a numpy Generator works as the source of integers
    scale = Fraction(3, 2)
    draws = np.array([Q.sample_discrete_laplace(rng, scale) for _ in range(20_000)])
    r = math.exp(-1 / 1.5)
    pmf = {y: (1 - r) / (1 + r) * r ** abs(y) for y in range(-12, 13)}
    assert _chi_square_p(draws, pmf) > 1e-3
    assert draws.mean() == pytest.approx(0, abs=0.06)
    assert draws.var() == pytest.approx(2 * r / (1 - r) ** 2, rel=0.05)


def test_discrete_gaussian_matches_its_pmf():
    rng = random.Random(7)
    sigma2 = Fraction(9, 4)
    draws = np.array([Q.sample_discrete_gaussian(rng, sigma2) for _ in range(20_000)])
    ys = np.arange(-40, 41)
    w = np.exp(-ys ** 2 / (2 * 2.25))
    w /= w.sum()
    pmf = {int(y): float(p) for y, p in zip(ys, w) if abs(y) <= 8}
    assert _chi_square_p(draws, pmf) > 1e-3
    assert draws.var() == pytest.approx(float((ys ** 2 * w).sum()), rel=0.05)


def test_rounding_to_the_grid_moves_neighbours_at_most_the_effective_sensitivity():
    from fractions import Fraction

    # ties round up: 0.5 and 1.5 (one unit apart) land one unit apart, as the noise scale assumes
    assert Q._quantize(np.array([0.5, 1.5, -0.5, 2.5]), Fraction(1)).tolist() == [1, 2, 0, 3]
    rng = np.random.default_rng(0)
    g, s = Fraction(1, 4), Fraction(3, 5)
    bound = Q._effective_sensitivity(s, g)
    a = rng.uniform(-5, 5, 2000)
    for b in (a + float(s), a - float(s), a + float(s) / 2):
        moved = np.abs(Q._quantize(a, g) - Q._quantize(b, g)).astype(int)
        assert moved.max() <= bound
    # a vector: every entry's rounding may add a unit (l1 distance 0.6, three units apart on the grid of 1)
    near, far = np.full(3, 0.4), np.full(3, 0.6)
    moved = int(np.abs(Q._quantize(near, Fraction(1)) - Q._quantize(far, Fraction(1))).sum())
    assert moved == 3 == Q._effective_sensitivity(Fraction(1), Fraction(1), entries=3)
    lap = Q.DiscreteLaplaceMechanism(1.0, sensitivity=1, granularity=1)
    spread = np.abs(lap.sample(near, random.Random(0), 4000) - 0.0).mean()
    assert spread == pytest.approx(float(lap.scale) * 3, rel=0.15)  # the noise of a sensitivity of 3 units


def test_discrete_mechanisms_release_integers_or_the_grid():
    lap = Q.DiscreteLaplaceMechanism(1.0, sensitivity=1)
    out = lap.sample(np.array([3, 5]), random.Random(0))
    assert out.dtype == np.int64 and out.shape == (2,)
    assert lap.sample(3, random.Random(0)).shape == ()
    grid = Q.DiscreteLaplaceMechanism(1.0, sensitivity=0.5, granularity=0.25)
    vals = grid.sample(np.array([0.3, 1.0]), random.Random(1), 5)
    assert vals.shape == (5, 2) and np.allclose(np.mod(vals, 0.25), 0)
    with pytest.raises(LeaklabError):
        lap.sample(np.array([0.5]), random.Random(0))
    with pytest.raises(LeaklabError, match="coarser granularity"):
        Q.DiscreteGaussianMechanism(1.0, 1e-5, granularity=1e-6)  # 3.8 GiB for one array, a MemoryError
    g = Q.DiscreteGaussianMechanism(1.0, 1e-5)
    with pytest.raises(LeaklabError, match="one value's"):
        g.sample(np.array([3, 5]), random.Random(0))
    assert g.claimed_delta <= 1e-5
    assert float(g.sigma2) ** 0.5 == pytest.approx(M.analytic_gaussian_sigma(1.0, 1e-5), rel=0.05)
    assert Q.discrete_gaussian_delta(float(g.sigma2) * 0.98, 1.0) > 1e-5
