"""The room attacks end to end through the CLI: `attack qgi|rgi`, `audit` (the main job, rooms),
`audit --cases`, `reproduce room-table1`, `env contact-sheet`; and their refusals of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from leaklab.cli import app
from leaklab.errors import LeaklabError
from leaklab.experiments.room_attack import SUMMARY_KEYS
from leaklab.names import DEFAULT_ARCH
from leaklab.rl.envs.layouts import layouts_arg
from leaklab.rl.capture import RoomCaptureConfig, capture_rooms
from leaklab.models import PerceptionSpec

torch.set_num_threads(1)
runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
FAST = ["--iterations", "3", "--workers", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_user_error(result, out: Path, *words: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


class Interrupt(KeyboardInterrupt):
    """Ctrl-C, pressed by a test while the attack after the first ``after`` runs."""


def interrupt_after(after: int):
    def progress(task, done, total):
        if not task.startswith(("capture", "prepare")) and done > after:
            raise Interrupt
    return progress


def test_attack_qgi_writes_the_results_contract(tmp_path):
    out = tmp_path / "qgi"
    result = invoke("attack", "qgi", "--setting", "S1", "--samples", "2", "--layouts", "2", *FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    s = res["summary"]
    for key in ("rgb_psnr_mean", "rgb_ssim_mean", "depth_psnr_mean", "depth_ssim_mean", "rgb_psnr_raw_mean",
                "depth_psnr_raw_mean", "rgb_psnr_baseline_mean", "depth_psnr_baseline_mean", "iou_mean",
                "action_accuracy", "q_pred_err_mean", "q_target_err_mean", "iterations", "seconds_per_sample"):
        assert s[key] is not None, key
    assert "reward_abs_err_mean" not in s and s["update_cosine_median"] == 1.0  # no defense: the update as it is
    assert s["samples"] == 2 and s["layouts"] == 2 and len(res["samples"]) == 2
    # the exact recovery of the vector parts holds even with 3 image iterations
    assert s["iou_min"] > 0.999 and s["action_accuracy"] == 1.0 and s["q_target_err_mean"] < 0.01
    # the spread the paper's Table I gives beside each mean: here of the two samples' scores
    for key, metric in (("rgb_psnr_std", "rgb_paper_psnr"), ("depth_ssim_std", "depth_paper_ssim")):
        a, b = (row["metrics"][metric] for row in res["samples"])
        assert s[key] == pytest.approx(abs(a - b) / 2) and s[key] > 0
    assert (out / "reconstructions.png").read_bytes().startswith(PNG)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2
    # the reconstructions themselves, re-scored: the rows' metrics come back from the saved tensors
    from leaklab.io import load_tensors
    from leaklab.metrics.image import psnr
    from leaklab.experiments.room_attack import RoomRunConfig, capture_samples

    recs, meta = load_tensors(out / "reconstructions.safetensors", "reconstructions")
    assert meta["format"] == "leaklab.room_reconstructions"
    assert recs["images"].shape == (2, 4, 150, 150) and recs["box"].shape == (2, 4)
    assert set(recs) == {"images", "box", "action", "q_pred", "q_target"}
    _, samples = capture_samples(RoomRunConfig(setting="S1", samples=2, layouts=layouts_arg("2")))
    for i, sample in enumerate(samples):
        depth = psnr(recs["images"][i:i + 1, 3:], sample.truth["images"][:, 3:].float())
        assert abs(float(depth) - res["samples"][i]["metrics"]["depth_raw_psnr"]) < 1e-6


def test_attack_rgi_reports_the_reward_error_and_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert invoke("attack", "rgi", "--samples", "1", "--layouts", "1", *FAST, "--out", out).exit_code == 0
    ra, rb = (json.loads((o / "results.json").read_text()) for o in (a, b))
    assert ra["summary"]["reward_abs_err_mean"] < 1e-4 and "q_target_err_mean" not in ra["summary"]
    # this sample's return is not 0, so its update holds the action (a zero return would leave none)
    assert ra["summary"]["zero_return_samples"] == 0 and ra["summary"]["action_accuracy_nonzero_return"] == 1.0
    assert ra["samples"][0]["metrics"] == rb["samples"][0]["metrics"]


@pytest.mark.parametrize("args, words", [
    (["--setting", "S3"], ["--setting"]),
    (["--layouts", "nowhere"], ["unknown room layout", "nowhere"]),
    (["--layouts", "99"], ["invalid --layouts (got '99'): there are 17 room layouts"]),
    (["--layouts", "-1"], ["invalid --layouts (got '-1')", "give a count from 1 to 17"]),
    (["--layouts", "--1"], ["--1"]),
    (["--defense", "blur:2"], ["blur"]),
    (["--mode", "fast"], ["--mode"]),
    (["--samples", "0"], ["--samples"]),
    (["--mode", "paper", "--no-layerwise"], ["layerwise", "paper mode"]),
])
def test_attack_qgi_refuses_bad_input_without_output(tmp_path, args, words):
    out = tmp_path / "bad"
    assert_user_error(invoke("attack", "qgi", *args, "--out", out), out, *words)


def test_quick_room_audit_writes_report_with_defenses(tmp_path):
    """... after an interrupted audit in the same folder (the audit picks a new runs/<id> each time),
    whose finished attacks it takes instead of attacking them again."""
    from leaklab.experiments import room_audit

    calls, stop = [], interrupt_after(2)

    def progress(task, done, total):
        calls.append((task, done, total))
        stop(task, done, total)

    with pytest.raises(Interrupt):
        room_audit.run(tmp_path / "audit-1", room_audit.default_config(quick=True), progress)
    assert not (tmp_path / "audit-1").exists()
    # one client episode per cell (QGI and RGI in S1) is captured, the 6 attacks are prepared (their
    # defended updates built and named), then they begin
    assert calls[:3] == [("capture", 0, 2), ("capture", 1, 2), ("capture", 2, 2)]
    assert calls[3:9] == [("prepare", n, 6) for n in range(1, 7)] and calls[9] == ("audit", 0, 6)
    out = tmp_path / "audit"
    result = invoke("audit", "--quick", "--out", out)
    assert result.exit_code == 0, result.output
    assert "2 attacks resumed from an interrupted run" in result.output
    assert json.loads((out / "results.json").read_text())["summary"]["resumed_attacks"] == 2
    assert "attacks resumed from an interrupted run" in (out / "report.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit"]  # the journal went with its run
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3  # leakage plot + one grid per attack
    assert "RGB baseline (dB)" in html and "RGB SSIM baseline" in html and "DP-SGD" in html
    res = json.loads((out / "results.json").read_text())
    assert res["kind"] == "rooms"
    cells = {(c["algorithm"], c["defense"]) for c in res["cells"]}
    assert cells == {(a, d) for a in ("qgi", "rgi") for d in ("none", "gaussian σ=0.001", "DP-SGD ε=8")}
    dp = next(c for c in res["cells"] if c["defense"] == "DP-SGD ε=8")
    # one DP-SGD release at epsilon 8: clip to 1, then the analytic Gaussian's sigma (about 0.600)
    from leaklab.privacy.mechanisms import analytic_gaussian_sigma

    sigma = dp["defense_chain"].removeprefix("clip:1,gaussian:")
    assert sigma != dp["defense_chain"] and float(sigma) == pytest.approx(analytic_gaussian_sigma(8.0, 1e-5), rel=1e-5)
    clean = next(c for c in res["cells"] if c["defense"] == "none" and c["algorithm"] == "qgi")
    assert clean["summary"]["iou_min"] > 0.999
    # what each defense costs: the cosine an update keeps, reported beside what leaks
    kept = {(c["algorithm"], c["defense"]): c["summary"]["update_cosine_median"] for c in res["cells"]}
    assert all(kept[(a, "none")] == 1.0 and abs(kept[(a, "DP-SGD ε=8")]) < 0.01 for a in ("qgi", "rgi"))
    assert "update kept (cosine)" in (out / "report.html").read_text()
    assert (out / "figures" / "leakage_per_defense.png").read_bytes().startswith(PNG)
    assert "At a glance" in html and "leaks the target&#39;s box" in html  # 3 image steps: not the room
    # 3 image steps: the report says that its verdicts understate the leak, and how much the attacks did
    assert "fewer than the 2000 they take by default" in html and "1 sample per cell from 1 room" in html
    # RGI's share of updates with a policy-gradient part is shown for clean updates only (noise passes for one)
    rgi = [line for line in result.output.splitlines() if line.strip().startswith("RGI")]
    assert [("policy-gradient part found" in line) for line in rgi] == [True, False, False], rgi
    # 3 image steps: no levels to audit next are suggested from verdicts that understate the leak
    assert res["summary"]["next_levels"] == {"gaussian_sigmas": [], "dp_epsilons": []}
    assert "To pin down" not in result.output and "To pin down" not in html


def test_audit_attacks_a_partly_trained_network(tmp_path):
    """``train_steps``: each algorithm and setting trains its network in the rooms before the captured
    round, the progress counts the steps, and the report says which network the clients sent."""
    from leaklab.experiments import room_audit

    calls = []
    config = room_audit.default_config(quick=True).model_copy(update={"train_steps": 40})
    res = room_audit.run(tmp_path / "audit", config, lambda task, done, total: calls.append((task, done, total)))
    trained = [(done, total) for task, done, total in calls if task == "train"]
    assert trained[-1] == (80, 80) and (40, 80) in trained  # QGI's and RGI's S1 networks, one after the other
    assert all(a <= b for (a, _), (b, _) in zip(trained, trained[1:]))
    assert res["config"]["train_steps"] == 40
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "network after 40 environment steps of DQN or REINFORCE training" in html


def test_audit_report_pictures_a_cells_first_samples_and_scores_them_all(tmp_path, monkeypatch):
    """A paper-scale audit (48 samples a cell) pictures the first SHOWN_SAMPLES of each cell."""
    from leaklab.experiments import room_audit, room_report

    monkeypatch.setattr(room_report, "SHOWN_SAMPLES", 1)
    config = room_audit.AuditConfig(algorithms=("qgi",), settings=("S2",), samples=2, iterations=3,
                                    gaussian_sigmas=(), dp_epsilons=(), workers=1)
    res = room_audit.run(tmp_path / "audit", config)
    assert [len(c["samples"]) for c in res["cells"]] == [2]
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "the first 1 of 2 samples; results.json has every one" in html


def test_an_audit_of_both_modes_attacks_each_update_in_both_and_counts_it_once(tmp_path):
    """``--full``'s shape: exact and paper mode attack the same (defended) updates; the verdicts count each
    update once and name the mode of the largest gain."""
    from leaklab.experiments import room_audit, room_verdicts

    config = room_audit.AuditConfig(algorithms=("qgi",), settings=("S2",), modes=("exact", "paper"), samples=1,
                                    layouts=("e1m1-stalactite",), iterations=3, gaussian_sigmas=(1e-3,),
                                    dp_epsilons=(), workers=1)
    res = room_audit.run(tmp_path / "audit", config)
    assert [(c["mode"], c["defense"]) for c in res["cells"]] == [
        ("exact", "none"), ("exact", "gaussian σ=0.001"), ("paper", "none"), ("paper", "gaussian σ=0.001")]
    noisy = [c["samples"][0]["metrics"]["update_cosine"] for c in res["cells"] if c["defense"] != "none"]
    assert noisy[0] == noisy[1] < 1  # one noised update, attacked twice
    rows = room_verdicts.verdicts(res)
    assert [r[5] for r in rows] == ["0 of 1", "0 of 1"] and rows[0][7].startswith("1 of 1 update (100%")
    assert rows[0][4].endswith(" mode)")
    assert "each update counts once" in (tmp_path / "audit" / "report.html").read_text()


def test_audit_takes_the_defense_levels_a_user_asks_for(tmp_path):
    out = tmp_path / "levels"
    result = invoke("audit", "--quick", "--sigmas", "1e-4", "--epsilons", "50,20", "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["summary"]["defenses"] == [
        "none", "gaussian σ=0.0001", "DP-SGD ε=50", "DP-SGD ε=20"]
    for args, word in [(("--sigmas", "0"), "--sigmas"), (("--epsilons", "8,8"), "--epsilons"),
                       (("--sigmas", "1e-3,x"), "distinct positive numbers")]:
        assert_user_error(invoke("audit", "--quick", *args, "--out", tmp_path / "bad"), tmp_path / "bad", word)
    with pytest.raises(ValueError, match="each level once"):
        from leaklab.experiments import room_audit
        room_audit.AuditConfig(dp_epsilons=(8.0, 8.0))
    # an earlier audit of the same rooms, network and attacks counts; anything else is refused at once
    again = tmp_path / "again"
    result = invoke("audit", "--quick", "--sigmas", "1e-3", "--earlier", out, "--out", again)
    assert result.exit_code == 0, result.output
    assert json.loads((again / "results.json").read_text())["summary"]["earlier_audits"] == [str(out)]
    for args, words in [(("--arch", "deep"), ("--earlier", f"arch {DEFAULT_ARCH} where this audit has deep")),
                        (("--seed", "1"), ("seed 0", "do not carry over"))]:
        assert_user_error(invoke("audit", "--quick", "--earlier", out, *args, "--out", tmp_path / "bad"),
                          tmp_path / "bad", *words)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "results.json").write_text('{"format": "leaklab.room_attack"}')
    assert_user_error(invoke("audit", "--quick", "--earlier", tmp_path / "mine", "--out", tmp_path / "bad"),
                      tmp_path / "bad", "not a room audit")
    before = (out / "results.json").read_bytes()
    result = invoke("audit", "--quick", "--earlier", out, "--out", out)
    assert result.exit_code == 2 and "would replace the input" in result.stderr
    assert (out / "results.json").read_bytes() == before
    assert_user_error(invoke("audit", "--kind", "images", "--earlier", out, "--out", tmp_path / "bad"),
                      tmp_path / "bad", "--earlier")


def test_audit_verdicts_in_words():
    from leaklab.experiments.room_verdicts import conclusion, verdicts

    def cell(defense, chain, depth, iou, action, frames, kept=1.0, algorithm="qgi", error=None, mode="exact"):
        read = {"qgi": "q_target_err_mean", "rgi": "reward_abs_err_mean"}[algorithm]
        return {"defense": defense, "defense_chain": chain, "algorithm": algorithm, "setting": "S2", "mode": mode,
                "summary": {"depth_psnr_mean": depth, "depth_psnr_baseline_mean": 15.0, "iou_mean": iou,
                            "action_accuracy": action, read: error,
                            **({} if kept is None else {"update_cosine_median": kept})},
                "samples": [{"index": i, "metrics": {"depth_paper_psnr": d, "depth_paper_psnr_baseline": 15.0,
                                                     "action": float(i < action * len(frames))}}
                            for i, d in enumerate(frames)]}

    # the mean of the noisy cell is under the 3 dB line, but one of its two updates shows its room
    rows = verdicts({"summary": {"defenses": ["none", "noise", "dp"]},
                     "cells": [cell("none", None, 40.0, 1.0, 1.0, [45.0, 35.0], error=1.2e-6),
                               cell("noise", "gaussian:0.001", 17.0, 0.6, 1.0, [19.0, 15.0], kept=0.8712, error=12.1),
                               cell("noise", "gaussian:0.001", 5.0, 0.0, 0.0, [5.0, 5.0], kept=0.6, algorithm="rgi",
                                    error=0.00113),
                               cell("dp", "clip:1,gaussian:0.6", 5.0, 0.0, 0.25, [5.0] * 4, kept=0.000651,
                                    error=347.0)]})
    assert [r[1] for r in rows] == ["nothing", "noise std 0.001", "clip to norm 1, noise std 0.6"]
    # what each defense costs: the cosine an update keeps, the attacks' range where they differ
    assert [r[2] for r in rows] == ["1", "0.6 to 0.871", "0.000651"]
    assert [r[5] for r in rows] == ["2 of 2", "1 of 4", "0 of 4"]
    assert rows[0][8] == ("leaks the room (2 of 2 updates show it; the best: QGI S2 depth +30.0 dB over its "
                          "baseline), the target's box (IoU 1.00), the action (100%) and the target Q-value (error "
                          "1.2e-06%)")
    # the room leaks where any update shows it: the mean's +2.0 dB hid the one that does (+4.0), which the
    # verdict names; QGI's target Q under the noise (12% off) is not read; RGI's reward (0.0011 off) is
    assert rows[1][3] == 2.0 and rows[1][4] == "QGI S2 depth"
    assert rows[1][8] == ("leaks the room (1 of 4 updates show it; the best: QGI S2 depth +4.0 dB over its "
                          "baseline), the target's box (IoU 0.60), the action (100%) and the reward (error 0.0011)")
    assert rows[2][8] == "nothing measured leaks" and rows[2][7] == ("1 of 4 updates (25%; chance alone: "
                                                                          "p = 0.46)")  # QGI's updates only
    # the action column weighs a count against guessing one of 7 actions: 2 of 2 right by chance is 1 in 49;
    # a batch's shares are no count
    from leaklab.experiments.room_verdicts import _actions_read

    assert rows[0][7] == "2 of 2 updates (100%; chance alone: p = 0.02)"
    assert _actions_read([1.0, 1.0, 0.0, 1.0, 1.0, 0.0]) == "4 of 6 updates (67%; chance alone: p = 0.0049)"
    assert _actions_read([0.5, 1.0]) == "75% of 2 updates" and _actions_read([]) is None
    # the verdicts' action: half of the updates read right, or more than guessing names but with p < 0.05
    from leaklab.experiments.room_verdicts import _action_leaks

    def reads(right: int, n: int) -> list[float]:
        return [1.0] * right + [0.0] * (n - right)

    assert _action_leaks(reads(1, 1)) and _action_leaks(reads(3, 6)) and not _action_leaks(reads(2, 6))
    assert _action_leaks(reads(21, 96)) and not _action_leaks(reads(20, 96))  # p = 0.029 and 0.051; 14 expected
    assert _action_leaks([0.5, 1.0]) and not _action_leaks([0.5, 0.0]) and not _action_leaks([])
    assert conclusion(rows) == ("dp is the weakest defense tested behind which nothing measured leaks, and there an "
                                "update keeps a cosine of 0.000651 with the true one; behind noise (cosine 0.6 to "
                                "0.871) the update still leaks the room (1 of 4 updates show it; the best: QGI S2 "
                                "depth +4.0 dB over its baseline), the target's box (IoU 0.60), the action (100%) and "
                                "the reward (error "
                                "0.0011).")
    assert conclusion(rows[:2]).startswith("Every defense tested leaks: behind noise (cosine 0.6 to 0.871) the "
                                           "update still leaks")
    assert conclusion(rows[:1]).startswith("Every defense tested leaks: behind none the update still leaks")
    assert conclusion(rows[2:]) == "Nothing measured leaks behind any defense tested, dp included."
    # results written before the cosine was measured: the column says so, the sentence leaves it out
    old = verdicts({"summary": {"defenses": ["none", "dp"]},
                    "cells": [cell("none", None, 40.0, 1.0, 1.0, [45.0, 35.0], kept=None),
                              cell("dp", "clip:1,gaussian:0.6", 5.0, 0.0, 0.25, [5.0] * 4, kept=None)]})
    assert [r[2] for r in old] == ["–", "–"]
    assert conclusion(old).startswith("dp is the weakest defense tested behind which nothing measured leaks; behind "
                                      "none the update still leaks the room")
    # `--full` attacks each update in both modes: an update counts once, showing its room where either
    # reconstruction shows it; its action (read by the same rule in both) is no second guess
    both = verdicts({"summary": {"defenses": ["noise"]},
                     "cells": [cell("noise", "gaussian:0.03", 4.0, 0.5, 0.5, [14.0, 25.0] + [14.0] * 4),
                               cell("noise", "gaussian:0.03", 5.0, 0.5, 0.5, [19.0, 14.0] + [14.0] * 4,
                                    mode="paper")]})
    assert both[0][4] == "QGI S2 depth (paper mode)" and both[0][5] == "2 of 6"  # the largest mean gain
    # the verdict names the update that shows its room best, in the mode that shows it
    assert both[0][8].startswith("leaks the room (2 of 6 updates show it; the best: QGI S2 depth (exact mode) "
                                 "+10.0 dB over its baseline)")
    # `audit --cases`: each case is an update of its own, the best named by its case; an unscored one (no
    # truth) does not count
    from leaklab.experiments.room_verdicts import room_shown, verdict

    cases = [{"case": name, "algorithm": "rgi", "setting": "S2",
              "metrics": {"depth_paper_psnr": psnr, "depth_paper_psnr_baseline": 15.0}}
             for name, psnr in (("0000", 16.0), ("0001", 21.5))]
    cases.append({"case": "0002", "algorithm": "rgi", "setting": "S2"})
    room = room_shown({r["case"]: [(r, r)] for r in cases}, modes=False)
    assert (room.shown, room.updates) == (1, 2)
    assert verdict(room, 0.2, None) == ("leaks the room (1 of 2 updates show it; the best: RGI S2 depth of case 0001 "
                                        "+6.5 dB over its baseline)")
    assert both[0][7] == "3 of 6 updates (50%; chance alone: p = 0.042)"  # 6 of 12 would be p = 0.0036


def test_audit_suggests_the_levels_to_audit_next():
    from leaklab.experiments.audit_levels import next_levels, next_levels_text

    # every σ leaks: two stronger round levels; every ε is safe: two weaker ones (larger ε)
    assert next_levels({1e-3: True, 0.03: True}, {8.0: False, 1.0: False}) == {
        "gaussian_sigmas": [0.1, 0.3], "dp_epsilons": [30.0, 100.0]}
    # a bracket: two levels between, a third and two thirds of the way (log scale); ε orders the other way
    assert next_levels({1e-3: True, 0.3: False}, {50.0: True, 8.0: False}) == {
        "gaussian_sigmas": [0.005, 0.05], "dp_epsilons": [20.0, 30.0]}
    # every σ safe: weaker ones; every ε leaks: stronger ones (smaller ε); a family not tested: none
    assert next_levels({0.1: False}, {}) == {"gaussian_sigmas": [0.01, 0.03], "dp_epsilons": []}
    assert next_levels({}, {50.0: True})["dp_epsilons"] == [5.0, 20.0]
    # a bracket of adjacent round levels is narrow already; a level already tested is not suggested again
    assert next_levels({0.1: True, 0.2: False}, {})["gaussian_sigmas"] == []
    assert next_levels({0.03: True, 0.1: True}, {})["gaussian_sigmas"] == [0.3, 1.0]
    assert next_levels_text({"gaussian_sigmas": [0.1, 0.3], "dp_epsilons": [30.0]}).startswith(
        "To pin down where the leaks stop, audit next with `--sigmas 0.1,0.3 --epsilons 30`")
    assert next_levels_text({"gaussian_sigmas": [], "dp_epsilons": []}) == ""


def test_audit_suggests_levels_from_its_verdicts_only_when_they_are_full_strength():
    from leaklab.experiments import room_audit

    def cell(defense, depth):
        return {"defense": defense, "defense_chain": None if defense == "none" else "gaussian:1", "algorithm": "rgi",
                "setting": "S2", "mode": "exact",
                "summary": {"depth_psnr_mean": depth, "depth_psnr_baseline_mean": 15.0, "iou_mean": 0.0},
                "samples": [{"index": 0, "metrics": {"depth_paper_psnr": depth, "depth_paper_psnr_baseline": 15.0}}]}

    config = room_audit.AuditConfig(gaussian_sigmas=(1e-3, 0.3), dp_epsilons=(8.0,))
    labels = [label for label, _ in config.defenses()]
    assert labels == ["none", "gaussian σ=0.001", "gaussian σ=0.3", "DP-SGD ε=8"]

    def levels(depths, earlier=({}, {}), **fields):
        results = {"summary": {"defenses": labels}, "cells": [cell(label, d) for label, d in zip(labels, depths)]}
        return room_audit._levels_summary(config.model_copy(update=fields), results, earlier)

    def suggest(depths, **fields):
        return levels(depths, **fields)["next_levels"]

    assert suggest([40.0, 20.0, 15.0, 15.0]) == {"gaussian_sigmas": [0.005, 0.05], "dp_epsilons": [30.0, 100.0]}
    assert suggest([40.0, 20.0, 20.0, 20.0]) == {"gaussian_sigmas": [1.0, 3.0], "dp_epsilons": [1.0, 3.0]}
    # nothing leaks even undefended, or the attacks ran short (their verdicts understate): no suggestion
    none = {"gaussian_sigmas": [], "dp_epsilons": []}
    assert suggest([15.0] * 4) == none and suggest([40.0, 20.0, 15.0, 15.0], iterations=3) == none
    # where the leaks stop: σ = 1e-3 leaks and 0.3 does not; no DP-SGD level leaks
    assert levels([40.0, 20.0, 15.0, 15.0])["leaks_stop"] == {"gaussian_sigma": [1e-3, 0.3], "dp_epsilon": []}
    assert levels([40.0, 20.0, 15.0, 15.0], iterations=3)["leaks_stop"] == {"gaussian_sigma": [], "dp_epsilon": []}
    # earlier audits' verdicts count: σ = 0.03 and ε = 30 leaked there, ε = 20 did not; this audit's own
    # verdict wins where both tested a level (σ = 0.3)
    both = levels([40.0, 20.0, 15.0, 15.0], earlier=({0.03: True, 0.3: True}, {30.0: True, 20.0: False}))
    assert both["leaks_stop"] == {"gaussian_sigma": [0.03, 0.3], "dp_epsilon": [30.0, 20.0]}
    assert both["next_levels"] == {"gaussian_sigmas": [0.05, 0.1], "dp_epsilons": []}  # 30 and 20: adjacent
    from leaklab.experiments.room_verdicts import levels_text

    text = levels_text({**both, "earlier_audits": ["runs/a"]})
    assert "The leaks stop between Gaussian noise σ = 0.03 (leaks) and σ = 0.3 (nothing leaks)" in text
    assert "one DP-SGD step at ε = 30 (leaks) and ε = 20" in text and "`--sigmas 0.05,0.1`" in text
    assert text.endswith("(From the verdicts of this audit and 1 earlier audit.)")
    assert levels_text(levels([15.0] * 4)) == ""  # nothing leaks at all: nothing to say


def test_audit_attacks_saved_room_cases(tmp_path, monkeypatch):
    cases = tmp_path / "cases"
    result = invoke("env", "capture", "--algorithm", "reinforce", "--setting", "S2", "--samples", "2",
                    "--layouts", "e1m1-stalactite", "--out", cases)
    assert result.exit_code == 0, result.output
    assert f"leaklab audit --cases {cases}" in result.output
    assert json.loads((cases / "capture.json").read_text())["cases"] == ["0000", "0001"]
    out = tmp_path / "audit"
    monkeypatch.setattr("leaklab.experiments.room_report.SHOWN_SAMPLES", 1)  # the report pictures 1 of the 2
    result = invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "the first 1 of 2 scored cases; results.json has every one" in html
    assert "At a glance" in html and "fewer than the 2000" in html and "--quick" not in html
    assert "could not read" not in result.output + html  # exact mode read both updates in closed form
    assert html.count(">yes</td>") + html.count(">no</td>") == 2  # each case's action judged
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["cases"] == 2 and res["summary"]["scored"] == 2
    # the glance counts the cases showing their room and its verdict names the best one's gain
    gains = [c["metrics"]["depth_paper_psnr"] - c["metrics"]["depth_paper_psnr_baseline"] for c in res["cases"]]
    shown = sum(g >= 3.0 for g in gains)
    assert f"<td>{shown} of 2</td>" in html
    best = max(range(2), key=lambda i: gains[i])
    assert (f"the best: RGI S2 depth of case {res['cases'][best]['case']} {gains[best]:+.1f} dB over its "
            "baseline" in html) == (shown > 0)
    assert all(c["algorithm"] == "rgi" for c in res["cases"])
    # the attack's own verdict on the action agrees with the truth: a zero return hides it
    assert all(c["action_identified"] == [c["metrics"]["action_informative"] == 1.0] for c in res["cases"])
    assert res["summary"]["iou_min"] > 0.999 and "2 scored; depth PSNR" in result.output
    # what the clients' (here no) defense left of each update, as the capture recorded it
    assert [c["metrics"]["update_cosine"] for c in res["cases"]] == [1.0, 1.0] and "update kept (cosine)" in html
    # every case's reconstruction as tensors, named by its case, the box and action those of results.json
    from leaklab.io import load_tensors

    recs, meta = load_tensors(out / "reconstructions.safetensors", "reconstructions")
    assert meta["format"] == "leaklab.room_case_reconstructions"
    assert set(recs) == {f"{c}/{k}" for c in ("0000", "0001") for k in ("images", "box", "action", "probs", "reward")}
    assert recs["0001/images"].shape == (1, 1, 150, 150) and recs["0001/action"].tolist() == res["cases"][1]["action"]
    assert recs["0000/box"].tolist() == res["cases"][0]["box"]
    assert "box IoU 1.0000" in result.output
    assert "data:image/png;base64," in (out / "report.html").read_text()
    result = invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", cases)
    assert result.exit_code == 2 and "would replace the input" in result.stderr
    assert len([p for p in cases.iterdir() if p.is_dir()]) == 2
    # a case without its truth is attacked and pictured as the server reconstructs it, unscored
    (cases / "0001" / "truth.safetensors").unlink()
    blind = tmp_path / "blind"
    assert invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", blind).exit_code == 0
    html = (blind / "report.html").read_text()
    assert "Reconstructions of the cases without their truth (depth)" in html and "the first 1 of 1" not in html
    figures = blind / "figures"
    assert (figures / "unscored.png").stat().st_size > 0 and not (figures / "unscored_rgb.png").exists()  # S2
    assert json.loads((blind / "results.json").read_text())["summary"]["scored"] == 1
    # a case of the capture without its view is an error, not a smaller audit; a stray folder is named
    (cases / "0001" / "view.json").rename(cases / "0001" / "view.json.bak")
    again = tmp_path / "again"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", again),
                      again, "case 0001 of its capture.json has no view.json")
    (cases / "0001" / "view.json.bak").rename(cases / "0001" / "view.json")
    (cases / "notes").mkdir()
    with pytest.warns(UserWarning, match="skipping 1 sub-folder without view.json: notes"):
        from leaklab.experiments.room_audit import _case_folders

        assert [p.name for p in _case_folders(cases)] == ["0000", "0001"]


def test_the_cases_report_pictures_rgb_and_counts_rgi_actions(tmp_path):
    """An S1 case was pictured in depth only, and RGI's actions never counted in the verdict."""
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(algorithm="reinforce", spec=PerceptionSpec(setting="S1"), samples=2,
                                    layouts=("e1m1-stalactite",)), cases)
    out = tmp_path / "audit"
    assert invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out).exit_code == 0
    html = (out / "report.html").read_text()
    assert (out / "figures" / "cases_rgb.png").stat().st_size > 0 and "reconstructions (RGB)" in html
    held = [c for c in json.loads((out / "results.json").read_text())["cases"] if all(c["action_identified"])]
    assert held, "both sampled returns are 0: choose other samples for this test"
    right = sum(c["metrics"]["action"] for c in held)
    assert f"{100 * right / len(held):.0f}% of {len(held)} case" in html


