"""The reports of the room audit (``leaklab audit``) and of ``leaklab audit --cases``: the conclusion in
a sentence and an at-a-glance verdict per defense (:mod:`leaklab.experiments.room_verdicts`), originals
beside reconstructions with their boxes, metrics tables beside the baselines and the leakage per defense
(seed 000, section V's metrics).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.experiments import room_attack, room_verdicts
from leaklab.io import REPORT_FILE
from leaklab.metrics.rooms import matched
from leaklab.metrics.vectors import median_of
from leaklab.words import cosine_text, plural, sentences

NONE_UNREAD = " (none where an update showed nothing of the features above its noise)"
SHOWN_SAMPLES = 16  # the report pictures a cell's (or the cases') first samples; results.json has every row
Picture = tuple[torch.Tensor, torch.Tensor]  # a pictured state: its images [1, C, H, W] and the target's box [4]


def _action_text(row: dict[str, Any]) -> str:
    """The recovered action(s) of a case row, marked where the update did not hold them."""
    if row.get("no_signal"):
        return "none read (nothing the attack reads)"
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


def defense_text(row: dict[str, Any]) -> str:
    """A case's defense as the report names it: its chain, "withheld" where its view does not grant it (until
    session 54 named "none", and such a noised case was called undefended), else "none"."""
    return row["defense"] or ("withheld" if row.get("defense_withheld") else "none")


def held_actions(cases: list[dict[str, Any]]) -> list[float]:
    """The action read right (1 or 0, a batch's share) of the scored cases whose update holds it: QGI's, and
    RGI's whose every transition's return is not 0 (by the truth: behind noise the attack's own flag,
    ``action_identified``, passes the noise for the action); a case with nothing to read holds none."""
    return [r["metrics"]["action"] for r in cases
            if "metrics" in r and not r.get("no_signal") and r["metrics"].get("action_informative", 1.0) == 1.0]


def defended_kept(cases: list[dict[str, Any]]) -> float | None:
    """The median cosine the defended scored cases' updates keep with the true ones (None: none recorded)."""
    return median_of(r["metrics"].get("update_cosine") for r in cases if "metrics" in r and maybe_defended(r))


def maybe_defended(row: dict[str, Any]) -> bool:
    """Whether a case's update may be behind a defense: one it names, or one its view withholds."""
    return row["defense"] is not None or bool(row.get("defense_withheld"))


def features_read(row: dict[str, Any]) -> float | None:
    """The features a case's attack read off its update (``feature_cosine``): 0 where it read nothing (no signal:
    the median and the counts left such a case out, and named a whole read where 5 of 6 read nothing); None where
    it was not estimated (paper mode's batches of two)."""
    return 0.0 if row.get("no_signal") else row.get("feature_cosine")


def blind_features(cases: list[dict[str, Any]]) -> list[float]:
    """The features read (:func:`features_read`) off the updates of the cases without their truth."""
    return [read for r in cases if "metrics" not in r and (read := features_read(r)) is not None]


def write_cases_report(folder: Path, results: dict[str, Any], truths: list[Picture], pictures: list[Picture],
                        unscored: list[Picture], names: dict[str, list[str]]) -> None:
    """The report of ``audit --cases``: ``truths`` and ``pictures`` picture the first scored cases,
    ``unscored`` the first reconstructions of cases without their truth (``names``: of those cases)."""
    from leaklab.report.html import Section, Table, render_report

    s, attack = results["summary"], results["attack"]
    sections, lead = [], ""
    if s["scored"]:
        gains = [(s[f"{im}_psnr_mean"] - s[f"{im}_psnr_baseline_mean"], im) for im in ("rgb", "depth")
                 if s.get(f"{im}_psnr_mean") is not None]
        gain, where = max(gains) if gains else (None, None)  # none: no case's image scored (not finite)
        held = held_actions(results["cases"])
        room = room_verdicts.room_shown({r["case"]: [(r, r)] for r in results["cases"]}, modes=False)
        verdict = room_verdicts.verdict(room, s["iou_mean"], held, s.get("q_target_err_mean"),
                                        s.get("reward_abs_err_mean"))
        empty = sum(1 for r in results["cases"] if "metrics" in r and r.get("no_signal"))  # their errors undefined
        read = f" ({empty} of them with nothing to read)" if empty else ""
        lead = (f"Over {plural(s['scored'], 'scored case')}{read}, the saved updates give away "
                f"{'nothing measured' if verdict == room_verdicts.NOTHING_LEAKS else verdict.removeprefix('leaks ')}.")
        glance = Table(columns=["largest mean image gain (dB)", "where", "cases showing their room", "box IoU (mean)",
                                "action", "verdict"],
                       rows=[[gain, where, f"{room.shown} of {room.updates}", s["iou_mean"],
                              f"{100 * statistics.fmean(held):.0f}% of {plural(len(held), 'case')}" if held else None,
                              verdict]],
                       caption=room_verdicts.glance_caption() + " Over the scored cases; the action over those "
                                                                "whose update holds it (an RGI update with a return "
                                                                "of 0 does not).")
        sections.append(Section(title="At a glance", tables=[glance]))
    lead = " ".join(filter(None, (lead, room_verdicts.features_read_text(blind_features(results["cases"])))))
    figures = []
    if truths:
        figures += _case_figures(folder, [("original", truths), ("reconstructed", pictures)], names["scored"],
                                 "cases", "Originals and reconstructions",
                                 sentences(("green: the target's true box above, the recovered one below.",
                                             _shown(len(truths), s["scored"], "scored case"))))
    if unscored:
        figures += _case_figures(folder, [("reconstructed", unscored)], names["unscored"], "unscored",
                                 "Reconstructions of the cases without their truth",
                                 sentences(("green: the recovered box.",
                                             _shown(len(unscored), s["cases"] - s["scored"], "unscored case"))))

    def right(row: dict[str, Any]) -> str | None:
        if "metrics" not in row:
            return None
        return "yes" if row["metrics"]["action"] == 1 else "no" if row["metrics"]["action"] == 0 else \
            f"{100 * row['metrics']['action']:.0f}%"

    scores = [f"{im}_paper_{key}" for im in ("depth", "rgb")
              for key in ("psnr", "psnr_baseline", "ssim", "ssim_baseline")]
    columns = ["case", "attack", "setting", "defense", "update kept (cosine)", "features read (cosine, estimated)",
               "action", "action right", "box IoU",
               *(f"{name} {col}" for name in ("depth", "RGB") for col in ("PSNR (dB)", "baseline (dB)", "SSIM",
                                                                         "SSIM baseline")), "s"]
    table = Table(columns=columns, rows=[
        [r["case"], r["algorithm"].upper(), r["setting"], defense_text(r),
         cosine_text(r.get("metrics", {}).get("update_cosine")), cosine_text(features_read(r)),
         _action_text(r),
         right(r), *(r.get("metrics", {}).get(k) for k in ("box_iou", *scores)), r["seconds"]]
        for r in results["cases"]],
        caption="Metrics appear for cases whose truth.safetensors is present; PSNR/SSIM with the paper's "
                "normalisation, baseline: a constant image at the true mean. Update kept: the cosine of the "
                "update the case holds with the client's true one, as `leaklab env capture` recorded it (1 "
                "without a defense; blank where the truth does not record it). Features read: the cosine of "
                "the conv features read off the update in closed form with the client's, as the server "
                "estimates it from the update alone, so also for a case without its truth; "
                f"{room_verdicts.features_lines_text()}.")
    sections.append(Section(title="Cases", figures=figures, tables=[table]))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("cases", results["cases_dir"]),
               ("network", results["model_class"] or "leaklab's perception network (as the cases' views name it)"),
               ("attacks", f"{attack['mode']} mode, {attack['iterations']} image iterations each"
                           f"{NONE_UNREAD if images_unread(results['cases']) else ''}"),
               ("device", results["device"]), ("leaklab", results["versions"]["leaklab"]),
               ("torch", results["versions"]["torch"]),
               ("wall-clock seconds (reading the cases, attacks)", s["seconds"]),
               ("attacks resumed from an interrupted run", s["resumed_attacks"])]
    render_report(folder / REPORT_FILE, "leaklab audit of saved room updates", summary=summary,
                  notice=sentences((fallback_caveat(results), no_signal_caveat(results["cases"]),
                                     unread_images_caveat(results["cases"], "case"),
                                     effort_notice(attack["iterations"]),
                                     room_verdicts.noise_caveat([attack["mode"]],
                                                                [r["defense"] for r in results["cases"]],
                                                                cases=results["cases"]))),
                  lead=lead,
                  intro="Each saved client update was attacked from the server's files only (QGI for DQN "
                        "updates, RGI for REINFORCE updates).",
                  sections=sections)


