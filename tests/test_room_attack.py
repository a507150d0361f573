"""`leaklab attack qgi|rgi` end to end (the results contract, determinism, refusals of bad input, a
defended update's cosine), the cell summary, and `env capture` / `env contact-sheet`."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from cli_helpers import PNG, ROOM_FAST, assert_user_error, invoke
from leaklab.errors import LeaklabError
from leaklab.experiments.room_attack import SUMMARY_KEYS
from leaklab.rl.envs.layouts import layouts_arg


def test_the_attacks_pictures_carry_each_images_psnr_and_gain(monkeypatch):
    """reconstructions.png captioned only the depth row, with its PSNR alone (9.7 dB under a 23.8 dB baseline
    read as a score); now every reconstructed row, with the gain over the image's own baseline."""
    import torch
    from leaklab.experiments import room_attack
    from leaklab.report import plots

    seen = []
    monkeypatch.setattr(plots, "image_grid", lambda rows, path, captions, **kw: seen.append(captions))
    scores = [{"rgb_raw_psnr": 14.0, "rgb_raw_psnr_baseline": 16.0, "depth_raw_psnr": 9.7,
               "depth_raw_psnr_baseline": 23.8}]
    image = [torch.rand(1, 4, 8, 8)]
    room_attack.image_grid_png("S1", image, image, "t", None, scores)
    room_attack.image_grid_png("S2", image, image, "t", None, scores)
    assert seen == [[None, ["14.0 dB (-2.0)"], None, ["9.7 dB (-14.1)"]], [None, ["9.7 dB (-14.1)"]]]


def test_attack_qgi_writes_the_results_contract(tmp_path):
    out = tmp_path / "qgi"
    result = invoke("attack", "qgi", "--setting", "S1", "--samples", "2", "--layouts", "2", *ROOM_FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    s = res["summary"]
    for key in ("rgb_psnr_mean", "rgb_ssim_mean", "depth_psnr_mean", "depth_ssim_mean", "rgb_psnr_raw_mean",
                "depth_psnr_raw_mean", "rgb_psnr_baseline_mean", "depth_psnr_baseline_mean", "iou_mean",
                "action_accuracy", "q_pred_err_mean", "q_target_err_mean", "iterations", "seconds_per_sample"):
        assert s[key] is not None, key
    assert "reward_abs_err_mean" not in s and s["update_cosine_median"] == 1.0  # no defense: the update as it is
    # every image score beside its constant-image baseline (SSIM printed alone until session 54)
    assert (f"SSIM {s['depth_ssim_mean']:.3f} (baseline {s['depth_ssim_baseline_mean']:.3f})" in result.output
            and f"SSIM {s['rgb_ssim_mean']:.3f} (baseline {s['rgb_ssim_baseline_mean']:.3f})" in result.output)
    assert s["feature_cosine_median"] == 1.0 and all(r["feature_cosine"] == 1.0 for r in res["samples"])
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
        assert invoke("attack", "rgi", "--samples", "1", "--layouts", "1", *ROOM_FAST, "--out", out).exit_code == 0
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


def _one_defended_update(tmp_path, defense: str) -> tuple[Any, dict[str, Any]]:
    """`leaklab attack qgi` on one room's update behind ``defense``: the command's result and its row."""
    out = tmp_path / "defended"
    result = invoke("attack", "qgi", "--defense", defense, "--samples", "1", "--layouts", "1", *ROOM_FAST,
                    "--out", out)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "samples.jsonl").read_text().splitlines()[0])


def test_a_defense_that_prunes_every_bias_gradient_is_scored_not_fatal(tmp_path):
    # (topk:0.9999 keeps the last bias gradient's one large entry: since exact method version 25 the attack reads
    # the action and the target there, fitting the box without box.0's gradient)
    result, row = _one_defended_update(tmp_path, "prune:0.9999")
    assert row["no_signal"] is True and row["exact"] == []
    assert row["metrics"]["q_target_error"] is None and row["metrics"]["q_target_error_undefined"] == 1  # no reading
    assert "feature_cosine" not in row  # nothing read
    assert "ran 3 image iterations" in result.stderr  # as asked (the attack ran none: nothing to read)
    assert "1 sample (0) of 1 holds an update off which the attacks read nothing" in result.stderr
    # the server got a random 0.01% of the entries: a sliver of the update's direction
    assert 0 < row["metrics"]["update_cosine"] < 1