def test_audit_of_cases_checks_every_truth_before_attacking(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(algorithm="dqn", spec=PerceptionSpec(setting="S2"), samples=2,
                                    layouts=("e1m1-stalactite",)), cases)
    last = sorted(p for p in cases.iterdir() if p.is_dir())[-1] / "truth.safetensors"
    with safe_open(str(last), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    out = tmp_path / "audit"
    # not an object; more rooms than the update has transitions (the summary counted them as rooms audited);
    # a cosine that is none
    for provenance in ("[1, 2]", '{"layouts": ["e1m1-stalactite", "map01-hangar", "map02-vault"]}',
                       '{"update_cosine": [1.5]}', '{"update_cosine": [0.5, 0.5]}', '{"update_cosine": "high"}'):
        save_file(tensors, str(last), metadata={**meta, "provenance": provenance})
        assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out),
                          out, "provenance")


def test_audit_of_cases_refuses_batches_the_attack_cannot_read_before_attacking(tmp_path):
    out = tmp_path / "audit"
    for algorithm, batch, mode, limit in (("dqn", 3, "exact", 2), ("reinforce", 2, "paper", 1)):
        cases = tmp_path / algorithm
        with warnings.catch_warnings(record=True) as said:  # the capture itself warns of a batch over 2
            warnings.simplefilter("always")
            assert invoke("env", "capture", "--algorithm", algorithm, "--batch-size", batch, "--samples", "1",
                          "--layouts", "e1m1-stalactite", "--out", cases).exit_code == 0
        assert [str(w.message) for w in said if "at most 2 transitions" in str(w.message)] == \
            (["leaklab's room attacks read updates of at most 2 transitions (audit --cases refuses these 3); the "
              "cases are for attacks of your own"] if batch > 2 else [])
        assert_user_error(invoke("audit", "--cases", cases, "--mode", mode, "--out", out), out,
                          f"0000 is an update of {batch} transitions", f"reads at most {limit}")
    # a FedAvg update in the second case: refused before the first case is attacked (it was after)
    cases = tmp_path / "fedavg"
    assert invoke("env", "capture", "--samples", "2", "--layouts", "e1m1-stalactite", "--out", cases).exit_code == 0
    for name in ("view.json", "update.json"):
        path = cases / "0001" / name
        data = json.loads(path.read_text())
        data["metadata"]["kind"] = "fedavg"
        path.write_text(json.dumps(data))
    assert_user_error(invoke("audit", "--cases", cases, "--out", out), out,
                      "0001 is a fedavg update; the room attacks read FedSGD updates")
    assert not (tmp_path / ".leaklab-resume").exists()


