"""The main job (``leaklab audit``, ``make audit``): how much do robots' federated RL updates leak
their rooms, and how much does a defense help? (seed 000, "Your Room is not Private").

Robots in private ViZDoom rooms train the multimodal perception network with DQN and with
REINFORCE and share single-sample FedSGD gradients. The server runs QGI and RGI
(:mod:`leaklab.attacks.rl`) on each update, undefended and behind each defense:

* Gaussian noise on every gradient entry at two scales (``gaussian:σ``);
* DP-SGD's step at two ε: the per-sample gradient clipped to L2 norm ``C`` plus N(0, (zC)²) on every
  entry, ``z`` the noise multiplier that makes this one release (ε, δ)-DP
  (:func:`leaklab.privacy.dpsgd.noise_multiplier_for`, δ = 1e-5).

It writes ``OUT/report.html`` (originals beside reconstructions, a metrics table with the
constant-image baselines, leakage versus defense strength), ``OUT/results.json`` (one
:mod:`leaklab.experiments.room_attack` summary per algorithm and defense, and the per-sample rows)
and the figures in ``OUT/figures/``. The defaults finish within about ten minutes on two CPU
cores; ``full=True`` is the paper-scale protocol (48 samples from every layout, S1 and S2, the exact
and the paper mode, hours); ``quick=True`` is a seconds-long version for tests. Finished attacks are
kept beside ``OUT`` until the audit ends (:mod:`.attack_journal`): the same command, rerun after an
interruption, attacks only what is left (with ``run_cases`` too).

``run_cases`` attacks a user's own saved updates instead: room case folders written by
:func:`leaklab.rl.capture.capture_rooms` (or in that format), of leaklab's perception network or of the
user's own network class (``model_class="module:Class"``, called with the spec, following the module
layout of :func:`leaklab.models.perception.check_contract`); they are scored when their
``truth.safetensors`` is present.
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from leaklab.attacks.rl import RoomAttackConfig, max_batch
from leaklab.device import DEVICE_PATTERN, describe, require_device, versions
from leaklab.errors import LeaklabError
from leaklab.experiments import ProgressFn, room_attack
from leaklab.experiments.attack_journal import journal_beside
from leaklab.fields import Seed, defense_steps
from leaklab.io import (AUDIT_FORMAT, CAPTURE_JSON, RESULTS_FILE, TRUTH_FILE, VIEW_FILE, atomic_dir, check_out,
                        read_json, write_json)
from leaklab.metrics.rooms import first_match
from leaklab.models.perception import ArchName
from leaklab.names import ROOM_ATTACK_NAMES, ROOM_MODE_NAMES, SETTING_NAMES
from leaklab.privacy.dpsgd import noise_multiplier_for
from leaklab.words import plural

REPORT_FILE = "report.html"
DP_DELTA = 1e-5
DP_CLIP = 1.0
IMAGE_LEAK_DB = 3.0  # verdict: images leak when their PSNR beats the no-information baseline by this
BOX_LEAK_IOU = 0.5  # verdict: the target's box leaks at this mean IoU (the usual detection threshold)
ACTION_LEAK = 0.5  # verdict: QGI's action leaks at this accuracy (chance: 1 in 7)
SHOWN_SAMPLES = 16  # the report pictures a cell's (or the cases') first samples; results.json has every row
Picture = tuple[torch.Tensor, torch.Tensor]  # a pictured state: its images [1, C, H, W] and the target's box [4]


def dpsgd_defense(epsilon: float, clip: float = DP_CLIP, delta: float = DP_DELTA) -> str:
    """The defense chain of one DP-SGD release at ``epsilon``: clip to ``clip``, Gaussian noise."""
    return f"clip:{clip:g},gaussian:{noise_multiplier_for(epsilon, delta) * clip:.6g}"


class AuditConfig(BaseModel):
    """What the audit attacks; the defaults are sized for about ten minutes on two CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    algorithms: tuple[Literal[ROOM_ATTACK_NAMES], ...] = ("qgi", "rgi")
    settings: tuple[Literal[SETTING_NAMES], ...] = ("S1", "S2")
    modes: tuple[Literal[ROOM_MODE_NAMES], ...] = ("exact",)
    arch: ArchName = "small"
    samples: int = Field(default=3, ge=1)
    layouts: tuple[str, ...] | None = Field(default=None, description="None: the first `samples` layouts")
    iterations: int | None = Field(default=None, ge=1, description="image-stage iterations; None: the mode's")
    gaussian_sigmas: tuple[float, ...] = (1e-5, 1e-3)
    dp_epsilons: tuple[float, ...] = (8.0, 1.0)
    workers: int = Field(default=0, ge=0, description="attack processes; 0: one per CPU core")
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN,
                        description="where the attacks run: cpu, or cuda[:N] (the workers share the GPU)")
    seed: Seed = 0

    def defenses(self) -> list[tuple[str, str | None]]:
        """(label, defense chain) from the weakest to the strongest."""
        out: list[tuple[str, str | None]] = [("none", None)]
        out += [(f"gaussian σ={s:g}", f"gaussian:{s:g}") for s in self.gaussian_sigmas]
        out += [(f"DP-SGD ε={e:g}", dpsgd_defense(e)) for e in sorted(self.dp_epsilons, reverse=True)]
        return out


