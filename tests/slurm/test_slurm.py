"""Runs on one node of the local SLURM (tests/slurm/local_cluster.sh): jobs of two tasks (gloo on the CPU) through
Hydra's launcher (one run, an Optuna sweep) and through examples/slurm/train.sbatch; a job stopped before its time
limit or requeued by SLURM resumes to the same weights as one that never stopped."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.conftest import (
    ALL_EPOCHS,
    REPO,
    assert_compliant,
    assert_same_run,
    importing_torch,
    mllog_events,
    run_train,
    time_to_train_min,
)
from tests.slurm.jobs import (
    JOB_TIMEOUT_S,
    LONGER,
    TINY,
    TWO_TASKS,
    assert_resumed_once,
    job_environment,
    job_of,
    launched,
    release_when_requeued,
    sbatch,
    squeue,
    wait_for_job,
    wait_for_line,
    wait_until,
)


def test_a_task_defined_by_the_running_script_travels_by_name(tmp_path):
    # cloudpickle copies what __main__ defines by value, with every global its code touches: here torch and an
    # attribute called `classes`, which drag in torch.classes, which cannot be pickled.
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import cloudpickle, hydra, torch
            from hydra_plugins.rn50perf_slurm import ScriptTask

            @hydra.main(version_base=None)
            def main(cfg):
                return int(torch.tensor(len(cfg.classes)))

            if __name__ == "__main__":
                sys.stdout.buffer.write(cloudpickle.dumps(ScriptTask.of(main.__wrapped__)))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pickled = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, check=True).stdout
    task = pickle.loads(pickled)  # in a process that never ran the script: it imports it
    assert task(OmegaConf.create({"classes": ["a", "b", "c"]})) == 3


def test_a_sweep_slurm_cannot_take_leaves_a_users_folder_as_it_was(slurm, cache_dir, tmp_path):
    """hydra.sweep.dir given as a folder of the user's, on a machine whose SLURM cannot take the jobs (an empty
    slurm.conf): the same one line, and the folder stays with the user's file, byte for byte, though it holds only
    a .submitit, as a folder the sweep made would (that one goes: tests/test_sweeps.py)."""
    (tmp_path / "slurm.conf").write_text("")
    mine = tmp_path / "mine"
    notes = mine / ".submitit" / "notes.bin"
    notes.parent.mkdir(parents=True)
    notes.write_bytes(b"my notes on an earlier sweep\n\x00\xff")
    overrides = ("-m", "hydra/launcher=slurm", f"hydra.sweep.dir={mine}")
    result = run_train(*overrides, cache=cache_dir, env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: hydra/launcher=slurm: sbatch could not submit the jobs: sbatch: fatal: ")
    assert notes.read_bytes() == b"my notes on an earlier sweep\n\x00\xff"


# Slow: make test checks what it adds: the launcher's job requeuing itself on SLURM's warning (the test below, warned
# while it starts), a requeued job resuming to the weights of a run never stopped (test_multinode.py, preempted),
# and SIGUSR1 mid-run stopping at a step boundary, resumed (tests/test_run.py, the run with workers stopped twice).
@pytest.mark.slow
def test_a_hydra_launcher_job_warned_before_its_time_limit_requeues_itself_and_resumes(
    slurm, whole_run, cache_dir, tmp_path
):
    # Launched from a directory that is not the repository, as a user's script or notebook might.
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(REPO / "train.py"), "-m", *TWO_TASKS, *LONGER, f"hydra.sweep.dir={sweep}"]
    output = tmp_path / "launcher.out"
    with launched(command, tmp_path, job_environment(cache_dir), output) as launcher:
        wait_for_line(sweep / "0" / "mlperf.log", "run_start", launcher)
        job = job_of(sweep)
        # What SLURM sends signal_delay_s before the time limit (--signal=USR1@N): USR1 to every task.
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        release_when_requeued(job)
        launcher.wait(timeout=JOB_TIMEOUT_S)
    assert launcher.returncode == 0, output.read_text()
    run_dir = sweep / "0"
    rank0 = sweep / ".submitit" / job / f"{job}_0_log"
    assert Path(f"{rank0}.out").read_text().count("2 ranks (slurm)") == 2
    assert f"job {job} requeued: it resumes from the checkpoint" in Path(f"{rank0}.err").read_text()
    assert_resumed_once(run_dir, "stopped by SIGUSR1")
    assert_same_run(whole_run, run_dir)


@pytest.mark.slow  # make test: a stop while train.py starts (tests/test_run.py); SLURM's requeues: make test-all
def test_a_hydra_launcher_job_warned_while_it_starts_requeues_itself_and_trains_from_the_start(
    slurm, cache_dir, tmp_path
):
    """SLURM may send its warning up to a minute early: here while the job's tasks load the run (submitit has
    loaded this launcher, torch is being imported). Each task exits with 138 and no traceback, rank 0
    requeues the job, and the requeued job trains the run from its start: one log, no stopped attempt's."""
    sweep = tmp_path / "sweep"
    one_epoch = (*TINY, "run.max_epochs=1", *ALL_EPOCHS)
    command = [sys.executable, str(REPO / "train.py"), "-m", *TWO_TASKS, *one_epoch, f"hydra.sweep.dir={sweep}"]
    output = tmp_path / "launcher.out"
    with launched(command, tmp_path, job_environment(cache_dir), output) as launcher:
        wait_until(lambda: importing_torch(str(sweep / ".submitit")), lambda: "no task importing torch", launcher)
        job = job_of(sweep)
        rank0 = sweep / ".submitit" / job / f"{job}_0_log"
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        release_when_requeued(job)
        launcher.wait(timeout=JOB_TIMEOUT_S)
    assert launcher.returncode == 0, output.read_text()
    errors = Path(f"{rank0}.err").read_text()
    assert f"job {job} requeued" in errors and "Traceback" not in errors, errors
    run_dir = sweep / "0"
    assert not list(run_dir.glob("mlperf.attempt*.log"))
    assert [event["key"] for event in mllog_events(run_dir / "mlperf.log")].count("run_start") == 1
    assert_compliant(run_dir / "mlperf.log")


