"""Seed 000's tables on our ViZDoom rooms: ``leaklab reproduce room-table1`` and ``room-table2``.

* Table I: QGI and RGI in settings S1 (RGB + depth + box) and S2 (depth + box), PSNR/SSIM of the
  images, with the vector metrics (box IoU, action accuracy, Q-value and reward errors) the text of
  section V-A reports. Run in ``paper`` mode (section IV as written) or ``exact`` mode.
* Table II and Fig. 4: the ablations of section V-C on QGI S1 in paper mode -- gradient-matching
  objectives (DLG-style MSE on the true objective with the action optimised or rule-based,
  Inverting-Gradients-style cosine on the true objective, the error direction of QGI), joint versus
  separate multimodal optimisation -- and, beside them, leaklab's exact mode.

Every cell is one :func:`leaklab.experiments.room_attack.run` written to ``OUT/cells/NAME``; a rerun
skips finished cells that ran the same computation on the same network architecture
(:func:`_same_cell`) and takes an interrupted cell's finished samples from
``OUT/cells/.leaklab-resume`` (:mod:`.attack_journal`). ``OUT/results.json`` holds the table with the
published numbers beside ours and ``OUT/table.md`` the same as Markdown; Table II also draws Fig. 4
(``OUT/fig4.png``). ``update_docs`` puts that Markdown into the marked section of ``docs/reproductions.md``.

The published numbers are seed 000's on AI2-THOR (240 samples, 120 layouts, 2x10^4 iterations); ours
are on ViZDoom rooms with the sample and iteration budget given, so they compare the methods, not the
simulators.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.attacks.rl.config import EXACT_ONLY, METHOD_VERSION
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn, room_attack
from leaklab.io import CELLS_DIR, REPRODUCTION_FORMAT, RESULTS_FILE, check_out, read_json, write_bytes, write_json
from leaklab.models.perception import architecture_digest
from leaklab.names import DEFAULT_ARCH, TABLE1_CELLS
from leaklab.words import plural


# Table I of seed 000, "average" column, mean and standard deviation (the Markdown shows the means); the
# vector metrics are the text of section V-A.
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "qgi-S1": {"rgb_psnr_mean": 21.02, "rgb_ssim_mean": 0.729, "depth_psnr_mean": 23.18,
               "depth_ssim_mean": 0.807, "rgb_psnr_std": 5.86, "rgb_ssim_std": 0.157,
               "depth_psnr_std": 8.17, "depth_ssim_std": 0.195},
    "qgi-S2": {"depth_psnr_mean": 26.46, "depth_ssim_mean": 0.910, "depth_psnr_std": 7.68,
               "depth_ssim_std": 0.123},
    "rgi-S1": {"rgb_psnr_mean": 17.12, "rgb_ssim_mean": 0.544, "depth_psnr_mean": 18.58,
               "depth_ssim_mean": 0.581, "rgb_psnr_std": 5.35, "rgb_ssim_std": 0.176,
               "depth_psnr_std": 5.94, "depth_ssim_std": 0.166},
    "rgi-S2": {"depth_psnr_mean": 37.21, "depth_ssim_mean": 0.964, "depth_psnr_std": 4.84,
               "depth_ssim_std": 0.022},
}
PAPER_VECTORS = "box IoU > 0.9 (mean), action 100%, Q errors < 1.1% (mean), reward error < 1e-6 (mean)"

# Table II of seed 000 (QGI): IoU, eps(Q_pred) %, eps(Q_target) %.
PAPER_TABLE2: dict[str, dict[str, float]] = {
    "dlg-opt": {"iou_mean": 0.649, "q_pred_err_mean": 1083.64, "q_target_err_mean": 89.85},
    "dlg-rule": {"iou_mean": 0.610, "q_pred_err_mean": 1112.33, "q_target_err_mean": 92.44},
    "inverting": {"iou_mean": 0.216, "q_pred_err_mean": 15751.95, "q_target_err_mean": 198.83},
    "error-direction": {"iou_mean": 0.912, "q_pred_err_mean": 1.03, "q_target_err_mean": 0.67},
}
# name -> (algorithm, setting, attack fields, description)
TABLE2_CELLS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "dlg-opt": ("qgi", "S1", {"mode": "paper", "objective": "dlg", "action": "optimised"},
                "DLG objective J, action and target Q optimised, MSE"),
    "dlg-rule": ("qgi", "S1", {"mode": "paper", "objective": "dlg", "action": "rule"},
                 "DLG objective J, action by rule, target Q optimised, MSE"),
    "inverting": ("qgi", "S1", {"mode": "paper", "objective": "inverting", "action": "rule"},
                  "Inverting-Gradients objective J, action by rule, target Q optimised, cosine"),
    "error-direction": ("qgi", "S1", {"mode": "paper"}, "QGI: error direction, rules, cosine (paper mode)"),
    "joint": ("qgi", "S1", {"mode": "paper", "multimodal": "joint"},
              "QGI with joint image + box optimisation (Fig. 4 'joint')"),
    "exact": ("qgi", "S1", {"mode": "exact"}, "leaklab's exact mode"),
}
METRICS_TABLE1 = ("rgb_psnr_mean", "rgb_ssim_mean", "depth_psnr_mean", "depth_ssim_mean")
VECTORS = ("iou_mean", "iou_min", "action_accuracy", "q_pred_err_mean", "q_target_err_mean",
           "reward_abs_err_mean")
DOCS = Path("docs/reproductions.md")
FIG4_FILE = "fig4.png"
# Fig. 4 of seed 000: joint against separate optimisation (QGI), exact mode beside; panel -> sample metric
FIG4_SERIES = {"joint": "joint", "error-direction": "separate (QGI)", "exact": "exact mode"}
FIG4_PANELS = {"RGB PSNR (dB)": "rgb_paper_psnr", "RGB SSIM": "rgb_paper_ssim",
               "depth PSNR (dB)": "depth_paper_psnr", "depth SSIM": "depth_paper_ssim",
               "box IoU": "box_iou", "ε(Q̂) %": "q_pred_error", "ε(Q) %": "q_target_error"}


def _cell_config(algorithm: str, setting: str, attack: dict[str, Any], samples: int,
                 layouts: tuple[str, ...] | None, iterations: int | None, arch: str, seed: int,
                 workers: int, device: str) -> room_attack.RoomRunConfig:
    fields = dict(attack, seed=seed)
    if iterations is not None:
        fields["iterations"] = iterations
    return room_attack.RoomRunConfig(algorithm=algorithm, setting=setting, arch=arch, samples=samples,
                                     layouts=layouts, attack=RoomAttackConfig(**fields), workers=workers,
                                     device=device, seed=seed)


def _same_cell(saved: Any, config: room_attack.RoomRunConfig) -> bool:
    """Whether saved cell results ran ``config`` on the same network architecture (results written
    before leaklab recorded it never count) with the same method
    (:data:`~leaklab.attacks.rl.config.METHOD_VERSION`); the worker count does not change a cell's numbers, nor do
    exact-mode settings a paper-mode cell's."""
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        return False

    def computation(run: dict[str, Any]) -> dict[str, Any]:
        attack = run.get("attack")
        if isinstance(attack, dict) and attack.get("mode") == "paper":
            run = {**run, "attack": {k: v for k, v in attack.items() if k not in EXACT_ONLY}}
        return {k: v for k, v in run.items() if k != "workers"}

    return (saved.get("network") == architecture_digest(config.spec)
            and saved.get("method_version", 1) == METHOD_VERSION[config.attack.mode]
            and computation(saved["config"]) == computation(config.model_dump(mode="json")))


