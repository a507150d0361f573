"""Seed 001 Table 2 reproduction: structure of a quick run, resumability, and the Bayes likelihood."""

import json
import math

import pytest
import torch

from leaklab.attacks.inversion.objectives import Objective
from leaklab.attacks.inversion.simulate import UpdateSimulator
from leaklab.data import load_images
from leaklab.defenses import parse_defense
from leaklab.errors import LeaklabError
from leaklab.experiments import bayes_table2 as t2
from leaklab.fl import fedsgd_update
from leaklab.models import ModelSpec, build_model


def test_paper_table_is_complete():
    for dataset in ("MNIST", "CIFAR-10"):
        for defense in t2.DEFENSES:
            for step in t2.STEPS:
                assert set(t2.PAPER_TABLE2[dataset][defense][step]) == set(t2.ATTACKS)
    assert t2.paper_value("digits", "prune+gaussian", 0, "bayes") == 18.40
    assert t2.paper_value("photos", "prune+laplace", 500, "cosine") == 15.51


def test_quick_run_structure_and_resume(tmp_path):
    calls = []
    kwargs = dict(quick=True, datasets=["digits"], defenses=["prune+gaussian", "laplace:0.1"],
                  steps=[0, 500])
    result = t2.run(tmp_path, progress=lambda text, done, total: calls.append((text, done, total)),
                    **kwargs)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["table"] == result["table"]
    assert (tmp_path / "table2.png").stat().st_size > 0
    table = result["table"]
    assert list(table) == ["digits"]
    assert list(table["digits"]) == ["prune+gaussian", "laplace"]  # spec strings map to names
    for defense, by_step in table["digits"].items():
        assert list(by_step) == ["0", "500"]
        for step, row in by_step.items():
            assert list(row) == list(t2.ATTACKS)
            assert all(math.isfinite(v) and 0 < v < 100 for v in row.values())
            for attack in t2.ATTACKS:
                cell = result["cells"]["digits"][defense][step][attack]
                assert len(cell["psnr"]) == 1 and row[attack] == round(cell["psnr"][0], 3)  # the table is the cells'
                assert {"lr", "lr_decay", "beta_tv", "layer_weighting"} <= set(cell["hyperparameters"])
                assert cell["tuning"]
                assert result["paper"]["digits"][defense][step][attack] == cell["paper"]
    assert calls and calls[-1][1] == calls[-1][2]  # progress reaches its total
    assert result["acceptance"]["evaluated"] is False and result["acceptance"]["holds"] is None
    cells = sorted(p.name for p in (tmp_path / "cells").glob("*.json"))
    assert len(cells) == 16

    # A rerun with the same settings skips every finished cell and gives the same table.
    again = []
    second = t2.run(tmp_path, progress=lambda text, done, total: again.append(text), **kwargs)
    assert second["table"] == result["table"]
    assert not any("search" in text or "reported" in text for text in again)


def test_resume_records_that_do_not_read_back_are_recomputed(tmp_path):
    """An edited or foreign tuning log line was an AttributeError or KeyError, and a NaN mean was taken."""
    good = '{"fp": "x", "key": "k", "mean": 1.5, "psnr": [1.5]}'
    bad = ['[1, 2]', '{"fp": "x"}', '{"fp": "x", "key": "j", "mean": NaN, "psnr": [1]}', '{"fp": "x", "key": "j", '
           '"mean": "1", "psnr": [1]}', '{"fp": "x", "key": "j", "mean": 1, "psnr": []}', '{"fp": "x", "key": 3, '
           '"mean": 1, "psnr": [1]}', '{"fp": "y", "key": "j", "mean": 1, "psnr": [1]}', '{"fp": "x", "mean": tr']
    log = tmp_path / "cell.tune.jsonl"
    log.write_bytes(("\n".join([*bad, good]) + "\n").encode() + b'{"fp": "x", "key": "\xff\xfe"}\n')  # not UTF-8
    tuner = t2.Tuner(log, "x", evaluate=lambda cfg: [0.0], tick=lambda: None)
    assert list(tuner.records) == ["k"] and tuner.records["k"]["mean"] == 1.5
    assert t2._saved('{"fingerprint": "f", "psnr_mean": 2, "psnr": [2]}', "fingerprint", "f", "psnr_mean", "psnr")
    assert t2._saved('{"fingerprint": "f", "psnr_mean": true, "psnr": [2]}', "fingerprint", "f", "psnr_mean") is None


def test_bad_selection_is_refused(tmp_path):
    with pytest.raises(LeaklabError):
        t2.run(tmp_path, quick=True, datasets=["cifar"])
    with pytest.raises(LeaklabError):
        t2.run(tmp_path, quick=True, defenses=["topk:0.5"])
    with pytest.raises(LeaklabError):
        t2.run(tmp_path, quick=True, images=0)
    # seed 27 draws one photo both to tune the attacks on and to report: refused before any work
    with pytest.raises(LeaklabError, match="--seed 27 draws a photos image both to tune the attacks and to report"):
        t2.run(tmp_path / "seed27", datasets=["photos"], seed=27)
    assert not (tmp_path / "seed27").exists()


