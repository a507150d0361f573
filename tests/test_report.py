"""leaklab.report (figures, HTML) and the quick image audit behind `make audit`."""

from __future__ import annotations

import base64
import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

from leaklab.cli import app
from leaklab.report.html import Figure, Section, Table, render_report
from leaklab.report.plots import bar_plot, image_grid, spread_panels

torch.set_num_threads(1)
PNG = b"\x89PNG\r\n\x1a\n"


def test_image_grid_rgb_grey_and_wrapping(tmp_path):
    rgb = torch.rand(3, 3, 8, 8)
    data = image_grid([("original", rgb), ("reconstruction", rgb.flip(0))], tmp_path / "g.png",
                      captions=[None, ["1.0 dB", "2.0 dB", "3.0 dB"]], title="t")
    assert data.startswith(PNG) and (tmp_path / "g.png").read_bytes() == data
    grey = torch.rand(11, 1, 8, 8)
    assert image_grid([("faces", grey)], max_cols=4).startswith(PNG)


def test_boxes_are_drawn_where_they_are_in_the_frame(monkeypatch):
    """A box in [-1, 1] lands on the image's pixels (the whole frame: -0.5 to size - 0.5); an all-zero
    box, the target out of view, draws nothing; image_grid draws a row's boxes on its images."""
    from matplotlib.figure import Figure as MplFigure

    from leaklab.report import plots

    ax = MplFigure().subplots()
    plots.draw_box(ax, torch.tensor([-1.0, -1.0, 1.0, 0.0]), 150)
    plots.draw_box(ax, torch.zeros(4), 150)
    (patch,) = ax.patches
    assert (patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()) == (-0.5, -0.5, 150.0, 75.0)
    drawn = []
    monkeypatch.setattr(plots, "draw_box", lambda ax, box, size: drawn.append((box.tolist(), size)))
    images = torch.rand(2, 1, 8, 8)
    plots.image_grid([("a", images), ("b", images)], boxes=[None, [torch.ones(4), -torch.ones(4)]])
    assert drawn == [([1.0] * 4, 8), ([-1.0] * 4, 8)]


def test_image_grid_texts_are_shown_as_written():
    # a case folder named `cost$5_to_$10` is a caption; as math it failed the whole cases report
    odd = "cost$5_to_$10"
    assert image_grid([(odd, torch.rand(1, 1, 8, 8))], captions=[[odd]], title=odd).startswith(PNG)
    assert bar_plot([odd], {odd: [1.0]}, ylabel=odd, xlabel=odd, title=odd).startswith(PNG)


def test_image_grid_rejects_ragged_rows():
    try:
        image_grid([("a", torch.rand(2, 1, 4, 4)), ("b", torch.rand(3, 1, 4, 4))])
    except ValueError as e:
        assert "same number" in str(e)
    else:
        raise AssertionError("ragged rows accepted")


def test_bar_plot_with_baselines_and_gaps():
    data = bar_plot(["none", "gaussian:0.1"], {"photos": [20.0, None], "faces": [30.0, 12.0]},
                    baselines={"photos": 15.0, "faces": 11.0}, title="PSNR")
    assert data.startswith(PNG)


def test_bar_plot_gives_every_series_its_own_colour(monkeypatch):
    """--full's leakage plot has 12 series: matplotlib's 10 colours gave two pairs of them one colour each."""
    from leaklab.report import plots

    colours, real = [], plots._to_png

    def keep(fig):
        colours.extend({tuple(bar.get_facecolor()) for bar in container} for container in fig.axes[0].containers)
        return real(fig)

    monkeypatch.setattr(plots, "_to_png", keep)
    bar_plot(["none", "noise"], {f"series {i}": [float(i), 1.0] for i in range(12)})
    assert all(len(c) == 1 for c in colours) and len({c.pop() for c in colours}) == 12


def test_bar_plot_draws_a_line_on_its_own_axis(monkeypatch):
    """The room audit's leakage plot: bars in dB; the cosine an update keeps and the action accuracy per
    defense as lines on a [0, 1] axis."""
    from leaklab.report import plots

    shown, real = {}, plots._to_png

    def keep(fig):
        left, right = fig.axes
        shown["line"] = [list(map(float, line.get_ydata())) for line in right.get_lines()]
        shown["right"], shown["left"] = right.get_ylim(), left.get_ylim()
        shown["legend"] = [t.get_text() for t in left.get_legend().get_texts()]
        return real(fig)

    monkeypatch.setattr(plots, "_to_png", keep)
    data = bar_plot(["none", "noise", "dp"], {"depth": [30.0, 6.0, -12.0]},
                    lines={"kept": [1.0, 0.9, None], "action": [1.0, 0.67, 0.17]}, lines_label="share")
    assert data.startswith(PNG)
    assert shown["line"][0][:2] == [1.0, 0.9] and math.isnan(shown["line"][0][2])
    assert shown["line"][1] == [1.0, 0.67, 0.17]
    assert shown["right"] == (-0.05, 1.3) and shown["left"][0] < -12 and shown["left"][1] > 30  # 1 under the values
    assert shown["legend"] == ["depth", "kept", "action"]


