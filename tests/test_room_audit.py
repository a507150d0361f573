"""`leaklab audit` on the rooms (the main job): the report, the defense levels, both modes, a trained
network, the verdicts in words, the levels to audit next, and refusals of conflicting options."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_helpers import PNG, Interrupt, assert_user_error, interrupt_after, invoke
from leaklab.names import DEFAULT_ARCH


def audit_in_a_new_process(*args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`leaklab audit ARGS` in a new Python that first imports what the Makefile's install imports to byte-compile
    the audit's modules (AUDIT_IMPORTS): the finished process, and the modules of the venv and of leaklab that the
    audit imported beyond those (each compiled by every process that imports it, at every run)."""
    makefile = (Path(__file__).parents[1] / "Makefile").read_text().replace("\\\n", " ")
    listed = re.search(r"^AUDIT_IMPORTS := (.+)$", makefile, re.M).group(1)
    script = f"""import atexit, pathlib, sys, sysconfig, {listed}
PIL.Image.init()
before = set(sys.modules)
roots = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], leaklab.__path__[0])
atexit.register(lambda: pathlib.Path("imported.txt").write_text(" ".join(
    n for n, m in list(sys.modules.items()) if n not in before and str(getattr(m, "__file__", "")).startswith(roots))))
from leaklab.cli import app
app(["audit", *sys.argv[1:]], prog_name="leaklab")
"""
    out = Path(args[args.index("--out") + 1])
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=out.parent, capture_output=True, text=True)
    return done, (out.parent / "imported.txt").read_text().split()


