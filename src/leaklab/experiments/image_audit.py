"""The image leakage audit (``leaklab audit --kind images``; the default audit is the room one,
:mod:`leaklab.experiments.room_audit`).

A few real private images (photo crops and faces) are sent as FedSGD gradients of one image each,
with no defense and with two defenses, and attacked by the server with Deep Leakage from Gradients
(L2 gradient matching with L-BFGS, labels by iDLG) on the sigmoid LeNet of DLG. The audit writes
``OUT/report.html`` (originals beside reconstructions, a metrics table with the constant-image
baseline and the cosine each defense leaves of the updates, a PSNR-per-defense bar plot with that
cosine as a line; the figures are embedded, and also in ``OUT/figures/``),
``OUT/results.json`` and the attacked cases in
``OUT/cases/`` (re-attack one with ``leaklab attack inversion --case OUT/cases/NAME ...``).

The default run is sized to finish within about five minutes on two CPU cores; ``quick=True`` is a
seconds-long version with the same structure, for tests.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaklab.device import default_device, describe, versions
from leaklab.experiments import ProgressFn
from leaklab.experiments.capture import CaptureConfig, capture, write
from leaklab.experiments.image_attack import attack, evaluate, inversion_config
from leaklab.cases import load_case, load_truth
from leaklab.io import AUDIT_FORMAT, REPORT_FILE, RESULTS_FILE, atomic_dir, check_audit_kind, write_json
from leaklab.metrics.vectors import median_of
from leaklab.words import cosine_text, plural, sentences

DEFENSES = ("none", "gaussian:0.01", "prune:0.5,gaussian:0.01")


@dataclass(frozen=True)
class Scenario:
    """Private images of one kind, the model they are sent through, and the attack on them."""

    key: str
    title: str
    data: str
    model: str
    num_images: int
    image_seed: int
    image_offset: int = 0
    image_size: int = 32
    width: int | None = None
    attack: dict[str, Any] = field(default_factory=dict)


QUICK_NOTICE = ("a --quick run: each attack ran a few iterations, so these numbers show that the audit works, not how "
                "much the updates leak")  # the report's notice and the command's warning


def scenarios(quick: bool = False) -> list[Scenario]:
    """The audit's scenarios: photo crops and faces on the sigmoid LeNet, attacked by DLG."""
    dlg = {"objective": "l2", "optimizer": "lbfgs"}
    if quick:
        tiny = {**dlg, "iterations": 2, "lbfgs_inner": 4}
        return [Scenario("photos", "Photo crops, LeNet (sigmoid), DLG", "photos", "lenet", 1, 5, 0,
                         image_size=16, attack=tiny),
                Scenario("faces", "Faces, LeNet (sigmoid), DLG", "faces", "lenet", 1, 1, 2,
                         image_size=16, attack=tiny)]
    return [Scenario("photos", "Photo crops (32x32 RGB), LeNet (sigmoid), DLG: L2 + L-BFGS", "photos",
                     "lenet", 4, 5, 0, attack={**dlg, "iterations": 70}),
            Scenario("faces", "Faces (LFW subset, 32x32 grey), LeNet (sigmoid), DLG: L2 + L-BFGS",
                     "faces", "lenet", 2, 1, 2, attack={**dlg, "iterations": 100})]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "none"


def run(out: Path, quick: bool = False, seed: int = 0, progress: ProgressFn | None = None,
        defenses: tuple[str, ...] = DEFENSES, chosen: list[Scenario] | None = None) -> dict[str, Any]:
    """Run the audit and write ``out`` atomically; returns the results dict (also ``results.json``)."""
    check_audit_kind(out, "image")  # before the work: another kind's audit is not replaced
    chosen = chosen or scenarios(quick)
    device = default_device()
    total = sum(sc.attack.get("iterations", 1) * sc.num_images for sc in chosen) * len(defenses)
    done = 0
    start = time.perf_counter()
    settings: list[dict[str, Any]] = []
    pictures: dict[str, dict[str, Any]] = {}
    with atomic_dir(out, AUDIT_FORMAT) as tmp:
        for sc in chosen:
            config = inversion_config(sc.attack, seed=seed)
            for defense in defenses:
                name = f"{sc.key}-{_slug(defense)}"
                cap = capture(CaptureConfig(model=sc.model, data=sc.data, num_images=sc.num_images,
                                            image_seed=sc.image_seed, image_offset=sc.image_offset,
                                            image_size=sc.image_size, width=sc.width, defense=defense,
                                            seed=seed))
                case_dir = tmp / "cases" / name
                write(cap, case_dir)
                case = load_case(case_dir)
                per_case = config.iterations * len(case.updates)

                def report(_task: str, completed: int, total_here: int, base: int = done,
                           per_case: int = per_case) -> None:
                    if progress:
                        progress("audit", base + round(completed / max(total_here, 1) * per_case), total)

                recons = attack(case, "inversion", config, progress=report, device=device)
                done += per_case
                truth = load_truth(case_dir, case)
                summary, samples, images, _labels = evaluate(case, recons, truth)
                settings.append({"scenario": sc.key, "title": sc.title, "dataset": sc.data,
                                 "model": sc.model, "defense": defense, "case": f"cases/{name}",
                                 "attack": config.model_dump(mode="json"), "summary": summary,
                                 "samples": samples})
                pic = pictures.setdefault(sc.key, {"truth": truth[0], "rows": []})
                pic["rows"].append((defense, images, [f"{s['psnr']:.1f} dB" for s in samples]))
                if progress:
                    progress("audit", done, total)
        seconds = time.perf_counter() - start
        results = {
            "format": AUDIT_FORMAT, "format_version": 1,
            "kind": "image",
            "quick": quick, "seed": seed,
            "summary": {"seconds": seconds, "scenarios": [sc.key for sc in chosen],
                        "defenses": list(defenses),
                        "psnr_mean": {f"{s['scenario']} | {s['defense']}": s["summary"]["psnr_mean"]
                                      for s in settings}},
            "settings": settings,
            "versions": versions(),
            "device": describe(device),
        }
        write_json(tmp / RESULTS_FILE, results)
        _write_report(tmp / REPORT_FILE, results, chosen, defenses, pictures)
    return results