@pytest.mark.parametrize("noise", ["gaussian:0.1", "laplace:0.1"])
def test_bayes_likelihood_prefers_the_true_image_under_pruning(noise):
    """The exact prune-then-noise likelihood is higher at the client's image than at a slightly
    perturbed one, for every noise draw. A likelihood that ignored the pruning (plain Gaussian, i.e.
    L2) fails this: on this very case L2 prefers the perturbed image for most draws, because a smaller
    gradient matches the zeroed entries better; that mismatch is what the Bayes attack exploits."""
    torch.manual_seed(0)
    batch = load_images("photos", 2, image_size=16, seed=3)
    spec = ModelSpec(name="cnn", num_classes=batch.num_classes, in_channels=3, image_size=16,
                     width=8, mean=batch.mean, std=batch.std)
    model = build_model(spec, seed=0)
    x, y = batch.images[:1], batch.labels[:1]
    clean = fedsgd_update(model, x, y)
    chain = parse_defense(f"prune:0.5,{noise}")
    simulator = UpdateSimulator(model, clean.metadata)
    perturbed = (x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    candidates = torch.stack([x, perturbed])  # (R=2, B=1, C, H, W)
    labels = torch.stack([y, y])
    simulated = [g.detach() for g in simulator(candidates, labels)]
    for draw in range(5):
        observed = chain.apply(clean, torch.Generator().manual_seed(draw)).ordered(model)
        obs = [torch.stack([o, o]) for o in observed]
        nll = Objective("bayes", obs, chain)(simulated)
        assert nll[0] < nll[1], f"draw {draw}: -log p(g|x) {nll[0]:.2f} >= perturbed {nll[1]:.2f}"


def test_acceptance_verdict_from_a_table():
    """The Table 2 line (Bayes at least ACCEPT_MARGIN_DB ahead of the best other attack at step 0, under
    both prune+noise defenses, on both datasets) computed from made-up rows: it holds at the margin, fails
    just under it, and is not evaluated while a cell is missing."""
    def table(gaps):
        return {ds: {d: {"0": {"bayes": 20.0 + gaps.get((ds, d), 2.0), "l2": 20.0, "l1": 19.0, "cosine": 18.5}}
                     for d in t2.ACCEPT_DEFENSES} for ds in t2.DATASETS}

    def verdict(t):
        return t2._acceptance(t, list(t2.DATASETS), [0], list(t2.ACCEPT_DEFENSES))

    margin = t2.ACCEPT_MARGIN_DB
    held = verdict(table({("photos", "prune+laplace"): margin}))
    assert held["evaluated"] is True and held["holds"] is True
    assert held["gaps_db"]["photos"]["prune+laplace"] == margin and held["gaps_db"]["digits"]["prune+gaussian"] == 2.0
    failed = verdict(table({("digits", "prune+gaussian"): margin - 0.01}))
    assert failed["evaluated"] is True and failed["holds"] is False
    partial = table({})
    del partial["photos"]["prune+gaussian"]
    assert verdict(partial)["evaluated"] is False and verdict(partial)["holds"] is None


def test_cells_of_another_method_version_are_computed_again(tmp_path, monkeypatch):
    """A cell's key held no code version: a rerun into a folder of cells computed before the Bayes tiny-noise fix
    printed their 5.53 dB where the code now reads 6.32."""
    from leaklab.experiments import bayes_table2 as bt

    kwargs = dict(quick=True, datasets=["digits"], defenses=["gaussian"], steps=[0])
    bt.run(tmp_path, **kwargs)
    said = []
    monkeypatch.setattr(bt, "INVERSION_METHOD_VERSION", bt.INVERSION_METHOD_VERSION + 1)
    bt.run(tmp_path, progress=lambda text, done, total: said.append(text), **kwargs)
    assert not any("done earlier" in text for text in said) and any("search" in text for text in said)


def test_a_rerun_with_other_images_tunes_a_trained_cell_again(tmp_path):
    """The reported images leave the step > 0 network's training pool: with seed 141 two photos take one of its
    crops that one does not, so the network differs, and a rerun into the same folder reused the first search."""
    from leaklab.experiments import bayes_table2 as bt

    log = tmp_path / "cells" / "photos__gaussian__step1__l2.tune.jsonl"
    lines = []
    for n in (1, 2):
        bt.run(tmp_path, quick=True, datasets=["photos"], defenses=["gaussian"], steps=[1], images=n, seed=141)
        lines.append(len(log.read_text().splitlines()))
    assert lines[1] == 2 * lines[0]  # searched again, on the network the new images leave
