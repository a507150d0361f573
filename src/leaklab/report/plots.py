"""Figures for results and reports (matplotlib, Agg backend: no display needed).

* :func:`image_grid`: rows of images (e.g. originals above reconstructions), wrapped into blocks of
  ``max_cols`` columns, with an optional caption under each image and a box drawn on it (:func:`draw_box`);
* :func:`bar_plot`: grouped bars, e.g. mean PSNR per defense with the constant-image baseline, and
  optionally lines on a [0, 1] axis of their own (e.g. the cosine an update keeps per defense);
* :func:`spread_panels`: one panel per metric, each series' mean ± standard deviation with its samples;
* :func:`saved_figure`: a figure an experiment draws itself, laid out and written to its file when drawn.

All but the last return PNG bytes and, with ``path``, also write the file (atomically).
"""

from __future__ import annotations

import io as _io
import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from leaklab.io import write_bytes  # noqa: E402


def _to_png(fig) -> bytes:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


@contextmanager
def saved_figure(path: Path, nrows: int = 1, ncols: int = 1, *, title: str | None = None, dpi: int = 100,
                 rect: tuple[float, ...] | None = None, axes: bool = True, **subplots) -> Iterator[tuple]:
    """``(fig, axes)`` of ``plt.subplots(nrows, ncols, **subplots)`` (``axes`` False: ``plt.figure(**subplots)`` and
    None) to draw on; when the block ends, ``title`` as the figure's title, a tight layout (within ``rect``) and the
    PNG at ``path`` (written atomically). The figure is closed either way."""
    if axes:
        fig, drawn = plt.subplots(nrows, ncols, **subplots)
    else:
        fig, drawn = plt.figure(**subplots), None
    try:
        yield fig, drawn
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout(rect=rect)
        buf = _io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        write_bytes(path, buf.getvalue())
    finally:
        plt.close(fig)


def _show(ax, image: torch.Tensor) -> None:
    img = image.detach().float().cpu().clamp(0, 1)
    if img.shape[0] == 1:
        ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    else:
        ax.imshow(img[:3].permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def draw_box(ax, box, size: int) -> None:
    """Draw a target box ``(x1, y1, x2, y2)`` in [-1, 1] (seed 000's box, :mod:`leaklab.rl.envs`) on an
    image of ``size`` pixels a side; an all-zero box (the target out of view) draws nothing."""
    values = [float(v) for v in box]
    if not any(values):
        return
    x1, y1, x2, y2 = ((v + 1) * size / 2 - 0.5 for v in values)
    ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="lime", linewidth=1.2))


GRID_CELL = 1.3  # inches a side of one image in a grid


def image_grid(rows: Sequence[tuple[str, torch.Tensor]], path: Path | None = None,
               captions: Sequence[Sequence[str] | None] | None = None, max_cols: int = 8,
               title: str | None = None,
               boxes: Sequence[Sequence[Sequence[float]] | None] | None = None) -> bytes:
    """A grid with one row per ``(name, images)`` entry (images (N, C, H, W) in [0, 1], same N in
    every row); more than ``max_cols`` images wrap into further blocks of rows. ``boxes`` gives a row's
    target box per image (:func:`draw_box`; None: no boxes in that row)."""
    if not rows:
        raise ValueError("image_grid needs at least one row")
    n = len(rows[0][1])
    if any(len(images) != n for _, images in rows):
        raise ValueError("every row of an image grid needs the same number of images")
    cols = max(1, min(max_cols, n))
    blocks = max(1, math.ceil(n / cols))
    total_rows = blocks * len(rows)
    has_captions = captions is not None and any(c for c in captions)
    height = GRID_CELL * (1.18 if has_captions else 1.0)
    fig, axes = plt.subplots(total_rows, cols, squeeze=False,
                             figsize=(GRID_CELL * cols + 1.1, height * total_rows + (0.4 if title else 0)),
                             dpi=100)
    for b in range(blocks):
        for r, (name, images) in enumerate(rows):
            row = b * len(rows) + r
            for c in range(cols):
                ax = axes[row][c]
                i = b * cols + c
                if i >= n:
                    ax.axis("off")
                    continue
                _show(ax, images[i])
                if c == 0:
                    ax.set_ylabel(_plain(name), fontsize=8)
                caption = captions[r][i] if captions is not None and captions[r] else None
                if caption:
                    ax.set_xlabel(_plain(caption), fontsize=7)
                if boxes is not None and boxes[r] is not None:
                    draw_box(ax, boxes[r][i], images.shape[-1])
    if title:
        fig.suptitle(_plain(title), fontsize=10)
    # keep the title's strip free: tight_layout alone lets the first row's images run into it
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()) if title else None)
    data = _to_png(fig)
    if path is not None:
        write_bytes(Path(path), data)
    return data