def test_audit_refuses_conflicting_options(tmp_path):
    out = tmp_path / "a"
    assert_user_error(invoke("audit", "--quick", "--full", "--out", out), out, "--quick", "--full")
    assert_user_error(invoke("audit", "--cases", tmp_path, "--out", out), out, "no room case")
    assert_user_error(invoke("audit", "--cases", tmp_path / "nothing", "--out", out), out, "does not exist")
    # a negative count ran; an empty selection started the whole 48-sample table
    assert_user_error(invoke("audit", "--cases", tmp_path, "--workers", "-3", "--out", out), out, "--workers")
    assert_user_error(invoke("reproduce", "room-table1", "--cells", ",", "--out", out), out, "--cells",
                      "at least one name")
    assert_user_error(invoke("attack", "qgi", "--layouts", "", "--out", out), out, "--layouts")
    assert_user_error(invoke("env", "capture", "--entropy-weight", "0.5", "--out", out), out,
                      "--entropy-weight", "--algorithm reinforce")  # a DQN client has no entropy term: it was ignored
    assert_user_error(invoke("audit", "--kind", "robots", "--out", out), out, "--kind")
    assert_user_error(invoke("audit", "--quick", "--device", "tpu", "--out", out), out, "--device", "cpu or cuda")
    assert_user_error(invoke("audit", "--kind", "images", "--device", "cuda", "--out", out), out, "--device")
    assert_user_error(invoke("audit", "--kind", "images", "--mode", "paper", "--out", out), out, "--mode")
    assert_user_error(invoke("audit", "--kind", "images", "--model-class", "a.b:C", "--out", out), out,
                      "--model-class")
    assert_user_error(invoke("audit", "--full", "--mode", "paper", "--out", out), out, "--mode")
    assert_user_error(invoke("audit", "--quick", "--iterations", "0", "--out", out), out, "--iterations")
    assert_user_error(invoke("audit", "--quick", "--arch", "wide", "--out", out), out, "--arch", "nature")
    assert_user_error(invoke("audit", "--kind", "images", "--arch", "nature", "--out", out), out, "--arch")
    # the message names the option given, not every option of --kind rooms
    assert_user_error(invoke("audit", "--kind", "images", "--iterations", "3", "--out", out), out,
                      "error: --iterations: only for --kind rooms")
    assert_user_error(invoke("audit", "--cases", tmp_path, "--arch", "nature", "--out", out), out, "--arch",
                      "view.json")
    assert_user_error(invoke("audit", "--cases", tmp_path, "--train-steps", "5", "--out", out), out,
                      "--train-steps", "env capture --train-steps")
    assert_user_error(invoke("audit", "--kind", "images", "--train-steps", "5", "--out", out), out,
                      "error: --train-steps: only for --kind rooms")
    assert_user_error(invoke("audit", "--quick", "--train-steps", "-1", "--out", out), out, "--train-steps")
    assert_user_error(invoke("attack", "rgi", "--mode", "paper", "--batch-size", "2", "--out", out), out,
                      "paper-mode RGI", "batch_size 1")  # exact mode reads a batch of two
    assert_user_error(invoke("attack", "qgi", "--device", "cuda:x", "--out", out), out, "--device", "cpu or cuda")
    if not torch.cuda.is_available():
        assert_user_error(invoke("audit", "--quick", "--device", "cuda", "--out", out), out, "no CUDA")
        assert_user_error(invoke("audit", "--cases", tmp_path, "--device", "cuda:1", "--out", out), out, "no CUDA")


