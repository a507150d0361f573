"""``leaklab plan``: policies for tabular MDPs whose transition probabilities are private (leaklab.planning).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from leaklab.cli.app import _guard, plan_app
from leaklab.cli.options import OutOpt, _checked, _seed_opt


@plan_app.command("private")
@_guard
def plan_private(
    mdp: Annotated[Path, typer.Option("--mdp", help="the MDP as JSON: transitions [S][A][S], rewards [S][A], horizon "
                                                    "(null: infinite), optionally discount, terminal [S], start")],
    k: Annotated[float, typer.Option("--k", help="the Dirichlet mechanism's concentration (larger: less private)",
                                     callback=_checked("--k", lambda v: 0 < v <= 1e6, "a number in (0, 1e6]"))],
    out: OutOpt,
    beta: Annotated[float, typer.Option("--beta", help="the cost bound's failure probability", callback=_checked(
        "--beta", lambda v: 0 < v < 1, "a number in (0, 1)"))] = 0.05,
    union_bound: Annotated[bool, typer.Option(
        "--union-bound", help="bound with the union-bound radius, which holds for every transition vector (Lemma "
                              "2.2's printed radius fails for many small entries at small k)")] = False,
    seed: Annotated[Optional[int], _seed_opt(
        "fix the Dirichlet draws: reproducible, but whoever knows the seed can redraw the release, so NOT private "
        "(default: the operating system's entropy)")] = None,
) -> None:
    """Seed 003, Algorithm 1: privatise the MDP's transitions (Dirichlet mechanism), synthesise an optimal policy of
    the privatised MDP, and bound its cost of privacy (Theorems 2.4 and 2.6)."""
    from leaklab.experiments.private_plan import plan

    result = plan(mdp, out, k, beta, union_bound, seed)
    typer.echo(f"wrote {out / 'results.json'}" + ("" if seed is None else " (seeded: reproducible, not private)"))
    typer.echo(f"  released value at s0 {result['private_value']:.4g}; bounds [{result['lower_value']:.4g}, "
               f"{result['upper_value']:.4g}] on it and on the expected value under the true transitions (beta "
               f"{result['beta']:g}, alpha {result['alpha']:.4g}): cost of privacy at most {result['cost_bound']:.4g}")