def fallback_caveat(results: dict[str, Any]) -> str:
    """The caveat when exact mode could not read an undefended case in closed form and fell back to the
    paper's optimisation: a QGI batch whose two transitions share their action (their errors at the
    output are then one direction, which no closed form separates), a batch the closed forms could not split
    otherwise (an RGI batch with a zero return's partner whose head.0 fit was refused, supports nested or
    identical), or a network that computes what the closed forms do not model (e.g. a batch through a module
    other than Linear or ReLU in its head); "" when it read every such case."""
    if results["attack"]["mode"] != "exact":
        return ""
    missed = [r for r in results["cases"]
              if not maybe_defended(r) and not r.get("no_signal") and "features" not in r["exact"]]
    shared = [r["case"] for r in missed if r["algorithm"] == "qgi" and len(set(r["action"])) < len(r["action"])]
    other = [r["case"] for r in missed if r["case"] not in shared]
    reasons = []
    if shared:
        reasons.append(f"{_listed(shared, 'undefended QGI batch')} whose transitions share their action")
    if other:
        reasons.append(f"{_listed(other, 'undefended case')}, whose batch its closed forms could not split (one "
                       "sample's gradient near zero, or the samples' ReLU supports nested or identical) or whose "
                       "network computes what they do not model")
    if not reasons:
        return ""
    return (f"exact mode could not read {' and '.join(reasons)}, so the attack fell back to the paper's "
            "optimisation there; low scores there show a weaker attack, not a private update.")


