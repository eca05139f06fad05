"""Whole runs of train.py on the tiny synthetic task: the MLPerf log, the run directory, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torchvision

from tests.conftest import REPO, compliance_check, mllog_events, run_train


@pytest.mark.parametrize(("optimizer", "lr"), [("lars", 4.0), ("sgd", 0.05)])
def test_smoke_run_reaches_target_and_its_log_passes_the_compliance_checker(optimizer, lr, cache_dir, tmp_path):
    overrides = ("experiment=smoke", f"optim={optimizer}", f"optim.base_lr={lr}", f"hydra.run.dir={tmp_path}")
    run_train(*overrides, cache=cache_dir, check=True)
    log = tmp_path / "mlperf.log"
    checker = compliance_check(log)
    assert checker.returncode == 0, checker.stdout + checker.stderr
    assert "SUCCESS" in checker.stdout + checker.stderr
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


def test_a_new_run_refuses_a_directory_that_holds_a_log(cache_dir, tmp_path):
    (tmp_path / "mlperf.log").write_text(":::MLLOG {}\n")
    (tmp_path / "config.yaml").write_text("earlier run\n")
    result = run_train("experiment=smoke", f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 2
    assert "run.resume" in result.stderr and "new hydra.run.dir" in result.stderr
    assert (tmp_path / "mlperf.log").read_text() == ":::MLLOG {}\n"
    assert (tmp_path / "config.yaml").read_text() == "earlier run\n"


RESUME_RUN = ("experiment=smoke", "run.max_epochs=3", "mlperf.target_accuracy=1.0")


def kill_after_first_checkpoint(run_dir: Path, cache: Path) -> None:
    command = [sys.executable, "train.py", *RESUME_RUN, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "RN50PERF_CACHE": str(cache)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoint.pt").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_killed_run_resumes_to_the_same_weights_and_one_valid_log(cache_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_train(*RESUME_RUN, f"hydra.run.dir={straight}", cache=cache_dir, check=True)
    kill_after_first_checkpoint(killed, cache_dir)
    assert not (killed / "model.pt").exists()
    resumed = run_train(*RESUME_RUN, f"hydra.run.dir={killed}", "run.resume=auto", cache=cache_dir, check=True)
    assert "resuming at epoch 2" in resumed.stdout

    expected = torch.load(straight / "model.pt", weights_only=True)
    actual = torch.load(killed / "model.pt", weights_only=True)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name

    def accuracies(run: Path) -> list[float]:
        return [e["value"] for e in mllog_events(run / "mlperf.log") if e["key"] == "eval_accuracy"]

    assert accuracies(killed) == accuracies(straight)
    assert [e["key"] for e in mllog_events(killed / "mlperf.log")].count("run_start") == 1
    assert (killed / "metrics.csv").read_text().count("\n") == 4  # header and three epochs, none twice


def test_a_damaged_or_mismatched_checkpoint_is_refused(cache_dir, tmp_path):
    kill_after_first_checkpoint(tmp_path, cache_dir)
    log_before = (tmp_path / "mlperf.log").read_bytes()

    mismatched = run_train(
        *RESUME_RUN, "optim.base_lr=3.0", f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir
    )
    assert mismatched.returncode == 2
    assert "optim.base_lr: checkpoint 4.0, this run 3.0" in mismatched.stderr

    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
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
    checker = compliance_check(tmp_path / "skip" / "mlperf.log")
    assert checker.returncode == 0, checker.stdout + checker.stderr

    fatal = run_train(*data, *short, "data.bad_files=fail", f"hydra.run.dir={tmp_path / 'fail'}", cache=tmp_path)
    assert fatal.returncode == 2
    assert f"error: unreadable file {bad}" in fatal.stderr
    assert "Traceback" not in fatal.stderr
    stop = [e for e in mllog_events(tmp_path / "fail" / "mlperf.log") if e["key"] == "run_stop"]
    assert [e["metadata"]["status"] for e in stop] == ["aborted"]


@pytest.mark.parametrize(
    "policy", [pytest.param(p, marks=pytest.mark.slow) for p in ("bf16", "bf16.16", "fp16.32")] + ["fp16.16"]
)
def test_a_smoke_run_under_each_precision_policy_passes_the_compliance_checker(policy, cache_dir, tmp_path):
    result = run_train("experiment=smoke", f"precision={policy}", f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"precision {policy}:" in result.stdout
    checker = compliance_check(tmp_path / "mlperf.log")
    assert checker.returncode == 0, checker.stdout + checker.stderr
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header.endswith("loss_scale,skipped_steps")