def default_config(quick: bool = False, full: bool = False, seed: int = 0) -> AuditConfig:
    if quick and full:
        raise LeaklabError("--quick and --full exclude each other")
    if quick:
        return AuditConfig(settings=("S1",), samples=1, iterations=3, gaussian_sigmas=(1e-3,),
                           dp_epsilons=(8.0,), seed=seed, workers=1)
    if full:
        from leaklab.rl.envs import LAYOUTS

        return AuditConfig(settings=("S1", "S2"), modes=("exact", "paper"), samples=48,
                           layouts=tuple(LAYOUTS), iterations=None, seed=seed)
    return AuditConfig(seed=seed)


def _cell_configs(config: AuditConfig) -> list[tuple[dict[str, str], room_attack.RoomRunConfig]]:
    from leaklab.rl.envs import LAYOUTS

    layouts = config.layouts or tuple(LAYOUTS)[:min(config.samples, len(LAYOUTS))]
    cells = []
    for algorithm in config.algorithms:
        for setting in config.settings:
            for mode in config.modes:
                fields = {"mode": mode, "seed": config.seed}
                if config.iterations is not None:
                    fields["iterations"] = config.iterations
                run = room_attack.RoomRunConfig(algorithm=algorithm, setting=setting, arch=config.arch,
                                                samples=config.samples, layouts=layouts,
                                                attack=RoomAttackConfig(**fields), workers=config.workers,
                                                device=config.device, seed=config.seed)
                cells.append(({"algorithm": algorithm, "setting": setting, "mode": mode}, run))
    return cells


