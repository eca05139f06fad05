"""Whole runs of train.py on the tiny synthetic task: the MLPerf log, the run directory, resume."""

from __future__ import annotations

import csv
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torchvision

from optim.precision import emulates
from tests.conftest import (
    REPO,
    assert_compliant,
    assert_read_whole,
    assert_same_run,
    mllog_events,
    processes_mentioning,
    record_margin,
    run_train,
    tensorboard_scalars,
    train_env,
)


@pytest.mark.convergence
@pytest.mark.parametrize(("optimizer", "lr"), [("lars", 4.0), ("sgd", 0.1)])
def test_smoke_run_reaches_target_and_its_log_passes_the_compliance_checker(optimizer, lr, cache_dir, tmp_path):
    overrides = ("experiment=smoke", f"optim={optimizer}", f"optim.base_lr={lr}", f"hydra.run.dir={tmp_path}")
    result = run_train(*overrides, cache=cache_dir, check=True)
    log = tmp_path / "mlperf.log"
    record_margin(f"smoke {optimizer} lr {lr}", log, max_epochs=10)
    assert "data wait" in next(line for line in result.stdout.splitlines() if line.startswith("epoch"))
    assert_compliant(log)
    events = mllog_events(log)
    stop = next(e for e in events if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success"
    assert next(e for e in events if e["key"] == "opt_name")["value"] == optimizer
    seed = next(e for e in events if e["key"] == "seed")
    assert seed["metadata"]["file"] == "train.py"  # mllog names the real call site
    for name in ("config.yaml", "metrics.csv", "metrics.png", "model.pt"):
        assert (tmp_path / name).exists(), name
    weights = torch.load(tmp_path / "model.pt", weights_only=True)
    torchvision.models.resnet50(num_classes=4).load_state_dict(weights)
    assert_tensorboard_matches_metrics(tmp_path)


def assert_tensorboard_matches_metrics(run_dir: Path) -> None:
    """TensorBoard holds each epoch's loss, lr, img/s, top-1 and time split at its step, as metrics.csv does;
    the time split's fractions add up to the epoch."""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    scalars = tensorboard_scalars(run_dir)
    columns = {"train/loss": "train_loss", "train/lr": "lr", "train/images_per_s": "images_per_s"}
    for tag, column in {**columns, "time/data_wait": "data_wait", "time/step_time": "step_time"}.items():
        steps, values = zip(*scalars[tag], strict=True)
        assert list(steps) == [int(row["step"]) for row in rows], tag
        assert list(values) == pytest.approx([float(row[column]) for row in rows], rel=1e-6), tag
    assert [step for step, _ in scalars["eval/top1"]] == [int(r["step"]) for r in rows if r["eval_accuracy"]]
    for row in rows:
        split = [float(row[name]) for name in ("data_wait", "step_time", "allreduce", "evaluation")]
        assert all(0 <= share <= 1 for share in split) and sum(split) == pytest.approx(1, abs=1e-6)


def test_a_new_run_refuses_a_directory_that_holds_a_log(cache_dir, tmp_path):
    (tmp_path / "mlperf.log").write_text(":::MLLOG {}\n")
    (tmp_path / "config.yaml").write_text("earlier run\n")
    result = run_train("experiment=smoke", f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 2
    assert "run.resume" in result.stderr and "new hydra.run.dir" in result.stderr
    assert (tmp_path / "mlperf.log").read_text() == ":::MLLOG {}\n"
    assert (tmp_path / "config.yaml").read_text() == "earlier run\n"


RESUME_RUN = ("experiment=smoke", "run.max_epochs=3", "mlperf.target_accuracy=1.0")
ONE_STEP_EPOCHS = (*RESUME_RUN, "data.synthetic.train_per_class=4")  # 16 images: an epoch is one step of 16


@pytest.fixture(scope="module")
def straight(cache_dir, tmp_path_factory) -> dict[tuple[str, ...], Path]:
    """Run directories of recipes run once without a stop, by recipe, made on first use."""
    runs: dict[tuple[str, ...], Path] = {}

    def run_of(recipe: tuple[str, ...]) -> Path:
        if recipe not in runs:
            runs[recipe] = tmp_path_factory.mktemp("straight")
            run_train(*recipe, f"hydra.run.dir={runs[recipe]}", cache=cache_dir, check=True)
        return runs[recipe]

    return run_of


def signal_after_first_checkpoint(run_dir: Path, cache: Path, *signals: signal.Signals) -> tuple[int, str]:
    """RESUME_RUN in `run_dir`, sent `signals` (10 ms apart: one of a kind is pending at a time) once its first
    checkpoint exists; returns its exit status and output."""
    command = [sys.executable, "train.py", *RESUME_RUN, f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(
        command, cwd=REPO, env=train_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoint.pt").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    for signum in signals:
        process.send_signal(signum)
        time.sleep(0.01)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


def test_a_killed_run_resumes_to_the_same_weights_and_one_valid_log(straight, cache_dir, tmp_path):
    signal_after_first_checkpoint(tmp_path, cache_dir, signal.SIGKILL)
    assert not (tmp_path / "model.pt").exists()
    resumed = run_train(*RESUME_RUN, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir, check=True)
    assert "resuming at epoch 2" in resumed.stdout
    assert_same_run(straight(RESUME_RUN), tmp_path)


def signal_on_line(command: list[str], cache: Path, marker: str, *signals: signal.Signals) -> tuple[int, str]:
    """Run `command` in the repo; send `signals` once a line of its output contains `marker` (the loop has not
    started: the stop comes at the first step boundary); returns its exit status and output."""
    process = subprocess.Popen(
        command, cwd=REPO, env=train_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = []
    for line in process.stdout:
        output.append(line)
        if marker in line:
            for signum in signals:
                process.send_signal(signum)
            break
    rest, _ = process.communicate(timeout=600)
    return process.returncode, "".join(output) + rest


def assert_stopped_cleanly(run_dir: Path, returncode: int, output: str, signum: signal.Signals, where: str) -> None:
    """Exit status 128 + the signal; a log that ends with run_stop aborted and that the checker reads whole; a
    loadable checkpoint; resume.sh with the command that continues the run."""
    assert returncode == 128 + signum, output
    assert f"stopped by {signum.name} at {where}" in output, output
    events = mllog_events(run_dir / "mlperf.log")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert_read_whole(run_dir / "mlperf.log")
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["loop"]["step"] == int(where.split()[1])
    assert f"hydra.run.dir={run_dir} run.resume=auto" in (run_dir / "resume.sh").read_text()


def test_a_run_stopped_twice_in_the_middle_of_an_epoch_resumes_to_the_same_run(straight, cache_dir, tmp_path):
    first = [sys.executable, "train.py", *RESUME_RUN, f"hydra.run.dir={tmp_path}"]
    status, output = signal_on_line(first, cache_dir, "precision ", signal.SIGTERM)
    assert_stopped_cleanly(tmp_path, status, output, signal.SIGTERM, "step 1 (epoch 1, 1 of its 16 steps done)")

    resume = ["sh", str(tmp_path / "resume.sh")]  # as a user (or a requeued job) would
    status, output = signal_on_line(resume, cache_dir, "resuming at epoch 1 (step 1", signal.SIGUSR1)
    assert_stopped_cleanly(tmp_path, status, output, signal.SIGUSR1, "step 2 (epoch 1, 2 of its 16 steps done)")

    resumed = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming at epoch 1 (step 2, 2 steps into the epoch)" in resumed.stdout
    assert_same_run(straight(RESUME_RUN), tmp_path)
    resumptions = [e["value"] for e in mllog_events(tmp_path / "mlperf.log") if e["key"] == "rn50perf_resumed"]
    assert [(r["step"], r["stopped_attempt_log"]) for r in resumptions] == [
        (1, "mlperf.attempt1.log"),
        (2, "mlperf.attempt2.log"),
    ]
    for attempt in ("mlperf.attempt1.log", "mlperf.attempt2.log"):  # each stopped attempt's log, whole
        assert mllog_events(tmp_path / attempt)[-1]["metadata"]["status"] == "aborted"


def test_a_run_stopped_at_the_end_of_an_epoch_resumes_to_the_same_run(straight, cache_dir, tmp_path):
    command = [sys.executable, "train.py", *ONE_STEP_EPOCHS, f"hydra.run.dir={tmp_path}"]
    status, output = signal_on_line(command, cache_dir, "precision ", signal.SIGINT)
    assert_stopped_cleanly(tmp_path, status, output, signal.SIGINT, "step 1 (epoch 1, 1 of its 1 steps done)")
    assert "eval_start" not in [e["key"] for e in mllog_events(tmp_path / "mlperf.log")]  # before its evaluation
    again = run_train(*ONE_STEP_EPOCHS, f"hydra.run.dir={tmp_path}", cache=cache_dir)  # without run.resume=auto
    assert again.returncode == 2 and "a stopped run; continue it with run.resume=auto" in again.stderr
    resumed = run_train(*ONE_STEP_EPOCHS, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_run(straight(ONE_STEP_EPOCHS), tmp_path)


class StoppedRun(NamedTuple):
    status: int
    output: str
    signalled_s: float  # from the signal to the exit
    boundary_s: float  # from "stopped by ... at step ..." (the step boundary's checkpoint and log written) to the exit


def stop_when(
    command: list[str], cache: Path, ready: Callable[[str], bool], signum: signal.Signals, *, group: bool
) -> StoppedRun:
    """Run `command` in its own process group; once `ready(output so far)` holds, send `signum` to its main
    process, or to the whole group (as a terminal's Ctrl-C and SLURM do: the loader's workers get it too)."""
    process = subprocess.Popen(
        command, cwd=REPO, env=train_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in process.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not ready("".join(line for _, line in lines)):
        assert process.poll() is None, "the run ended before the point to stop it: " + "".join(x for _, x in lines)
        assert time.monotonic() < deadline
        time.sleep(0.005)
    signalled = time.monotonic()
    os.killpg(process.pid, signum) if group else process.send_signal(signum)
    process.wait(timeout=120)
    exited = time.monotonic()
    reader.join(timeout=10)
    boundary = next((at for at, line in lines if "stopped by" in line), math.inf)
    return StoppedRun(process.returncode, "".join(line for _, line in lines), exited - signalled, exited - boundary)


def last_event(log: Path) -> str:
    """The key of the MLPerf log's last whole line ('' for none yet)."""
    try:
        return mllog_events(log)[-1]["key"]
    except (FileNotFoundError, IndexError, ValueError):  # not there yet, or a line being written
        return ""


@pytest.mark.convergence  # make test-hosts: under each host's kernels too
def test_a_run_with_workers_stops_at_any_point_within_seconds_and_resumes_to_the_same_run(
    straight, cache_dir, tmp_path
):
    """Stops at several points of one run whose loaders have worker processes, by each stop signal, to the main
    process and to the whole process group: while the loader starts, at a seeded random moment mid-epoch, while a
    checkpoint is written, and during an evaluation. Each exits within seconds of the step boundary with 128 +
    the signal, its log ended and its checkpoint loadable; the resumed run ends with the weights of a run that was
    never stopped (and that had no workers: the batches are the same)."""
    rng = random.Random(26)
    log, temporary = tmp_path / "mlperf.log", tmp_path / ".checkpoint.pt.tmp"
    started = [0.0]

    def after(marker: str, seconds: float) -> Callable[[str], bool]:
        def ready(output: str) -> bool:
            if marker not in output:
                return False
            started[0] = started[0] or time.monotonic()
            return time.monotonic() - started[0] >= seconds

        return ready

    stops = [
        ("loader starting", after("precision ", 0.0), signal.SIGINT, False),
        ("mid-epoch", after("resuming at epoch", rng.uniform(0.5, 2.0)), signal.SIGTERM, True),
        ("checkpoint write", lambda _: temporary.exists() or "epoch   1/3" in _, signal.SIGUSR1, False),
        ("evaluation", lambda _: last_event(log) == "eval_start", signal.SIGINT, True),
    ]
    command = [sys.executable, "train.py", *RESUME_RUN, "data.workers=2", f"hydra.run.dir={tmp_path}"]
    for point, ready, signum, group in stops:
        started[0] = 0.0
        stopped = stop_when(command, cache_dir, ready, signum, group=group)
        where = re.search(r"stopped by \w+ at (step \d+ \(epoch \d, \d+ of its 16 steps done\))", stopped.output)
        assert where, (point, stopped.output)
        print(
            f"{point}: {signum.name} to the {'group' if group else 'process'} stopped at {where[1]}; exit "
            f"{stopped.signalled_s:.1f} s after the signal, {stopped.boundary_s:.1f} s after the step boundary"
        )
        assert_stopped_cleanly(tmp_path, stopped.status, stopped.output, signum, where[1])
        assert stopped.boundary_s < 10 and stopped.signalled_s < 30, (point, stopped)
        assert processes_mentioning(str(tmp_path)) == []  # no worker left behind
        command = ["sh", str(tmp_path / "resume.sh")]
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_run(straight(RESUME_RUN), tmp_path)


def test_a_second_ctrl_c_quits_at_once_and_leaves_the_checkpoint_whole(cache_dir, tmp_path):
    status, output = signal_after_first_checkpoint(tmp_path, cache_dir, signal.SIGINT, signal.SIGINT)
    assert status == 130, output
    assert "stopped by SIGINT" not in output  # it did not wait for the step boundary
    torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # the last one written whole, whatever was under way
    mllog_events(tmp_path / "mlperf.log")  # every line whole


def test_a_damaged_or_mismatched_checkpoint_is_refused(cache_dir, tmp_path):
    signal_after_first_checkpoint(tmp_path, cache_dir, signal.SIGKILL)
    log_before = (tmp_path / "mlperf.log").read_bytes()

    mismatched = run_train(
        *RESUME_RUN, "optim.base_lr=3.0", f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir
    )
    assert mismatched.returncode == 2
    assert "optim.base_lr: checkpoint 4.0, this run 3.0" in mismatched.stderr

    checkpoint = tmp_path / "checkpoint.pt"
    whole = checkpoint.read_bytes()
    torch.save({**torch.load(checkpoint, weights_only=True), "format": 1}, checkpoint)  # an earlier version's
    older = run_train(*RESUME_RUN, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir)
    assert older.returncode == 2
    assert "checkpoint format 1, this rn50perf reads format 2" in older.stderr

    checkpoint.write_bytes(whole[: len(whole) // 2])
    damaged = run_train(*RESUME_RUN, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir)
    assert damaged.returncode == 2
    assert "damaged or not a checkpoint" in damaged.stderr
    assert (tmp_path / "mlperf.log").read_bytes() == log_before  # refusing to resume touches nothing


def test_an_unreadable_training_file_is_skipped_and_reported_or_fatal_by_policy(tmp_path):
    data = ("experiment=smoke", f"data.root={tmp_path / 'data'}")
    short = ("run.max_epochs=1", "optim.warmup_epochs=0")
    run_train(*data, *short, f"hydra.run.dir={tmp_path / 'first'}", cache=tmp_path, check=True)  # makes the set
    bad = sorted((tmp_path / "data" / "train").glob("*/*.JPEG"))[0]
    bad.write_bytes(bad.read_bytes()[:300])  # truncated inside the entropy-coded data

    skipped = run_train(*data, f"hydra.run.dir={tmp_path / 'skip'}", cache=tmp_path, check=True)
    assert "1 unreadable files skipped" in skipped.stdout
    assert (skipped.stdout + skipped.stderr).count(f"skipped an unreadable file: {bad}") == 1
    assert_compliant(tmp_path / "skip" / "mlperf.log")

    fatal = run_train(*data, *short, "data.corrupt=fail", f"hydra.run.dir={tmp_path / 'fail'}", cache=tmp_path)
    assert fatal.returncode == 2
    assert f"error: unreadable file {bad}" in fatal.stderr
    assert "Traceback" not in fatal.stderr
    stop = [e for e in mllog_events(tmp_path / "fail" / "mlperf.log") if e["key"] == "run_stop"]
    assert [e["metadata"]["status"] for e in stop] == ["aborted"]


@pytest.mark.convergence
@pytest.mark.parametrize(
    ("policy", "emulate"),
    [pytest.param(p, "auto", marks=pytest.mark.slow) for p in ("bf16", "bf16.16", "fp16.32")]
    + [("fp16.16", "auto"), ("bf16", "always")],
)
def test_a_smoke_run_under_each_precision_policy_passes_the_compliance_checker(policy, emulate, cache_dir, tmp_path):
    overrides = (f"precision={policy}", f"precision.emulate={emulate}", f"hydra.run.dir={tmp_path}")
    result = run_train("experiment=smoke", *overrides, cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"precision {policy}:" in result.stdout
    record_margin(f"smoke lars {policy}, precision.emulate={emulate}", tmp_path / "mlperf.log", max_epochs=10)
    assert_compliant(tmp_path / "mlperf.log")
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header.endswith("loss_scale,skipped_steps,data_wait,step_time,allreduce,evaluation")
    emulated = "emulated: fp32 arithmetic rounded to" in result.stdout
    platform = next(e["value"] for e in mllog_events(tmp_path / "mlperf.log") if e["key"] == "submission_platform")
    assert ("emulated in fp32" in platform) == emulated  # the log says what ran
    assert emulated == (emulate == "always" or policy.startswith("fp16") or emulates("bf16", "auto", "cpu"))
