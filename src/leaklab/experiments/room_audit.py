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
interruption, attacks only what is left (with ``run_cases`` too). The reports are drawn by
:mod:`.room_report`, the verdicts reached by :mod:`.room_verdicts`. From each level's verdict the audit
says where the leaks stop and which levels to audit next (:mod:`.audit_levels`), counting the verdicts of
earlier audits of the same rooms, network and attacks that the caller names (``earlier``, ``leaklab audit
--earlier``).

``run_cases`` attacks a user's own saved updates instead: room case folders written by
:func:`leaklab.rl.capture.capture_rooms` (or in that format), of leaklab's perception network or of the
user's own network class (``model_class="module:Class"``, called with the spec, following the module
layout of :func:`leaklab.models.perception.check_contract`); they are scored when their
``truth.safetensors`` is present.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator

from leaklab.attacks.rl import RoomAttackConfig, max_batch
from leaklab.attacks.rl.config import METHOD_VERSION
from leaklab.cases import member_file
from leaklab.device import DEVICE_PATTERN, describe, require_device, versions
from leaklab.errors import LeaklabError, ModelClassError
from leaklab.experiments import ProgressFn, attack_pool, room_attack, room_report, room_verdicts
from leaklab.experiments.attack_journal import journal_beside
from leaklab.experiments.audit_levels import leaks_stop, next_levels
from leaklab.fields import Seed, defense_steps
from leaklab.io import (AUDIT_FORMAT, CAPTURE_JSON, RECONSTRUCTIONS_FILE, RESULTS_FILE, ROOM_CAPTURE_FORMAT,
                        ROOM_CAPTURE_VERSION, TRUTH_FILE, VIEW_FILE, atomic_dir, check_audit_kind,
                        check_format_version, check_out, read_json, resolved, save_tensors, write_json)
from leaklab.metrics.rooms import matched
from leaklab.metrics.vectors import median_of
from leaklab.models.perception import ArchName
from leaklab.names import DEFAULT_ARCH, ROOM_ATTACK_NAMES, ROOM_MODE_NAMES, SETTING_NAMES
from leaklab.privacy.dpsgd import noise_multiplier_for
from leaklab.rl.envs.layouts import LayoutNames
from leaklab.words import plural


DP_DELTA = 1e-5
AUDIT_FORMAT_VERSION = 2  # a room audit's results.json (`--earlier` reads up to it)
DP_CLIP = 1.0


def dpsgd_defense(epsilon: float, clip: float = DP_CLIP, delta: float = DP_DELTA) -> str:
    """The defense chain of one DP-SGD release at ``epsilon``: clip to ``clip``, Gaussian noise whose std
    is written to 6 significant digits rounded up (the chain is what the clients apply; rounded to the
    nearest, ε = 8's std 0.6002290722 became 0.600229, a release at ε = 8.0000012)."""
    std = noise_multiplier_for(epsilon, delta) * clip
    step = 10.0 ** (math.floor(math.log10(std)) - 5)
    return f"clip:{clip:g},gaussian:{math.ceil(std / step) * step:.6g}"


