"""`leaklab reproduce room-table1|room-table2`: the table's columns and notes, the docs section it
replaces, and which saved cells it takes again."""

from __future__ import annotations

import json

import pytest

from cli_helpers import ROOM_FAST, assert_user_error, invoke
from leaklab.errors import LeaklabError


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
                    *ROOM_FAST, "--out", out)
    assert result.exit_code == 0, result.output
    assert "understate what the updates leak" in result.stderr  # a short run's table said nothing of it
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
    # a run smaller than the published ones' protocol never replaces them (a 1-iteration, 1-room table did)
    for small in (["--samples", "1"], ["--layouts", "11"], ["--iterations", "299"]):
        smoke = invoke("reproduce", "room-table1", *small, "--update-docs", "--out", tmp_path / "s")
        assert_user_error(smoke, tmp_path / "s", "--update-docs replaces a published table")


def test_a_stopped_table_resumes_its_cell_from_the_journal(tmp_path):
    from cli_helpers import Interrupt, interrupt_after
    from leaklab.experiments import room_tables

    out, args = tmp_path / "t", dict(mode="exact", samples=2, iterations=2, workers=1, cells=("qgi-S2",))
    with pytest.raises(Interrupt):
        room_tables.table1(out, progress=interrupt_after(1), **args)
    assert [p.name for p in (out / "cells").iterdir()] == [".leaklab-resume"]  # the first sample's attack, kept
    tasks = set()
    room_tables.table1(out, progress=lambda task, done, total: tasks.add(task), **args)  # was refused: the
    # journal read as another reproduction's cell
    cell = json.loads((out / "cells" / "qgi-S2" / "results.json").read_text())
    assert cell["summary"]["resumed_samples"] == 1 and cell["summary"]["samples"] == 2
    assert tasks and all(t.endswith(" (cell 1/1 qgi-S2)") for t in tasks)  # every row's tasks were "qgi S1"
    # a finished cell is taken again, unless its summary is not what its samples give (a KeyError's traceback
    # where the summary was cut out; an edited "layouts" went into the table)
    done = out / "cells" / "qgi-S2" / "results.json"
    tasks.clear()
    room_tables.table1(out, progress=lambda task, done, total: tasks.add(task), **args)
    assert not tasks and json.loads(done.read_text()) == cell
    for edit in ({"summary": None}, {"summary": {**cell["summary"], "layouts": "x"}}):
        done.write_text(json.dumps({**cell, **edit}))
        table = room_tables.table1(out, progress=lambda task, done, total: tasks.add(task), **args)
        assert tasks and table["table"]["qgi-S2"]["layouts"] == cell["summary"]["layouts"]
        tasks.clear()


def saved_cell(config):
    """What ``room_attack.run`` writes about a cell's computation."""
    from leaklab.attacks.rl.config import METHOD_VERSION
    from leaklab.models.perception import architecture_digest
    return {"config": config.model_dump(mode="json"), "network": architecture_digest(config.spec),
            "method_version": METHOD_VERSION[config.attack.mode]}


def test_room_table2_runs_every_row_beside_the_papers_and_draws_fig4(tmp_path, monkeypatch):
    from leaklab.experiments import room_tables
    from leaklab.experiments.room_tables import PAPER_TABLE2, TABLE2_CELLS

    for name, (alg, setting, attack, words) in TABLE2_CELLS.items():  # stage 1 in seconds (the joint row too)
        monkeypatch.setitem(room_tables.TABLE2_CELLS, name, (alg, setting, {**attack, "stage1_iterations": 3}, words))
    out = tmp_path / "t2"
    result = invoke("reproduce", "room-table2", "--samples", "1", "--layouts", "1", "--arch", "small",
                    *ROOM_FAST, "--out", out)
    assert result.exit_code == 0, result.output
    res = json.loads((out / "results.json").read_text())
    assert res["experiment"] == "room-table2" and set(res["table"]) == set(TABLE2_CELLS)
    table = (out / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == [d for *_, d in TABLE2_CELLS.values()]
    for name, paper in PAPER_TABLE2.items():  # the paper's figures in brackets beside ours, on its own row
        row = rows[list(TABLE2_CELLS).index(name)]
        assert f"({paper['iou_mean']:.3f})" in row and f"({paper['q_target_err_mean']:.3f})" in row
    assert res["table"]["exact"]["iou_mean"] == 1.0  # exact mode reads the box in closed form
    assert (out / "fig4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Table I into Table II's folder: refused before any work (it merged, Fig. 4 and Table II's cells staying)
    before = sorted(p.name for p in (out / "cells").iterdir())
    assert_user_error(invoke("reproduce", "room-table1", "--mode", "exact", "--samples", "1", "--layouts", "1",
                             "--cells", "qgi-S2", *ROOM_FAST, "--out", out), None,
                      "holds another reproduction's output (room-table2)")
    assert sorted(p.name for p in (out / "cells").iterdir()) == before


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


def test_a_paper_mode_cell_whose_summary_is_its_samples_is_reused():
    """A paper-mode attack runs both stages (2,000 + its iterations): the check recomputed the summary with the
    image stage's iterations alone and ran every paper-mode cell again on every rerun."""
    from leaklab.attacks.rl import RoomAttackConfig
    from leaklab.experiments.room_attack import RoomRunConfig, summarise
    from leaklab.experiments.room_tables import _intact

    config = RoomRunConfig(samples=2, attack=RoomAttackConfig(mode="paper", iterations=2))
    rows = [{"batch_size": 1, "iterations": 2002, "layouts": [name], "metrics": {"action": 1.0}} for name in "ab"]
    saved = {**saved_cell(config), "samples": rows, "summary": {**summarise(rows, 3.0), "wall_seconds": 4.0}}
    assert _intact(json.loads(json.dumps(saved)), config)
    assert not _intact({**saved, "summary": {**saved["summary"], "iterations": 2}}, config)
    assert not _intact({**saved, "samples": rows[:1]}, config)


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
