"""Seed 002, chapter 5: the genetic search for a policy's floor plan (Pan et al.'s attack as the thesis reproduces
it), the masked Adam of the batched DQN, and ``leaklab reproduce dp-drl``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from leaklab.attacks.environment_search import SearchConfig, fitness, policy_table, recovery_rates, search
from leaklab.experiments.dp_drl_table import stages
from leaklab.rl.agents.grid_dqn import StackedMLP, _MaskedAdam
from leaklab.rl.envs.grid_world import (NEIGHBOURS, GridMap, distances, observations, optimal_actions, random_map,
                                        violations)

CODE_WEIGHTS = 1 << np.arange(len(NEIGHBOURS))


def _oracle_table(grid: GridMap) -> np.ndarray:
    """A policy that learnt ``grid``: at each free cell's observation, probability 1 on one of its optimal actions
    (the first such cell wins an observation shared by several); uniform elsewhere."""
    table = np.full((256, 5), 0.2)
    best = optimal_actions(distances(grid.free, grid.goal))
    seen = set()
    for cell in np.argwhere(grid.free):
        code = int((observations(grid.free, cell[None]) @ CODE_WEIGHTS)[0])
        ok = np.flatnonzero(best[tuple(cell)])
        if code in seen or len(ok) == 0:
            continue
        seen.add(code)
        table[code] = 0.0
        table[code, ok[0]] = 1.0
    return table


def test_policy_table_codes_and_probabilities():
    def q(x):  # action 0's value is element 0, action 1's is element 7: the code's bits
        return torch.stack([x[:, 0], x[:, 7], torch.zeros(len(x)), torch.zeros(len(x)), torch.zeros(len(x))], 1)

    table = policy_table(q, temperature=0.01)
    assert table.shape == (256, 5)
    assert np.allclose(table.sum(axis=1), 1)
    assert table[1, 0] > 0.99 and table[128, 1] > 0.99  # element i of the observation is worth 2**i
    assert np.allclose(table[0], 0.2)  # all zero values: uniform


def test_fitness_of_a_uniform_policy_counts_optimal_actions():
    grid = random_map(7, 7, np.random.default_rng(3))
    dist = distances(grid.free, grid.goal)
    best = optimal_actions(dist)
    value = fitness(grid.free, grid.start, grid.goal, np.full((256, 5), 0.2))
    cells = dist > 0  # every free cell but the goal
    assert value == pytest.approx(best[cells].sum(axis=1).mean() / 5)


def test_fitness_is_one_for_the_map_the_oracle_learnt_and_zero_when_the_goal_is_cut_off():
    grid = GridMap(np.array([[c == "." for c in r] for r in ["#######", "#.....#", "#.#.#.#", "#.....#",
                                                               "#######"]]), (1, 1), (3, 5))
    table = _oracle_table(grid)
    assert fitness(grid.free, grid.start, grid.goal, table) == pytest.approx(1.0)
    cut = grid.free.copy()
    cut[1, 2] = cut[2, 1] = False  # the start's two ways out are walled
    assert fitness(cut, grid.start, grid.goal, table) == 0.0


def test_recovery_rates_and_the_grr_nrr_relation():
    truth = np.zeros((7, 7), dtype=bool)
    truth[1:-1, 1:-1] = True
    guess = truth.copy()
    guess[2, 2] = guess[3, 3] = guess[4, 4] = False
    grr, nrr = recovery_rates(guess, truth)
    assert nrr == pytest.approx(22 / 25) and grr == pytest.approx(46 / 49)
    border, interior = 24, 25
    assert grr == pytest.approx((border + interior * nrr) / (border + interior))  # notes-002 4.5


def test_search_reads_the_map_an_oracle_policy_learnt_and_not_a_uniform_one():
    grid = random_map(7, 7, np.random.default_rng(11))
    config = SearchConfig(population=100, generations=30, seed=0)
    informed = search(_oracle_table(grid), grid.shape, grid.start, grid.goal, config, truth=grid.free)
    blind = search(np.full((256, 5), 0.2), grid.shape, grid.start, grid.goal, config, truth=grid.free)
    assert not violations(informed.recovered.free, grid.start, grid.goal)
    assert informed.recovered.start == grid.start and informed.recovered.goal == grid.goal
    assert len(informed.fitness) == len(informed.nrr) == 31
    assert informed.fitness == sorted(informed.fitness)  # elitism: the best never gets worse
    assert informed.nrr[-1] > informed.prior_nrr + 0.05
    assert informed.nrr[-1] > blind.nrr[-1]
    again = search(_oracle_table(grid), grid.shape, grid.start, grid.goal, config, truth=grid.free)
    assert np.array_equal(again.recovered.free, informed.recovered.free) and again.nrr == informed.nrr


def test_search_without_truth_records_no_nrr():
    grid = random_map(6, 6, np.random.default_rng(2))
    found = search(_oracle_table(grid), grid.shape, grid.start, grid.goal, SearchConfig(population=6, generations=2))
    assert found.nrr == [] and found.prior_nrr is None and len(found.fitness) == 3


def test_masked_adam_is_torch_adam_for_the_agents_it_steps_and_leaves_the_others():
    net = StackedMLP(2, 8, torch.Generator().manual_seed(0))
    reference = [torch.nn.Parameter(p[0].detach().clone()) for p in net.params]
    frozen = [p[1].detach().clone() for p in net.params]
    optimiser = _MaskedAdam(net.params, lr=0.01)
    torch_adam = torch.optim.Adam(reference, lr=0.01)
    x = torch.rand(4, 8)
    for _ in range(5):
        out = net(torch.stack([x, x]))[0].pow(2).sum()
        out.backward()
        optimiser.step(torch.tensor([True, False]))
        y = x
        for i in range(0, len(reference), 2):
            y = torch.baddbmm(reference[i + 1][None], y[None], reference[i][None])[0]
            if i + 2 < len(reference):
                y = torch.relu(y)
        torch_adam.zero_grad()
        y.pow(2).sum().backward()
        torch_adam.step()
    for mine, theirs, kept in zip(net.params, reference, frozen):
        assert torch.allclose(mine[0], theirs, atol=1e-6)
        assert torch.equal(mine[1], kept)


def test_stages_follow_the_thesis_or_scale_down():
    assert stages(100_000) == ((300, 1000), (99_000, 100_000))
    assert stages(2000) == ((300, 1000), (1000, 2000))
    assert stages(100) == ((15, 50), (50, 100))


def test_reproduce_dp_drl_quick(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "dp-drl"
    result = CliRunner().invoke(app, ["reproduce", "dp-drl", "--quick", "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    for name in ("recovered_maps.png", "nrr_generations.png", "learning_curves.png"):
        assert (out / name).stat().st_size > 0
    from safetensors.torch import load_file

    policies = load_file(str(out / "policies.safetensors"))
    assert policies["weight0"].shape[:2] == (len(data["rows"]), 8) and policies["bias2"].shape[-1] == 5
    config = data["config"]
    defenses = ["none", *map(str, config["epsilons"]), "dynamic"]
    assert [r["defense"] for r in data["rows"]] == defenses * config["maps"] * len(config["sizes"])
    for row in data["rows"]:
        truth = next(m for m in data["maps"] if m["size"] == row["size"] and m["map"] == row["map"])
        recovered = GridMap.from_json(row["recovered"])  # meets the constraints, or this raises
        assert recovered.start == tuple(truth["start"]) and recovered.goal == tuple(truth["goal"])
        assert 0 <= row["nrr"] <= 1 and 0 <= row["grr"] <= 1 and len(row["nrr_per_generation"]) == \
            config["search"]["generations"] + 1
        assert len(row["utility"]) == 3
    assert [t["defense"] for t in data["table"]] == defenses
    assert data["timing"]["obfuscation"] > 0
    assert "NRR" in result.output and "obfuscation" in result.output
    again = tmp_path / "again"
    rerun = ["reproduce", "dp-drl", "--quick", "--workers", "1", "--out", str(again)]
    assert CliRunner().invoke(app, rerun).exit_code == 0
    first, second = data["rows"], json.loads((again / "results.json").read_text())["rows"]
    assert [r["recovered"] for r in first] == [r["recovered"] for r in second]  # same seed, same maps


def test_reproduce_dp_drl_refuses_bad_options(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    result = CliRunner().invoke(app, ["reproduce", "dp-drl", "--quick", "--episodes", "0", "--out",
                                      str(tmp_path / "x")])
    assert result.exit_code == 2 and "--episodes" in result.output
    assert not (tmp_path / "x").exists()


def test_policy_table_for_an_agent_that_sees_its_position():
    def q(x):  # action 0 for the top half of the map, 1 for the bottom: the row feature decides
        row = x[:, 8]
        return torch.stack([1 - row, row, torch.zeros(len(x)), torch.zeros(len(x)), torch.zeros(len(x))], 1)

    table = policy_table(q, temperature=0.01, shape=(5, 4))
    assert table.shape == (5, 4, 256, 5)
    assert (table[0, :, :, 0] > 0.99).all() and (table[4, :, :, 1] > 0.99).all()
    assert np.allclose(table[2, 1], table[2, 3])  # the column feature is ignored by q


def test_fitness_reads_a_per_cell_table_as_a_shared_one_when_they_agree():
    grid = random_map(7, 7, np.random.default_rng(5))
    shared = _oracle_table(grid)
    per_cell = np.broadcast_to(shared, (*grid.shape, *shared.shape))
    assert fitness(grid.free, grid.start, grid.goal, per_cell) == fitness(grid.free, grid.start, grid.goal, shared)


def test_reproduce_dp_drl_with_position(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "pos"
    result = CliRunner().invoke(app, ["reproduce", "dp-drl", "--quick", "--position", "--episodes", "10", "--workers",
                                      "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["training"]["position"] is True and data["config"]["training"]["episodes"] == 10
    assert all(len(r["nrr_per_generation"]) == data["config"]["search"]["generations"] + 1 for r in data["rows"])


def test_reproduce_dp_drl_refuses_one_episode(tmp_path):
    from typer.testing import CliRunner

    from leaklab.cli import app
    from leaklab.experiments.dp_drl_table import DpDrlTableConfig

    result = CliRunner().invoke(app, ["reproduce", "dp-drl", "--quick", "--episodes", "1", "--out",
                                      str(tmp_path / "y")])
    assert result.exit_code == 2 and "from 2" in result.output
    with pytest.raises(ValueError, match="2 episodes"):
        DpDrlTableConfig.model_validate({**DpDrlTableConfig.quick().model_dump(), "training": {"episodes": 1}})


def test_dp_drl_searches_in_processes_give_the_same_maps(tmp_path):
    from leaklab.experiments import dp_drl_table

    config = dp_drl_table.DpDrlTableConfig.quick()
    one = dp_drl_table.run(tmp_path / "one", config, quick=True, workers=1)
    two = dp_drl_table.run(tmp_path / "two", config, quick=True, workers=2)
    assert [r["recovered"] for r in one["rows"]] == [r["recovered"] for r in two["rows"]]
    assert [r["nrr_per_generation"] for r in one["rows"]] == [r["nrr_per_generation"] for r in two["rows"]]
