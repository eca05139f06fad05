"""Several processes: the launcher's environment, start-up checks, rank 0's decisions, a 2-rank run with torchrun,
and a rank that dies."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlperf_logging
import pytest
import torch
import yaml

import distributed
import stopsignals
from backends.base import StepSettings
from backends.native import NativeBackend
from configs.checks import ConfigError
from configs.schema import Config, validate
from distributed.stop import Resume, agreed_stop
from distributed.topology import LaunchError, Topology, first_host, from_environment
from models import batchnorm, build_resnet50
from tests.conftest import (
    ALL_EPOCHS,
    REPO,
    TINY_RUN,
    assert_compliant,
    assert_compliant_but_for_accuracy,
    assert_same_run,
    mllog_events,
    processes_mentioning,
    record_margin,
    run_train,
    train_env,
)
from tests.ranks import run_ranks

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
SMOKE = ("experiment=smoke",)


def test_torchrun_environment_names_the_rank():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node7", "MASTER_PORT": "1234"}
    topology = from_environment(env | {"TORCHELASTIC_USE_AGENT_STORE": "True", "LOCAL_WORLD_SIZE": "4"})
    assert topology == Topology(3, 8, 1, "torchrun", "node7", 1234, agent_store=True, local_world_size=4)
    assert not topology.is_main and topology.distributed


def test_slurm_environment_rendezvous_on_the_first_node():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-09,12]"}
    topology = from_environment(env | {"SLURM_JOB_ID": "4242"})
    assert (topology.rank, topology.world_size, topology.local_rank) == (5, 8, 1)
    assert (topology.launcher, topology.master_addr, topology.master_port) == ("slurm", "gpu07", 29500 + 4242)
    assert topology.local_world_size == 1  # no tasks per node said: one
    per_node = {"SLURM_STEP_TASKS_PER_NODE": "3(x2),2", "SLURM_NODEID": "2"}
    assert from_environment(env | per_node).local_world_size == 2  # the third node's count
    assert from_environment(env | per_node | {"SLURM_NODEID": "1"}).local_world_size == 3
    assert from_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == Topology()  # one task: one process
    assert from_environment({**env, "RANK": "0", "WORLD_SIZE": "2"}).launcher == "torchrun"  # torchrun in SLURM


@pytest.mark.parametrize(("nodes", "first"), [("n1", "n1"), ("a[3-5]", "a3"), ("b[010,2],c1", "b010"), ("x,y", "x")])
def test_first_host_of_a_slurm_node_list(nodes, first):
    assert first_host(nodes) == first


SLURM_PAIR = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n1"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "two", "WORLD_SIZE": "4"}, "RANK='two' is not an integer"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is not in [0, world size 4)"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_JOB_NODELIST is not set"),
        (SLURM_PAIR | {"SLURM_STEP_TASKS_PER_NODE": "2(x"}, "cannot read SLURM's tasks per node '2(x'"),
        (SLURM_PAIR | {"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "1"}, "SLURM_NODEID=1 is not a node of"),
    ],
)
def test_a_broken_launcher_environment_is_refused(env, message):
    with pytest.raises(LaunchError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        from_environment(env)


@pytest.mark.parametrize(
    ("overrides", "world_size", "key"),
    [
        ({"global_batch": 64, "grad_accum": 3}, 2, "data.global_batch"),
        ({"global_batch": 60, "grad_accum": 4}, 2, "data.global_batch"),
        ({"global_batch": 64, "bn_group_size": 3}, 4, "dist.bn_group_size"),
        ({"global_batch": 64, "bn_group_size": 2}, 1, "dist.bn_group_size"),
        ({"global_batch": 66}, 4, "data.global_batch"),
    ],
)
def test_batch_sizes_that_disagree_with_the_world_size_are_refused(overrides, world_size, key):
    cfg = Config()
    cfg.data.global_batch = overrides.pop("global_batch")
    for name, value in overrides.items():
        setattr(cfg.dist, name, value)
    with pytest.raises(ConfigError) as err:
        validate(cfg, world_size)
    assert err.value.key == key


def test_a_rank_refuses_a_batch_that_does_not_split_over_the_ranks(cache_dir, tmp_path):
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = run_train(*SMOKE, f"hydra.run.dir={tmp_path}", cache=cache_dir, env=env)
    assert result.returncode == 2
    assert "error: data.global_batch: 16 images do not deal evenly to 3 ranks x dist.grad_accum 1" in result.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # a rank > 0 writes nothing


def _refuse() -> None:
    raise ConfigError("run.resume", "outputs/x already holds a finished run")


def _rank_zero_decides(rank: int) -> tuple:
    chosen = distributed.from_main(lambda: f"decided by rank {rank}")
    gathered = distributed.gather_to_main({"rank": rank, "state": torch.full((2,), rank)})
    try:
        distributed.from_main(_refuse)
    except ConfigError as err:
        refused = err.key
    return chosen, [(g["rank"], g["state"].tolist()) for g in gathered], refused


def _train_two_steps(rank: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(rank)  # each rank builds different initial weights, as seeds are per rank
    model = build_resnet50(4, batchnorm(0.1, 1e-5), channels_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    backend = NativeBackend(model, optimizer, torch.device("cpu"), StepSettings(label_smoothing=0.1))
    generator = torch.Generator().manual_seed(100 + rank)  # and reads different images
    for _ in range(2):
        images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8, generator=generator)
        backend.train_step(images, torch.randint(0, 4, (4,), generator=generator), lr=0.1)
    backend.end_epoch()  # local BatchNorm's running statistics are averaged
    return backend.state_dict()["model"]


def _one_rank_signalled(rank: int) -> tuple[int | None, int | None]:
    """While the loop runs, rank 1 alone receives SIGTERM: the step boundary before it goes on, on every rank; the
    next one stops every rank, with the signal's exit status (agreed_stop, as the loop asks after each step)."""
    stopsignals.catch()
    with stopsignals.running():
        before = agreed_stop()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            while not stopsignals.received():  # noted by its handler, for the next step boundary
                time.sleep(0.01)
        after = agreed_stop()
    return (before and before.code), (after and after.code)


