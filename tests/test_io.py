"""leaklab.io: safetensors/JSON files, validation at load, atomic output folders, case folders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from leaklab.errors import LeaklabError
from leaklab.experiments.capture import CaptureConfig, capture, write
from leaklab.cases import load_case, load_truth
from leaklab.io import (AUDIT_FORMAT, BAYES_TABLE2_FORMAT, ENTRIES_FILE, REPRODUCTION_FORMAT, ROOM_ATTACK_FORMAT,
                        UPDATE_FILE, UPDATE_JSON, VIEW_FILE, VIEW_FORMAT, atomic_dir, check_out, json_line,
                        load_tensors, make_out_dir, new_run_dir, read_config, read_json, save_tensors,
                        tensor_file_metadata, write_json)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_capture():
    return capture(CaptureConfig(model="lenet", data="photos", num_images=2, image_size=16,
                                 defense="gaussian:0.01", seed=1))


@pytest.fixture()
def case_dir(tmp_path, tiny_capture) -> Path:
    folder = tmp_path / "case"
    write(tiny_capture, folder)
    return folder


def _rewrite_update(folder: Path, change) -> None:
    """Apply ``change`` to the update tensors and keep update.json's checksum consistent, so that
    only the problem under test is present."""
    tensors, _ = load_tensors(folder / UPDATE_FILE, "update")
    change(tensors)
    sha = save_tensors(folder / UPDATE_FILE, tensors)
    meta = json.loads((folder / UPDATE_JSON).read_text())
    meta["sha256"] = sha
    (folder / UPDATE_JSON).write_text(json.dumps(meta))


# ---------------------------------------------------------------------------- tensors and JSON

def test_tensors_round_trip(tmp_path):
    t = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    sha = save_tensors(tmp_path / "x.safetensors", t, {"note": "hi"})
    back, meta = load_tensors(tmp_path / "x.safetensors", "test", sha)
    assert torch.equal(back["a"], t["a"]) and torch.equal(back["b"], t["b"])
    assert meta["note"] == "hi"
    assert sha == hashlib.sha256((tmp_path / "x.safetensors").read_bytes()).hexdigest()
    assert torch.equal(load_tensors(tmp_path / "x.safetensors", "test", sha.upper())[0]["a"], t["a"])  # was "corrupt"
    for recorded in (5, "sha256:" + sha, sha[:-1]):  # read as a corrupt file
        with pytest.raises(LeaklabError, match="is not 64 hexadecimal digits"):
            load_tensors(tmp_path / "x.safetensors", "test", recorded)


def test_truncated_and_garbage_tensor_files(tmp_path):
    path = tmp_path / "x.safetensors"
    save_tensors(path, {"a": torch.randn(100)})
    path.write_bytes(path.read_bytes()[:-17])
    with pytest.raises(LeaklabError, match="truncated or corrupt"):
        load_tensors(path, "update")
    path.write_bytes(b"\x00garbage" * 5)
    with pytest.raises(LeaklabError, match="truncated or corrupt"):
        load_tensors(path, "update")
    path.write_bytes(b"")
    with pytest.raises(LeaklabError, match="truncated or corrupt"):
        load_tensors(path, "update")
    with pytest.raises(LeaklabError, match="missing"):
        load_tensors(tmp_path / "nope.safetensors", "update")
    # a pickle or torch.save file under the name is told as such (it read as a header too large), never unpickled
    import pickle

    for make in (lambda: torch.save({"a": torch.zeros(3)}, path),
                 lambda: path.write_bytes(pickle.dumps({"a": [0.0] * 3}, protocol=4))):
        make()
        with pytest.raises(LeaklabError, match="is a pickle or torch.save file, not safetensors"):
            load_tensors(path, "update")


def test_checksum_detects_a_flipped_byte(tmp_path):
    path = tmp_path / "x.safetensors"
    sha = save_tensors(path, {"a": torch.zeros(64)})
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    load_tensors(path, "update")  # still a well-formed file ...
    with pytest.raises(LeaklabError, match="truncated or corrupt"):
        load_tensors(path, "update", sha)  # ... but not the one recorded


def test_json_round_trip_and_errors(tmp_path):
    write_json(tmp_path / "r.json", {"x": float("nan"), "t": torch.tensor([1.5]), "p": Path("a")})
    assert read_json(tmp_path / "r.json") == {"x": None, "t": [1.5], "p": "a"}
    # a line of samples.jsonl is strict JSON too: an infinite % error (a true Q of 0) is null, not Infinity
    assert json_line({"q_err": float("inf"), "t": torch.tensor(2.5)}) == '{"q_err": null, "t": 2.5}\n'
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LeaklabError, match="not valid JSON"):
        read_json(tmp_path / "bad.json")
    with pytest.raises(LeaklabError, match="missing"):
        read_json(tmp_path / "none.json")


def test_read_config_yaml(tmp_path):
    (tmp_path / "c.yaml").write_text("objective: l1\niterations: 3\n")
    assert read_config(tmp_path / "c.yaml") == {"objective": "l1", "iterations": 3}
    # YAML 1.1 (PyYAML's) read numbers with an exponent but no dot or no sign as text, refused as no number
    (tmp_path / "e.yaml").write_text("lr: 1e-3\nmc_radius: 1.0e2\nobjective: l2e5\n")
    assert read_config(tmp_path / "e.yaml") == {"lr": 0.001, "mc_radius": 100.0, "objective": "l2e5"}
    # whole numbers as YAML 1.2 too: 1.1 read 010 as 8 and 1:05 as 65 (base 60), and the attack ran with them
    (tmp_path / "i.yaml").write_text("iterations: 010\nseed: 1:05\nrestarts: 0x2\nwidth: 0o10\nb: 0b11\nn: -3\n"
                                     "steps: 1_000\nlr: 1:05.5\nmc_radius: 1_000.5\nx: .5\ny: 10_\nz: ._\n")
    assert read_config(tmp_path / "i.yaml") == {"iterations": 10, "seed": "1:05", "restarts": 2, "width": 8,
                                               "b": "0b11", "n": -3, "steps": 1000, "lr": "1:05.5",
                                               "mc_radius": 1000.5, "x": 0.5, "y": "10_", "z": "._"}
    (tmp_path / "d.yaml").write_text("- a\n- b\n")
    with pytest.raises(LeaklabError, match="mapping"):
        read_config(tmp_path / "d.yaml")


# ---------------------------------------------------------------------------- atomic folders

def test_atomic_dir_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:
            (tmp / "results.json").write_text("{}")
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def _results(folder: Path, fmt: str, **more) -> None:
    (folder / "results.json").write_text(json.dumps({"format": fmt, **more}))


def test_an_out_that_cannot_be_moved_is_one_error_before_any_work(tmp_path, monkeypatch):
    """A mount point or an immutable folder as --out: the rename failed with a traceback after the whole
    command had run, and left `.out.XXXX.old/` beside it."""
    import os

    out = tmp_path / "out"
    with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:
        _results(tmp, ROOM_ATTACK_FORMAT)
    real = os.replace

    def busy(src, dst):
        if Path(src) == out.absolute():
            raise OSError(16, "Device or resource busy")
        return real(src, dst)

    monkeypatch.setattr("leaklab.io.os.replace", busy)
    ran = []
    with pytest.raises(LeaklabError, match="cannot be replaced \\(Device or resource busy\\)"):
        with atomic_dir(out, ROOM_ATTACK_FORMAT):
            ran.append(True)
    assert not ran and sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "results.json").exists()


def test_atomic_dir_replaces_only_the_same_commands_output(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:
        _results(tmp, ROOM_ATTACK_FORMAT)
    assert (out / "results.json").exists()
    with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:  # its own earlier output: replaced
        _results(tmp, ROOM_ATTACK_FORMAT, second=1)
    assert json.loads((out / "results.json").read_text())["second"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # another command's output is not replaced: a mistyped --out must not delete an audit
    with pytest.raises(LeaklabError, match="another command's output \\(of `leaklab attack qgi\\|rgi`\\)"):
        with atomic_dir(out, AUDIT_FORMAT):
            pass
    case = tmp_path / "case"  # a case folder, an image model's (leaklab capture) or a room's (leaklab env capture)
    case.mkdir()
    (case / VIEW_FILE).write_text(json.dumps({"format": VIEW_FORMAT}))
    with pytest.raises(LeaklabError, match="\\(of `leaklab capture\\|env capture`\\)"):
        check_out(case, ROOM_ATTACK_FORMAT)
    assert json.loads((out / "results.json").read_text())["second"] == 1

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(LeaklabError, match="leaklab did not write; choose a new folder"):
        with atomic_dir(mine, ROOM_ATTACK_FORMAT):
            pass
    # a file named like leaklab's marker does not make a folder leaklab's
    for text in ("{}", '{"format": "mine"}', "[1]", "not json", '{"format": "leaklab.room_attack"'):
        (mine / "results.json").write_text(text)
        with pytest.raises(LeaklabError, match="leaklab did not write"):
            check_out(mine, ROOM_ATTACK_FORMAT)
    assert (mine / "thesis.tex").read_text() == "precious"
    # a reproduction stopped after some cells is resumable output, of that reproduction only
    interrupted = tmp_path / "table"
    (interrupted / "cells").mkdir(parents=True)  # stopped before its first cell: nothing to lose
    assert check_out(interrupted, REPRODUCTION_FORMAT) == interrupted
    (interrupted / "cells" / ".leaklab-resume").mkdir()  # the first cell's finished attacks
    assert check_out(interrupted, REPRODUCTION_FORMAT) == interrupted
    (interrupted / "cells" / "qgi-S2").mkdir()
    with pytest.raises(LeaklabError, match="leaklab did not write"):  # a folder that is no finished cell
        check_out(interrupted, REPRODUCTION_FORMAT)
    _results(interrupted / "cells" / "qgi-S2", ROOM_ATTACK_FORMAT)
    assert check_out(interrupted, REPRODUCTION_FORMAT) == interrupted
    for other in (ROOM_ATTACK_FORMAT, BAYES_TABLE2_FORMAT):  # not the Bayes table's, nor an attack's
        with pytest.raises(LeaklabError, match="another command's output"):
            check_out(interrupted, other)
    bayes = tmp_path / "bayes"
    (bayes / "cells").mkdir(parents=True)
    (bayes / "cells" / "digits-gaussian-0-bayes.tune.jsonl").write_text("")  # the Bayes table's journal
    assert check_out(bayes, BAYES_TABLE2_FORMAT) == bayes
    with pytest.raises(LeaklabError, match="another command's output"):
        check_out(bayes, REPRODUCTION_FORMAT)
    # a user's folder with an empty cells/ (or one holding other files) is not a reproduction's
    (mine / "cells").mkdir()
    with pytest.raises(LeaklabError, match="leaklab did not write"):
        check_out(mine, REPRODUCTION_FORMAT)
    (mine / "cells" / ".gitkeep").write_text("")
    with pytest.raises(LeaklabError, match="leaklab did not write"):
        check_out(mine, REPRODUCTION_FORMAT)
    (mine / "results.json").write_text("[" * 100_000 + "]" * 100_000)  # too deep to parse: not leaklab's
    with pytest.raises(LeaklabError, match="leaklab did not write"):
        check_out(mine, ROOM_ATTACK_FORMAT)


def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run(tmp_path):
    """A run killed outright (SIGKILL, the OOM killer) left its temporary folder beside --out for good; one of a
    live process stays, and so does one named in another scope (another machine's or container's process ids)."""
    import os
    import subprocess
    import sys

    from leaklab.processes import process_scope

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    orphan = tmp_path / f".out.{process_scope()}.{dead}.abc.partial"
    live = tmp_path / f".out.{process_scope()}.{os.getpid()}.def.partial"
    elsewhere = tmp_path / f".out.0.1.{dead}.ghi.partial"
    for folder in (orphan, live, elsewhere):
        (folder / "cells").mkdir(parents=True)
    with atomic_dir(tmp_path / "out", ROOM_ATTACK_FORMAT) as tmp:
        assert tmp.name.startswith(f".out.{process_scope()}.{os.getpid()}.")
        _results(tmp, ROOM_ATTACK_FORMAT)
    assert not orphan.exists() and live.exists() and elsewhere.exists()


def test_an_out_that_links_to_an_earlier_output_replaces_that_output(tmp_path):
    """A link was replaced by a folder of the new results, and its target kept the old ones."""
    with atomic_dir(tmp_path / "first", ROOM_ATTACK_FORMAT) as tmp:
        _results(tmp, ROOM_ATTACK_FORMAT)
    (tmp_path / "link").symlink_to(tmp_path / "first")
    with atomic_dir(tmp_path / "link", ROOM_ATTACK_FORMAT) as tmp:
        _results(tmp, ROOM_ATTACK_FORMAT)
        (tmp / "new.txt").write_text("new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "first" / "new.txt").read_text() == "new"


def test_a_rerun_never_deletes_what_leaklab_did_not_write_in_its_earlier_output(tmp_path):
    """A user's note or a nested run inside an earlier --out went with it when the command ran again there."""
    out = tmp_path / "out"
    with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:
        _results(tmp, ROOM_ATTACK_FORMAT)
        (tmp / "cells" / "a").mkdir(parents=True)
        (tmp / "cells" / "a" / "grid.png").write_bytes(b"x")
    assert json.loads((out / ENTRIES_FILE).read_text())["entries"] == ["cells", "cells/a", "cells/a/grid.png",
                                                                     "results.json"]
    for extra in (out / "notes.txt", out / "cells" / "a" / "mine.txt", out / "nested"):
        if extra.name == "nested":
            extra.mkdir()
        else:
            extra.write_text("precious")
        ran = []
        shown = extra.relative_to(out)
        with pytest.raises(LeaklabError, match=f"holds what leaklab did not write there \\({shown}\\)"):
            with atomic_dir(out, ROOM_ATTACK_FORMAT):
                ran.append(True)
        assert not ran and extra.exists() and (out / "results.json").exists()
        extra.rmdir() if extra.is_dir() else extra.unlink()
    with atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:  # nothing but its own: replaced
        _results(tmp, ROOM_ATTACK_FORMAT, second=1)
    assert sorted(p.name for p in out.iterdir()) == [ENTRIES_FILE, "results.json"]
    # an earlier output that lists nothing (edited, or written before the list) is refused, not replaced
    (out / ENTRIES_FILE).unlink()
    with pytest.raises(LeaklabError, match="does not list what it holds"):
        check_out(out, ROOM_ATTACK_FORMAT)


