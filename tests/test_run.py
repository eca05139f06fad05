"""Whole runs of train.py on the tiny synthetic task: the MLPerf log, the run directory, stops and resume.

Most runs are tiny (TINY_RUN's 64 images at 32 px: a few seconds past train.py's start-up); the smoke task's runs to
the target, a minute or more each, are marked slow (`make test-hosts` and `make test-all` run them)."""

from __future__ import annotations

import csv
import math
import os
import random
import re
import shutil
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

import checkpoint
import rundir
from checkpoint import CheckpointError
from configs.checks import ConfigError
from configs.schema import training_fingerprint
from data.sources.synthetic import CACHE_ENV
from mlperf_logs.logger import SKIPPED_FILES
from optim.precision import emulates
from tests.conftest import (
    ALL_EPOCHS,
    REPO,
    TINY_RUN,
    assert_compliant,
    assert_compliant_but_for_accuracy,
    assert_read_whole,
    assert_same_run,
    composed,
    configured_dataset,
    importing_torch,
    mllog_events,
    processes_mentioning,
    record_margin,
    run_train,
    run_trains,
    straight_run,
    tensorboard_scalars,
    train_env,
)
from tests.filesystems import fill
from tests.forked import stopped_forked

# Two epochs of 4 steps (TINY_RUN: 64 images at 32 px, batches of 16) that never reach the target, with LARS.
TWO_EPOCHS = (*TINY_RUN, "run.max_epochs=2", *ALL_EPOCHS)
# The same, half of each batch decoded on the training device (the CPU here: the GPU's stand-in) by the producer
# thread, the other half and its crops by the workers.
DEVICE_DECODED = (*TWO_EPOCHS, "data.decode=hybrid", "data.device_share=0.5")
# The same images in one step per epoch, so that a stop at step 1 comes at the end of an epoch, before its
# evaluation; with SGD, so that each optimizer's state goes through a checkpoint.
ONE_STEP_EPOCHS = (*TWO_EPOCHS, "data.global_batch=64", "optim=sgd")
# The smoke task's three epochs of 16 steps, for the randomised stops (slow).
RESUME_RUN = ("experiment=smoke", "run.max_epochs=3", *ALL_EPOCHS)
CHECKER_LOG = "compliance_checker.log"  # the checker's own, in the directory it runs in (conftest.assert_read_whole)


# The recipes run once without a stop, which the whole-run tests read and the stopped ones compare with: made
# together with the other test modules' (conftest.straight_runs).
STRAIGHT = {
    TWO_EPOCHS: straight_run("test_run lars", *TWO_EPOCHS),
    ONE_STEP_EPOCHS: straight_run("test_run sgd", *ONE_STEP_EPOCHS),
    DEVICE_DECODED: straight_run("test_run decoded on the device", *DEVICE_DECODED),
}


@pytest.fixture(scope="module")
def straight(straight_runs, cache_dir, tmp_path_factory) -> Callable[[tuple[str, ...]], Path]:
    """Run directories of recipes run once without a stop, by recipe: STRAIGHT's, or made on first use."""
    runs: dict[tuple[str, ...], Path] = {}

    def run_of(recipe: tuple[str, ...]) -> Path:
        if recipe in STRAIGHT:
            run = straight_runs[STRAIGHT[recipe]]
            assert run.status == 0, f"train.py failed ({run.status}):\n{run.stdout}\n{run.stderr}"
            return run.run_dir
        if recipe not in runs:
            runs[recipe] = tmp_path_factory.mktemp("straight")
            run_train(*recipe, f"hydra.run.dir={runs[recipe]}", cache=cache_dir, check=True)
        return runs[recipe]

    return run_of


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


def assert_rundir_names_each_entry(run_dir: Path, *others: str) -> None:
    """Every file and folder in the run directory is one that rundir names (the modules that write take the names
    from there), or one of `others`, which a test's tools left there."""
    unnamed = [path.name for path in run_dir.iterdir() if not rundir.written_by_run(path.name)]
    assert sorted(set(unnamed) - set(others)) == []


