"""Storage faults, on real filesystems: a write of the run directory that fails for lack of room, on a read-only
filesystem or in a directory that is gone raises rundir.StorageError, one line that names the file, the filesystem
and the room, and loses nothing (the previous checkpoint, the MLPerf log's and metrics.csv's whole lines); a side
output that fails (TensorBoard, the plot, the job log) is turned off with one warning and the run goes on."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mlperf_logging.compliance_checker.mlp_parser import parse_file

import checkpoint
import rundir
from mlperf_logs.logger import MLPerfLogger
from monitor.metrics import EpochMetrics, MetricsCSV, plot
from monitor.progress import job_log, say
from tests.conftest import tensorboard_scalars
from tests.filesystems import ReadOnly, fill, read_only_directory, small_filesystem

__all__ = ["read_only_directory", "small_filesystem"]  # fixtures: pytest finds them here, by the tests' arguments

SMALL = 64 * 1024  # a filesystem of 16 pages: room for a few small files


def epoch_row(epoch: int) -> EpochMetrics:
    return EpochMetrics(
        epoch=epoch, step=10 * epoch, lr=0.1, train_loss=1 / epoch, images_per_s=900.0, eval_accuracy=0.5, elapsed_s=1
    )


def test_a_storage_error_is_one_line_naming_the_file_the_filesystem_and_the_room():
    scratch = Path("/scratch")

    def line(reason: str, fstype: str | None, needed: int | None, free: int, code: int) -> str:
        return str(rundir.StorageError(scratch / "run/checkpoint.pt", reason, scratch, fstype, needed, free, code))

    full = "no space left"
    assert line(full, "tmpfs", 95_000_000, 40_000_000, errno.ENOSPC) == (
        "no space left on /scratch (tmpfs) writing checkpoint.pt (needs 95 MB, 40 MB free)"
    )
    # needs rounded up and free space down: a write that did not fit never reads as one that would have
    assert line(full, "tmpfs", 40_000_001, 40_999_999, errno.ENOSPC).endswith("(needs 41 MB, 40 MB free)")
    assert line(full, "tmpfs", None, 40_000_000, errno.ENOSPC).endswith("checkpoint.pt (40 MB free)")
    quota = line("disk quota exceeded", "ext4", 2_000_000, 9 * 10**12, errno.EDQUOT)  # not the filesystem's free
    assert quota == "disk quota exceeded on /scratch (ext4) writing checkpoint.pt (needs 2 MB)"
    read_only = line("read-only file system", None, 2_000_000, 0, errno.EROFS)
    assert read_only == "read-only file system on /scratch writing checkpoint.pt"


def test_writing_turns_only_an_oserror_into_a_storage_error(tmp_path):
    with pytest.raises(rundir.StorageError) as failed, rundir.writing(tmp_path / "a.csv", needed=lambda: 7):
        raise OSError(errno.EIO, "Input/output error")
    assert (failed.value.reason, failed.value.needed) == ("input/output error", 7)
    assert isinstance(failed.value.__cause__, OSError)
    with pytest.raises(ValueError), rundir.writing(tmp_path / "a.csv"):
        raise ValueError("not a storage fault")


def test_a_checkpoint_that_does_not_fit_raises_one_line_and_leaves_the_previous_one(small_filesystem):
    run = small_filesystem(2_000_000)
    path = run / rundir.CHECKPOINT
    checkpoint.save_atomically(path, {"weights": torch.arange(1000.0)})
    previous = path.read_bytes()
    state = {"weights": torch.zeros(900_000)}  # 3.6 MB
    with pytest.raises(rundir.StorageError) as failed:
        checkpoint.save_atomically(path, state)
    assert str(failed.value) == f"no space left on {run} (tmpfs) writing checkpoint.pt (needs 4 MB, 1 MB free)"
    assert failed.value.needed == checkpoint.serialized_size(state)
    assert failed.value.free == rundir.free_bytes(run)  # once the temporary file was removed
    assert [entry.name for entry in run.iterdir()] == [rundir.CHECKPOINT]  # no .checkpoint.pt.tmp
    assert path.read_bytes() == previous
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.arange(1000.0))


def test_a_checkpoint_in_a_directory_that_is_gone_names_the_filesystem_it_was_on(small_filesystem):
    mount = small_filesystem(SMALL)
    run = mount / "outputs" / "run"
    run.mkdir(parents=True)
    run.rmdir()
    with pytest.raises(rundir.StorageError) as failed:
        checkpoint.save_atomically(run / rundir.CHECKPOINT, {"weights": torch.zeros(4)})
    assert str(failed.value) == f"no such file or directory on {mount} (tmpfs) writing checkpoint.pt"


def test_serialized_size_is_the_size_torch_save_writes(tmp_path):
    state = {
        "model": {"weight": torch.randn(3, 5), "bias": torch.zeros(5, dtype=torch.bfloat16)},
        "rng": torch.get_rng_state(),
        "loop": {"epoch": 2, "step": 70, "names": ["a", "b"]},
    }
    with (tmp_path / "saved.pt").open("wb") as f:
        torch.save(state, f)
    checkpoint.save_atomically(tmp_path / rundir.CHECKPOINT, state)
    size = checkpoint.serialized_size(state)
    assert size == (tmp_path / "saved.pt").stat().st_size == (tmp_path / rundir.CHECKPOINT).stat().st_size


def test_the_room_for_checkpoints_is_two_of_them_less_the_one_already_on_disk(tmp_path):
    state = {"weights": torch.zeros(1000)}
    size = checkpoint.serialized_size(state)
    path = tmp_path / rundir.CHECKPOINT
    assert checkpoint.room_needed(state, path) == 2 * size  # the first checkpoint, then its successor's copy
    assert checkpoint.room_needed(state, path, grows_by=100) == 2 * (size + 100)  # momentum the first step makes
    checkpoint.save_atomically(path, {"weights": torch.zeros(10)})
    assert checkpoint.room_needed(state, path) == 2 * size - path.stat().st_size
    checkpoint.save_atomically(path, state)
    assert checkpoint.room_needed(state, path) == size
    checkpoint.save_atomically(path, {"weights": torch.zeros(10_000)})  # a larger one on disk: room enough
    assert checkpoint.room_needed(state, path) == 0


def test_a_log_line_that_does_not_fit_is_cut_back_and_the_next_is_written_once_there_is_room(small_filesystem, capfd):
    run = small_filesystem(SMALL)
    path = run / rundir.MLPERF_LOG
    log = MLPerfLogger(path)
    log.event("submission_benchmark", "resnet")
    written = path.read_bytes()
    filler = fill(run)
    with pytest.raises(rundir.StorageError) as failed:
        log.event("rn50perf_note", "x" * 5000)  # more than the rest of the page, less than a write buffer
    assert str(failed.value) == f"no space left on {run} (tmpfs) writing mlperf.log (0 MB free)"
    assert path.read_bytes() == written
    filler.unlink()
    log.end("run_stop", metadata={"status": "aborted"})
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line.removeprefix(":::MLLOG "))["key"] for line in lines] == ["submission_benchmark", "run_stop"]
    assert all(line.startswith(":::MLLOG {") for line in lines)  # nothing of the failed line (the checker skips it)
    assert parse_file(str(path), ruleset="4.0.0")[1] == []  # the compliance checker reads it without an error
    assert capfd.readouterr().err == ""  # none of logging's "--- Logging error ---" blocks


def test_a_metrics_row_that_does_not_fit_raises_and_leaves_whole_rows(small_filesystem):
    run = small_filesystem(SMALL)
    metrics = MetricsCSV(run / rundir.METRICS)
    fill(run)
    with pytest.raises(rundir.StorageError) as failed:
        for epoch in range(1, 200):  # about 40 rows fill the page the CSV has
            metrics.append(epoch_row(epoch))
    assert str(failed.value) == f"no space left on {run} (tmpfs) writing metrics.csv (0 MB free)"
    rows = metrics.read()
    assert [int(row["epoch"]) for row in rows] == list(range(1, len(rows) + 1))
    assert all(None not in row.values() for row in rows)  # every row whole, the one that failed not begun
    assert (run / rundir.METRICS).read_text().endswith("\n")


def test_tensorboard_that_cannot_be_written_is_turned_off_with_one_warning_and_the_csv_goes_on(
    small_filesystem, tmp_path, capsys
):
    full = small_filesystem(SMALL)
    metrics = MetricsCSV(tmp_path / rundir.METRICS, full / rundir.TENSORBOARD)
    metrics.append(epoch_row(1))
    fill(full)
    for epoch in range(2, 40):  # each epoch's points are a few hundred bytes: the event file's page fills
        metrics.append(epoch_row(epoch))
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(
        f"warning: TensorBoard turned off: no space left on {full} (tmpfs) writing events.out.tfevents."
    )
    assert warning.endswith(" (0 MB free)")
    assert len(metrics.read()) == 39
    steps = [step for step, _ in tensorboard_scalars(full)["train/loss"]]
    assert 0 < len(steps) < 39 and steps == [10 * epoch for epoch in range(1, len(steps) + 1)]


def test_a_plot_that_cannot_be_written_is_removed_with_one_warning(small_filesystem, capsys):
    run = small_filesystem(SMALL)
    rows = [{"epoch": str(epoch), "train_loss": str(1 / epoch), "eval_accuracy": "0.5"} for epoch in (1, 2)]
    filler = fill(run)
    assert not plot(rows, run / rundir.PLOT, 0.759)
    assert not (run / rundir.PLOT).exists()  # not left empty
    err = capsys.readouterr().err
    assert err == f"warning: plot not written: no space left on {run} (tmpfs) writing metrics.png (0 MB free)\n"
    filler.unlink()
    assert plot(rows, run / rundir.PLOT, 0.759)
    assert (run / rundir.PLOT).read_bytes().startswith(b"\x89PNG")


def test_a_job_log_that_cannot_be_written_is_turned_off_with_one_warning(small_filesystem, capsys):
    run = small_filesystem(SMALL)
    root = logging.getLogger()
    handler = logging.FileHandler(run / rundir.JOB_LOG)  # as Hydra's job logging opens it
    root.addHandler(handler)
    lines = [f"epoch {epoch} " + "x" * 500 for epoch in range(1, 20)]
    filler = None
    try:
        with job_log():
            say("first")
            filler = fill(run)
            for line in lines:
                say(line)
        shown = capsys.readouterr()
        assert shown.out.splitlines() == ["first", *lines]  # the terminal shows every line
        warning = f"warning: job log turned off: no space left on {run} (tmpfs) writing train.log (0 MB free)"
        assert shown.err == warning + "\n"  # and none of logging's "--- Logging error ---" blocks
        assert handler not in root.handlers
    finally:
        root.removeHandler(handler)
        if filler is not None:
            filler.unlink()
        handler.close()


WRITERS: dict[str, Callable[[Path], object]] = {
    rundir.CHECKPOINT: lambda path: checkpoint.save_atomically(path, {"weights": torch.zeros(4)}),
    rundir.MLPERF_LOG: MLPerfLogger,
    rundir.METRICS: MetricsCSV,
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_read_only_directory_ends_each_essential_write_in_one_line(read_only_directory: ReadOnly, name: str):
    with pytest.raises(rundir.StorageError) as failed:
        WRITERS[name](read_only_directory.path / name)
    assert failed.value.reason == read_only_directory.reason
    assert str(failed.value).startswith(read_only_directory.says)
    assert str(failed.value).endswith(f" writing {name}")
    assert list(read_only_directory.path.iterdir()) == []
