"""`leaklab audit --cases`: saved room updates (leaklab's network or a user's own class), scored or
not, their checks before any attack, and what the report says of updates the attack cannot read."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings

import pytest
import torch

from cli_helpers import ROOM_FAST, Interrupt, assert_user_error, interrupt_after, invoke
from leaklab.errors import ModelClassError
from leaklab.models import PerceptionSpec
from leaklab.rl.capture import RoomCaptureConfig, capture_rooms


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
    assert "warning: these attacks ran 3 image iterations" in result.stderr  # as the report says
    html = (out / "report.html").read_text()
    assert "true box above, the recovered one below. The first 1 of 2 scored cases; results.json has every one" in html
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
    assert [c["feature_cosine"] for c in res["cases"]] == [1.0, 1.0] and "features read (cosine, estimated)" in html
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
    # an audit inside the cases: capturing them again deleted it, with whatever the user kept beside it
    inside = cases / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", inside),
                      inside, "is inside the input", "choose a folder outside it")
    assert len([p for p in cases.iterdir() if p.is_dir()]) == 2
    # a case without its truth is attacked and pictured as the server reconstructs it, unscored
    (cases / "0001" / "truth.safetensors").unlink()
    blind = tmp_path / "blind"
    result = invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", blind)
    assert result.exit_code == 0, result.output
    html = (blind / "report.html").read_text()
    # what its update lets through, the one reading of a real client's update that needs no truth
    said = "The server reads the room's conv features of the case without its truth at a cosine of 1 with"
    assert said in result.output and said.replace("'", "&#39;") in html
    assert "Reconstructions of the cases without their truth (depth)" in html and "the first 1 of 1" not in html
    figures = blind / "figures"
    assert (figures / "unscored.png").stat().st_size > 0 and not (figures / "unscored_rgb.png").exists()  # S2
    blind_res = json.loads((blind / "results.json").read_text())
    assert blind_res["summary"]["scored"] == 1
    # what the update lets through of the features, read without the truth: for the unscored case too
    assert [c["feature_cosine"] for c in blind_res["cases"]] == [1.0, 1.0]
    assert blind_res["summary"]["feature_cosine_median"] == 1.0
    # a case of the capture without its view is an error, not a smaller audit; a stray folder is named
    (cases / "0001" / "view.json").rename(cases / "0001" / "view.json.bak")
    again = tmp_path / "again"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", again),
                      again, "case 0001 of its capture.json has no view.json")
    (cases / "0001" / "view.json.bak").rename(cases / "0001" / "view.json")
    # an index of a newer version, or whose case list is no list, was read as if it were none
    index = json.loads((cases / "capture.json").read_text())
    for changed, words in (({"format_version": 7}, "format version 7"), ({"cases": "0000"}, "is no list"),
                           ({"format": "mine"}, "not the index")):
        (cases / "capture.json").write_text(json.dumps({**index, **changed}))
        assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", again),
                          again, words)
    # a folder of that name was taken for no index: its case list and recorded class went unread
    (cases / "capture.json").unlink()
    (cases / "capture.json").mkdir()
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", again),
                      again, "capture.json is not a file")
    (cases / "capture.json").rmdir()
    (cases / "capture.json").write_text(json.dumps(index))
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
    held = [c for c in json.loads((out / "results.json").read_text())["cases"] if c["metrics"]["action_informative"] == 1]
    assert held, "both sampled returns are 0: choose other samples for this test"
    right = sum(c["metrics"]["action"] for c in held)
    assert f"{100 * right / len(held):.0f}% of {len(held)} case" in html


def test_a_folder_of_dqn_and_reinforce_cases_is_audited_as_one(tmp_path):
    """Each case is attacked by its own loss's attack (QGI, RGI); the summary's RGI keys count RGI's cases
    alone (the audit used to end in a KeyError after every attack, on a QGI case's missing return)."""
    import shutil

    mixed = tmp_path / "mixed"
    for algorithm in ("dqn", "reinforce"):
        capture_rooms(RoomCaptureConfig(algorithm=algorithm, samples=1, layouts=("e1m1-stalactite",)),
                      tmp_path / algorithm)
        shutil.copytree(tmp_path / algorithm / "0000", mixed / f"{algorithm}-0000")
    out = tmp_path / "audit"
    result = invoke("audit", "--cases", mixed, *ROOM_FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    by_case = {c["case"]: c for c in res["cases"]}
    assert (by_case["dqn-0000"]["algorithm"], by_case["reinforce-0000"]["algorithm"]) == ("qgi", "rgi")
    rgi = by_case["reinforce-0000"]["metrics"]
    assert res["summary"]["zero_return_samples"] == 1 - rgi["action_informative"]
    expected = rgi["action_informative_correct"] if rgi["action_informative"] else None
    assert res["summary"]["action_accuracy_nonzero_return"] == expected
    assert res["summary"]["q_target_err_mean"] == by_case["dqn-0000"]["metrics"]["q_target_error"]


def test_the_cases_verdict_counts_no_rgi_action_behind_a_zero_return_whatever_the_attack_flagged(tmp_path):
    """Behind noise RGI's own flag (`action_identified`) takes the noise for a policy-gradient part; the
    verdict's action is over the cases whose update holds it by the truth: QGI's and RGI's non-zero returns."""
    from leaklab.experiments import room_report

    def case(name, algorithm, right, extra):
        metrics = {"depth_paper_psnr": 10.0, "depth_paper_psnr_baseline": 12.0, "depth_paper_ssim": 0.1,
                   "depth_paper_ssim_baseline": 0.1, "box_iou": 0.0, "action": right, **extra}
        return {"case": name, "algorithm": algorithm, "setting": "S2", "defense": "gaussian:0.03", "iterations": 2000,
                "seconds": 1.0, "action": [3], "box": [[0.0] * 4], "exact": ["features"], "metrics": metrics,
                "layouts": ["a"], "batch_size": 1, "action_identified": [True]}

    cases = [case("0000", "qgi", 0.0, {"q_target_error": 50.0}),
             case("0001", "rgi", 1.0, {"reward_error": 0.5, "action_informative": 0.0, "action_informative_correct": 0.0})]
    cases[0].pop("action_identified")
    summary = {"seconds": 1.0, "cases": 2, "scored": 2, "resumed_attacks": 0, "depth_psnr_mean": 10.0,
               "depth_psnr_baseline_mean": 12.0, "iou_mean": 0.0, "q_target_err_mean": 50.0, "reward_abs_err_mean": 0.5}
    results = {"summary": summary, "attack": {"mode": "exact", "iterations": 2000}, "cases": cases, "cases_dir": "c",
               "model_class": None, "device": "cpu", "versions": {"leaklab": "x", "torch": "y"}}
    room_report.write_cases_report(tmp_path, results, [], [], [], {"scored": [], "unscored": []})
    html = (tmp_path / "report.html").read_text()
    assert "0% of 1 case" in html and "give away nothing measured" in html
    # images that came out not finite (a network whose values overflow float32) score no PSNR: no gain to show
    for c in cases:
        c["metrics"].update(depth_paper_psnr=None, depth_paper_ssim=None)
    results["summary"] = {k: v for k, v in summary.items() if k != "depth_psnr_mean"}
    room_report.write_cases_report(tmp_path / "nan", results, [], [], [], {"scored": [], "unscored": []})
    assert "<tr><td>–</td><td>–</td><td>0 of 0</td>" in (tmp_path / "nan" / "report.html").read_text()


def test_the_cases_line_counts_the_action_and_the_cosine_as_the_report_does():
    """One defended case dropped RGI's qualifier for every case and the line read "action 67%" (a zero return's
    guess counted) beside the report's 100%; undefended cases' cosines of 1 joined the median the line printed."""
    from leaklab.cli.rooms import _room_summary_line

    def row(defense, action, kept, informative=1.0):
        return {"defense": defense, "metrics": {"action": action, "update_cosine": kept,
                                                "action_informative": informative}}

    cases = [row("gaussian:0.001", 1.0, 0.912), row(None, 0.5, 1.0, informative=0.0), row(None, 1.0, 1.0)]
    summary = {"iou_mean": 1.0, "action_accuracy": 0.67, "action_identified_share": 0.5, "update_cosine_median": 1.0}
    line = _room_summary_line(summary, True, cases)
    assert "action 100% of 2 cases whose update holds it" in line
    assert "update kept (cosine with the true one) 0.912" in line


def test_a_cases_folder_reads_nothing_through_a_link_out_of_it(tmp_path):
    """As a case's own files: a sub-folder or a capture.json that links outside --cases is refused, as is a link
    to a case inside it."""
    import shutil

    capture_rooms(RoomCaptureConfig(algorithm="dqn", samples=1, layouts=("e1m1-stalactite",)), tmp_path / "cap")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "0000").symlink_to(tmp_path / "cap" / "0000")
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", linked, *ROOM_FAST, "--out", out), out,
                      "0000 is a link to a folder outside it")
    indexed = tmp_path / "indexed"
    shutil.copytree(tmp_path / "cap" / "0000", indexed / "0000")
    (indexed / "capture.json").symlink_to(tmp_path / "cap" / "capture.json")
    assert_user_error(invoke("audit", "--cases", indexed, *ROOM_FAST, "--out", out), out,
                      "capture.json is a link to a file outside")
    (indexed / "capture.json").unlink()
    (indexed / "0001").symlink_to("0000")  # inside, but the same case again: it counted twice in every mean
    assert_user_error(invoke("audit", "--cases", indexed, *ROOM_FAST, "--out", out), out,
                      "0001 is a link to 0000, a case already audited")


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


