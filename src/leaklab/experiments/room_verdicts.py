"""The room audit's verdicts (``leaklab audit`` and ``leaklab audit --cases``): what leaks behind each
defense, in words and in one sentence. The room leaks where any attacked update shows it (an image
:data:`IMAGE_LEAK_DB` over its own constant-image baseline), the target's box at a mean IoU of
:data:`BOX_LEAK_IOU`, QGI's action beyond chance (:data:`ACTION_CHANCE_P`; a batch's shares at :data:`ACTION_LEAK`), the
target Q-value and the reward read to :data:`Q_LEAK_PERCENT` and :data:`REWARD_LEAK` (seed 000, section V's
metrics). An update attacked in several modes (``--full``) counts once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable
from typing import Any, NamedTuple

from scipy.stats import binom

from leaklab.attacks.rl.attack import max_batch
from leaklab.experiments.audit_levels import leaks_stop_text, next_levels_text
from leaklab.fields import defense_steps
from leaklab.names import NOISE_DEFENSE_NAMES
from leaklab.rl.envs.active_perception import ACTIONS
from leaklab.words import beside_line, cosine_text, listing, plural, sentences

IMAGE_LEAK_DB = 3.0  # verdict: images leak when their PSNR beats the no-information baseline by this
BOX_LEAK_IOU = 0.5  # verdict: the target's box leaks at this mean IoU (the usual detection threshold)
ACTION_CHANCE_P = 0.05  # verdict: QGI's action leaks when guessing would name as many right with a lower probability
ACTION_LEAK = 0.5  # (e.g. 21 of 96 right), a batch's shares (no count) at this accuracy (chance: 1 in 7)
Q_LEAK_PERCENT = 1.0  # verdict: the target Q-value leaks read to this error (seed 000's QGI: about 1%)
REWARD_LEAK = 0.01  # verdict: the reward (RGI reads the discounted return that weights log π) leaks read to
# this absolute error, 1% of the most one step earns
FEATURES_WHOLE = 0.9  # the features read off an update (their estimated cosine): in exact-mode audits of leaklab's
FEATURES_LOST = 0.2  # rooms on `wide-rgb` and `nature` every update at 0.9 or more showed its room (56 of 56), none
# under 0.2 (0 of 108) and 11 of 28 between; on `stacked`, whose images exact mode reads worse, 3 at 0.90 to 0.93
# did not (docs/reproductions.md, "What an update lets through of the features")


Attacks = dict[Hashable, list[tuple[dict[str, Any], dict[str, Any]]]]  # update -> its attacks' (cell, row)


def _updates(cells: list[dict[str, Any]]) -> Attacks:
    """The attacks of ``cells`` (each a cell and its row) grouped by the update they attacked, (algorithm,
    setting, sample index): an audit that runs several modes (``--full``) attacks each capture's defended
    updates once per mode, and an update counts once."""
    grouped: Attacks = {}
    for c in cells:
        for r in c["samples"]:
            grouped.setdefault((c["algorithm"], c["setting"], r["index"]), []).append((c, r))
    return grouped


def several_modes(cells: list[dict[str, Any]]) -> bool:
    """Whether ``cells`` hold more than one mode's attacks (``--full``: exact and paper on the same updates)."""
    return len({c["mode"] for c in cells}) > 1


def qgi_actions(cells: list[dict[str, Any]]) -> list[float]:
    """Whether QGI read each of its attacked updates' action right (1 or 0; a batch's share; the mean over the
    modes that attacked it, which read it by the same rule), over ``cells``: the verdicts' and the leakage
    plot's action (RGI's is left out: a REINFORCE update whose return is 0 holds no trace of its action, and
    under noise RGI's rule reads the noise)."""
    return [statistics.fmean(r["metrics"]["action"] for _, r in attacks)
            for (algorithm, _, _), attacks in _updates(cells).items() if algorithm == "qgi"]


def _chance_p(actions: list[float]) -> float | None:
    """The chance that guessing one of the room's actions at random names as many of ``actions`` (1 or 0
    per update) right or more (a binomial tail); None for a batch's shares, which are no count."""
    if not actions or any(a not in (0.0, 1.0) for a in actions):
        return None
    return float(binom.sf(int(sum(actions)) - 1, len(actions), 1 / len(ACTIONS)))


