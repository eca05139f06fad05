"""A real SLURM (tests/slurm/local_cluster.sh) for the tests in this folder: started once per session where the
machine allows it (root, and slurm-wlm and munge installed or apt-get to install them), with two nodes in network
namespaces of their own where it can make them, else one; stopped at the end if this session started it. The
tests are skipped with the reason where there is no cluster, the multi-node ones where it has one node."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.slurm.jobs import LONGER, sbatch, wait_for_job

CLUSTER = Path(__file__).resolve().parent / "local_cluster.sh"
STATE = Path(os.environ.get("RN50PERF_SLURM_DIR", "/tmp/rn50perf-slurm"))
NODES = 2
FAULT_FIGURES: list[str] = []  # what each fault cost, printed at the end of the session


def cluster(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), *command], capture_output=True, text=True, timeout=600, env=env)


class Cluster(NamedTuple):
    conf: Path  # its slurm.conf
    nodes: int
    started_here: bool  # by this session, which stops it at the end (one a developer started by hand is left running)


def start(nodes: int) -> None:
    up = cluster("start", "--nodes", str(nodes))
    assert up.returncode == 0, f"the local SLURM did not start:\n{up.stdout}{up.stderr}"


@pytest.fixture(scope="session")
def slurm() -> Iterator[Cluster]:
    """The cluster, with SLURM_CONF set for this process and what it starts."""
    can = cluster("can")
    if can.returncode != 0:
        pytest.skip(f"no local SLURM: {can.stdout.strip()}")
    started = cluster("status").returncode != 0
    if started:
        start(NODES if cluster("can", "--nodes", str(NODES)).returncode == 0 else 1)
    with pytest.MonkeyPatch.context() as session:
        session.setenv("SLURM_CONF", str(STATE / "slurm.conf"))
        yield Cluster(STATE / "slurm.conf", len((STATE / "nodes").read_text().split()), started)
    if started:
        cluster("stop")


@pytest.fixture(scope="session")
def two_nodes(slurm: Cluster) -> list[str]:
    """The names of the cluster's nodes, each in a network namespace of its own; skipped where it has one."""
    nodes = (STATE / "nodes").read_text().split()
    if len(nodes) < NODES:
        why = cluster("can", "--nodes", str(NODES)).stdout.strip() or "the running cluster was started with one"
        pytest.skip(f"the local SLURM has one node: {why}")
    return nodes


@pytest.fixture(scope="session")
def whole_run(slurm: Cluster, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LONGER through the sbatch example on one node, never stopped: the run directory every stopped run of these
    tests, on one node or two, must end the same as."""
    run_dir = tmp_path_factory.mktemp("sbatch") / "whole"
    wait_for_job(sbatch(run_dir, cache_dir, *LONGER))
    assert (run_dir / "model.pt").exists(), Path(f"{run_dir}.out").read_text()
    return run_dir


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FAULT_FIGURES:
        terminalreporter.write_sep("-", "faults on two nodes (docs/slurm.md tables them)")
        for line in FAULT_FIGURES:
            terminalreporter.write_line(line)
