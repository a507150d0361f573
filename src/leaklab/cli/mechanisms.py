"""``leaklab mechanisms``: differential-privacy mechanisms' epsilon, DP-SGD accounting and empirical
audits (leaklab.privacy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from leaklab.cli.app import _guard, mechanisms_account_app, mechanisms_app, mechanisms_epsilon_app
from leaklab.cli.options import SeedOpt, _choice
from leaklab.errors import LeaklabError
from leaklab.names import ACCOUNTANT_NAMES, AUDIT_TEST_NAMES, MECHANISM_ALIASES, MECHANISM_NAMES
from leaklab.words import plural


JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object on stdout (for scripts)")]


def _answer(payload: dict, as_json: bool, text: Callable[[], str]) -> None:
    """A command's answer: ``payload`` as one JSON object with ``--json`` (for scripts), else ``text()``."""
    import json

    typer.echo(json.dumps(payload, indent=2, sort_keys=True) if as_json else text())


@mechanisms_epsilon_app.command("dirichlet")
@_guard
def mechanisms_epsilon_dirichlet(
    eta: Annotated[float, typer.Option("--eta", help="lower bound on every protected entry p_i, i in W")],
    eta_bar: Annotated[float, typer.Option("--eta-bar", help="mass kept outside W: sum_W p_i <= 1 - eta_bar")],
    k: Annotated[float, typer.Option("--k", help="concentration: the output is Dirichlet(k p)")],
    b: Annotated[float, typer.Option("--b", help="adjacency: ||p - q||_1 <= b")] = 0.1,
    w: Annotated[int, typer.Option("--w", help="|W|, the number of protected entries")] = 3,
    delta: Annotated[float, typer.Option("--delta", help="target delta")] = 0.05,
    as_json: JsonOpt = False,
) -> None:
    """Epsilon of the Dirichlet mechanism (seed 003, Theorem 1.6) at a target delta."""
    from leaklab.privacy.dirichlet import DirichletMechanism, adjacent_spread, dirichlet_epsilon_approx

    m = DirichletMechanism(k=k, eta=eta, eta_bar=eta_bar, b=b, w=w, delta=delta)
    approx = dirichlet_epsilon_approx(eta, eta_bar, k, b, w, m.gamma)
    # a domain of one point has no two adjacent inputs: the claim holds vacuously (mechanisms audit refuses it)
    vacuous = not adjacent_spread(eta, eta_bar, b, w)
    payload = {"mechanism": "dirichlet", "k": k, "eta": eta, "eta_bar": eta_bar, "b": b, "w": w,
               "delta": delta, "gamma": m.gamma, "epsilon": m.epsilon, "epsilon_approx": approx, "vacuous": vacuous}
    note = "; vacuous: the domain is one point, |W| eta = 1 - eta_bar, no two inputs adjacent" if vacuous else ""
    _answer(payload, as_json, lambda: f"Dirichlet mechanism k={k:g}, eta={eta:g}, eta_bar={eta_bar:g}, b={b:g}, "
                                      f"|W|={w}: epsilon {m.epsilon:.4f} at delta {delta:g} (gamma {m.gamma:.5g}; "
                                      f"Lemma 1.7 bound {approx:.4f}{note})")


@mechanisms_account_app.command("dpsgd")
@_guard
def mechanisms_account_dpsgd(
    q: Annotated[float, typer.Option("--q", help="sampling rate (expected batch size / dataset size), in (0, 1]")],
    sigma: Annotated[float, typer.Option("--sigma", help="noise multiplier: noise std / clipping norm")],
    steps: Annotated[int, typer.Option("--steps", help="DP-SGD steps")],
    delta: Annotated[float, typer.Option("--delta", help="target delta, in (0, 1)")] = 1e-5,
    accountant: Annotated[str, _choice("--accountant", ACCOUNTANT_NAMES,
                                       "(rdp, prv: opacus' accountants; pld: dp-accounting's)")] = "prv",
    as_json: JsonOpt = False,
) -> None:
    """Epsilon spent by DP-SGD (Poisson-subsampled Gaussian mechanism, composed over the steps)."""
    from leaklab.privacy.accounting import dpsgd_epsilon

    epsilon = dpsgd_epsilon(q, sigma, steps, delta, accountant)
    payload = {"mechanism": "dpsgd", "q": q, "sigma": sigma, "steps": steps, "delta": delta,
               "accountant": accountant, "epsilon": epsilon}
    _answer(payload, as_json, lambda: f"DP-SGD q={q:g}, sigma={sigma:g}, {plural(steps, 'step')}: epsilon "
                                      f"{epsilon:.4f} at delta {delta:g} ({accountant} accountant)")