def test_room_table1_action_column_separates_zero_returns():
    from leaklab.experiments.room_tables import _action

    assert _action({"action_accuracy": 1.0}) == "100%"  # QGI
    rgi = {"action_accuracy": 0.65, "action_accuracy_nonzero_return": 1.0, "samples": 48, "zero_return_samples": 18}
    assert _action(rgi) == "65% (100% of 30 non-zero returns)"


def test_room_table1_names_the_cells_whose_stage1_started_again():
    from leaklab.experiments.room_tables import _restart_note

    assert _restart_note({"qgi-S1": {"stage1_restarted": 0}, "qgi-S2": {}}) == []
    note = _restart_note({"qgi-S1": {"stage1_restarted": 1}, "rgi-S1": {"stage1_restarted": 2}})
    assert note[-1].endswith("on QGI S1 1 sample, RGI S1 2 samples.")


def test_room_table1_runs_and_updates_a_docs_section(tmp_path):
    out = tmp_path / "t1"
    result = invoke("reproduce", "room-table1", "--mode", "exact", "--samples", "1", "--layouts", "1",
                    *FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    assert set(res["table"]) == {"qgi-S1", "qgi-S2", "rgi-S1", "rgi-S2"}
    assert "(26.46)" in (out / "table.md").read_text()  # the paper's QGI S2 depth PSNR beside ours
    assert res["paper"]["qgi-S2"]["depth_psnr_std"] == 7.68 and res["table"]["qgi-S2"]["depth_psnr_std"] == 0
    from leaklab.experiments.room_tables import update_docs

    docs = tmp_path / "reproductions.md"
    docs.write_text("# R\n\nkeep me\n")
    update_docs("room-table1", "TABLE A", "leaklab x", docs)
    update_docs("room-table1", "TABLE B", "leaklab y", docs)
    text = docs.read_text()
    assert "keep me" in text and "TABLE B" in text and "TABLE A" not in text and text.count(":start -->") == 1
    # a lone or repeated marker is refused, never used to replace text outside the section
    for broken in ("<!-- room-table1:start -->\nkeep me\n",
                   text + "\nquoting <!-- room-table1:start --> here\n",
                   "<!-- room-table1:end -->\nkeep me\n<!-- room-table1:start -->\n"):
        docs.write_text(broken)
        with pytest.raises(LeaklabError, match="markers"):
            update_docs("room-table1", "TABLE C", "leaklab z", docs)
        assert docs.read_text() == broken
    with pytest.raises(LeaklabError, match="not found"):
        update_docs("room-table1", "TABLE C", "leaklab z", tmp_path / "missing.md")
    smoke = invoke("reproduce", "room-table1", "--samples", "1", "--update-docs", "--out", tmp_path / "s")
    assert_user_error(smoke, tmp_path / "s", "--update-docs")


def test_env_capture_refuses_bad_options_and_writes_nothing(tmp_path):
    out = tmp_path / "cases"
    assert_user_error(invoke("env", "capture", "--algorithm", "ppo", "--out", out), out, "--algorithm", "reinforce")
    assert_user_error(invoke("env", "capture", "--setting", "S3", "--out", out), out, "--setting")
    assert_user_error(invoke("env", "capture", "--samples", "0", "--out", out), out, "--samples")
    assert_user_error(invoke("env", "capture", "--layouts", "nowhere", "--samples", "1", "--out", out), out,
                      "nowhere")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    result = invoke("env", "capture", "--samples", "1", "--out", mine)
    assert result.exit_code == 2 and "leaklab did not write" in result.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_env_contact_sheet(tmp_path):
    out = tmp_path / "rooms.png"
    result = invoke("env", "contact-sheet", "--layouts", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG)
    result = invoke("env", "contact-sheet", "--layouts", "1", "--out", out)  # its own image: replaced
    assert result.exit_code == 0, result.output
    # a folder, a user's file or another kind of file name is refused, before any room is rendered
    (tmp_path / "notes.png").write_text("my notes")
    (tmp_path / "folder.png").mkdir()
    for name, words in (("folder.png", "is a folder"), ("notes.png", "not a PNG image"), ("sheet.jpg", "*.png")):
        result = invoke("env", "contact-sheet", "--layouts", "1", "--out", tmp_path / name)
        assert result.exit_code == 2 and words in result.stderr and "Traceback" not in result.output, result.output
    assert (tmp_path / "notes.png").read_text() == "my notes" and not (tmp_path / "sheet.jpg").exists()
    # a folder that exists but takes no files (Linux's /proc, even for root): refused before any room
    result = invoke("env", "contact-sheet", "--layouts", "1", "--out", "/proc/rooms.png")
    assert result.exit_code == 2 and "cannot write in /proc" in result.stderr, result.output


def test_layouts_argument_and_summary_keys():
    assert len(layouts_arg("3")) == 3 and layouts_arg(None) is None
    assert layouts_arg("e1m3-column, e1m1-stalactite") == ("e1m3-column", "e1m1-stalactite")
    with pytest.raises(LeaklabError, match="unknown room layout 'b'"):
        layouts_arg("e1m3-column, b")
    assert {"rgb_psnr_mean", "depth_psnr_mean", "iou_mean", "action_accuracy"} <= set(SUMMARY_KEYS)


def test_audit_attacks_saved_cases_of_the_users_own_network(tmp_path):
    cls = "tests.plugins.narrow_net:NarrowNet"
    cases = tmp_path / "cases"
    assert_user_error(invoke("env", "capture", "--model-class", cls, "--arch", "nature", "--out", cases), cases,
                      "--arch", "--model-class")
    result = invoke("env", "capture", "--model-class", cls, "--samples", "2", "--layouts", "e1m1-stalactite",
                    "--out", cases)
    assert result.exit_code == 0, result.output
    assert f"--model-class {cls}`" in result.output
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--out", out), out,
                      "model.safetensors: model file does not fit", "the same --arch, or pass the --model-class",
                      f"(the cases were captured with --model-class {cls})")
    # leaklab's cases under a user's class: the error names that class, not leaklab's network
    ours = tmp_path / "ours"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, layouts=("e1m1-stalactite",)), ours)
    assert_user_error(invoke("audit", "--cases", ours, "--model-class", cls, "--out", out), out,
                      f"does not fit a {cls} model", "(the cases were captured with a network of leaklab)")
    # interrupted during the second case, then run again: the first case's attack is taken as saved
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_audit

    with pytest.raises(Interrupt):
        room_audit.run_cases(out, cases, RoomAttackConfig(iterations=3), workers=1, progress=interrupt_after(1),
                             model_class=cls)
    result = invoke("audit", "--cases", cases, "--model-class", cls, "--iterations", "3", "--workers", "1",
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert "1 resumed from an interrupted run" in result.output
    res = json.loads((out / "results.json").read_text())
    assert res["model_class"] == cls and res["summary"]["scored"] == 2 and res["summary"]["resumed_attacks"] == 1
    assert res["summary"]["iou_min"] > 0.999 and res["summary"]["q_target_err_mean"] < 0.01
    # another class with the same parameters reads the files: the audit runs, but says whose cases they were
    bare = "tests.plugins.narrow_net:Bare"
    with pytest.warns(UserWarning, match=f"captured with --model-class {cls}, and are attacked as updates of "
                                         f"--model-class {bare}"):
        room_audit.run_cases(tmp_path / "bare", cases, RoomAttackConfig(iterations=3), workers=1, model_class=bare)


def test_cases_report_says_when_exact_mode_fell_back_on_an_undefended_update(tmp_path):
    """A batch of two through a head with Tanh is outside exact mode's closed forms: the attack falls back
    to the paper's optimisation, and its low scores must not read as a private update."""
    cls = "tests.plugins.narrow_net:TanhHead"
    cases = tmp_path / "cases"
    assert invoke("env", "capture", "--model-class", cls, "--batch-size", "2", "--samples", "1", "--layouts",
                  "e1m1-stalactite", "--out", cases).exit_code == 0
    out = tmp_path / "audit"
    with pytest.warns(UserWarning, match=r"could not read 1 undefended case \(0000\), whose network computes"):
        result = invoke("audit", "--cases", cases, "--model-class", cls, "--iterations", "3", "--workers", "1",
                        "--out", out)
    assert result.exit_code == 0, result.output
    assert "not a private update" in (out / "report.html").read_text()
    assert "features" not in json.loads((out / "results.json").read_text())["cases"][0]["exact"]


def test_the_fallback_caveat_names_its_cause():
    """A QGI batch of two transitions with one action is outside exact mode on any network (its output
    errors are one direction); other undefended fallbacks are the network's doing."""
    from leaklab.experiments.room_report import fallback_caveat

    def row(case, algorithm="qgi", action=(1, 2), exact=(), **more):
        return {"case": case, "algorithm": algorithm, "action": list(action), "defense": None,
                "exact": list(exact), **more}

    rows = [row("a", action=(3, 3)), row("b"), row("c", exact=("box", "features")),
            row("d", defense="gaussian:1"), row("e", no_signal=True)]
    results = {"attack": {"mode": "exact"}, "cases": rows}
    text = fallback_caveat(results)
    assert "1 undefended QGI batch (a) whose transitions share their action and 1 undefended case (b), whose " \
           "network computes" in text
    assert fallback_caveat({**results, "cases": rows[2:]}) == ""
    assert fallback_caveat({**results, "attack": {"mode": "paper"}}) == ""


def test_cases_without_the_gradient_the_attack_reads_are_named_and_kept_out_of_the_action(tmp_path):
    """A client that sends only the largest 0.01% of its update zeroes the last bias gradient: the audit
    says which cases held nothing to read, and their guessed action does not count as the action leaking
    or not."""
    cases = tmp_path / "cases"
    assert invoke("env", "capture", "--samples", "1", "--layouts", "e1m1-stalactite", "--defense", "topk:0.9999",
                  "--out", cases).exit_code == 0
    out = tmp_path / "audit"
    with pytest.warns(UserWarning, match=r"1 case \(0000\) of 1 holds an update whose last bias gradient is all zero"):
        result = invoke("audit", "--cases", cases, *FAST, "--out", out)
    assert result.exit_code == 0, result.output
    report = (out / "report.html").read_text()
    assert "none read (no gradient the attack reads)" in report and "holds an update whose last bias" in report
    assert ">action</th>" in report and "% of 1 case" not in report  # no case holds the action


@pytest.mark.parametrize("cls, words", [
    ("tests.plugins.narrow_net:NoHead", ["contract", "box starting with a Linear with bias"]),
    ("tests.plugins.narrow_net:Missing", ["module tests.plugins.narrow_net has no 'Missing'"]),
    ("tests.plugins.nowhere:Net", ["cannot be imported", "PYTHONPATH"]),
    ("narrow_net", ["package.module:Class"]),
])
def test_bad_model_class_is_refused(tmp_path, cls, words):
    """The class is at fault, not the case's model file nor the class the cases were captured with."""
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, layouts=("e1m1-stalactite",)),
                  cases)
    out = tmp_path / "audit"
    result = invoke("audit", "--cases", cases, "--model-class", cls, "--out", out)
    assert_user_error(result, out, *words)
    assert "model.safetensors" not in result.stderr and "captured with" not in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["folder", "pipe", "broken link"])