def _intact(saved: dict[str, Any], config: room_attack.RoomRunConfig) -> bool:
    """Whether a saved cell's summary is the one its samples give (:func:`room_attack.summarise`): an edited or
    truncated ``results.json`` (a summary missing: a KeyError's traceback; ``layouts: "x"``: printed in the table)
    is run again."""
    summary, rows = saved.get("summary"), saved.get("samples")
    if not isinstance(summary, dict) or not isinstance(rows, list) or len(rows) != config.samples:
        return False
    try:
        fresh = room_attack.summarise(rows, 0.0)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, statistics.StatisticsError):
        return False
    timing = {"seconds_per_sample", "wall_seconds", "resumed_samples"}
    return {k: v for k, v in fresh.items() if k not in timing} == {k: v for k, v in summary.items() if k not in timing}


def _run_cells(out: Path, experiment: str, names: tuple[str, ...], cells: dict[str, room_attack.RoomRunConfig],
               progress: ProgressFn | None) -> dict[str, dict[str, Any]]:
    """Run (or take again, :func:`_same_cell`) the ``cells`` of ``experiment``, whose cells are ``names``."""
    # before any work: a user's file or folder is refused, an earlier run's cells resumed, another table's
    # output refused (its results and figure would have stayed beside this one's); the hidden entries are a stopped
    # cell's, its resume journal and its partial folder
    check_out(out, REPRODUCTION_FORMAT)
    earlier = out / RESULTS_FILE
    data = read_json(earlier, "room-table results") if earlier.is_file() else None
    held = data.get("experiment") if isinstance(data, dict) else None
    others = sorted(p.name for p in (out / CELLS_DIR).iterdir()
                    if p.name not in names and not p.name.startswith(".")) if (out / CELLS_DIR).is_dir() else []
    if (held is not None and held != experiment) or others:
        raise LeaklabError(f"--out {out} holds another reproduction's output ({held or 'cells ' + ', '.join(others)}); "
                           "choose a new folder or remove that one first")
    results = {}
    for i, (name, config) in enumerate(cells.items()):
        folder = out / CELLS_DIR / name
        done = folder / RESULTS_FILE
        if done.exists():
            previous = read_json(done, "room-table cell")
            if _same_cell(previous, config) and _intact(previous, config):
                results[name] = previous
                continue
        results[name] = room_attack.run(config, folder, progress=_labelled(progress, f"cell {i + 1}/{len(cells)} "
                                                                                     f"{name}"))
    return results