class AuditConfig(BaseModel):
    """What the audit attacks; the defaults are sized for about ten minutes on two CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    algorithms: tuple[Literal[ROOM_ATTACK_NAMES], ...] = ("qgi", "rgi")
    settings: tuple[Literal[SETTING_NAMES], ...] = ("S1", "S2")
    modes: tuple[Literal[ROOM_MODE_NAMES], ...] = ("exact",)
    arch: ArchName = DEFAULT_ARCH
    train_steps: int = Field(default=0, ge=0, description="environment steps of DQN / REINFORCE training before the "
                             "captured round; 0: the network as initialised (seed 000, V)")
    samples: int = Field(default=3, ge=1)
    layouts: LayoutNames = Field(default=None, description="None: the first `samples` layouts")
    iterations: int | None = Field(default=None, ge=1, description="image-stage iterations; None: the mode's")
    # σ = 1e-3 keeps a typical update's direction (cosine 0.87-1) and leaks the room; 3e-2 keeps a cosine of
    # 0.06-0.34 and leaks the action and, in 6 updates of 12 (1 up to exact method version 11), the room
    # (docs/reproductions.md, "The levels in between" and the default audit's table)
    gaussian_sigmas: tuple[PositiveFloat, ...] = Field(default=(1e-3, 3e-2), description="Gaussian noise std levels")
    dp_epsilons: tuple[PositiveFloat, ...] = Field(default=(8.0, 1.0), description="one DP-SGD step's ε levels")
    workers: int = Field(default=0, ge=0, description="attack processes; 0: one per CPU core")
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN,
                        description="where the attacks run: cpu, or cuda[:N] (the workers share the GPU)")
    seed: Seed = 0

    @field_validator("gaussian_sigmas", "dp_epsilons")
    @classmethod
    def _distinct(cls, levels: tuple[float, ...]) -> tuple[float, ...]:
        if len({f"{level:g}" for level in levels}) < len(levels):  # as the chains and labels write them
            raise ValueError("each level once, to 6 significant digits")
        return levels

    @field_validator("gaussian_sigmas")
    @classmethod
    def _applicable(cls, sigmas: tuple[float, ...]) -> tuple[float, ...]:
        for sigma in sigmas:  # the chain the clients apply, checked before any capture
            defense_steps(f"gaussian:{sigma:g}")
        return sigmas

    @field_validator("dp_epsilons")
    @classmethod
    def _calibrated(cls, epsilons: tuple[float, ...]) -> tuple[float, ...]:
        for epsilon in epsilons:  # its noise calibrated before any capture: 1.7e308 was an OverflowError
            try:
                dpsgd_defense(epsilon)
            except (ArithmeticError, LeaklabError) as e:
                raise ValueError(f"no DP-SGD noise calibrates to ε = {epsilon:g} ({e})") from None
        return epsilons

    def defenses(self) -> list[tuple[str, str | None]]:
        """(label, defense chain): none, then each family's levels from the weakest to the strongest (Gaussian
        noise, then one DP-SGD step: the families are not ranked against each other)."""
        out: list[tuple[str, str | None]] = [("none", None)]
        out += [(gaussian_label(s), f"gaussian:{s:g}") for s in sorted(self.gaussian_sigmas)]
        out += [(dpsgd_label(e), dpsgd_defense(e)) for e in sorted(self.dp_epsilons, reverse=True)]
        return out


def gaussian_label(sigma: float) -> str:
    """The report's name of the Gaussian defense at ``sigma``."""
    return f"{room_verdicts.GAUSSIAN_PREFIX}{sigma:g}"


def dpsgd_label(epsilon: float) -> str:
    """The report's name of one DP-SGD step at ``epsilon``."""
    return f"{room_verdicts.DPSGD_PREFIX}{epsilon:g}"


Levels = tuple[dict[float, bool], dict[float, bool]]  # each tested Gaussian σ's and DP-SGD ε's verdict: leaks?
# what an earlier audit must share with this one for its verdicts to count (``--earlier``)
COMPARED_FIELDS = ("algorithms", "settings", "modes", "arch", "train_steps", "samples", "layouts", "iterations",
                   "seed")


def _compared(config: AuditConfig) -> dict[str, Any]:
    """:data:`COMPARED_FIELDS` as the audit runs them: the layouts it picks where none are named, each mode's
    image iterations where none are given (an audit that wrote the defaults out is the same audit)."""
    values = {name: getattr(config, name) for name in COMPARED_FIELDS}
    run = {cell["mode"]: c for cell, c in cell_configs(config)}
    values["layouts"] = next(iter(run.values())).layouts
    values["iterations"] = ", ".join(f"{run[mode].attack.iterations} ({mode} mode)" for mode in config.modes)
    return values


def _verdicts_by_level(config: AuditConfig, results: dict[str, Any]) -> tuple[bool, Levels]:
    """Whether the undefended updates leak, and each tested level's verdict."""
    leaks = {row.defense: row.verdict != room_verdicts.NOTHING_LEAKS for row in room_verdicts.verdicts(results)}
    return leaks["none"], ({s: leaks[gaussian_label(s)] for s in config.gaussian_sigmas},
                           {e: leaks[dpsgd_label(e)] for e in config.dp_epsilons})


def method_versions(config: AuditConfig) -> dict[str, int]:
    """The attacks' method versions an audit's verdicts come from (``results.json`` ``method_version``), by mode."""
    return {mode: METHOD_VERSION[mode] for mode in config.modes}


