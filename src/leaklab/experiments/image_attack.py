"""Attack a captured case and evaluate the reconstructions against the client's truth.

``run(case_dir, out, method, config)`` (``leaklab attack inversion|analytic|features --case``) reads only the
server's files of the case (:func:`leaklab.cases.load_case`), attacks every update, and only then reads
``truth.safetensors`` (when present) to score the reconstructions. ``run_oneshot`` captures into
``out/case`` first. Both write ``out/results.json``, ``out/reconstructions.png`` (originals above
reconstructions when the truth exists) and ``out/reconstructions.safetensors``, atomically.

Scoring (see :mod:`leaklab.metrics`): per image PSNR and SSIM against the truth, and the PSNR of the
no-information baseline (a constant image at the true image's per-channel mean). A batch
reconstruction has no order: images are matched to the truth by :func:`~leaklab.metrics.match_order`
and labels are compared as multisets.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import torch

from leaklab.attacks.inversion import (FeatureInversionConfig, InversionConfig, Reconstruction, feature_attack, invert,
                                       recover_input, recover_labels)
from leaklab.data import load_images
from leaklab.device import default_device, describe, versions
from leaklab.errors import LeaklabError, NoSignal
from leaklab.experiments import ProgressFn
from leaklab.experiments import capture as capture_mod
from leaklab.cases import Case, load_case, load_truth
from leaklab.io import (CASE_SUBDIR, IMAGE_ATTACK_FORMAT, RECONSTRUCTIONS_FILE, RESULTS_FILE, atomic_dir, save_tensors,
                        write_json)
from leaklab.metrics import match_order, psnr, scores
from leaklab.metrics.vectors import mean_of, median_of

Method = Literal["inversion", "analytic", "features"]
AttackConfig = InversionConfig | FeatureInversionConfig  # of the inversion and the features attack

PNG_FILE = "reconstructions.png"
TOGETHER = 16  # updates optimised together (batched) by one inversion call

# DLG's settings for L-BFGS (Zhu et al. 2019): step size 1 and no image prior, unless given.
_LBFGS_DEFAULTS = {"lr": 1.0, "priors": {}}


def inversion_config(base: dict[str, Any] | None = None, **fields: Any) -> InversionConfig:
    """An :class:`InversionConfig` from ``base`` (e.g. a YAML file) overridden by ``fields``
    (``None`` means "not given"); ``priors`` prior by prior: the weights given replace those of ``base``, or the
    defaults, of the priors they name (a weight of 0 removes one), the others stay (``--prior range=0.5`` had
    dropped the default TV prior, ``--tv`` a file's range prior).

    With ``optimizer="lbfgs"`` the learning rate defaults to 1 and the priors to none (DLG), unless
    they are given.
    """
    given = {**(base or {}), **{k: v for k, v in fields.items() if v is not None and k != "priors"}}
    if given.get("optimizer") == "lbfgs":
        given = {**_LBFGS_DEFAULTS, **given}
    if fields.get("priors") is not None:
        given["priors"] = {**given.get("priors", InversionConfig().priors), **fields["priors"]}
    return InversionConfig(**given)


def parse_priors(items: list[str] | None, tv: float | None = None) -> dict[str, float] | None:
    """``["tv=0.2", "l2=0.01"]`` (and ``tv``) as a prior-weight mapping; None when nothing is given."""
    if not items and tv is None:
        return None
    priors: dict[str, float] = {}
    for item in items or []:
        for part in item.split(","):
            name, sep, value = part.strip().partition("=")
            try:
                if not sep:
                    raise ValueError
                weight = float(value)
            except ValueError:
                raise LeaklabError(f"--prior {part.strip()!r} must look like NAME=WEIGHT, e.g. tv=0.2") from None
            if name.strip() in priors:  # a second weight silently replaced the first
                raise LeaklabError(f"--prior names {name.strip()!r} twice; give each prior one weight")
            priors[name.strip()] = weight
    if tv is not None:
        if "tv" in priors:
            raise LeaklabError("--tv and --prior tv=... both weigh the TV prior; give one")
        priors["tv"] = tv
    return priors


# --------------------------------------------------------------------------------------------
# attacking


def attack(case: Case, method: Method, config: AttackConfig | None = None,
           progress: ProgressFn | None = None, device: torch.device | None = None) -> list[Reconstruction]:
    """One reconstruction per update of ``case``, in order. Sees only the server's view."""
    if method == "analytic":
        return _analytic(case, progress)
    if method == "features":
        return _features(case, config or FeatureInversionConfig(), progress, device or default_device())
    if method != "inversion":
        raise LeaklabError(f"unknown attack {method!r}; choose inversion, analytic or features")
    config = config or InversionConfig()
    device = device or default_device()
    n = len(case.updates)
    # one update at a time with known labels (a view holds one update's) and with L-BFGS (which runs its
    # instances one after the other anyway: optimize.InversionLoop._lbfgs; each chunk draws its own start)
    alone = config.optimizer == "lbfgs" or any(y is not None for y in case.labels)
    step = 1 if alone else TOGETHER
    chunks = [list(range(s, min(n, s + step))) for s in range(0, n, step)]
    total = config.iterations * len(chunks)
    out: list[Reconstruction] = []
    if progress:  # the bar and its clock start with the attack, not at its first report
        progress("inversion", 0, total)
    for k, idx in enumerate(chunks):
        cfg = config.model_copy(update={"seed": config.seed + k})

        def report(it: int, _loss: float, k: int = k) -> None:
            if progress:
                progress("inversion", k * config.iterations + it, total)

        out += invert(case.view_for(idx[0]), [case.updates[i] for i in idx], cfg, progress=report,
                      device=device)
        if progress:
            progress("inversion", (k + 1) * config.iterations, total)
    return out


def _analytic(case: Case, progress: ProgressFn | None) -> list[Reconstruction]:
    out = []
    for i, update in enumerate(case.updates):
        start = time.perf_counter()
        view = case.view_for(i)
        try:
            image = recover_input(view, update)
        except NoSignal as e:  # which of the updates: the others may be readable (a defense's pruning, a dead unit)
            raise LeaklabError(f"update {i} of {len(case.updates)}: {e}") from None
        labels = view.labels if view.labels is not None else \
            recover_labels(view.model, update, update.metadata.batch_size)
        out.append(Reconstruction(images=image.clamp(0, 1), labels=labels.cpu(), loss=0.0,
                                  iterations=0, evaluations=1, seconds=time.perf_counter() - start))
        if progress:
            progress("analytic", i + 1, len(case.updates))
    return out


def _features(case: Case, config: FeatureInversionConfig, progress: ProgressFn | None,
              device: torch.device) -> list[Reconstruction]:
    """Seed 004's two-step attack on each update (:func:`~leaklab.attacks.inversion.feature_attack`)."""
    out, total = [], config.iterations * len(case.updates)
    for i, update in enumerate(case.updates):
        def report(it: int, _total: int, i: int = i) -> None:
            if progress:
                progress("features", i * config.iterations + it, total)

        rec = feature_attack(case.view_for(i), update, config.model_copy(update={"seed": config.seed + i}),
                             progress=report, device=device)
        out.append(Reconstruction(images=rec.images, labels=rec.labels.cpu(), loss=float(rec.loss.mean()),
                                  iterations=config.iterations, evaluations=config.iterations * config.restarts,
                                  seconds=rec.seconds))
    return out


# --------------------------------------------------------------------------------------------
# scoring


def _label_hits(recovered: list[int], true: list[int]) -> list[bool]:
    """Per true label: whether the recovered multiset still holds it (a batch has no order)."""
    pool = Counter(recovered)
    hits = []
    for y in true:
        hits.append(pool[y] > 0)
        if pool[y] > 0:
            pool[y] -= 1
    return hits


def evaluate(case: Case, recons: list[Reconstruction],
             truth: tuple[torch.Tensor, torch.Tensor, dict] | None,
             ) -> tuple[dict[str, Any], list[dict[str, Any]], torch.Tensor, torch.Tensor]:
    """Summary, per-image samples, and the reconstructed images and labels in the truth's order."""
    b = case.view.metadata.batch_size
    samples, images, labels = [], [], []
    kept = truth[2].get("update_cosine") if truth is not None else None  # one per update, as load_truth checked
    for u, rec in enumerate(recons):
        rec_images, rec_labels = rec.images.detach().float().cpu(), rec.labels.cpu().long()
        if truth is None:
            for j in range(len(rec_images)):
                samples.append({"index": u * b + j, "update": u, "label": int(rec_labels[j])})
            images.append(rec_images)
            labels.append(rec_labels)
            continue
        t_images, t_labels = truth[0][u * b:(u + 1) * b], truth[1][u * b:(u + 1) * b]
        perm = match_order(rec_images, t_images)
        matched = rec_images[perm]
        scored, p_y = scores(matched, t_images), psnr(matched, t_images, channel="y")
        if b == 1:
            hits = [int(rec_labels[0]) == int(t_labels[0])]
        else:
            hits = _label_hits(rec_labels.tolist(), t_labels.tolist())
        for j in range(b):
            samples.append({"index": u * b + j, "update": u, "psnr": float(scored["psnr"][j]), "psnr_y": float(p_y[j]),
                            "ssim": float(scored["ssim"][j]), "psnr_baseline": float(scored["psnr_baseline"][j]),
                            "ssim_baseline": float(scored["ssim_baseline"][j]), "label": int(rec_labels[perm[j]]),
                            "label_true": int(t_labels[j]), "label_correct": bool(hits[j]),
                            **({"update_cosine": kept[u]} if kept else {})})
        images.append(matched)
        labels.append(rec_labels[perm])
    seconds = sum(r.seconds for r in _unique_runs(recons))
    summary: dict[str, Any] = {
        "images": len(samples), "updates": len(recons), "batch_size": b,
        "psnr_mean": mean_of([s.get("psnr") for s in samples]),
        "psnr_y_mean": mean_of([s.get("psnr_y") for s in samples]),
        "ssim_mean": mean_of([s.get("ssim") for s in samples]),
        "psnr_baseline_mean": mean_of([s.get("psnr_baseline") for s in samples]),
        "ssim_baseline_mean": mean_of([s.get("ssim_baseline") for s in samples]),
        "label_accuracy": mean_of([float(s["label_correct"]) for s in samples if "label_correct" in s]),
        "seconds": seconds,
        "iterations": max((r.iterations for r in recons), default=0),
        "truth": truth is not None,
    }
    if kept:  # what the defense left of the updates, as the capture recorded it (a median, as the rooms')
        summary["update_cosine_median"] = median_of(kept)
    return summary, samples, torch.cat(images), torch.cat(labels)


def _unique_runs(recons: list[Reconstruction]) -> list[Reconstruction]:
    """Updates attacked together share one optimisation: count its time once."""
    seen, out = set(), []
    for r in recons:
        key = (id(r.history), r.seconds) if r.history else (id(r), r.seconds)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


# --------------------------------------------------------------------------------------------
# files


def _attack_and_write(case: Case, case_ref: str, out: Path, method: Method,
                      config: AttackConfig | None, progress: ProgressFn | None,
                      capture_config: dict | None = None) -> dict[str, Any]:
    truth = load_truth(case.folder, case)  # checked before the attack (a bad file fails in seconds), never handed to it
    device = torch.device("cpu") if method == "analytic" else default_device()
    start = time.perf_counter()
    recons = attack(case, method, config, progress=progress, device=device)
    wall = time.perf_counter() - start
    summary, samples, images, labels = evaluate(case, recons, truth)
    summary["wall_seconds"] = wall
    provenance = truth[2] if truth is not None else {}
    view = case.view
    results = {
        "format": IMAGE_ATTACK_FORMAT, "format_version": 1,
        "attack": method,
        "case": case_ref,
        "summary": summary,
        "samples": samples,
        "config": {
            "attack": method,
            "inversion": config.model_dump(mode="json") if method == "inversion" and config else None,
            **({"features": config.model_dump(mode="json")} if method == "features" and config else {}),
            "capture": capture_config or provenance.get("capture"),
        },
        "view": {"model": view.spec.model_dump(mode="json"),
                 "metadata": view.metadata.model_dump(mode="json"),
                 "capabilities": view.capabilities.model_dump(mode="json"),
                 "defense": view.defense, "updates": len(case.updates)},
        "versions": versions(),
        "device": describe(device),
    }
    save_tensors(out / RECONSTRUCTIONS_FILE, {"images": images, "labels": labels},
                 {"format": "leaklab.reconstructions"})
    from leaklab.report.plots import image_grid

    if truth is not None:
        captions = [None, [f"{s['psnr']:.1f} dB" for s in samples]]
        rows = [("original", truth[0]), ("reconstruction", images)]
    else:
        captions, rows = None, [("reconstruction", images)]
    capture = results["config"]["capture"]  # the client's defenses where the truth records them, else the view's
    defended = capture_mod.defenses_text(capture) if capture else view.defense
    title = f"{method}" + (f" ({config.objective}, {config.optimizer})" if method == "inversion" and config
                           else "") + f" on {view.spec.name}, defense {defended or 'none'}"
    image_grid(rows, out / PNG_FILE, captions=captions, title=title)
    write_json(out / RESULTS_FILE, results)
    return results


def _default_config(method: Method, config: AttackConfig | None) -> AttackConfig | None:
    if config is None and method in ("inversion", "features"):
        return InversionConfig() if method == "inversion" else FeatureInversionConfig()
    return config


def run(case_dir: Path, out: Path, method: Method = "inversion", config: AttackConfig | None = None,
        progress: ProgressFn | None = None) -> dict[str, Any]:
    """``leaklab attack METHOD --case CASE --out OUT``: the results dict, also written to ``out``."""
    case = load_case(case_dir)
    config = _default_config(method, config)
    with atomic_dir(out, IMAGE_ATTACK_FORMAT, inputs=[case_dir]) as tmp:
        return _attack_and_write(case, str(Path(case_dir)), tmp, method, config, progress)


def run_oneshot(capture_config: capture_mod.CaptureConfig, out: Path, method: Method = "inversion",
                config: AttackConfig | None = None,
                progress: ProgressFn | None = None) -> dict[str, Any]:
    """Capture into ``out/case``, then attack it as :func:`run` does; one atomic output folder."""
    config = _default_config(method, config)
    if method == "features":  # what the attack would refuse, refused before the capture trains
        if capture_config.bn_stats == "batch" and capture_mod.has_batchnorm(capture_config):
            raise LeaklabError(f"{capture_config.model} normalises with BatchNorm: the features attack needs the "
                               "client on the running statistics (--bn-stats running), not the batch's")
        classes = load_images(capture_config.data, 1, capture_config.image_size).num_classes
        if not capture_config.knows_labels and capture_config.batch_size > classes:
            raise LeaklabError(f"{capture_config.data} has {classes} classes: the features attack reads a batch of "
                               f"distinct labels, at most {classes} images (or grant them: --knows-labels)")
    with atomic_dir(out, IMAGE_ATTACK_FORMAT) as tmp:
        result = capture_mod.capture(capture_config, progress)
        capture_mod.write(result, tmp / CASE_SUBDIR)
        case = load_case(tmp / CASE_SUBDIR)
        return _attack_and_write(case, str(Path(out) / CASE_SUBDIR), tmp, method, config, progress,
                                 capture_config=capture_config.model_dump(mode="json"))