def assert_a_whole_run(run_dir: Path, optimizer: str) -> None:
    """What a run that ended leaves: its epoch lines with the data wait, a log naming the optimizer and the real
    call site, the config, metrics and plot, weights that torchvision's ResNet-50 loads, TensorBoard's scalars, and
    nothing that rundir does not name."""
    epoch_line = next(line for line in (run_dir / "train.log").read_text().splitlines() if "- epoch " in line)
    assert "data wait" in epoch_line
    events = mllog_events(run_dir / "mlperf.log")
    assert next(e for e in events if e["key"] == "opt_name")["value"] == optimizer
    block = next(e for e in events if e["key"] == "block_start")
    assert block["metadata"]["file"] == "train.py"  # mllog names the real call site, not the logger's module
    for name in ("config.yaml", "metrics.csv", "metrics.png", "model.pt"):
        assert (run_dir / name).exists(), name
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    torchvision.models.resnet50(num_classes=4).load_state_dict(weights)
    assert_tensorboard_matches_metrics(run_dir)
    assert_rundir_names_each_entry(run_dir, CHECKER_LOG)  # the test's own checker may have run in the directory


@pytest.mark.parametrize(
    ("recipe", "optimizer"),
    [(TWO_EPOCHS, "lars"), (ONE_STEP_EPOCHS, "sgd"), (DEVICE_DECODED, "lars")],
    ids=["lars", "sgd", "decoded on the device"],
)
def test_a_whole_run_leaves_its_log_weights_and_metrics(straight, recipe, optimizer, tmp_path):
    run_dir = straight(recipe)
    assert_compliant_but_for_accuracy(run_dir / "mlperf.log", tmp_path)
    assert_a_whole_run(run_dir, optimizer)


@pytest.mark.slow  # a minute or more each; what a whole run leaves is checked on the tiny runs above
@pytest.mark.convergence
@pytest.mark.parametrize(("optimizer", "lr"), [("lars", 4.0), ("sgd", 0.1)])
def test_smoke_run_reaches_target_and_its_log_passes_the_compliance_checker(optimizer, lr, cache_dir, tmp_path):
    overrides = ("experiment=smoke", f"optim={optimizer}", f"optim.base_lr={lr}", f"hydra.run.dir={tmp_path}")
    run_train(*overrides, cache=cache_dir, check=True)
    log = tmp_path / "mlperf.log"
    record_margin(f"smoke {optimizer} lr {lr}", log, max_epochs=10)
    assert_compliant(log)
    stop = next(e for e in mllog_events(log) if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success"
    assert_a_whole_run(tmp_path, optimizer)


def test_a_new_run_refuses_a_directory_that_holds_a_log(tmp_path):
    """As train.py decides before it writes anything (the run stopped at the end of an epoch below is refused so
    by train.py, its files untouched)."""
    (tmp_path / "mlperf.log").write_text(":::MLLOG {}\n")
    with pytest.raises(ConfigError) as refused:
        checkpoint.restore_point(tmp_path, "mlperf.log", "none", fingerprint={})
    assert refused.value.key == "run.resume" and "new hydra.run.dir" in str(refused.value)


class StoppedRun(NamedTuple):
    status: int
    output: str
    signalled_s: float  # from the signal to the exit
    boundary_s: float  # from "stopped by ... at step ..." (the step boundary's checkpoint and log written) to the exit


def stop_when(
    command: list[str], cache: Path, ready: Callable[[str], bool], *signals: signal.Signals, group: bool = False
) -> StoppedRun:
    """Run `command` in the repo in its own process group; once `ready(output so far)` holds, send `signals` (10 ms
    apart: one of a kind is pending at a time) to its main process, or to the whole group (as a terminal's Ctrl-C
    and SLURM do: the loader's workers get them too)."""
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
    for signum in signals:
        os.killpg(process.pid, signum) if group else process.send_signal(signum)
        time.sleep(0.01)
    process.wait(timeout=120)
    exited = time.monotonic()
    reader.join(timeout=10)
    boundary = next((at for at, line in lines if "stopped by" in line), math.inf)
    return StoppedRun(process.returncode, "".join(line for _, line in lines), exited - signalled, exited - boundary)


@pytest.fixture(scope="module")
def interrupted_twice(cache_dir, tmp_path_factory) -> tuple[Path, StoppedRun]:
    """ONE_STEP_EPOCHS sent SIGINT twice once its first checkpoint was written: its directory (tests take copies)
    and how it ended."""
    run_dir = tmp_path_factory.mktemp("interrupted")
    command = [sys.executable, "train.py", *ONE_STEP_EPOCHS, f"hydra.run.dir={run_dir}"]
    return run_dir, stop_when(command, cache_dir, lambda _: (run_dir / "checkpoint.pt").exists(), *[signal.SIGINT] * 2)


def test_a_second_ctrl_c_quits_at_once_and_leaves_the_checkpoint_whole(interrupted_twice):
    run_dir, stopped = interrupted_twice
    assert stopped.status == 130, stopped.output
    assert "stopped by SIGINT" not in stopped.output  # it did not wait for the step boundary
    torch.load(run_dir / "checkpoint.pt", weights_only=True)  # the last one written whole, whatever was under way
    mllog_events(run_dir / "mlperf.log")  # every line whole


def test_a_damaged_or_mismatched_checkpoint_is_refused(interrupted_twice, tmp_path):
    """By the load train.py resumes through, before it writes anything: a CheckpointError, which train.py tells in
    one line with exit status 2 (tests/test_checkpoint.py runs train.py into one)."""
    saved = tmp_path / "checkpoint.pt"
    shutil.copy(interrupted_twice[0] / "checkpoint.pt", saved)
    other_lr = training_fingerprint(composed(*ONE_STEP_EPOCHS, "optim.base_lr=0.3"), world_size=1)
    with pytest.raises(CheckpointError, match=r"optim\.base_lr: checkpoint 0\.2, this run 0\.3"):
        checkpoint.load(saved, other_lr)

    whole = saved.read_bytes()
    torch.save({**torch.load(saved, weights_only=True), "format": 1}, saved)  # an earlier version's
    with pytest.raises(CheckpointError, match="checkpoint format 1, this rn50perf reads format 2"):
        checkpoint.load(saved, other_lr)
    saved.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match="damaged or not a checkpoint"):
        checkpoint.load(saved, other_lr)