def _labelled(progress: ProgressFn | None, label: str) -> ProgressFn | None:
    """``progress`` with each task named after its cell (the cells' tasks share names: every row's ``qgi S1``)."""
    if progress is None:
        return None
    return lambda task, done, total: progress(f"{task} ({label})", done, total)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def table1(out: Path, mode: str = "paper", samples: int = 48, layouts: tuple[str, ...] | None = None,
           iterations: int | None = None, arch: str = DEFAULT_ARCH, seed: int = 0, workers: int = 0,
           device: str = "cpu", cells: tuple[str, ...] = TABLE1_CELLS,
           progress: ProgressFn | None = None) -> dict[str, Any]:
    """Table I (and the vector metrics of V-A) in ``mode`` for ``cells`` (``qgi-S1`` ...; default
    all four); returns and writes the results."""
    if mode not in ("paper", "exact"):
        raise LeaklabError(f"--mode {mode!r}: choose paper or exact")
    unknown = [c for c in cells if c not in TABLE1_CELLS]
    if unknown or not cells:
        raise LeaklabError(f"--cells: {', '.join(unknown) or 'none given'}; choose from {', '.join(TABLE1_CELLS)}")
    cells = {name: _cell_config(name.split("-")[0], name.split("-")[1], {"mode": mode}, samples, layouts,
                                iterations, arch, seed, workers, device) for name in cells}
    results = _run_cells(Path(out), "room-table1", TABLE1_CELLS, cells, progress)
    table = {name: {k: r["summary"].get(k) for k in METRICS_TABLE1 + VECTORS +
                    ("rgb_psnr_baseline_mean", "depth_psnr_baseline_mean", "rgb_psnr_raw_mean",
                     "depth_psnr_raw_mean", "iterations", "seconds_per_sample", "samples", "layouts",
                     "action_accuracy_nonzero_return", "zero_return_samples", "stage1_restarted")
                    + tuple(room_attack.SPREAD_KEYS)}
             for name, r in results.items()}
    first = table[next(iter(cells))]
    lines = [f"Mode `{mode}`, `{arch}` network, {plural(samples, 'sample')} per cell, "
             f"{plural(first['layouts'], 'layout')}, {plural(first['iterations'], 'iteration')}. "
             "Ours (paper) for PSNR (dB) / SSIM with paper normalisation; baseline = "
             "constant image at the true mean; raw = without normalisation.", "",
             "| attack | setting | RGB PSNR | RGB SSIM | depth PSNR | depth SSIM | RGB baseline / raw | "
             "depth baseline / raw | box IoU mean (min) | action | ε(Q̂) % | ε(Q) % | reward error | s/sample |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in cells:
        t, p = table[name], PAPER_TABLE1[name]

        def both(key: str) -> str:
            ours = _fmt(t.get(key), 3 if "ssim" in key else 2)
            return f"{ours} ({_fmt(p[key], 3 if 'ssim' in key else 2)})" if key in p else ours

        lines.append(
            f"| {name[:3].upper()} | {name[4:]} | {both('rgb_psnr_mean')} | {both('rgb_ssim_mean')} | "
            f"{both('depth_psnr_mean')} | {both('depth_ssim_mean')} | "
            f"{_fmt(t.get('rgb_psnr_baseline_mean'))} / {_fmt(t.get('rgb_psnr_raw_mean'))} | "
            f"{_fmt(t.get('depth_psnr_baseline_mean'))} / {_fmt(t.get('depth_psnr_raw_mean'))} | "
            f"{_fmt(t.get('iou_mean'), 4)} ({_fmt(t.get('iou_min'), 4)}) | "
            f"{_action(t)} | {_fmt(t.get('q_pred_err_mean'))} | "
            f"{_fmt(t.get('q_target_err_mean'))} | {_fmt(t.get('reward_abs_err_mean'))} | "
            f"{_fmt(t.get('seconds_per_sample'), 1)} |")
    lines += ["", f"Published vector metrics (section V-A): {PAPER_VECTORS}."]
    lines += _restart_note(table)
    subset = "" if tuple(cells) == TABLE1_CELLS else "-" + "-".join(cells)
    return _finish(Path(out), "room-table1", mode, arch, table, PAPER_TABLE1, "\n".join(lines), subset)


def _restart_note(table: dict[str, dict[str, Any]]) -> list[str]:
    """The lines that say on how many samples of which cells paper mode's stage 1 started again."""
    restarted = [f"{name[:3].upper()} {name[4:]} {plural(t['stage1_restarted'], 'sample')}"
                 for name, t in table.items() if t.get("stage1_restarted")]
    if not restarted:
        return []
    return ["", "Stage 1 started again from a fresh draw (leaklab's addition: its match ended under a cosine "
                f"of 0.999) on {', '.join(restarted)}."]


def _action(t: dict[str, Any]) -> str:
    """Action accuracy; for RGI also over the updates with a non-zero return (a zero return leaves
    no trace of the action in the update)."""
    text = f"{_fmt(100 * t['action_accuracy'], 0)}%"
    if t.get("action_accuracy_nonzero_return") is not None:
        informative = t["samples"] - t["zero_return_samples"]
        text += f" ({_fmt(100 * t['action_accuracy_nonzero_return'], 0)}% of {plural(informative, 'non-zero return')})"
    return text


def table2_cells(samples: int, layouts: tuple[str, ...] | None, iterations: int | None, arch: str,
                 seed: int, workers: int, device: str) -> dict[str, room_attack.RoomRunConfig]:
    """Table II's cells. ``iterations`` counts the image-stage steps of the separate rows, which run
    stage 1's ``stage1_iterations`` before them; the joint row (Fig. 4) optimises box and images in
    one stage, so it gets their sum, the same number of steps."""
    cells = {name: _cell_config(alg, setting, attack, samples, layouts, iterations, arch, seed, workers,
                                device)
             for name, (alg, setting, attack, _) in TABLE2_CELLS.items()}
    joint = cells["joint"].attack
    total = joint.iterations + joint.stage1_iterations
    cells["joint"] = cells["joint"].model_copy(update={"attack": joint.model_copy(update={"iterations": total})})
    return cells


def table2(out: Path, samples: int = 48, layouts: tuple[str, ...] | None = None,
           iterations: int | None = None, arch: str = DEFAULT_ARCH, seed: int = 0, workers: int = 0,
           device: str = "cpu", progress: ProgressFn | None = None) -> dict[str, Any]:
    """Table II and Fig. 4 (QGI S1, paper mode) with the exact mode beside them."""
    cells = table2_cells(samples, layouts, iterations, arch, seed, workers, device)
    results = _run_cells(Path(out), "room-table2", tuple(TABLE2_CELLS), cells, progress)
    table = {name: {k: r["summary"].get(k) for k in METRICS_TABLE1 + VECTORS +
                    ("rgb_psnr_baseline_mean", "depth_psnr_baseline_mean", "iterations", "samples")}
             for name, r in results.items()}
    lines = [f"QGI, setting S1, `{arch}` network, {plural(samples, 'sample')} per row, "
             f"{table['error-direction']['iterations']} iterations. Ours (paper).", "",
             "| method | box IoU | ε(Q̂) % | ε(Q) % | action | RGB PSNR / SSIM | depth PSNR / SSIM |",
             "|---|---|---|---|---|---|---|"]
    for name, (_, _, _, description) in TABLE2_CELLS.items():
        t, p = table[name], PAPER_TABLE2.get(name, {})

        def both(key: str) -> str:
            ours = _fmt(t.get(key), 3)
            return f"{ours} ({_fmt(p[key], 3)})" if key in p else ours

        lines.append(f"| {description} | {both('iou_mean')} | {both('q_pred_err_mean')} | "
                     f"{both('q_target_err_mean')} | {_fmt(100 * t['action_accuracy'], 0)}% | "
                     f"{_fmt(t.get('rgb_psnr_mean'))} / {_fmt(t.get('rgb_ssim_mean'), 3)} | "
                     f"{_fmt(t.get('depth_psnr_mean'))} / {_fmt(t.get('depth_ssim_mean'), 3)} |")
    fig4(results, Path(out) / FIG4_FILE, samples)
    return _finish(Path(out), "room-table2", "paper", arch, table, PAPER_TABLE2, "\n".join(lines))


def fig4(results: dict[str, dict[str, Any]], path: Path, samples: int) -> bytes:
    """Fig. 4 of seed 000 (V-C): joint against separate multimodal optimisation in QGI, per metric the
    mean, ± one standard deviation and every sample (the paper reads the joint optimisation's
    instability off its spread), with leaklab's exact mode beside; the Q errors on a log scale."""
    from leaklab.report.plots import spread_panels

    panels = {label: {series: [row["metrics"].get(metric) for row in results[name]["samples"]]
                      for name, series in FIG4_SERIES.items()}
              for label, metric in FIG4_PANELS.items()}
    log = [label for label, metric in FIG4_PANELS.items() if metric.startswith("q_")]
    return spread_panels(panels, path, log=log,
                         title=f"Fig. 4: joint vs separate optimisation (QGI S1, {plural(samples, 'sample')})")


def _finish(out: Path, name: str, mode: str, arch: str, table: dict, paper: dict, markdown: str,
            subset: str = "") -> dict[str, Any]:
    results = {"format": REPRODUCTION_FORMAT, "format_version": 1, "experiment": name, "mode": mode, "arch": arch,
               "section": f"{name}-{mode}-{arch}{subset}", "table": table, "paper": paper, "markdown": markdown}
    write_json(out / RESULTS_FILE, results)
    write_bytes(out / "table.md", (markdown + "\n").encode("utf-8"))
    return results


def update_docs(name: str, markdown: str, command: str, docs: Path = DOCS) -> Path:
    """Put ``markdown`` (and the command that made it) between the ``<!-- NAME:start -->`` and
    ``<!-- NAME:end -->`` lines of ``docs``, or append the section when neither marker is there.
    Anything else (a lone marker, markers out of order or repeated, no docs file) is refused, so a
    run can never overwrite text outside its own section."""
    if not docs.is_file():
        raise LeaklabError(f"{docs} not found; run --update-docs from the repository root")
    text = docs.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = f"{start}\nCommand: `{command}`\n\n{markdown}\n{end}"
    starts, ends = text.count(start), text.count(end)
    if starts == ends == 0:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    elif starts == ends == 1 and text.index(start) < text.index(end):
        text = text[:text.index(start)] + body + text[text.index(end) + len(end):]
    else:
        raise LeaklabError(f"{docs}: the markers of section {name!r} are not one start before one end "
                           f"({starts} start, {ends} end); mend them by hand, then rerun")
    write_bytes(docs, text.encode("utf-8"))
    return docs
