"""Attack robots' private rooms through their federated RL updates (seed 000, sections IV and V).

``run(config, out)`` (``leaklab attack qgi|rgi``) captures ``samples`` private transitions from
client rooms of the ViZDoom active-perception task (:mod:`leaklab.rl.capture`), turns each into the
FedSGD update a DQN client (QGI) or REINFORCE client (RGI) shares, optionally passes it through a
defense, attacks it from the server's view only (:mod:`leaklab.attacks.rl`) and scores the
reconstruction against the client's truth with the section V metrics (:mod:`leaklab.metrics.rooms`).

Samples are independent: they are attacked in ``workers`` processes of one torch thread each (on a
shared 2-core CPU that beats two threads per process). Per-sample rows are appended to
``samples.jsonl`` in the run's temporary folder as they finish; ``OUT/results.json`` (format in
``docs/formats.md``) and ``OUT/reconstructions.png`` are written at the end, the whole folder atomically. Each finished
attack is also kept beside ``OUT`` until the run ends (:mod:`.attack_journal`): rerunning an
interrupted command attacks only what is left.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from leaklab.attacks.rl import RoomAttackConfig, RoomReconstruction
from leaklab.attacks.rl.config import METHOD_VERSION
from leaklab.device import DEVICE_PATTERN, describe, require_device, versions
from leaklab.experiments import ProgressFn
from leaklab.experiments.attack_journal import journal_beside
from leaklab.experiments.attack_pool import Job, JobList, run_jobs, task_progress, workers_for
from leaklab.fields import DefenseOption, EntropyWeight, Seed
from leaklab.io import (RECONSTRUCTIONS_FILE, RESULTS_FILE, ROOM_ATTACK_FORMAT, atomic_dir, check_out, json_line,
                        save_tensors, write_json)
from leaklab.metrics.rooms import UNDEFINED_ERRORS, room_metrics, scored_transitions, transition_metrics
from leaklab.metrics.vectors import finite_numbers, mean_of, median_of, update_cosine
from leaklab.models import PerceptionSpec
from leaklab.models.perception import ArchName, architecture_digest
from leaklab.names import DEFAULT_ARCH, MAX_TRAIN_STEPS, ROOM_ATTACK_NAMES, SETTING_NAMES
from leaklab.rl.capture import RoomCaptureConfig, client_rounds, defended
from leaklab.rl.envs.layouts import LayoutNames
from leaklab.threat import ClientUpdate
from leaklab.words import db_text

SAMPLES_FILE = "samples.jsonl"
PNG_FILE = "reconstructions.png"
GRID_SAMPLES = 8

# results.json summary key <- per-sample metric of leaklab.metrics.rooms (mean over transitions; _min: the least)
SUMMARY_KEYS = {
    "rgb_psnr_mean": "rgb_paper_psnr", "rgb_ssim_mean": "rgb_paper_ssim",
    "rgb_psnr_raw_mean": "rgb_raw_psnr", "rgb_ssim_raw_mean": "rgb_raw_ssim",
    "rgb_psnr_baseline_mean": "rgb_paper_psnr_baseline", "rgb_ssim_baseline_mean": "rgb_paper_ssim_baseline",
    "depth_psnr_mean": "depth_paper_psnr", "depth_ssim_mean": "depth_paper_ssim",
    "depth_psnr_raw_mean": "depth_raw_psnr", "depth_ssim_raw_mean": "depth_raw_ssim",
    "depth_psnr_baseline_mean": "depth_paper_psnr_baseline",
    "depth_ssim_baseline_mean": "depth_paper_ssim_baseline",
    "iou_mean": "box_iou", "iou_min": "box_iou_min", "action_accuracy": "action",
    "q_pred_err_mean": "q_pred_error", "q_target_err_mean": "q_target_error",
    "reward_abs_err_mean": "reward_error", "action_identified_share": "action_identified",
}
# Seed 000's Table I gives mean ± standard deviation of the images' scores: the spread of ours
SPREAD_KEYS = {"rgb_psnr_std": "rgb_paper_psnr", "rgb_ssim_std": "rgb_paper_ssim",
               "depth_psnr_std": "depth_paper_psnr", "depth_ssim_std": "depth_paper_ssim"}


class RoomRunConfig(BaseModel):
    """One room-attack experiment: what the clients share and how the server attacks it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    algorithm: Literal[ROOM_ATTACK_NAMES] = "qgi"
    setting: Literal[SETTING_NAMES] = "S2"
    arch: ArchName = DEFAULT_ARCH
    samples: int = Field(default=48, ge=1, le=10_000)
    layouts: LayoutNames = Field(default=None, description="client rooms; None: all")
    batch_size: int = Field(default=1, ge=1, le=2)
    train_steps: int = Field(default=0, ge=0, le=MAX_TRAIN_STEPS, description="0: initialised network (seed 000 V)")
    defense: DefenseOption = Field(default=None, description="defense chain the clients apply")
    attack: RoomAttackConfig = RoomAttackConfig()
    entropy_weight: EntropyWeight = Field(default=0.01, description="alpha of eq. 4 (RGI clients)")
    gamma: float = Field(default=0.99, ge=0, le=1)
    workers: int = Field(default=0, ge=0, description="attack processes; 0: one per CPU core")
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN,
                        description="where the attacks run: cpu, or cuda[:N] (the workers share the GPU)")
    seed: Seed = 0

    @model_validator(mode="after")
    def _paper_rgi_reads_one_sample(self) -> "RoomRunConfig":
        if self.algorithm == "rgi" and self.batch_size != 1 and self.attack.mode != "exact":
            raise ValueError("paper-mode RGI attacks single-sample REINFORCE updates (seed 000 IV-D): "
                             "batch_size 1 (exact mode reads batches of 2)")
        return self

    @property
    def spec(self) -> PerceptionSpec:
        return PerceptionSpec(setting=self.setting, arch=self.arch)


