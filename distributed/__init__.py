"""Many processes, one model: the launcher's topology, the process group and its few collectives,
DistributedBatchNorm2d (distributed.batchnorm) and the bulk gradient all-reduce (distributed.allreduce)."""

from distributed.group import (
    PeerLost,
    agree_on_output_dir,
    as_lost_peer,
    average_over_ranks,
    barrier,
    broadcast_from_main,
    from_main,
    gather_to_main,
    max_over_ranks,
    mean_over_ranks,
    process_group,
    record_step,
    sum_over_ranks,
)
from distributed.seeds import seed_everything
from distributed.topology import QUIET_HYDRA, LaunchError, Topology, from_environment

__all__ = [
    "QUIET_HYDRA",
    "LaunchError",
    "PeerLost",
    "Topology",
    "agree_on_output_dir",
    "as_lost_peer",
    "average_over_ranks",
    "barrier",
    "broadcast_from_main",
    "from_environment",
    "from_main",
    "gather_to_main",
    "max_over_ranks",
    "mean_over_ranks",
    "process_group",
    "record_step",
    "seed_everything",
    "sum_over_ranks",
]
