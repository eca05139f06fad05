"""Two nodes of the local SLURM (tests/slurm/local_cluster.sh start --nodes 2), each in a network namespace of its
own: a job of examples/slurm/train.sbatch puts one rank on each, and they rendezvous, all-reduce and share
BatchNorm statistics over the bridge. The faults a multi-node run meets (a node lost, a link cut, a rank frozen,
the job preempted) each stop every process within a bound, at a seeded random point of an epoch after the first
checkpoint; the stopped attempt's log ends aborted, its checkpoint loads, and the requeued job resumes to the
weights of a run never interrupted."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import checkpoint
from configs.schema import training_fingerprint
from tests.conftest import (
    REPO,
    assert_compliant,
    assert_same_run,
    composed,
    mllog_events,
    processes_mentioning,
    record_margin,
)
from tests.slurm.conftest import FAULT_FIGURES, cluster
from tests.slurm.jobs import (
    JOB_TIMEOUT_S,
    LONGER,
    TWO_TASKS,
    assert_resumed_once,
    job_environment,
    job_of,
    launched,
    release_when_requeued,
    sbatch,
    squeue,
    wait_for_job,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("two_nodes")  # skipped, with the reason, on a cluster of one node
ONE_RANK_EACH = ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=4G")
TIMEOUT_S = 10  # dist.timeout_s: a collective waiting longer fails
ACROSS = (*LONGER, f"dist.timeout_s={TIMEOUT_S}")  # BatchNorm over both ranks: its statistics cross the link too
GONE_WITHIN_S = TIMEOUT_S + 15  # the timeout, then the log ended and the loader workers shut down
SLURMD_TIMEOUT_S = 20  # tests/slurm/local_cluster.sh's: SLURM marks a node that stopped answering down after it
REQUEUED_WITHIN_S = GONE_WITHIN_S + SLURMD_TIMEOUT_S + 20  # srun may wait for a lost node until it is marked down
LINK_CUT_S = TIMEOUT_S + 5


def link_bytes(node: str) -> int:
    """Bytes through node `node`'s end of the bridge so far, both ways."""
    stats = Path(f"/sys/class/net/rn50perf-v{node.removeprefix('n')}/statistics")
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def run_across(run_dir: Path, cache: Path, *overrides: str) -> str:
    return sbatch(run_dir, cache, *ACROSS, *overrides, where=ONE_RANK_EACH)


@pytest.mark.slow
def test_the_sbatch_example_trains_the_smoke_recipe_to_its_target_on_two_nodes(cache_dir, tmp_path):
    run_dir = tmp_path / "smoke"
    where = ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=8G")
    wait_for_job(sbatch(run_dir, cache_dir, "experiment=smoke", "device.threads=1", where=where))
    output = Path(f"{run_dir}.out").read_text()
    assert "2 ranks (slurm)" in output and "run_stop status success" in output, output
    record_margin("smoke lars, 2 nodes x 1 rank (sbatch)", run_dir / "mlperf.log", max_epochs=10)
    assert_compliant(run_dir / "mlperf.log")


def rank_processes(run_dir: Path) -> list[int]:
    """The ranks of the run in `run_dir` and their loader workers: the sbatch example's name the directory, the
    launcher's their job's folder in the sweep's .submitit/ (srun, which names them too, is not one)."""
    named = processes_mentioning(f"hydra.run.dir={run_dir}", f"{run_dir.parent}/.submitit/")
    return [pid for pid in named if comm(pid) != "srun"]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rank_on(node: str, run_dir: Path) -> int:
    """The pid of the rank running on `node` (its namespace's train.py whose parent is not one: not a worker)."""
    pids = subprocess.run(["ip", "netns", "pids", f"rn50perf-{node}"], capture_output=True, text=True).stdout.split()
    ours = set(rank_processes(run_dir)) & {int(pid) for pid in pids}
    (rank,) = [pid for pid in ours if parent(pid) not in ours]
    return rank


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def freeze_rank_on_n2(run_dir: Path) -> Callable[[], None]:
    return lambda: os.kill(rank_on("n2", run_dir), signal.SIGSTOP)  # no crash, no closed socket, no heartbeat