def test_an_update_whose_features_are_all_noise_gets_no_image_stage_and_says_so(tmp_path):
    result, row = _one_defended_update(tmp_path, "gaussian:1")
    assert row["feature_cosine"] == 0 and row["iterations"] == 0 and "no_signal" not in row
    assert {"box", "features"} <= set(row["exact"])  # still read off the update, as noise
    assert ("1 update of 1 showed nothing of the conv features above the noise (estimated cosine 0), so exact mode "
            "reconstructed no images from them") in result.stderr


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
    # what exact mode read of the features behind that noise, estimated from each update alone
    assert all(0 <= r["feature_cosine"] < 1 for r in res["samples"])
    assert res["summary"]["feature_cosine_median"] == pytest.approx(
        statistics.median(r["feature_cosine"] for r in res["samples"]))
    # DP-SGD's noise (std 0.6 on each of about 1.9 million entries, the update clipped to norm 1) leaves a
    # single update next to nothing of its direction; noise of std 0.001 leaves most of a large one
    dp = room_attack.attack_job(config, state, samples[0], "clip:1,gaussian:0.6").update
    assert abs(update_cosine(samples[0].update.tensors, dp.tensors)) < 0.01
    assert 0.5 < res["samples"][0]["metrics"]["update_cosine"] < 1
    assert update_cosine(samples[0].update.tensors, samples[0].update.tensors) == 1.0


def test_rgi_summary_counts_samples_not_updates_in_a_batch():
    """A batch row holds its samples' means: a mixed batch (one zero return) must count one sample
    with a non-zero return, and whether that one's action was right."""
    from leaklab.experiments.room_attack import summarise

    def row(action, informative, correct, layouts=("a", "b")):
        return {"layouts": list(layouts), "batch_size": 2, "iterations": 1,
                "metrics": {"action": action, "action_informative": informative,
                            "action_informative_correct": correct}}
    # the zero-return sample guessed right, the other wrong; then a batch of two non-zero returns, right
    s = summarise([row(0.5, 0.5, 0.0), row(1.0, 1.0, 1.0)], 1.0)
    assert s["action_accuracy_nonzero_return"] == pytest.approx(2 / 3) and s["zero_return_samples"] == 1
    assert s["samples"] == 2 and s["transitions"] == 4  # updates, as before, and their transitions
    # a user's case without provenance names no rooms: its batch still counts two samples
    s = summarise([row(0.5, 0.5, 0.0, layouts=()), row(1.0, 1.0, 1.0, layouts=())], 1.0)
    assert s["action_accuracy_nonzero_return"] == pytest.approx(2 / 3) and s["zero_return_samples"] == 1


def test_summary_means_count_transitions_and_a_zero_q_value_is_counted_not_dropped():
    """A batch row holds its transitions' means: weighed by its size in the summary; a true Q-value of 0 has
    no % error, which neither erases its batch mate's nor vanishes unsaid; `iou_min` is a transition's."""
    from types import SimpleNamespace

    import torch

    from leaklab.experiments.room_attack import summarise
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    boxes = torch.tensor([[-0.5, -0.5, 0.5, 0.5], [0.0, 0.0, 0.4, 0.4]])
    truth = {"images": images, "box": boxes, "action": torch.tensor([1, 2]),
             "q_pred": torch.tensor([0.5, 0.3]), "q_target": torch.tensor([0.0, 0.2])}
    rec = SimpleNamespace(images=images.clone(), box=boxes + torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, 0.2]]),
                          action=torch.tensor([1, 0]), q_pred=truth["q_pred"].clone(),
                          q_target=torch.tensor([1e-7, 0.4]), reward=None, action_identified=None, read=None)
    m = room_metrics(rec, truth, "S2")
    assert m["q_target_error"] == pytest.approx(100.0) and m["q_target_error_undefined"] == 1.0
    assert m["q_pred_error_undefined"] == 0.0  # its predicted Q-value has a % error: both transitions count
    assert m["box_iou"] == pytest.approx((1 + 2 / 3) / 2) and m["box_iou_min"] == pytest.approx(2 / 3)
    one = {"batch_size": 1, "iterations": 1, "layouts": ["b"],
           "metrics": dict(m, action=1.0, q_target_error=1.0, q_target_error_undefined=0.0, box_iou=1.0,
                           box_iou_min=1.0)}
    s = summarise([{"batch_size": 2, "iterations": 1, "layouts": ["a"], "metrics": m}, one], 1.0)
    assert s["action_accuracy"] == pytest.approx(2 / 3)  # 2 of 3 transitions, not the mean of 0.5 and 1
    # the batch's mean covers its one transition with a % error: weighed 1, not 2
    assert s["q_target_err_mean"] == pytest.approx((100 + 1) / 2) and s["q_target_error_undefined"] == 1
    assert s["q_pred_error_undefined"] == 0
    assert s["iou_min"] == pytest.approx(2 / 3)
    # a true target of 0 on every row: the predicted Q's error still counts (until session 52 it weighed 0: a traceback)
    alone = room_metrics(SimpleNamespace(**{**vars(rec), "q_pred": rec.q_pred[:1] * 1.1, "q_target": rec.q_target[:1],
                                           "images": images[:1], "box": boxes[:1], "action": rec.action[:1]}),
                         {k: v[:1] for k, v in truth.items()}, "S2")
    s = summarise([{"batch_size": 1, "iterations": 1, "layouts": ["a"], "metrics": alone}], 1.0)
    assert s["q_pred_err_mean"] == pytest.approx(10.0) and s["q_target_error_undefined"] == 1