def no_signal_caveat(rows: list[dict[str, Any]], noun: str = "case", key: str = "case") -> str:
    """The caveat when the attack read nothing off some rows' updates (an all-zero last bias gradient: a
    pruned or frozen head, an all-zero file; or a batch of two whose samples the last layer does not
    separate), each row named by its ``key``: they score the attack's no-information start, which says
    nothing about what the rest of the update holds; "" when every update was read."""
    empty = [str(r[key]) for r in rows if r.get("no_signal")]
    if not empty:
        return ""
    return (f"{_listed(empty, noun)} of {len(rows)} {'holds' if len(empty) == 1 else 'hold'} an "
            "update off which the attacks read nothing (its last bias gradient, which they read first, is all "
            "zero, as behind the heaviest pruning, or, in a batch of two, the last layer does not separate "
            "the samples, as where one sample's gradient is under the noise), so nothing was recovered there: "
            "their rows score the attack's no-information start, not what the rest of the update gives away.")


def unread_images_caveat(rows: list[dict[str, Any]], noun: str = "update") -> str:
    """The caveat when exact mode reconstructed no images from some of ``rows``' updates (exact-mode rows: paper mode
    always reconstructs): noise was all they showed of the conv features (their estimated cosine 0,
    ``attack._images_and_state``, exact method version 27), and their images are the no-information start at 0
    iterations; "" when there are none."""
    unread = images_unread(rows)
    if not unread:
        return ""
    return (f"{plural(len(unread), noun)} of {len(rows)} showed nothing of the conv features above the noise "
            "(estimated cosine 0), so exact mode reconstructed no images from them: their images are the attack's "
            "no-information start, the rest read off the update as elsewhere (in 202 attacks of such updates that "
            "did reconstruct the images, none showed its room: docs/reproductions.md, \"No image stage where the "
            "features read as noise\").")


