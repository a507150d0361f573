"""The reports of the room audit (``leaklab audit``) and of ``leaklab audit --cases``: the conclusion in
a sentence, an at-a-glance verdict per defense (what leaks: the room at a mean gain of
:data:`IMAGE_LEAK_DB` over the constant-image baseline, the box at a mean IoU of :data:`BOX_LEAK_IOU`,
the action at :data:`ACTION_LEAK` or beyond chance, :data:`ACTION_CHANCE_P`), originals beside
reconstructions with their boxes, metrics tables beside the baselines and the leakage per defense (seed
000, section V's metrics).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from scipy.stats import binom

from leaklab.attacks.rl import RoomAttackConfig
from leaklab.experiments import room_attack
from leaklab.experiments.audit_levels import leaks_stop_text, next_levels_text
from leaklab.fields import defense_steps
from leaklab.io import REPORT_FILE
from leaklab.metrics.rooms import matched
from leaklab.metrics.vectors import median_of
from leaklab.rl.envs.active_perception import ACTIONS
from leaklab.words import cosine_text, listing, plural

IMAGE_LEAK_DB = 3.0  # verdict: images leak when their PSNR beats the no-information baseline by this
BOX_LEAK_IOU = 0.5  # verdict: the target's box leaks at this mean IoU (the usual detection threshold)
ACTION_LEAK = 0.5  # verdict: QGI's action leaks at this accuracy (chance: 1 in 7), or when
ACTION_CHANCE_P = 0.05  # guessing would name as many right with a lower probability (e.g. 21 of 96 right)
Q_LEAK_PERCENT = 1.0  # verdict: the target Q-value leaks read to this error (seed 000's QGI: about 1%)
REWARD_LEAK = 0.01  # verdict: the reward (RGI reads the discounted return that weights log π) leaks read to
# this absolute error, 1% of the most one step earns
SHOWN_SAMPLES = 16  # the report pictures a cell's (or the cases') first samples; results.json has every row
Picture = tuple[torch.Tensor, torch.Tensor]  # a pictured state: its images [1, C, H, W] and the target's box [4]


def _action_text(row: dict[str, Any]) -> str:
    """The recovered action(s) of a case row, marked where the update did not hold them."""
    if row.get("no_signal"):
        return "none read (no gradient the attack reads)"
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
        gain, where = max(gains)
        # the action of the cases whose update holds it (QGI always; RGI unless a return of 0 hid it)
        held = [r["metrics"]["action"] for r in results["cases"]
                if "metrics" in r and not r.get("no_signal") and all(r.get("action_identified", [True]))]
        room = _room_shown(((r["case"], r, r) for r in results["cases"]), modes=False)
        verdict = _verdict(room, s["iou_mean"], held, s.get("q_target_err_mean"), s.get("reward_abs_err_mean"))
        lead = (f"Over {plural(s['scored'], 'scored case')}, the saved updates give away "
                f"{verdict.removeprefix('leaks ') if verdict != NOTHING_LEAKS else 'nothing measured'}.")
        glance = Table(columns=["largest mean image gain (dB)", "where", "cases showing their room", "box IoU (mean)",
                                "action", "verdict"],
                       rows=[[gain, where, f"{room.shown} of {room.updates}", s["iou_mean"],
                              f"{100 * statistics.fmean(held):.0f}% of {plural(len(held), 'case')}" if held else None,
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
    columns = ["case", "attack", "setting", "defense", "update kept (cosine)", "action", "action right", "box IoU",
               *(f"{name} {col}" for name in ("depth", "RGB") for col in ("PSNR (dB)", "baseline (dB)", "SSIM",
                                                                         "SSIM baseline")), "s"]
    table = Table(columns=columns, rows=[
        [r["case"], r["algorithm"].upper(), r["setting"], r["defense"] or "none",
         cosine_text(r.get("metrics", {}).get("update_cosine")), _action_text(r),
         right(r), *(r.get("metrics", {}).get(k) for k in ("box_iou", *scores)), r["seconds"]]
        for r in results["cases"]],
        caption="Metrics appear for cases whose truth.safetensors is present; PSNR/SSIM with the paper's "
                "normalisation, baseline: a constant image at the true mean. Update kept: the cosine of the "
                "update the case holds with the client's true one, as `leaklab env capture` recorded it (1 "
                "without a defense; blank where the truth does not record it).")
    sections.append(Section(title="Cases", figures=figures, tables=[table]))
    summary = [("generated", time.strftime("%Y-%m-%d %H:%M:%S")), ("cases", results["cases_dir"]),
               ("network", results["model_class"] or "leaklab's perception network (as the cases' views name it)"),
               ("attacks", f"{attack['mode']} mode, {attack['iterations']} image iterations each"),
               ("device", results["device"]), ("leaklab", results["versions"]["leaklab"]),
               ("torch", results["versions"]["torch"]), ("wall-clock seconds", s["seconds"]),
               ("attacks resumed from an interrupted run", s["resumed_attacks"])]
    render_report(folder / REPORT_FILE, "leaklab audit of saved room updates", summary=summary,
                  notice=" ".join(filter(None, (fallback_caveat(results), no_signal_caveat(results["cases"]),
                                                effort_notice(attack["iterations"])))),
                  lead=lead,
                  intro="Each saved client update was attacked from the server's files only (QGI for DQN "
                        "updates, RGI for REINFORCE updates).",
                  sections=sections)


def fallback_caveat(results: dict[str, Any]) -> str:
    """The caveat when exact mode could not read an undefended case in closed form and fell back to the
    paper's optimisation: a QGI batch whose two transitions share their action (their errors at the
    output are then one direction, which no closed form separates), or a network that computes what
    the closed forms do not model (e.g. a batch through a module other than Linear or ReLU in its
    head); "" when it read every such case."""
    if results["attack"]["mode"] != "exact":
        return ""
    missed = [r for r in results["cases"]
              if r["defense"] is None and not r.get("no_signal") and "features" not in r["exact"]]
    shared = [r["case"] for r in missed if r["algorithm"] == "qgi" and len(set(r["action"])) < len(r["action"])]
    other = [r["case"] for r in missed if r["case"] not in shared]
    reasons = []
    if shared:
        reasons.append(f"{_listed(shared, 'undefended QGI batch')} whose transitions share their action")
    if other:
        reasons.append(f"{_listed(other, 'undefended case')}, whose network computes what its closed forms do "
                       "not model")
    if not reasons:
        return ""
    return (f"exact mode could not read {' and '.join(reasons)}, so the attack fell back to the paper's "
            "optimisation there; low scores there show a weaker attack, not a private update.")


def no_signal_caveat(rows: list[dict[str, Any]], noun: str = "case", key: str = "case") -> str:
    """The caveat when some rows' updates lack the gradient the attack reads (an all-zero last bias
    gradient: a pruned or frozen head, an all-zero file), each row named by its ``key``: they score the
    attack's no-information start, which says nothing about what the rest of the update holds; "" when
    every update had it."""
    empty = [str(r[key]) for r in rows if r.get("no_signal")]
    if not empty:
        return ""
    return (f"{_listed(empty, noun)} of {len(rows)} {'holds' if len(empty) == 1 else 'hold'} an "
            "update whose last bias gradient is all zero, which the attacks read first, so nothing was recovered "
            "there: their rows score the attack's no-information start, not what the rest of the update gives "
            "away.")


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
    axis, the cosine an update keeps behind each (the median of the attacks' medians) and QGI's action
    accuracy over its updates (the leak that outlasts the images)."""
    from leaklab.report.plots import bar_plot

    series: dict[str, list[float | None]] = {}
    for cell in results["cells"]:
        key = f"{cell['algorithm'].upper()} {cell['setting']} {cell['mode']}"
        s = cell["summary"]
        for image in ("rgb", "depth"):
            if s.get(f"{image}_psnr_mean") is not None:
                gain = s[f"{image}_psnr_mean"] - s[f"{image}_psnr_baseline_mean"]
                series.setdefault(f"{key} {image}", [None] * len(labels))[labels.index(cell["defense"])] = gain
    kept = [median_of(c["summary"].get("update_cosine_median") for c in results["cells"] if c["defense"] == label)
            for label in labels]
    actions = [_qgi_actions([c for c in results["cells"] if c["defense"] == label]) for label in labels]
    return bar_plot(labels, series, path, ylabel="PSNR over baseline (dB)", xlabel="defense, weakest first",
                    title="Leakage per defense: reconstruction PSNR minus the constant-image baseline",
                    threshold=(IMAGE_LEAK_DB, f"the room shows from +{IMAGE_LEAK_DB:g} dB"),
                    lines={"update kept (cosine; right axis)": kept,
                           "QGI action accuracy (right axis)": [statistics.fmean(a) if a else None for a in actions]},
                    lines_label="cosine kept; action accuracy (chance 1/7)")


