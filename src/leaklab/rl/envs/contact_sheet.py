"""Contact sheets of the active-perception rooms: the first observation of each layout, or frames.

For a look at the private data of seed 000 ("Your Room is not Private", section III "Active
Perception Task": RGB image, depth image and the target's box): :func:`contact_sheet` shows every
room of :mod:`.layouts`, per layout the RGB frame with the target box drawn and the depth frame,
titled with the layout name; :func:`frame_sheet` shows any frames so (a capture's private states).
"""

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from leaklab.errors import LeaklabError  # noqa: E402
from leaklab.io import check_png_out, write_bytes  # noqa: E402
from leaklab.report.plots import draw_box  # noqa: E402
from leaklab.rl.envs.active_perception import ActivePerceptionEnv  # noqa: E402
from leaklab.rl.envs.layouts import LAYOUTS  # noqa: E402

_PER_ROW = 4  # layouts per row, two panels each


def contact_sheet(out: Path, layouts: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Write the PNG contact sheet of ``layouts`` (default: all) reset with ``seed`` to ``out``."""
    names = list(LAYOUTS) if layouts is None else list(layouts)
    if not names:
        raise LeaklabError("no layouts given for the contact sheet; pass at least one layout name")
    check_png_out(out)
    frames = []
    for name in names:
        env = ActivePerceptionEnv(layout=name)
        try:
            obs, info = env.reset(seed=seed)
        finally:
            env.close()
        box = obs["box"] if info["visible"] else None
        frames.append(Frame(f"{name}\n{info['target']}", obs["rgb"], obs["depth"], box))
    return frame_sheet(out, frames)


@dataclass(frozen=True)
class Frame:
    """One state for a sheet: its title, RGB ``[3, S, S]`` (None: not shown), depth ``[1, S, S]`` in
    [0, 1], and the target's box in [-1, 1] (None or all zero: not in view, nothing drawn)."""

    title: str
    rgb: np.ndarray | None
    depth: np.ndarray
    box: np.ndarray | None


def frame_sheet(out: Path, frames: Sequence[Frame]) -> Path:
    """Write ``frames`` as a PNG to ``out``, :data:`_PER_ROW` per row: the RGB panel (where there
    is one) with the target box drawn, then the depth panel."""
    if not frames:
        raise LeaklabError("no frames for the contact sheet")
    panels = 2 if any(f.rgb is not None for f in frames) else 1
    rows, cols = math.ceil(len(frames) / _PER_ROW), panels * min(len(frames), _PER_ROW)
    fig = Figure(figsize=(1.6 * cols, 1.8 * rows), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, frame in enumerate(frames):
        row, col = i // _PER_ROW, panels * (i % _PER_ROW)
        depth_ax = axes[row, col + panels - 1]
        depth_ax.imshow(np.asarray(frame.depth)[0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        if frame.rgb is not None:
            axes[row, col].imshow(np.asarray(frame.rgb).transpose(1, 2, 0), interpolation="nearest")
            depth_ax.set_title("depth", fontsize=7)
        first = axes[row, col]
        first.set_title(frame.title, fontsize=7)
        if frame.box is not None:
            draw_box(first, frame.box, np.asarray(frame.depth).shape[-1])
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    out = Path(out)
    write_bytes(out, buf.getvalue())
    return out
