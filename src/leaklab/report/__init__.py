"""Reports: image grids and bar plots (:mod:`leaklab.report.plots`) and the HTML report
(:mod:`leaklab.report.html`, a jinja2 template with the images embedded as base64 PNG)."""

from leaklab.report.html import render_report
from leaklab.report.plots import bar_plot, image_grid, spread_panels

__all__ = ["bar_plot", "image_grid", "render_report", "spread_panels"]
