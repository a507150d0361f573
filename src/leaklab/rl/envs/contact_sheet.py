"""A contact sheet of the active-perception rooms: the first observation of each layout.

For a look at the private data of seed 000 ("Your Room is not Private", section III "Active
Perception Task": RGB image, depth image and the target's box) in every room of :mod:`.layouts`:
per layout the RGB frame with the target box drawn and the depth frame, titled with the layout name.
"""

import io
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from leaklab.errors import LeaklabError  # noqa: E402
from leaklab.io import write_bytes  # noqa: E402
from leaklab.rl.envs.active_perception import ActivePerceptionEnv  # noqa: E402
from leaklab.rl.envs.layouts import LAYOUTS  # noqa: E402

_PER_ROW = 4  # layouts per row, two panels each


def contact_sheet(out: Path, layouts: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Write the PNG contact sheet of ``layouts`` (default: all) reset with ``seed`` to ``out``."""
    names = list(LAYOUTS) if layouts is None else list(layouts)
    if not names:
        raise LeaklabError("no layouts given for the contact sheet; pass at least one layout name")
    rows, cols = math.ceil(len(names) / _PER_ROW), 2 * min(len(names), _PER_ROW)
    fig = Figure(figsize=(1.6 * cols, 1.8 * rows), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, name in enumerate(names):
        env = ActivePerceptionEnv(layout=name)
        try:
            obs, info = env.reset(seed=seed)
        finally:
            env.close()
        size = obs["rgb"].shape[-1]
        rgb_ax, depth_ax = axes[i // _PER_ROW, 2 * (i % _PER_ROW)], axes[i // _PER_ROW, 2 * (i % _PER_ROW) + 1]
        rgb_ax.imshow(obs["rgb"].transpose(1, 2, 0), interpolation="nearest")
        if info["visible"]:
            x1, y1, x2, y2 = (float(v + 1) * size / 2 - 0.5 for v in obs["box"])
            rgb_ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="lime", linewidth=1.2))
        rgb_ax.set_title(f"{name}\n{info['target']}", fontsize=7)
        depth_ax.imshow(obs["depth"][0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        depth_ax.set_title("depth", fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    out = Path(out)
    write_bytes(out, buf.getvalue())
    return out
