"""leaklab.privacy.accounting against dp-accounting, and the shape of epsilon(sigma)."""

from __future__ import annotations

import dp_accounting as dpa
import pytest
from dp_accounting import pld, rdp

from leaklab.errors import LeaklabError
from leaklab.names import ACCOUNTANT_NAMES
from leaklab.privacy import accounting as acc
from leaklab.privacy.mechanisms import GaussianMechanism, LaplaceMechanism, analytic_gaussian_sigma

Q, SIGMA, STEPS, DELTA = 0.01, 1.1, 1000, 1e-5


def _reference(accountant) -> float:
    """dp-accounting itself, on the DP-SGD event built here (not by leaklab)."""
    accountant.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), STEPS))
    return accountant.get_epsilon(DELTA)


def test_dpsgd_epsilon_matches_dp_accounting_to_one_percent():
    ref_pld, ref_rdp = _reference(pld.PLDAccountant()), _reference(rdp.RdpAccountant())
    assert ref_pld == pytest.approx(1.515, abs=0.01)  # the acceptance setting of issue 3
    assert acc.dpsgd_epsilon(Q, SIGMA, STEPS, DELTA) == pytest.approx(ref_pld, rel=0.01)  # default: opacus PRV
    assert acc.dpsgd_epsilon(Q, SIGMA, STEPS, DELTA, "pld") == pytest.approx(ref_pld, rel=1e-6)
    assert acc.dpsgd_epsilon(Q, SIGMA, STEPS, DELTA, "rdp") == pytest.approx(ref_rdp, rel=0.01)  # opacus RDP


def test_notes_003_recomputation_of_the_pe_marl_epsilon():
    # notes-003 section 4.5: opacus RDP after 1024 steps at q = 32/1024, sigma 0.8 gives "about 9.2"
    assert acc.dpsgd_epsilon(32 / 1024, 0.8, 1024, 4.88e-4, "rdp") == pytest.approx(9.2, abs=0.05)


def test_accountants_agree_loosely_and_rdp_is_an_upper_bound():
    eps = {name: acc.dpsgd_epsilon(0.05, 1.0, 100, DELTA, name) for name in ACCOUNTANT_NAMES}
    assert eps["prv"] == pytest.approx(eps["pld"], rel=0.03)
    assert eps["pld"] <= eps["rdp"] <= 1.25 * eps["pld"]