@mechanisms_app.command("audit")
@_guard
def mechanisms_audit(
    mechanism: Annotated[str, _choice("--mechanism", (*MECHANISM_NAMES, "dpsgd"), aliases=MECHANISM_ALIASES)],
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="claimed epsilon (not for dirichlet, "
                                                     "whose follows from --k ..., nor dpsgd, from --q ...)")] = None,
    delta: Annotated[Optional[float], typer.Option("--delta", help="claimed delta (gaussian 1e-5, "
                                                   "dirichlet 0.05, dpsgd 1e-5)")] = None,
    runs: Annotated[Optional[int], typer.Option("--runs", help="runs on each of the two inputs (100000); "
                                                "dpsgd: training runs (10)")] = None,
    seed: SeedOpt = 0,
    confidence: Annotated[float, typer.Option("--confidence", help="of the lower bound")] = 0.95,
    test: Annotated[str, _choice("--test", AUDIT_TEST_NAMES, "(split: threshold chosen on half the runs; scan: "
                                 "all thresholds, Bonferroni-corrected)")] = "split",
    broken: Annotated[bool, typer.Option("--broken", help="halve the noise scale, keep the claim (the audit "
                                         "should catch it; dirichlet's doubled k stays within its loose "
                                         "claim)")] = False,
    k: Annotated[Optional[float], typer.Option("--k", help="dirichlet concentration (6.7) or "
                                               "randomized-response categories (4)")] = None,
    eta: Annotated[Optional[float], typer.Option("--eta", help="dirichlet (0.15)")] = None,
    eta_bar: Annotated[Optional[float], typer.Option("--eta-bar", help="dirichlet (0.15)")] = None,
    b: Annotated[Optional[float], typer.Option("--b", help="dirichlet (0.1)")] = None,
    w: Annotated[Optional[int], typer.Option("--w", help="dirichlet (3)")] = None,
    q: Annotated[Optional[float], typer.Option("--q", help="dpsgd sampling rate, in (0, 1]")] = None,
    sigma: Annotated[Optional[float], typer.Option("--sigma", help="dpsgd noise multiplier")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="dpsgd training steps")] = None,
    canaries: Annotated[Optional[int], typer.Option("--canaries", help="dpsgd gradient canaries per "
                                                    "training run (even; default 1000)")] = None,
    accountant: Annotated[Optional[str], _choice("--accountant", ACCOUNTANT_NAMES,
                                                 "(dpsgd) the claim's accountant; default prv")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Empirical lower bound on epsilon (Clopper-Pearson) from runs on two neighbouring inputs.

    dpsgd: from gradient canaries in opacus DP-SGD trainings."""
    from leaklab.privacy.audit import audit, audit_case, audit_dpsgd

    dpsgd = {"--q": q, "--sigma": sigma, "--steps": steps, "--canaries": canaries, "--accountant": accountant}
    if mechanism == "dpsgd":
        others = {"--epsilon": epsilon, "--k": k, "--eta": eta, "--eta-bar": eta_bar, "--b": b, "--w": w}
        if any(v is not None for v in others.values()):
            given = ", ".join(o for o, v in others.items() if v is not None)
            raise LeaklabError(f"--mechanism dpsgd takes no {given}: its epsilon follows from --q, --sigma, "
                               "--steps, --delta and --accountant")
        missing = [o for o, v in dpsgd.items() if v is None and o not in ("--canaries", "--accountant")]
        if missing:
            raise LeaklabError(f"--mechanism dpsgd needs {', '.join(missing)}")
        result = audit_dpsgd(q, sigma, steps, 1e-5 if delta is None else delta,
                             canaries=1000 if canaries is None else canaries,
                             runs=10 if runs is None else runs, seed=seed, confidence=confidence, test=test,
                             broken=broken, accountant=accountant)
    else:
        if any(v is not None for v in dpsgd.values()):
            raise LeaklabError(f"{', '.join(o for o, v in dpsgd.items() if v is not None)}: only for "
                               "--mechanism dpsgd")
        case = audit_case(mechanism, epsilon, broken=broken, delta=delta, eta=eta, eta_bar=eta_bar, b=b, w=w, k=k)
        result = audit(case, runs=100_000 if runs is None else runs, seed=seed, confidence=confidence, test=test)
    payload = result.to_dict()
    payload["broken"] = broken
    _answer(payload, as_json, lambda: _audit_line(result, payload))


def _audit_line(result: Any, payload: dict[str, Any]) -> str:
    """One line of an audit's result (``payload``: its ``--json`` form): the claim, the audited lower bound
    and the verdict."""
    verdict = "VIOLATED" if payload["violated"] else "consistent"
    d = result.details
    source = (f"{result.runs} canary scores per side ({plural(d['training_runs'], 'training run')} of "
              f"{d['canaries']} canaries)") if result.mechanism == "dpsgd" else f"{result.runs} runs per input"
    qualifier = " (broken)" if payload["broken"] else ""
    if result.mechanism == "dpsgd" and d["sample_rate"] != d["q"]:  # the claim is at the rate the trainings realise
        qualifier += f" at sampling rate {d['sample_rate']:.4g} (asked {d['q']:g}; {d['canaries']} canaries)"
    return (f"{result.mechanism}{qualifier}: claimed epsilon {result.claimed_epsilon:.4g} "
            f"(delta {result.claimed_delta:g}); audited lower bound {result.epsilon_lower_bound:.4f} "
            f"at confidence {result.confidence:g} from {source}: {verdict}")