def test_an_out_that_cannot_be_created_is_one_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile" / "sub", tmp_path / "afile" / "sub" / "deeper"):
        with pytest.raises(LeaklabError, match="cannot create the folder .*afile is a file"):
            with atomic_dir(out, ROOM_ATTACK_FORMAT):
                pass
    with pytest.raises(LeaklabError, match="is a file"):
        check_out(tmp_path / "afile", ROOM_ATTACK_FORMAT)
    with pytest.raises(LeaklabError, match="cannot create the folder .*afile is a file"):
        make_out_dir(tmp_path / "afile" / "sub")  # a command that writes in place (reproduce inversion-checks)


def test_new_run_dir_is_unique(tmp_path):
    a = new_run_dir("audit", tmp_path)
    a.mkdir()
    assert new_run_dir("audit", tmp_path) != a


# ---------------------------------------------------------------------------- case folders

def test_case_round_trip(case_dir, tiny_capture):
    names = sorted(p.name for p in case_dir.iterdir())
    assert names == ["model.safetensors", "truth.safetensors", "update.json", "update.safetensors",
                     "view.json"]
    case = load_case(case_dir)
    assert len(case.updates) == 2
    assert case.view.spec == tiny_capture.spec
    assert case.view.defense == "gaussian:0.01"
    for got, sent in zip(case.updates, tiny_capture.updates):
        assert got.tensors.keys() == sent.tensors.keys()
        assert all(torch.equal(got.tensors[k], sent.tensors[k]) for k in got.tensors)
    assert case.labels == [None, None]  # labels are not granted by default
    images, labels, provenance = load_truth(case_dir, case)
    assert torch.equal(images, tiny_capture.images) and torch.equal(labels, tiny_capture.truth_labels)
    assert provenance["capture"]["model"] == "lenet"
    # what the defense left of each update: the cosine of the update sent with the client's true one
    from leaklab.fl import fedsgd_update
    from leaklab.metrics.vectors import update_cosine
    from leaklab.models import build_model

    clean = [fedsgd_update(build_model(tiny_capture.spec, seed=1), tiny_capture.images[i:i + 1],
                           tiny_capture.truth_labels[i:i + 1]) for i in range(2)]
    assert provenance["update_cosine"] == pytest.approx(
        [update_cosine(c.tensors, sent.tensors) for c, sent in zip(clean, tiny_capture.updates)], rel=1e-9)
    assert all(0 < k < 1 for k in provenance["update_cosine"])
    view = json.loads((case_dir / VIEW_FILE).read_text())
    assert "truth" not in json.dumps(view)


