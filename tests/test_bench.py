"""The benchmarks run end to end on tiny settings and end with their JSON line (their figures come from bench/)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import convergence, folders, ipu_cases, loader, photos, precision
from bench import index as index_bench
from bench.loader import generate_photos, write_dali_indexes
from bench.precision import curves
from data.config import SyntheticConfig
from data.datasets import open_dataset
from data.shards.write import ensure_shards
from tests.user_folder import files, plant

REPO = Path(__file__).resolve().parent.parent
LOADER = ["--images", "8", "--seconds", "0.05", "--rounds", "1", "--workers", "1", "--shard-size", "200KB"]
HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None


def run_loader_bench(*command: str) -> tuple[list[str], dict]:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    lines = result.stdout.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_loader_bench_prints_its_table_then_the_figures_as_json_without_dali(monkeypatch, capsys):
    """`python -m bench.loader`'s main, here, where importing nvidia.dali fails as where it is not installed."""
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    assert loader.main(LOADER) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    keys = ("torchvision_img_s", "fused_img_s", "floor_img_s", "ratio_vs_torchvision", "fraction_of_floor")
    shard_keys = ("torchvision_shards_img_s", "fused_shards_img_s", "loader_img_s", "loader_shards_img_s")
    reads = [f"read_{cache}_s_{source}" for cache in ("warm", "dropped") for source in ("files", "shards")]
    assert all(figures[key] > 0 for key in (*keys, *shard_keys, *reads))
    ratio = figures["fused_img_s"] / figures["torchvision_img_s"]  # of the rounded rates: agree to rounding
    assert abs(figures["ratio_vs_torchvision"] - ratio) < 0.002
    dali_keys = ("dali_img_s", "dali_shards_img_s", "fused_over_dali", "fused_over_dali_shards", "dali_cpu_per_wall")
    assert all(figures[key] is None for key in dali_keys)
    shards = figures["opens_per_epoch_shards"]  # one per shard and worker, and one worker: the shards
    assert figures["opens_per_epoch_files"] == 8 and 2 <= shards < 8
    assert any(line.startswith("fused ") for line in lines)
    assert any(line.startswith("loader, 1 workers, shards ") for line in lines)
    assert any(line.startswith("DALI CPU ") and "DALI not installed: make peers" in line for line in lines)


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is an optional peer (make peers)")
def test_loader_bench_times_dali_on_the_same_core_from_files_and_shards():
    lines, figures = run_loader_bench(sys.executable, "-m", "bench.loader", *LOADER)
    assert figures["dali_img_s"] > 0 and figures["dali_shards_img_s"] > 0
    assert abs(figures["fused_over_dali"] - figures["fused_img_s"] / figures["dali_img_s"]) < 0.002
    assert figures["dali_cpu_per_wall"] <= 1.05  # DALI's threads stayed on the bench's one CPU
    assert any(line.startswith("fused over DALI CPU ") for line in lines)


@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is an optional peer (make peers)")
def test_loader_bench_writes_the_dali_index_that_dalis_own_tool_writes(tmp_path):
    import wds2idx  # installed with DALI

    generate_photos(tmp_path / "photos", 6)
    train, val = open_dataset("imagenet", str(tmp_path / "photos"), SyntheticConfig())
    shards, _ = ensure_shards(train, val, tmp_path / "shards", shard_size=200_000)
    ours = write_dali_indexes(shards, tmp_path / "index")
    assert len(ours) == len(shards.files) > 1
    for index, tar in zip(ours, shards.files, strict=True):
        with wds2idx.IndexCreator(str(tar), str(tmp_path / "theirs.idx"), verbose=False) as creator:
            creator.create_index()
        assert index.read_text() == (tmp_path / "theirs.idx").read_text()


def test_loader_bench_refuses_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    assert loader.main(["--data", str(tmp_path)]) == 2
    assert "not in an ImageNet layout" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("main", "option", "names"),
    [
        (photos.main, "DIR", ["train/n00000000/n00000000_0.JPEG"]),  # a name it writes
        (precision.main, "--out", ["precision.png", "fp32/metrics.csv"]),
        (convergence.main, "--out", ["smoke-lars/notes.txt"]),
        (index_bench.main, "--root", ["torchvision-1000x1281+50/train/n00000000/n00000000_0.JPEG"]),
    ],
)
def test_a_bench_refuses_a_folder_of_the_users_files_before_writing(main, option, names, tmp_path, capsys):
    planted = plant(tmp_path, "notes.txt", *names)
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path)] if option == "DIR" else [option, str(tmp_path)])
    error = capsys.readouterr().err
    assert refused.value.code == 2 and error.count("\n") == 1
    assert error.startswith(f"error: {option} {tmp_path} holds files that no bench made")
    assert files(tmp_path) == planted


def test_a_bench_writes_into_a_new_folder_and_again_into_its_own(tmp_path):
    out = tmp_path / "photos"
    for _ in range(2):
        assert photos.main([str(out), "--images", "2", "--size", "8x8", "--workers", "1"]) == 0
    assert folders.is_ours(out) and len(list(out.rglob("*.JPEG"))) == 2


def test_precision_bench_starts_each_policy_in_a_new_run_directory(tmp_path, monkeypatch):
    """A rerun into the bench's own --out replaces its earlier runs (train.py refuses a run directory that holds a
    run's files)."""
    plant(tmp_path, "fp32/mlperf.log")  # the earlier run's

    def train_py(command: list[str], **_: object) -> None:
        run_dir = Path(next(arg for arg in command if arg.startswith("hydra.run.dir=")).split("=", 1)[1])
        assert not run_dir.exists()
        plant(run_dir, "metrics.csv")

    monkeypatch.setattr(precision.subprocess, "run", train_py)
    assert precision.train("fp32", tmp_path, []) == []  # the metrics.csv of the new run, which has no rows


def test_precision_bench_prints_the_plot_curves_as_a_table():
    results = {"fp32": {"curve": [(1, 0.5), (2, 0.8)]}, "fp16.16": {"curve": [(1, 0.25)]}}
    assert curves(results).splitlines() == [
        "epoch          fp32       fp16.16",
        "    1        0.5000        0.2500",
        "    2        0.8000             -",
    ]


@pytest.mark.slow  # 8 s; the sharded, pipelined and replicated steps it times are tests/test_ipu_*.py's
def test_ipu_cases_bench_tables_sharded_pipelined_and_replicated_then_json(capsys):
    ipu_cases.main(["--micro-batch", "2", "--grad-accum", "4", "--image-size", "64"])
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert list(figures) == [case.name for case in ipu_cases.CASES]
    sharded, pipelined, replicated = figures["sharded"], figures["pipelined"], figures["replicated"]
    assert sharded["busy_pct"] == 25.0 and replicated["busy_pct"] == 100.0  # one IPU of 4 at a time; no pipeline
    assert sharded["busy_pct"] < pipelined["busy_pct"] < 100
    assert len(sharded["cuts"]) == 3 and len(pipelined["cuts"]) == 3
    assert sharded["img_s"] < pipelined["img_s"] < replicated["img_s"] and all(row["fits"] for row in figures.values())
    assert figures["combined (4 x 4)"]["ipus"] == 16 and figures["combined (4 x 4)"]["cuts"] == pipelined["cuts"]
    assert any(line.startswith("sharded ") for line in lines)
