"""Who this process is among the ranks of a run, read from the launcher's environment (torchrun or SLURM)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500
# Ranks other than 0 keep Hydra from writing: rank 0's run directory is the run's, and ${now:} differs per rank.
QUIET_HYDRA = ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


class LaunchError(ValueError):
    """The launcher's environment is incomplete or inconsistent."""


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # the rank among this machine's processes: picks the GPU
    launcher: str = "none"  # none | torchrun | slurm
    master_addr: str = "127.0.0.1"  # where rank 0 (or torchrun's agent) serves the rendezvous store
    master_port: int = DEFAULT_PORT
    agent_store: bool = False  # torchrun's agent serves the store; otherwise rank 0 does
    local_world_size: int = 1  # the ranks on this machine, which share its cores

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise LaunchError(f"rank {self.rank} is not in [0, world size {self.world_size})")

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the logs and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size} ({self.launcher}, local rank {self.local_rank})"


def from_environment(env: Mapping[str, str] = os.environ) -> Topology:
    """torchrun's variables (RANK, WORLD_SIZE, ...) win; else srun's (SLURM_PROCID, ...); else one process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return Topology(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK", 0),
            launcher="torchrun",
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", DEFAULT_PORT),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True",
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
        )
    if "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", 1) > 1:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodes:
            raise LaunchError("SLURM_JOB_NODELIST is not set: cannot find the first node to rendezvous on")
        job_port = DEFAULT_PORT + _int(env, "SLURM_JOB_ID", 0) % 10_000  # jobs sharing a node use different ports
        return Topology(
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            launcher="slurm",
            master_addr=env.get("MASTER_ADDR") or first_host(nodes),
            master_port=_int(env, "MASTER_PORT", job_port),
            local_world_size=tasks_on_this_node(
                env.get("SLURM_STEP_TASKS_PER_NODE", "1"), _int(env, "SLURM_NODEID", 0)
            ),
        )
    return Topology()


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "gpu[07-09,12],cpu3" -> "gpu07" (what `scontrol show hostnames`
    prints first; parsed here because srun's tasks need not have scontrol on their PATH)."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise LaunchError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, ranges = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def tasks_on_this_node(tasks_per_node: str, node: int) -> int:
    """The count of node `node` (SLURM_NODEID) in SLURM's compressed tasks per node: "2(x3),1" is 2, 2, 2, 1."""
    counts = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise LaunchError(f"cannot read SLURM's tasks per node {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node < len(counts):
        raise LaunchError(f"SLURM_NODEID={node} is not a node of tasks per node {tasks_per_node!r}")
    return counts[node]


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    if key not in env:
        if default is None:
            raise LaunchError(f"the launcher did not set {key}")
        return default
    try:
        return int(env[key])
    except ValueError as err:
        raise LaunchError(f"{key}={env[key]!r} is not an integer") from err