def test_an_update_beyond_float32s_range_is_refused_before_attacking(tmp_path):
    """A float64 entry of 1e300 is finite as stored and infinite as the attacks read it: found in the worker, after
    the other cases' attacks, in a message that named no file."""
    from safetensors.torch import load_file, save_file

    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(algorithm="dqn", spec=PerceptionSpec(setting="S2"), samples=2,
                                    layouts=("e1m1-stalactite",)), cases)
    last = sorted(p for p in cases.iterdir() if p.is_dir())[-1]
    tensors = load_file(str(last / "update.safetensors"))
    name = next(k for k in tensors if k.endswith("head.2.weight"))
    tensors[name] = tensors[name].double()
    tensors[name][0, 0] = 1e300
    save_file(tensors, str(last / "update.safetensors"))
    meta = json.loads((last / "update.json").read_text())
    meta.pop("sha256", None)
    (last / "update.json").write_text(json.dumps(meta))
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out), out,
                      "update.safetensors: update tensor 'head.2.weight' holds values beyond float32's range")
    assert not (tmp_path / ".leaklab-resume").exists()


def test_a_case_whose_name_is_not_utf8_is_refused_before_attacking(tmp_path):
    """The reconstructions' tensor names and the report carry the case's name: a traceback after every attack."""
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(algorithm="dqn", spec=PerceptionSpec(setting="S2"), samples=2,
                                    layouts=("e1m1-stalactite",)), cases)
    shutil.copytree(os.fsencode(cases / "0001"), os.fsencode(cases) + b"/caf\xe9")  # a user's case beside them
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out), out,
                      "caf\\xe9: its name is not valid UTF-8")