def test_a_checkpoint_from_before_a_setting_was_dropped_still_resumes(interrupted_twice, tmp_path):
    """A checkpoint whose fingerprint names a setting this version no longer has (model.name, which configured
    nothing) is the same run: only the settings this version has are compared."""
    saved = tmp_path / "checkpoint.pt"
    state = torch.load(interrupted_twice[0] / "checkpoint.pt", weights_only=True)
    torch.save({**state, "fingerprint": {**state["fingerprint"], "model.name": "resnet50"}}, saved)
    loaded = checkpoint.load(saved, training_fingerprint(composed(*ONE_STEP_EPOCHS), world_size=1))
    assert loaded["loop"] == state["loop"]


def assert_stopped_cleanly(run_dir: Path, stopped: StoppedRun, signum: signal.Signals, where: str) -> None:
    """Exit status 128 + the signal; a log that ends with run_stop aborted and that the checker reads whole; a
    loadable checkpoint; resume.sh with the command that continues the run."""
    assert stopped.status == 128 + signum, stopped.output
    assert f"stopped by {signum.name} at {where}" in stopped.output, stopped.output
    events = mllog_events(run_dir / "mlperf.log")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert_read_whole(run_dir / "mlperf.log")
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["loop"]["step"] == int(where.split()[1])
    assert f"hydra.run.dir={run_dir} run.resume=auto" in (run_dir / "resume.sh").read_text()


@pytest.mark.slow  # make test: stops resumed bitwise (stopped twice, with workers; killed mid-epoch)
def test_a_run_stopped_at_the_end_of_an_epoch_then_killed_resumes_to_the_same_run(straight, cache_dir, tmp_path):
    """SIGINT as the loop starts: the stop comes at step 1, the end of epoch 1 and before its evaluation. A new
    run in its directory is refused, its files untouched (by the call train.py makes before it writes anything:
    that train.py refuses so with exit status 2, leaving the folder's files as they were, test_user_files checks);
    resumed, it is killed (SIGKILL) once it has written its next checkpoint, and resumed again it ends with the
    weights of a run never stopped, with one valid log."""
    command = [sys.executable, "train.py", *ONE_STEP_EPOCHS, f"hydra.run.dir={tmp_path}"]
    stopped = stop_when(command, cache_dir, loop_started(tmp_path), signal.SIGINT)
    assert_stopped_cleanly(tmp_path, stopped, signal.SIGINT, "step 1 (epoch 1, 1 of its 1 steps done)")
    assert "eval_start" not in [e["key"] for e in mllog_events(tmp_path / "mlperf.log")]  # before its evaluation

    files = {name: (tmp_path / name).read_bytes() for name in ("mlperf.log", "config.yaml", "checkpoint.pt")}
    with pytest.raises(ConfigError) as again:  # a new run there, without run.resume=auto
        checkpoint.restore_point(tmp_path, "mlperf.log", "none", fingerprint={})
    assert again.value.key == "run.resume" and "a stopped run; continue it with run.resume=auto" in str(again.value)
    assert {name: (tmp_path / name).read_bytes() for name in files} == files

    first = (tmp_path / "checkpoint.pt").stat().st_ino  # the next is renamed into place whole: a new inode
    killed = stop_when(
        [*command, "run.resume=auto"],
        cache_dir,
        lambda _: (tmp_path / "checkpoint.pt").stat().st_ino != first,
        signal.SIGKILL,
    )
    assert "resuming at epoch 1 (step 1, 1 steps into the epoch)" in killed.output
    assert not (tmp_path / "model.pt").exists()
    resumed = run_train(*ONE_STEP_EPOCHS, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir, check=True)
    assert "resuming at epoch 2" in resumed.stdout
    assert_same_run(straight(ONE_STEP_EPOCHS), tmp_path)


