"""A GPU cluster's section (configs/device/dgx_*.yaml, pcie_l40s.yaml): the nodes that run.mode=project projects a
run onto, and how many of them and of their GPUs it uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from configs.checks import ConfigError, positive, require
from configs.device.base import DeviceConfig
from configs.shape import BatchShape
from hardware.gpu import Cluster


@dataclass
class ClusterConfig(DeviceConfig):
    cluster: Cluster | None = None  # the nodes' GPUs and fabric (configs/device/<cluster>.yaml)
    nodes: int = 1  # nodes in the cluster
    gpus_per_node: int = 1  # GPUs used on each node, one data-parallel replica each
    measured: str | None = None  # a gpu.json from make gpu-check, whose step on one GPU replaces the modelled
    # compute: the projection of rn50perf itself on the cluster

    schema: ClassVar[str] = "gpu_cluster"
    needs: ClassVar[str] = "a cluster: device=dgx_a100, dgx_h100, dgx_h200 or pcie_l40s"
    projected: ClassVar[bool] = True
    dealt_to: ClassVar[str] = "GPUs"

    @property
    def chosen_cluster(self) -> Cluster:
        """The cluster (validation has made sure the config names one)."""
        assert self.cluster is not None
        return self.cluster

    def validate(self, bn_group_size: int, shape: BatchShape) -> None:
        """A GPU cluster needs its nodes described, and at most as many GPUs used per node as a node has."""
        cluster = self.cluster
        if cluster is None:
            raise ConfigError("device", f"{self.name} needs {self.needs}")
        positive(self.nodes, "device.nodes")
        require(
            1 <= self.gpus_per_node <= cluster.max_gpus_per_node,
            "device.gpus_per_node",
            f"must be 1 to the {cluster.max_gpus_per_node} GPUs of a {cluster.name} node, got {self.gpus_per_node}",
        )

    def replica_count(self, world_size: int) -> int:
        return self.nodes * self.gpus_per_node

    def only_projected(self) -> str:
        return (
            f"{self.cluster and self.cluster.name} describes GPU nodes to project onto (run.mode=project);"
            " to run on this machine's GPU, use device=cuda"
        )
