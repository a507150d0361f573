"""`leaklab mechanisms`: the Dirichlet epsilon and the audit, text and --json, and user errors
(one `error:` line, exit code 2)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_user_error, invoke


def test_epsilon_dirichlet_json_and_text():
    args = ["mechanisms", "epsilon", "dirichlet", "--eta", "0.15", "--eta-bar", "0.15", "--k", "6.7",
            "--b", "0.1", "--w", "3", "--delta", "0.05"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["epsilon"] == pytest.approx(2.516, abs=0.02)
    assert data["epsilon_approx"] > data["epsilon"] and 0 < data["gamma"] < 1 / 3
    text = invoke(*args)
    assert text.exit_code == 0 and "epsilon 2.51" in text.stdout and not data["vacuous"]
    # the thesis's eta = 0.25 panel: 3 * 0.25 = 1 - 0.25, its domain is one point and no two inputs are adjacent
    vacuous = invoke("mechanisms", "epsilon", "dirichlet", "--eta", "0.25", "--eta-bar", "0.25", "--k", "4.1", "--w", "3")
    assert vacuous.exit_code == 0 and "vacuous: the domain is one point" in vacuous.stdout
    # adjacency is ||p - q||_1 <= b (Def. 1.1): inputs 0.03 apart fit where b/2 = 0.05 does not (once called vacuous)
    narrow = invoke("mechanisms", "epsilon", "dirichlet", "--eta", "0.24", "--eta-bar", "0.25", "--k", "4.2", "--json")
    assert narrow.exit_code == 0 and json.loads(narrow.stdout)["vacuous"] is False
    # nor does a tiny b make a wide domain one point (it was called so at b = 1e-12)
    tiny = invoke("mechanisms", "epsilon", "dirichlet", "--eta", "0.1", "--eta-bar", "0.1", "--k", "10", "--w", "2",
                  "--b", "1e-12", "--json")
    assert tiny.exit_code == 0 and json.loads(tiny.stdout)["vacuous"] is False


def test_audit_laplace_json():
    result = invoke("mechanisms", "audit", "--mechanism", "laplace", "--epsilon", "1", "--runs", "100000",
                    "--seed", "0", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["claimed_epsilon"] == 1.0
    assert 0.6 <= data["epsilon_lower_bound"] <= 1.0
    assert data["confidence"] == 0.95 and data["violated"] is False


def test_audit_broken_text_says_violated():
    result = invoke("mechanisms", "audit", "--mechanism", "Randomized_Response", "--epsilon", "1",
                    "--runs", "20000", "--broken")
    assert result.exit_code == 0, result.output
    assert "VIOLATED" in result.stdout and "claimed epsilon 1" in result.stdout
    # a name in any case, with _ for -, or rr, is the mechanism's own name
    assert result.stdout.startswith("randomized-response (broken): ")


def test_audit_dirichlet_json():
    result = invoke("mechanisms", "audit", "--mechanism", "dirichlet", "--k", "5.1", "--eta", "0.2",
                    "--eta-bar", "0.2", "--runs", "20000", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["claimed_epsilon"] == pytest.approx(1.693, abs=0.02)
    assert data["epsilon_lower_bound"] <= data["claimed_epsilon"]


@pytest.mark.parametrize("args,words", [
    (["audit", "--mechanism", "snapping", "--epsilon", "1"], ["invalid --mechanism", "dpsgd"]),
    (["audit", "--mechanism", "laplace", "--epsilon", "1", "--canaries", "10"], ["--canaries", "dpsgd"]),
    (["audit", "--mechanism", "laplace"], ["--epsilon"]),
    (["audit", "--mechanism", "laplace", "--epsilon", "-1"], ["--epsilon"]),
    (["audit", "--mechanism", "laplace", "--epsilon", "1", "--eta", "0.1"], ["--eta", "dirichlet"]),
    (["audit", "--mechanism", "dirichlet", "--epsilon", "1"], ["leave out --epsilon"]),
    (["epsilon", "dirichlet", "--eta", "0.4", "--eta-bar", "0.3", "--k", "6"], ["domain"]),
    (["epsilon", "dirichlet", "--eta", "0.15", "--eta-bar", "0.15", "--k", "6.7", "--delta", "1.5"], ["delta"]),
    (["epsilon", "dirichlet", "--eta", "0.15", "--eta-bar", "0.15", "--k", "3"], ["k * min"]),
])
def test_user_errors(args, words):
    assert_user_error(invoke("mechanisms", *args), None, *words)


def test_audit_scan_test_option():
    result = invoke("mechanisms", "audit", "--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-5",
                    "--runs", "20000", "--test", "scan", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["test"] == "scan" and data["claimed_delta"] == 1e-5
    assert data["epsilon_lower_bound"] <= 1.0
    assert_user_error(invoke("mechanisms", "audit", "--mechanism", "gaussian", "--epsilon", "1", "--test", "x"), None,
                      "invalid --test")


ACCOUNT = ["mechanisms", "account", "dpsgd", "--q", "0.01", "--sigma", "1.1", "--steps", "1000", "--delta", "1e-5"]


def test_account_dpsgd_json_and_text():
    result = invoke(*ACCOUNT, "--accountant", "pld", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["epsilon"] == pytest.approx(1.515, abs=0.015)
    inputs = (data["accountant"], data["q"], data["sigma"], data["steps"], data["delta"])
    assert inputs == ("pld", 0.01, 1.1, 1000, 1e-5)
    text = invoke(*ACCOUNT, "--accountant", "RDP")
    assert text.exit_code == 0 and "epsilon 1.71" in text.stdout and "rdp" in text.stdout


@pytest.mark.parametrize("option,value,word", [
    ("--q", "0", "q"), ("--q", "1.5", "q"), ("--sigma", "0", "sigma"), ("--sigma", "-1", "sigma"),
    ("--steps", "0", "steps"), ("--delta", "1", "delta"), ("--delta", "0", "delta"),
    ("--accountant", "gdp", "accountant"),
])
def test_account_dpsgd_user_errors(option, value, word):
    args = list(ACCOUNT)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    assert_user_error(invoke(*args), None, word)


AUDIT_DPSGD = ["mechanisms", "audit", "--mechanism", "dpsgd", "--q", "1", "--sigma", "1", "--steps", "5",
               "--runs", "4", "--canaries", "200"]


def test_audit_dpsgd_json_and_text():
    from leaklab.privacy.accounting import dpsgd_epsilon

    result = invoke(*AUDIT_DPSGD, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["claimed_epsilon"] == pytest.approx(dpsgd_epsilon(1.0, 1.0, 5, 1e-5))
    assert 0 < data["epsilon_lower_bound"] <= data["claimed_epsilon"] and data["confidence"] == 0.95
    assert data["training_runs"] == 4 and data["runs"] == 4 * 100 and data["trained_noise_multiplier"] == 1.0
    text = invoke(*AUDIT_DPSGD, "--broken")
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("dpsgd (broken): claimed epsilon 11.")
    assert "from 400 canary scores per side (4 training runs of 200 canaries)" in text.stdout
    args = list(AUDIT_DPSGD)  # q = 0.7 of 200 canaries trains at 0.5: the line says so beside the claim
    args[args.index("--q") + 1] = "0.7"
    text = invoke(*args)
    assert text.stdout.startswith("dpsgd at sampling rate 0.5 (asked 0.7; 200 canaries): claimed epsilon"), text.stdout


@pytest.mark.parametrize("extra,word", [
    (["--q", "2"], "sampling rate"), (["--sigma", "0"], "noise multiplier"), (["--steps", "0"], "steps"),
    (["--canaries", "7"], "even number"), (["--runs", "0"], "at least one run"), (["--epsilon", "1"], "--epsilon"),
    (["--k", "3"], "--k"),
])
def test_audit_dpsgd_user_errors(extra, word):
    args = list(AUDIT_DPSGD)
    if extra[0] in args:
        args[args.index(extra[0]) + 1] = extra[1]
    else:
        args += extra
    assert_user_error(invoke(*args), None, word)


def test_audit_dpsgd_options_belong_to_dpsgd():
    assert_user_error(invoke("mechanisms", "audit", "--mechanism", "dpsgd", "--q", "0.1", "--steps", "5"), None,
                      "--sigma")
    assert_user_error(invoke("mechanisms", "audit", "--mechanism", "laplace", "--epsilon", "1", "--q", "0.1"), None,
                      "--q", "dpsgd")
    assert_user_error(invoke("mechanisms", "audit", "--mechanism", "laplace", "--epsilon", "1", "--accountant",
                             "rdp"), None, "--accountant", "dpsgd")


def test_audit_dpsgd_takes_the_accountant_its_error_names():
    """Under sigma 0.05 the default prv accountant refuses and names rdp, which `mechanisms audit` now takes."""
    from leaklab.privacy.accounting import dpsgd_epsilon

    small = [*AUDIT_DPSGD[:7], "0.01", *AUDIT_DPSGD[8:]]
    assert_user_error(invoke(*small), None, "rdp")
    result = invoke(*small, "--accountant", "rdp", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["accountant"] == "rdp" and data["claimed_epsilon"] == pytest.approx(dpsgd_epsilon(1.0, 0.01, 5, 1e-5,
                                                                                                  "rdp"))


def test_running_out_of_memory_is_one_line(monkeypatch):
    from leaklab.privacy import dirichlet

    def allocate(**_):
        raise MemoryError("Unable to allocate 999. MiB for an array with shape (16374696, 8)")
    monkeypatch.setattr(dirichlet, "DirichletMechanism", allocate)
    result = invoke("mechanisms", "epsilon", "dirichlet", "--eta", "0.1", "--eta-bar", "0.1", "--k", "7")
    assert_user_error(result, None, "out of memory (Unable to allocate 999. MiB", "nothing is left half-written")


@pytest.mark.parametrize("args, words", [
    # allocations of 84 GiB, 745 GiB and a division by zero, all tracebacks before
    (["account", "dpsgd", "--q", "0.01", "--sigma", "1e-3", "--steps", "10"], ["grows as sigma shrinks", "rdp"]),
    # an overflow and a division by zero in every accountant; a math domain error (and minutes at k = 1e12)
    (["account", "dpsgd", "--q", "0.01", "--sigma", "1e300", "--steps", "10"], ["sigma must lie in [1e-06, 1e+06]"]),
    (["account", "dpsgd", "--q", "0.01", "--sigma", "1e-300", "--steps", "10", "--accountant", "rdp"],
     ["sigma must lie in"]),
    (["epsilon", "dirichlet", "--eta", "0.15", "--eta-bar", "0.15", "--k", "1e300"], ["k must be at most 1e+06"]),
    # |W| = 11 allocated 56 GB (a MemoryError's traceback), 10 ran an hour
    (["epsilon", "dirichlet", "--eta", "0.04", "--eta-bar", "0.1", "--k", "25", "--w", "11"], ["|W| must be", "to 8"]),
    (["audit", "--mechanism", "laplace", "--epsilon", "1", "--runs", "100000000000"], ["--runs must be from 4"]),
    (["audit", "--mechanism", "dpsgd", "--q", "0.5", "--sigma", "1", "--steps", "2", "--runs", "2", "--canaries", "0"],
     ["even number of canaries"]),
    (["audit", "--mechanism", "dpsgd", "--q", "0.5", "--sigma", "1", "--steps", "2", "--runs", "2",
      "--canaries", "-2"], ["canaries", "(got -2)"]),
    # options a mechanism has no use for were ignored (--delta, --k) or refused with bad grammar (--eta)
    (["audit", "--mechanism", "laplace", "--epsilon", "1", "--eta", "0.1"], ["--eta: not an option of the laplace"]),
    (["audit", "--mechanism", "laplace", "--epsilon", "1", "--delta", "0.5"], ["--delta: not an option"]),
    (["audit", "--mechanism", "exponential", "--epsilon", "1", "--k", "3"], ["--k: not an option"]),
])
def test_sizes_that_cannot_run_are_one_line(args, words):
    assert_user_error(invoke("mechanisms", *args), None, *words)


def test_the_canary_audit_says_what_it_counted():
    result = invoke("mechanisms", "audit", "--mechanism", "dpsgd", "--q", "0.01", "--sigma", "1", "--steps", "2",
                    "--runs", "2", "--canaries", "10")
    assert result.exit_code == 0, result.output
    assert "from 10 canary scores per side (2 training runs of 10 canaries)" in result.stdout
    assert "batch is empty" not in result.output  # opacus' note on the empty Poisson batches it draws by design
