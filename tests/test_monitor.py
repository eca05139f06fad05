"""monitor/: what a person watches during a run and reads after it, in process. The progress bar or lines, each
epoch's line and the summary (progress.py); the metrics CSV and TensorBoard cut back to a resumed run's checkpoint,
where each epoch's time went, and the plot (metrics.py).

Whole runs check what these leave in a run directory (tests/test_run.py), a full disk turning each off
(tests/test_storage.py) and a simulated system's clock in the lines (tests/test_ipu_projection.py)."""

import logging
import struct
import sys
import time
import types
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import rundir
from monitor.metrics import EpochMetrics, EpochTimer, MetricsCSV, plot
from monitor.progress import JOB_LOGGER, REFRESH_STEPS, Progress, epoch_line, job_log, print_summary, say
from tests.conftest import tensorboard_scalars


def row(epoch: int, *, loss: float = 2.0, accuracy: float | None = None, allreduce: float = 0.0) -> EpochMetrics:
    """An epoch of 10 steps."""
    return EpochMetrics(
        epoch=epoch,
        step=10 * epoch,
        lr=0.1,
        train_loss=loss,
        images_per_s=1234.5,
        eval_accuracy=accuracy,
        elapsed_s=60.0 * epoch,
        data_wait=0.12,
        step_time=0.78,
        allreduce=allreduce,
    )


class UnreadLoss:
    """A loss that must not be read: reading it is a host sync, which the bar makes only every REFRESH_STEPS."""

    def __float__(self) -> float:
        raise AssertionError("the loss was read between refreshes")


# --- progress.py: the bar, the lines, the summary, the job log -------------------------------------------------


def test_the_epoch_line_shows_the_figures_and_only_what_the_epoch_had():
    assert epoch_line(16, row(3)) == "epoch   3/16  loss 2.0000  lr 0.1       1234.5 img/s  data wait  12%"
    assert epoch_line(16, row(4, accuracy=0.76, allreduce=0.05)) == (
        "epoch   4/16  loss 2.0000  lr 0.1       1234.5 img/s  data wait  12%  all-reduce   5%  eval top-1 0.7600"
    )


def test_lines_mode_prints_each_epochs_line_on_stdout_and_none_mode_nothing(capsys):
    lines = Progress("lines", max_epochs=2, images_per_step=8)
    lines.start_epoch(1, steps=10)
    for step in range(1, 11):
        lines.step(step, UnreadLoss(), 0.1)  # no bar: the loss is never read
    lines.end_epoch("epoch 1 figures")
    quiet = Progress("none", max_epochs=2, images_per_step=8)
    quiet.start_epoch(1, steps=10)
    quiet.step(REFRESH_STEPS, torch.tensor(1.0), 0.1)
    quiet.end_epoch("epoch 1 again")
    assert capsys.readouterr() == ("epoch 1 figures\n", "")


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    assert Progress("auto", 2, 8).mode == "lines"  # pytest's captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert Progress("auto", 2, 8).mode == "bar"


def test_the_bar_counts_images_from_where_a_resumed_epoch_was_and_shows_loss_and_lr_every_few_steps(capsys):
    progress = Progress("bar", max_epochs=5, images_per_step=32)
    progress.start_epoch(2, steps=10, done=3)  # resumed after its third step
    bar = progress._bar
    assert bar is not None and (bar.n, bar.total) == (96, 320)
    progress.step(4, UnreadLoss(), 0.05)  # between refreshes: the loss is not read, the bar not moved
    assert bar.n == 96
    progress.step(REFRESH_STEPS, torch.tensor(1.23456), 0.05)
    assert bar.n == REFRESH_STEPS * 32
    shown = str(bar)
    assert shown.startswith("epoch 2/5:") and "160/320" in shown and "loss=1.235, lr=0.05" in shown
    progress.end_epoch("epoch line")
    assert progress._bar is None and bar.disable  # closed, and (leave=False) wiped from the terminal
    out, err = capsys.readouterr()
    assert out == "epoch line\n" and "epoch 2/5" in err


def test_the_summary_says_how_the_run_ended_and_where_its_outputs_are(capsys, tmp_path):
    print_summary("success", 0.76123, 5, 2.404, tmp_path, {}, set())
    assert capsys.readouterr().out == (
        f"\nrun_stop status success: 5 epochs, eval top-1 0.7612, time to train 2.40 min\noutputs: {tmp_path}\n"
    )
    skipped = {"a.JPEG": "truncated", "b.JPEG": "not a JPEG"}
    print_summary("aborted", None, 0, 0.5, tmp_path, skipped, {"c.JPEG"})
    assert capsys.readouterr().out == (
        "\nrun_stop status aborted: 0 epochs, eval top-1 n/a, time to train 0.50 min\n"
        "2 unreadable files skipped (each reported above)\n"
        "1 files decoded despite libjpeg's corrupt-data warnings (as PIL decodes them)\n"
        f"outputs: {tmp_path}\n"
    )


