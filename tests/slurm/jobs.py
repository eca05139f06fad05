"""Submitting jobs to the local SLURM and following them, for the tests in this folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import ALL_EPOCHS, REPO, TINY_RUN, assert_compliant, assert_read_whole, mllog_events, train_env

# A run of a few seconds on one CPU per rank: 64 images at 32 px, one thread per rank.
TINY = (*TINY_RUN, "mlperf=open", "device.threads=1")
# Three epochs of 4 steps that never reach the target, BatchNorm over both ranks: a run to stop in the middle and
# compare with a whole one, on one node or across two (the same arithmetic: the same weights).
LONGER = (*TINY, "run.max_epochs=3", *ALL_EPOCHS, "dist.bn_group_size=2")
# Two tasks of one CPU each through Hydra's launcher, on one 2-core node.
TWO_TASKS = (
    "hydra/launcher=slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.tasks_per_node=2",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=4",
)
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
ON_THIS_NODE = ("--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=4G")
JOB_TIMEOUT_S = 180


def job_environment(cache: Path, **extra: str) -> dict[str, str]:
    """What the submitting shell passes to its jobs: train.py's test environment, with this Python first on PATH
    (the sbatch example calls `python`)."""
    return train_env(cache, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **extra)


@contextmanager
def launched(command: list[str], cwd: Path, env: dict[str, str], output: Path) -> Iterator[subprocess.Popen]:
    """A multirun submitting in the background, its output to the file `output`; killed if the test ends first."""
    with output.open("w") as sink:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()


def slurm_query(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True).stdout.strip()


def squeue(job: str, fmt: str) -> str:
    return slurm_query("squeue", "-h", "-j", job, "-o", fmt)


def wait_until(done: Callable[[], bool], what: Callable[[], str], process: subprocess.Popen | None = None) -> None:
    """Poll `done` until it holds; fail with `what()` after JOB_TIMEOUT_S, or once `process` (a submission) ended."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not done():
        assert process is None or process.poll() is None, f"the submission ended first: {what()}"
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def wait_for_line(path: Path, marker: str, process: subprocess.Popen | None = None) -> None:
    """Until a line of the file at `path` (a job's output) contains `marker`."""
    wait_until(lambda: path.exists() and marker in path.read_text(), lambda: f"no {marker!r} in {path}", process)


def release_when_requeued(job: str) -> float:
    """SLURM holds a requeued job for two minutes (its EligibleTime); let it start sooner, as an administrator may:
    once every node is idle again, and a few seconds after the requeue, since slurmd refuses a job credential issued
    in the same second as the one it revoked ("Job credential revoked"). Returns when it was released (time.time)."""
    wait_until(
        lambda: squeue(job, "%T %r") == "PENDING BeginTime" and set(node_states()) == {"idle"},
        lambda: f"job {job} was not requeued: {squeue(job, '%T %r')}; nodes {node_states()}",
    )
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    return time.time()


def node_states() -> list[str]:
    return slurm_query("sinfo", "-h", "-N", "-o", "%T").split()


def wait_for_job(job: str) -> None:
    wait_until(lambda: not squeue(job, "%T"), lambda: f"job {job} still {squeue(job, '%T')}")


def assert_resumed_once(run_dir: Path, reason: str) -> None:
    """The stopped attempt's log is kept whole and ends with run_stop aborted; the run's log, which passes the
    checker, says where it was resumed and keeps the first attempt's run_start (the clock is not paused)."""
    attempt = mllog_events(run_dir / "mlperf.attempt1.log")
    assert attempt[-1]["key"] == "run_stop" and attempt[-1]["metadata"]["status"] == "aborted"
    assert_read_whole(run_dir / "mlperf.attempt1.log")  # no block ended before the stop: it need not pass
    events = mllog_events(run_dir / "mlperf.log")
    resumed = [e for e in events if e["key"] == "rn50perf_resumed"]
    assert len(resumed) == 1 and resumed[0]["value"]["stopped_attempt_log"] == "mlperf.attempt1.log"
    run_start = next(e for e in events if e["key"] == "run_start")
    assert run_start == next(e for e in attempt if e["key"] == "run_start")
    assert not (run_dir / "mlperf.attempt2.log").exists()
    assert reason in (run_dir / "train.log").read_text()  # resume.sh went as the run ended
    assert not (run_dir / "resume.sh").exists() and not (run_dir / "checkpoint.pt").exists()
    assert_compliant(run_dir / "mlperf.log")


def sbatch(
    run_dir: Path, cache: Path, *overrides: str, where: tuple[str, ...] = ON_THIS_NODE, output: bool = True
) -> str:
    """Submit the sbatch example from the repository, as its comment says, on the nodes `where` asks for, its
    output to {run_dir}.out (output=False: where the example sends it); returns the job id."""
    to = [f"--output={run_dir}.out"] if output else []
    command = ["sbatch", "--parsable", *where, *to, str(SBATCH), "device=cpu", *overrides]
    env = job_environment(cache, RUN_DIR=str(run_dir))
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.strip()


def job_of(sweep: Path) -> str:
    """The SLURM job id of a one-job multirun, from submitit's folder of it."""
    return next(path.name for path in (sweep / ".submitit").iterdir() if path.is_dir())