def _action_leaks(actions: list[float] | None) -> bool:
    """The verdicts' action rule: read right on more updates than guessing one of the room's actions would name
    but for a probability under :data:`ACTION_CHANCE_P` (3 of 6 right: p = 0.042; 21 of 96, a guess's 14
    expected: p = 0.03; 1 of 1 is p = 0.14, no evidence: behind strong noise every level of an audit guesses
    alike, from the same draws, and one right guess named each of them leaky); a batch's shares, which are
    no count, at :data:`ACTION_LEAK` or more on average."""
    if not actions:
        return False
    p = _chance_p(actions)
    return statistics.fmean(actions) >= ACTION_LEAK if p is None else p < ACTION_CHANCE_P


def _actions_read(actions: list[float]) -> str | None:
    """The glance's action column: how many updates QGI read right and, beside it, :func:`_chance_p`; a
    batch's shares are not a count, and give the share alone."""
    if not actions:
        return None
    n, right, p = len(actions), sum(actions), _chance_p(actions)
    if p is None:
        return f"{100 * right / n:.0f}% of {plural(n, 'update')}"
    return f"{int(right)} of {plural(n, 'update')} ({100 * right / n:.0f}%; chance alone: p = {p:.2g})"


def image_gains(row: dict[str, Any]) -> list[tuple[float, str]]:
    """One attack's image gains over their constant baselines (dB), each with its image (``rgb``, ``depth``): a
    batch's largest transition's (``…_gain_max``; rows written before session 52 hold their batch's mean gain
    alone); none for an image without scores (None once written, NaN before: a constant true image's)."""
    m = row.get("metrics", {})
    gains = [(m.get(f"{im}_gain_max", _difference(m.get(f"{im}_paper_psnr"), m.get(f"{im}_paper_psnr_baseline"))),
              im) for im in ("rgb", "depth")]
    return [(gain, im) for gain, im in gains if isinstance(gain, (int, float)) and math.isfinite(gain)]


def _difference(score: Any, baseline: Any) -> float | None:
    return score - baseline if all(isinstance(v, (int, float)) for v in (score, baseline)) else None


def chain_in_words(chain: str | None) -> str:
    """What a client does to its update behind a defense chain, e.g. ``clip to norm 1, noise std 0.6``."""
    words = {"gaussian": "noise std {:.3g}", "laplace": "Laplace noise of scale {:.3g}", "clip": "clip to norm {:g}",
             "prune": "drop each entry with probability {:g}", "topk": "drop the smallest {:g} of the entries"}
    return ", ".join(words[name].format(value) for name, value in defense_steps(chain)) or "nothing"


def _cosine_range(cells: list[dict[str, Any]], key: str = "update_cosine_median") -> str:
    """The cosine an update keeps with the true one behind a defense (``key``; ``feature_cosine_median``: the
    cosine of the conv features read off the update in closed form, as the server estimates it): the attacks'
    medians, as one number when they agree to three digits, else their range; "–" where none was measured
    (results written before leaklab measured it; for the features, paper mode's batches of two)."""
    medians = sorted(m for c in cells if (m := c["summary"].get(key)) is not None)
    if not medians:
        return NOT_MEASURED
    lo, hi = cosine_text(medians[0]), cosine_text(medians[-1])
    return lo if lo == hi else f"{lo} to {hi}"


NOT_MEASURED = "–"


