"""The benchmarks run end to end on tiny settings and end with their JSON line (their figures come from bench/)."""

import json
import subprocess
import sys
from pathlib import Path

from bench.precision import curves

REPO = Path(__file__).resolve().parent.parent


def test_loader_bench_prints_its_table_then_the_figures_as_json():
    command = [sys.executable, "-m", "bench.loader", "--images", "8", "--seconds", "0.1", "--rounds", "1"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    lines = result.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    keys = ("torchvision_img_s", "fused_img_s", "floor_img_s", "ratio_vs_torchvision", "fraction_of_floor")
    assert all(figures[key] > 0 for key in keys)
    ratio = figures["fused_img_s"] / figures["torchvision_img_s"]  # of the rounded rates: agree to rounding
    assert abs(figures["ratio_vs_torchvision"] - ratio) < 0.002
    assert any(line.startswith("fused ") for line in lines) and any("loader, " in line for line in lines)


def test_loader_bench_refuses_a_folder_that_is_not_a_dataset(tmp_path):
    command = [sys.executable, "-m", "bench.loader", "--data", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "no train/ folder" in result.stderr


def test_precision_bench_prints_the_plot_curves_as_a_table():
    results = {"fp32": {"curve": [(1, 0.5), (2, 0.8)]}, "fp16.16": {"curve": [(1, 0.25)]}}
    assert curves(results).splitlines() == [
        "epoch          fp32       fp16.16",
        "    1        0.5000        0.2500",
        "    2        0.8000             -",
    ]