def earlier_verdicts(folders: Sequence[Path], config: AuditConfig) -> tuple[Levels, list[Path]]:
    """The levels' verdicts of earlier audits (their folders) of the rooms, network and attacks ``config`` audits
    (:data:`COMPARED_FIELDS`, and the attacks' method versions), with the folders counted. An audit run with
    ``--earlier`` counts its own earlier ones, which a later one counts in turn (naming only the last audit of a
    chain lost the verdicts before it), each once, an audit's verdicts over those it counted; one plain error when
    a folder holds no room audit, audited something else, or counted one that is gone."""
    gaussian: dict[float, bool] = {}
    dpsgd: dict[float, bool] = {}
    counted: list[Path] = []

    def read(folder: Path, named: str) -> tuple[dict, dict, list[tuple[Path, str]]]:
        """One earlier audit's verdicts by level and the earlier audits it counted, checked."""
        results = read_json(folder / RESULTS_FILE, "--earlier results")
        if not isinstance(results, dict) or results.get("format") != AUDIT_FORMAT or results.get("kind") != "rooms":
            raise LeaklabError(f"--earlier {named}: not a room audit's folder (`leaklab audit --out` writes one)")
        check_format_version(results, f"--earlier {named}: its {RESULTS_FILE}", AUDIT_FORMAT_VERSION)
        try:
            earlier = AuditConfig.model_validate(results["config"])
            _, (g, d) = _verdicts_by_level(earlier, results)
            before = results["summary"].get("earlier_audits", [])
            if not isinstance(before, list):
                raise TypeError("earlier_audits is not a list")
            before = [Path(b) for b in before]  # an entry that is no string: TypeError, refused too
        except (KeyError, TypeError, ValueError, AttributeError, StopIteration) as e:  # a field of another type
            raise LeaklabError(f"--earlier {named}: its {RESULTS_FILE} is not a whole room audit "
                               f"({type(e).__name__}); run that audit again") from None
        theirs, ours = _compared(earlier), _compared(config)
        differ = [f"{name} {theirs[name]} where this audit has {ours[name]}" for name in COMPARED_FIELDS
                  if theirs[name] != ours[name]]
        if results.get("method_version") != method_versions(config):
            recorded = results.get("method_version") or "unrecorded (before 2026-11-29)"
            differ.append(f"attacks of method version {recorded} where this audit's are {method_versions(config)}")
        if differ:
            raise LeaklabError(f"--earlier {named}: it audited {'; '.join(differ)}, so its verdicts do not "
                               "carry over")
        for path in before:
            if not (path / RESULTS_FILE).is_file():
                raise LeaklabError(f"--earlier {named} counted the earlier audit {path}, which is not there; name "
                                   "the audits you have with --earlier, without it")
        return g, d, [(resolved(path), f"{path} (counted by {named})") for path in before]

    # depth first, each audit's verdicts over those it counted: a loop (a chain of 1,100 audits overflowed
    # the recursion this was) of (folder, name) to read, or (verdicts,) to apply once its earlier ones are
    work: list[tuple] = [(resolved(Path(f)), str(f)) for f in reversed(folders)]
    while work:
        item = work.pop()
        if len(item) == 1:
            g, d = item[0]
            gaussian.update(g)
            dpsgd.update(d)
            continue
        folder, named = item
        if folder in counted:
            continue
        counted.append(folder)  # before its own earlier ones: a loop of folders ends here
        g, d, before = read(folder, named)
        work.append(((g, d),))
        work.extend(reversed(before))
    return (gaussian, dpsgd), counted


def _levels_summary(config: AuditConfig, results: dict[str, Any], earlier: Levels) -> dict[str, Any]:
    """``next_levels`` (:mod:`.audit_levels`) and ``leaks_stop`` from each tested level's verdict, the
    ``earlier`` audits' included (this audit's own where both tested a level); neither when the attacks
    ran fewer image iterations than their default (their verdicts understate the leaks), no levels to
    audit next when the undefended updates leak nothing."""
    leaky, (gaussian, dpsgd) = _verdicts_by_level(config, results)
    gaussian, dpsgd = {**earlier[0], **gaussian}, {**earlier[1], **dpsgd}
    if config.iterations is not None and room_report.effort_notice(config.iterations):
        gaussian, dpsgd = {}, {}  # no verdict to go on: neither names a level
    return {"next_levels": next_levels(gaussian, dpsgd) if leaky else next_levels({}, {}),
            "leaks_stop": leaks_stop(gaussian, dpsgd)}


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