@dataclass
class Sample:
    """A client's update and its truth, as the experiment hands them to an attack process."""

    index: int
    layouts: list[str]
    update: ClientUpdate
    truth: dict[str, torch.Tensor]


def capture_samples(config: RoomRunConfig, on_episode: Callable[[int], None] | None = None,
                    on_train_step: Callable[[int], None] | None = None,
                    ) -> tuple[dict[str, torch.Tensor], list[Sample]]:
    """The network's state and one clean client update (with its truth) per sample
    (:func:`leaklab.rl.capture.client_rounds`); ``on_episode(n)`` hears how many of the
    ``samples * batch_size`` client episodes are done, ``on_train_step(n)`` how many of the network's
    ``train_steps`` of training."""
    capture = RoomCaptureConfig(algorithm="dqn" if config.algorithm == "qgi" else "reinforce", spec=config.spec,
                                layouts=config.layouts, samples=config.samples, batch_size=config.batch_size,
                                train_steps=config.train_steps, gamma=config.gamma,
                                entropy_weight=config.entropy_weight, seed=config.seed)
    state, rounds = client_rounds(capture, on_episode, on_train_step)
    return state, [Sample(i, r.layouts, r.update, r.truth) for i, r in enumerate(rounds)]


def attack_job(config: RoomRunConfig, state: dict[str, torch.Tensor], sample: Sample, defense: str | None) -> Job:
    """The attack of ``config`` on ``sample``'s update behind the clients' ``defense`` (its noise
    drawn from ``config.seed`` and the sample's index: every defense level of an audit sees the same
    draws for a sample)."""
    return Job(config.algorithm, config.spec, state, defended(sample.update, defense, config.seed, sample.index),
               config.attack, device=config.device)


def jobs_and_cosines(count: int, build: Callable[[int], tuple[Sample, Job]]) -> tuple[JobList, dict[int, float]]:
    """``count`` jobs, job ``i`` built by ``build(i)`` (with its sample) when the pool takes it, and the
    cosine of each job's update with its sample's true one, filled in as the jobs are first built."""
    kept: dict[int, float] = {}

    def make(i: int) -> Job:
        sample, job = build(i)
        if i not in kept:  # an attack journal builds every job once before the pool builds it again
            kept[i] = update_cosine(sample.update.tensors, job.update.tensors)
        return job

    return JobList(count, make), kept