def test_a_run_checkpointing_every_few_steps_killed_mid_epoch_resumes_to_the_same_run(straight, cache_dir, tmp_path):
    """run.checkpoint_every_steps=3 over epochs of 4 steps: a checkpoint at step 3, mid-epoch, where SIGKILL (no
    chance to save) finds it; resumed from there, the run ends with the weights of one never stopped. Half of each
    batch is decoded on the training device: the samples and crops do not depend on who decodes them."""
    argv = (*DEVICE_DECODED, "run.checkpoint_every_steps=3", f"hydra.run.dir={tmp_path}")
    checkpoint = tmp_path / "checkpoint.pt"
    killed = stopped_forked(argv, train_env(cache_dir), checkpoint.exists, signal.SIGKILL)
    saved = torch.load(checkpoint, weights_only=True)["loop"]
    assert saved["step"] % 3 == 0 and saved["epoch_step"] == saved["step"] % 4 != 0, killed.stdout  # mid-epoch
    resumed = run_train(*argv, "run.resume=auto", cache=cache_dir, check=True)
    assert f"resuming at epoch {saved['epoch']} (step {saved['step']}, {saved['epoch_step']} steps" in resumed.stdout
    assert_same_run(straight(DEVICE_DECODED), tmp_path)


def last_event(log: Path) -> str:
    """The key of the MLPerf log's last whole line ('' for none yet)."""
    try:
        return mllog_events(log)[-1]["key"]
    except (FileNotFoundError, IndexError, ValueError):  # not there yet, or a line being written
        return ""


def loop_started(run_dir: Path) -> Callable[[str], bool]:
    """Ready once the run's log holds run_start: its loop runs, and a stop signal waits for its next step boundary
    (before, one ends the run at once: test_a_stop_signal_during_start_up_...)."""

    def ready(_: str) -> bool:
        try:
            return any(event["key"] == "run_start" for event in mllog_events(run_dir / "mlperf.log"))
        except (FileNotFoundError, ValueError):  # not there yet, or a line being written
            return False

    return ready


def stopped_where(stopped: StoppedRun, steps_per_epoch: int) -> re.Match[str]:
    """Where `stopped` says it stopped: group 1 the whole place, then the step, the epoch and its steps done."""
    pattern = rf"stopped by \w+ at (step (\d+) \(epoch (\d+), (\d+) of its {steps_per_epoch} steps done\))"
    where = re.search(pattern, stopped.output)
    assert where, stopped.output
    return where


def assert_stopped_within_seconds(run_dir: Path, stopped: StoppedRun, signum: signal.Signals, where: str) -> None:
    """Stopped cleanly at `where`, within seconds of the step boundary, and no loader worker is left behind."""
    assert_stopped_cleanly(run_dir, stopped, signum, where)
    assert stopped.boundary_s < 10 and stopped.signalled_s < 30, stopped
    assert processes_mentioning(str(run_dir)) == []  # no worker left behind