def test_a_truth_that_is_no_file_is_an_error_not_an_unscored_case(tmp_path, kind):
    """formats.md: a truth file is read or refused; a folder or a pipe in its place passed for a case
    whose truth the user left out (reported as unscored, without a word)."""
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, layouts=("e1m1-stalactite",)),
                  cases)
    truth = next(cases.glob("*/truth.safetensors"))
    truth.unlink()
    {"folder": truth.mkdir, "pipe": lambda: os.mkfifo(truth),
     "broken link": lambda: truth.symlink_to(truth.parent / "gone.safetensors")}[kind]()
    out = tmp_path / "audit"
    words = {"folder": "not a regular file", "pipe": "not a regular file",
             "broken link": "is a link to " + str(truth.parent / "gone.safetensors") + ", which does not exist"}
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--out", out), out, "truth file",
                      str(truth), words[kind])


def test_a_batch_update_pictures_and_lists_each_transition_against_its_own_reconstruction(tmp_path, monkeypatch):
    """A batch of two was pictured by its first transition, captioned with the update's mean PSNR, and an
    audited case listed its actions in the attack's order beside its layouts in the truth's."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack, room_audit
    from leaklab.io import load_tensors

    grids = []
    monkeypatch.setattr(room_attack, "image_grid_png", lambda setting, truths, recs, title, path, captions:
                        grids.append((truths, recs, captions)))
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, batch_size=2,
                                       layouts=("e1m1-stalactite", "e1m3-column"),
                                       attack=RoomAttackConfig(iterations=20), workers=1)
    results = room_attack.run(config, tmp_path / "run")
    (truths, recs, captions), = grids
    assert len(truths) == len(recs) == len(captions) == 4  # both transitions of both updates
    for u, row in enumerate(results["samples"]):
        mean = sum(float(c.removesuffix(" dB")) for c in captions[2 * u:2 * u + 2]) / 2
        assert abs(mean - row["metrics"]["depth_paper_psnr"]) < 0.06, (captions, row["metrics"])
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, batch_size=2,
                                    layouts=("e1m1-stalactite", "e1m3-column")), cases)
    monkeypatch.setattr(room_audit, "matched", lambda rec, truth: [1, 0])  # the second reconstruction first
    results = room_audit.run_cases(tmp_path / "audit", cases, RoomAttackConfig(iterations=3), workers=1)
    row, = results["cases"]
    recovered = load_tensors(tmp_path / "audit" / "reconstructions.safetensors", "reconstructions")[0]
    name = row["case"]
    assert row["action"] == recovered[f"{name}/action"].flip(0).tolist()  # the rows follow the match given
    assert row["box"] == recovered[f"{name}/box"].flip(0).tolist()


def saved_cell(config):
    """What ``room_attack.run`` writes about a cell's computation."""
    from leaklab.attacks.rl.config import METHOD_VERSION
    from leaklab.models.perception import architecture_digest
    return {"config": config.model_dump(mode="json"), "network": architecture_digest(config.spec),
            "method_version": METHOD_VERSION[config.attack.mode]}


