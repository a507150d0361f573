import json

from typer.testing import CliRunner

from leaklab.cli import app


def test_inversion_checks_quick_writes_results(tmp_path, monkeypatch):
    out = tmp_path / "checks"
    result = CliRunner().invoke(app, ["reproduce", "inversion-checks", "--quick", "--checks",
                                      "idlg,analytic", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["checks"]["idlg"]["accuracy"] == 1.0
    assert data["checks"]["analytic"]["psnr_min"] > 100
    # stopped in its first check, a rerun into the same --out left the earlier run's checks as its own
    from leaklab.experiments import inversion_checks

    def stopped(n):
        raise KeyboardInterrupt
    monkeypatch.setattr(inversion_checks, "check_analytic", stopped)
    CliRunner().invoke(app, ["reproduce", "inversion-checks", "--quick", "--checks", "analytic", "--out", str(out)])
    assert json.loads((out / "results.json").read_text())["checks"] == {}


def test_unknown_check_is_one_line_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["reproduce", "inversion-checks", "--checks", "foo",
                                      "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert not (tmp_path / "x").exists()


def test_images_for_the_idlg_check_alone_is_refused(tmp_path):
    """--images was ignored by --checks idlg, whose 50 images are its acceptance line."""
    result = CliRunner().invoke(app, ["reproduce", "inversion-checks", "--checks", "idlg", "--images", "3",
                                      "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "idlg always runs 50" in result.stderr
    assert not (tmp_path / "x").exists()