def run(out: Path, config: AuditConfig, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run the audit and write ``out`` atomically; returns the results (also ``results.json``)."""
    check_out(out, AUDIT_FORMAT)
    require_device(config.device)
    start = time.perf_counter()
    defenses = config.defenses()
    cells = _cell_configs(config)
    # capture once per algorithm and setting (the modes attack the same updates), then attack every
    # cell's samples behind every defense level in one pool, each defended update built when its
    # attack is handed to the pool (room_attack.JobList)
    firsts: dict[tuple[str, str], room_attack.RoomRunConfig] = {}
    for _, run_config in cells:
        firsts.setdefault((run_config.algorithm, run_config.setting), run_config)
    episodes = sum(run_config.samples * run_config.batch_size for run_config in firsts.values())
    captures: dict[tuple[str, str], tuple[dict[str, torch.Tensor], list[room_attack.Sample]]] = {}
    captured = 0
    for key, run_config in firsts.items():
        def on_episode(n: int, before: int = captured) -> None:
            progress("capture", before + n, episodes)

        captures[key] = room_attack.capture_samples(run_config, on_episode if progress else None)
        captured += run_config.samples * run_config.batch_size
    where = [(c, d, sample) for c, (_, run_config) in enumerate(cells) for d in range(len(defenses))
             for sample in captures[(run_config.algorithm, run_config.setting)][1]]

    def make_job(i: int) -> room_attack.Job:  # a cell's run config carries the audit's seed
        c, d, sample = where[i]
        run_config = cells[c][1]
        state = captures[(run_config.algorithm, run_config.setting)][0]
        return room_attack.attack_job(run_config, state, sample, defenses[d][1])

    jobs = room_attack.JobList(len(where), make_job)
    rows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    pictures: dict[tuple[int, int], list[Picture]] = {}
    truths: dict[int, list[Picture]] = {}
    seconds: dict[tuple[int, int], float] = {}

    def on_result(i: int, rec) -> None:
        c, d, sample = where[i]
        setting = cells[c][1].setting
        rows.setdefault((c, d), []).append(room_attack.score(sample, rec, setting))
        seconds[(c, d)] = seconds.get((c, d), 0.0) + rec.seconds
        if len(rows[(c, d)]) <= SHOWN_SAMPLES:  # results arrive in sample order
            pictures.setdefault((c, d), []).append(_picture(rec, sample.truth))
            if d == 0:
                truths.setdefault(c, []).append(_true_picture(sample.truth))

    with journal_beside(out, jobs, room_attack.task_progress(progress, "prepare", len(jobs))) as journal, \
            atomic_dir(out, AUDIT_FORMAT) as tmp:
        resumed = room_attack.run_jobs(jobs, config.workers, on_result,
                                       room_attack.task_progress(progress, "audit", len(jobs)), journal)
        results_cells = []
        for c, (meta, run_config) in enumerate(cells):
            for d, (label, chain) in enumerate(defenses):
                cell_rows = rows[(c, d)]
                iterations = max(r["iterations"] for r in cell_rows)
                results_cells.append({**meta, "defense": label, "defense_chain": chain,
                                      "summary": room_attack.summarise(cell_rows, iterations, seconds[(c, d)]),
                                      "samples": cell_rows})
        results = {"format": AUDIT_FORMAT, "format_version": 2, "kind": "rooms",
                   "config": config.model_dump(mode="json"),
                   "summary": {"seconds": time.perf_counter() - start, "samples_attacked": len(jobs),
                               "resumed_attacks": resumed, "defenses": [label for label, _ in defenses]},
                   "cells": results_cells, "versions": versions(), "device": describe(torch.device(config.device))}
        write_json(tmp / RESULTS_FILE, results)
        _write_report(tmp, results, cells, defenses, truths, pictures)
    return results


def _algorithm(loss: str) -> str:
    if loss == "dqn_mse":
        return "qgi"
    if loss == "reinforce":
        return "rgi"
    raise LeaklabError(f"update loss {loss!r} is not an RL loss; room cases hold dqn_mse or reinforce updates")


def run_cases(out: Path, cases_dir: Path, attack: RoomAttackConfig, workers: int = 0,
              progress: ProgressFn | None = None, model_class: str | None = None,
              device: str = "cpu") -> dict[str, Any]:
    """Attack a user's saved room cases (every sub-folder of ``cases_dir`` with a ``view.json``) as
    they are, score them when their truth is present, and write ``out`` like :func:`run`.
    ``model_class`` ("module:Class") is the user's own perception network the cases belong to; it
    must follow :func:`leaklab.models.perception.check_contract`. ``device`` is where the attacks run
    (``cpu`` or ``cuda[:N]``)."""
    from leaklab.rl.cases import load_room_case, load_room_truth

    check_out(out, AUDIT_FORMAT, inputs=[cases_dir])
    require_device(device)
    cases_dir = Path(cases_dir)
    folders = _case_folders(cases_dir)
    if not folders:
        raise LeaklabError(f"--cases {cases_dir}: no room case folders (with {VIEW_FILE}) found (the format of "
                           "docs/formats.md; `leaklab env capture` writes them from the rooms)")
    start = time.perf_counter()
    recorded = _captured_model_class(cases_dir)
    try:
        cases = [load_room_case(f, model_class) for f in folders]
    except LeaklabError as e:
        if recorded == model_class:
            raise
        raise LeaklabError(f"{e} (the cases were captured with {_network_words(recorded)})") from None
    if recorded != model_class and "config" in _capture_index(cases_dir):  # same parameters, another class
        warnings.warn(f"--cases {cases_dir} were captured with {_network_words(recorded)}, and are attacked as "
                      f"updates of {_network_words(model_class)}", UserWarning, stacklevel=2)
    for c in cases:  # before any attack runs, as the truths below
        if c.update.metadata.kind != "fedsgd":
            raise LeaklabError(f"--cases: {c.folder.name} is a {c.update.metadata.kind} update; the room attacks "
                               "read FedSGD updates (one gradient)")
        limit = max_batch(c.view.metadata.loss, attack.mode)
        if c.update.metadata.batch_size > limit:
            raise LeaklabError(f"--cases: {c.folder.name} is an update of {c.update.metadata.batch_size} transitions; "
                               f"{_algorithm(c.view.metadata.loss).upper()} in {attack.mode} mode reads at most "
                               f"{limit}")
    # every truth is read and checked before any attack runs: a bad file fails in seconds
    truth_of = {i: load_room_truth(c.folder, c) for i, c in enumerate(cases) if (c.folder / TRUTH_FILE).is_file()}
    jobs = [room_attack.Job(_algorithm(c.view.metadata.loss), c.view.spec,
                            {k: v.detach().clone() for k, v in c.view.model.state_dict().items()}, c.update, attack,
                            model_class, device)
            for c in cases]
    rows: list[dict[str, Any]] = []
    truths, pictures, unscored = [], [], []
    names: dict[str, list[str]] = {"scored": [], "unscored": []}  # the pictured cases'

    def on_result(i: int, rec) -> None:
        case = cases[i]
        row: dict[str, Any] = {"case": case.folder.name, "algorithm": jobs[i].algorithm,
                               "setting": case.view.spec.setting, "defense": case.update.defense,
                               "iterations": rec.iterations, "seconds": rec.seconds,
                               "action": rec.action.tolist(), "box": rec.box.tolist()}
        if rec.action_identified is not None:  # RGI: False where a zero return hid the action
            row["action_identified"] = rec.action_identified.tolist()
        if rec.no_signal:
            row["no_signal"] = True
        row["exact"] = list(rec.exact)
        if i in truth_of:
            truth, provenance = truth_of[i]
            sample = room_attack.Sample(i, list(provenance.get("layouts", [])), case.update, truth)
            scored = room_attack.score(sample, rec, case.view.spec.setting)
            row.update(metrics=scored["metrics"], layouts=scored["layouts"], batch_size=scored["batch_size"])
            if len(truths) < SHOWN_SAMPLES:  # every channel: S1 (RGB, depth), S2 (depth)
                truths.append(_true_picture(truth))
                pictures.append(_picture(rec, truth))
                names["scored"].append(case.folder.name)
        elif len(unscored) < SHOWN_SAMPLES:  # what the server sees of a case whose truth nobody gave
            unscored.append((rec.images[:1].detach().float().clamp(0, 1), rec.box[0].detach().float()))
            names["unscored"].append(case.folder.name)
        rows.append(row)

    with journal_beside(out, jobs) as journal, atomic_dir(out, AUDIT_FORMAT, inputs=[cases_dir]) as tmp:
        resumed = room_attack.run_jobs(jobs, workers, on_result,
                                       room_attack.task_progress(progress, "audit", len(jobs)), journal)
        scored = [r for r in rows if "metrics" in r]
        summary = {"seconds": time.perf_counter() - start, "cases": len(rows), "scored": len(scored),
                   "resumed_attacks": resumed}
        if scored:
            summary.update(room_attack.summarise(scored, max(r["iterations"] for r in scored),
                                                 sum(r["seconds"] for r in scored)))
        results = {"format": AUDIT_FORMAT, "format_version": 2, "kind": "room-cases",
                   "cases_dir": str(cases_dir), "model_class": model_class,
                   "attack": attack.model_dump(mode="json"), "summary": summary,
                   "cases": rows, "versions": versions(), "device": describe(torch.device(device))}
        write_json(tmp / RESULTS_FILE, results)
        _write_cases_report(tmp, results, truths, pictures, unscored, names)
    if _fell_back(results):
        warnings.warn(_fell_back(results), UserWarning, stacklevel=2)
    return results


def _capture_index(cases_dir: Path) -> dict[str, Any]:
    """The ``capture.json`` that ``leaklab env capture`` wrote beside the cases; {} when there is none."""
    path = cases_dir / CAPTURE_JSON
    index = read_json(path) if path.is_file() else {}
    return index if isinstance(index, dict) else {}


def _captured_model_class(cases_dir: Path) -> str | None:
    """The ``--model-class`` that ``leaklab env capture`` recorded for the cases in ``cases_dir``; None
    for leaklab's own networks, or when no capture index records it."""
    config = _capture_index(cases_dir).get("config")
    recorded = config.get("model_class") if isinstance(config, dict) else None
    return recorded if isinstance(recorded, str) else None


def _network_words(model_class: str | None) -> str:
    return f"--model-class {model_class}" if model_class else "a network of leaklab"


def _case_folders(cases_dir: Path) -> list[Path]:
    """The case folders under ``cases_dir`` (or ``cases_dir`` itself when it is one). A case that its
    capture's ``capture.json`` lists but that lacks its view is an error; another sub-folder without
    a view is skipped with a warning naming it."""
    if (cases_dir / VIEW_FILE).is_file():
        return [cases_dir]
    if not cases_dir.is_dir():
        raise LeaklabError(f"--cases {cases_dir} {'is not a folder' if cases_dir.exists() else 'does not exist'}; "
                           "give a folder that `leaklab env capture` wrote")
    listed = _capture_index(cases_dir).get("cases")
    lost = [name for name in listed if not (cases_dir / str(name) / VIEW_FILE).is_file()] \
        if isinstance(listed, list) else []
    if lost:
        more = f" (nor have {len(lost) - 1} more)" if len(lost) > 1 else ""
        raise LeaklabError(f"--cases {cases_dir}: case {lost[0]} of its {CAPTURE_JSON} has no {VIEW_FILE}{more}; "
                           "restore it or capture again")
    subs = sorted(p for p in cases_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    skipped = [p.name for p in subs if not (p / VIEW_FILE).is_file()]
    if skipped and len(skipped) < len(subs):
        warnings.warn(f"--cases {cases_dir}: skipping {plural(len(skipped), 'sub-folder')} without {VIEW_FILE}: "
                      f"{', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''}", UserWarning, stacklevel=3)
    return [p for p in subs if (p / VIEW_FILE).is_file()]


def _action_text(row: dict[str, Any]) -> str:
    """The recovered action(s) of a case row, marked where the update did not hold them."""
    known = row.get("action_identified", [True] * len(row["action"]))
    return ", ".join(str(a) if k else f"{a} (guess: not in the update)" for a, k in zip(row["action"], known))


def _case_figures(folder: Path, rows: list[tuple[str, list[Picture]]], names: list[str], stem: str, title: str,
                  caption: str) -> list[Any]:
    """The figures of pictured cases, one grid row per ``(label, pictures)`` of ``rows``, each picture
    with its box and the case's name under the first row: depth for every case (``figures/STEM.png``),
    RGB for the S1 ones (``STEM_rgb.png``)."""
    from leaklab.report.html import Figure
    from leaklab.report.plots import image_grid

    figures = []
    for channel, channels, suffix in (("depth", slice(-1, None), ""), ("RGB", slice(0, 3), "_rgb")):
        shown = [i for i, (images, _) in enumerate(rows[0][1]) if channel == "depth" or images.shape[1] == 4]
        if not shown:
            continue
        grid = image_grid([(f"{channel} {label}", torch.cat([pics[i][0][:, channels] for i in shown]))
                           for label, pics in rows],
                          boxes=[[pics[i][1] for i in shown] for _, pics in rows],
                          captions=[[names[i] for i in shown]] + [None] * (len(rows) - 1),
                          path=folder / "figures" / f"{stem}{suffix}.png", max_cols=8, title=f"{title} ({channel})")
        figures.append(Figure(f"{title} ({channel})", grid, caption if channel == "depth" else
                              f"the {plural(len(shown), 'S1 case')} among the pictured ones"))
    return figures


def _write_cases_report(folder: Path, results: dict[str, Any], truths: list[Picture], pictures: list[Picture],
                        unscored: list[Picture], names: dict[str, list[str]]) -> None:
    """The report of ``audit --cases``: ``truths`` and ``pictures`` picture the first scored cases,
    ``unscored`` the first reconstructions of cases without their truth (``names``: of those cases)."""
    from leaklab.report.html import Section, Table, render_report

    s, attack = results["summary"], results["attack"]
    sections, lead = [], ""
    if s["scored"]:
        gains = [(s[f"{im}_psnr_mean"] - s[f"{im}_psnr_baseline_mean"], im) for im in ("rgb", "depth")
                 if s.get(f"{im}_psnr_mean") is not None]
        gain, where = max(gains)
        # the action of the cases whose update holds it (QGI always; RGI unless a return of 0 hid it)
        held = [r["metrics"]["action"] for r in results["cases"]
                if "metrics" in r and all(r.get("action_identified", [True]))]
        action = statistics.fmean(held) if held else None
        verdict = _verdict(gain, where, s["iou_mean"], action)
        lead = (f"Over {plural(s['scored'], 'scored case')}, the saved updates give away "
                f"{verdict.removeprefix('leaks ') if verdict != NOTHING_LEAKS else 'nothing measured'}.")
        glance = Table(columns=["largest image gain (dB)", "where", "cases showing their room", "box IoU (mean)",
                                "action", "verdict"],
                       rows=[[gain, where, _leak_share(results["cases"]), s["iou_mean"],
                              None if action is None else f"{100 * action:.0f}% of {plural(len(held), 'case')}",
                              verdict]],
                       caption=_glance_caption() + " Over the scored cases; the action over those whose update "
                                                   "holds it (an RGI update with a return of 0 does not).")
        sections.append(Section(title="At a glance", tables=[glance]))
    figures = []
    if truths:
        figures += _case_figures(folder, [("original", truths), ("reconstructed", pictures)], names["scored"],
                                 "cases", "Originals and reconstructions",
                                 _shown(len(truths), s["scored"], "scored case"))
    if unscored:
        figures += _case_figures(folder, [("reconstructed", unscored)], names["unscored"], "unscored",
                                 "Reconstructions of the cases without their truth",
                                 _shown(len(unscored), s["cases"] - s["scored"], "unscored case"))

    def right(row: dict[str, Any]) -> str | None:
        if "metrics" not in row:
            return None
        return "yes" if row["metrics"]["action"] == 1 else "no" if row["metrics"]["action"] == 0 else \
            f"{100 * row['metrics']['action']:.0f}%"

    scores = [f"{im}_paper_{key}" for im in ("depth", "rgb")
              for key in ("psnr", "psnr_baseline", "ssim", "ssim_baseline")]
    columns = ["case", "attack", "setting", "defense", "action", "action right", "box IoU",
               *(f"{name} {col}" for name in ("depth", "RGB") for col in ("PSNR (dB)", "baseline (dB)", "SSIM",
                                                                         "SSIM baseline")), "s"]
    table = Table(columns=columns, rows=[
        [r["case"], r["algorithm"].upper(), r["setting"], r["defense"] or "none", _action_text(r), right(r),
         *(r.get("metrics", {}).get(k) for k in ("box_iou", *scores)), r["seconds"]] for r in results["cases"]],
        caption="Metrics appear for cases whose truth.safetensors is present; PSNR/SSIM with the paper's "
                "normalisation, baseline: a constant image at the true mean.")
    sections.append(Section(title="Cases", figures=figures, tables=[table]))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("cases", results["cases_dir"]),
               ("network", results["model_class"] or "leaklab's perception network (as the cases' views name it)"),
               ("attacks", f"{attack['mode']} mode, {attack['iterations']} image iterations each"),
               ("device", results["device"]), ("leaklab", results["versions"]["leaklab"]),
               ("torch", results["versions"]["torch"]), ("seconds", s["seconds"]),
               ("attacks resumed from an interrupted run", s["resumed_attacks"])]
    render_report(folder / REPORT_FILE, "leaklab audit of saved room updates", summary=summary,
                  notice=" ".join(filter(None, (_fell_back(results), _effort_notice(attack["iterations"])))),
                  lead=lead,
                  intro="Each saved client update was attacked from the server's files only (QGI for DQN "
                        "updates, RGI for REINFORCE updates).",
                  sections=sections)


def _fell_back(results: dict[str, Any]) -> str:
    """The caveat when exact mode could not read an undefended case in closed form (its network computes
    what the attacks do not model, e.g. a batch through a module other than Linear or ReLU in its head)
    and fell back to the paper's optimisation; "" when it read every such case."""
    if results["attack"]["mode"] != "exact":
        return ""
    missed = [r["case"] for r in results["cases"]
              if r["defense"] is None and not r.get("no_signal") and "features" not in r["exact"]]
    if not missed:
        return ""
    return (f"exact mode could not read {plural(len(missed), 'undefended case')} ({', '.join(missed[:3])}"
            f"{', ...' if len(missed) > 3 else ''}) in closed form: the network computes what its closed forms do "
            "not model, so the attack fell back to the paper's optimisation; low scores there show a weaker "
            "attack, not a private update.")


def _true_picture(truth: dict[str, torch.Tensor]) -> Picture:
    """The first true state of an update as the reports picture it, with its box."""
    return truth["images"][:1], truth["box"][0].float()


def _picture(rec, truth: dict[str, torch.Tensor]) -> Picture:
    """The reconstruction matched to the first true state (a batch has no order), with its recovered box."""
    r = first_match(rec.images, truth["images"])
    return rec.images[r:r + 1].detach().float().clamp(0, 1), rec.box[r].detach().float()


def _shown(pictured: int, total: int, what: str) -> str:
    """A figure's caption when it pictures only the first of its rows (:data:`SHOWN_SAMPLES`)."""
    return f"the first {pictured} of {total} {what}s; results.json has every one" if pictured < total else ""


def _leakage_plot(results: dict[str, Any], labels: list[str], path: Path) -> bytes:
    """PSNR gain over the constant-image baseline per defense (RGB and depth per attack)."""
    from leaklab.report.plots import bar_plot

    series: dict[str, list[float | None]] = {}
    for cell in results["cells"]:
        key = f"{cell['algorithm'].upper()} {cell['setting']} {cell['mode']}"
        s = cell["summary"]
        for image in ("rgb", "depth"):
            if s.get(f"{image}_psnr_mean") is not None:
                gain = s[f"{image}_psnr_mean"] - s[f"{image}_psnr_baseline_mean"]
                series.setdefault(f"{key} {image}", [None] * len(labels))[labels.index(cell["defense"])] = gain
    return bar_plot(labels, series, path, ylabel="PSNR over baseline (dB)", xlabel="defense, weakest first",
                    title="Leakage per defense: reconstruction PSNR minus the constant-image baseline",
                    threshold=(IMAGE_LEAK_DB, f"the room shows from +{IMAGE_LEAK_DB:g} dB"))


def _frame_gain(row: dict[str, Any]) -> float | None:
    """One attacked update's largest image gain over its constant baseline (RGB or depth, dB)."""
    m = row.get("metrics", {})
    gains = [m[f"{im}_paper_psnr"] - m[f"{im}_paper_psnr_baseline"] for im in ("rgb", "depth")
             if m.get(f"{im}_paper_psnr") is not None and m.get(f"{im}_paper_psnr_baseline") is not None]
    return max(gains) if gains else None


def chain_in_words(chain: str | None) -> str:
    """What a client does to its update behind a defense chain, e.g. ``clip to norm 1, noise std 0.6``."""
    words = {"gaussian": "noise std {:.3g}", "laplace": "Laplace noise of scale {:.3g}", "clip": "clip to norm {:g}",
             "prune": "drop each entry with probability {:g}", "topk": "drop the smallest {:g} of the entries"}
    return ", ".join(words[name].format(value) for name, value in defense_steps(chain)) or "nothing"


def verdicts(results: dict[str, Any]) -> list[list[Any]]:
    """One row per defense, weakest first: what the clients add, the largest image gain over the constant
    baseline (and where), how many attacked updates show their room (an image at :data:`IMAGE_LEAK_DB`
    or more over its own baseline), the best mean box IoU, QGI's action accuracy, and a verdict in words
    naming what leaks (:data:`IMAGE_LEAK_DB`, :data:`BOX_LEAK_IOU`, :data:`ACTION_LEAK`)."""
    rows = []
    for label in results["summary"]["defenses"]:
        cells = [c for c in results["cells"] if c["defense"] == label]
        gains = [(s[f"{im}_psnr_mean"] - s[f"{im}_psnr_baseline_mean"], f"{c['algorithm'].upper()} {c['setting']} {im}")
                 for c in cells for im in ("rgb", "depth") if (s := c["summary"]).get(f"{im}_psnr_mean") is not None]
        gain, where = max(gains)
        shown = _leak_share([r for c in cells for r in c["samples"]])
        iou = max(c["summary"]["iou_mean"] for c in cells)
        actions = [c["summary"]["action_accuracy"] for c in cells if c["algorithm"] == "qgi"]
        action = statistics.fmean(actions) if actions else None
        rows.append([label, chain_in_words(cells[0].get("defense_chain")), gain, where, shown, iou,
                     None if action is None else f"{100 * action:.0f}%", _verdict(gain, where, iou, action)])
    return rows


def conclusion(rows: list[list[Any]]) -> str:
    """The audit in one sentence, from :func:`verdicts`' rows (weakest defense first)."""
    safe = [r[0] for r in rows if r[-1] == NOTHING_LEAKS]
    leaky = [r for r in rows if r[-1] != NOTHING_LEAKS]
    if not leaky:
        return f"Nothing measured leaks behind any defense tested, {rows[0][0]} included."
    last = leaky[-1]
    sees = f"behind {last[0]} the update still {last[-1]}"
    if not safe:
        return f"Every defense tested leaks: {sees}."
    return f"{safe[0]} is the weakest defense tested behind which nothing measured leaks; {sees}."


def _verdict(gain: float, where: str, iou: float, action: float | None) -> str:
    """What leaks, in words: the room at an image gain of :data:`IMAGE_LEAK_DB`, the box at a mean IoU
    of :data:`BOX_LEAK_IOU`, the action at an accuracy (``action``; None: not measured) of :data:`ACTION_LEAK`."""
    leaks = [f"the room ({where} {gain:+.1f} dB over the baseline)"] if gain >= IMAGE_LEAK_DB else []
    leaks += [f"the target's box (IoU {iou:.2f})"] if iou >= BOX_LEAK_IOU else []
    leaks += [f"the action ({100 * action:.0f}%)"] if action is not None and action >= ACTION_LEAK else []
    return "leaks " + ", ".join(leaks) if leaks else NOTHING_LEAKS


NOTHING_LEAKS = "nothing measured leaks"


def _glance_caption() -> str:
    return (f"Image gain: reconstruction PSNR minus the constant-image baseline (a mean over the samples); "
            f"the room leaks at {IMAGE_LEAK_DB:g} dB or more, and an attacked update shows its room when one of "
            f"its images is {IMAGE_LEAK_DB:g} dB or more above its own baseline. The box leaks at a mean IoU of "
            f"{BOX_LEAK_IOU:g} or more, the action at an accuracy of {100 * ACTION_LEAK:.0f}% or more (chance: "
            "1 in 7).")


def _leak_share(rows: list[dict[str, Any]]) -> str:
    """How many of the attacked updates ``rows`` show their room (:func:`_frame_gain`), as ``k of n``."""
    gains = [g for r in rows if (g := _frame_gain(r)) is not None]
    return f"{sum(g >= IMAGE_LEAK_DB for g in gains)} of {len(gains)}"


def _effort_notice(iterations: int, after: str = "") -> str:
    """The report's warning (ending in ``after``) when the attacks ran fewer image iterations than
    their default."""
    full = RoomAttackConfig.model_fields["iterations"].default
    return (f"these attacks ran {iterations} image iterations, fewer than the {full} they take by default: the "
            f"reconstructions, and so the verdicts below, understate what the updates leak.{after}"
            if iterations < full else "")


def _cell_table(meta: dict[str, str], images: tuple[str, ...], labels: list[str], by: dict) -> Any:
    """One attack's metrics under every defense: each image score beside its constant baseline, the
    box, the action and the Q-value (QGI) or reward (RGI) error, and the time per sample."""
    from leaklab.report.html import Table

    names = {"rgb": "RGB", "depth": "depth"}
    columns = ["defense"] + [f"{names[im]} {col}" for im in images for col in
                             ("PSNR (dB)", "baseline (dB)", "SSIM", "SSIM baseline")]
    qgi = meta["algorithm"] == "qgi"
    columns += ["box IoU", "action", "target-Q error (%)" if qgi else "reward error (absolute)", "s per sample"]
    rows = []
    for label in labels:
        cell = by[(meta["algorithm"], meta["setting"], meta["mode"], label)]
        s = cell["summary"]
        row = [label] + [s.get(f"{im}_{key}") for im in images for key in
                         ("psnr_mean", "psnr_baseline_mean", "ssim_mean", "ssim_baseline_mean")]
        error = s.get("q_target_err_mean" if qgi else "reward_abs_err_mean")
        row += [s.get("iou_mean"), room_attack.action_share(s, cell["defense_chain"] is not None),
                None if error is None else f"{error:.3g}", s.get("seconds_per_sample")]
        rows.append(row)
    return Table(columns=columns, rows=rows,
                 caption="Baseline: a constant image at the true mean, what an attacker gets with no information; "
                         "a PSNR well above it means the update shows the room (SSIM likewise). PSNR and SSIM on "
                         "the Y channel (RGB) and on depth, with seed 000's normalisation (the reconstruction's "
                         "brightest RGB pixel scaled to white). Means over the samples; the picture above gives "
                         "each one's PSNR and, in brackets, its gain over its own baseline.")


def _write_report(folder: Path, results: dict[str, Any], cells, defenses, truths, pictures) -> None:
    from leaklab.report.html import Figure, Section, Table, render_report
    from leaklab.report.plots import image_grid

    labels = [label for label, _ in defenses]
    plot = _leakage_plot(results, labels, folder / "figures" / "leakage_per_defense.png")
    by = {(c["algorithm"], c["setting"], c["mode"], c["defense"]): c for c in results["cells"]}
    glance = Table(columns=["defense", "what each client does", "largest image gain (dB)", "where",
                            "updates showing their room", "box IoU (best)", "action (QGI)", "verdict"],
                   rows=verdicts(results),
                   caption=_glance_caption() + " The action column is QGI's: RGI's is left out of the verdict, as a "
                   "REINFORCE update whose return is 0 holds no trace of the action and under noise RGI's rule "
                   "reads the noise; the per-attack tables show it.")
    sections = [Section(title="At a glance", tables=[glance])]
    for c, (meta, run_config) in enumerate(cells):
        rows = []
        captions: list[list[str] | None] = []
        boxes: list[list[torch.Tensor]] = []  # the true box on the originals, the recovered one below
        images = ("rgb", "depth") if run_config.setting == "S1" else ("depth",)
        for image in images:
            sl = slice(0, 3) if image == "rgb" else slice(-1, None)
            rows.append((f"{image} original", torch.cat([t[:, sl] for t, _ in truths[c]])))
            captions.append(None)
            boxes.append([b for _, b in truths[c]])
            for d, label in enumerate(labels):
                rows.append((f"{image}, {label}", torch.cat([p[:, sl] for p, _ in pictures[(c, d)]])))
                boxes.append([b for _, b in pictures[(c, d)]])
                cell = by[(meta["algorithm"], meta["setting"], meta["mode"], label)]
                captions.append([f"{m[f'{image}_paper_psnr']:.1f} dB "
                                 f"({m[f'{image}_paper_psnr'] - m[f'{image}_paper_psnr_baseline']:+.1f})"
                                 for m in (r["metrics"] for r in cell["samples"][:SHOWN_SAMPLES])])
        title = f"{meta['algorithm'].upper()} {meta['setting']} ({meta['mode']} mode)"
        slug = f"{meta['algorithm']}-{meta['setting']}-{meta['mode']}"
        grid = image_grid(rows, folder / "figures" / f"{slug}.png", captions=captions, max_cols=8, title=title,
                          boxes=boxes)
        table = _cell_table(meta, images, labels, by)
        what = ("a DQN client (MSE TD loss); QGI recovers the state, the action and the target Q-value"
                if meta["algorithm"] == "qgi" else
                "a REINFORCE client (with entropy bonus); RGI recovers the state, the action and the reward")
        text = (f"{plural(run_config.samples, 'private transition')} from "
                f"{plural(len(set(run_config.layouts or ())), 'room')}, each sent alone as the FedSGD gradient "
                f"of {what}. Top: the originals with the target's box; below, the server's reconstruction and "
                f"recovered box under each defense.")
        shown = _shown(len(truths[c]), run_config.samples, "sample")
        sections.append(Section(title=title, text=text, figures=[Figure("Originals and reconstructions", grid, shown)],
                                tables=[table]))
    config = results["config"]
    iterations = sorted({run_config.attack.iterations for _, run_config in cells})  # as asked (a no-signal
    # attack reports 0)
    rooms = sorted(set(cells[0][1].layouts or ()))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("device", results["device"]),
               ("leaklab", results["versions"]["leaklab"]), ("torch", results["versions"]["torch"]),
               ("network", config["arch"]), ("seed", config["seed"]),
               ("attacks", f"{' and '.join(config['modes'])} mode, {'/'.join(map(str, iterations))} image iterations "
                           f"each; {plural(config['samples'], 'sample')} per cell from {plural(len(rooms), 'room')}"),
               ("rooms", ", ".join(rooms)),
               ("seconds", results["summary"]["seconds"]),
               ("attacks resumed from an interrupted run", results["summary"]["resumed_attacks"])]
    notice = _effort_notice(iterations[0], " Rerun without --quick or --iterations for the audit's verdicts.")
    intro = ("Can an honest-but-curious federated-learning server (one that follows the protocol but studies "
             "what it receives) see a robot's private room? Robots training an active-perception policy in "
             "ViZDoom rooms share one gradient per step; the server inverts it (seed 000, \"Your Room is not "
             "Private\": QGI against DQN clients, RGI against REINFORCE clients). Defenses: Gaussian noise "
             "on every gradient entry, and one DP-SGD step (clip to norm 1, then Gaussian noise calibrated to "
             "ε at δ = 1e-5 for that one step: a training run of many steps spends a larger ε). "
             "S1: the robot sees RGB, depth and the target's box; S2: depth and the box. Exact mode: "
             "leaklab's attack, which reads every linear layer's input in closed form before it reconstructs "
             "the images. Baseline: a constant image at the true mean, what an attacker with no information "
             "scores; the gain over it is what the update gave away.")
    lead = f"{conclusion(verdicts(results))} ({plural(config['samples'], 'sample')} per attack and defense.)"
    render_report(folder / REPORT_FILE, "leaklab audit: your room through federated RL updates",
                  summary=summary, intro=intro, notice=notice, lead=lead,
                  figures=[Figure("Leakage per defense", plot, "bars: PSNR minus the constant-image "
                                  "baseline; at or below 0 the reconstruction shows nothing of the room")],
                  sections=sections)
