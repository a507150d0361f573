"""Seed 002, chapter 6: the One Parameter Defense (Algorithm 12 and eq. 6.2), its query bound and eps*."""

from __future__ import annotations

import pytest
import torch

from leaklab.defenses.opd import divide_and_modify, matching_eps, normalise, one_parameter_defense, query_bound
from leaklab.errors import LeaklabError


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_thesis_example_draws_from_its_candidate_sets():
    y = torch.tensor([[0.23, 0.77]], dtype=torch.float64).repeat(4000, 1)  # the thesis' sub-ranges, y off the grid
    y_prime = divide_and_modify(y, 0.001, _g())  # a tiny eps: nearly uniform over the candidates
    low = {round(v, 6) for v in y_prime[:, 0].tolist()}
    high = {round(v, 6) for v in y_prime[:, 1].tolist()}
    assert low == {0.0, 0.1, 0.2, 0.3, 0.4} and high == {0.5, 0.6, 0.7, 0.8, 0.9}
    sharp = divide_and_modify(y[:50], 50.0, _g())  # the candidate nearest y_i has the largest utility
    assert torch.allclose(sharp, torch.tensor([[0.2, 0.8]], dtype=torch.float64).expand(50, 2))
    on_grid = divide_and_modify(torch.tensor([[0.2, 0.8]], dtype=torch.float64), 1e-6, _g())
    assert torch.allclose(on_grid, torch.tensor([[0.2, 0.8]], dtype=torch.float64))  # infinite utility: kept


def test_order_and_argmax_are_kept_and_the_output_is_a_distribution():
    y = torch.softmax(torch.randn(500, 10) * 3, 1)
    for eps in (0.1, 1.0, 20.0):
        z = one_parameter_defense(y, eps, _g())
        assert torch.equal(z.argmax(1), y.argmax(1))
        assert torch.allclose(z.sum(1), torch.ones(500, dtype=torch.float64))
        ranks = [torch.sort(v, dim=1, stable=True).indices for v in (z, y.double())]
        assert torch.equal(*ranks)


def test_distortion_falls_with_eps_and_matches_the_literal_equation_on_one_hot_scores():
    y = torch.full((1000, 10), 1e-4)
    y[:, 3] = 1 - 9e-4
    distortion = [float((one_parameter_defense(y, eps, _g()) - y.double()).norm(dim=1).mean())
                  for eps in (0.1, 0.7, 1.4, 2.0)]
    assert distortion == sorted(distortion, reverse=True)
    assert distortion[0] == pytest.approx(0.945, abs=0.003)  # the thesis' 0.948: z is nearly uniform
    assert distortion[3] == pytest.approx(0.828, abs=0.005)  # eq. 6.2 as printed (the thesis reports 0.328)


def test_same_generator_same_answer():
    y = torch.softmax(torch.randn(20, 5), 1)
    assert torch.equal(one_parameter_defense(y, 0.7, _g(3)), one_parameter_defense(y, 0.7, _g(3)))
    assert not torch.equal(divide_and_modify(y, 0.01, _g(3)), divide_and_modify(y, 0.01, _g(4)))


def test_query_bound_of_theorem_6_3():
    assert query_bound(10, 0.1, 10) == pytest.approx(128183, rel=1e-4)
    assert query_bound(10, 0.7, 10) == pytest.approx(28.72, rel=1e-3)
    assert query_bound(5, 0.1, 10) == pytest.approx(429.0, rel=1e-3)


def test_matching_eps_recovers_the_eps_that_gives_back_y():
    y_prime = divide_and_modify(torch.softmax(torch.randn(8, 6), 1), 1.0, _g())
    y = normalise(y_prime, 3.7)
    assert torch.allclose(matching_eps(y, y_prime), torch.full((8,), 3.7, dtype=torch.float64))


@pytest.mark.parametrize("bad", [torch.tensor([0.2, 0.8]), torch.tensor([[1.0]]), torch.tensor([[0.5, float("nan")]]),
                                 torch.tensor([[-0.1, 1.1]]), torch.tensor([[1, 0]])])
def test_bad_confidences_are_refused(bad):
    with pytest.raises(LeaklabError):
        one_parameter_defense(bad, 1.0, _g())


def test_bad_settings_are_refused():
    y = torch.tensor([[0.2, 0.8]])
    for eps, m, sensitivity in ((0.0, 5, 1.0), (float("inf"), 5, 1.0), (1.0, 0, 1.0), (1.0, 5, 0.0)):
        with pytest.raises(LeaklabError):
            one_parameter_defense(y, eps, _g(), m=m, sensitivity=sensitivity)
    with pytest.raises(LeaklabError):
        query_bound(10, 0, 10)


def test_reproduce_opd_table_quick(tmp_path):
    import json

    from typer.testing import CliRunner

    from leaklab.cli import app

    out = tmp_path / "opd"
    result = CliRunner().invoke(app, ["reproduce", "opd-table", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert (out / "opd_table.png").stat().st_size > 0 and (out / "opd_inversions.png").stat().st_size > 0
    rows = data["rows"]
    epsilons = data["config"]["epsilons"]
    assert [r["eps"] for r in rows] == [None, *epsilons, None, None]
    assert [r["defense"] for r in rows] == ["none", *(f"OPD eps {e}" for e in epsilons), "MemGuard", "Purification"]
    # OPD and MemGuard never change the argmax; the purifier may
    assert len({(r["train_accuracy"], r["test_accuracy"]) for r in rows[:-1]}) == 1
    assert rows[0]["distortion"] == 0 and all(r["distortion"] > 0 for r in rows[1:len(epsilons) + 1])
    assert all(0 <= r[k] <= 1 for r in rows for k in ("ml_leaks", "nsh"))
    assert [r["training_seconds"] > 0 for r in rows] == [False] * (len(epsilons) + 1) + [True, True]
    assert "ML-Leaks" in result.output and "MemGuard" in result.output
    bad = CliRunner().invoke(app, ["reproduce", "opd-table", "--quick", "--data", "cifar", "--out",
                                   str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--data" in bad.output and not (tmp_path / "x").exists()


def test_a_tie_for_the_top_keeps_argmax_s_class_and_a_zero_score_has_no_matching_eps():
    y = torch.tensor([[0.5, 0.5, 0.0], [0.45, 0.45, 0.1], [0.1, 0.45, 0.45]], dtype=torch.float64)
    for seed in range(5):
        assert torch.equal(one_parameter_defense(y, 1.0, _g(seed)).argmax(1), y.argmax(1))
    assert torch.isinf(matching_eps(y[:1], divide_and_modify(y[:1], 1.0, _g()))).all()