def cell_configs(config: AuditConfig) -> list[tuple[dict[str, str], room_attack.RoomRunConfig]]:
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
                                                train_steps=config.train_steps, samples=config.samples,
                                                layouts=layouts,
                                                attack=RoomAttackConfig(**fields), workers=config.workers,
                                                device=config.device, seed=config.seed)
                cells.append(({"algorithm": algorithm, "setting": setting, "mode": mode}, run))
    return cells


# per (algorithm, setting): the network's state and the clean samples (room_attack.capture_samples)
Captures = dict[tuple[str, str], tuple[dict[str, torch.Tensor], list[room_attack.Sample]]]
Attack = tuple[int, int, room_attack.Sample]  # an audit's attack: cell, defense and sample


def capture_runs(cells: list[tuple[dict[str, str], room_attack.RoomRunConfig]]
                 ) -> dict[tuple[str, str], room_attack.RoomRunConfig]:
    """The run config that captures each algorithm and setting's updates, once: its modes attack the same."""
    firsts: dict[tuple[str, str], room_attack.RoomRunConfig] = {}
    for _, run_config in cells:
        firsts.setdefault((run_config.algorithm, run_config.setting), run_config)
    return firsts


def attack_list(samples: int, cells: list[tuple[dict[str, str], room_attack.RoomRunConfig]],
                defenses: list[tuple[str, str | None]], captures: Captures
                ) -> tuple[list[Attack], attack_pool.JobList, dict[int, float]]:
    """Every attack of an audit, and its jobs and update cosines (:func:`room_attack.jobs_and_cosines`).
    Sample by sample, each through every cell and defense: the attacks' rate, and so the time left a
    progress line gives, is the whole audit's from the start (cell by cell, `--full`'s first cell ran 3
    times faster than its second); each cell's rows still come in sample order."""
    where = [(c, d, captures[(run_config.algorithm, run_config.setting)][1][s]) for s in range(samples)
             for c, (_, run_config) in enumerate(cells) for d in range(len(defenses))]

    def build(i: int) -> tuple[room_attack.Sample, attack_pool.Job]:  # a cell's run config carries the seed
        c, d, sample = where[i]
        run_config = cells[c][1]
        state = captures[(run_config.algorithm, run_config.setting)][0]
        return sample, room_attack.attack_job(run_config, state, sample, defenses[d][1])

    jobs, kept = room_attack.jobs_and_cosines(len(where), build)
    return where, jobs, kept