def test_a_case_that_withholds_its_defense_or_batch_size_keeps_them_from_the_attacks(tmp_path):
    """The room attacks read the defense off the update, which a case gave whatever its view granted (the claims
    moved with it), and the workers' views dropped a case's capabilities (its withheld batch size was read)."""
    from leaklab.rl.cases import load_room_case

    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(algorithm="dqn", spec=PerceptionSpec(setting="S2"), samples=1,
                                    layouts=("e1m1-stalactite",), defense="clip:0.001"), cases)
    view_file = cases / "0000" / "view.json"
    view = json.loads(view_file.read_text())
    assert load_room_case(cases / "0000").update.defense == "clip:0.001"
    view_file.write_text(json.dumps({**view, "capabilities": {"knows_defense": False}}))
    assert load_room_case(cases / "0000").update.defense is None
    # withheld is not undefended: the report named such a case's defense "none" (and a noised one's fallback
    # the network's doing) and gave no noise caveat
    withheld = tmp_path / "withheld"
    assert invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", withheld).exit_code == 0
    row, = json.loads((withheld / "results.json").read_text())["cases"]
    assert row["defense"] is None and row["defense_withheld"] is True
    report = (withheld / "report.html").read_text()
    assert ">withheld</td>" in report and "Behind noise the verdicts are exact mode" in report
    view_file.write_text(json.dumps({**view, "capabilities": {"knows_batch_size": False}}))
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--iterations", "3", "--workers", "1", "--out", out), out,
                      "0000: this attack needs the capability 'knows_batch_size'")


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
    with pytest.warns(UserWarning, match=r"could not read 1 undefended case \(0000\), whose batch .* or whose "
                                         "network computes"):
        result = invoke("audit", "--cases", cases, "--model-class", cls, "--iterations", "3", "--workers", "1",
                        "--out", out)
    assert result.exit_code == 0, result.output
    assert "not a private update" in (out / "report.html").read_text()
    assert "features" not in json.loads((out / "results.json").read_text())["cases"][0]["exact"]