def images_unread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose images exact mode did not reconstruct, their features read as noise alone (not ``no_signal``
    rows, which read nothing)."""
    return [r for r in rows if not r.get("no_signal") and r.get("feature_cosine") == 0 and r["iterations"] == 0]


def exact_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """An audit's exact-mode rows, each attacked update once (with ``--full`` paper mode attacks them again)."""
    return [r for c in results["cells"] if c["mode"] == "exact" for r in c["samples"]]


def _listed(cases: list[str], what: str) -> str:
    return f"{plural(len(cases), what)} ({', '.join(cases[:3])}{', ...' if len(cases) > 3 else ''})"


def true_picture(truth: dict[str, torch.Tensor]) -> Picture:
    """The first true state of an update as the reports picture it, with its box."""
    return truth["images"][:1], truth["box"][0].float()


def picture(rec, truth: dict[str, torch.Tensor] | None = None) -> Picture:
    """The reconstruction matched to the first true state (a batch has no order), with its recovered box;
    without a truth, the first reconstruction."""
    r = matched(rec.images, truth["images"])[0] if truth is not None else 0
    return rec.images[r:r + 1].detach().float().clamp(0, 1), rec.box[r].detach().float()


def _shown(pictured: int, total: int, what: str) -> str:
    """A figure's caption when it pictures only the first of its rows (:data:`SHOWN_SAMPLES`)."""
    return f"the first {pictured} of {total} {what}s; results.json has every one" if pictured < total else ""


def _leakage_plot(results: dict[str, Any], labels: list[str], path: Path) -> bytes:
    """PSNR gain over the constant-image baseline per defense (RGB and depth per attack) and, on the right
    axis, the cosine an update keeps behind each and that of the conv features read off it in closed form, as
    the server estimates it (each the median of the attacks' medians), and QGI's action accuracy over its updates
    (the leak that outlasts the images)."""
    from leaklab.report.plots import bar_plot

    series: dict[str, list[float | None]] = {}
    for cell in results["cells"]:
        key = f"{cell['algorithm'].upper()} {cell['setting']} {cell['mode']}"
        s = cell["summary"]
        for image in ("rgb", "depth"):
            if s.get(f"{image}_psnr_mean") is not None:
                gain = s[f"{image}_psnr_mean"] - s[f"{image}_psnr_baseline_mean"]
                series.setdefault(f"{key} {image}", [None] * len(labels))[labels.index(cell["defense"])] = gain
    kept, read = ([median_of(c["summary"].get(key) for c in results["cells"] if c["defense"] == label)
                   for label in labels] for key in ("update_cosine_median", "feature_cosine_median"))
    actions = [room_verdicts.qgi_actions([c for c in results["cells"] if c["defense"] == label]) for label in labels]
    return bar_plot(labels, series, path, ylabel="PSNR over baseline (dB)",
                    xlabel="defense (each family weakest first)",
                    title="Leakage per defense: reconstruction PSNR minus the constant-image baseline",
                    threshold=(room_verdicts.IMAGE_LEAK_DB, f"the room shows from +{room_verdicts.IMAGE_LEAK_DB:g} dB"),
                    lines={"update kept (cosine; right axis)": kept,
                           **({"features read (cosine, estimated; right axis)": read}
                              if any(r is not None for r in read) else {}),  # none: paper mode's batches of two
                           "QGI action accuracy (right axis)": [statistics.fmean(a) if a else None for a in actions]},
                    lines_label="cosine kept or read; action accuracy (chance 1/7)")


def effort_notice(iterations: int, after: str = "") -> str:
    """The warning (ending in ``after``) when the attacks ran fewer image iterations than their default:
    the reports', and the ``leaklab attack`` and ``leaklab audit`` commands' ``warning:`` lines."""
    full = RoomAttackConfig.model_fields["iterations"].default
    return (f"these attacks ran {iterations} image iterations, fewer than the {full} they take by default: the "
            f"reconstructions and their scores understate what the updates leak.{after}"
            if iterations < full else "")


def _trained_words(config: dict[str, Any]) -> str:
    """Which network the audit's clients send gradients of (``train_steps``: 0 in results written before
    audits could train it)."""
    steps = config.get("train_steps", 0)
    return f"after {plural(steps, 'environment step')} of DQN or REINFORCE training" if steps else "as initialised"