def test_a_run_with_workers_stopped_resumes_by_its_resume_sh_to_the_same_run_and_leaves_what_the_readme_lists(
    straight, cache_dir, tmp_path
):
    """TWO_EPOCHS with a loader worker: SIGTERM to the whole process group once epoch 1 has ended (the worker gets it
    too, as from a terminal's Ctrl-C or from SLURM); it stops at its step boundary with epoch 1's plot, and resume.sh
    continues it to the weights of a run never stopped (without workers: the batches are the same). Its log records
    the resumption, and its directory holds what the README lists. (Slow, below: stops at random points, by each
    signal, to the main process and to the group.)"""
    command = [sys.executable, "train.py", *TWO_EPOCHS, "data.workers=1", f"hydra.run.dir={tmp_path}"]
    stopped = stop_when(command, cache_dir, lambda output: "epoch   1/2" in output, signal.SIGTERM, group=True)
    where = stopped_where(stopped, steps_per_epoch=4)
    assert_stopped_within_seconds(tmp_path, stopped, signal.SIGTERM, where[1])
    assert (tmp_path / "metrics.png").stat().st_size > 0  # a stopped run's plot, of epoch 1: ended before the stop

    resume = ["sh", str(tmp_path / "resume.sh")]  # as a user (or a requeued job) would
    resumed = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    step, epoch, steps_done = where.group(2, 3, 4)
    resuming = f"resuming at epoch {epoch} (step {step}, {steps_done} steps into the epoch)"
    assert resuming in resumed.stdout
    assert_same_run(straight(TWO_EPOCHS), tmp_path)
    resumptions = [e["value"] for e in mllog_events(tmp_path / "mlperf.log") if e["key"] == "rn50perf_resumed"]
    assert [(r["step"], r["stopped_attempt_log"]) for r in resumptions] == [(int(step), "mlperf.attempt1.log")]
    assert mllog_events(tmp_path / "mlperf.attempt1.log")[-1]["metadata"]["status"] == "aborted"  # whole

    assert not (tmp_path / "resume.sh").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert_rundir_names_each_entry(tmp_path, CHECKER_LOG)  # the attempt's log too
    shown = [line for line in (stopped.output + resumed.stdout).splitlines() if line.startswith(("dataset:", "epoch "))]
    assert shown[0].startswith("dataset: torchvision layout at ")  # the synthetic set is in torchvision's layout
    assert len(shown) == 2 + 2  # each attempt's dataset line, and the two epochs' lines
    job_log = (tmp_path / "train.log").read_text()  # each attempt's lines, appended
    for line in [*shown, resuming, "run_stop status aborted: 2 epochs"]:
        assert line in job_log, line


@pytest.mark.slow  # minutes long; stops at a step boundary with workers, and resume.sh: the test above
@pytest.mark.convergence  # make test-hosts: under each host's kernels too
def test_a_run_with_workers_stops_at_any_point_within_seconds_and_resumes_to_the_same_run(
    straight, cache_dir, tmp_path
):
    """Stops at several points of one run whose loaders have worker processes, by each stop signal, to the main
    process and to the whole process group: as the loader starts, at a seeded random moment mid-epoch, while a
    checkpoint is written, and during an evaluation. Each exits within seconds of the step boundary with 128 +
    the signal, its log ended and its checkpoint loadable; the resumed run ends with the weights of a run that was
    never stopped (and that had no workers: the batches are the same)."""
    rng = random.Random(26)
    log, temporary = tmp_path / "mlperf.log", rundir.temporary(tmp_path / rundir.CHECKPOINT)
    started = [0.0]

    def after(marker: str, seconds: float) -> Callable[[str], bool]:
        def ready(output: str) -> bool:
            if marker not in output:
                return False
            started[0] = started[0] or time.monotonic()
            return time.monotonic() - started[0] >= seconds

        return ready

    stops = [
        ("loader starting", loop_started(tmp_path), signal.SIGINT, False),
        ("mid-epoch", after("resuming at epoch", rng.uniform(0.5, 2.0)), signal.SIGTERM, True),
        ("checkpoint write", lambda _: temporary.exists() or "epoch   1/3" in _, signal.SIGUSR1, False),
        ("evaluation", lambda _: last_event(log) == "eval_start", signal.SIGINT, True),
    ]
    command = [sys.executable, "train.py", *RESUME_RUN, "data.workers=2", f"hydra.run.dir={tmp_path}"]
    for point, ready, signum, group in stops:
        started[0] = 0.0
        stopped = stop_when(command, cache_dir, ready, signum, group=group)
        where = stopped_where(stopped, steps_per_epoch=16)
        print(
            f"{point}: {signum.name} to the {'group' if group else 'process'} stopped at {where[1]}; exit "
            f"{stopped.signalled_s:.1f} s after the signal, {stopped.boundary_s:.1f} s after the step boundary"
        )
        assert_stopped_within_seconds(tmp_path, stopped, signum, where[1])
        command = ["sh", str(tmp_path / "resume.sh")]
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_run(straight(RESUME_RUN), tmp_path)


