"""tests/slurm/local_cluster.sh itself: `stop` leaves no process, namespace, link or file of the cluster's, even with
a job running, and a user's folder given as RN50PERF_SLURM_DIR keeps every file of the user's, byte for byte.

Two clusters cannot run at once (the ports and namespace names are fixed), so these tests stop the session's
cluster, run one of their own in a user's folder, and start the session's again after them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.conftest import Cluster, cluster, start

NOTES = b"the user's notes\n\x00\xff"  # a file of the user's in the cluster's folder (bytes, not text)


@pytest.fixture(scope="module")
def session_cluster_stopped(slurm: Cluster) -> Iterator[None]:
    """The session's cluster stopped for this module's tests, and started again after them."""
    if not slurm.started_here:
        pytest.skip("the local SLURM was started by hand: these tests would stop it and cancel its jobs")
    stopped = cluster("stop")
    assert stopped.returncode == 0, stopped.stderr
    yield
    start(slurm.nodes)


def live_processes(conf: Path) -> dict[int, str]:
    """pid -> name of every process whose environment names `conf` as SLURM_CONF (what the script exports to its
    daemons, slurmd to its slurmstepd, and a job to its srun and tasks), zombies aside (ended, their parent not
    yet told)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if f"SLURM_CONF={conf}".encode() in environ and state != "Z":
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
    return found


def made_on_the_machine() -> list[str]:
    """The network namespaces and links of a cluster of several nodes, and their hosts files."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    etc = Path("/etc/netns")
    return [
        *(line.split()[0] for line in namespaces.splitlines() if line.startswith("rn50perf-")),
        *(line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ": rn50perf-" in line),
        *(str(path) for path in etc.glob("rn50perf-*")),
    ]


def test_start_refuses_a_folder_holding_files_by_its_names_that_it_did_not_make(slurm, tmp_path):
    """A user's slurm.conf and munge.key (another cluster's, say) are neither used nor overwritten: one line, exit
    status 2, and the folder as it was."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    files = {"slurm.conf": b"ClusterName=theirs\n", "munge.key": os.urandom(32), "notes.bin": NOTES}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    env = {**os.environ, "RN50PERF_SLURM_DIR": str(folder), "SLURM_CONF": str(folder / "slurm.conf")}
    refused = cluster("start", env=env)
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: {folder} holds files by this cluster's names that it did not make (slurm.conf munge.key): set"
        " RN50PERF_SLURM_DIR to a new folder (or remove them, if an earlier local_cluster.sh left them)\n"
    )
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == files
    assert cluster("stop", env=env).returncode == 0  # nothing of its own there: it stops nothing, removes nothing
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == files
    assert cluster("status").returncode == 0  # the session's cluster, in its own folder, runs on


@pytest.mark.usefixtures("session_cluster_stopped")
@pytest.mark.parametrize("before_stop", ["a node draining", "the controller gone"])
def test_stop_ends_a_running_job_and_leaves_nothing_of_the_cluster_in_a_users_folder(before_stop, slurm, tmp_path):
    """A node draining (neither idle nor busy, where stop once cancelled nothing): SLURM ends the job's steps.
    The controller gone: nothing can cancel the job, and stop kills its steps itself (srun and slurmstepd outlive
    slurmd). Either way nothing of the cluster is left, and the user's file is as it was."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.bin").write_bytes(NOTES)
    conf = folder / "slurm.conf"
    env = {**os.environ, "RN50PERF_SLURM_DIR": str(folder), "SLURM_CONF": str(conf)}
    up = cluster("start", "--nodes", str(slurm.nodes), env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert (folder / "notes.bin").read_bytes() == NOTES

    command = ["sbatch", "--parsable", "--nodes=1", f"--output={tmp_path / 'job.out'}", "--wrap", "srun sleep 600"]
    job = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 60
    while "sleep" not in live_processes(conf).values():  # the step's task runs: srun and slurmstepd are up
        assert time.monotonic() < deadline, f"job {job} did not start: {live_processes(conf)}"
        time.sleep(0.1)
    assert {"slurmctld", "slurmd", "slurmstepd", "srun", "sleep"} <= set(live_processes(conf).values())
    if before_stop == "a node draining":
        node = (folder / "nodes").read_text().split()[0]
        drain = ["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=drained by a test"]
        subprocess.run(drain, env=env, check=True)
    else:
        os.kill(int((folder / "slurmctld.pid").read_text()), signal.SIGKILL)

    stopped = cluster("stop", env=env)
    assert stopped.returncode == 0 and stopped.stdout == "stopped\n", stopped.stdout + stopped.stderr
    assert live_processes(conf) == {}
    assert made_on_the_machine() == []
    assert [path.name for path in folder.iterdir()] == ["notes.bin"]
    assert (folder / "notes.bin").read_bytes() == NOTES