def test_quick_room_audit_writes_report_with_defenses(tmp_path):
    """... after an interrupted audit in the same folder (the audit picks a new runs/<id> each time),
    whose finished attacks it takes instead of attacking them again; the command runs in a new process that
    imports no module of the venv the Makefile's install leaves uncompiled."""
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
    result, uncompiled = audit_in_a_new_process("--quick", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not uncompiled, f"add to the Makefile's AUDIT_IMPORTS: {uncompiled}"
    # interrupted in the fourth attack: the third, behind DP-SGD, whose update shows nothing of the features above
    # the noise, ran no image stage (exact method version 27) and reported no step before it ended
    assert "3 attacks resumed from an interrupted run" in result.stdout
    assert "warning: these attacks ran 3 image iterations" in result.stderr  # its verdicts understate the leaks
    unread = "2 updates of 6 showed nothing of the conv features above the noise"  # behind DP-SGD
    assert unread in result.stdout and unread in (out / "report.html").read_text()
    assert json.loads((out / "results.json").read_text())["summary"]["resumed_attacks"] == 3
    assert "attacks resumed from an interrupted run" in (out / "report.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit", "imported.txt"]  # the journal went with its run
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
    # written to 6 digits, never under the calibrated std: the release spends at most the ε it is named by
    from leaklab.experiments.room_audit import dpsgd_defense

    for epsilon in (0.37, 1.0, 8.0, 30.0, 1000.0):
        written = float(dpsgd_defense(epsilon).removeprefix("clip:1,gaussian:"))
        assert analytic_gaussian_sigma(epsilon, 1e-5) <= written <= analytic_gaussian_sigma(epsilon, 1e-5) * (1 + 1e-5)
    clean = next(c for c in res["cells"] if c["defense"] == "none" and c["algorithm"] == "qgi")
    assert clean["summary"]["iou_min"] > 0.999
    # what each defense costs: the cosine an update keeps, reported beside what leaks
    kept = {(c["algorithm"], c["defense"]): c["summary"]["update_cosine_median"] for c in res["cells"]}
    assert all(kept[(a, "none")] == 1.0 and abs(kept[(a, "DP-SGD ε=8")]) < 0.01 for a in ("qgi", "rgi"))
    assert "update kept (cosine)" in (out / "report.html").read_text()
    # and what each lets through of the room's conv features, as the server estimates it without the truth
    read = {(c["algorithm"], c["defense"]): c["summary"]["feature_cosine_median"] for c in res["cells"]}
    assert all(read[(a, "none")] == 1.0 and read[(a, "DP-SGD ε=8")] < 0.2 for a in ("qgi", "rgi"))
    assert "features read (cosine, estimated)" in html and ", features read " in result.stdout
    assert (out / "figures" / "leakage_per_defense.png").read_bytes().startswith(PNG)
    assert "At a glance" in html and "leaks the target&#39;s box" in html  # 3 image steps: not the room
    # 3 image steps: the report says that its verdicts understate the leak, and how much the attacks did
    assert "fewer than the 2000 they take by default" in html and "1 sample per cell from 1 room" in html
    # RGI's share of updates with a policy-gradient part is shown for clean updates only (noise passes for one)
    rgi = [line for line in result.stdout.splitlines() if line.strip().startswith("RGI")]
    assert [("policy-gradient part found" in line) for line in rgi] == [True, False, False], rgi
    # 3 image steps: no levels to audit next are suggested from verdicts that understate the leak
    assert res["summary"]["next_levels"] == {"gaussian_sigmas": [], "dp_epsilons": []}
    assert "To pin down" not in result.stdout and "To pin down" not in html
    # exact mode alone behind noise: the report and the command say that the paper's method may show more
    assert "Behind noise the verdicts are exact mode" in html
    assert "Behind noise the verdicts are exact mode" in result.stdout


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
    assert [r.shown for r in rows] == ["0 of 1", "0 of 1"] and rows[0].action.startswith("1 of 1 update (100%")
    assert rows[0].where.endswith(" mode)")
    # the features exact mode read: all of them untouched, less behind the noise (paper mode reads none)
    assert rows[0].features == "1" and 0 <= float(rows[1].features) < 1
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "each update counts once" in html and "the verdicts are exact mode" not in html  # paper's ran too


def test_an_exact_mode_audit_behind_noise_says_the_paper_method_may_show_more():
    """Behind noise the paper's method, fitted to every gradient, can show a room exact mode misses
    (docs/reproductions.md): an exact-mode audit of noised updates says so, and no other does."""
    from leaklab.experiments.room_verdicts import noise_caveat

    for chains in ([None, "gaussian:0.001"], ["clip:1,gaussian:0.6"], ["prune:0.5,laplace:0.1"]):
        text = noise_caveat(["exact"], chains)
        assert "`--mode paper`" in text and "`--mode both`" in text, chains
        scored = {"defense": chains[-1], "metrics": {}}
        one = [{"algorithm": "rgi", "action": [3], **scored}, {"algorithm": "qgi", "action": [1, 2], **scored}]
        assert "`--mode both`" not in noise_caveat(["exact"], chains, cases=one)  # a cases audit runs one mode
        assert "not RGI's batches of two" not in noise_caveat(["exact"], chains, cases=one)
        assert "not RGI's batches of two" in noise_caveat(["exact"], chains, cases=[{"algorithm": "rgi",
                                                                                     "action": [3, 0], **scored}])
        # saved cases none of which scored have no verdicts to caveat
        assert noise_caveat(["exact"], chains, cases=[{"algorithm": "rgi", "action": [3], "defense": chains[-1]}]) == ""
    for modes, chains in ((["exact"], [None]), (["exact"], [None, "clip:1", "prune:0.5", "topk:0.9"]),
                          (["paper"], ["gaussian:0.001"]), (["exact", "paper"], ["gaussian:0.001"])):
        assert noise_caveat(modes, chains) == "", (modes, chains)


def test_audit_mode_both_attacks_each_update_in_both_modes(tmp_path, monkeypatch):
    """`--mode both`: the default audit's updates in exact and in paper mode (as --full's, at the default
    scale); an audit of saved cases runs one mode, and says so."""
    from leaklab.errors import LeaklabError
    from leaklab.experiments import room_audit

    asked = []

    def run(out, config, progress=None, earlier=()):
        asked.append(config)
        raise LeaklabError("stopped by the test")

    monkeypatch.setattr(room_audit, "run", run)
    out = tmp_path / "both"
    assert_user_error(invoke("audit", "--mode", "both", "--out", out), out, "stopped by the test")
    assert_user_error(invoke("audit", "--mode", "paper", "--out", out), out, "stopped by the test")
    assert [c.modes for c in asked] == [("exact", "paper"), ("paper",)]
    assert asked[0].samples == room_audit.default_config().samples
    assert_user_error(invoke("audit", "--cases", tmp_path, "--mode", "both", "--out", out), out, "--mode both",
                      "once with --mode exact")


def test_audit_takes_the_defense_levels_a_user_asks_for(tmp_path):
    out = tmp_path / "levels"
    result = invoke("audit", "--quick", "--sigmas", "1e-4", "--epsilons", "50,20", "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["summary"]["defenses"] == [
        "none", "gaussian σ=0.0001", "DP-SGD ε=50", "DP-SGD ε=20"]
    for args, word in [(("--sigmas", "0"), "--sigmas"), (("--epsilons", "8,8"), "e.g. 8,1"),
                       (("--sigmas", "1e-3,x"), "distinct positive numbers"),
                       (("--sigmas", "1e39"), "invalid --sigmas (got '1e+39')")]:  # infinite float32 updates
        assert_user_error(invoke("audit", "--quick", *args, "--out", tmp_path / "bad"), tmp_path / "bad", word)
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_audit
    from leaklab.rl.envs import LAYOUTS

    with pytest.raises(ValueError, match="each level once"):
        room_audit.AuditConfig(dp_epsilons=(8.0, 8.0))
    with pytest.raises(ValueError, match="no DP-SGD noise calibrates"):  # an OverflowError's traceback
        room_audit.AuditConfig(dp_epsilons=(1.7e308,))
    from leaklab.experiments.audit_levels import next_levels

    # suggestions past what an audit takes: 1e308's overflowed after every attack, σ over 1e6 was refused next time
    assert next_levels({}, {1e308: False}) == next_levels({1e6: True}, {}) == {"gaussian_sigmas": [],
                                                                               "dp_epsilons": []}
    with pytest.raises(ValueError, match="each level once"):  # both applied as gaussian:0.001, twice the same rows
        room_audit.AuditConfig(gaussian_sigmas=(1e-3, 1.0000001e-3))
    # an earlier audit that wrote the defaults out (iterations, layouts) is the same audit
    written = room_audit.AuditConfig(iterations=RoomAttackConfig(mode="exact").iterations, layouts=tuple(LAYOUTS)[:3])
    assert room_audit._compared(written) == room_audit._compared(room_audit.AuditConfig())
    assert room_audit._compared(written.model_copy(update={"iterations": 5}))["iterations"] == "5 (exact mode)"
    # an earlier audit of the same rooms, network and attacks counts; anything else is refused at once
    again = tmp_path / "again"
    result = invoke("audit", "--quick", "--sigmas", "1e-3", "--earlier", out, "--out", again)
    assert result.exit_code == 0, result.output
    assert json.loads((again / "results.json").read_text())["summary"]["earlier_audits"] == [str(out)]
    # a chain: naming its last audit counts the ones that one counted (their verdicts were lost), each once
    third = tmp_path / "third"
    result = invoke("audit", "--quick", "--sigmas", "3e-3", "--earlier", again, "--earlier", out, "--out", third)
    assert result.exit_code == 0, result.output
    assert json.loads((third / "results.json").read_text())["summary"]["earlier_audits"] == [str(again), str(out)]
    # a chain longer than Python's recursion limit (counting it recursed: a RecursionError's traceback)
    whole = json.loads((out / "results.json").read_text())
    chain = [tmp_path / "chain" / f"a{i:04d}" for i in range(1100)]
    for i, folder in enumerate(chain):
        folder.mkdir(parents=True)
        earlier = [str(chain[i + 1])] if i + 1 < len(chain) else []
        (folder / "results.json").write_text(json.dumps({**whole, "summary": {**whole["summary"],
                                                                               "earlier_audits": earlier}}))
    _, counted = room_audit.earlier_verdicts([chain[0]], room_audit.AuditConfig.model_validate(whole["config"]))
    assert len(counted) == 1100
    # an audit whose attacks are of another method version (or unrecorded: before session 53) does not carry over
    older = tmp_path / "older"
    older.mkdir()
    (older / "results.json").write_text(json.dumps({**json.loads((out / "results.json").read_text()),
                                                    "method_version": {"exact": 1}}))
    assert_user_error(invoke("audit", "--quick", "--earlier", older, "--out", tmp_path / "bad"), tmp_path / "bad",
                      "attacks of method version {'exact': 1} where this audit's are")
    # a newer format than this leaklab reads was taken as its own
    (older / "results.json").write_text(json.dumps({**json.loads((out / "results.json").read_text()),
                                                    "format_version": 3}))
    assert_user_error(invoke("audit", "--quick", "--earlier", older, "--out", tmp_path / "bad"), tmp_path / "bad",
                      "format version 3; this leaklab reads versions up to 2")
    for args, words in [(("--arch", "deep"), ("--earlier", f"arch {DEFAULT_ARCH} where this audit has deep")),
                        (("--seed", "1"), ("seed 0", "do not carry over"))]:
        assert_user_error(invoke("audit", "--quick", "--earlier", out, *args, "--out", tmp_path / "bad"),
                          tmp_path / "bad", *words)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "results.json").write_text('{"format": "leaklab.room_attack"}')
    assert_user_error(invoke("audit", "--quick", "--earlier", tmp_path / "mine", "--out", tmp_path / "bad"),
                      tmp_path / "bad", "not a room audit")
    whole = json.loads((out / "results.json").read_text())
    for cell, field, value in ((0, "summary", "x"), (1, "defense_chain", 5), (0, "samples", [{"metrics": []}])):
        broken = {**whole, "cells": [dict(c) for c in whole["cells"]]}
        broken["cells"][cell][field] = value
        (tmp_path / "mine" / "results.json").write_text(json.dumps(broken))
        assert_user_error(invoke("audit", "--quick", "--earlier", tmp_path / "mine", "--out", tmp_path / "bad"),
                          tmp_path / "bad", "is not a whole room audit")
    before = (out / "results.json").read_bytes()
    result = invoke("audit", "--quick", "--earlier", out, "--out", out)
    assert result.exit_code == 2 and "would replace the input" in result.stderr
    assert (out / "results.json").read_bytes() == before
    # the kinds of audit share their format: an image audit replaced a room audit (its hours with --full)
    result = invoke("audit", "--kind", "images", "--quick", "--out", out)
    assert result.exit_code == 2 and "holds an audit of another kind ('rooms')" in result.stderr
    assert (out / "results.json").read_bytes() == before
    assert_user_error(invoke("audit", "--kind", "images", "--earlier", out, "--out", tmp_path / "bad"),
                      tmp_path / "bad", "--earlier")