def test_saved_table_cells_are_reused_whatever_the_worker_count():
    from leaklab.experiments.room_attack import RoomRunConfig
    from leaklab.experiments.room_tables import _same_cell

    config = RoomRunConfig(samples=2, workers=2)
    assert _same_cell(saved_cell(RoomRunConfig(samples=2, workers=16)), config)
    assert not _same_cell(saved_cell(RoomRunConfig(samples=3, workers=2)), config)
    assert not _same_cell(None, config)


def test_saved_cells_of_another_network_or_of_unknown_network_are_not_reused():
    from leaklab.experiments.room_attack import RoomRunConfig
    from leaklab.experiments.room_tables import _same_cell

    config = RoomRunConfig(setting="S1", samples=2)
    other = saved_cell(RoomRunConfig(setting="S1", arch="stacked", samples=2))
    assert not _same_cell({**other, "config": config.model_dump(mode="json")}, config)
    assert not _same_cell({"config": config.model_dump(mode="json")}, config)  # written before digests


def test_saved_cells_of_an_earlier_method_are_not_reused():
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments.room_attack import RoomRunConfig
    from leaklab.experiments.room_tables import _same_cell

    exact, paper = RoomRunConfig(samples=2), RoomRunConfig(samples=2, attack=RoomAttackConfig(mode="paper"))
    before = lambda config: {k: v for k, v in saved_cell(config).items() if k != "method_version"}  # noqa: E731
    assert not _same_cell(before(exact), exact)  # exact mode has changed since (the layerwise stage)
    assert not _same_cell({**saved_cell(exact), "method_version": 1}, exact)
    assert not _same_cell(before(paper), paper)  # paper mode too (stage 1 starts again since version 2)
    assert not _same_cell({**saved_cell(paper), "method_version": 1}, paper)
    assert _same_cell(saved_cell(paper), paper)


def test_exact_mode_settings_do_not_invalidate_saved_paper_cells():
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments.room_attack import RoomRunConfig
    from leaklab.experiments.room_tables import _same_cell

    def run(**attack):
        return RoomRunConfig(samples=2, attack=RoomAttackConfig(**attack))

    older = saved_cell(run(mode="paper"))  # written before paper mode refused exact-mode settings
    older["config"]["attack"]["gradient_weight"] = 0.0
    assert _same_cell(older, run(mode="paper"))
    assert not _same_cell(saved_cell(run(mode="exact", gradient_weight=0.0)), run(mode="exact"))
    assert not _same_cell(saved_cell(run(mode="paper", tv_weight=0.2)), run(mode="paper"))
    assert not _same_cell(saved_cell(run(mode="paper")), run(mode="paper").model_copy(update={"device": "cuda"}))