def test_a_sample_the_attack_did_not_read_scores_no_reward_or_q_error():
    """The no-information start's reward 0 against a true return of 0 scored an error of 0, and the verdict named
    the reward as leaked where the attack read nothing; such a sample's errors are left out of the means."""
    from types import SimpleNamespace

    import torch

    from leaklab.experiments.room_attack import summarise
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    truth = {"images": images, "box": torch.zeros(2, 4), "action": torch.tensor([1, 2]),
             "reward": torch.tensor([1.5, 0.0])}
    rec = SimpleNamespace(images=images.clone(), box=torch.zeros(2, 4), action=torch.tensor([1, 0]), q_pred=None,
                          reward=torch.tensor([1.4, 0.0]), action_identified=torch.tensor([True, False]),
                          read=torch.tensor([True, False]))
    m = room_metrics(rec, truth, "S2")
    assert m["reward_error"] == pytest.approx(0.1) and m["reward_error_undefined"] == 1
    s = summarise([{"batch_size": 2, "iterations": 1, "layouts": ["a"], "metrics": m}], 1.0)
    assert s["reward_abs_err_mean"] == pytest.approx(0.1) and s["reward_error_undefined"] == 1
    nothing = SimpleNamespace(**{**vars(rec), "reward": torch.zeros(2), "read": torch.zeros(2, dtype=torch.bool)})
    s = summarise([{"batch_size": 2, "iterations": 1, "layouts": ["a"],
                    "metrics": room_metrics(nothing, truth, "S2")}], 1.0)
    assert s.get("reward_abs_err_mean") is None and s["reward_error_undefined"] == 2


def test_a_batch_shows_its_room_by_its_best_image_not_its_mean():
    """One image of a batch read well beside its unread mate: the batch's mean gain stayed under the 3 dB that
    shows a room (2.0 dB), and the verdict counted no room where one image stood 10 dB over its baseline."""
    from types import SimpleNamespace

    import torch

    from leaklab.experiments.room_verdicts import IMAGE_LEAK_DB, image_gains
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    noise = 0.1 * torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(2))
    recovered = torch.stack([images[0] + noise, torch.zeros(1, 16, 16)])
    rec = SimpleNamespace(images=recovered.clamp(0, 1), box=torch.zeros(2, 4), action=torch.tensor([1, 2]),
                          q_pred=None, reward=None, action_identified=None, read=torch.tensor([True, False]))
    m = room_metrics(rec, {"images": images, "box": torch.zeros(2, 4), "action": torch.tensor([1, 2])}, "S2")
    assert m["depth_paper_psnr"] - m["depth_paper_psnr_baseline"] < IMAGE_LEAK_DB  # the mean's gain
    assert image_gains({"metrics": m})[0][0] == m["depth_gain_max"] > 9


