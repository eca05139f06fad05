"""Process groups, distributed BatchNorm and bulk gradient all-reduce. One process so far: `Topology`."""

from distributed.topology import Topology

__all__ = ["Topology"]