def noise_caveat(modes: list[str], chains: list[str | None], cases: list[dict[str, Any]] | None = None) -> str:
    """The caveat of an audit whose attacks ran in exact mode alone on updates behind noise (``chains``: the
    defense chains attacked): its verdicts there are one attack's, and the paper's optimisation, which fits
    the images to every gradient at once, may show a room exact mode misses (it did on one of the default
    audit's 36 updates behind σ = 0.03, 0.1 and 0.3 up to exact method version 11; at version 12 on none, while
    exact mode showed 3 that it missed: docs/reproductions.md, "The prior's weight per pixel behind noise");
    "" otherwise. ``cases``: the rows of an audit of saved cases, which runs one mode at a time (paper mode
    does not read RGI's batches of two, and the caveat says so where there are some); a case whose defense its
    view withholds may be behind noise; a case without scores has no verdict to caveat."""
    if cases is not None:
        cases = [r for r in cases if "metrics" in r]
        chains = [r["defense"] for r in cases]
    noised = any(name in NOISE_DEFENSE_NAMES for chain in chains for name, _ in defense_steps(chain)) or any(
        r.get("defense_withheld") for r in cases or ())
    if set(modes) != {"exact"} or not noised:
        return ""
    return ("Behind noise the verdicts are exact mode's, one attack's and so a lower bound on the leak: the paper's "
            "method, which fits the images to every gradient at once, may show a room that exact mode misses (on "
            "the default rooms behind Gaussian noise it showed none of 36 updates that exact mode missed, and "
            "missed 3 that exact mode showed: docs/reproductions.md, \"The prior's weight per pixel behind "
            "noise\"). `--mode paper` (four times as long or more) attacks with the paper's method"
            + (", `--mode both` with both (each update counted once)." if cases is None else
               " the updates it reads (not RGI's batches of two)." if any(
                   len(r["action"]) > max_batch(CASE_LOSSES[r["algorithm"]], "paper") for r in cases) else "."))


CASE_LOSSES = {"qgi": "dqn_mse", "rgi": "reinforce"}  # the loss of the updates each room attack reads


def levels_text(summary: dict[str, Any]) -> str:
    """Where the leaks stop and the levels to audit next, in words, from an audit's ``summary`` (saying
    how many earlier audits' verdicts they count); "" when it names neither."""
    text = " ".join(filter(None, (leaks_stop_text(summary["leaks_stop"]), next_levels_text(summary["next_levels"]))))
    earlier = len(summary.get("earlier_audits", []))
    # the conclusion before it names this audit's levels alone: a level it calls safe may leak in an earlier one
    return f"{text} (From the verdicts of this audit and {plural(earlier, 'earlier audit')}; the conclusion counts " \
        "this audit's levels alone.)" if text and earlier \
        else text


class GlanceRow(NamedTuple):
    """One defense's row of the at-a-glance table (:func:`verdicts`), its fields in the order of
    :data:`GLANCE_COLUMNS`."""
    defense: str
    client_does: str  # the defense chain in words
    kept: str  # the cosine an update keeps with the true one (:func:`_cosine_range`)
    features: str  # the estimated cosine of the features read off the updates in closed form
    gain: float  # the largest mean image gain over the constant baseline (dB)
    where: str
    shown: str  # "K of N" updates showing their room
    iou: str  # the best mean box IoU, on its side of :data:`BOX_LEAK_IOU` (:func:`~leaklab.words.beside_line`)
    action: str | None  # QGI's action accuracy over its updates
    verdict: str


GLANCE_COLUMNS = ("defense", "what each client does", "update kept (cosine)", "features read (cosine, estimated)",
                  "largest mean image gain (dB)", "where", "updates showing their room", "box IoU (best)",
                  "action (QGI)", "verdict")


def verdicts(results: dict[str, Any]) -> list[GlanceRow]:
    """One row per defense, weakest first: what the clients add, the cosine an update keeps with the true
    one (what the defense costs) and that of the conv features read off it in closed form with the client's
    (what the defense lets through, estimated without the truth), the largest mean image gain over the constant
    baseline (and where, with the mode when several ran), how many attacked updates (each once, whatever the
    modes that attacked it) show their room (an image at :data:`IMAGE_LEAK_DB` or more over its own
    baseline), the best mean box IoU, QGI's action accuracy over its updates, and a verdict in words naming
    what leaks (:func:`verdict`; the target Q-value and the reward by the attack that reads them best)."""
    rows = []
    for label in results["summary"]["defenses"]:
        cells = [c for c in results["cells"] if c["defense"] == label]
        modes = several_modes(cells)
        gains = [(s[f"{im}_psnr_mean"] - s[f"{im}_psnr_baseline_mean"], _where(c, im, modes))
                 for c in cells for im in ("rgb", "depth") if (s := c["summary"]).get(f"{im}_psnr_mean") is not None]
        gain, where = max(gains, default=(math.nan, NOT_MEASURED))  # none: every true image constant
        room = room_shown(_updates(cells), modes)
        iou = max(c["summary"]["iou_mean"] for c in cells)
        actions = qgi_actions(cells)
        q_error, reward_error = (min((e for c in cells if (e := c["summary"].get(key)) is not None), default=None)
                                 for key in ("q_target_err_mean", "reward_abs_err_mean"))
        rows.append(GlanceRow(label, chain_in_words(cells[0].get("defense_chain")), _cosine_range(cells),
                              _cosine_range(cells, "feature_cosine_median"), gain, where,
                              f"{room.shown} of {room.updates}", beside_line(iou, BOX_LEAK_IOU),
                              _actions_read(actions),
                              verdict(room, iou, actions, q_error, reward_error)))
    return rows