def test_a_summary_of_reconstructions_that_came_back_nan_has_no_image_means():
    """Paper mode behind clip:1e-11 returns NaN images: each row's finite baseline then covers no transition, and
    the summary raised StatisticsError (zero weights) after every attack had run."""
    from types import SimpleNamespace

    import torch

    from leaklab.experiments.room_attack import summarise
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    rec = SimpleNamespace(images=torch.full_like(images, math.nan), box=torch.zeros(1, 4), action=torch.tensor([1]),
                          q_pred=None, reward=None, action_identified=None, read=None)
    m = room_metrics(rec, {"images": images, "box": torch.zeros(1, 4), "action": torch.tensor([1])}, "S2")
    s = summarise([{"batch_size": 1, "iterations": 1, "layouts": ["a"], "metrics": m}], 1.0)
    assert s.get("depth_psnr_mean") is None and s.get("depth_psnr_baseline_mean") is None


def test_an_rgb_frame_of_one_colour_per_channel_scores_nothing():
    """A flat frame of a colour that is no grey is constant in each channel, as the constant baseline (each
    channel's mean) is: it reproduced the frame (150 dB) where one test over all channels let it through."""
    import math
    from types import SimpleNamespace

    import torch

    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    images[0, :3] = torch.tensor([0.2, 0.5, 0.8])[:, None, None]
    rec = SimpleNamespace(images=torch.rand(1, 4, 16, 16), box=torch.zeros(1, 4), action=torch.tensor([1]),
                          q_pred=None, reward=None, action_identified=None, read=None)
    m = room_metrics(rec, {"images": images, "box": torch.zeros(1, 4), "action": torch.tensor([1])}, "S1")
    assert math.isnan(m["rgb_paper_psnr_baseline"]) and m["rgb_unscored"] == 1
    assert math.isfinite(m["depth_paper_psnr"])


def test_a_constant_true_image_scores_nothing_and_leaves_its_batch_mates_score_whole():
    """A wall filling the depth frame: the constant baseline is the truth (300 dB), which sank the batch's mean gain
    by some 120 dB, so that its partner's room never showed."""
    import math
    from types import SimpleNamespace

    import torch

    from leaklab.experiments.room_verdicts import image_gains
    from leaklab.metrics.rooms import room_metrics

    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    images[0] = 0.015625  # ViZDoom's nearest depth, everywhere
    truth = {"images": images, "box": torch.zeros(2, 4), "action": torch.tensor([1, 2])}
    rec = SimpleNamespace(images=(images + 0.01).clamp(0, 1), box=torch.zeros(2, 4), action=torch.tensor([1, 2]),
                          q_pred=None, reward=None, action_identified=None, read=None)
    m = room_metrics(rec, truth, "S2")
    alone = room_metrics(SimpleNamespace(**{**vars(rec), "images": rec.images[1:], "box": rec.box[1:],
                                           "action": rec.action[1:]}),
                         {k: v[1:] for k, v in truth.items()}, "S2")
    assert m["depth_paper_psnr"] == alone["depth_paper_psnr"] and m["depth_paper_psnr_baseline"] < 30
    assert m["depth_unscored"] == 1 and "depth_unscored" not in alone
    from leaklab.experiments.room_attack import summarise

    rows = [{"batch_size": 2, "iterations": 1, "layouts": ["a"], "metrics": m},
            {"batch_size": 1, "iterations": 1, "layouts": ["b"], "metrics": alone}]
    assert summarise(rows, 1.0)["depth_psnr_mean"] == pytest.approx(alone["depth_paper_psnr"])  # 2 transitions
    assert image_gains({"metrics": m})[0][0] > 20  # its partner's room shows
    one = room_metrics(SimpleNamespace(**{**vars(rec), "images": rec.images[:1], "box": rec.box[:1],
                                         "action": rec.action[:1]}), {k: v[:1] for k, v in truth.items()}, "S2")
    assert math.isnan(one["depth_paper_psnr"]) and math.isnan(one["depth_paper_psnr_baseline"])
    assert image_gains({"metrics": one}) == []  # no gain, in memory (NaN) as once written (None)


def test_summary_counts_the_rows_whose_stage1_started_again():
    from leaklab.experiments.room_attack import summarise

    rows = [{"layouts": ["a"], "batch_size": 1, "iterations": 1, "metrics": {"action": 1.0}, "stage1_starts": n}
            for n in (1, 3, 1)]
    assert summarise(rows, 1.0)["stage1_restarted"] == 1
    exact = [{k: v for k, v in r.items() if k != "stage1_starts"} for r in rows]
    assert "stage1_restarted" not in summarise(exact, 1.0)  # no stage 1: nothing to count