def run(out: Path, config: AuditConfig, progress: ProgressFn | None = None,
        earlier: Sequence[Path] = ()) -> dict[str, Any]:
    """Run the audit and write ``out`` atomically; returns the results (also ``results.json``).
    ``earlier``: folders of earlier audits of the same rooms, network and attacks whose verdicts count
    in where the leaks stop and which levels to audit next (:func:`earlier_verdicts`)."""
    check_out(out, AUDIT_FORMAT, inputs=earlier)
    check_audit_kind(out, "rooms")
    judged, counted = earlier_verdicts(earlier, config)  # before minutes of work: a wrong folder is refused at once
    require_device(config.device)
    start = time.perf_counter()
    defenses = config.defenses()
    cells = cell_configs(config)
    # capture once per algorithm and setting (the modes attack the same updates), then attack every
    # cell's samples behind every defense level in one pool, each defended update built when its
    # attack is handed to the pool (attack_pool.JobList)
    firsts = capture_runs(cells)
    episodes = sum(run_config.samples * run_config.batch_size for run_config in firsts.values())
    # the attack processes start now, importing the attack code while this one captures (attack_pool.workers_for)
    with attack_pool.workers_for(config.workers, config.samples * len(cells) * len(defenses)) as workers:
        captures: Captures = {}
        captured = trained = 0
        for key, run_config in firsts.items():
            def on_episode(n: int, before: int = captured) -> None:
                if n or not before:  # every capture says 0 at its start: the first one's opens the bar
                    progress("capture", before + n, episodes)

            def on_train_step(n: int, before: int = trained) -> None:  # each algorithm and setting trains a network
                progress("train", before + n, config.train_steps * len(firsts))

            captures[key] = room_attack.capture_samples(run_config, on_episode if progress else None,
                                                        on_train_step if progress and config.train_steps else None)
            captured += run_config.samples * run_config.batch_size
            trained += config.train_steps
        where, jobs, kept = attack_list(config.samples, cells, defenses, captures)
        rows: dict[tuple[int, int], list[dict[str, Any]]] = {}
        pictures: dict[tuple[int, int], list[room_report.Picture]] = {}
        truths: dict[int, list[room_report.Picture]] = {}
        seconds: dict[tuple[int, int], float] = {}

        def on_result(i: int, rec) -> None:
            c, d, sample = where[i]
            setting = cells[c][1].setting
            rows.setdefault((c, d), []).append(room_attack.score(sample, rec, setting, kept[i]))
            seconds[(c, d)] = seconds.get((c, d), 0.0) + rec.seconds
            if len(rows[(c, d)]) <= room_report.SHOWN_SAMPLES:  # results arrive in sample order
                pictures.setdefault((c, d), []).append(room_report.picture(rec, sample.truth))
                if d == 0:
                    truths.setdefault(c, []).append(room_report.true_picture(sample.truth))

        with journal_beside(out, jobs, attack_pool.task_progress(progress, "prepare", len(jobs))) as journal, \
                atomic_dir(out, AUDIT_FORMAT) as tmp:
            resumed = attack_pool.run_jobs(jobs, workers, on_result,
                                           attack_pool.task_progress(progress, "audit", len(jobs)), journal)
            results_cells = []
            for c, (meta, run_config) in enumerate(cells):
                for d, (label, chain) in enumerate(defenses):
                    cell_rows = rows[(c, d)]
                    results_cells.append({**meta, "defense": label, "defense_chain": chain,
                                          "summary": room_attack.summarise(cell_rows, seconds[(c, d)]),
                                          "samples": cell_rows})
            results = {"format": AUDIT_FORMAT, "format_version": AUDIT_FORMAT_VERSION, "kind": "rooms",
                       "config": config.model_dump(mode="json"), "method_version": method_versions(config),
                       "summary": {"seconds": time.perf_counter() - start, "samples_attacked": len(jobs),
                                   "resumed_attacks": resumed, "defenses": [label for label, _ in defenses]},
                       "cells": results_cells, "versions": versions(), "device": describe(torch.device(config.device))}
            results["summary"].update(_levels_summary(config, results, judged))
            if counted:  # every audit counted, a chain's included, each once, as absolute paths
                results["summary"]["earlier_audits"] = [str(folder) for folder in counted]
            write_json(tmp / RESULTS_FILE, results)
            room_report.write_report(tmp, results, cells, defenses, truths, pictures)
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
    check_audit_kind(out, "room-cases")
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
        if recorded == model_class or isinstance(e, ModelClassError):  # (the class itself is at fault)
            raise
        raise LeaklabError(f"{e} (the cases were captured with {_network_words(recorded)})") from None
    if recorded != model_class and "config" in _capture_index(cases_dir):  # same parameters, another class
        warnings.warn(f"--cases {cases_dir} were captured with {_network_words(recorded)}, and are attacked as "
                      f"updates of {_network_words(model_class)}", UserWarning, stacklevel=2)
    for c in cases:  # before any attack runs, as the truths below
        try:  # the workers attack a view rebuilt with leaklab's capabilities: a case's own are checked here
            c.view.require("knows_batch_size", "the room attacks read the update's transitions")
        except LeaklabError as e:
            raise LeaklabError(f"--cases: {c.folder.name}: {e}") from None
        if c.update.metadata.kind != "fedsgd":
            raise LeaklabError(f"--cases: {c.folder.name} is a {c.update.metadata.kind} update; the room attacks "
                               "read FedSGD updates (one gradient)")
        limit = max_batch(c.view.metadata.loss, attack.mode)
        if c.update.metadata.batch_size > limit:
            raise LeaklabError(f"--cases: {c.folder.name} is an update of {c.update.metadata.batch_size} transitions; "
                               f"{_algorithm(c.view.metadata.loss).upper()} in {attack.mode} mode reads at most "
                               f"{limit}")
    # every truth is read and checked before any attack runs: a bad file fails in seconds
    # (a truth that is there but no file, a folder or a pipe, is an error, not a case without its truth)
    truth_of = {i: load_room_truth(c.folder, c) for i, c in enumerate(cases) if os.path.lexists(c.folder / TRUTH_FILE)}
    jobs = [attack_pool.Job(_algorithm(c.view.metadata.loss), c.view.spec,
                            {k: v.detach().clone() for k, v in c.view.model.state_dict().items()}, c.update, attack,
                            model_class, device)
            for c in cases]
    rows: list[dict[str, Any]] = []
    truths, pictures, unscored = [], [], []
    names: dict[str, list[str]] = {"scored": [], "unscored": []}  # the pictured cases'
    recovered: dict[str, torch.Tensor] = {}  # every case's reconstruction, CASE/<tensor>

    def on_result(i: int, rec) -> None:
        case = cases[i]
        row: dict[str, Any] = {"case": case.folder.name, "algorithm": jobs[i].algorithm,
                               "setting": case.view.spec.setting, "defense": case.update.defense,
                               "iterations": rec.iterations, "seconds": rec.seconds,
                               "action": rec.action.tolist(), "box": rec.box.tolist()}
        if rec.action_identified is not None:  # RGI: False where a zero return hid the action
            row["action_identified"] = rec.action_identified.tolist()
        row.update(room_attack.read_flags(rec))
        if not case.view.capabilities.knows_defense:  # "defense" null: not granted, which is not undefended
            row["defense_withheld"] = True
        row["exact"] = list(rec.exact)
        if rec.feature_cosine is not None:  # read off the update alone: known for a case without its truth too
            row["feature_cosine"] = rec.feature_cosine
        recovered.update({f"{case.folder.name}/{k}": v for k, v in room_attack.reconstruction_tensors([rec]).items()})
        if i in truth_of:
            truth, provenance = truth_of[i]
            sample = room_attack.Sample(i, list(provenance.get("layouts", [])), case.update, truth)
            kept = provenance.get("update_cosine")  # one number, as load_room_truth checked
            scored = room_attack.score(sample, rec, case.view.spec.setting, kept[0] if kept else None)
            row.update(metrics=scored["metrics"], layouts=scored["layouts"], batch_size=scored["batch_size"])
            order = matched(rec.images, truth["images"])  # a batch's transitions in the truth's order, as its layouts
            row.update({key: [row[key][r] for r in order] for key in ("action", "box", "action_identified", "read")
                        if key in row})
            if len(truths) < room_report.SHOWN_SAMPLES:  # every channel: S1 (RGB, depth), S2 (depth)
                truths.append(room_report.true_picture(truth))
                pictures.append(room_report.picture(rec, truth))
                names["scored"].append(case.folder.name)
        elif len(unscored) < room_report.SHOWN_SAMPLES:  # what the server sees of a case whose truth nobody gave
            unscored.append(room_report.picture(rec))
            names["unscored"].append(case.folder.name)
        rows.append(row)

    with journal_beside(out, jobs) as journal, atomic_dir(out, AUDIT_FORMAT, inputs=[cases_dir]) as tmp:
        resumed = attack_pool.run_jobs(jobs, workers, on_result,
                                       attack_pool.task_progress(progress, "audit", len(jobs)), journal)
        scored = [r for r in rows if "metrics" in r]
        summary = {"seconds": time.perf_counter() - start, "cases": len(rows), "scored": len(scored),
                   "resumed_attacks": resumed}
        if scored:
            summary.update(room_attack.summarise(scored, sum(r["seconds"] for r in scored)))
        read = median_of(room_report.features_read(r) for r in rows)  # over every case, scored or not
        if read is not None:
            summary["feature_cosine_median"] = read
        results = {"format": AUDIT_FORMAT, "format_version": AUDIT_FORMAT_VERSION, "kind": "room-cases",
                   "cases_dir": str(cases_dir), "model_class": model_class,
                   "attack": attack.model_dump(mode="json"), "summary": summary,
                   "cases": rows, "versions": versions(), "device": describe(torch.device(device))}
        write_json(tmp / RESULTS_FILE, results)
        save_tensors(tmp / RECONSTRUCTIONS_FILE, recovered, {"format": "leaklab.room_case_reconstructions"})
        room_report.write_cases_report(tmp, results, truths, pictures, unscored, names)
    for caveat in (room_report.fallback_caveat(results), room_report.no_signal_caveat(results["cases"]),
                   room_report.unread_images_caveat(results["cases"], "case")):
        if caveat:
            warnings.warn(caveat, UserWarning, stacklevel=2)
    return results