def test_attacks_in_this_process_leave_its_torch_thread_count_alone():
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(mode="exact", iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=1, layouts=("e1m1-stalactite",),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, clean[0].update, attack)]
    results = []
    torch.set_num_threads(2)
    try:
        attack_pool.run_jobs(jobs, 1, lambda i, rec: results.append(rec))  # one worker: in this process
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert len(results) == 1 and results[0].iterations == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_the_share_of_each_running_attack(workers):
    """A long sample moves the bar while it runs, in this process and from worker processes."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(mode="exact", iterations=200)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2,
                                       layouts=("e1m1-stalactite",), attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]
    results, seen = [], []
    attack_pool.run_jobs(jobs, workers, lambda i, rec: results.append((i, len(seen))), seen.append)
    assert [i for i, _ in results] == [0, 1]
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 2
    # at the start, every 50 of the 200 image steps of each sample, and once per result
    assert len(seen) == 1 + 2 * 4 + 2 and {0.25, 0.5, 0.75} <= set(seen)


def test_a_defense_that_prunes_every_bias_gradient_is_scored_not_fatal(tmp_path):
    out = tmp_path / "pruned"
    result = invoke("attack", "qgi", "--defense", "topk:0.9999", "--samples", "1", "--layouts", "1", *FAST,
                    "--out", out)
    assert result.exit_code == 0, result.output
    row = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert row["no_signal"] is True and row["exact"] == [] and row["metrics"]["q_target_error"] == 100.0
    assert "ran 3 image iterations" in result.stderr  # as asked (the attack ran none: nothing to read)
    assert "1 sample (0) of 1 holds an update whose last bias gradient is all zero" in result.stderr
    # the server got the largest 0.01% of the entries: part of the update's direction, not all of it
    assert 0 < row["metrics"]["update_cosine"] < 1


def test_the_update_cosine_is_that_of_what_the_attack_received(tmp_path):
    """Each row's update_cosine is that of the update its attack was handed: the same noise draw."""
    import statistics

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack
    from leaklab.metrics import cosine_similarity
    from leaklab.metrics.vectors import update_cosine

    config = room_attack.RoomRunConfig(setting="S2", samples=2, layouts=layouts_arg("2"), seed=3, workers=1,
                                       defense="gaussian:0.001", attack=RoomAttackConfig(iterations=3))
    res = room_attack.run(config, tmp_path / "noised")
    state, samples = room_attack.capture_samples(config)
    for row, sample in zip(res["samples"], samples):
        sent = room_attack.attack_job(config, state, sample, config.defense).update.tensors
        names = sorted(sent)
        truth = cosine_similarity([sample.update.tensors[n] for n in names], [sent[n] for n in names])
        assert row["metrics"]["update_cosine"] == pytest.approx(truth, rel=1e-12)
        # another draw of the same noise level keeps a different cosine: the row's is this draw's
        other = room_attack.attack_job(config.model_copy(update={"seed": 4}), state, sample, config.defense)
        assert update_cosine(sample.update.tensors, other.update.tensors) != pytest.approx(truth, rel=1e-9)
    assert res["summary"]["update_cosine_median"] == pytest.approx(
        statistics.median(r["metrics"]["update_cosine"] for r in res["samples"]))
    # DP-SGD's noise (std 0.6 on each of about 1.9 million entries, the update clipped to norm 1) leaves a
    # single update next to nothing of its direction; noise of std 0.001 leaves most of a large one
    dp = room_attack.attack_job(config, state, samples[0], "clip:1,gaussian:0.6").update
    assert abs(update_cosine(samples[0].update.tensors, dp.tensors)) < 0.01
    assert 0.5 < res["samples"][0]["metrics"]["update_cosine"] < 1
    assert update_cosine(samples[0].update.tensors, samples[0].update.tensors) == 1.0


@pytest.mark.parametrize("iterations", [None, 300])
def test_table2_joint_row_gets_the_separate_rows_step_count(iterations):
    """Fig. 4 compares joint and separate optimisation at the same number of Adam steps: the separate
    rows run stage 1 and then ``iterations`` image steps, the joint row their sum in one stage."""
    from leaklab.experiments.room_tables import table2_cells

    cells = table2_cells(4, None, iterations, "small", 0, 1, "cpu")
    separate, joint = cells["error-direction"].attack, cells["joint"].attack
    assert joint.multimodal == "joint" and separate.multimodal == "separate"
    assert joint.iterations == separate.stage1_iterations + separate.iterations
    assert separate.iterations == (iterations or 2000)
    assert all(c.attack.iterations == separate.iterations for n, c in cells.items() if n != "joint")


def test_rgi_summary_counts_samples_not_updates_in_a_batch():
    """A batch row holds its samples' means: a mixed batch (one zero return) must count one sample
    with a non-zero return, and whether that one's action was right."""
    from leaklab.experiments.room_attack import summarise

    def row(action, informative, correct, layouts=("a", "b")):
        return {"layouts": list(layouts), "batch_size": 2,
                "metrics": {"action": action, "action_informative": informative,
                            "action_informative_correct": correct}}
    # the zero-return sample guessed right, the other wrong; then a batch of two non-zero returns, right
    s = summarise([row(0.5, 0.5, 0.0), row(1.0, 1.0, 1.0)], 1, 1.0)
    assert s["action_accuracy_nonzero_return"] == pytest.approx(2 / 3) and s["zero_return_samples"] == 1
    assert s["samples"] == 2 and s["transitions"] == 4  # updates, as before, and their transitions
    # a user's case without provenance names no rooms: its batch still counts two samples
    s = summarise([row(0.5, 0.5, 0.0, layouts=()), row(1.0, 1.0, 1.0, layouts=())], 1, 1.0)
    assert s["action_accuracy_nonzero_return"] == pytest.approx(2 / 3) and s["zero_return_samples"] == 1


def test_summary_counts_the_rows_whose_stage1_started_again():
    from leaklab.experiments.room_attack import summarise

    rows = [{"layouts": ["a"], "batch_size": 1, "metrics": {"action": 1.0}, "stage1_starts": n} for n in (1, 3, 1)]
    assert summarise(rows, 1, 1.0)["stage1_restarted"] == 1
    exact = [{k: v for k, v in r.items() if k != "stage1_starts"} for r in rows]
    assert "stage1_restarted" not in summarise(exact, 1, 1.0)  # no stage 1: nothing to count


def test_audit_arch_reaches_every_cell():
    from leaklab.experiments.room_audit import AuditConfig, _cell_configs

    cells = _cell_configs(AuditConfig(arch="nature", samples=1))
    assert len(cells) == 4 and {run.arch for _, run in cells} == {"nature"}
    assert {run.spec.arch for _, run in cells} == {"nature"}


