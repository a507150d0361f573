"""The pictures of ``leaklab reproduce rnn-membership`` (seed 003, chapter 3, Figs. 3.4 and 3.6-3.8), one per
section of its results, the FFNN and the RNN side by side; 50% (a guess) dotted on every attack axis."""

from __future__ import annotations

import math
from pathlib import Path

from leaklab.report.plots import saved_figure

ARCHS = ("FFNN", "RNN")


def _two_panels(path: Path, rows: list[dict], x: str, panels: tuple[tuple[str, str], tuple[str, str]], xlabel: str,
                title: str, log_x: bool = True, references: dict[str, dict] | None = None,
                group: str | None = None) -> None:
    """Two panels of ``rows`` against the key ``x``, one line per architecture (and per value of the key
    ``group``, dashed after the first): each panel a (key, axis label), shown in percent, with error bars where the
    rows give ``KEY_se``; ``references`` (per architecture, key -> value) dotted in the architecture's colour. A line
    whose values are all None (e.g. a utility loss against an unprotected model that earned nothing) is named
    "undefined" in the legend rather than left an empty entry."""
    with saved_figure(path, 1, 2, figsize=(9, 3.3), title=title) as (fig, axes):
        groups = list(dict.fromkeys(r[group] for r in rows)) if group else [None]
        for arch in ARCHS:
            colour = None
            for style, value in zip(("o-", "s--", "^-."), groups):
                cell = [r for r in rows if r["arch"] == arch and (group is None or r[group] == value)]
                label = arch if value is None else f"{arch}, {value}"
                for ax, (key, _) in zip(axes, panels):
                    errors = [100 * r[f"{key}_se"] for r in cell] if all(r.get(f"{key}_se") for r in cell) else None
                    values = [math.nan if r[key] is None else 100 * r[key] for r in cell]  # None: undefined
                    shown = label if any(v == v for v in values) else f"{label} (undefined)"
                    line = ax.errorbar([r[x] for r in cell], values, yerr=errors, fmt=style,
                                       color=colour, label=shown, capsize=2)
                    colour = line.lines[0].get_color()
            for ax, (key, _) in zip(axes, panels):
                if references and key in references[arch]:
                    ax.axhline(100 * references[arch][key], color=colour, linestyle=":", linewidth=1,
                               label=f"{arch}, unprotected")
        for ax, (key, label) in zip(axes, panels):
            if key == "attack_accuracy":
                ax.axhline(50, color="grey", linestyle=":", linewidth=0.8)
            if log_x:  # the values themselves as ticks, without the minor ticks' crowded labels
                ax.set_xscale("log")
                values = sorted({r[x] for r in rows})
                ax.set_xticks(values, [f"{v:.3g}" for v in values], fontsize=7)
                ax.minorticks_off()
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.legend(fontsize=7)


def plot_epochs(path: Path, rows: list[dict]) -> None:
    """Fig. 3.4: the attack's accuracy and the prediction entropies against the training epochs."""
    title = "membership inference against an RNN and an FFNN (seed 003, Fig. 3.4; MNIST)"
    with saved_figure(path, 1, 2, figsize=(9, 3.3), title=title) as (fig, (left, right)):
        for arch in ARCHS:
            cell = [r for r in rows if r["arch"] == arch]
            epochs = [r["epochs"] for r in cell]
            line = left.plot(epochs, [100 * r["attack_accuracy"] for r in cell], "o-", label=arch)[0]
            right.plot(epochs, [r["entropy_members"] for r in cell], "o-", color=line.get_color(),
                       label=f"{arch}, members")
            right.plot(epochs, [r["entropy_non_members"] for r in cell], "s:", color=line.get_color(),
                       label=f"{arch}, non-members")
        left.axhline(50, color="grey", linestyle=":", linewidth=0.8)
        left.set_ylabel("attack accuracy (%)")
        right.set_ylabel("prediction entropy H_APE")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xlabel("training epochs")
            ax.legend(fontsize=7)


