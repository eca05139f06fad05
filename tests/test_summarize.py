"""`python -m mlperf_logs.summarize`: a real 2 learning rates x 2 seeds sweep (conftest.TINY_SWEEP), summarised,
then damaged copies; a real run whose log has a name of its own (mlperf.log_file)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import rundir
from mlperf_logs import summarize
from tests.conftest import ALL_EPOCHS, REPO, TINY_RUN, mllog_events, promoted, straight_run
from tests.jpeg_samples import png
from tests.user_folder import files, plant

SUMMARIZE = [sys.executable, "-m", "mlperf_logs.summarize"]
Edit = Callable[[list[str]], list[str]]


@pytest.fixture(scope="session")
def sweep(tiny_sweep: Path) -> Path:
    return tiny_sweep


@pytest.fixture(scope="session")
def summarized(sweep: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SUMMARIZE, str(sweep)], cwd=REPO, capture_output=True, text=True, timeout=300)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def event(events: list[dict], key: str) -> dict:
    return next(e for e in events if e["key"] == key)


def expected_row(log: Path) -> dict[str, str]:
    """The figures a row must show, computed straight from the run's own log."""
    events = mllog_events(log)
    start, stop = event(events, "run_start"), event(events, "run_stop")
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    block = event(events, "block_stop")["time_ms"] - event(events, "block_start")["time_ms"]
    success = stop["metadata"]["status"] == "success"
    return {
        "seed": str(event(events, "seed")["value"]),
        "status": stop["metadata"]["status"],
        "epochs_to_target": str(evals[-1]["metadata"]["epoch_num"]) if success else "",
        "time_to_train_min": f"{(stop['time_ms'] - start['time_ms']) / 60_000:.3f}" if success else "",
        "train_img_s": f"{event(events, 'train_samples')['value'] / (block / 1000):.1f}",
        "top1": f"{evals[-1]['value']:.4f}",
    }


def test_the_table_has_a_row_per_run_with_the_swept_overrides_and_the_logs_figures(sweep, summarized):
    assert summarized.returncode == 0, summarized.stderr
    figures = json.loads(summarized.stdout.strip().splitlines()[-1])
    assert figures["runs"] == 4 and figures["swept"] == ["optim.base_lr"]
    rows = read_csv(Path(figures["csv"]))
    assert Path(figures["csv"]) == sweep / "summary.csv"
    assert list(rows[0])[:2] == ["optim.base_lr", "seed"]  # experiment=smoke is the same everywhere: no column
    runs = sorted((row["optim.base_lr"], row["seed"]) for row in rows)
    assert runs == [("2", "1"), ("2", "2"), ("4", "1"), ("4", "2")]
    for row in rows:
        expected = expected_row(Path(row["run_dir"]) / "mlperf.log")
        assert {key: row[key] for key in expected} == expected, row["run_dir"]
    assert figures["succeeded"] == sum(row["status"] == "success" for row in rows)
    printed = [line.split() for line in summarized.stdout.splitlines()]
    for row in rows:  # the printed table holds the CSV's rows
        assert " ".join(value for value in row.values() if value).split() in printed


def test_the_plots_are_pngs(summarized):
    plots = [Path(p) for p in json.loads(summarized.stdout.strip().splitlines()[-1])["plots"]]
    assert [p.name for p in plots] == ["summary_optim.base_lr.png", "summary_accuracy.png"]
    for plot in plots:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def damaged_copy(run: Path, destination: Path, edit: Edit) -> None:
    """A copy of a run directory (weights left out) whose mlperf.log lines pass through `edit`."""
    shutil.copytree(run, destination, ignore=shutil.ignore_patterns("*.pt"))
    log = destination / "mlperf.log"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(edit(lines)))


def without(key: str) -> Edit:
    return lambda lines: [line for line in lines if f'"key": "{key}"' not in line]


def cut_short(lines: list[str]) -> list[str]:
    middle = len(lines) // 2
    return [*lines[:middle], lines[middle][:40] + "\n", *lines[middle + 1 :]]