def test_an_unreadable_training_file_is_skipped_and_reported_or_fatal_by_policy(cache_dir, tmp_path):
    data = (*TINY_RUN, f"data.root={tmp_path / 'data'}")
    configured_dataset(*data)  # the set made in data.root, as a first run makes it
    bad = sorted((tmp_path / "data" / "train").glob("*/*.JPEG"))[0]
    bad.write_bytes(bad.read_bytes()[:300])  # truncated inside the entropy-coded data

    two_epochs = ("run.max_epochs=2", *ALL_EPOCHS)  # the file met twice, reported once
    skip, fail = (*data, *two_epochs, f"hydra.run.dir={tmp_path / 'skip'}"), (*data, "data.corrupt=fail")
    skipped, fatal = run_trains([skip, (*fail, f"hydra.run.dir={tmp_path / 'fail'}")], cache_dir, at_once=2)
    assert skipped.returncode == 0, skipped
    assert "1 unreadable files skipped" in skipped.stdout
    assert (skipped.stdout + skipped.stderr).count(f"skipped an unreadable file: {bad}") == 1
    assert_compliant_but_for_accuracy(tmp_path / "skip" / "mlperf.log", tmp_path)
    logged = [e["value"] for e in mllog_events(tmp_path / "skip" / "mlperf.log") if e["key"] == SKIPPED_FILES]
    assert logged == [{"epoch": 1, "files": [str(bad)], "total": 1}]  # named once, in the epoch that met it first

    assert fatal.returncode == 2
    assert f"error: unreadable file {bad}" in fatal.stderr
    assert "Traceback" not in fatal.stderr
    stop = [e for e in mllog_events(tmp_path / "fail" / "mlperf.log") if e["key"] == "run_stop"]
    assert [e["metadata"]["status"] for e in stop] == ["aborted"]


# One epoch of TINY_RUN's shape under 16-bit policies, native or emulated as precision.emulate says, by (policy,
# emulate): one step of 16 images (what a run says and logs of its policy needs no more), made with the other tiny
# runs (conftest.straight_runs). fp16.16 with precision.emulate=always is not among them: on the CPU, auto emulates
# fp16 too, so it would be the same run.
POLICY_RUNS = {
    (policy, emulate): straight_run(
        f"test_run {policy} emulate={emulate}",
        *TINY_RUN,
        "data.synthetic.train_per_class=4",
        "data.synthetic.val_per_class=2",
        f"precision={policy}",
        f"precision.emulate={emulate}",
        "run.max_epochs=1",
        "run.allow_not_converged=true",
    )
    for policy, emulate in (("fp16.16", "auto"), ("bf16", "auto"), ("bf16", "always"))
}


@pytest.fixture(scope="module")
def policy_runs(straight_runs) -> dict[tuple[str, str], Path]:
    """The run directory of each (policy, emulate)."""
    runs = {}
    for chosen, name in POLICY_RUNS.items():
        run = straight_runs[name]
        assert run.status == 0, f"train.py failed ({run.status}):\n{run.stdout}\n{run.stderr}"
        runs[chosen] = run.run_dir
    return runs


def assert_the_run_says_and_logs_its_policy(run_dir: Path, policy: str, emulate: str) -> None:
    """The run names its policy and whether its 16-bit compute is emulated, and so does its MLPerf log; metrics.csv
    has the loss scale and skipped steps."""
    job_log = (run_dir / "train.log").read_text()
    assert f"precision {policy}:" in job_log
    header = (run_dir / "metrics.csv").read_text().splitlines()[0]
    assert header.endswith("loss_scale,skipped_steps,data_wait,step_time,allreduce,evaluation")
    emulated = "emulated: fp32 arithmetic rounded to" in job_log
    platform = next(e["value"] for e in mllog_events(run_dir / "mlperf.log") if e["key"] == "submission_platform")
    assert ("emulated in fp32" in platform) == emulated  # the log says what ran
    assert emulated == (emulate == "always" or policy.startswith("fp16") or emulates("bf16", "auto", "cpu"))


@pytest.mark.parametrize(("policy", "emulate"), POLICY_RUNS)
def test_a_run_under_a_16_bit_policy_says_and_logs_what_ran(policy_runs, policy, emulate, tmp_path):
    run_dir = policy_runs[policy, emulate]
    assert_the_run_says_and_logs_its_policy(run_dir, policy, emulate)
    assert_compliant_but_for_accuracy(run_dir / "mlperf.log", tmp_path)