def _cell_table(meta: dict[str, str], images: tuple[str, ...], labels: list[str], by: dict) -> Any:
    """One attack's metrics under every defense: each image score beside its constant baseline, the
    box, the action, the Q-value (QGI) or reward (RGI) error, the cosine an update keeps with the true
    one (a median) and the time per sample."""
    from leaklab.report.html import Table

    names = {"rgb": "RGB", "depth": "depth"}
    columns = ["defense"] + [f"{names[im]} {col}" for im in images for col in
                             ("PSNR (dB)", "baseline (dB)", "SSIM", "SSIM baseline")]
    qgi = meta["algorithm"] == "qgi"
    columns += ["box IoU", "action", "target-Q error (%)" if qgi else "reward error (absolute)", "update kept (cosine)",
                "features read (cosine, estimated)", "s per sample"]
    rows = []
    for label in labels:
        cell = by[(meta["algorithm"], meta["setting"], meta["mode"], label)]
        s = cell["summary"]
        row = [label] + [s.get(f"{im}_{key}") for im in images for key in
                         ("psnr_mean", "psnr_baseline_mean", "ssim_mean", "ssim_baseline_mean")]
        error = s.get("q_target_err_mean" if qgi else "reward_abs_err_mean")
        row += [s.get("iou_mean"), room_attack.action_share(s, cell["defense_chain"] is not None),
                None if error is None else f"{error:.3g}",
                cosine_text(s.get("update_cosine_median")), cosine_text(s.get("feature_cosine_median")),
                s.get("seconds_per_sample")]
        rows.append(row)
    normalised = ("the Y channel (RGB) and on depth, with the paper's normalisation (the reconstruction's "
                  "brightest RGB pixel scaled to white, its depth by the same factor)" if "rgb" in images else
                  "depth (S2 has no RGB image, so the paper's normalisation leaves it as it is)")
    return Table(columns=columns, rows=rows,
                 caption="Baseline: a constant image at the true mean, what an attacker gets with no information; "
                         "a PSNR well above it means the update shows the room (SSIM too, though a smooth depth "
                         f"image's constant already scores a high SSIM). PSNR and SSIM on {normalised}. Means over "
                         "the samples but for the two cosines, medians; the picture above gives "
                         "each one's PSNR as drawn (raw) and, in brackets, its gain over its own baseline. Features "
                         "read: the cosine of the conv features read off the update in closed form with the client's, "
                         "as the server estimates it from the update alone.")


