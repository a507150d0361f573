"""A self-contained HTML report (jinja2 template ``templates/report.html``).

The report is built from plain data, so any experiment can use it::

    render_report(path, title="Image audit", summary=[("device", "cpu")],
                  figures=[Figure("PSNR per defense", png_bytes)],
                  sections=[Section(title="Photos", text="...", figures=[...], tables=[Table(...)])])

Figures are PNG bytes embedded as base64 data URIs: the HTML file is the whole report and can be
mailed or archived on its own. Every string is HTML-escaped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from leaklab.io import write_bytes

_TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class Figure:
    title: str
    png: bytes
    caption: str = ""

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


@dataclass
class Table:
    columns: list[str]
    rows: list[Sequence[Any]]
    title: str = ""
    caption: str = ""


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


def _fmt(value: Any) -> str:
    """Numbers to short strings: floats with 2 decimals (None and NaN, no value, as an en dash: the glance's gain
    read "nan" where no image was scored), booleans as yes/no."""
    if value is None or (isinstance(value, float) and value != value):
        return "\u2013"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _is_text(value: Any) -> bool:
    """Whether a table cell is words (left-aligned) rather than a number, a share or a count."""
    return isinstance(value, str) and not re.match(r"[-+]?\d", value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.tests["text"] = _is_text
    return env


def render_report(path: Path | None, title: str, summary: list[tuple[str, Any]] | None = None,
                  figures: list[Figure] | None = None, sections: list[Section] | None = None,
                  intro: str = "", notice: str = "", lead: str = "") -> str:
    """Render the report (``notice``: a highlighted caveat above everything else; ``lead``: the report's
    conclusion in a sentence or two, in bold before the introduction); with ``path`` also write it
    (atomically). Returns the HTML."""
    html = _environment().get_template("report.html").render(
        title=title, notice=notice, lead=lead, intro=intro, summary=summary or [], figures=figures or [],
        sections=sections or [])
    if path is not None:
        write_bytes(Path(path), html.encode("utf-8"))
    return html