@pytest.mark.slow  # minutes long; what a run says and logs of its policy is checked on tiny runs above
@pytest.mark.convergence
@pytest.mark.parametrize(
    ("policy", "emulate"),
    [("bf16", "auto"), ("bf16.16", "auto"), ("fp16.32", "auto"), ("fp16.16", "auto"), ("bf16", "always")],
)
def test_a_smoke_run_under_each_precision_policy_passes_the_compliance_checker(policy, emulate, cache_dir, tmp_path):
    overrides = (f"precision={policy}", f"precision.emulate={emulate}", f"hydra.run.dir={tmp_path}")
    result = run_train("experiment=smoke", *overrides, cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    record_margin(f"smoke lars {policy}, precision.emulate={emulate}", tmp_path / "mlperf.log", max_epochs=10)
    assert_compliant(tmp_path / "mlperf.log")
    assert_the_run_says_and_logs_its_policy(tmp_path, policy, emulate)


@pytest.mark.slow  # compiling ResNet-50 on the CPU takes over a minute
def test_a_compiled_run_compiles_before_its_clock_starts_and_logs_a_run_the_checker_takes(cache_dir, tmp_path):
    overrides = (*TINY_RUN, "run.max_epochs=1", *ALL_EPOCHS, "device.compile=true", f"hydra.run.dir={tmp_path}")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # inductor's shared cache is not keyed by ISA
    result = run_train(*overrides, cache=cache_dir, check=True, env=env)
    assert_compliant_but_for_accuracy(tmp_path / "mlperf.log", tmp_path)
    time_ms = {e["key"]: e["time_ms"] for e in mllog_events(tmp_path / "mlperf.log")}  # each key's last
    init_s = (time_ms["init_stop"] - time_ms["init_start"]) / 1000
    epoch_s = (time_ms["block_stop"] - time_ms["block_start"]) / 1000  # the one epoch's block
    assert 3 * epoch_s < init_s, (init_s, epoch_s, result.stdout)  # the compilation (a minute here) came in init


Ready = Callable[[str], bool]  # whether stop_when may send its signal, given the run's output so far


def importing(run_dir: Path, data_root: Path) -> Ready:
    """Once the run's process has begun to import torch."""
    return lambda _: importing_torch(str(run_dir))


def generating(run_dir: Path, data_root: Path) -> Ready:
    """Once the synthetic set's generator has begun to write into `data_root`."""
    return lambda _: data_root.is_dir() and any(data_root.iterdir())


def compiling(run_dir: Path, data_root: Path) -> Ready:
    """A moment after the init phase said its precision: the model is built, and torch.compile under way."""

    def ready(output: str) -> bool:
        if "precision " not in output:
            return False
        time.sleep(2)
        return True

    return ready


@pytest.mark.parametrize(
    ("phase", "ready", "signum", "extra"),
    [
        ("imports", importing, signal.SIGTERM, ()),
        ("data", generating, signal.SIGINT, ()),
        pytest.param("compile", compiling, signal.SIGUSR1, ("device.compile=true",), marks=pytest.mark.slow),
    ],
    ids=["imports", "data", "compile"],
)
def test_a_stop_signal_during_start_up_ends_the_run_with_its_status_and_the_same_command_starts_it_again(
    phase, ready, signum, extra, cache_dir, tmp_path, monkeypatch
):
    """A stop signal while train.py imports torch, while it generates its synthetic set, or while it compiles (in
    MLPerf's init phase, its log begun) ends the run at once, with 128 + the signal, no traceback and no process
    left; the run directory keeps only Hydra's record and train.log (nothing to resume), so the same command, as a
    requeued job would, starts the run again. After a stop in the generation, the calls train.py makes before its
    run say so (here in process): the half-made set is made again, the directory taken."""
    run_dir, data_root = tmp_path / "run", tmp_path / "data"
    recipe = (*TINY_RUN, "run.max_epochs=1", *ALL_EPOCHS, f"data.root={data_root}", *extra)
    command = [sys.executable, "train.py", *recipe, f"hydra.run.dir={run_dir}"]
    stopped = stop_when(command, cache_dir, ready(run_dir, data_root), signum, group=True)
    assert stopped.status == 128 + signum, stopped.output
    assert f"{signum.name} received: stopping now" in stopped.output and "Traceback" not in stopped.output
    if phase == "compile":  # the run had begun to write its directory: it says so in train.log too
        assert f"stopped by {signum.name} before the run started: nothing to resume" in stopped.output
    left = {path.name for path in run_dir.iterdir()} if run_dir.exists() else set()
    assert left <= {".hydra", "train.log"}, left
    assert processes_mentioning(str(run_dir)) == []
    if phase == "data":  # the set half made is made again, and the directory takes the run
        monkeypatch.setenv(CACHE_ENV, str(cache_dir))  # the caches train.py used
        train, val = configured_dataset(*recipe)
        assert (len(train), len(val)) == (64, 32)
        assert checkpoint.restore_point(run_dir, "mlperf.log", "none", fingerprint={}) is None


# Slow: make test checks what it adds in process (tests/test_storage.py: a checkpoint that does not fit ends in one
# line naming the file, the filesystem and the room, the previous one intact) and a crash resumed from the last
# checkpoint (the mid-epoch SIGKILL above).
@pytest.mark.slow
def test_a_disk_that_fills_mid_run_ends_it_in_one_line_and_its_last_checkpoint_resumes_to_the_same_run(
    straight, cache_dir, small_filesystem
):
    """TWO_EPOCHS checkpointed every 2 steps on a tmpfs with room for a checkpoint and its copy. Once the first
    checkpoint is written, something else takes the space (the run held still meanwhile), so the next cannot be:
    the run ends in one line naming the file, the filesystem and the room, with exit status 5, no temporary file
    and its log ended; once space is freed, resume.sh continues it to the weights of a run never stopped."""
    filesystem = small_filesystem(420 * rundir.MB)
    run_dir = filesystem / "run"
    filler: list[Path] = []

    def filled_once_checkpointed(_: str) -> bool:
        if not (run_dir / rundir.CHECKPOINT).exists():
            return False
        for pid in processes_mentioning(str(run_dir)):
            os.kill(pid, signal.SIGSTOP)
        filler.append(fill(filesystem, leave=50 * rundir.MB))
        return True

    command = [sys.executable, "train.py", *TWO_EPOCHS, "run.checkpoint_every_steps=2", f"hydra.run.dir={run_dir}"]
    failed = stop_when(command, cache_dir, filled_once_checkpointed, signal.SIGCONT, group=True)
    assert failed.status == 5, failed.output
    said = [line for line in failed.output.splitlines() if not line.startswith(("dataset:", "precision ", "epoch "))]
    assert said == [
        f"error: no space left on {filesystem} (tmpfs) writing checkpoint.pt (needs 189 MB, 49 MB free); "
        f"checkpoint.pt (step 2) is intact and resumes the run: free space and run {run_dir / 'resume.sh'}"
    ]
    assert not rundir.temporary(run_dir / rundir.CHECKPOINT).exists()
    assert mllog_events(run_dir / "mlperf.log")[-1]["metadata"]["status"] == "aborted"

    filler[0].unlink()
    resumed = subprocess.run(["sh", str(run_dir / "resume.sh")], cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming at epoch 1 (step 2, 2 steps into the epoch)" in resumed.stdout
    assert_same_run(straight(TWO_EPOCHS), run_dir)


def test_a_run_directory_too_small_for_a_checkpoint_or_not_writable_is_refused_in_one_line(
    cache_dir, small_filesystem, read_only_directory
):
    """Before run_start, with exit status 2: a directory whose filesystem cannot hold a checkpoint and the copy
    written beside it (known once the model is built), which keeps only Hydra's record and train.log; and one that
    cannot be written at all, where even Hydra's first write fails."""
    small = small_filesystem(60 * rundir.MB) / "run"
    refused = run_train(*TINY_RUN, f"hydra.run.dir={small}", cache=cache_dir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert re.fullmatch(
        rf"error: hydra\.run\.dir: {small} has \d+ MB free on {small.parent}; the run needs 3\d\d MB there, for a "
        r"checkpoint and the copy written beside it: free space or give another hydra\.run\.dir\n",
        refused.stderr,
    ), refused.stderr
    assert {path.name for path in small.iterdir()} <= {".hydra", "train.log"}

    unwritable = read_only_directory.path / "run"
    refused = run_train(*TINY_RUN, f"hydra.run.dir={unwritable}", cache=cache_dir)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr == f"error: hydra.run.dir: {read_only_directory.says}writing run\n"