def test_an_interrupted_attack_resumes_from_its_finished_samples(tmp_path):
    """Ctrl-C keeps the finished attacks beside --out; the same run attacks only the rest and gives
    the rows of an uninterrupted run; a finished run leaves no journal behind."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=3, layouts=layouts_arg("3"),
                                       attack=RoomAttackConfig(iterations=3), workers=1)
    (tmp_path / "a").mkdir()
    out = tmp_path / "a" / "run"
    with pytest.raises(Interrupt):
        room_attack.run(config, out, progress=interrupt_after(2))
    assert not out.exists()
    saved = sorted((tmp_path / "a" / RESUME_DIR).iterdir())
    assert len(saved) == 2 and all(p.suffix == ".safetensors" for p in saved)
    calls = []
    resumed = room_attack.run(config, out, progress=lambda task, done, total: calls.append((task, done, total)))
    assert resumed["summary"]["resumed_samples"] == 2
    # the client episodes are captured (and counted) first; the saved samples count as done from the
    # attacks' start (so the time a progress line estimates is the new attacks'), then the third is attacked
    assert calls[:4] == [("capture qgi S2", n, 3) for n in (0, 1, 2, 3)]
    assert calls[4] == ("qgi S2", 2, 3) and calls[-1] == ("qgi S2", 3, 3)
    assert all(done >= 2 for _, done, _ in calls[4:])
    assert not (tmp_path / "a" / RESUME_DIR).exists()
    fresh = room_attack.run(config, tmp_path / "b" / "run")
    assert fresh["summary"]["resumed_samples"] == 0
    assert [r["metrics"] for r in resumed["samples"]] == [r["metrics"] for r in fresh["samples"]]
    assert [r["index"] for r in resumed["samples"]] == [0, 1, 2]


@pytest.mark.parametrize("workers", [1, 2])
def test_run_jobs_takes_what_the_journal_holds_and_attacks_the_rest(tmp_path, workers):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import AttackJournal
    from leaklab.rl.capture import defended

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="rgi", setting="S2", samples=3, layouts=layouts_arg("3"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("rgi", config.spec, state, s.update, attack) for s in clean]
    journal = AttackJournal(tmp_path, jobs)
    assert len(set(journal.digests)) == 3
    first = []
    assert attack_pool.run_jobs(jobs, 1, lambda i, rec: first.append(rec), journal=journal) == 0
    # a lost entry is attacked again, a corrupt one too; the others come back as saved
    (tmp_path / ".leaklab-resume" / f"{journal.digests[0]}.safetensors").unlink()
    (tmp_path / ".leaklab-resume" / f"{journal.digests[2]}.safetensors").write_bytes(b"\0" * 16)
    second = []
    assert attack_pool.run_jobs(jobs, workers, lambda i, rec: second.append((i, rec)),
                                journal=AttackJournal(tmp_path, jobs)) == 1
    assert [i for i, _ in second] == [0, 1, 2]
    for a, (_, b) in zip(first, second):
        assert torch.equal(a.images, b.images) and torch.equal(a.reward, b.reward)
        assert torch.equal(a.probs, b.probs) and torch.equal(a.action_identified, b.action_identified)
        assert (a.iterations, a.exact, a.no_signal, a.stage1_starts) == \
            (b.iterations, b.exact, b.no_signal, b.stage1_starts)
    assert second[1][1].seconds == first[1].seconds  # the saved attack's own time, not a new one
    from dataclasses import replace

    journal.add(0, replace(first[0], stage1_starts=3))  # paper mode's count of stage 1's starts is kept
    assert AttackJournal(tmp_path, jobs).load(0).stage1_starts == 3
    # an entry that reads back but not in the job's shapes is not taken either

    journal.add(1, replace(first[1], box=first[1].box[:, :3]))
    reread = AttackJournal(tmp_path, jobs)
    assert reread.held() == {0, 1, 2} and reread.load(1) is None and reread.load(0) is not None
    # it is attacked in its turn, by a pool too (entries are read as their turn comes, not up front)
    for k in (0, 2):
        (tmp_path / ".leaklab-resume" / f"{journal.digests[k]}.safetensors").unlink()
    third = []
    assert attack_pool.run_jobs(jobs, workers, lambda i, rec: third.append((i, rec)),
                                journal=AttackJournal(tmp_path, jobs)) == 0
    assert [i for i, _ in third] == [0, 1, 2]
    assert all(torch.equal(a.images, b.images) and torch.equal(a.box, b.box) for a, (_, b) in zip(first, third))
    # another attack configuration, defense or network state names other jobs
    other = [attack_pool.Job("rgi", config.spec, state, s.update, RoomAttackConfig(iterations=3)) for s in clean]
    noisy = [attack_pool.Job("rgi", config.spec, state, defended(s.update, "gaussian:1e-3", 0, s.index), attack)
             for s in clean]
    moved = {k: v + 1e-3 if k.endswith("bias") else v for k, v in state.items()}
    shifted = [attack_pool.Job("rgi", config.spec, moved, s.update, attack) for s in clean]
    for jobs_b in (other, noisy, shifted):
        assert not set(AttackJournal(tmp_path, jobs_b).digests) & set(journal.digests)
    # a run that ends says what other runs left behind, and keeps it
    AttackJournal(tmp_path, other).add(0, first[0])
    with pytest.warns(UserWarning, match="still holds 1 finished attack"):
        journal.discard()
    assert len(list((tmp_path / ".leaklab-resume").iterdir())) == 1


def test_a_pool_that_meets_an_error_drops_its_queue_and_keeps_the_running_attacks(tmp_path):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR, AttackJournal

    attack = RoomAttackConfig(iterations=100)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=12, layouts=layouts_arg("4"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]

    def stop(i, rec):
        raise OSError("no space left on device")

    with pytest.raises(OSError):
        attack_pool.run_jobs(jobs, 2, stop, journal=AttackJournal(tmp_path, jobs))
    # the first result and the one running beside it are kept; the queue is dropped (only the few
    # jobs the pool had already handed its workers' call queue still run, and are kept)
    kept = len(list((tmp_path / RESUME_DIR).iterdir()))
    assert 2 <= kept < len(jobs), kept


def test_ctrl_c_stops_a_pools_workers_at_once(tmp_path):
    """Not after the running and the queued attacks have run (a terminal's Ctrl-C interrupts the
    workers' running attacks too, so waiting kept only the queued ones, which nobody asked for)."""
    import multiprocessing

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR, AttackJournal

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=4, layouts=layouts_arg("4"),
                                       attack=RoomAttackConfig(iterations=2))
    state, clean = room_attack.capture_samples(config)
    # the first attack is over in a second, the others would take minutes
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update,
                            RoomAttackConfig(iterations=2 if s.index == 0 else 20000)) for s in clean]

    def stop(i, rec):
        raise Interrupt

    with pytest.raises(Interrupt):
        attack_pool.run_jobs(jobs, 2, stop, journal=AttackJournal(tmp_path, jobs))
    assert len(list((tmp_path / RESUME_DIR).iterdir())) == 1  # the finished attack is kept
    assert not multiprocessing.active_children()


_WITHOUT_SHARED_MEMORY = """
import torch
from leaklab.attacks.rl import RoomAttackConfig
from leaklab.experiments import attack_pool, room_attack

attack = RoomAttackConfig(iterations=2)
config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=("e1m1-stalactite",),
                                   attack=attack)
state, clean = room_attack.capture_samples(config)
jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack) for s in clean]

def no_shared_memory(*args, **kwargs):
    raise RuntimeError("a tensor passed through shared memory")

torch.UntypedStorage._share_fd_cpu_ = torch.UntypedStorage._share_filename_cpu_ = no_shared_memory
results = []
attack_pool.run_jobs(jobs, 2, lambda i, rec: results.append((i, rec.iterations)))
print(results)
"""


def test_the_pool_passes_jobs_and_results_without_shared_memory():
    """Docker caps /dev/shm at 64 MB by default and an S1 job is 30 MB: with 25 MB, a 2-worker S1 attack
    waited forever while torch passed the jobs' tensors through shared memory (so did this check: it
    runs in a process of its own, with a time limit)."""
    run = subprocess.run([sys.executable, "-c", _WITHOUT_SHARED_MEMORY], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and run.stdout.strip() == "[(0, 2), (1, 2)]", run.stderr[-2000:]


@pytest.mark.parametrize("model_class,printed", [("Dies", ""), ("Crashes", "Segmentation fault")])
def test_a_worker_process_that_dies_is_a_one_line_error(model_class, printed, capfd):
    """A worker killed for memory (or crashed) broke the pool with a traceback; one that crashes in native
    code prints where, as the command's own process does (the pool passes on its fault handler)."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=layouts_arg("2"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    jobs = [attack_pool.Job("qgi", config.spec, state, s.update, attack,
                            model_class=f"tests.plugins.narrow_net:{model_class}") for s in clean]
    with pytest.raises(LeaklabError, match="an attack worker process ended abruptly"):
        attack_pool.run_jobs(jobs, 2, lambda i, rec: None)
    err = capfd.readouterr().err
    assert printed in err and (not printed or "narrow_net.py" in err)


def test_run_jobs_builds_a_job_list_as_the_pool_needs_it():
    """The paper-scale audit's 1,920 defended updates (15 MB each in S1) must not all be held at once."""
    import weakref

    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import attack_pool, room_attack

    attack = RoomAttackConfig(iterations=2)
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=12, layouts=layouts_arg("4"),
                                       attack=attack)
    state, clean = room_attack.capture_samples(config)
    built, delivered, alive, most = [], [], set(), [0]

    def make(i):
        job = attack_pool.Job("qgi", config.spec, state, clean[i].update, attack)
        built.append(i)
        alive.add(i)
        weakref.finalize(job, alive.discard, i)  # once the pool lets go of it
        most[0] = max(most[0], len(alive))
        return job

    attack_pool.run_jobs(attack_pool.JobList(12, make), 2, lambda i, rec: delivered.append(i))
    assert delivered == list(range(12)) and sorted(built) == list(range(12))
    # two running and QUEUED_PER_WORKER more per worker queued (one more while a result comes back)
    assert most[0] <= 2 * (1 + attack_pool.QUEUED_PER_WORKER) + 1, most[0]
    with pytest.raises(IndexError):
        attack_pool.JobList(12, make)[12]


def test_a_users_network_class_is_known_by_its_module_source(tmp_path, monkeypatch):
    """An edited class is another network: attacks saved for the old one are not taken for it."""
    import os
    from leaklab.experiments.attack_journal import network_identity

    source = (Path(__file__).parent / "plugins" / "narrow_net.py").read_text()
    module = tmp_path / "my_rooms_net.py"
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = PerceptionSpec(setting="S2")
    first = network_identity(spec, "my_rooms_net:NarrowNet")
    assert first == network_identity(spec, "my_rooms_net:NarrowNet") != network_identity(spec, None)
    module.write_text(source.replace("nn.Linear(64, spec.num_actions)", "nn.Linear(64, spec.num_actions)  # v2"))
    os.utime(module, (1, 1))  # another modification time, whatever the clock's resolution
    assert network_identity(spec, "my_rooms_net:NarrowNet") != first


def test_a_journal_that_cannot_be_written_warns_once_and_the_run_goes_on(tmp_path):
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack
    from leaklab.experiments.attack_journal import RESUME_DIR

    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, layouts=layouts_arg("2"),
                                       attack=RoomAttackConfig(iterations=2), workers=1)
    blocker = tmp_path / RESUME_DIR
    blocker.write_text("a file where the journal's folder goes")
    with pytest.warns(RuntimeWarning, match="will not resume") as caught:
        results = room_attack.run(config, tmp_path / "run")
    assert results["summary"]["samples"] == 2 and len(caught) == 1
    assert blocker.read_text() == "a file where the journal's folder goes"