def _on_each_rank(rank: int, world_size: int) -> dict[str, object]:
    trained = _train_two_steps(rank)
    return {"decisions": _rank_zero_decides(rank), "trained": trained, "stop": _one_rank_signalled(rank)}


@pytest.fixture(scope="module")
def ranked() -> list[dict[str, object]]:
    """What each of 2 gloo ranks returns from every scenario, run in one spawn (each costs seconds of imports)."""
    return run_ranks(_on_each_rank, 2)


def test_rank_zero_decides_gathers_and_its_errors_reach_every_rank(ranked):
    results = [rank["decisions"] for rank in ranked]
    assert [chosen for chosen, _, _ in results] == ["decided by rank 0"] * 2
    assert results[0][1] == [(0, [0, 0]), (1, [1, 1])] and results[1][1] == []
    assert [refused for _, _, refused in results] == ["run.resume", "run.resume"]


def test_ranks_start_from_rank_0s_weights_and_stay_identical(ranked):
    first, second = (rank["trained"] for rank in ranked)
    assert first.keys() == second.keys()
    for key, value in first.items():
        assert torch.equal(value, second[key]), key


def test_one_ranks_stop_signal_stops_every_rank_at_the_same_step_boundary(ranked):
    assert [rank["stop"] for rank in ranked] == [(None, 128 + signal.SIGTERM)] * 2


def test_a_torchrun_runs_resume_command_starts_as_many_ranks_again_in_its_directory(tmp_path, monkeypatch):
    """resume.sh of a run of 2 ranks under torchrun (its workers are told LOCAL_WORLD_SIZE)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    topology = Topology(0, 2, 0, "torchrun", local_world_size=2)
    overrides = ["experiment=smoke", "hydra.run.dir=elsewhere", "run.resume=none"]
    resume = Resume.of(topology, overrides, tmp_path, keep_env=[])
    assert resume.argv == [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"),
        *("experiment=smoke", f"hydra.run.dir={tmp_path}", "run.resume=auto"),
    ]
    script = resume.write_script(tmp_path, "stopped by SIGTERM")
    assert "torch.distributed.run --standalone --nproc-per-node=2 train.py experiment=smoke" in script.read_text()


def exactly_one_keys() -> set[str]:
    """The keys the ruleset's checker requires exactly once in a closed ResNet log."""
    rules = Path(mlperf_logging.__file__).parent / "compliance_checker" / "training_4.0.0"
    keys = set()
    for name in ("common.yaml", "closed_common.yaml", "closed_resnet.yaml", "closed_resnet_lars.yaml"):
        for rule in yaml.safe_load((rules / name).read_text()) or []:
            if "KEY" in rule and rule["KEY"].get("REQ") == "EXACTLY_ONE":
                keys.add(rule["KEY"]["NAME"])
    return keys