# the audit's defense families: each level's label starts with its family's prefix (room_audit.defenses)
GAUSSIAN_PREFIX, DPSGD_PREFIX = "gaussian σ=", "DP-SGD ε="
FAMILIES = ((GAUSSIAN_PREFIX, "Gaussian"), (DPSGD_PREFIX, "DP-SGD"))


def conclusion(rows: list[GlanceRow]) -> str:
    """The audit in a sentence per defense family (:data:`FAMILIES`; levels of different families are not
    ranked against each other), from :func:`verdicts`' rows (weakest level first), with the cosine an update keeps
    behind the levels it names; the undefended update's verdict where no family's level leaks."""
    if all(r.verdict == NOTHING_LEAKS for r in rows):  # the weakest row is the undefended update where it ran
        return ("Nothing measured leaks, undefended or behind any defense tested." if rows[0].defense == "none"
                else f"Nothing measured leaks behind any defense tested, {rows[0].defense} included.")
    families = [(name, levels) for prefix, name in FAMILIES
                if (levels := [r for r in rows if r.defense.startswith(prefix)])]
    parts = [_family_sentence(name, levels) for name, levels in families]
    if all(r.verdict == NOTHING_LEAKS for _, levels in families for r in levels):
        parts.append(f"{'Undefended' if families else 'No defense was tested; undefended'}, the update "
                     f"{rows[0].verdict}.")
    return sentences(tuple(parts))  # a sentence may begin with a level's label, in lowercase (gaussian σ=…)


def _still_leaks(row: GlanceRow) -> str:
    cosine = f" (cosine {row.kept})" if row.client_does != "nothing" and row.kept != NOT_MEASURED else ""
    return f"behind {row.defense}{cosine} the update still {row.verdict}"


def _family_sentence(name: str, levels: list[GlanceRow]) -> str:
    """One family's levels (weakest first): the weakest behind which, as behind every stronger one, nothing
    measured leaks, and the strongest that leaks; a level that showed nothing under a stronger leaky one is
    named as such, never as the level where the leaks stop."""
    k = len(levels)
    while k and levels[k - 1].verdict == NOTHING_LEAKS:
        k -= 1
    lone = [r.defense for r in levels[:k - 1] if r.verdict == NOTHING_LEAKS]  # safe, yet a stronger level leaks
    odd = f" (nothing measured leaked behind the weaker {listing(lone)}, which is therefore no safe level)" if lone \
        else ""
    if k == len(levels):
        return (f"{'Every' if not lone else 'No'} {name} level tested {'leaks' if not lone else 'is safe'}: "
                f"{_still_leaks(levels[-1])}{odd}.")
    first = levels[k]
    kept = f", where an update keeps a cosine of {first.kept} with the true one" if first.kept != NOT_MEASURED else ""
    stronger = ", as behind every stronger one," if k < len(levels) - 1 else ""  # none stronger: it said so anyway
    text = f"{first.defense} is the weakest {name} level tested behind which{stronger} nothing measured leaks{kept}"
    return text + (f"; {_still_leaks(levels[k - 1])}{odd}." if k else ".")