def _capture_index(cases_dir: Path) -> dict[str, Any]:
    """The ``capture.json`` that ``leaklab env capture`` wrote beside the cases; {} when there is none. One of
    another format or a newer version, or whose ``cases`` is no list, is refused (its case list was ignored)."""
    path = member_file(cases_dir, None, CAPTURE_JSON, cases_dir)
    if not os.path.lexists(path):
        return {}
    if not path.is_file():  # a folder or a pipe of that name: its cases' list and recorded class went unread
        raise LeaklabError(f"--cases {cases_dir}: its {CAPTURE_JSON} is not a file; remove it or capture again")
    index = read_json(path)
    if not isinstance(index, dict) or index.get("format") != ROOM_CAPTURE_FORMAT:
        raise LeaklabError(f"--cases {cases_dir}: its {CAPTURE_JSON} is not the index `leaklab env capture` writes "
                           "(format leaklab.room_capture); remove it or capture again")
    check_format_version(index, f"--cases {cases_dir}: its {CAPTURE_JSON}", ROOM_CAPTURE_VERSION)
    if not isinstance(index.get("cases", []), list):
        raise LeaklabError(f"--cases {cases_dir}: its {CAPTURE_JSON} lists no cases (its 'cases' is no list)")
    return index


def _captured_model_class(cases_dir: Path) -> str | None:
    """The ``--model-class`` that ``leaklab env capture`` recorded for the cases in ``cases_dir``; None
    for leaklab's own networks, or when no capture index records it."""
    config = _capture_index(cases_dir).get("config")
    recorded = config.get("model_class") if isinstance(config, dict) else None
    return recorded if isinstance(recorded, str) else None