def test_a_glance_iou_reads_on_its_side_of_the_box_line():
    """The glance printed a best IoU of 0.49998 as 0.50 beside a verdict that the box does not leak (under 0.5)."""
    from leaklab.words import beside_line

    assert [beside_line(v, 0.5) for v in (0.49998, 0.5, 0.504, 0.999996, 0.0)] == ["0.49998", "0.50", "0.50",
                                                                                   "1.00", "0.00"]
    assert beside_line(0.4999999999999999, 0.5) == "0.4999999999999999"
    # a noised update's cosine printed as "1", which the captions call an untouched update (σ = 1e-5)
    from leaklab.words import cosine_text

    assert [cosine_text(v) for v in (1.0, 0.9999917, 0.99999977, 0.912, -0.000335, None, 0.9999999999999538,
                                     0.99999999998)] == ["1", "0.99999", "0.9999998", "0.912", "-0.000335", None, "1",
                                                         "0.9999999"]
    # a share one short of all or above none never prints as all or none (2 labels wrong of 400: "labels 100%")
    from leaklab.words import percent_text

    assert [percent_text(v) for v in (1.0, 0.995, 0.9999, 0.0, 0.004, 0.5)] == ["100%", "99.5%", "99.99%", "0%",
                                                                                "0.4%", "50%"]
    # an update a defense left as it was keeps exactly 1 (a clip that never reached its norm: 0.99999999999995)
    from leaklab.metrics.vectors import update_cosine

    true = {"w": torch.linspace(-1.0, 1.0, 1001)}
    assert update_cosine(true, {"w": true["w"].clone()}) == 1.0
    assert update_cosine(true, {"w": 3 * true["w"]}) <= 1.0


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
    noise, dp = "gaussian σ=0.001", "DP-SGD ε=1"
    rows = verdicts({"summary": {"defenses": ["none", noise, dp]},
                     "cells": [cell("none", None, 40.0, 1.0, 1.0, [45.0, 35.0], error=1.2e-6),
                               cell(noise, "gaussian:0.001", 17.0, 0.6, 1.0, [19.0, 15.0], kept=0.8712, error=12.1),
                               cell(noise, "gaussian:0.001", 5.0, 0.0, 0.0, [5.0, 5.0], kept=0.6, algorithm="rgi",
                                    error=0.00113),
                               cell(dp, "clip:1,gaussian:0.6", 5.0, 0.0, 0.25, [5.0] * 4, kept=0.000651,
                                    error=347.0)]})
    assert [r.client_does for r in rows] == ["nothing", "noise std 0.001", "clip to norm 1, noise std 0.6"]
    # what each defense costs: the cosine an update keeps, the attacks' range where they differ
    assert [r.kept for r in rows] == ["1", "0.6 to 0.871", "0.000651"]
    assert [r.shown for r in rows] == ["2 of 2", "1 of 4", "0 of 4"]
    assert [r.iou for r in rows] == ["1.00", "0.60", "0.00"]
    assert rows[0].verdict == ("leaks the room (2 of 2 updates show it; the best: QGI S2 depth +30.0 dB over its "
                          "baseline), the target's box (IoU 1.00), the action (100%) and the target Q-value (error "
                          "1.2e-06%)")
    # the room leaks where any update shows it: the mean's +2.0 dB hid the one that does (+4.0), which the
    # verdict names; QGI's target Q under the noise (12% off) is not read; RGI's reward (0.0011 off) is
    assert rows[1].gain == 2.0 and rows[1].where == "QGI S2 depth"
    assert rows[1].verdict == ("leaks the room (1 of 4 updates show it; the best: QGI S2 depth +4.0 dB over its "
                          "baseline), the target's box (IoU 0.60), the action (100%) and the reward (error 0.0011)")
    assert rows[2].verdict == "nothing measured leaks" and rows[2].action == ("1 of 4 updates (25%; chance alone: "
                                                                          "p = 0.46)")  # QGI's updates only
    # the action column weighs a count against guessing one of 7 actions: 2 of 2 right by chance is 1 in 49;
    # a batch's shares are no count
    from leaklab.experiments.room_verdicts import _actions_read

    assert rows[0].action == "2 of 2 updates (100%; chance alone: p = 0.02)"
    assert _actions_read([1.0, 1.0, 0.0, 1.0, 1.0, 0.0]) == "4 of 6 updates (67%; chance alone: p = 0.0049)"
    assert _actions_read([0.5, 1.0]) == "75% of 2 updates" and _actions_read([]) is None
    # the verdicts' action: half of the updates read right, or more than guessing names but with p < 0.05
    from leaklab.experiments.room_verdicts import _action_leaks

    def reads(right: int, n: int) -> list[float]:
        return [1.0] * right + [0.0] * (n - right)

    # 1 of 1 right is p = 0.14, no evidence (it named every strong level of an audit leaky on one right guess)
    assert not _action_leaks(reads(1, 1)) and _action_leaks(reads(3, 6)) and not _action_leaks(reads(2, 6))
    assert _action_leaks(reads(21, 96)) and not _action_leaks(reads(20, 96))  # p = 0.029 and 0.051; 14 expected
    assert _action_leaks([0.5, 1.0]) and not _action_leaks([0.5, 0.0]) and not _action_leaks([])
    # a sentence per family (Gaussian noise and DP-SGD are not ranked against each other)
    assert conclusion(rows) == ("Every Gaussian level tested leaks: behind gaussian σ=0.001 (cosine 0.6 to 0.871) the "
                                "update still leaks the room (1 of 4 updates show it; the best: QGI S2 depth +4.0 dB "
                                "over its baseline), the target's box (IoU 0.60), the action (100%) and the reward "
                                "(error 0.0011). DP-SGD ε=1 is the weakest DP-SGD level tested behind which nothing "
                                "measured leaks, where an update keeps a cosine of 0.000651 with the true one.")
    assert conclusion(rows[:2]).startswith("Every Gaussian level tested leaks: behind gaussian σ=0.001 (cosine 0.6 to "
                                           "0.871) the update still leaks")
    assert conclusion(rows[:1]).startswith("No defense was tested; undefended, the update leaks the room")
    assert conclusion(rows[2:]) == "Nothing measured leaks behind any defense tested, DP-SGD ε=1 included."
    quiet = [rows[2]._replace(defense="none")]  # nothing leaks undefended: it said "…, none included."
    assert conclusion(quiet) == "Nothing measured leaks, undefended or behind any defense tested."
    # a level that showed nothing under a stronger one that leaks is no safe level: the conclusion named the weak
    # σ = 0.001 safe while σ = 0.03 leaked (behind strong noise each level guesses the action from the same draws)
    odd = [rows[0], rows[2]._replace(defense="gaussian σ=0.001"), rows[1]._replace(defense="gaussian σ=0.03"),
           rows[2]._replace(defense="gaussian σ=0.1", kept="0.0001")]
    assert conclusion(odd) == ("Gaussian σ=0.1 is the weakest Gaussian level tested behind which nothing measured "
                               "leaks, where an update keeps a cosine of 0.0001 with the true one; behind gaussian "
                               "σ=0.03 (cosine 0.6 to 0.871) the update still "
                               f"{rows[1].verdict} (nothing measured leaked behind the weaker gaussian σ=0.001, which "
                               "is therefore no safe level).")
    # and where the strongest leaks too, the family has no safe level (it said every level leaks)
    assert conclusion(odd[:3]).startswith("No Gaussian level tested is safe: behind gaussian σ=0.03 (cosine 0.6 to "
                                          "0.871) the update still leaks") and conclusion(odd[:3]).endswith(
        "(nothing measured leaked behind the weaker gaussian σ=0.001, which is therefore no safe level).")
    # results written before the cosine was measured: the column says so, the sentence leaves it out
    old = verdicts({"summary": {"defenses": ["none", dp]},
                    "cells": [cell("none", None, 40.0, 1.0, 1.0, [45.0, 35.0], kept=None),
                              cell(dp, "clip:1,gaussian:0.6", 5.0, 0.0, 0.25, [5.0] * 4, kept=None)]})
    assert [r.kept for r in old] == ["–", "–"] and [r.features for r in old] == ["–", "–"]
    assert conclusion(old).startswith("DP-SGD ε=1 is the weakest DP-SGD level tested behind which nothing measured "
                                      "leaks. Undefended, the update leaks the room")
    # with a stronger level tested, the sentence says it showed nothing either (it said so of the strongest too)
    two = [rows[0], rows[2]._replace(defense="DP-SGD ε=8"), rows[2]]
    assert "DP-SGD ε=8 is the weakest DP-SGD level tested behind which, as behind every stronger one, nothing" \
        in conclusion(two)
    # `--full` attacks each update in both modes: an update counts once, showing its room where either
    # reconstruction shows it; its action (read by the same rule in both) is no second guess
    both = verdicts({"summary": {"defenses": ["noise"]},
                     "cells": [cell("noise", "gaussian:0.03", 4.0, 0.5, 0.5, [14.0, 25.0] + [14.0] * 4),
                               cell("noise", "gaussian:0.03", 5.0, 0.5, 0.5, [19.0, 14.0] + [14.0] * 4,
                                    mode="paper")]})
    assert both[0].where == "QGI S2 depth (paper mode)" and both[0].shown == "2 of 6"  # the largest mean gain
    # the verdict names the update that shows its room best, in the mode that shows it
    assert both[0].verdict.startswith("leaks the room (2 of 6 updates show it; the best: QGI S2 depth (exact mode) "
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
    assert both[0].action == "3 of 6 updates (50%; chance alone: p = 0.042)"  # 6 of 12 would be p = 0.0036



def test_audit_verdicts_count_a_value_on_the_line_as_a_leak():
    """The verdicts' lines are inclusive (room_verdicts.glance_caption): 3 dB, IoU 0.5, a batch's action share 0.5,
    1 % Q error and 0.01 reward error leak; an action count leaks under a chance of 0.05 only."""
    from leaklab.experiments.room_verdicts import NOTHING_LEAKS, RoomShown, room_shown, verdict

    rows = {name: [({"algorithm": "qgi", "setting": "S2"}, {"metrics": {"depth_gain_max": gain}})]
            for name, gain in (("a", 3.0), ("b", 2.999))}
    assert room_shown(rows, modes=False) == RoomShown(1, 2, 3.0, "QGI S2 depth")  # 3 dB over the baseline shows it
    on_line = verdict(RoomShown(1, 1, 3.0, "QGI S2 depth"), 0.5, [0.5], 1.0, 0.01)
    for leak in ("the room", "the target's box", "the action", "the target Q-value", "the reward"):
        assert leak in on_line
    assert verdict(RoomShown(0, 1, 2.9, "x"), 0.499, [0.499], 1.01, 0.0101) == NOTHING_LEAKS
    # 3 of 6 right by chance alone: p = 0.042 leaks; 2 of 6: p = 0.21 does not
    assert "the action" in verdict(RoomShown(0, 6, None, None), 0.0, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert verdict(RoomShown(0, 6, None, None), 0.0, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]) == NOTHING_LEAKS

def test_audit_suggests_the_levels_to_audit_next():
    from leaklab.experiments.audit_levels import leaks_stop, next_levels, next_levels_text

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
    # a round level outside the bracket it should narrow is dropped (0.12 to 0.18 rounds to 0.1 and 0.2)
    assert next_levels({0.12: True, 0.18: False}, {})["gaussian_sigmas"] == []
    # the leaks stop at the weakest level stronger than the leaky one that is safe, not at a weaker safe one
    assert leaks_stop({1e-3: False, 0.03: True, 0.3: False}, {50.0: False, 8.0: True, 1.0: False}) == {
        "gaussian_sigma": [0.03, 0.3], "dp_epsilon": [8.0, 1.0]}
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
    # weakest first whatever order the levels were typed in (the conclusion reads the weakest safe one first)
    typed = room_audit.AuditConfig(gaussian_sigmas=(0.3, 1e-3), dp_epsilons=(1.0, 8.0))
    assert [label for label, _ in typed.defenses()] == labels[:3] + ["DP-SGD ε=8", "DP-SGD ε=1"]

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
    assert text.endswith("(From the verdicts of this audit and 1 earlier audit; the conclusion counts this audit's "
                         "levels alone.)")
    assert levels_text(levels([15.0] * 4)) == ""  # nothing leaks at all: nothing to say


def test_audit_refuses_conflicting_options(tmp_path):
    out = tmp_path / "a"
    assert_user_error(invoke("audit", "--quick", "--full", "--out", out), out, "--quick", "--full")
    (tmp_path / "empty").mkdir()
    assert_user_error(invoke("audit", "--cases", tmp_path / "empty", "--out", out), out, "no room case")
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


def test_audit_arch_reaches_every_cell():
    from leaklab.experiments.room_audit import AuditConfig, cell_configs

    cells = cell_configs(AuditConfig(arch="nature", samples=1))
    assert len(cells) == 4 and {run.arch for _, run in cells} == {"nature"}
    assert {run.spec.arch for _, run in cells} == {"nature"}