def test_bar_plot_labels_are_shown_as_written(monkeypatch):
    # '$' pairs would be parsed as (here invalid) math, a leading '_' would hide the legend entry
    from leaklab.report import plots

    shown, real = {}, plots._to_png

    def keep(fig):  # the figure's texts, read before it becomes a PNG
        ax = fig.axes[0]
        shown["ticks"] = [t.get_text() for t in ax.get_xticklabels()]
        shown["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        return real(fig)

    monkeypatch.setattr(plots, "_to_png", keep)
    data = bar_plot([r"bad $\frac$", "_hidden"], {r"cost $\frac$": [1.0, 2.0], "_private": [3.0, 4.0]})
    assert data.startswith(b"\x89PNG")
    # drawn as typed: the dollar escaped (shown as '$'), the underscore kept behind a space
    assert shown["ticks"] == [r"bad \$\frac\$", " _hidden"]
    assert shown["legend"] == [r"cost \$\frac\$", " _private"]


def test_spread_panels_skips_what_it_cannot_draw(tmp_path):
    panels = {"PSNR": {"joint": [20.0, None, float("nan"), 22.0], "separate": []},
              "ε(Q) %": {"joint": [0.1, 0.0, -1.0, 1e-5], "separate": [2e-6, 3e-6]}}
    data = spread_panels(panels, tmp_path / "s.png", title="$x$", log=("ε(Q) %",))
    assert data.startswith(PNG) and (tmp_path / "s.png").read_bytes() == data
    with pytest.raises(ValueError, match="at least one panel"):
        spread_panels({})


def test_room_fig4_panels_hold_each_cells_samples(monkeypatch, tmp_path):
    from leaklab.experiments import room_tables
    from leaklab.report import plots

    def cell(offset: float) -> dict:
        return {"samples": [{"metrics": {m: offset + i for m in room_tables.FIG4_PANELS.values()}}
                            for i in range(3)]}

    results = {"joint": cell(100.0), "error-direction": cell(200.0), "exact": cell(300.0), "dlg-opt": cell(0)}
    drawn = {}
    monkeypatch.setattr(plots, "spread_panels", lambda panels, path, **kw: drawn.update(panels) or b"")
    room_tables.fig4(results, tmp_path / "f.png", 3)
    assert list(drawn) == list(room_tables.FIG4_PANELS)
    for series in drawn.values():
        assert series == {"joint": [100.0, 101.0, 102.0], "separate (QGI)": [200.0, 201.0, 202.0],
                          "exact mode": [300.0, 301.0, 302.0]}


def test_render_report_embeds_figures_and_escapes(tmp_path):
    png = bar_plot(["a"], {"s": [1.0]})
    html = render_report(tmp_path / "r.html", "Audit <1>", summary=[("seconds", 1.23456), ("ok", True)],
                         figures=[Figure("bars", png)],
                         sections=[Section("S & T", "text <b>", [Figure("grid", png, "cap")],
                                           [Table(["name", "psnr"], [["x<y", 12.345], ["z", None],
                                                                     ["w", float("nan")]])])])
    assert (tmp_path / "r.html").read_text() == html
    assert "Audit &lt;1&gt;" in html and "S &amp; T" in html and "x&lt;y" in html
    assert "12.35" in html and "1.23" in html and "yes" in html and "nan" not in html
    uris = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(uris) == 2 and base64.b64decode(uris[0]).startswith(PNG)


def test_quick_image_audit_writes_report_and_results(tmp_path):
    out = tmp_path / "audit"
    result = CliRunner().invoke(app, ["audit", "--kind", "images", "--quick", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3  # bar plot + one grid per scenario
    assert "baseline PSNR (dB)" in html and "gaussian:0.01" in html
    assert "A --quick run: each attack ran a few iterations" in html  # it read like a real audit
    assert "warning: a --quick run: each attack ran a few iterations" in result.stderr  # the command says so too
    res = json.loads((out / "results.json").read_text())
    assert res["format"] == "leaklab.audit" and res["quick"] is True
    defenses = {s["defense"] for s in res["settings"]}
    assert defenses == {"none", "gaussian:0.01", "prune:0.5,gaussian:0.01"}
    assert {s["dataset"] for s in res["settings"]} == {"photos", "faces"}
    for setting in res["settings"]:  # each summary is its samples' mean, and the report's plot shows it
        rows = setting["samples"]
        assert setting["summary"]["psnr_mean"] == pytest.approx(sum(r["psnr"] for r in rows) / len(rows))
        assert setting["summary"]["psnr_baseline_mean"] == pytest.approx(
            sum(r["psnr_baseline"] for r in rows) / len(rows))
        key = next(k for k in res["summary"]["psnr_mean"] if k.startswith(setting["scenario"])
                   and k.endswith(setting["defense"]))
        assert res["summary"]["psnr_mean"][key] == pytest.approx(setting["summary"]["psnr_mean"])
        assert (out / setting["case"] / "view.json").exists()
        # what the defense costs: the median cosine of the sent updates with the true ones
        kept = setting["summary"]["update_cosine_median"]
        assert kept == 1.0 if setting["defense"] == "none" else -1 <= kept < 1
    assert "update kept (cosine)" in html
    for name in ("photos.png", "faces.png", "psnr_per_defense.png"):
        assert (out / "figures" / name).read_bytes().startswith(PNG)