def _plain(label: str) -> str:
    """``label`` shown as written: matplotlib reads ``$...$`` as math (and fails on bad math) and
    drops legend entries that start with ``_``."""
    label = str(label).replace("$", r"\$")
    return " " + label if label.startswith("_") else label


LABEL_INCHES = 0.075  # the width of one character of a group's label at font size 8

_LINE_STYLES = [{"marker": "o", "linestyle": "-"}, {"marker": "s", "linestyle": "--"},
                {"marker": "^", "linestyle": ":"}]  # bar_plot's lines, all black: told apart by these


def bar_plot(groups: Sequence[str], series: dict[str, Sequence[float | None]],
             path: Path | None = None, ylabel: str = "PSNR (dB)", title: str | None = None,
             baselines: dict[str, float | None] | None = None, xlabel: str | None = None,
             threshold: tuple[float, str] | None = None,
             lines: dict[str, Sequence[float | None]] | None = None, lines_label: str = "") -> bytes:
    """Grouped bars: one group per entry of ``groups``, one bar per series (None leaves a gap).

    ``baselines`` maps a series name to a reference value, drawn as a dashed line in its colour;
    ``threshold`` ``(value, label)`` is one grey dotted line for all; ``lines`` maps a label to one value
    per group (None leaves a gap), e.g. a share or a cosine, each drawn as a line on one axis at the
    right (``lines_label``), from -0.05 to 1.3 (a cosine near 0 may be slightly negative; 1 stays under the values
    written at the tallest bars' ends). Bars take tab10's colours, tab20's beyond 10 series. The figure is
    at most 11 inches wide, so that a report page shows its text at a readable size.
    """
    k = max(1, len(series))
    width = 0.8 / k
    palette = plt.get_cmap("tab10" if k <= 10 else "tab20")  # 12 series (--full) shared tab10's colours
    inches = min(11.0, max(6.0 if lines else 4.0, 1.4 * len(groups) * max(1, k / 2) + 1.5))
    fig, ax = plt.subplots(figsize=(inches, 3.2 if k <= 3 else 4.2), dpi=100)
    if threshold is not None:
        ax.axhline(threshold[0], color="0.45", linestyle=":", linewidth=1.2, label=_plain(threshold[1]))
    for j, (name, values) in enumerate(series.items()):
        xs = [g + (j - (k - 1) / 2) * width for g in range(len(groups))]
        heights = [float("nan") if v is None else float(v) for v in values]
        bars = ax.bar(xs, [0 if math.isnan(h) else h for h in heights], width, label=_plain(name),
                      color=palette(j % palette.N))
        ref = (baselines or {}).get(name)
        if ref is not None:
            ax.axhline(float(ref), color=bars.patches[0].get_facecolor() if bars.patches else None,
                       linestyle="--", linewidth=1.2, label=_plain(f"{name}: baseline"))
        for bar, h in zip(bars, heights):  # each value at its bar's end; upright when the bars are too narrow
            if not math.isnan(h):
                ax.annotate(f"{h:.1f}", (bar.get_x() + bar.get_width() / 2, h), ha="center",
                            va="bottom" if h >= 0 else "top", fontsize=7, rotation=90 if k > 4 else 0)
    ax.margins(y=0.15 if k > 4 else 0.08)  # room for the values at the bars' ends
    ax.set_xticks(range(len(groups)))
    crowded = max(len(str(g)) for g in groups) * LABEL_INCHES > (inches - 1.5) / max(1, len(groups))
    ax.set_xticklabels([_plain(g) for g in groups], fontsize=8, rotation=20 if crowded else 0,
                       ha="right" if crowded else "center")  # slanted where they would run into each other
    ax.set_ylabel(_plain(ylabel))
    if xlabel:
        ax.set_xlabel(_plain(xlabel))
    if title:
        ax.set_title(_plain(title), fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if lines:
        right = ax.twinx()
        for (label, values), style in zip(lines.items(), _LINE_STYLES * len(lines)):
            ys = [float("nan") if v is None else float(v) for v in values]
            handles += right.plot(range(len(groups)), ys, color="black", linewidth=1.2, markersize=4,
                                  label=_plain(label), **style)
            labels.append(_plain(label))
        right.set_ylim(-0.05, 1.3)  # a cosine of 1 below the values at the tallest bars' ends
        right.set_ylabel(_plain(lines_label), fontsize=8)
        right.spines[["top"]].set_visible(False)
    if len(series) > 1 or baselines or threshold or lines:  # with lines the legend goes above the axes,
        # where it covers neither the bars nor the lines
        ax.legend(handles, labels, fontsize=7, **({"loc": "lower center", "bbox_to_anchor": (0.5, 1.08),
                                                   "ncol": min(4, len(labels))} if lines else {"loc": "best"}))
    ax.spines[["top"] + ([] if lines else ["right"])].set_visible(False)
    fig.tight_layout()
    data = _to_png(fig)
    if path is not None:
        write_bytes(Path(path), data)
    return data


def spread_panels(panels: dict[str, dict[str, Sequence[float]]], path: Path | None = None,
                  title: str | None = None, log: Sequence[str] = ()) -> bytes:
    """One panel per metric (``panels``: metric label -> series name -> per-sample values): a bar at
    each series' mean, a whisker of ± one standard deviation and the samples as dots, so a reader
    sees how stable a method is, not only its mean. Panels named in ``log`` use a log scale (their
    non-positive values are left out there); non-finite values are left out everywhere."""
    if not panels:
        raise ValueError("spread_panels needs at least one panel")
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(2.1 * len(panels) + 0.6, 3.0),
                             dpi=100)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (label, series) in zip(axes[0], panels.items()):
        names = list(series)
        for j, name in enumerate(names):
            values = [float(v) for v in series[name] if v is not None and math.isfinite(float(v))]
            if label in log:
                values = [v for v in values if v > 0]
            if not values:
                continue
            mean, std = statistics.fmean(values), statistics.pstdev(values)
            colour = colours[j % len(colours)]
            ax.bar(j, mean, 0.6, color=colour, alpha=0.45)
            ax.errorbar(j, mean, yerr=std, color="black", capsize=3, linewidth=1)
            offsets = [0.22 * ((i % 7) / 3 - 1) for i in range(len(values))]
            ax.scatter([j + o for o in offsets], values, s=6, color=colour, zorder=3)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([_plain(n) for n in names], fontsize=7, rotation=30, ha="right")
        ax.set_title(_plain(label), fontsize=9)
        if label in log:
            ax.set_yscale("log")
        ax.spines[["top", "right"]].set_visible(False)
    if title:
        fig.suptitle(_plain(title), fontsize=10)
    fig.tight_layout()
    data = _to_png(fig)
    if path is not None:
        write_bytes(Path(path), data)
    return data
