"""GPU clusters as data: the figures the GPU projection reads (configs/device/dgx_*.yaml, pcie_l40s.yaml and their
GPU in configs/device/gpu/), each with its public source there. Like the IPU systems' dataclasses (ipu.py), no
defaults: a figure comes from the data or nowhere. Rates are per second, sizes in bytes, bandwidths one direction."""

from __future__ import annotations

from dataclasses import dataclass


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
