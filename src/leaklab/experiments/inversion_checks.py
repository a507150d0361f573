"""The reference checks of the inversion engine (issue 2 acceptance, seed 001 and the attacks it
generalises), each measured on real images and written beside its target.

* ``dlg``: DLG (L2 objective, L-BFGS) on the sigmoid LeNet, 32x32 photo crops, label by iDLG;
  target: PSNR >= 30 dB within 300 iterations (an iteration is one L-BFGS step of <= 20 inner
  iterations, as in DLG's code; evaluations are reported too).
* ``idlg``: iDLG label accuracy over 50 different images (target 100%).
* ``analytic``: exact first-layer recovery on an MLP, batch 1 (target >= 100 dB).
* ``ig``: Inverting Gradients (cosine + TV) on ConvNet width 64, batch 1, 32x32, untrained network,
  2,000 iterations (target >= 18 dB; breaching 0.1.2 reaches 14.0 dB after 1,000 on this machine).
  As in breaching's default case (the server provides public BatchNorm buffers), the client computes
  its gradient with BatchNorm in evaluation mode, i.e. with the running statistics. With batch
  statistics instead (``train_mode=True``), a batch-1 BatchNorm removes each channel's mean and scale,
  so brightness and contrast of the input are nearly unidentifiable; that harder case is reported by
  ``ig_batch_stats``.

Every image metric is recorded beside the no-information baseline (a constant image at the true
per-channel mean) in results.json, per image; the command's summary line prints it for IG.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from leaklab.attacks.inversion import InversionConfig, invert, recover_input, recover_labels
from leaklab.data import load_images
from leaklab.errors import LeaklabError
from leaklab.fl import fedsgd_update
from leaklab.io import INVERSION_CHECKS_FORMAT, RESULTS_FILE, check_out, make_out_dir, write_json
from leaklab.metrics import scores
from leaklab.models import ModelSpec, build_model
from leaklab.names import INVERSION_CHECK_NAMES
from leaklab.threat import make_view

TARGETS = {"dlg_psnr_min": 30.0, "idlg_accuracy": 1.0, "analytic_psnr_min": 100.0, "ig_psnr_mean": 18.0}

DLG_CONFIG = InversionConfig(objective="l2", optimizer="lbfgs", iterations=300, lr=1.0, priors={},
                             clamp=False)
IG_CONFIG = InversionConfig(objective="cosine", optimizer="adam", iterations=2000, lr=0.1,
                            schedule="cosine", priors={"tv": 0.2})

Progress = Callable[[str, int, int], None]


def _case(model: str, image_seed: int, width: int | None = None, train_mode: bool = True):
    batch = load_images("photos", 1, image_size=32, seed=image_seed)
    spec = ModelSpec(name=model, num_classes=batch.num_classes, in_channels=3, image_size=32,
                     width=width, mean=batch.mean, std=batch.std)
    net = build_model(spec, seed=image_seed)
    update = fedsgd_update(net, batch.images, batch.labels, train_mode=train_mode)
    return make_view(spec, net.state_dict(), update.metadata), update, batch


def _scores(images: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    scored = scores(images, truth)
    return {"psnr": float(scored["psnr"][0]), "psnr_baseline": float(scored["psnr_baseline"][0])}


def check_dlg(images: int, config: InversionConfig = DLG_CONFIG) -> dict:
    rows = []
    for seed in range(images):
        view, update, batch = _case("lenet", seed)
        rec = invert(view, update, config.model_copy(update={"seed": seed}))[0]
        rows.append({"image_seed": seed, **_scores(rec.images, batch.images),
                     "label_correct": rec.labels.tolist() == batch.labels.tolist(),
                     "iterations": rec.iterations, "evaluations": rec.evaluations,
                     "seconds": rec.seconds})
    return {"samples": rows, "psnr_mean": sum(r["psnr"] for r in rows) / len(rows),
            "psnr_min": min(r["psnr"] for r in rows)}


def check_idlg(images: int = 50) -> dict:
    correct = 0
    for seed in range(images):
        view, update, batch = _case("lenet", 1000 + seed)
        correct += int(recover_labels(view.model, update, 1).tolist() == batch.labels.tolist())
    return {"images": images, "correct": correct, "accuracy": correct / images}


def check_analytic(images: int) -> dict:
    rows = []
    for seed in range(images):
        view, update, batch = _case("mlp", seed)
        rows.append({"image_seed": seed, **_scores(recover_input(view, update).float(), batch.images)})
    return {"samples": rows, "psnr_min": min(r["psnr"] for r in rows)}


def check_ig(images: int, config: InversionConfig = IG_CONFIG, train_mode: bool = False) -> dict:
    rows = []
    for seed in range(images):
        view, update, batch = _case("convnet", seed, width=64, train_mode=train_mode)
        rec = invert(view, update, config.model_copy(update={"seed": seed}))[0]
        rows.append({"image_seed": seed, **_scores(rec.images, batch.images),
                     "iterations": rec.iterations, "seconds": rec.seconds,
                     "iterations_per_second": rec.iterations / rec.seconds})
    return {"samples": rows, "psnr_mean": sum(r["psnr"] for r in rows) / len(rows),
            "psnr_baseline_mean": sum(r["psnr_baseline"] for r in rows) / len(rows)}


def run(out: Path, quick: bool = False, checks: list[str] | None = None, images: int | None = None,
        progress: Progress | None = None) -> dict:
    """Run the checks (all but the slow ``ig_batch_stats`` by default), write ``out/results.json``."""
    checks = checks or ["dlg", "idlg", "analytic", "ig"]
    unknown = [name for name in checks if name not in INVERSION_CHECK_NAMES]
    if unknown:
        raise LeaklabError(f"unknown check {unknown[0]!r}; choose from {', '.join(INVERSION_CHECK_NAMES)}")
    if images is not None and images < 1:
        raise LeaklabError(f"--images must be at least 1 (got {images})")
    if images is not None and checks == ["idlg"]:  # it was ignored: iDLG's 50 images are its acceptance line
        raise LeaklabError("--images sets the dlg, analytic and ig checks' images; idlg always runs 50 "
                           "(5 with --quick)")
    n = images if images is not None else (1 if quick else 5)
    check_out(out, INVERSION_CHECKS_FORMAT)
    dlg_cfg = DLG_CONFIG.model_copy(update={"iterations": 20}) if quick else DLG_CONFIG
    ig_cfg = IG_CONFIG.model_copy(update={"iterations": 20}) if quick else IG_CONFIG
    jobs = {"dlg": lambda: check_dlg(n, dlg_cfg), "idlg": lambda: check_idlg(5 if quick else 50),
            "analytic": lambda: check_analytic(n), "ig": lambda: check_ig(1 if quick else min(n, 3), ig_cfg),
            "ig_batch_stats": lambda: check_ig(1 if quick else min(n, 3), ig_cfg, train_mode=True)}
    results: dict = {"format": INVERSION_CHECKS_FORMAT, "format_version": 1, "targets": TARGETS, "quick": quick,
                     "checks": {}}
    make_out_dir(out)
    write_json(out / RESULTS_FILE, results)  # no check yet: an earlier run's results would pass for this one's
    for i, name in enumerate(checks):
        if progress:
            progress(name, i, len(checks))
        start = time.perf_counter()
        results["checks"][name] = {**jobs[name](), "wall_seconds": time.perf_counter() - start}
        write_json(out / RESULTS_FILE, results)  # after each check: complete or not there
    if progress:
        progress("done", len(checks), len(checks))
    return results
