"""Exact mode against paper mode on the updates an unfinished ``leaklab audit --full`` has already attacked.

The paper-scale audit attacks every defended update in both modes and keeps each finished attack in
``.leaklab-resume/`` beside its output folder until the run ends. This script rebuilds the audit's jobs
(the same captures, defenses and seed: ``room_audit.default_config(full=True)`` and
``room_audit.attack_list``), reads every saved attack
the journal holds, scores it with the audit's own ``room_attack.score`` and compares the two modes update by
update: how many updates each shows the room of (an image ``room_verdicts.IMAGE_LEAK_DB`` over its own
constant baseline), their mean largest gain and mean box IoU, per attack, setting and defense
(docs/reproductions.md, "Exact or paper mode behind noise"). It only reads the journal.

    .venv/bin/python analysis/score_journal.py --journal runs --out runs/journal-scores.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from leaklab.experiments import room_attack, room_audit
from leaklab.experiments.attack_journal import AttackJournal
from leaklab.experiments.room_verdicts import IMAGE_LEAK_DB, image_gains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", type=Path, required=True, help="the folder that holds .leaklab-resume/")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = room_audit.default_config(full=True)
    cells = room_audit.cell_configs(config)
    defenses = config.defenses()
    firsts = room_audit.capture_runs(cells)
    captures = {key: room_attack.capture_samples(run_config) for key, run_config in firsts.items()}
    where, jobs, kept = room_audit.attack_list(config.samples, cells, defenses, captures)
    journal = AttackJournal(args.journal, jobs)
    held = sorted(journal.held())
    print(f"{len(held)} of {len(where)} attacks saved", flush=True)
    by_update: dict = defaultdict(dict)
    for i in held:
        rec = journal.load(i)
        if rec is None:
            continue
        c, d, sample = where[i]
        meta = cells[c][0]
        metrics = room_attack.score(sample, rec, meta["setting"], kept[i])["metrics"]
        by_update[(meta["algorithm"], meta["setting"], defenses[d][0], sample.index)][meta["mode"]] = {
            "gain_db": max(image_gains({"metrics": metrics}))[0], "box_iou": metrics["box_iou"],
            "seconds": rec.seconds}
    table = []
    for algorithm, setting in firsts:
        for label, _ in defenses:
            pairs = [modes for (a, s, dd, _), modes in sorted(by_update.items())
                     if (a, s, dd) == (algorithm, setting, label) and len(modes) == 2]
            if not pairs:
                continue
            row = {"algorithm": algorithm, "setting": setting, "defense": label, "updates": len(pairs)}
            for mode in ("exact", "paper"):
                row[f"{mode}_shown"] = sum(p[mode]["gain_db"] >= IMAGE_LEAK_DB for p in pairs)
                row[f"{mode}_gain_mean"] = statistics.fmean(p[mode]["gain_db"] for p in pairs)
                row[f"{mode}_box_iou_mean"] = statistics.fmean(p[mode]["box_iou"] for p in pairs)
            row["either_shown"] = sum(max(p["exact"]["gain_db"], p["paper"]["gain_db"]) >= IMAGE_LEAK_DB
                                      for p in pairs)
            table.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"saved": len(held), "attacks": len(where), "table": table}, indent=1))


if __name__ == "__main__":
    main()