def test_known_labels_are_part_of_the_view(tmp_path):
    cap = capture(CaptureConfig(model="lenet", data="faces", num_images=2, batch_size=2, image_size=16,
                                knows_labels=True))
    write(cap, tmp_path / "c")
    case = load_case(tmp_path / "c")
    assert torch.equal(case.labels[0], cap.labels[0])
    assert torch.equal(case.view_for(0).labels, cap.labels[0])
    _edit_json(tmp_path / "c" / UPDATE_JSON, lambda d: d["updates"][0].update(labels=[True, 0]))
    with pytest.raises(LeaklabError, match="class indices"):  # a JSON true is not label 1
        load_case(tmp_path / "c")


def test_the_defense_the_server_reads_is_the_views(tmp_path, tiny_capture):

    from leaklab.cases import write_case
    from leaklab.threat import Capabilities

    cap = tiny_capture
    for knows, expected in ((True, "gaussian:0.01"), (False, None)):
        folder = tmp_path / f"c{knows}"
        write_case(folder, cap.spec, cap.state, cap.metadata, Capabilities(knows_defense=knows), cap.defense,
                   cap.updates, cap.labels)
        assert json.loads((folder / UPDATE_JSON).read_text())["defense"] == expected
        assert all(u.defense == expected for u in load_case(folder).updates)
        meta = json.loads((folder / UPDATE_JSON).read_text())
        meta["defense"] = "prune:0.9"  # update.json claims no chain of its own: since session 54 one is refused
        (folder / UPDATE_JSON).write_text(json.dumps(meta))
        with pytest.raises(LeaklabError, match="declares another defense"):
            load_case(folder)