def write_report(folder: Path, results: dict[str, Any], cells, defenses, truths, pictures) -> None:
    from leaklab.report.html import Figure, Section, Table, render_report
    from leaklab.report.plots import image_grid

    labels = [label for label, _ in defenses]
    plot = _leakage_plot(results, labels, folder / "figures" / "leakage_per_defense.png")
    by = {(c["algorithm"], c["setting"], c["mode"], c["defense"]): c for c in results["cells"]}
    glance = Table(columns=list(room_verdicts.GLANCE_COLUMNS), rows=room_verdicts.verdicts(results),
                   caption=room_verdicts.glance_caption() + " Update kept: the cosine of the update the server "
                   "receives with the client's true one, the median over the updates (the attacks' range where they "
                   "differ), 1 when nothing changes: a measure of what the defense costs the training. An update "
                   "whose own gradient is small (a TD error or a REINFORCE return near 0) drowns in weak noise; a "
                   "server that averages K updates of one direction lifts a small cosine about √K-fold at best. "
                   "Features read: the cosine of the conv features read off an update in closed form with the "
                   "client's, as the server estimates it without the truth (the median over the updates): "
                   f"near 1 the image stage has the room's features to work from, near 0 nothing: "
                   f"{room_verdicts.features_lines_text()}. The "
                   "action column is QGI's (p: the chance that guessing one of the 7 actions at random would name as "
                   "many right or more): RGI's is left out of the verdict, as a REINFORCE update whose return is 0 "
                   "holds no trace of the action and under noise RGI's rule reads the noise; the per-attack tables "
                   "show it." + (" Exact and paper mode attack the same updates: each update counts once, "
                                 "showing its room when either reconstruction shows it."
                                 if room_verdicts.several_modes(results["cells"]) else ""))
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
                captions.append([room_attack.picture_caption(r["metrics"], image)
                                 for r in cell["samples"][:SHOWN_SAMPLES]])
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
    iterations = sorted({run_config.attack.iterations for _, run_config in cells})  # as asked (an attack that
    # read nothing, or no features, reports 0)
    rooms = sorted(set(cells[0][1].layouts or ()))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("device", results["device"]),
               ("leaklab", results["versions"]["leaklab"]), ("torch", results["versions"]["torch"]),
               ("network", f"{config['arch']}, {_trained_words(config)}"), ("seed", config["seed"]),
               ("attacks", f"{' and '.join(config['modes'])} mode, {'/'.join(map(str, iterations))} image iterations "
                           f"each{NONE_UNREAD if images_unread(exact_rows(results)) else ''}; "
                           f"{plural(config['samples'], 'sample')} per cell from {plural(len(rooms), 'room')}"),
               ("rooms", ", ".join(rooms)),
               ("wall-clock seconds (captures, attacks)", results["summary"]["seconds"]),
               ("attacks resumed from an interrupted run", results["summary"]["resumed_attacks"])]
    notice = sentences((effort_notice(iterations[0], " Rerun without --quick or --iterations for the audit's "
                                                      "verdicts."),
                         room_verdicts.noise_caveat(config["modes"], [chain for _, chain in defenses]),
                         unread_images_caveat(exact_rows(results))))
    intro = ("Can an honest-but-curious federated-learning server (one that follows the protocol but studies "
             "what it receives) see a robot's private room? Robots training an active-perception policy in "
             "ViZDoom rooms share one gradient per step; the server inverts it (the paper \"Your Room is not "
             "Private\": QGI against DQN clients, RGI against REINFORCE clients). Each attacked update is one "
             f"transition's gradient of the network {_trained_words(config)}"
             + (", the case the paper attacks (`--train-steps N` audits a partly trained one, whose larger "
                "updates the same noise hides less)" if not config.get("train_steps") else
                " (each algorithm and setting trains its own)") + ". Defenses: Gaussian noise "
             "on every gradient entry, and one DP-SGD step (clip to norm 1, then Gaussian noise calibrated to "
             "ε at δ = 1e-5 for that one step: a training run of many steps spends a larger ε); `leaklab audit "
             "--sigmas … --epsilons …` audits other levels. "
             "S1: the robot sees RGB, depth and the target's box; S2: depth and the box. Exact mode: "
             "leaklab's attack, which reads every linear layer's input in closed form before it reconstructs "
             "the images (on a noised update its closed forms read noisy values, and the image stage leaves "
             "out the terms that need an exact update; where the update shows nothing of the features above its "
             "noise it reconstructs none). Baseline: a constant image at the true mean, what an "
             "attacker with no information scores; the gain over it is what the update gave away.")
    sentence = room_verdicts.conclusion(room_verdicts.verdicts(results))
    lead = " ".join(filter(None, (f"{sentence} ({plural(config['samples'], 'sample')} per attack and defense.)",
                                  room_verdicts.levels_text(results["summary"]))))
    render_report(folder / REPORT_FILE, "leaklab audit: your room through federated RL updates",
                  summary=summary, intro=intro, notice=notice, lead=lead,
                  figures=[Figure("Leakage per defense", plot, "bars: PSNR (with the paper's normalisation) "
                                  "minus the constant-image baseline, a mean over the samples; from "
                                  f"{room_verdicts.IMAGE_LEAK_DB:g} dB (the dotted line) an image shows its room, "
                                  "below 0 the reconstruction is worse than a constant guess; "
                                  "lines (right axis): the cosine an update keeps with the true one (what the "
                                  "defense costs) and the cosine of the conv features read off it, estimated "
                                  "without the truth (what it lets through), each the median of the attacks' "
                                  "medians, and QGI's action accuracy (chance: 1 in 7)")],
                  sections=sections)
