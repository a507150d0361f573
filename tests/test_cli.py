"""The `leaklab` command line: capture -> attack round trips, determinism, and bad input (one line,
exit code 2, nothing left in --out)."""

from __future__ import annotations

import json
import statistics
import sys
import types
from pathlib import Path

import pytest
import torch
import typer

from cli_helpers import assert_user_error, invoke
from leaklab.io import UPDATE_FILE, UPDATE_JSON, load_tensors, save_tensors

torch.set_num_threads(1)

TINY = ["--model", "lenet", "--data", "photos", "--image-size", "16", "--num-images", "1"]
FAST = ["--objective", "l2", "--optimizer", "adam", "--iterations", "3"]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cases") / "case"
    result = invoke("capture", *TINY, "--defense", "prune:0.5,gaussian:0.1", "--seed", "3",
                    "--out", folder)
    assert result.exit_code == 0, result.output
    return folder


def _copy_case(case: Path, tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "case"
    shutil.copytree(case, dest)
    return dest


def _rewrite_update(folder: Path, change) -> None:
    tensors, _ = load_tensors(folder / UPDATE_FILE, "update")
    change(tensors)
    meta = json.loads((folder / UPDATE_JSON).read_text())
    meta["sha256"] = save_tensors(folder / UPDATE_FILE, tensors)
    (folder / UPDATE_JSON).write_text(json.dumps(meta))


# ---------------------------------------------------------------------------- round trips

def test_capture_then_attack_round_trip(case, tmp_path):
    view = json.loads((case / "view.json").read_text())
    assert view["model"]["name"] == "lenet" and view["defense"] == "prune:0.5,gaussian:0.1"
    out = tmp_path / "attack"
    result = invoke("attack", "inversion", "--case", case, *FAST, "--out", out)
    assert result.exit_code == 0, result.output
    assert "PSNR" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [".leaklab-entries.json", "reconstructions.png",
                                                     "reconstructions.safetensors", "results.json"]
    res = json.loads((out / "results.json").read_text())
    for key in ("psnr_mean", "ssim_mean", "psnr_baseline_mean", "label_accuracy", "seconds", "iterations"):
        assert key in res["summary"]
    assert res["summary"]["iterations"] == 3
    sample = res["samples"][0]
    for key in ("psnr", "ssim", "label_correct", "psnr_baseline"):
        assert key in sample
    # what the defense left of each image's update, as the capture recorded it, and in the printed line
    kept = [s["update_cosine"] for s in res["samples"]]
    assert all(-1 <= k < 1 for k in kept)
    assert res["summary"]["update_cosine_median"] == pytest.approx(statistics.median(kept))
    assert "update kept (cosine with the true one)" in result.stdout
    assert res["config"]["inversion"]["objective"] == "l2"
    assert res["config"]["capture"]["defense"] == "prune:0.5,gaussian:0.1"
    assert set(res["versions"]) >= {"leaklab", "torch", "python"} and res["device"]
    assert (out / "reconstructions.png").read_bytes()[:4] == b"\x89PNG"


def test_attack_without_truth_reports_no_scores(case, tmp_path):
    folder = _copy_case(case, tmp_path)
    (folder / "truth.safetensors").unlink()
    out = tmp_path / "attack"
    result = invoke("attack", "inversion", "--case", folder, *FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["psnr_mean"] is None and res["summary"]["truth"] is False
    assert "label" in res["samples"][0] and "psnr" not in res["samples"][0]
    assert "update_cosine" not in res["samples"][0] and "update_cosine_median" not in res["summary"]


def test_one_shot_and_same_seed_same_numbers(tmp_path):
    args = ["attack", "inversion", "--model", "lenet", "--data", "faces", "--image-size", "16",
            "--num-images", "2", "--batch-size", "2", "--defense", "gaussian:0.01", "--seed", "5",
            "--objective", "cosine", "--iterations", "3"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke(*args, "--out", a).exit_code == 0
    assert invoke(*args, "--out", b).exit_code == 0
    assert (a / "case" / "view.json").exists() and (a / "case" / "truth.safetensors").exists()
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    assert ra["samples"] == rb["samples"]
    # a batch of two images is one update: both carry that update's cosine
    assert ra["samples"][0]["update_cosine"] == ra["samples"][1]["update_cosine"] < 1
    assert ra["summary"]["psnr_mean"] == rb["summary"]["psnr_mean"]
    ta, _ = load_tensors(a / "case" / UPDATE_FILE, "update")
    tb, _ = load_tensors(b / "case" / UPDATE_FILE, "update")
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert ra["config"]["capture"]["seed"] == 5 and ra["config"]["inversion"]["seed"] == 5


def test_analytic_recovers_mlp_input_exactly(tmp_path):
    out = tmp_path / "analytic"
    result = invoke("attack", "analytic", "--model", "mlp", "--data", "digits", "--image-size", "8",
                    "--num-images", "2", "--width", "32", "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    assert res["summary"]["psnr_mean"] > 100
    assert res["summary"]["label_accuracy"] == 1.0
    # the one-shot form's model is the MLP unless named (its first layer is fully connected)
    result = invoke("attack", "analytic", "--data", "digits", "--image-size", "8", "--width", "32", "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["config"]["capture"]["model"] == "mlp"
    # an update whose first bias gradient was pruned away holds nothing to read: the error names it
    pruned = invoke("attack", "analytic", "--model", "mlp", "--image-size", "8", "--num-images", "16", "--defense",
                    "prune:0.99", "--out", tmp_path / "pruned")
    assert pruned.exit_code == 2 and "error: update 6 of 16: the bias gradient is all zero" in pruned.output
    assert not (tmp_path / "pruned").exists()


def test_version():
    import leaklab

    result = invoke("--version")
    assert result.exit_code == 0 and result.output == f"leaklab {leaklab.__version__}\n"


def test_a_mistyped_command_is_suggested_once():
    """click and typer each suggested the command: "Did you mean 'attack'? Did you mean 'attack'?"."""
    for args, name in ((("atack",), "'attack'"), (("reproduce", "room-table"), "'room-table1'")):
        result = invoke(*args)
        assert result.exit_code == 2 and result.stderr.count(name) == 1, result.stderr


def test_an_option_given_to_the_wrong_command_says_where_it_belongs():
    """`leaklab audit --threads 2` said only "no such option"; `attack qgi --case` was offered --seed."""
    for args, words in ((("audit", "--threads", "2"), "give it before the command (leaklab --threads VALUE audit"),
                        (("attack", "qgi", "--case", "x"), "leaklab audit --cases DIR"),
                        (("attack", "rgi", "--version"), "give it before the command (leaklab --version)"),
                        (("audit", "--thread", "2"), "(see leaklab audit --help)")):
        result = invoke(*args)
        assert result.exit_code == 2 and result.stderr.startswith("error: no such option"), result.stderr
        assert words in result.stderr and "Did you mean" not in result.stderr, result.stderr

def test_command_listings_give_each_summary_as_one_line(monkeypatch):
    """typer's listing kept a docstring's line breaks: on a terminal of any width a command's summary broke off
    mid-line ("...an RNN" / "and an FFNN...")."""
    import click
    import typer.rich_utils

    from leaklab.cli import app

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 1000)  # wide enough that nothing wraps
    groups = [((), typer.main.get_command(app))]
    seen = 0
    while groups:
        path, group = groups.pop()
        result = invoke(*path, "--help")
        assert result.exit_code == 0, result.output
        lines = [" ".join(line.strip(" │").split()) for line in result.output.splitlines()]
        for name in group.list_commands(click.Context(group)):
            command = group.get_command(click.Context(group), name)
            summary = " ".join((command.help or "").split("\n\n")[0].split())
            assert any(line == f"{name} {summary}" for line in lines), (path, name, summary)
            seen += 1
            if isinstance(command, click.Group):
                groups.append(((*path, name), command))
    assert seen >= 30


def test_help_version_and_bad_names_do_not_load_torch(tmp_path):
    """`leaklab --help` took 2.6 s here while torch loaded, 0.5 s without it; a mistyped name
    (`--setting S3`) was refused only after the imports, 6-9 s, and a negative seed was a traceback in
    some commands (`reproduce bayes-table2` also left its cells folder behind)."""
    import subprocess

    out = tmp_path / "out"
    o = ["--out", str(out)]
    bad = {("attack", "qgi", "--setting", "S3", *o): "choose S1 | S2",
           ("audit", "--arch", "wide", *o): "choose small | nature", ("audit", "--kind", "x", *o): "rooms | images",
           ("env", "capture", "--policy", "x", *o): "random | agent", ("capture", "--model", "vgg", *o): "lenet",
           ("attack", "inversion", "--data", "x", *o): "photos",
           ("attack", "inversion", "--objective", "x", *o): "choose l2 | l1 | cosine | bayes",
           ("capture", "--bn-stats", "z", *o): "choose batch | running",
           ("reproduce", "room-table1", "--mode", "x", *o): "paper",
           ("reproduce", "bayes-table2", "--quick", "--seed", "-1", *o): "from 0 to 4294967295",
           ("mechanisms", "audit", "--mechanism", "laplace", "--seed", "-1"): "from 0",
           ("capture", "--image-seed", "4294967296", *o): "from 0", ("env", "contact-sheet", "--seed", "-3"): "from 0",
           ("attack", "qgi", "--layouts", "e1m1-stalactite,nowhere", *o): "unknown room layout 'nowhere'",
           ("env", "contact-sheet", "--layouts", "99", *o): "there are 17 room layouts",
           ("reproduce", "inversion-checks", "--checks", "nope", *o): "choose dlg | idlg | analytic",
           ("reproduce", "bayes-table2", "--steps", "x", *o): "whole numbers of train steps",
           ("reproduce", "bayes-table2", "--steps", "²", *o): "whole numbers of train steps",
           ("reproduce", "room-table1", "--cells", "qgi-S3", *o): "choose qgi-S1 | qgi-S2",
           ("attack", "qgi", "--device", "tpu", *o): "cpu or cuda[:N]", ("audit", "--device", "cuda:x", *o): "cuda[:N]",
           ("attack", "rgi", "--defense", "clip:1,gauss:2", *o): "unknown defense 'gauss'",
           ("capture", "--defense", "prune:1", *o): "out of range",
           # noise past float32 made infinite updates, refused only when attacked (the audit after its capture)
           ("capture", "--defense", "laplace:1e308", *o): "noise scales in (0, 1e+06]",
           ("mechanisms", "account", "dpsgd", "--q", "0.1", "--sigma", "1", "--steps", "9", "--accountant", "x"): "prv",
           ("mechanisms", "audit", "--epsilon", "1", "--mechanism", "lap"): "randomized-response | dirichlet | dpsgd",
           ("mechanisms", "audit", "--mechanism", "laplace", "--epsilon", "1", "--test", "x"): "choose split | scan"}
    code = ("import sys; from typer.testing import CliRunner; from leaklab.cli import app; "
            "r = [CliRunner().invoke(app, a).exit_code for a in (['--version'], ['--help'], ['attack', 'inversion', "
            f"'--help'], ['audit', '--help'])] + [CliRunner().invoke(app, list(a)).exit_code for a in {list(bad)!r}]; "
            "print(r, 'torch' in sys.modules)")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == f"{[0, 0, 0, 0] + [2] * len(bad)} False", printed
    for args, need in bad.items():
        flag = next(a for a in reversed(args) if a.startswith("--") and a != "--out")
        value = args[args.index(flag) + 1]
        got = value if flag not in ("--seed", "--image-seed") else int(value)
        assert_user_error(invoke(*args), out, f"invalid {flag} (got {got!r})", need)


def test_a_named_choice_takes_any_case_and_passes_on_the_name_as_listed():
    """Every closed-list option is a ``_choice``: ``s1``, ``Nature``, ``Randomized_Response`` and the alias
    ``rr`` are read as the names the configurations know (``S1``, ``nature``, ``randomized-response``)."""
    from leaklab.cli.options import _choice
    from leaklab.names import ARCH_NAMES, MECHANISM_ALIASES, MECHANISM_NAMES, SETTING_NAMES

    assert [_choice("--setting", SETTING_NAMES).callback(v) for v in ("s1", "S2", None)] == ["S1", "S2", None]
    assert _choice("--arch", ARCH_NAMES).callback("Nature") == "nature"
    mechanism = _choice("--mechanism", MECHANISM_NAMES, aliases=MECHANISM_ALIASES).callback
    assert [mechanism(v) for v in ("Randomized_Response", "RR")] == ["randomized-response"] * 2
    with pytest.raises(typer.Exit):
        _choice("--setting", SETTING_NAMES).callback("S3")
    # list options read each item the same way
    from leaklab.cli.options import _bounded, _each, _spelling
    from leaklab.names import INVERSION_CHECK_NAMES, TABLE1_CELLS

    assert _each("--cells", _spelling(TABLE1_CELLS), "")("QGI-s1, rgi-S2") == "qgi-S1,rgi-S2"
    checks = _each("--checks", _spelling(INVERSION_CHECK_NAMES), "")
    assert checks(["IG", "ig-batch-stats,dlg"]) == ["ig", "ig_batch_stats", "dlg"] and checks(None) is None
    assert [_bounded(500)(v) for v in ("500", "²", "-1", "501")] == ["500", None, None, None]  # int("²") raises


def test_mistakes_click_finds_are_one_line_too(tmp_path):
    """A value of the wrong type, a missing or unknown option, an unknown command: one `error:` line naming
    it and the command's help, exit code 2 (they were boxed panels of 5 lines)."""
    out = tmp_path / "out"
    for args, words in ((("attack", "qgi", "--samples", "abc", "--out", out), ["'--samples'", "'abc'"]),
                        (("attack", "qgi"), ["missing option '--out'", "leaklab attack qgi --help"]),
                        (("attack", "qgi", "--out", out, "--bogus"), ["'--bogus'"]),
                        (("--threads", "0", "attack", "qgi", "--out", out), ["'--threads'"]),
                        # named as typed (it said --steps, the field of the agent it trains)
                        (("attack", "qgi", "--train-steps", "99999999999", "--out", out),
                         ["invalid --train-steps", "from 0 to 10,000,000"]),
                        (("nosuch",), ["'nosuch'", "leaklab --help"])):
        assert_user_error(invoke(*args), out, *words)
    for args in (("attack",), ()):  # a group without its command shows its help
        result = invoke(*args)
        assert result.exit_code == 2 and "Usage: leaklab" in result.output


def test_knows_labels_flag(tmp_path):
    out = tmp_path / "case"
    assert invoke("capture", *TINY, "--knows-labels", "--out", out).exit_code == 0
    meta = json.loads((out / "update.json").read_text())
    assert meta["updates"][0]["labels"] is not None


def test_prior_options_change_the_priors_they_name_and_keep_the_others():
    """--prior range=0.5 dropped the default TV prior, --tv a config file's range prior, silently."""
    from leaklab.experiments.image_attack import inversion_config, parse_priors

    assert inversion_config(priors=parse_priors(["range=0.5"])).priors == {"tv": 0.2, "range": 0.5}
    base = {"priors": {"tv": 0.2, "range": 1.0}}
    assert inversion_config(base, priors=parse_priors(None, 0.5)).priors == {"tv": 0.5, "range": 1.0}
    assert inversion_config(base, priors=parse_priors(["tv=0"])).priors == {"range": 1.0}  # 0 removes one
    assert inversion_config(base).priors == base["priors"]
    assert inversion_config({"optimizer": "lbfgs"}, priors=parse_priors(["range=1"])).priors == {"range": 1.0}


def test_yaml_config_file_with_override(case, tmp_path):
    cfg = tmp_path / "attack.yaml"
    cfg.write_text("objective: l1\noptimizer: adam\niterations: 5\nlr: 0.05\n")
    out = tmp_path / "attack"
    assert invoke("attack", "inversion", "--case", case, "--config", cfg, "--iterations", "2",
                  "--out", out).exit_code == 0
    inv = json.loads((out / "results.json").read_text())["config"]["inversion"]
    assert (inv["objective"], inv["iterations"], inv["lr"]) == ("l1", 2, 0.05)
    cfg.write_text("1: 2\n")  # a key that is no option name
    bad = tmp_path / "bad"
    assert_user_error(invoke("attack", "inversion", "--case", case, "--config", cfg, "--out", bad), bad,
                      "mapping of option names")
    # the file's own mistakes are named as its fields, not as options the user never typed
    for text, words in (("bogus: 1\n", ["--config", "field 'bogus'"]), ("iterations: -1\n", ["field 'iterations'"]),
                        ("restarts: true\n", ["field 'restarts'"]), ("seed: 2.0\n", ["field 'seed'"])):  # coerced
        cfg.write_text(text)
        line = assert_user_error(invoke("attack", "inversion", "--case", case, "--config", cfg, "--out", bad), bad,
                                 *words)
        assert "--bogus" not in line and "--iterations" not in line
    # a rule across fields waits for the options: they complete the file (mc_samples 3 with --mc-radius was refused)
    cfg.write_text("mc_samples: 2\niterations: 2\n")
    done = tmp_path / "completed"
    assert invoke("attack", "inversion", "--case", case, "--config", cfg, "--mc-radius", "0.1",
                  "--out", done).exit_code == 0
    assert json.loads((done / "results.json").read_text())["config"]["inversion"]["mc_radius"] == 0.1
    # labels the server was given are not reported as recovered
    given = invoke("attack", "inversion", "--model", "lenet", "--data", "photos", "--num-images", "1", "--image-size",
                   "16", "--iterations", "1", "--knows-labels", "--out", tmp_path / "given")
    assert given.exit_code == 0 and "labels given" in given.stdout and "labels 100%" not in given.stdout
    # a setting the optimizer would record but not apply (L-BFGS ran bit for bit the same whatever its schedule)
    for args, words in ((("--optimizer", "lbfgs", "--schedule", "step"), ["schedule applies to adam"]),
                        (("--schedule", "cosine", "--config", cfg), [f"--config {cfg}: mc_samples"])):
        # the file's own rule that no option completes is still named in the file
        assert_user_error(invoke("attack", "inversion", "--case", case, *args, "--out", bad), bad, *words)
    # a config kept in the --out folder it would be replaced with is refused, not deleted
    kept = out / "attack.yaml"
    kept.write_text("iterations: 2\n")
    result = invoke("attack", "inversion", "--case", case, "--config", kept, "--out", out)
    assert result.exit_code == 2 and "would replace the input" in result.stderr and kept.is_file()


def test_out_never_replaces_the_case_it_reads(case, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(case, run / "case")
    for out in (run, run / "case"):
        result = invoke("attack", "inversion", "--case", run / "case", *FAST, "--out", out)
        assert result.exit_code == 2 and "would replace the input" in result.stderr, result.output
        assert (run / "case" / "view.json").is_file()


# ---------------------------------------------------------------------------- bad input

def test_truncated_update_file(case, tmp_path):
    folder = _copy_case(case, tmp_path)
    path = folder / UPDATE_FILE
    path.write_bytes(path.read_bytes()[:1000])
    out = tmp_path / "out"
    result = invoke("attack", "inversion", "--case", folder, *FAST, "--out", out)
    assert_user_error(result, out, "update file", "truncated or corrupt")


def test_corrupt_update_file(case, tmp_path):
    folder = _copy_case(case, tmp_path)
    path = folder / UPDATE_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)  # zeroed block in the tensor data
    path.write_bytes(bytes(data))
    out = tmp_path / "out"
    result = invoke("attack", "inversion", "--case", folder, *FAST, "--out", out)
    assert_user_error(result, out, "truncated or corrupt")


def test_update_shapes_that_do_not_match_the_model(case, tmp_path):
    folder = _copy_case(case, tmp_path)

    def change(t):
        t["u0/fc.weight"] = torch.zeros(10, 7)
    _rewrite_update(folder, change)
    out = tmp_path / "out"
    result = invoke("attack", "inversion", "--case", folder, *FAST, "--out", out)
    assert_user_error(result, out, "fc.weight", "shape")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_gradients(case, tmp_path, value):
    folder = _copy_case(case, tmp_path)

    def change(t):
        t["u0/fc.bias"][1] = value
    _rewrite_update(folder, change)
    out = tmp_path / "out"
    result = invoke("attack", "analytic", "--case", folder, "--out", out)
    assert_user_error(result, out, "NaN or Inf")


def test_unknown_defense_name(tmp_path):
    out = tmp_path / "case"
    result = invoke("capture", *TINY, "--defense", "prune:0.5,blur:3", "--out", out)
    assert_user_error(result, out, "unknown defense 'blur'")
    out2 = tmp_path / "oneshot"
    result = invoke("attack", "inversion", *TINY, "--defense", "gausian:0.1", *FAST, "--out", out2)
    assert_user_error(result, out2, "gausian")


def test_unknown_objective_name(case, tmp_path):
    out = tmp_path / "out"
    result = invoke("attack", "inversion", "--case", case, "--objective", "l3", "--out", out)
    assert_user_error(result, out, "--objective", "l3")


def test_unknown_model_and_dataset(tmp_path):
    out = tmp_path / "case"
    assert_user_error(invoke("capture", "--model", "vgg", "--out", out), out, "--model")
    assert_user_error(invoke("capture", "--model", "lenet", "--data", "cifar", "--out", out), out, "--data")


def test_batch_size_the_attack_cannot_handle(tmp_path):
    out = tmp_path / "out"
    result = invoke("attack", "analytic", "--model", "mlp", "--data", "digits", "--image-size", "8",
                    "--width", "16", "--batch-size", "2", "--num-images", "2", "--out", out)
    assert_user_error(result, out, "batch size 2")


def test_num_images_not_a_multiple_of_batch_size(tmp_path):
    out = tmp_path / "case"
    result = invoke("capture", *TINY[:-2], "--num-images", "3", "--batch-size", "2", "--out", out)
    assert_user_error(result, out, "multiple")
    assert_user_error(invoke("capture", *TINY, "--local-lr", "0.5", "--out", out), out, "--local-lr", "fedavg")
    assert_user_error(invoke("capture", *TINY, "--width", "8", "--out", out), out, "lenet", "width")


def test_missing_case_and_mixed_forms(case, tmp_path):
    out = tmp_path / "out"
    assert_user_error(invoke("attack", "inversion", "--case", tmp_path / "nope", "--out", out), out,
                      "does not exist")
    assert_user_error(invoke("attack", "inversion", "--case", case, "--model", "lenet", "--out", out),
                      out, "--model")
    assert_user_error(invoke("attack", "inversion", "--out", out), out, "--case")


def test_out_that_is_not_leaklab_output_is_kept(case, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = invoke("attack", "inversion", "--case", case, *FAST, "--out", out)
    assert result.exit_code == 2 and "choose a new folder" in result.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_path_the_file_system_refuses_is_one_line(tmp_path):
    """A name over the file system's 255 bytes (in --out, or one of its folders) was a traceback."""
    for out in (tmp_path / ("x" * 300), tmp_path / ("x" * 300) / "run"):
        line = assert_user_error(invoke("attack", "qgi", "--samples", "1", "--iterations", "3", "--workers", "1",
                                        "--out", out), None, "File name too long", "x" * 300)
        assert "nothing is left half-written" in line or "no partial results" in line
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------- reproduce wiring

def test_reproduce_bayes_table2_is_wired(monkeypatch, tmp_path):
    import leaklab.experiments as experiments

    calls = {}

    def run(out, quick=False, datasets=None, defenses=None, steps=None, images=None, seed=0, progress=None):
        calls.update(out=out, quick=quick, datasets=datasets, defenses=defenses, steps=steps, images=images)
        table = {"digits": {"prune:0.5,gaussian:0.1": {"0": {"bayes": 20.0, "l2": 15.0}}}}
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.json").write_text(json.dumps({"table": table}))
        return {"table": table}

    fake = types.ModuleType("leaklab.experiments.bayes_table2")
    fake.run = run
    monkeypatch.setitem(sys.modules, "leaklab.experiments.bayes_table2", fake)
    monkeypatch.setattr(experiments, "bayes_table2", fake, raising=False)
    out = tmp_path / "table"
    result = invoke("reproduce", "bayes-table2", "--quick", "--datasets", "digits,photos,digits",
                    "--defenses", "prune:0.5,gaussian:0.1", "--defenses", "laplace:0.1",
                    "--steps", "0,500,00", "--images", "2", "--out", out)
    assert result.exit_code == 0, result.output
    # each once (digits,digits and steps 0,0 were recorded and run twice)
    assert calls["quick"] is True and calls["datasets"] == ["digits", "photos"]
    assert calls["defenses"] == ["prune:0.5,gaussian:0.1", "laplace:0.1"]
    assert calls["steps"] == [0, 500] and calls["images"] == 2
    assert json.loads((out / "results.json").read_text())["table"]["digits"]
    assert "bayes 20.00" in result.stdout


def test_reproduce_commands_and_threads_setting_fail_with_one_line(case, tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for cmd in (["reproduce", "inversion-checks", "--quick"], ["reproduce", "bayes-table2", "--quick"]):
        result = invoke(*cmd, "--out", afile)
        assert result.exit_code == 2 and result.stderr.startswith("error: --out") and afile.read_text() == "mine"
    out = tmp_path / "ic"
    assert_user_error(invoke("reproduce", "inversion-checks", "--images", "0", "--out", out), out, "--images")
    assert_user_error(invoke("attack", "analytic", "--case", case, "--seed", "3", "--out", out), out, "--seed")
    monkeypatch.setenv("LEAKLAB_THREADS", "abc")
    assert_user_error(invoke("reproduce", "inversion-checks", "--quick", "--out", out), out, "LEAKLAB_THREADS")
    # a million threads made torch's pool fail to map its stacks: a segfault, not an error line
    monkeypatch.setenv("LEAKLAB_THREADS", "1000000")
    assert_user_error(invoke("reproduce", "inversion-checks", "--quick", "--out", out), out, "from 1 to 1024")
    monkeypatch.delenv("LEAKLAB_THREADS")
    assert_user_error(invoke("--threads", "1025", "reproduce", "inversion-checks", "--quick", "--out", out), out,
                      "'--threads'", "1025")


def test_plain_progress_writes_a_line_every_interval_and_at_each_task_end(capsys):
    """On a non-interactive stderr (a log, CI) long work reports plain lines; the first 30 s stay silent."""
    from leaklab.cli.progress import PLAIN_EVERY, _plain_progress

    now = [100.0]
    progress = _plain_progress(clock=lambda: now[0])
    for t, done in ((1, 0), (5, 1), (PLAIN_EVERY - 1, 2), (PLAIN_EVERY + 1, 3), (PLAIN_EVERY + 10, 4),
                    (2 * PLAIN_EVERY + 2, 5), (2 * PLAIN_EVERY + 3, 60)):
        now[0] = 100.0 + t
        progress("audit", done, 60)
    now[0] += 1
    progress(task="cell 2/2: qgi-S1", completed=0, total=None)
    lines = capsys.readouterr().err.splitlines()
    # the time left at the task's rate since its count first moved (1 done at 0:05), not since its start-up began
    # (0 at 0:01, which said 9:30): 57 x 26 s / 2
    assert lines == ["audit: 3/60 (0:31 elapsed, about 12:21 left)", "audit: 5/60 (1:02 elapsed, about 13:03 left)",
                     "audit: 60/60 (1:03 elapsed)"]


def test_plain_progress_shows_a_running_attacks_share_to_the_tenth_below(capsys):
    from leaklab.cli.progress import PLAIN_EVERY, _plain_progress

    now = [0.0]
    progress = _plain_progress(clock=lambda: now[0])
    for t, done in ((PLAIN_EVERY + 1, 0.96), (2 * PLAIN_EVERY + 2, 2.25), (2 * PLAIN_EVERY + 3, 3.0),
                    (2 * PLAIN_EVERY + 4, 3)):
        now[0] = t
        progress("qgi S1", done, 3)
    assert capsys.readouterr().err.splitlines() == [
        "qgi S1: 0.9/3 (0:31 elapsed)", "qgi S1: 2.2/3 (1:02 elapsed, about 0:18 left)", "qgi S1: 3/3 (1:03 elapsed)"]


def test_plain_progress_estimates_from_a_whole_steps_move(capsys):
    """The audit's attacks report their first image steps as shares of an attack: 0.05 of one in the first 30 s
    said 3:30:50 left of a 10-minute run; the estimate waits for one attack's worth (a short count's twentieth)."""
    from leaklab.cli.progress import PLAIN_EVERY, _plain_progress

    now = [0.0]
    progress = _plain_progress(clock=lambda: now[0])
    for t, done in ((1, 0), (20, 0.02), (PLAIN_EVERY + 1, 0.05), (2 * PLAIN_EVERY + 2, 2.2)):
        now[0] = t
        progress("audit", done, 60)
    now[0] = 0.0
    short = _plain_progress(clock=lambda: now[0])
    for t, done in ((1, 0), (PLAIN_EVERY + 1, 0.2)):
        now[0] = t
        short("qgi S1", done, 1)
    assert capsys.readouterr().err.splitlines() == [
        "audit: 0/60 (0:31 elapsed)", "audit: 2.2/60 (1:02 elapsed, about 18:33 left)",
        "qgi S1: 0.2/1 (0:31 elapsed, about 2:00 left)"]


def test_plain_progress_estimates_after_the_second_of_whole_steps_counted_from_one(capsys):
    """A task counting whole steps from 1 (training runs, maps) gets its estimate at its second step, as before its
    rate ran from its count's first move (a review found such a task waiting a step longer, or never estimated)."""
    from leaklab.cli.progress import PLAIN_EVERY, _plain_progress

    now = [0.0]
    progress = _plain_progress(clock=lambda: now[0])
    for step in range(1, 5):
        now[0] = step * (PLAIN_EVERY + 10)
        progress("training runs", step, 4)
    assert capsys.readouterr().err.splitlines() == [
        "training runs: 1/4 (0:40 elapsed)", "training runs: 2/4 (1:20 elapsed, about 1:20 left)",
        "training runs: 3/4 (2:00 elapsed, about 0:40 left)", "training runs: 4/4 (2:40 elapsed)"]


def test_terminal_progress_starts_a_new_bar_when_work_goes_on_after_a_full_one():
    """On a terminal a full bar stops its clock: the capture's bar, reused for the attacks, showed their
    elapsed and remaining time as 0:00:00 throughout. Steps of one count share a bar."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from leaklab.cli.progress import _bar_progress

    bars = Progress(console=Console(file=io.StringIO(), force_terminal=True))
    progress = _bar_progress(bars)
    progress("capture qgi S2", 2, 3)
    progress("capture qgi S2", 3, 3)
    progress("qgi S2", 0, 3)
    progress("qgi S2", 1.5, 3)
    capture, attack = bars.tasks
    assert (capture.description, capture.finished, capture.completed) == ("capture qgi S2", True, 3)
    assert (attack.description, attack.finished, attack.completed, attack.total) == ("qgi S2", False, 1.5, 3)
    progress("qgi S2", 3, 3)
    progress("qgi S2", 3, 3)  # a task's end told twice (its last step, then its result)
    progress("digits none step 0 dlg: 2.5 dB", 4, 10)  # a reproduction names each step of its count
    progress("digits none step 0 ig: 9.1 dB", 5, 10)
    assert [t.description for t in bars.tasks] == ["capture qgi S2", "qgi S2", "digits none step 0 ig: 9.1 dB"]
    assert attack.finished and bars.tasks[-1].completed == 5


def test_plain_progress_clock_counts_hours():
    from leaklab.cli.progress import _clock

    assert (_clock(31), _clock(3599), _clock(3723), _clock(36000)) == ("0:31", "59:59", "1:02:03", "10:00:00")


@pytest.mark.parametrize("args, words", [
    (["--tv", "inf"], ["--prior/--tv", "finite"]), (["--prior", "tv=nan"], ["finite"]),
    (["--mc-radius", "inf"], ["--mc-radius", "finite"]), (["--lr", "1e308"], ["--lr", "less than or equal"]),
    # two weights for one prior: the last one was used, silently
    (["--tv", "0.5", "--prior", "tv=1"], ["--tv and --prior tv"]), (["--prior", "tv=1", "--prior", "tv=2"], ["twice"]),
])
def test_non_finite_or_huge_attack_options_are_refused(tmp_path, args, words):
    """--tv inf was a traceback (or NaN PSNRs with exit code 0), --tv nan silently dropped the prior."""
    out = tmp_path / "out"
    assert_user_error(invoke("attack", "inversion", *TINY, *FAST, *args, "--out", out), out, *words)


def test_a_diverging_attack_is_an_error_not_nan_scores(tmp_path):
    """Updates of 1e29 (FedAvg at a local learning rate of 1e30) gave PSNR nan and exit code 0."""
    case = tmp_path / "case"
    assert invoke("capture", *TINY, "--update", "fedavg", "--local-lr", "1e30", "--local-steps", "3",
                  "--out", case).exit_code == 0
    out = tmp_path / "out"
    assert_user_error(invoke("attack", "inversion", "--case", case, "--iterations", "20", "--out", out), out,
                      "the attack diverged")
    assert_user_error(invoke("capture", *TINY, "--update", "fedavg", "--local-lr", "inf", "--out", out), out,
                      "--local-lr", "finite")
    # a local step so large that the update overflows was written (all NaN, exit code 0) and refused on load
    assert_user_error(invoke("capture", *TINY, "--update", "fedavg", "--local-lr", "1e300", "--local-steps", "3",
                             "--out", out), out, "not finite", "lower --local-lr")


def test_a_batchnorm_that_sees_one_value_per_channel_is_one_line(tmp_path):
    """resnet18 at 8 px shrinks one image to 1x1 before its last BatchNorm: a ValueError's traceback before."""
    out = tmp_path / "case"
    assert_user_error(invoke("capture", "--model", "resnet18", "--width", "4", "--image-size", "8", "--out", out),
                      out, "one value per channel", "--bn-stats running")
    assert invoke("capture", "--model", "resnet18", "--width", "4", "--image-size", "8", "--bn-stats", "running",
                  "--out", out).exit_code == 0


def test_an_attacks_output_given_as_a_case_points_to_its_case(tmp_path):
    first = tmp_path / "first"
    assert invoke("attack", "analytic", "--data", "digits", "--image-size", "8", "--width", "32",
                  "--out", first).exit_code == 0
    out = tmp_path / "out"
    assert_user_error(invoke("attack", "inversion", "--case", first, "--out", out), out,
                      f"{first} is an attack's output; its case is {first / 'case'}")


def test_a_room_named_twice_is_refused():
    from leaklab.errors import LeaklabError
    from leaklab.rl.envs.layouts import layouts_arg

    assert layouts_arg("e1m1-stalactite, e1m3-column") == ("e1m1-stalactite", "e1m3-column")
    with pytest.raises(LeaklabError, match="name e1m1-stalactite more than once"):
        layouts_arg("e1m1-stalactite,e1m3-column,e1m1-stalactite")


def test_monte_carlo_points_that_cannot_act_are_refused(case, tmp_path):
    """--mc-samples 3 without a radius drew 3 equal points (3 times the work for nothing); L-BFGS never drew."""
    out = tmp_path / "out"
    assert_user_error(invoke("attack", "inversion", "--case", case, *FAST, "--mc-samples", "3", "--out", out), out,
                      "give mc_radius > 0")
    assert_user_error(invoke("attack", "inversion", "--case", case, "--optimizer", "lbfgs", "--mc-radius", "0.1",
                             "--out", out), out, "need the adam optimizer")


def test_a_crash_in_native_code_prints_where_it_happened():
    """A segmentation fault in ViZDoom's engine start ended a command with no word of where (session 23);
    a command now prints the Python traceback of every thread on such a crash."""
    import os
    import subprocess

    code = ("import os, signal; from leaklab.cli.app import _guard\n"
            "def start_the_engine():\n"
            "    os.kill(os.getpid(), signal.SIGSEGV)\n"
            "_guard(start_the_engine)()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}  # the command's own handler
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == -11 and "Segmentation fault" in run.stderr and "start_the_engine" in run.stderr


def test_sigterm_ends_a_command_with_one_line():
    """SIGTERM (a job scheduler, `timeout`) ended a command with exit status 143 and not a word; it now
    says so as Ctrl-C does, once, though `timeout` sends its process group a second one."""
    import signal
    import subprocess

    code = ("import os, signal, time; from leaklab.cli.app import _guard\n"
            "def work():\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)\n"
            "    finally:  # cleaning up, as atomic_dir does, when the second comes\n"
            "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print('cleaned up')\n"
            "_guard(work)()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, run.stderr
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("error: terminated; nothing is left half-written"), \
        run.stderr
    assert run.stdout == "cleaned up\n"


def test_an_interrupted_command_says_what_it_leaves(capsys):
    """Ctrl-C's line names what the command keeps: the room commands their finished attacks, the
    table reproductions their cells, the others nothing."""
    import importlib

    cli_app = importlib.import_module("leaklab.cli.app")  # the module; leaklab.cli.app is the typer app

    def work():
        raise KeyboardInterrupt

    for guarded, kept in ((cli_app._guard(work), cli_app.NOTHING_KEPT),
                          (cli_app._guard(stopped=cli_app.CELLS_KEPT)(work), cli_app.CELLS_KEPT),
                          (cli_app._guard(stopped=cli_app.CHECKS_KEPT)(work), cli_app.CHECKS_KEPT)):
        with pytest.raises(typer.Exit) as stop:
            guarded()
        assert stop.value.exit_code == 130 and capsys.readouterr().err == f"error: interrupted; {kept}\n"


def test_a_published_table_names_its_network():
    from leaklab.cli.reproduce import _published_command

    argv = ["reproduce", "room-table1", "--mode", "exact", "--update-docs", "--out", "runs/a b"]
    assert _published_command(argv, "small") == \
        "leaklab reproduce room-table1 --mode exact --out 'runs/a b' --arch small"
    assert _published_command(["reproduce", "room-table2", "--arch", "deep"], "deep") == \
        "leaklab reproduce room-table2 --arch deep"
    assert _published_command(["reproduce", "room-table2", "--arch=deep"], "deep").endswith("--arch=deep")