def test_the_features_read_off_cases_without_their_truth_are_counted_against_what_they_meant_on_our_rooms():
    from leaklab.experiments.room_verdicts import features_read_text

    assert features_read_text([]) == ""
    text = features_read_text([0.95, 0.91, 0.7, 0.3, 0.0])
    assert text.startswith("Of the 5 cases without their truth, the server reads the room's conv features at a "
                           "cosine of 0.9 or more with the client's off 2 and under 0.2 off 1 (estimated")
    assert "every update at 0.9 or more showed its room and none under 0.2 (on stacked" in text


def test_the_fallback_caveat_names_its_cause():
    """A QGI batch of two transitions with one action is outside exact mode on any network (its output
    errors are one direction); other undefended fallbacks are a split refused or the network's doing (the
    caveat blamed leaklab's own network for an RGI batch whose zero return's split it refused)."""
    from leaklab.experiments.room_report import fallback_caveat

    def row(case, algorithm="qgi", action=(1, 2), exact=(), **more):
        return {"case": case, "algorithm": algorithm, "action": list(action), "defense": None,
                "exact": list(exact), **more}

    rows = [row("a", action=(3, 3)), row("b"), row("c", exact=("box", "features")),
            row("d", defense="gaussian:1"), row("e", no_signal=True), row("f", defense_withheld=True)]
    results = {"attack": {"mode": "exact"}, "cases": rows}
    text = fallback_caveat(results)
    assert "1 undefended QGI batch (a) whose transitions share their action and 1 undefended case (b), whose " \
           "batch its closed forms could not split" in text and "or whose network computes" in text
    assert fallback_caveat({**results, "cases": rows[2:]}) == ""
    assert fallback_caveat({**results, "attack": {"mode": "paper"}}) == ""