def torchrun(*overrides: str, cache: Path) -> subprocess.Popen[str]:
    command = [*TORCHRUN, "train.py", *overrides]
    return subprocess.Popen(
        command, cwd=REPO, env=train_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


# Two ranks of one thread and one loader worker each (the machine's 2 cores), 2 epochs of 4 steps (TINY_RUN's 64
# images at 32 px, batches of 8 per rank) that never reach the target.
TWO_RANKS = (*TINY_RUN, "run.max_epochs=2", *ALL_EPOCHS, "device.threads=1", "data.workers=1")


@pytest.fixture(scope="module")
def two_ranks(cache_dir, tmp_path_factory) -> tuple[Path, str]:
    """TWO_RANKS under torchrun, never stopped: its run directory (alone in its parent) and what it printed."""
    run_dir = tmp_path_factory.mktemp("two-ranks") / "run"
    run = torchrun(*TWO_RANKS, f"hydra.run.dir={run_dir}", cache=cache_dir)
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stdout + stderr
    return run_dir, stdout


def test_two_ranks_write_one_directory_and_a_log_that_passes_the_checker(two_ranks, tmp_path):
    run_dir, _ = two_ranks
    assert_compliant_but_for_accuracy(run_dir / "mlperf.log", tmp_path)
    events = mllog_events(run_dir / "mlperf.log")
    counts = {key: sum(e["key"] == key for e in events) for key in exactly_one_keys()}
    assert counts == dict.fromkeys(counts, 1)
    assert {e["key"]: e["value"] for e in events}["model_bn_span"] == 8  # per-rank batch 8, BatchNorm per rank
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run"]  # one directory for both ranks


def test_only_rank_0_reports(two_ranks):
    _, stdout = two_ranks
    assert "2 ranks (torchrun), BN span 8" in stdout
    assert stdout.count("epoch   1/2") == 1
    assert stdout.count("run_stop status aborted: 2 epochs") == 1


@pytest.mark.slow  # minutes long; what a run of two ranks writes is checked on two_ranks
@pytest.mark.convergence
def test_two_ranks_train_and_rank_0_writes_a_log_that_passes_the_checker(cache_dir, tmp_path):
    out = tmp_path / "run"
    run = torchrun(*SMOKE, "dist.bn_group_size=2", f"hydra.run.dir={out}", cache=cache_dir)
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stdout + stderr
    assert "2 ranks (torchrun), BN span 16" in stdout
    assert stdout.count("epoch   1/10") == 1  # only rank 0 reports
    assert "run_stop status success" in stdout
    record_margin("smoke lars, 2 ranks (torchrun), BN over both", out / "mlperf.log", max_epochs=10)
    assert_compliant(out / "mlperf.log")
    events = mllog_events(out / "mlperf.log")
    counts = {key: sum(e["key"] == key for e in events) for key in exactly_one_keys()}
    assert counts == dict.fromkeys(counts, 1)
    assert {e["key"]: e["value"] for e in events}["model_bn_span"] == 8 * 2  # per-rank batch 8, 2 ranks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # one directory for both ranks


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the train.py process of `rank` whose command line mentions `marker`."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if marker in cmdline and "train.py" in cmdline and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def start_and_wait_for_epoch_1(out: Path, cache: Path, *overrides: str) -> tuple[subprocess.Popen[str], int]:
    """A 2-rank torchrun that would run long, once its first epoch is over and checkpointed; returns it and rank 1's
    pid."""
    run = torchrun(*TINY_RUN, "run.max_epochs=50", *ALL_EPOCHS, f"hydra.run.dir={out}", *overrides, cache=cache)
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2 and (out / "checkpoint.pt").exists()):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.5)
    victim = rank_pid(str(out), rank=1)
    assert victim is not None
    return run, victim


