"""A GPU cluster as data and as a device section: the figures the GPU projection reads (configs/device/dgx_*.yaml,
pcie_l40s.yaml and their GPU in configs/device/gpu/, each with its public source there), and the section that says
how many nodes and GPUs run.mode=project projects a run onto. Like the IPU systems' dataclasses, no defaults: a
figure comes from the data or nowhere. Rates are per second, sizes in bytes, bandwidths one direction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from configs.checks import ConfigError, positive, require
from configs.device.base import DeviceConfig
from configs.shape import BatchShape


@dataclass
class Gpu:
    name: str
    clock_hz: float  # boost clock
    fp16_flops: float  # dense fp16/bf16 tensor-core peak with fp32 accumulation (no sparsity)
    memory_bandwidth: float  # HBM or GDDR
    memory_bytes: float
    nvlink_bandwidth: float  # to the node's other GPUs through NVSwitch; 0 where the GPUs meet over PCIe only
    pcie_bandwidth: float  # the GPU's host link


@dataclass
class Cluster:
    name: str
    gpu: Gpu
    max_gpus_per_node: int
    fabric_bandwidth: float  # one GPU's share of its node's InfiniBand HCAs
    in_network_reduction: bool  # the fabric's switches can reduce (NVIDIA SHARP on Quantum InfiniBand)
    host_cores: int  # per node, decoding and feeding its GPUs


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
    family: ClassVar[str] = "projection.gpu.family.FAMILY"
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