def _updates(cells: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """The rows of ``cells`` grouped by the update they attacked: an audit that runs several modes
    (``--full``) attacks each capture's defended updates once per mode, and an update counts once."""
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for c in cells:
        for r in c["samples"]:
            grouped.setdefault(_update_key(c, r), []).append(r)
    return grouped


def _update_key(cell: dict[str, Any], row: dict[str, Any]) -> tuple[str, str, int]:
    """The update an audit's attack (``row`` of ``cell``) attacked: the same in every mode."""
    return cell["algorithm"], cell["setting"], row["index"]


def _several_modes(cells: list[dict[str, Any]]) -> bool:
    """Whether ``cells`` hold more than one mode's attacks (``--full``: exact and paper on the same updates)."""
    return len({c["mode"] for c in cells}) > 1


def _qgi_actions(cells: list[dict[str, Any]]) -> list[float]:
    """Whether QGI read each of its attacked updates' action right (1 or 0; a batch's share; the mean over the
    modes that attacked it, which read it by the same rule), over ``cells``: the verdicts' and the leakage
    plot's action (RGI's is left out: a REINFORCE update whose return is 0 holds no trace of its action, and
    under noise RGI's rule reads the noise)."""
    return [statistics.fmean(r["metrics"]["action"] for r in rows)
            for (algorithm, _, _), rows in _updates(cells).items() if algorithm == "qgi"]


def _chance_p(actions: list[float]) -> float | None:
    """The chance that guessing one of the room's actions at random names as many of ``actions`` (1 or 0
    per update) right or more (a binomial tail); None for a batch's shares, which are no count."""
    if not actions or any(a not in (0.0, 1.0) for a in actions):
        return None
    return float(binom.sf(int(sum(actions)) - 1, len(actions), 1 / len(ACTIONS)))


def _action_leaks(actions: list[float] | None) -> bool:
    """The verdicts' action rule: read right on at least :data:`ACTION_LEAK` of the updates, or on more than
    guessing would name but with a probability under :data:`ACTION_CHANCE_P` (which a few updates cannot
    show: 1 of 1 right is p = 0.14; many can: 21 of 96 right, a guess's 14 expected, is p = 0.03)."""
    if not actions:
        return False
    p = _chance_p(actions)
    return statistics.fmean(actions) >= ACTION_LEAK or (p is not None and p < ACTION_CHANCE_P)


def _actions_read(actions: list[float]) -> str | None:
    """The glance's action column: how many updates QGI read right and, beside it, :func:`_chance_p`; a
    batch's shares are not a count, and give the share alone."""
    if not actions:
        return None
    n, right, p = len(actions), sum(actions), _chance_p(actions)
    if p is None:
        return f"{100 * right / n:.0f}% of {plural(n, 'update')}"
    return f"{int(right)} of {plural(n, 'update')} ({100 * right / n:.0f}%; chance alone: p = {p:.2g})"


def _image_gains(row: dict[str, Any]) -> list[tuple[float, str]]:
    """One attack's image gains over their constant baselines (dB), each with its image (``rgb``, ``depth``)."""
    m = row.get("metrics", {})
    return [(m[f"{im}_paper_psnr"] - m[f"{im}_paper_psnr_baseline"], im) for im in ("rgb", "depth")
            if m.get(f"{im}_paper_psnr") is not None and m.get(f"{im}_paper_psnr_baseline") is not None]


def chain_in_words(chain: str | None) -> str:
    """What a client does to its update behind a defense chain, e.g. ``clip to norm 1, noise std 0.6``."""
    words = {"gaussian": "noise std {:.3g}", "laplace": "Laplace noise of scale {:.3g}", "clip": "clip to norm {:g}",
             "prune": "drop each entry with probability {:g}", "topk": "drop the smallest {:g} of the entries"}
    return ", ".join(words[name].format(value) for name, value in defense_steps(chain)) or "nothing"


def _kept_text(cells: list[dict[str, Any]]) -> str:
    """The cosine an update keeps with the true one behind a defense: the attacks' medians, as one number
    when they agree to three digits, else their range; "–" where none was measured (results written before
    leaklab measured it)."""
    medians = sorted(m for c in cells if (m := c["summary"].get("update_cosine_median")) is not None)
    if not medians:
        return NOT_MEASURED
    lo, hi = cosine_text(medians[0]), cosine_text(medians[-1])
    return lo if lo == hi else f"{lo} to {hi}"


NOT_MEASURED = "–"


def levels_text(summary: dict[str, Any]) -> str:
    """Where the leaks stop and the levels to audit next, in words, from an audit's ``summary`` (saying
    how many earlier audits' verdicts they count); "" when it names neither."""
    text = " ".join(filter(None, (leaks_stop_text(summary["leaks_stop"]), next_levels_text(summary["next_levels"]))))
    earlier = len(summary.get("earlier_audits", []))
    return f"{text} (From the verdicts of this audit and {plural(earlier, 'earlier audit')}.)" if text and earlier \
        else text


def verdicts(results: dict[str, Any]) -> list[list[Any]]:
    """One row per defense, weakest first: what the clients add, the cosine an update keeps with the true
    one (what the defense costs), the largest mean image gain over the constant baseline (and where, with the
    mode when several ran), how many attacked updates (each once, whatever the modes that attacked it) show
    their room (an image at :data:`IMAGE_LEAK_DB` or more over its own baseline), the best mean box IoU,
    QGI's action accuracy over its updates, and a verdict in words naming what leaks (:func:`_verdict`; the
    target Q-value and the reward by the attack that reads them best)."""
    rows = []
    for label in results["summary"]["defenses"]:
        cells = [c for c in results["cells"] if c["defense"] == label]
        modes = _several_modes(cells)
        gains = [(s[f"{im}_psnr_mean"] - s[f"{im}_psnr_baseline_mean"], _where(c, im, modes))
                 for c in cells for im in ("rgb", "depth") if (s := c["summary"]).get(f"{im}_psnr_mean") is not None]
        gain, where = max(gains)
        room = _room_shown(((_update_key(c, r), c, r) for c in cells for r in c["samples"]), modes)
        iou = max(c["summary"]["iou_mean"] for c in cells)
        actions = _qgi_actions(cells)
        q_error, reward_error = (min((e for c in cells if (e := c["summary"].get(key)) is not None), default=None)
                                 for key in ("q_target_err_mean", "reward_abs_err_mean"))
        rows.append([label, chain_in_words(cells[0].get("defense_chain")), _kept_text(cells), gain, where,
                     f"{room.shown} of {room.updates}", iou, _actions_read(actions),
                     _verdict(room, iou, actions, q_error, reward_error)])
    return rows


def conclusion(rows: list[list[Any]]) -> str:
    """The audit in one sentence, from :func:`verdicts`' rows (weakest defense first), with the cosine an
    update keeps behind the defenses it names."""
    safe = [r for r in rows if r[-1] == NOTHING_LEAKS]
    leaky = [r for r in rows if r[-1] != NOTHING_LEAKS]
    if not leaky:
        return f"Nothing measured leaks behind any defense tested, {rows[0][0]} included."
    last = leaky[-1]
    sees = f"behind {last[0]}" + (f" (cosine {last[2]})" if last[1] != "nothing" and last[2] != NOT_MEASURED
                                  else "") + f" the update still {last[-1]}"
    if not safe:
        return f"Every defense tested leaks: {sees}."
    first = safe[0]
    kept = f", and there an update keeps a cosine of {first[2]} with the true one" if first[2] != NOT_MEASURED else ""
    return f"{first[0]} is the weakest defense tested behind which nothing measured leaks{kept}; {sees}."


def _verdict(room: RoomShown, iou: float, actions: list[float] | None, q_error: float | None = None,
             reward_error: float | None = None) -> str:
    """What leaks, in words: the room where any attacked update shows it (``room``: how many of how many
    have an image :data:`IMAGE_LEAK_DB` over its own baseline; a mean over the updates hid a room that
    some show), with the largest single gain and where it is; the box at a mean IoU of
    :data:`BOX_LEAK_IOU`; the action by :func:`_action_leaks` (``actions``: 1 or 0 per update, a batch's
    share; None or empty: not measured);
    the target Q-value at a mean error (``q_error``, %) of :data:`Q_LEAK_PERCENT` and the reward at a
    mean absolute error (``reward_error``) of :data:`REWARD_LEAK` (None: not measured)."""
    leaks = [f"the room ({room.shown} of {plural(room.updates, 'update')} show it; the best: {room.best_where} "
             f"{room.best_gain:+.1f} dB over its baseline)"] if room.shown else []
    leaks += [f"the target's box (IoU {iou:.2f})"] if iou >= BOX_LEAK_IOU else []
    leaks += [f"the action ({100 * statistics.fmean(actions):.0f}%)"] if _action_leaks(actions) else []
    leaks += [f"the target Q-value (error {q_error:.2g}%)"] if q_error is not None and q_error <= Q_LEAK_PERCENT \
        else []
    leaks += [f"the reward (error {reward_error:.2g})"] if reward_error is not None and reward_error <= REWARD_LEAK \
        else []
    return "leaks " + listing(leaks) if leaks else NOTHING_LEAKS


NOTHING_LEAKS = "nothing measured leaks"


def _glance_caption() -> str:
    return (f"Image gain: reconstruction PSNR minus the constant-image baseline (a mean over the samples). An "
            f"attacked update shows its room when one of its images is {IMAGE_LEAK_DB:g} dB or more above its own "
            "baseline, and the room leaks when any update shows it (a mean over rooms can hide one). The box "
            f"leaks at a mean IoU of {BOX_LEAK_IOU:g} or more (a target out of view counts 1 only when the "
            f"recovered box is empty too), the action at an accuracy of {100 * ACTION_LEAK:.0f}% or more "
            f"(chance: 1 in 7) or when guessing would name as many right only with a probability under "
            f"{ACTION_CHANCE_P:g}, the target Q-value (QGI) at a mean error of {Q_LEAK_PERCENT:g}% or less and the "
            f"reward (RGI: the discounted return that weights log π) at a mean absolute error of {REWARD_LEAK:g} or "
            "less (one step earns at most 1).")


class RoomShown(NamedTuple):
    """:func:`_room_shown`'s count: ``shown`` of ``updates`` show their room; ``best_gain`` (dB) is the
    largest single image gain, ``best_where`` its attack and image (None where nothing was scored)."""
    shown: int
    updates: int
    best_gain: float | None
    best_where: str | None


def _room_shown(attacks: Iterable[tuple[Hashable, dict[str, Any], dict[str, Any]]], modes: bool) -> RoomShown:
    """How many attacked updates show their room (an image :data:`IMAGE_LEAK_DB` or more over its own
    baseline in any of their reconstructions), of how many, and the largest single gain with where it is
    (:func:`_where`). ``attacks``: (the update attacked, the attack's cell or row naming its algorithm,
    setting and mode, its row); an update attacked in several modes (``--full``) counts once."""
    best: dict[Hashable, tuple[float, str]] = {}
    for update, attack, row in attacks:
        for gain, image in _image_gains(row):
            if update not in best or gain > best[update][0]:
                best[update] = (gain, _where(attack, image, modes))
    gain, where = max(best.values(), default=(None, None))
    return RoomShown(sum(g >= IMAGE_LEAK_DB for g, _ in best.values()), len(best), gain, where)


def _where(attack: dict[str, Any], image: str, modes: bool) -> str:
    """An image of an attack in words, e.g. ``QGI S2 depth (paper mode)``: the mode where several ran."""
    return f"{attack['algorithm'].upper()} {attack['setting']} {image}" + (f" ({attack['mode']} mode)" if modes else "")


def effort_notice(iterations: int, after: str = "") -> str:
    """The warning (ending in ``after``) when the attacks ran fewer image iterations than their default:
    the reports', and the room attack command's."""
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
                "s per sample"]
    rows = []
    for label in labels:
        cell = by[(meta["algorithm"], meta["setting"], meta["mode"], label)]
        s = cell["summary"]
        row = [label] + [s.get(f"{im}_{key}") for im in images for key in
                         ("psnr_mean", "psnr_baseline_mean", "ssim_mean", "ssim_baseline_mean")]
        error = s.get("q_target_err_mean" if qgi else "reward_abs_err_mean")
        row += [s.get("iou_mean"), room_attack.action_share(s, cell["defense_chain"] is not None),
                None if error is None else f"{error:.3g}",
                cosine_text(s.get("update_cosine_median")),
                s.get("seconds_per_sample")]
        rows.append(row)
    return Table(columns=columns, rows=rows,
                 caption="Baseline: a constant image at the true mean, what an attacker gets with no information; "
                         "a PSNR well above it means the update shows the room (SSIM too, though a smooth depth "
                         "image's constant already scores a high SSIM). PSNR and SSIM on "
                         "the Y channel (RGB) and on depth, with the paper's normalisation (the reconstruction's "
                         "brightest RGB pixel scaled to white). Means over the samples; the picture above gives "
                         "each one's PSNR and, in brackets, its gain over its own baseline.")