@pytest.fixture
def job_log_handler(tmp_path):
    """The root logger's file handler, as Hydra's job logging opens train.log in the run directory."""
    handler = logging.FileHandler(tmp_path / rundir.JOB_LOG)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)
    handler.close()


def test_say_shows_a_line_and_keeps_it_once_in_the_job_log_while_the_job_runs(job_log_handler, capsys):
    say("before the job")
    with job_log():
        say("epoch   1/2  loss 2.0000")
        say("error: the disk is full", error=True)
    say("after the job")
    assert capsys.readouterr() == (
        "before the job\nepoch   1/2  loss 2.0000\nafter the job\n",
        "error: the disk is full\n",
    )
    written = Path(job_log_handler.baseFilename).read_text()
    assert written == "INFO epoch   1/2  loss 2.0000\nERROR error: the disk is full\n"
    assert job_log_handler not in JOB_LOGGER.handlers  # as before the job
    assert "handleError" not in vars(job_log_handler)


# --- metrics.py: the CSV and TensorBoard, the time split, the plot ---------------------------------------------


def test_the_csv_has_a_column_per_figure_and_an_empty_cell_where_an_epoch_did_not_evaluate(tmp_path):
    metrics = MetricsCSV(tmp_path / rundir.METRICS)
    metrics.append(row(1))
    metrics.append(row(2, accuracy=0.5))
    header = (tmp_path / rundir.METRICS).read_text().splitlines()[0]
    assert header.split(",") == [field.name for field in fields(EpochMetrics)]
    rows = metrics.read()
    assert [(r["epoch"], r["step"], r["eval_accuracy"]) for r in rows] == [("1", "10", ""), ("2", "20", "0.5")]
    assert MetricsCSV(tmp_path / rundir.METRICS).read() == rows  # reopened (a resumed run): no second header
    assert MetricsCSV(None).read() == []  # ranks > 0 write nothing
    assert not list(tmp_path.glob("events.out.*"))


def test_a_resumed_run_cuts_the_csv_and_tensorboard_back_to_its_checkpoint(tmp_path):
    """A run stopped after epoch 3 with its checkpoint at epoch 1 resumes from there: the rows and points of epochs
    2 and 3 it wrote before the stop give way to the resumed run's, once each."""
    board = tmp_path / rundir.TENSORBOARD
    stopped = MetricsCSV(tmp_path / rundir.METRICS, board)
    stopped.append(row(1, loss=3.0))
    size_at_checkpoint = (tmp_path / rundir.METRICS).stat().st_size
    stopped.append(row(2, loss=2.5, accuracy=0.3))
    stopped.append(row(3, loss=2.25))
    resumed = MetricsCSV(tmp_path / rundir.METRICS, board)
    resumed.resume(size_at_checkpoint, step=10)
    assert [r["epoch"] for r in resumed.read()] == ["1"]
    resumed.append(row(2, loss=2.0, accuracy=0.4))
    assert [(r["epoch"], r["train_loss"]) for r in resumed.read()] == [("1", "3.0"), ("2", "2.0")]
    scalars = tensorboard_scalars(tmp_path)
    assert scalars["train/loss"] == [(10, 3.0), (20, 2.0)]
    assert scalars["eval/top1"] == [(20, pytest.approx(0.4))]  # epoch 1 did not evaluate: no point
    assert set(scalars) == {
        "train/loss",
        "train/lr",
        "train/images_per_s",
        "eval/top1",
        "time/data_wait",
        "time/step_time",
        "time/allreduce",
        "time/evaluation",
    }


class Clock:
    """perf_counter as the test sets it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_epoch_timer_splits_each_epochs_wall_time_by_where_it_went(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("monitor.metrics.time", types.SimpleNamespace(perf_counter=clock, time=time.time))
    waited = {"data": 7.0, "allreduce": 3.0}  # counters that only grow, from before the epoch
    timer = EpochTimer(lambda: waited["data"], lambda: waited["allreduce"])
    timer.start()
    clock.now += 6
    waited["data"] += 2
    waited["allreduce"] += 1
    with timer.evaluating():
        clock.now += 2
    clock.now += 2  # 10 s in all
    assert timer.fractions() == pytest.approx({"data_wait": 0.2, "allreduce": 0.1, "evaluation": 0.2, "step_time": 0.5})
    timer.start()  # the next epoch starts from its own counters, with no evaluation yet
    clock.now += 4
    waited["data"] += 1
    assert timer.fractions() == pytest.approx({"data_wait": 0.25, "allreduce": 0, "evaluation": 0, "step_time": 0.75})


def test_the_plot_of_a_runs_csv_is_a_png(tmp_path):
    metrics = MetricsCSV(tmp_path / rundir.METRICS)
    for epoch in (1, 2, 3):
        metrics.append(row(epoch, loss=3.0 / epoch, accuracy=0.3 * epoch if epoch > 1 else None))
    assert plot(metrics.read(), tmp_path / rundir.PLOT, target=0.759)
    png = (tmp_path / rundir.PLOT).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (700, 400)  # 7 x 4 inches at 100 dpi