def _network_words(model_class: str | None) -> str:
    return f"--model-class {model_class}" if model_class else "a network of leaklab"


def _utf8(folder: Path) -> None:
    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        shown = str(folder).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise LeaklabError(f"--cases {shown}: its name is not valid UTF-8, which the report and the reconstructions "
                           "file name cases in; rename it") from None


def _case_folders(cases_dir: Path) -> list[Path]:
    """The case folders under ``cases_dir`` (or ``cases_dir`` itself when it is one). A case that its
    capture's ``capture.json`` lists but that lacks its view is an error; another sub-folder without
    a view is skipped with a warning naming it; a link to another of them (one case audited twice) or out of
    ``cases_dir`` is an error. A folder whose name is not UTF-8 is refused: the report and the
    reconstructions' tensor names carry it (they failed after every attack)."""
    _utf8(cases_dir)
    if (cases_dir / VIEW_FILE).is_file():  # `.` or `..` named the case '' or '..': its own name
        return [cases_dir if cases_dir.name not in ("", "..") else resolved(cases_dir)]
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
    for sub in subs:
        _utf8(sub)
    outside = [p.name for p in subs if p.is_symlink() and resolved(cases_dir) not in resolved(p).parents]
    if outside:  # as a case's files: nothing a --cases folder names is read from outside it
        raise LeaklabError(f"--cases {cases_dir}: {outside[0]} is a link to a folder outside it; copy the case in")
    seen: dict[Path, str] = {}
    for sub in subs:  # one update scored twice would count twice in every mean and share
        first = seen.setdefault(resolved(sub), sub.name)
        if first != sub.name:
            raise LeaklabError(f"--cases {cases_dir}: {sub.name} is a link to {first}, a case already audited; "
                               "remove the link")
    skipped = [p.name for p in subs if not (p / VIEW_FILE).is_file()]
    if skipped and len(skipped) < len(subs):
        warnings.warn(f"--cases {cases_dir}: skipping {plural(len(skipped), 'sub-folder')} without {VIEW_FILE}: "
                      f"{', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''}", UserWarning, stacklevel=3)
    return [p for p in subs if (p / VIEW_FILE).is_file()]