def inject_mid_epoch(run_dir: Path, fault: str, inject: Callable[[], None]) -> float:
    """Once the first checkpoint is written, wait a seeded random part of an epoch (the first epoch's time),
    then inject; returns when it was injected (time.monotonic)."""
    metrics, saved = run_dir / "metrics.csv", run_dir / "checkpoint.pt"
    wait_until(lambda: saved.exists() and metrics.exists(), lambda: f"no checkpoint in {run_dir}")
    epoch_s = float(metrics.read_text().splitlines()[1].split(",")[6])  # elapsed_s at the end of epoch 1
    time.sleep(random.Random(fault).uniform(0.1, 0.9) * epoch_s)
    injected = time.monotonic()
    inject()
    return injected


def seconds_until_gone(run_dir: Path, since: float) -> float:
    """Wait until no rank of the run is left; the seconds from `since`."""
    wait_until(lambda: not rank_processes(run_dir), lambda: f"ranks still running: {rank_processes(run_dir)}")
    return time.monotonic() - since


def assert_stopped_attempt(run_dir: Path) -> int:
    """The stopped attempt ended its log aborted and left a checkpoint this run loads; returns its step."""
    events = mllog_events(run_dir / "mlperf.log")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    fingerprint = training_fingerprint(composed(*ACROSS, world_size=2), world_size=2)
    return int(checkpoint.load(run_dir / "checkpoint.pt", fingerprint)["loop"]["step"])


def resumed_after(run_dir: Path, released: float) -> float:
    """Seconds from the requeued job's release to its resumed attempt's restore (rn50perf_resumed in the log)."""
    resumed = next(e for e in mllog_events(run_dir / "mlperf.log") if e["key"] == "rn50perf_resumed")
    return resumed["time_ms"] / 1000 - released


def steps_to_take_again(output: str) -> int:
    """What rank 0 said the lost rank cost: the steps since its checkpoint."""
    found = re.search(r"its checkpoint is at step \d+ \((\d+) steps to take again\)", output)
    assert found, output
    return int(found[1])


def seconds_until_requeued(job: str, since: float) -> float:
    """Wait until the job is back in the queue, its processes (srun and the batch script too) gone; the seconds
    from `since`."""
    wait_until(lambda: squeue(job, "%T") == "PENDING", lambda: f"job {job} not requeued: {squeue(job, '%T %r')}")
    return time.monotonic() - since


def record(fault: str, gone_s: float, requeued_s: float, resumed_s: float, lost_steps: int) -> None:
    FAULT_FIGURES.append(
        f"{fault}: every rank gone {gone_s:.1f} s after it (dist.timeout_s={TIMEOUT_S}), the job requeued after "
        f"{requeued_s:.1f} s; released requeue to resumed {resumed_s:.1f} s; {lost_steps} steps to take again"
    )


def assert_trained_across_the_link(run_dir: Path, sent: int) -> None:
    """Every step's gradients crossed the link: ResNet-50's 25.6 M fp32 gradients (102 MB) each way at each of the
    run's 12 steps; and rank 0 alone wrote the run's one directory."""
    assert sent > 12 * 2 * 102e6, f"{sent / 1e6:.0f} MB crossed the link"
    assert [path.name for path in run_dir.parent.iterdir() if path.is_dir()] == [run_dir.name]


def lose_a_rank_and_resume(
    fault: str,
    inject: Callable[[Path], Callable[[], None]],
    whole_run: Path,
    cache: Path,
    tmp_path: Path,
    after: Callable[[str], None] | None = None,
) -> None:
    """A run across both nodes gets `fault` mid-epoch: its ranks stop within the bound, rank 0 names the lost one and
    ends the log, the job is requeued (by its script on exit status 4, or by SLURM when the node is gone), and
    the requeued job resumes to the weights of a run never interrupted."""
    run_dir = tmp_path / fault.replace(" ", "-")
    before = link_bytes("n2")
    job = run_across(run_dir, cache)
    injected = inject_mid_epoch(run_dir, fault, inject(run_dir))
    gone_s = seconds_until_gone(run_dir, injected)
    assert gone_s < GONE_WITHIN_S, f"{fault}: ranks still running {gone_s:.1f} s after it"
    saved_step = assert_stopped_attempt(run_dir)
    requeued_s = seconds_until_requeued(job, injected)
    assert requeued_s < REQUEUED_WITHIN_S
    if after is not None:
        after(job)
    released = release_when_requeued(job)
    wait_for_job(job)
    output = Path(f"{run_dir}.out").read_text()
    assert "error: rank 1 stopped responding" in output, output
    lost = steps_to_take_again(output)
    assert saved_step % 4 == 0 and 0 <= lost <= 4, output
    assert_resumed_once(run_dir, "a rank was lost at step")
    assert_same_run(whole_run, run_dir)
    record(fault, gone_s, requeued_s, resumed_after(run_dir, released), lost)
    assert_trained_across_the_link(run_dir, link_bytes("n2") - before)


