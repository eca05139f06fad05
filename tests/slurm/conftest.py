"""A real one-node SLURM (tests/slurm/local_cluster.sh) for the tests in this folder: started once per session where
the machine allows it (root, and slurm-wlm and munge installed or apt-get to install them), stopped at the end if
this session started it; the tests are skipped with the reason where it does not."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parent / "local_cluster.sh"
STATE = Path(os.environ.get("RN50PERF_SLURM_DIR", "/tmp/rn50perf-slurm"))


def cluster(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), command], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Path]:
    """The cluster's slurm.conf, with SLURM_CONF set for this process and what it starts."""
    can = cluster("can")
    if can.returncode != 0:
        pytest.skip(f"no local SLURM: {can.stdout.strip()}")
    started = cluster("status").returncode != 0  # a cluster a developer started by hand is left running
    if started:
        up = cluster("start")
        assert up.returncode == 0, f"the local SLURM did not start:\n{up.stdout}{up.stderr}"
    with pytest.MonkeyPatch.context() as session:
        session.setenv("SLURM_CONF", str(STATE / "slurm.conf"))
        yield STATE / "slurm.conf"
    if started:
        cluster("stop")