def test_missing_truth_is_none(case_dir):
    case = load_case(case_dir)
    (case_dir / "truth.safetensors").rename(case_dir / "renamed.safetensors")
    (case_dir / "truth.safetensors").symlink_to("gone.safetensors")  # a broken link was taken for no truth: no scores
    with pytest.raises(LeaklabError, match="is a link to gone.safetensors, which does not exist"):
        load_truth(case_dir, case)
    (case_dir / "truth.safetensors").unlink()
    assert load_truth(case_dir, case) is None


@pytest.mark.parametrize("member", ["model.safetensors", "update.safetensors"])
def test_a_tensor_file_larger_than_its_network_fills_is_refused_unread(case_dir, member):
    """A sparse 1 GiB file (4 KB on disk) was read whole, 2.4 GB of memory, before its names were compared."""
    import struct

    header = json.dumps({"x": {"dtype": "F32", "shape": [1 << 28], "data_offsets": [0, 1 << 30]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(case_dir / member, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + (1 << 30))
    for name, key in (("view.json", "model_sha256"), ("update.json", "sha256")):
        data = json.loads((case_dir / name).read_text())
        data.pop(key, None)
        (case_dir / name).write_text(json.dumps(data))
    with pytest.raises(LeaklabError, match="holds 1,073,741,9.. bytes, more than the tensors it should hold fill"):
        load_case(case_dir)


def test_a_long_defense_chain_and_many_update_prefixes_are_refused_quickly(case_dir):
    """A chain of 20,000 steps took 80 s and 2 GB to attack; 20,000 prefixes took 40 s to compare pairwise."""
    from leaklab.fields import defense_steps

    with pytest.raises(LeaklabError, match="chain of 17 steps; leaklab applies at most 16"):
        defense_steps(",".join(["clip:1"] * 17))
    assert len(defense_steps(",".join(["clip:1"] * 16))) == 16
    upd = json.loads((case_dir / "update.json").read_text())
    upd["updates"] = [{**upd["updates"][0], "prefix": f"u{i}/"} for i in range(20_000)]
    upd["updates"][7]["prefix"] = "u1"  # starts u1/ and u10/ ...: two updates would share tensors
    upd["count"] = 20_000
    (case_dir / "update.json").write_text(json.dumps(upd))
    with pytest.raises(LeaklabError, match="two updates share tensors"):
        load_case(case_dir)


def test_shape_mismatch_is_refused(case_dir):
    def change(t):
        t["u0/fc.weight"] = torch.zeros(3, 3)
    _rewrite_update(case_dir, change)
    with pytest.raises(LeaklabError, match="shape"):
        load_case(case_dir)


def test_nan_and_inf_are_refused(case_dir):
    def change(t):
        t["u1/fc.bias"][0] = float("nan")
    _rewrite_update(case_dir, change)
    with pytest.raises(LeaklabError, match="NaN or Inf"):
        load_case(case_dir)


def test_missing_and_unexpected_tensors_are_refused(case_dir):
    def change(t):
        del t["u0/fc.bias"]
    _rewrite_update(case_dir, change)
    with pytest.raises(LeaklabError, match="missing"):
        load_case(case_dir)


def test_truncated_update_file_is_refused(case_dir):
    path = case_dir / UPDATE_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(LeaklabError, match="truncated or corrupt"):
        load_case(case_dir)


def test_bad_view_json_is_refused(case_dir):
    (case_dir / VIEW_FILE).write_text("{")
    with pytest.raises(LeaklabError, match="not valid JSON"):
        load_case(case_dir)
    (case_dir / VIEW_FILE).write_text(json.dumps({"format": "leaklab.view", "format_version": 1,
                                                   "model": {"name": "vgg"}}))
    with pytest.raises(LeaklabError, match="model"):
        load_case(case_dir)


def test_not_a_case_folder(tmp_path):
    with pytest.raises(LeaklabError, match="does not exist"):
        load_case(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LeaklabError, match="missing"):
        load_case(tmp_path / "empty")


# ---------------------------------------------------------------------------- hostile case folders

def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_out_through_dotdot_or_a_symlink_is_still_the_input(case_dir):
    dotted = case_dir.parent / "x" / ".." / case_dir.name
    (case_dir.parent / "x").mkdir()
    with pytest.raises(LeaklabError, match="would replace the input"):
        check_out(dotted, VIEW_FORMAT, inputs=[case_dir])
    link = case_dir.parent / "link"
    link.symlink_to(case_dir)
    with pytest.raises(LeaklabError, match="would replace the input"):
        check_out(case_dir, VIEW_FORMAT, inputs=[link])


@pytest.mark.parametrize("name", ["/dev/zero", "../case2/update.safetensors", "", "..", "upd\0ate.safetensors"])
def test_a_case_names_only_files_inside_its_folder(case_dir, name):
    _edit_json(case_dir / UPDATE_JSON, lambda d: d.update(tensor_file=name))
    with pytest.raises(LeaklabError, match="plain names inside the case folder"):
        load_case(case_dir)


def test_a_tensor_file_that_is_not_a_regular_file_is_refused(case_dir):
    import os

    (case_dir / UPDATE_FILE).unlink()
    os.mkfifo(case_dir / UPDATE_FILE)  # reading it would block forever
    with pytest.raises(LeaklabError, match="not a regular file"):
        load_case(case_dir)


@pytest.mark.parametrize("file, change, words", [
    (UPDATE_JSON, lambda d: d["metadata"].update(batch_size="1"), "batch_size"),
    (VIEW_FILE, lambda d: d["metadata"].update(batch_size=True), "batch_size"),
    (VIEW_FILE, lambda d: d["capabilities"].update(knows_labels="yes"), "knows_labels"),
    (UPDATE_JSON, lambda d: d.update(count=True), "'count'"),
    (UPDATE_JSON, lambda d: d["updates"][0].update(labels=[99]), "labels the view does not grant")])
def test_case_json_values_are_not_coerced(case_dir, file, change, words):
    """"1", true and "yes" were taken as 1, 1 and True; labels the view does not grant were dropped unread."""
    _edit_json(case_dir / file, change)
    with pytest.raises(LeaklabError, match=words):
        load_case(case_dir)


@pytest.mark.parametrize("name", [UPDATE_JSON, "view.json"])
def test_a_json_file_that_is_not_a_regular_file_is_refused(case_dir, name):
    """A FIFO made the loader hang, a link to /dev/zero filled the memory."""
    import os

    (case_dir / name).unlink()
    os.mkfifo(case_dir / name)
    with pytest.raises(LeaklabError, match="not a regular file"):
        load_case(case_dir)
    (case_dir / name).unlink()
    (case_dir / name).symlink_to("/dev/zero")
    with pytest.raises(LeaklabError, match="outside the case folder"):
        load_case(case_dir)


def test_a_case_file_may_be_a_link_inside_its_folder_only(case_dir, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (case_dir / UPDATE_FILE).rename(outside)
    (case_dir / UPDATE_FILE).symlink_to(outside)
    with pytest.raises(LeaklabError, match="update.safetensors is a link to a file outside the case folder"):
        load_case(case_dir)
    (case_dir / UPDATE_FILE).unlink()
    outside.rename(case_dir / "kept.safetensors")
    (case_dir / UPDATE_FILE).symlink_to("kept.safetensors")
    assert load_case(case_dir).updates


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": [Infinity]}', '{"a": 1e999}', "[" * 100_000 + "]" * 100_000,
                                  '{"a": ' + "9" * 5000 + "}"])
def test_json_with_non_finite_numbers_or_deep_nesting_is_refused(tmp_path, text):
    (tmp_path / "f.json").write_text(text)
    with pytest.raises(LeaklabError, match="non-finite|nests too deeply|not a leaklab file"):
        read_json(tmp_path / "f.json")


def test_a_yaml_config_with_infinity_is_refused(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: .inf\n")
    with pytest.raises(LeaklabError, match="non-finite") as info:
        read_config(tmp_path / "c.yaml")
    assert "is not a configuration" not in str(info.value)  # said once, not wrapped in itself


ALIAS_BOMB = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(  # 6 lines of 10⁶ values (each more: ×10)
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 6))


@pytest.mark.parametrize("text, words", [
    ("lr: [1, 2\n", "not valid YAML"), ("[" * 5000 + "]" * 5000, "nests too deeply"), (b"lr: \xff\n", "cannot be read"),
    ("iterations: " + "9" * 5000 + "\n", "digits"), (ALIAS_BOMB, "aliases"), (None, "not a regular file")])
def test_a_broken_yaml_config_is_one_error(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    if text is None:
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(LeaklabError, match=words):
        read_config(path)
    with pytest.raises(LeaklabError, match="missing"):
        read_config(tmp_path / "none.yml")
    (tmp_path / "anchored.yaml").write_text("objective: &o l1\n")  # an anchor alone is plain YAML
    assert read_config(tmp_path / "anchored.yaml") == {"objective": "l1"}


def test_tensor_file_metadata_reads_the_header_alone_and_refuses_what_is_no_safetensors(tmp_path):
    path = tmp_path / "x.safetensors"
    save_tensors(path, {"a": torch.zeros(4)}, {"run": "r1"})
    assert tensor_file_metadata(path) == {"run": "r1"}
    for data in (b"\x05\x00", (2**40).to_bytes(8, "little") + b"{}", (4).to_bytes(8, "little") + b"\xff\xfe{}"):
        path.write_bytes(data)
        with pytest.raises(ValueError, match="no safetensors file"):
            tensor_file_metadata(path)


@pytest.mark.parametrize("version", [True, 0, -3, "1"])
def test_format_version_must_be_a_whole_number_from_one(case_dir, version):
    _edit_json(case_dir / VIEW_FILE, lambda d: d.update(format_version=version))
    with pytest.raises(LeaklabError, match="format version"):
        load_case(case_dir)


@pytest.mark.parametrize("name, edit", [
    (VIEW_FILE, lambda d: d.update(defence=d.pop("defense"))),
    (UPDATE_JSON, lambda d: d.update(tensorfile=d.pop("tensor_file"))),
    (UPDATE_JSON, lambda d: d["updates"][0].update(label=None))])
def test_a_misspelt_key_in_a_case_file_is_refused_not_read_as_absent(case_dir, name, edit):
    load_case(case_dir)  # the unedited case loads
    _edit_json(case_dir / name, edit)
    with pytest.raises(LeaklabError, match="unknown key"):
        load_case(case_dir)


def test_an_update_file_naming_another_defense_than_its_view_is_refused(case_dir):
    """formats.md: update.json repeats the view's defense; a view naming noise over an update naming none was
    taken (attacked as defended, the truth's cosine 1)."""
    _edit_json(case_dir / UPDATE_JSON, lambda d: d.update(defense="gaussian:0.5"))
    with pytest.raises(LeaklabError, match="declares another defense than"):
        load_case(case_dir)


def test_updates_that_share_tensors_or_a_wrong_count_are_refused(case_dir):
    _edit_json(case_dir / UPDATE_JSON, lambda d: d.update(updates=d["updates"] + d["updates"][:1]))
    with pytest.raises(LeaklabError, match="count"):
        load_case(case_dir)
    _edit_json(case_dir / UPDATE_JSON, lambda d: d.update(count=len(d["updates"])))
    with pytest.raises(LeaklabError, match="share tensors"):
        load_case(case_dir)


def test_truth_with_a_bad_provenance_or_out_of_range_values_is_refused(case_dir, tiny_capture):
    case = load_case(case_dir)
    images, labels, _ = load_truth(case_dir, case)
    for tensors, provenance, match in (
            ({"images": images, "labels": labels}, "[1, 2]", "not a JSON object"),
            ({"images": images * 255, "labels": labels}, "{}", r"outside \[0, 1\]"),
            ({"images": images, "labels": labels + 1000}, "{}", "labels outside"),
            ({"images": images, "labels": labels.float()}, "{}", "int64 labels"),
            # float8 images and unsigned labels passed this test and had no isfinite/min: a traceback
            ({"images": images.to(torch.float8_e4m3fn), "labels": labels}, "{}", "float8_e4m3fn"),
            ({"images": images, "labels": labels.to(torch.uint32)}, "{}", "uint32"),
            # a tensor besides the two was left unread (a room case's truth refused one)
            ({"images": images, "labels": labels, "lables": labels}, "{}", "alone .holds also 'lables'"),
            ({"images": images, "labels": labels}, '{"update_cosine": [0.5]}', "must list 2 number"),
            ({"images": images, "labels": labels}, '{"update_cosine": [0.5, 2]}', r"in \[-1, 1\]"),
            ({"images": images, "labels": labels}, '{"x": ' + "9" * 5000 + "}", "not valid JSON")):
        save_tensors(case_dir / "truth.safetensors", tensors, {"format": "leaklab.truth", "provenance": provenance})
        with pytest.raises(LeaklabError, match=match):
            load_truth(case_dir, case)


def test_an_out_link_to_nothing_and_links_that_loop_are_one_line_errors(tmp_path):
    """A link to a folder not yet there was taken for no --out: the run went to its end and lost its output in
    a traceback; a link that loops raised Python's RuntimeError wherever it was resolved."""
    from leaklab.cases import member_file
    from leaklab.io import check_out

    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name in ("dangling", "loop"):
        with pytest.raises(LeaklabError, match="does not exist"):
            check_out(tmp_path / name, AUDIT_FORMAT)
    with pytest.raises(LeaklabError, match="loops"):
        check_out(tmp_path / "out", AUDIT_FORMAT, inputs=[tmp_path / "loop"])
    with pytest.raises(LeaklabError, match="loops"):
        member_file(tmp_path, "loop", "x", tmp_path)


def test_an_image_case_with_an_rl_loss_is_refused(case_dir):
    def rl(d):
        d["metadata"]["loss"] = "dqn_mse"
    _edit_json(case_dir / VIEW_FILE, rl)
    _edit_json(case_dir / UPDATE_JSON, rl)
    with pytest.raises(LeaklabError, match="cross-entropy"):
        load_case(case_dir)


def test_huge_architectures_are_refused_before_building(case_dir):
    _edit_json(case_dir / VIEW_FILE, lambda d: d["model"].update(num_classes=10 ** 8))
    with pytest.raises(LeaklabError, match="num_classes"):
        load_case(case_dir)


def test_a_case_whose_images_are_too_many_values_to_reconstruct_is_refused(tmp_path):
    """A tiny model file cannot ask the attack for gigabytes: 256 images of 16×512² are 1.07 billion values."""
    from leaklab.cases import write_case
    from leaklab.models import ModelSpec, build_model
    from leaklab.threat import Capabilities, ClientUpdate, UpdateMetadata

    def case(batch, size, channels):
        spec = ModelSpec(name="convnet", num_classes=2, in_channels=channels, image_size=size, width=1,
                         mean=(0.5,) * channels, std=(0.5,) * channels)
        model = build_model(spec, seed=0)
        metadata = UpdateMetadata(batch_size=batch)
        update = ClientUpdate(metadata=metadata, tensors={n: torch.zeros_like(p) for n, p in model.named_parameters()})
        folder = tmp_path / f"case-{batch}-{size}-{channels}"
        write_case(folder, spec, model.state_dict(), metadata, Capabilities(), None, [update],
                   [torch.zeros(batch, dtype=torch.long)])
        return folder

    with pytest.raises(LeaklabError, match="1,073,741,824 values to reconstruct"):
        load_case(case(256, 512, 16))
    assert load_case(case(256, 224, 3)).updates  # ImageNet-sized photos in a batch of 256 still are


def test_the_same_tensors_and_metadata_give_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes the metadata in a hash map's order, which changes with the process: a rerun's truth
    file differed from the first run's (its tensors equal) until leaklab wrote the header's keys sorted."""
    import subprocess
    import sys

    code = ("import sys, torch; from pathlib import Path; from leaklab.io import load_tensors, save_tensors; "
            "save_tensors(Path(sys.argv[1]), {'b': torch.arange(3.0), 'a': torch.ones(2, dtype=torch.float64)}, "
            "{k: k.upper() for k in 'zyxwvu'})")
    files = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for path in files:
        subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    assert len({path.read_bytes() for path in files}) == 1
    from safetensors import safe_open

    with safe_open(str(files[0]), "pt") as f:  # still a safetensors file, its metadata whole
        assert f.metadata() == {k: k.upper() for k in "zyxwvu"} and f.get_tensor("a").dtype == torch.float64


def test_an_error_line_cuts_a_long_value():
    """A 2 MB value in a case file was printed whole in its one-line error."""
    from typing import Literal

    from pydantic import BaseModel, ValidationError

    from leaklab.errors import validation_message

    class Choice(BaseModel):
        objective: Literal["l2", "l1"]

    with pytest.raises(ValidationError) as caught:
        Choice(objective="x" * 2_000_000)
    line = validation_message(caught.value, "cfg")
    assert len(line) < 200 and "(2,000,000 characters)" in line
    with pytest.raises(ValidationError) as caught:
        Choice(objective="bad")
    assert validation_message(caught.value, "cfg") == "cfg: invalid field 'objective' (got 'bad'): Input should be " \
        "'l2' or 'l1'"


def test_formats_md_names_every_output_an_out_may_hold_and_each_has_a_section():
    """docs/formats.md's list of the outputs an --out may be replaced with names every command's `format`,
    and each has a section of its own, so that a new command cannot go undocumented."""
    from leaklab import io

    doc = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text(encoding="utf-8")
    listed = doc[doc.index("names the command by its `format`"):doc.index("or, for a\nreproduction")]
    for fmt, command in io._WRITTEN_BY.items():
        assert f"`{fmt}`" in listed, fmt
        assert f"`{command.split('|')[0]}" in doc, command