def verdict(room: RoomShown, iou: float, actions: list[float] | None, q_error: float | None = None,
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


def glance_caption() -> str:
    """The at-a-glance table's caption (the audit's and ``--cases``'): the verdicts' rules in words."""
    return ("Image gain: reconstruction PSNR (with the paper's normalisation) minus the constant-image "
            f"baseline (a mean over the samples). An attacked update shows its room when one of its images is "
            f"{IMAGE_LEAK_DB:g} dB or more above its own baseline (raw or with the paper's normalisation, whichever "
            "is higher), and the room leaks when any update shows it (a mean over rooms can hide one). The box "
            f"leaks at a mean IoU of {BOX_LEAK_IOU:g} or more (a target out of view, whose box is all zeros, "
            f"counts 1 only when the attack read a box within 1e-3 of it), the action when guessing one of the 7 "
            f"would name as many right only with a probability under {ACTION_CHANCE_P:g} (3 of 6 updates; a "
            f"batch's shares at {100 * ACTION_LEAK:.0f}% or more), the target Q-value (QGI) at a mean error of "
            f"{Q_LEAK_PERCENT:g}% or less and the reward (RGI: the discounted return that weights log π) at a mean "
            f"absolute error of {REWARD_LEAK:g} or less (one step earns at most 1).")


def features_lines_text() -> str:
    """What :data:`FEATURES_WHOLE` and :data:`FEATURES_LOST` meant where they were measured: the reports'
    captions and :func:`features_read_text` say it in these words."""
    return (f"in exact-mode audits of leaklab's rooms on its wide-rgb and nature networks every update at "
            f"{FEATURES_WHOLE:g} or more showed its room and none under {FEATURES_LOST:g} (on stacked, whose images "
            "the attack reads worse, 3 at 0.90 to 0.93 did not: docs/reproductions.md, \"What an update lets "
            "through of the features\")")


def features_read_text(cosines: list[float]) -> str:
    """What the features read off the updates of cases without their truth say (``cosines``: their
    ``feature_cosine``): how many at :data:`FEATURES_WHOLE` or more and how many under :data:`FEATURES_LOST`,
    with what those lines meant on leaklab's default rooms; "" when there are none."""
    if not cosines:
        return ""
    measured = f"(estimated from the updates alone; {features_lines_text()})"
    if len(cosines) == 1:
        return (f"The server reads the room's conv features of the case without its truth at a cosine of "
                f"{cosine_text(cosines[0])} with the client's {measured}.")
    whole = sum(c >= FEATURES_WHOLE for c in cosines)
    lost = sum(c < FEATURES_LOST for c in cosines)
    return (f"Of the {len(cosines)} cases without their truth, the server reads the room's conv features at a "
            f"cosine of {FEATURES_WHOLE:g} or more with the client's off {whole} and under {FEATURES_LOST:g} off "
            f"{lost} {measured}.")


class RoomShown(NamedTuple):
    """:func:`room_shown`'s count: ``shown`` of ``updates`` show their room; ``best_gain`` (dB) is the
    largest single image gain, ``best_where`` its attack and image (None where nothing was scored)."""
    shown: int
    updates: int
    best_gain: float | None
    best_where: str | None


def room_shown(updates: Attacks, modes: bool) -> RoomShown:
    """How many attacked updates show their room (an image :data:`IMAGE_LEAK_DB` or more over its own
    baseline in any of their reconstructions), of how many, and the largest single gain with where it is
    (:func:`_where`). ``updates``: each update's attacks, as :func:`_updates` groups them (the attack's cell,
    or a case's row, names its algorithm, setting and mode); an update attacked in several modes counts once."""
    best: dict[Hashable, tuple[float, str]] = {}
    for update, attacks in updates.items():
        for attack, row in attacks:
            for gain, image in image_gains(row):
                if update not in best or gain > best[update][0]:
                    best[update] = (gain, _where(attack, image, modes))
    gain, where = max(best.values(), default=(None, None))
    return RoomShown(sum(g >= IMAGE_LEAK_DB for g, _ in best.values()), len(best), gain, where)


def _where(attack: dict[str, Any], image: str, modes: bool) -> str:
    """An image of an attack in words, e.g. ``QGI S2 depth (paper mode)``: the mode where several ran, the
    case where the attack is a saved case's (``audit --cases``: ``RGI S2 depth of case 0001``)."""
    mode = f" ({attack['mode']} mode)" if modes else ""
    case = f" of case {attack['case']}" if "case" in attack else ""
    return f"{attack['algorithm'].upper()} {attack['setting']} {image}{mode}{case}"