def summarise(rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The ``summary`` of ``results.json`` from the per-sample rows: means (``SUMMARY_KEYS``; ``_min``: the
    least), the images' population standard deviations (``SPREAD_KEYS``) and the median of the updates'
    cosines with the true ones (what a defense costs: ``update_cosine``) and of the estimates of the conv
    features' (``feature_cosine``, read off the update alone: what it lets through). A row is one client
    update: ``samples`` counts them, ``transitions`` their transitions (more with batches of 2),
    ``iterations`` is the most an attack ran (paper mode: both stages) and ``seconds_per_sample`` is per update."""
    summary: dict[str, Any] = {}
    for key, metric in SUMMARY_KEYS.items():
        scored = [r for r in rows if metric in r["metrics"]]
        values = [r["metrics"][metric] for r in scored]
        if values:  # a row's metrics are its batch's means: weighed by the transitions they cover, means count those
            summary[key] = min(values) if key.endswith("_min") else mean_of(
                values, [scored_transitions(r["metrics"], metric, r["batch_size"]) for r in scored])
    for key, metric in SPREAD_KEYS.items():
        finite = finite_numbers([r["metrics"].get(metric) for r in rows])
        if finite:
            summary[key] = statistics.pstdev(finite)
    kept = median_of(r["metrics"].get("update_cosine") for r in rows)
    if kept is not None:  # a median: an update whose own gradient is small drowns in weak noise and would
        summary["update_cosine_median"] = kept  # pull a mean
    read = median_of(r.get("feature_cosine") for r in rows)
    if read is not None:
        summary["feature_cosine_median"] = read
    rgi = [r for r in rows if "action_informative" in r["metrics"]]  # RGI's rows (saved cases may mix in QGI's)
    if rgi:
        # a row's metrics are its batch's means: weigh them by the batch size to count samples
        sizes = [r["batch_size"] for r in rgi]
        informative = sum(b * r["metrics"]["action_informative"] for b, r in zip(sizes, rgi))
        correct = sum(b * r["metrics"]["action_informative_correct"] for b, r in zip(sizes, rgi))
        summary["action_accuracy_nonzero_return"] = correct / informative if informative else None
        summary["zero_return_samples"] = round(sum(sizes) - informative)
    for metric in UNDEFINED_ERRORS:  # transitions not read or whose true Q-value is 0: no error, left out
        undefined = [r["metrics"][f"{metric}_undefined"] for r in rows if f"{metric}_undefined" in r["metrics"]]
        if undefined:
            summary[f"{metric}_undefined"] = round(sum(undefined))
    if any("stage1_starts" in r for r in rows):
        summary["stage1_restarted"] = sum(r.get("stage1_starts", 1) > 1 for r in rows)
    summary["samples"] = len(rows)  # client updates, each of its row's batch_size transitions
    summary["transitions"] = sum(r["batch_size"] for r in rows)
    summary["layouts"] = len({name for r in rows for name in r["layouts"]})
    summary["iterations"] = max((r["iterations"] for r in rows), default=0)
    summary["seconds_per_sample"] = seconds / max(len(rows), 1)
    return summary


def action_share(summary: dict[str, Any], defended: bool = False) -> str:
    """Action accuracy, with RGI's share of updates that had a policy-gradient part at all (the rest:
    a zero return, whose update holds no trace of the action), left out for ``defended`` updates,
    where noise passes for such a part and the share says nothing."""
    text = f"{100 * summary['action_accuracy']:.0f}%"
    if summary.get("action_identified_share") is not None and not defended:
        text += f" (policy-gradient part found: {100 * summary['action_identified_share']:.0f}%)"
    return text


def score(sample: Sample, rec: RoomReconstruction, setting: str, kept: float | None = None) -> dict[str, Any]:
    """The per-sample row of ``results.json``: section V metrics against the client's truth, and the
    update's cosine with the true one (``kept``: what a defense left of its direction; a server that averages
    ``K`` updates of one direction lifts a small cosine about ``sqrt(K)``-fold at best) where the caller
    knows it."""
    metrics = room_metrics(rec, sample.truth, setting)
    if kept is not None:
        metrics["update_cosine"] = kept
    row = {"index": sample.index, "layouts": sample.layouts, "batch_size": sample.update.metadata.batch_size,
           "metrics": metrics, "iterations": rec.iterations, "seconds": rec.seconds, "exact": list(rec.exact),
           **read_flags(rec)}
    if rec.stage1_starts:
        row["stage1_starts"] = rec.stage1_starts
    if rec.feature_cosine is not None:
        row["feature_cosine"] = rec.feature_cosine
    return row


def read_flags(rec: RoomReconstruction) -> dict[str, Any]:
    """What a row says of the samples read: ``no_signal`` where the attack read nothing off the update, ``read``
    (one bool per sample, in the reconstruction's order) where it read only some of a batch's samples."""
    if rec.no_signal:
        return {"no_signal": True}
    return {} if rec.read is None else {"read": rec.read.tolist()}


def _grid_rows(setting: str, truths: list[torch.Tensor], recs: list[torch.Tensor]):
    rows = []
    if setting == "S1":
        rows += [("RGB original", torch.cat([t[:, :3] for t in truths])),
                 ("RGB reconstructed", torch.cat([r[:, :3] for r in recs]))]
    rows += [("depth original", torch.cat([t[:, -1:] for t in truths])),
             ("depth reconstructed", torch.cat([r[:, -1:] for r in recs]))]
    return rows


def picture_caption(metrics: dict[str, Any], image: str) -> str:
    """A reconstruction's caption under its picture: its PSNR as drawn (raw) and, in brackets, its gain over its
    own constant-image baseline (on a dark frame the baseline alone scores about 20 dB)."""
    raw = metrics[f"{image}_raw_psnr"]
    return f"{db_text(raw)} dB ({db_text(raw - metrics[f'{image}_raw_psnr_baseline'], True)})"


def image_grid_png(setting: str, truths: list[torch.Tensor], recs: list[torch.Tensor], title: str,
                   path: Path | None = None, scores: list[dict[str, Any]] | None = None) -> bytes:
    """Originals above reconstructions (RGB rows in S1, then depth), one ``[1, C, H, W]`` per column, each
    reconstruction captioned from its transition's ``scores`` (:func:`picture_caption`)."""
    from leaklab.report.plots import image_grid

    rows = _grid_rows(setting, truths, recs)
    caps = [None if name.endswith("original") or not scores
            else [picture_caption(m, "rgb" if name.startswith("RGB") else "depth") for m in scores]
            for name, _ in rows]
    return image_grid(rows, path, captions=caps, max_cols=GRID_SAMPLES, title=title)


def reconstruction_tensors(recovered: Sequence[RoomReconstruction]) -> dict[str, torch.Tensor]:
    """The reconstructions of a run as tensors, one row per attacked sample in sample order (each
    update's ``B`` samples in the attack's order): ``images`` float32 ``[N*B, C, S, S]``, ``box``,
    ``action`` and every other per-sample tensor all of them carry (``q_pred``, ``q_target``, ``probs``,
    ``reward``)."""
    names = ("images", "box", "action", "q_pred", "q_target", "probs", "reward")
    out = {}
    for name in names:
        parts = [getattr(rec, name) for rec in recovered]
        if parts and all(p is not None for p in parts):
            joined = torch.cat([p.detach().cpu() for p in parts])
            out[name] = joined.long() if name == "action" else joined.float()
    return out


def run(config: RoomRunConfig, out: Path, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Capture, attack, score; write ``out`` atomically and return the results dict."""
    check_out(out, ROOM_ATTACK_FORMAT)  # before the capture: never spend minutes and then refuse the folder
    require_device(config.device)
    start = time.perf_counter()
    # the attack processes start now, importing the attack code while this one captures (workers_for)
    with workers_for(config.workers, config.samples) as workers:
        state, clean = capture_samples(config, task_progress(progress, f"capture {config.algorithm} {config.setting}",
                                                             config.samples * config.batch_size),
                                       task_progress(progress, f"train {config.algorithm} {config.setting}",
                                                     config.train_steps) if config.train_steps else None)
        jobs, kept = jobs_and_cosines(len(clean),
                                      lambda i: (clean[i], attack_job(config, state, clean[i], config.defense)))
        rows: list[dict[str, Any]] = []
        truths, recs, scores = [], [], []
        recovered: list[RoomReconstruction] = []
        seconds_attacking = [0.0]
        with journal_beside(out, jobs) as journal, atomic_dir(out, ROOM_ATTACK_FORMAT) as tmp:
            log = (tmp / SAMPLES_FILE).open("w")

            def on_result(i: int, rec: RoomReconstruction) -> None:
                sample = clean[i]
                row = score(sample, rec, config.setting, kept[i])
                rows.append(row)
                recovered.append(rec)
                seconds_attacking[0] += rec.seconds
                log.write(json_line(row))
                log.flush()
                if len(truths) < GRID_SAMPLES:  # every transition of a batch, with its own score
                    for t, (r, each) in enumerate(transition_metrics(rec, sample.truth, config.setting)):
                        if len(truths) < GRID_SAMPLES:
                            truths.append(sample.truth["images"][t:t + 1])
                            recs.append(rec.images[r:r + 1].detach().float().clamp(0, 1))
                            scores.append(each)

            try:
                resumed = run_jobs(jobs, workers, on_result,
                                   task_progress(progress, f"{config.algorithm} {config.setting}", len(jobs)), journal)
            finally:
                log.close()
            wall = time.perf_counter() - start
            summary = summarise(rows, seconds_attacking[0])
            summary["wall_seconds"] = wall
            summary["resumed_samples"] = resumed
            results = {"format": ROOM_ATTACK_FORMAT, "format_version": 1,
                       "config": config.model_dump(mode="json"), "network": architecture_digest(config.spec),
                       "method_version": METHOD_VERSION[config.attack.mode], "summary": summary, "samples": rows,
                       "versions": versions(), "device": describe(torch.device(config.device))}
            write_json(tmp / RESULTS_FILE, results)
            save_tensors(tmp / RECONSTRUCTIONS_FILE, reconstruction_tensors(recovered),
                         {"format": "leaklab.room_reconstructions"})
            title = (f"{config.algorithm.upper()} {config.setting}, {config.attack.mode} mode, "
                     f"{config.arch} network" + (f", defense {config.defense}" if config.defense else ""))
            image_grid_png(config.setting, truths, recs, title, tmp / PNG_FILE, scores)
    return results