def _write_report(path: Path, results: dict[str, Any], chosen: list[Scenario],
                  defenses: tuple[str, ...], pictures: dict[str, dict[str, Any]]) -> None:
    from leaklab.report.html import Figure, Section, Table, render_report
    from leaklab.report.plots import bar_plot, image_grid

    settings = results["settings"]
    by = {(s["scenario"], s["defense"]): s for s in settings}
    series: dict[str, list[float | None]] = {}
    baselines: dict[str, float | None] = {}
    for sc in chosen:
        series[sc.key] = [by[(sc.key, d)]["summary"]["psnr_mean"] for d in defenses]
        baselines[sc.key] = by[(sc.key, defenses[0])]["summary"]["psnr_baseline_mean"]
    kept = [median_of(by[(sc.key, d)]["summary"].get("update_cosine_median") for sc in chosen) for d in defenses]
    bars = bar_plot(list(defenses), series, path.parent / "figures" / "psnr_per_defense.png",
                    title="Mean PSNR of the reconstructions per defense", baselines=baselines,
                    lines={"update kept (cosine, median over the scenarios; right axis)": kept}, lines_label="cosine")

    sections = []
    for sc in chosen:
        pic = pictures[sc.key]
        rows = [("original", pic["truth"])] + [(d, imgs) for d, imgs, _ in pic["rows"]]
        captions = [None] + [c for _, _, c in pic["rows"]]
        grid = image_grid(rows, path.parent / "figures" / f"{sc.key}.png", captions=captions,
                          max_cols=8, title=sc.title)
        first = by[(sc.key, defenses[0])]
        table = Table(
            columns=["defense", "PSNR (dB)", "SSIM", "baseline PSNR (dB)", "baseline SSIM",
                     "PSNR over baseline (dB)", "label accuracy", "update kept (cosine)", "iterations", "seconds"],
            rows=[[d, s["psnr_mean"], s["ssim_mean"], s["psnr_baseline_mean"], s["ssim_baseline_mean"],
                   s["psnr_mean"] - s["psnr_baseline_mean"], f"{100 * s['label_accuracy']:.0f}%",
                   cosine_text(s.get("update_cosine_median")),
                   s["iterations"], s["seconds"]]
                  for d in defenses for s in [by[(sc.key, d)]["summary"]]],
            caption="Baseline: every pixel at the true image's per-channel mean, the best an attacker "
                    "does with no information beyond the average colour. PSNR well above it means "
                    "the update leaks the image. Update kept: the cosine of the update the server receives "
                    "with the client's true one (the median over the updates; 1 without a defense), what "
                    "the defense costs the training.")
        per_image = Table(
            title="Per image",
            columns=["image", "defense", "PSNR (dB)", "SSIM", "baseline PSNR (dB)", "label (recovered)",
                     "label (true)", "label correct"],
            rows=[[smp["index"], d, smp["psnr"], smp["ssim"], smp["psnr_baseline"], smp["label"],
                   smp["label_true"], smp["label_correct"]]
                  for d in defenses for smp in by[(sc.key, d)]["samples"]])
        attack_cfg = first["attack"]
        text = (f"{plural(sc.num_images, 'private image')} of '{sc.data}', each sent alone as a FedSGD gradient "
                f"of an untrained {sc.model}. The server runs {attack_cfg['objective']} gradient matching "
                f"with {attack_cfg['optimizer']} for {attack_cfg['iterations']} iterations; labels are "
                f"recovered from the last layer (iDLG). Top row: the originals; below, the "
                f"reconstruction under each defense, with its PSNR. Cases: "
                f"{', '.join(by[(sc.key, d)]['case'] for d in defenses)}.")
        sections.append(Section(title=sc.title, text=text,
                                figures=[Figure("Originals and reconstructions", grid)],
                                tables=[table, per_image]))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("device", results["device"]),
               ("leaklab", results["versions"]["leaklab"]), ("torch", results["versions"]["torch"]),
               ("python", results["versions"]["python"]), ("seed", results["seed"]),
               ("quick", results["quick"]), ("seconds", results["summary"]["seconds"])]
    intro = ("What can an honest-but-curious federated-learning server reconstruct from a client's "
             "update? Each private image below was sent as one gradient; the server inverted it. "
             "The defenses add Gaussian noise to every gradient entry (gaussian:sigma) or first zero "
             "each entry with probability p (prune:p).")
    render_report(path, "leaklab image audit", summary=summary, intro=intro,
                  figures=[Figure("PSNR per defense", bars,
                                  "higher is more leakage; dashed lines: the constant-image baseline "
                                  "of each scenario (no information beyond the mean colour); black line: the "
                                  "cosine an update keeps with the true one (right axis)")],
                  sections=sections,
                  notice=sentences((QUICK_NOTICE,) if results["quick"] else ()))