def test_damaged_logs_are_listed_as_incomplete_or_failing_never_dropped(sweep, tmp_path, capsys):
    damaged = tmp_path / "damaged"
    damaged_copy(sweep / "0", damaged / "no_run_stop", without("run_stop"))
    damaged_copy(sweep / "0", damaged / "cut_line", cut_short)
    damaged_copy(sweep / "0", damaged / "no_batch_size", without("global_batch_size"))
    damaged_copy(sweep / "0", damaged / "reached_target", promoted)
    csv_path = tmp_path / "table.csv"
    assert summarize.main([str(sweep), str(damaged), "--csv", str(csv_path), "--plots", str(tmp_path)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (figures["runs"], figures["incomplete"], figures["fails_checker"]) == (8, 2, 1)
    rows = {Path(row["run_dir"]).name: row for row in read_csv(csv_path)}
    assert (rows["no_run_stop"]["status"], rows["no_run_stop"]["note"]) == ("incomplete", "no run_stop")
    assert (rows["cut_line"]["status"], rows["cut_line"]["note"]) == ("incomplete", "1 unparsable line")
    assert rows["no_batch_size"]["status"] == "fails checker"
    assert "global_batch_size" in rows["no_batch_size"]["note"]
    reached = rows["reached_target"]
    expected = expected_row(damaged / "reached_target" / "mlperf.log")
    assert {key: reached[key] for key in expected} == expected and reached["epochs_to_target"] == "1"
    assert all(rows[copy.name]["optim.base_lr"] == "2" for copy in damaged.iterdir())  # still in the sweep's columns
    for plot in figures["plots"]:
        assert Path(plot).read_bytes()[:4] == b"\x89PNG"


# A run whose log has a name of its own, made with other modules' tiny runs (conftest.straight_runs).
NAMED = (*TINY_RUN, "run.max_epochs=1", *ALL_EPOCHS, "mlperf.log_file=named.log", "run.progress=none")
NAMED_LOG = straight_run("test_summarize named log", *NAMED)


def test_a_run_whose_log_has_a_name_of_its_own_is_found_and_summarised(straight_runs, tmp_path, capsys):
    """mlperf.log_file=named.log: the run's directory holds named.log and no mlperf.log, and summarising the folder
    above it finds the run through its config.yaml (rundir.mlperf_log) and reads that log. Every name in the
    directory is one that rundir declares."""
    run = straight_runs[NAMED_LOG]
    assert run.status == 0, run.stdout + run.stderr
    named = run.run_dir  # alone in its folder
    log = named / "named.log"
    assert rundir.mlperf_log(named) == log and not (named / rundir.MLPERF_LOG).exists()
    assert [p.name for p in named.iterdir() if not rundir.written_by_run(p.name, log.name)] == []

    csv_path = tmp_path / "table.csv"
    assert summarize.main([str(named.parent), "--csv", str(csv_path), "--plots", str(tmp_path / "plots")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"] == 1
    (row,) = read_csv(csv_path)
    assert row["run_dir"] == str(named)
    assert {key: row[key] for key in expected_row(log)} == expected_row(log)


def test_a_missing_directory_exits_2(tmp_path):
    result = subprocess.run([*SUMMARIZE, str(tmp_path / "nowhere")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert "nowhere: no such directory" in result.stderr and "Traceback" not in result.stderr


def test_a_directory_without_logs_exits_2(tmp_path, capsys):
    assert summarize.main([str(tmp_path)]) == 2
    assert "holds no mlperf.log" in capsys.readouterr().err


def test_a_users_table_or_plot_is_never_overwritten_and_a_summarys_own_is(tmp_path, capsys):
    runs = tmp_path / "runs"
    plant(runs, "r1/mlperf.log")  # a damaged log: summarised as incomplete
    plant(runs, "summary.csv", "notes.txt")  # the user's, one by the name of the summary's table
    before = files(runs)
    assert summarize.main([str(runs)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{runs / 'summary.csv'} exists and was not written by a summary" in error
    assert files(runs) == before

    assert summarize.main([str(runs), "--csv", str(runs / "table.csv")]) == 0  # elsewhere: written, and again
    assert summarize.main([str(runs), "--csv", str(runs / "table.csv")]) == 0
    (runs / "summary_accuracy.png").write_bytes(png(20, 30))  # the user's image by the plot's name
    before = files(runs)
    capsys.readouterr()
    assert summarize.main([str(runs), "--csv", str(runs / "table.csv")]) == 2
    assert "summary_accuracy.png exists and was not written by a summary" in capsys.readouterr().err
    assert files(runs) == before


def test_summarize_is_a_leaf_that_knows_nothing_of_models_or_backends():
    leaves = "{'models', 'backends', 'train', 'torch'}"
    probe = f"import sys, mlperf_logs.summarize; print(sorted({leaves} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