def assert_stopped_with_log_closed(run: subprocess.Popen[str], out: Path, message: str, within_s: float) -> str:
    """The survivor stopped within `within_s`, saying `message`, with its log ended; returns what it said."""
    started = time.monotonic()
    _, stderr = run.communicate(timeout=within_s + 60)
    assert time.monotonic() - started < within_s, f"the survivor took too long to stop:\n{stderr}"
    assert run.returncode != 0
    assert message in stderr, stderr
    events = mllog_events(out / "mlperf.log")  # parseable to its last line
    assert [e["metadata"]["status"] for e in events if e["key"] == "run_stop"] == ["aborted"]
    assert processes_mentioning(str(out)) == []
    return stderr


# Slow (torchrun's start and an epoch: 18 s): make test checks that a rank's error reaches every rank in process
# (test_rank_zero_decides_gathers_...); a dead or frozen rank named by its heartbeat is in make test-all (here, and
# SLURM's lost node and frozen rank in tests/slurm).
@pytest.mark.slow
def test_killing_a_rank_stops_the_other_with_a_message_naming_it(cache_dir, tmp_path):
    run, victim = start_and_wait_for_epoch_1(tmp_path / "killed", cache_dir, "dist.timeout_s=60")
    os.kill(victim, signal.SIGKILL)
    stderr = assert_stopped_with_log_closed(run, tmp_path / "killed", "error: rank 1 stopped responding", within_s=30)
    saved = re.search(r"its checkpoint is at step (\d+) \((\d+) steps to take again\)", stderr)
    assert saved and int(saved[1]) % 4 == 0 and int(saved[1]) >= 4 and int(saved[2]) <= 4, stderr  # an epoch's end
    assert "run.resume=auto" in (tmp_path / "killed" / "resume.sh").read_text()  # what a requeue runs
    assert "Error executing job" not in stderr  # one line of the harness's, none of Hydra's


@pytest.mark.slow
def test_a_hung_rank_stops_the_other_after_the_timeout(cache_dir, tmp_path):
    run, victim = start_and_wait_for_epoch_1(tmp_path / "hung", cache_dir, "dist.timeout_s=20")
    os.kill(victim, signal.SIGSTOP)  # frozen: no crash, no closed socket, no heartbeat
    # torchrun stops the frozen rank with SIGTERM, and 30 s later SIGKILL, once rank 0 has given up
    assert_stopped_with_log_closed(run, tmp_path / "hung", "error: rank 1 stopped responding", within_s=20 + 30 + 20)


# Slow: make test checks what it adds: one rank's signal stopping every rank at one step boundary and the command
# that resumes a torchrun run (in process, above: test_one_ranks_stop_signal_..., test_a_torchrun_runs_resume_...),
# a group's SIGTERM shutting the loader's worker down within seconds and a resume mid-epoch (tests/test_run.py, the
# run with workers stopped twice). A stopped run of two ranks resumed to the weights of one never stopped is in make
# test-all only: here, and SLURM's requeued jobs (tests/slurm).
@pytest.mark.slow
def test_one_ranks_sigterm_stops_both_mid_epoch_and_they_resume_to_the_same_weights(two_ranks, cache_dir, tmp_path):
    run = torchrun(*TWO_RANKS, f"hydra.run.dir={tmp_path}", cache=cache_dir)
    log = tmp_path / "mlperf.log"
    while not (log.exists() and "run_start" in log.read_text()):  # the loop has begun: a stop waits for its boundary
        assert run.poll() is None, run.communicate()
        time.sleep(0.01)
    time.sleep(0.2)  # rank 1 past the barrier as well, into its first step (a second and more, its worker starting)
    os.kill(rank_pid(str(tmp_path), rank=1), signal.SIGTERM)
    signalled = time.monotonic()
    _, stderr = run.communicate(timeout=300)
    assert time.monotonic() - signalled < 30, stderr  # each rank's loader worker shut down, not waited for
    assert "stopped by SIGTERM at step 1 (epoch 1, 1 of its 4 steps done)" in stderr  # rank 0 says so, once
    events = mllog_events(tmp_path / "mlperf.log")
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "aborted"
    assert len(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["ranks"]) == 2  # both ranks' own state
    assert "torch.distributed.run --standalone --nproc-per-node=2" in (tmp_path / "resume.sh").read_text()
    assert processes_mentioning(str(tmp_path)) == []

    resumed = torchrun(*TWO_RANKS, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir)
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stdout + stderr
    assert "resuming at epoch 1 (step 1, 1 steps into the epoch)" in stdout
    never_stopped, _ = two_ranks
    assert_same_run(never_stopped, tmp_path)
