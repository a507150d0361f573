"""``leaklab plan private``: seed 003 chapter 2's Algorithm 1 on a user's own MDP.

The MDP is read from a JSON file (:meth:`~leaklab.planning.mdp.TabularMDP.to_json`'s form, validated); its
transition probabilities are privatised with the Dirichlet mechanism at concentration ``k``, an optimal policy of
the privatised MDP is synthesised and evaluated there, and the cost of privacy is bounded (Theorems 2.4 and 2.6).
``OUT/results.json`` holds only what Algorithm 1 releases and what is computed from it: the privatised
transitions, the policy, its value under them and the two bounds; never the true transitions. The Dirichlet draws
come from the operating system's entropy unless a seed is given: whoever knows a seed can redraw the release from
a candidate MDP and tell it apart from its neighbours, so a seeded plan is reproducible and not private.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from leaklab import seeds
from leaklab.io import PRIVATE_PLAN_FORMAT, RESULTS_FILE, atomic_dir, check_out, read_json, write_json
from leaklab.planning.mdp import TabularMDP
from leaklab.planning.private_synthesis import synthesize_private_policy


def plan(mdp_file: Path, out: Path, k: float, beta: float = 0.05, union_bound: bool = False,
         seed: int | None = None) -> dict:
    """Algorithm 1 on the MDP in ``mdp_file`` (draws from the OS's entropy, or from ``seed``: reproducible, not
    private); writes ``out`` atomically and returns the results (also ``results.json``)."""
    check_out(out, PRIVATE_PLAN_FORMAT, [mdp_file])
    mdp = TabularMDP.from_json(read_json(mdp_file, "MDP"))
    rng = np.random.default_rng(None if seed is None else seeds.stream_seed(seed, "private-plan"))
    found = synthesize_private_policy(mdp, k, rng, beta, union_bound)
    results = {"format": PRIVATE_PLAN_FORMAT, "format_version": 1, "mdp_file": str(mdp_file), "k": found.k,
               "beta": found.beta, "union_bound": union_bound, "alpha": found.alpha, "seed": seed,
               "private": seed is None,
               "horizon": mdp.horizon, "discount": mdp.discount, "start": mdp.start,
               "policy": found.policy.tolist(), "values": found.values.tolist(), "lower": found.lower.tolist(),
               "upper": found.upper.tolist(), "private_value": found.private_value,
               "lower_value": found.at_start(found.lower), "upper_value": found.at_start(found.upper),
               "cost_bound": found.cost_bound, "private_transitions": found.private_mdp.transitions.tolist()}
    with atomic_dir(out, PRIVATE_PLAN_FORMAT, inputs=[mdp_file]) as tmp:
        write_json(tmp / RESULTS_FILE, results)
    return results