def test_epsilon_is_never_negative():
    # at a large delta RDP's and PRV's conversions dip below 0 (-3.17 and -4.50 here before the clamp): a guarantee
    # at a negative epsilon is the one at 0, and an audit must not call a mechanism that keeps it violated
    for name in ACCOUNTANT_NAMES:
        assert acc.dpsgd_epsilon(0.1, 1.0, 10, 0.99, name) == 0.0
    # nor infinite: pld's grid resolves no delta this small (it said inf), rdp does
    with pytest.raises(LeaklabError, match="no finite epsilon.*use the rdp accountant"):
        acc.dpsgd_epsilon(0.01, 1.0, 1, 1e-16, "pld")
    assert 3 < acc.dpsgd_epsilon(0.01, 1.0, 1, 1e-16, "rdp") < 4
    # the search for the noise still finds the smallest that reaches a positive target there
    sigma = acc.dpsgd_sigma(0.1, 10, 0.01, 0.5, "rdp")
    assert acc.dpsgd_epsilon(0.1, sigma, 10, 0.5, "rdp") <= 0.01 < acc.dpsgd_epsilon(0.1, sigma * 0.99, 10, 0.5, "rdp")


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_epsilon_decreases_with_sigma_and_grows_with_steps(accountant):
    by_sigma = [acc.dpsgd_epsilon(0.05, s, 50, DELTA, accountant) for s in (0.7, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    assert acc.dpsgd_epsilon(0.05, 1.0, 100, DELTA, accountant) > acc.dpsgd_epsilon(0.05, 1.0, 50, DELTA, accountant)


def test_sigma_for_a_target_epsilon_inverts_epsilon():
    sigma = acc.dpsgd_sigma(0.05, 50, 2.0, DELTA, "rdp")
    assert acc.dpsgd_epsilon(0.05, sigma, 50, DELTA, "rdp") <= 2.0
    assert acc.dpsgd_epsilon(0.05, sigma * 0.995, 50, DELTA, "rdp") > 2.0
    # a target under RDP's floor (its orders stop at 63) is the accountant's limit, not the noise's: say so
    with pytest.raises(LeaklabError, match=r"rdp accountant's epsilon stays at 0\.1\d* or more .* use the pld or prv"):
        acc.dpsgd_sigma(0.5, 3, 0.05, DELTA, "rdp")
    assert 40 < acc.dpsgd_sigma(0.5, 3, 0.05, DELTA, "pld") < 60


def test_single_gaussian_release_is_the_analytic_gaussian():
    # q = 1, one step: the Gaussian mechanism, whose exact calibration is Balle & Wang's
    assert acc.dpsgd_sigma(1.0, 1, 3.0, DELTA, "pld") == pytest.approx(analytic_gaussian_sigma(3.0, DELTA), rel=2e-3)


def test_ledger_composes_mechanisms():
    # pure epsilon-DP Laplace uses add up exactly under composition (PLD is tight on them)
    ledger = acc.Ledger().spend(LaplaceMechanism(1.0)).spend(LaplaceMechanism(0.5, sensitivity=2.0))
    assert ledger.epsilon(DELTA, "pld") == pytest.approx(1.5, abs=0.01)
    one = acc.compose([acc.gaussian(GaussianMechanism(1.0, DELTA).sigma)], DELTA)
    assert one == pytest.approx(1.0, abs=0.01)
    # four Gaussian releases of sigma compose exactly into one of sigma / 2 (Dong, Roth & Su, Cor. 3.3),
    # which costs much less than the sum 4 of the four epsilons
    sigma = GaussianMechanism(1.0, DELTA).sigma
    four = acc.Ledger().spend(GaussianMechanism(1.0, DELTA), count=4).epsilon(DELTA)
    assert four == pytest.approx(acc.compose([acc.gaussian(sigma / 2)], DELTA), rel=1e-3)
    assert four < 3.0
    assert acc.compose([], DELTA) == 0.0


@pytest.mark.parametrize("call,word", [
    (lambda: acc.dpsgd_epsilon(0.0, 1.0, 10, DELTA), "q"),
    (lambda: acc.dpsgd_epsilon(1.5, 1.0, 10, DELTA), "q"),
    (lambda: acc.dpsgd_epsilon(0.1, 0.0, 10, DELTA), "sigma"),
    (lambda: acc.dpsgd_epsilon(0.1, 1.0, 0, DELTA), "steps"),
    (lambda: acc.dpsgd_epsilon(0.1, 1.0, 10, 1.0), "delta"),
    (lambda: acc.dpsgd_epsilon(0.1, 1.0, 10, DELTA, "gdp"), "accountant"),
    (lambda: acc.compose([acc.gaussian(1.0)], DELTA, "prv"), "accountant"),
    (lambda: acc.dpsgd_sigma(0.1, 10, -1.0, DELTA), "epsilon"),
    (lambda: acc.Ledger().spend(object()), "Laplace"),
    # the events' builders: read as q = 1 and 2 releases, or a ZeroDivisionError and a bare ValueError
    (lambda: acc.subsampled_gaussian(1.5, 1.0), "sampling rate"), (lambda: acc.gaussian(1.0, count=2.7), "count"),
    (lambda: acc.gaussian(1.0, count=0), "count"), (lambda: acc.gaussian(float("nan")), "noise multiplier"),
    (lambda: acc.laplace(0.0), "noise multiplier"),
    # pld past its grid's sizes raised OverflowError / ValueError tracebacks; prv's advice named pld
    (lambda: acc.dpsgd_epsilon(0.01, 1.0, 10**20, DELTA, "pld"), "pld accountant cannot compose.*use the rdp"),
    (lambda: acc.dpsgd_epsilon(0.01, 1.0, 2**63 - 1, DELTA, "pld"), "pld accountant cannot compose.*use the rdp"),
    (lambda: acc.dpsgd_epsilon(0.01, 1.0, 10**20, DELTA, "prv"), "prv accountant fails.*use the rdp"),
])
def test_user_errors(call, word):
    with pytest.raises(LeaklabError, match=word):
        call()