def write_report(folder: Path, results: dict[str, Any], cells, defenses, truths, pictures) -> None:
    from leaklab.report.html import Figure, Section, Table, render_report
    from leaklab.report.plots import image_grid

    labels = [label for label, _ in defenses]
    plot = _leakage_plot(results, labels, folder / "figures" / "leakage_per_defense.png")
    by = {(c["algorithm"], c["setting"], c["mode"], c["defense"]): c for c in results["cells"]}
    glance = Table(columns=["defense", "what each client does", "update kept (cosine)", "largest mean image gain (dB)",
                            "where", "updates showing their room", "box IoU (best)", "action (QGI)", "verdict"],
                   rows=verdicts(results),
                   caption=_glance_caption() + " Update kept: the cosine of the update the server receives with "
                   "the client's true one, the median over the updates (the attacks' range where they differ), 1 "
                   "when nothing changes: a measure of what the defense costs the training. An update whose own "
                   "gradient is small (a TD error or a REINFORCE return near 0) drowns in weak noise; a server that "
                   "averages K updates of one direction lifts a small cosine about √K-fold at best. The action "
                   "column is QGI's (p: the chance that guessing one of the 7 actions at random would name as "
                   "many right or more): RGI's is left out of the verdict, as a REINFORCE update whose return is 0 "
                   "holds no trace of the action and under noise RGI's rule reads the noise; the per-attack tables "
                   "show it." + (" Exact and paper mode attack the same updates: each update counts once, "
                                 "showing its room when either reconstruction shows it."
                                 if _several_modes(results["cells"]) else ""))
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
               ("network", f"{config['arch']}, {_trained_words(config)}"), ("seed", config["seed"]),
               ("attacks", f"{' and '.join(config['modes'])} mode, {'/'.join(map(str, iterations))} image iterations "
                           f"each; {plural(config['samples'], 'sample')} per cell from {plural(len(rooms), 'room')}"),
               ("rooms", ", ".join(rooms)),
               ("wall-clock seconds", results["summary"]["seconds"]),
               ("attacks resumed from an interrupted run", results["summary"]["resumed_attacks"])]
    notice = effort_notice(iterations[0], " Rerun without --quick or --iterations for the audit's verdicts.")
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
             "out the terms that need an exact update). Baseline: a constant image at the true mean, what an "
             "attacker with no information scores; the gain over it is what the update gave away.")
    lead = " ".join(filter(None, (f"{conclusion(verdicts(results))} ({plural(config['samples'], 'sample')} per "
                                  "attack and defense.)", levels_text(results["summary"]))))
    render_report(folder / REPORT_FILE, "leaklab audit: your room through federated RL updates",
                  summary=summary, intro=intro, notice=notice, lead=lead,
                  figures=[Figure("Leakage per defense", plot, "bars: PSNR minus the constant-image "
                                  f"baseline, a mean over the samples; from {IMAGE_LEAK_DB:g} dB (the dotted line) "
                                  "the room shows, below 0 the reconstruction is worse than a constant guess; "
                                  "lines (right axis): the cosine an update keeps with the true one, what the "
                                  "defense costs, and QGI's action accuracy (chance: 1 in 7)")],
                  sections=sections)
