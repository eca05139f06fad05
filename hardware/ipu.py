"""IPU chips and systems as data: the figures the memory plan and the cost model read.

The values live in configs/device/ (chip/<name>.yaml and one file per system), with their sources; these
dataclasses are their typed shape (no defaults: a figure comes from the data or nowhere), shared by the device
section (configs/device/ipu.py), the simulator (backends/ipu_sim/) and the models that time it (projection/ipu/). Rates
are per second, sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZER_STATES = ("on_chip", "streaming")  # where a run keeps optimizer state: in SRAM, or in streaming memory
MLPERF_ROUNDS = ("v1.1", "v2.0")  # whose Graphcore train.py runs around the steps (projection/ipu/cost.py ROUNDS)


@dataclass
class Chip:
    name: str
    tiles: int
    clock_hz: float
    fp16_flops: float  # peak FLOP/s, fp16 in with fp16/fp32 accumulation
    fp32_flops: float
    sram_bytes: float  # In-Processor-Memory per IPU
    sram_bandwidth: float  # bytes/s within the IPU
    link_bandwidth: float  # bytes/s over the IPU's IPU-Links, all links together
    streaming_memory_bytes: float  # off-chip DDR per IPU
    streaming_bandwidth: float  # bytes/s between the IPU and its streaming memory
    host_link_bandwidth: float  # bytes/s from the host, per IPU
    ipus_per_machine: int  # IPUs in one IPU-M2000 or Bow-2000, sharing its IPU-Gateway
    gateway_bandwidth: float  # bytes/s of one machine's GW-Links to other POD64s, shared by its IPUs
    ipus_per_pod: int  # IPUs that IPU-Links join (a POD64); larger systems join POD64s through the gateways


@dataclass
class System:
    name: str
    chip: Chip
    ipus: int
    hosts: int
    host_cores: int  # CPU cores over all hosts, feeding the loader
    mlperf_round: str  # one of MLPERF_ROUNDS: v1.1 (IPU-POD) or v2.0 (Bow Pod)