def plot_memorisation(path: Path, rows: list[dict], curves: dict[str, dict]) -> None:
    """Fig. 3.6. Top row, per network: its accuracy on each chunk (and on its non-members, dashed) after each
    chunk's training, the saw-tooth of training in turn. Bottom row: per chunk, in the order trained, the attack's
    accuracy at the end (mean and standard error over the runs) and the victim's accuracy on the chunk."""
    title = "memorisation: chunks trained in turn (seed 003, Fig. 3.6; MNIST)"
    with saved_figure(path, 2, 2, figsize=(9, 6.2), title=title) as (fig, axes):
        for ax, arch in zip(axes[0], ARCHS):
            chunk_accuracy = curves[arch]["chunk_accuracy"]  # [after chunk i][chunk j]
            after = range(1, len(chunk_accuracy) + 1)
            for j in range(len(chunk_accuracy[0])):
                ax.plot(after, [100 * a[j] for a in chunk_accuracy], "o-", markersize=3, label=f"chunk {j + 1}")
            ax.plot(after, [100 * a for a in curves[arch]["test_accuracy"]], "k--", label="non-members")
            ax.set_title(arch, fontsize=9)
            ax.set_xlabel("chunks trained")
            ax.set_ylabel("accuracy (%)")
            ax.legend(fontsize=6)
        for arch in ARCHS:
            cell = [r for r in rows if r["arch"] == arch]
            chunks = [r["chunk"] for r in cell]
            se = [r["attack_accuracy_se"] for r in cell]
            errors = [100 * e for e in se] if all(se) else None
            axes[1][0].errorbar(chunks, [100 * r["attack_accuracy"] for r in cell], yerr=errors, fmt="o-", capsize=2,
                                label=arch)
            axes[1][1].plot(chunks, [100 * r["train_accuracy"] for r in cell], "o-", label=arch)
        axes[1][0].axhline(50, color="grey", linestyle=":", linewidth=0.8)
        axes[1][0].set_ylabel("attack accuracy (%)")
        axes[1][1].set_ylabel("victim's accuracy on the chunk (%)")
        for ax in axes[1]:
            ax.set_xlabel("chunk of the members (1 = trained first)")
            ax.legend(fontsize=7)


def plot_regularisation(path: Path, rows: list[dict], unprotected: dict[str, dict]) -> None:
    """Fig. 3.7: the attack's and the victim's test accuracy against the l2 penalty lambda, one line per network
    and what the penalty takes; the unprotected networks dotted."""
    _two_panels(path, rows, "penalty", (("attack_accuracy", "attack accuracy (%)"),
                                        ("test_accuracy", "test accuracy (%)")),
                "l2 penalty lambda", "l2 regularisation of activations or weights (seed 003, Fig. 3.7; MNIST)",
                references=unprotected, group="penalised")


def plot_gpm(path: Path, rows: list[dict], task: str = "MNIST") -> None:
    """Fig. 3.8, bottom row: the GPM's utility loss and the attack's accuracy against sigma."""
    _two_panels(path, rows, "sigma", (("utility_loss", "utility loss (%)"), ("attack_accuracy",
                                                                               "attack accuracy (%)")),
                "GPM sigma", f"the Gaussian privacy module (seed 003, Fig. 3.8 bottom; {task})")


def plot_dp_sgd(path: Path, rows: list[dict], task: str = "MNIST",
                epsilon: str = "epsilon (DP-SGD, the same for both networks)") -> None:
    """Fig. 3.8, top row: DP-SGD's utility loss and the attack's accuracy against epsilon (``epsilon``: its axis
    label, saying what it protects)."""
    _two_panels(path, rows, "epsilon", (("utility_loss", "utility loss (%)"), ("attack_accuracy",
                                                                                 "attack accuracy (%)")),
                epsilon, f"DP-SGD (seed 003, Fig. 3.8 top; {task})")