@pytest.mark.slow
def test_a_node_lost_mid_epoch_stops_the_run_which_resumes_when_requeued(whole_run, cache_dir, tmp_path):
    lose_a_rank_and_resume(
        "node lost",
        lambda run_dir: lambda: check(cluster("kill-node", "n2")),
        whole_run,
        cache_dir,
        tmp_path,
        after=lambda job: check(cluster("start-node", "n2")),  # back once requeued; SLURM returns it to service
    )


@pytest.mark.slow
def test_a_link_cut_past_the_timeout_stops_the_run_which_resumes_when_requeued(whole_run, cache_dir, tmp_path):
    def cut(run_dir: Path) -> Callable[[], None]:
        def down_then_up() -> None:
            check(cluster("link", "n2", "down"))
            time.sleep(LINK_CUT_S)
            check(cluster("link", "n2", "up"))

        return down_then_up

    lose_a_rank_and_resume("link cut", cut, whole_run, cache_dir, tmp_path)


@pytest.mark.slow
def test_a_frozen_rank_is_named_and_the_run_resumes_when_requeued(whole_run, cache_dir, tmp_path):
    lose_a_rank_and_resume("rank frozen", freeze_rank_on_n2, whole_run, cache_dir, tmp_path)


# Slow (a minute and more: the two-node run never stopped, then the preempted one): make test checks what it adds in
# process (one rank's stop stopping every rank at one step boundary, the resume command: tests/test_distributed.py)
# and a one-node job of the same script (tests/slurm/test_slurm.py).
@pytest.mark.slow
def test_a_preempted_two_node_job_checkpoints_and_resumes_to_the_same_weights(whole_run, cache_dir, tmp_path):
    run_dir = tmp_path / "preempted"
    before = link_bytes("n2")
    job = run_across(run_dir, cache_dir)
    injected = inject_mid_epoch(run_dir, "preempted", requeue(job))
    gone_s = seconds_until_gone(run_dir, injected)
    assert gone_s < GONE_WITHIN_S
    assert_stopped_attempt(run_dir)  # checkpointed at the step boundary after the signal: nothing to take again
    requeued_s = seconds_until_requeued(job, injected)
    released = release_when_requeued(job)
    wait_for_job(job)
    assert_resumed_once(run_dir, "stopped by SIGTERM")
    assert_same_run(whole_run, run_dir)
    record("preempted (scontrol requeue)", gone_s, requeued_s, resumed_after(run_dir, released), 0)
    assert_trained_across_the_link(run_dir, link_bytes("n2") - before)


def check(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr


def requeue(job: str) -> Callable[[], None]:
    """As preemption would: SIGTERM to every task, then the job back in the queue."""
    return lambda: check(subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True))


@pytest.mark.slow
def test_a_hydra_launcher_job_on_two_nodes_that_loses_a_rank_requeues_itself_and_resumes(
    whole_run, cache_dir, tmp_path
):
    sweep = tmp_path / "sweep"
    across = ("hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1", f"hydra.sweep.dir={sweep}")
    command = [sys.executable, "train.py", "-m", *TWO_TASKS, *across, *ACROSS]
    output = tmp_path / "launcher.out"
    run_dir = sweep / "0"
    with launched(command, REPO, job_environment(cache_dir), output) as launcher:
        wait_until(lambda: (run_dir / "mlperf.log").exists(), lambda: output.read_text(), launcher)
        injected = inject_mid_epoch(run_dir, "launcher rank frozen", freeze_rank_on_n2(run_dir))
        gone_s = seconds_until_gone(run_dir, injected)
        assert gone_s < GONE_WITHIN_S
        release_when_requeued(job_of(sweep))
        launcher.wait(timeout=JOB_TIMEOUT_S)
    assert launcher.returncode == 0, output.read_text()
    assert_resumed_once(run_dir, "a rank was lost at step")
    assert_same_run(whole_run, run_dir)
