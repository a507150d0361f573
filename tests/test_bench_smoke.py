"""`benchmarks/run.py --quick` runs and writes its JSON (keys only: no speed is asserted)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from leaklab.names import DEFAULT_ARCH

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("leaklab_bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_benchmark_writes_its_json(tmp_path):
    threads = torch.get_num_threads()
    try:
        code = _bench().main(["--out", str(tmp_path), "--quick", "--threads", "1", "--only", "inversion",
                              "--iterations", "2", "--instances", "2"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    data = json.loads((tmp_path / "inversion_speed.json").read_text())
    for key in ("benchmark", "timestamp", "device", "torch", "threads", "case", "simulator", "targets",
                "single", "single_loop_simulator", "batched", "load_average_before", "load_average_after"):
        assert key in data
    assert data["threads"] == 1 and data["quick"] is True and data["complete"] is True
    for precision in ("fp32", "bf16"):
        assert data["single"][precision]["iterations_per_second"] > 0
        assert data["single_loop_simulator"][precision]["iterations_per_second"] > 0
        batched = data["batched"][precision]
        for key in ("instances", "batched_instance_iterations_per_second",
                    "sequential_instance_iterations_per_second", "speedup"):
            assert key in batched
        ceiling = data["ceiling"][precision]
        assert ceiling["gflop_per_iteration"] > 0 and ceiling["peak_gflops"] > 0
        assert abs(ceiling["max_batched_speedup"] * ceiling["single_share_of_peak"] - 1) < 1e-9
    assert not list(tmp_path.glob("*.tmp"))


def test_quick_room_benchmark_writes_its_json(tmp_path):
    assert _bench().main(["--out", str(tmp_path), "--quick", "--only", "rooms", "--room-samples", "1"]) == 0
    data = json.loads((tmp_path / "room_speed.json").read_text())
    assert data["benchmark"] == "room_speed" and data["targets"] and data["arch"] == DEFAULT_ARCH
    for setting in ("S1", "S2"):
        assert data["settings"][setting]["samples_per_minute"] > 0
        assert data["settings"][setting]["samples"] == 1
    assert data["complete"] is True and not (tmp_path / "inversion_speed.json").exists()


def test_quick_planning_benchmark_writes_its_json(tmp_path):
    assert _bench().main(["--out", str(tmp_path), "--quick", "--only", "planning"]) == 0
    data = json.loads((tmp_path / "planning_speed.json").read_text())
    assert data["benchmark"] == "planning_speed" and data["complete"] is True and len(data["settings"]) == 3
    for row in data["settings"]:
        assert row["synthesis_and_bounds_seconds"] > 0 and row["lp_seconds"] > 0
        assert row["lp_vs_closed_form_max_difference"] < 1e-9
    assert not (tmp_path / "room_speed.json").exists()


def test_a_stopped_benchmark_leaves_a_file_that_says_so(tmp_path, monkeypatch):
    """A run of fp32 and bf16 stopped during bf16 left a file shaped as a finished fp32-only run."""
    bench = _bench()
    rate = bench._rate

    def stop_in_bf16(view, updates, config, device):
        if config.precision == "bf16":
            raise KeyboardInterrupt
        return rate(view, updates, config, device)

    monkeypatch.setattr(bench, "_rate", stop_in_bf16)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(KeyboardInterrupt):
            bench.main(["--out", str(tmp_path), "--quick", "--threads", "1", "--only", "inversion",
                        "--iterations", "2", "--instances", "2"])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "inversion_speed.json").read_text())
    assert data["complete"] is False and "load_average_after" not in data and list(data["single"]) == ["fp32"]


@pytest.mark.parametrize("option", ["--room-samples", "--threads", "--iterations"])
def test_a_count_under_one_is_refused(tmp_path, option):
    with pytest.raises(SystemExit) as stop:  # argparse's one-line usage error (0 was read as the default)
        _bench().main(["--out", str(tmp_path), "--quick", option, "0"])
    assert stop.value.code == 2 and not list(tmp_path.iterdir())


def test_unknown_benchmark_is_refused(tmp_path, capsys):
    assert _bench().main(["--out", str(tmp_path), "--quick", "--only", "gpu"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


def test_unknown_precision_is_refused(tmp_path, capsys):
    assert _bench().main(["--out", str(tmp_path), "--quick", "--precisions", "fp16"]) == 2
    assert "unknown precision" in capsys.readouterr().err