@pytest.mark.slow  # make test keeps Optuna's sweep through train.py (tests/test_sweeps.py) and the launcher's job
def test_an_optuna_sweep_over_slurm_gets_each_trials_time_to_train(slurm, cache_dir, tmp_path):
    study = f"sqlite:///{tmp_path}/ttt.db"
    command = [
        sys.executable,
        "train.py",
        "-m",
        *TWO_TASKS,
        "hparams_search=ttt_optuna",
        *TINY,
        "run.max_epochs=1",
        "mlperf.target_accuracy=0.01",  # reached at the first evaluation: every trial has a time to train
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={study}",
        "hydra.sweeper.study_name=ttt",
        f"hydra.sweep.dir={tmp_path}",
    ]
    sweep = subprocess.run(command, cwd=REPO, env=job_environment(cache_dir), capture_output=True, text=True)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    import optuna  # here, not at the top: 4 s that every collection of make test would pay for a slow test

    trials = optuna.load_study(study_name="ttt", storage=study).trials
    assert len(trials) == 2
    for trial in trials:
        run_dir = tmp_path / str(trial.number)
        status, minutes = time_to_train_min(run_dir)
        assert status == "success" and trial.value == pytest.approx(minutes, abs=1e-4)
        assert_compliant(run_dir / "mlperf.log")
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())["best_value"]
    assert best == min(trial.value for trial in trials)


# Slow (half a minute): make test runs two ranks through torchrun (tests/test_distributed.py), reads SLURM's
# environment in process (test_distributed) and the sbatch example's own output (below).
@pytest.mark.slow
def test_the_sbatch_example_runs_two_ranks_whose_log_passes_the_checker(whole_run):
    assert "2 ranks (slurm)" in Path(f"{whole_run}.out").read_text()
    assert [e["key"] for e in mllog_events(whole_run / "mlperf.log")].count("run_start") == 1
    assert_compliant(whole_run / "mlperf.log")