def _audit_of_one_defended_case(tmp_path, defense: str, warning: str):
    """`audit --cases` of one room's update captured behind ``defense``, which warns ``warning``: its folder."""
    cases, out = tmp_path / "cases", tmp_path / "audit"
    assert invoke("env", "capture", "--samples", "1", "--layouts", "e1m1-stalactite", "--defense", defense,
                  "--out", cases).exit_code == 0
    with pytest.warns(UserWarning, match=warning):
        result = invoke("audit", "--cases", cases, *ROOM_FAST, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_cases_without_the_gradient_the_attack_reads_are_named_and_kept_out_of_the_action(tmp_path):
    """A client that sends a random 0.01% of its update zeroes the last bias gradient: the audit says which
    cases held nothing to read, and their guessed action does not count as the action leaking or not."""
    out = _audit_of_one_defended_case(tmp_path, "prune:0.9999",
                                      r"1 case \(0000\) of 1 holds an update off which the attacks read nothing")
    report = (out / "report.html").read_text()
    assert "none read (nothing the attack reads)" in report and "holds an update off which the attacks read" in report
    assert ">action</th>" in report and "% of 1 case" not in report  # no case holds the action
    # nothing read is no features read: the median and the lead left such cases out (a whole read where 5 of 6
    # cases read nothing)
    assert json.loads((out / "results.json").read_text())["summary"]["feature_cosine_median"] == 0.0
    assert "Over 1 scored case (1 of them with nothing to read)" in report
    assert '<td class="text">prune:0.9999</td><td>0.00699</td><td>0</td>' in report  # its features read too (–)


def test_cases_whose_features_read_as_noise_are_counted_where_no_images_were_reconstructed(tmp_path):
    out = _audit_of_one_defended_case(tmp_path, "gaussian:1",
                                      "1 case of 1 showed nothing of the conv features above the noise")
    row = json.loads((out / "results.json").read_text())["cases"][0]
    assert row["iterations"] == 0 and row["feature_cosine"] == 0
    report = (out / "report.html").read_text()
    assert "so exact mode reconstructed no images from them" in report
    assert "3 image iterations each (none where an update showed nothing of the features above its noise)" in report


@pytest.mark.parametrize("cls, words", [
    ("tests.plugins.narrow_net:NoHead", ["contract", "box starting with a Linear with bias"]),
    # both were captured, and the audit then failed with a KeyError's traceback (a capture's RuntimeError)
    ("tests.plugins.narrow_net:Frozen", ["do not train (box.0.weight", "let every parameter train"]),
    ("tests.plugins.narrow_net:Unused", ["does not depend on aux.weight"]),
    ("tests.plugins.narrow_net:NaNOut", ["the output holds NaN or Inf for two random states"]),
    ("tests.plugins.narrow_net:SpecLie", ["sets its own spec", "keep the spec it is given"]),  # a late traceback
    ("tests.plugins.narrow_net:Pair", ["(for S2, 1 channel of 150 px)",
                                       "forward returned a tuple; it must return one tensor"]),
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


def test_a_model_class_that_fails_in_the_attack_is_one_line(tmp_path):
    """A class that passes the capture and the contract's checks and fails in the attack (the box fit behind noise
    runs its box layer in float64): the attack's failure was some 150 lines of traceback. One that takes its input
    out of torch (a numpy step) failed there too; the contract now refuses it, as it refuses a detach, before any
    capture or attack."""
    cls = "tests.plugins.narrow_net:Float32Box"
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, layouts=("e1m1-stalactite",),
                                    model_class=cls, defense="gaussian:0.001"), cases)
    out = tmp_path / "audit"
    assert_user_error(invoke("audit", "--cases", cases, "--model-class", cls, "--iterations", "3", "--workers", "1",
                             "--out", out), out, f"--model-class {cls}: its code failed in the attack (TypeError",
                      "takes float32, not torch.float64")
    for name, words in [("NumpyConv", r"failed \(RuntimeError: Can't call numpy\(\)"),
                        ("Detached", r"the output has no gradient in the images \(a detach")]:
        with pytest.raises(ModelClassError, match=words):
            capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, layouts=("e1m1-stalactite",),
                                            model_class=f"tests.plugins.narrow_net:{name}"), tmp_path / name)
        assert not (tmp_path / name).exists()


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
    audited case listed its actions in the attack's order beside its layouts in the truth's; the rows of both say
    which samples of a batch were read (`leaklab attack`'s left it out until session 64)."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments import room_attack, room_audit
    from leaklab.io import load_tensors

    grids = []
    monkeypatch.setattr(room_attack, "image_grid_png", lambda setting, truths, recs, title, path, scores:
                        grids.append((truths, recs, [room_attack.picture_caption(m, "depth") for m in scores])))
    config = room_attack.RoomRunConfig(algorithm="qgi", setting="S2", samples=2, batch_size=2,
                                       layouts=("e1m1-stalactite", "e1m3-column"),
                                       attack=RoomAttackConfig(iterations=20), workers=1)
    attack_run_jobs = room_attack.run_jobs  # the second update: its second sample read alone
    monkeypatch.setattr(room_attack, "run_jobs", lambda jobs, workers, on_result, *rest: attack_run_jobs(
        jobs, workers, lambda i, rec: on_result(i, dataclasses.replace(rec, read=torch.tensor([False, True]))
                                                if i == 1 else rec), *rest))
    results = room_attack.run(config, tmp_path / "run")
    assert "read" not in results["samples"][0] and results["samples"][1]["read"] == [False, True]
    (truths, recs, captions), = grids
    assert len(truths) == len(recs) == len(captions) == 4  # both transitions of both updates
    for u, row in enumerate(results["samples"]):
        mean = sum(float(c.split(" dB")[0]) for c in captions[2 * u:2 * u + 2]) / 2
        assert abs(mean - row["metrics"]["depth_paper_psnr"]) < 0.06, (captions, row["metrics"])
    cases = tmp_path / "cases"
    capture_rooms(RoomCaptureConfig(spec=PerceptionSpec(setting="S2"), samples=1, batch_size=2,
                                    layouts=("e1m1-stalactite", "e1m3-column")), cases)
    monkeypatch.setattr(room_audit, "matched", lambda rec, truth: [1, 0])  # the second reconstruction first
    run_jobs = room_audit.attack_pool.run_jobs  # the attack read its first sample alone (RoomReconstruction.read)
    monkeypatch.setattr(room_audit.attack_pool, "run_jobs", lambda jobs, workers, on_result, *rest: run_jobs(
        jobs, workers, lambda i, rec: on_result(i, dataclasses.replace(rec, read=torch.tensor([True, False]))), *rest))
    results = room_audit.run_cases(tmp_path / "audit", cases, RoomAttackConfig(iterations=3), workers=1)
    row, = results["cases"]
    recovered = load_tensors(tmp_path / "audit" / "reconstructions.safetensors", "reconstructions")[0]
    name = row["case"]
    assert row["action"] == recovered[f"{name}/action"].flip(0).tolist()  # the rows follow the match given
    assert row["box"] == recovered[f"{name}/box"].flip(0).tolist()
    assert row["read"] == [False, True]  # in the truth's order too