def test_the_sbatch_examples_output_is_where_it_says_and_git_ignores_it(slurm, cache_dir, tmp_path):
    """Submitted from the repository without --output, as its comment shows: the job's lines are in
    slurm-<job id>.out there, and `git status` shows nothing of it (here the job of a refused run on one rank: it
    ends at once, and leaves no run folder). Held until the test knows its id, the name of its output."""
    one_rank = ("--ntasks-per-node=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=4G", "--hold")
    job = sbatch(tmp_path / "refused", cache_dir, "optim.base_lrr=4", where=one_rank, output=False)
    out = REPO / f"slurm-{job}.out"
    if out.exists():  # a user's, from a job of an earlier cluster with the same id: this job would append to it
        subprocess.run(["scancel", job], check=True)
        pytest.skip(f"{out} is there already: this test would write to it")
    subprocess.run(["scontrol", "release", job], check=True)
    try:
        wait_for_job(job)
        assert "error: optim.base_lrr: no such key; did you mean optim.base_lr?" in out.read_text()
        git = ["git", "status", "--porcelain", "--untracked-files=all"]
        assert out.name not in subprocess.run(git, cwd=REPO, capture_output=True, text=True, check=True).stdout
        assert not (tmp_path / "refused").exists()
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.slow  # over a minute: make test checks the stop of two ranks at one step in process (test_distributed)
def test_an_sbatch_job_requeued_by_slurm_resumes_to_the_same_weights(slurm, whole_run, cache_dir, tmp_path):
    run_dir = tmp_path / "requeued"
    job = sbatch(run_dir, cache_dir, *LONGER)
    wait_for_line(run_dir / "mlperf.log", "run_start")
    subprocess.run(["scontrol", "requeue", job], check=True)  # as preemption would: SIGTERM, then the queue
    release_when_requeued(job)
    wait_for_job(job)
    output = Path(f"{run_dir}.out").read_text()
    assert output.count("2 ranks (slurm)") == 2 and "resuming at epoch" in output, output
    assert_resumed_once(run_dir, "stopped by SIGTERM")
    assert_same_run(whole_run, run_dir)


@pytest.mark.slow
def test_a_hydra_launcher_job_that_reaches_its_time_limit_is_warned_requeued_and_finishes(slurm, cache_dir, tmp_path):
    # A one-minute limit with the warning 40 s before it, which SLURM may send up to a minute early (sbatch(1),
    # --signal): here it came at slurmctld's periodic check, each attempt about 30 s after the one before, while a
    # task may still be importing. 16 epochs of 4 steps: more than an attempt trains on the fastest host (about 40
    # steps, an AMX Xeon), 5 or 6 attempts on the slowest (about 12 steps each, an AVX2-only EPYC), so SLURM's own
    # timer stops the run at least once, and the run ends in a later attempt.
    overrides = ("hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=40", "run.max_epochs=16")
    command = [sys.executable, "train.py", "-m", *TWO_TASKS, *LONGER, *overrides, f"hydra.sweep.dir={tmp_path}"]
    output = tmp_path / "launcher.out"
    with launched(command, REPO, job_environment(cache_dir), output) as launcher:
        wait_for_line(tmp_path / "0" / "mlperf.log", "run_start", launcher)
        job = job_of(tmp_path)
        deadline = time.monotonic() + 2 * JOB_TIMEOUT_S
        while launcher.poll() is None:
            assert time.monotonic() < deadline, f"job {job} has not finished"
            if squeue(job, "%T %r") == "PENDING BeginTime":
                release_when_requeued(job)
            time.sleep(0.5)
    assert launcher.returncode == 0, output.read_text()
    run_dir = tmp_path / "0"
    attempts = sorted(run_dir.glob("mlperf.attempt*.log"))
    assert attempts, "the run ended before its time limit"
    for attempt in attempts:
        assert mllog_events(attempt)[-1]["metadata"]["status"] == "aborted"
    assert "stopped by SIGUSR1" in (run_dir / "train.log").read_text()  # each attempt's lines, appended
    assert (run_dir / "model.pt").exists() and not (run_dir / "resume.sh").exists()
    assert_compliant(run_dir / "mlperf.log")
