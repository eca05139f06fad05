"""The IPU cost model's assumed constants: each one's range and the reason for it (docs/ipu_sim.md says how each
was chosen). projection/uncertainty.py repeats a projection over them."""

from __future__ import annotations

from projection.uncertainty import Assumption

# Where the in-sample logs time a cost, its range is their spread; elsewhere no published figure pins it (Graphcore
# publishes bandwidths, not latencies or program costs), and the range is what the hardware's structure allows, from
# the sources named. docs/ipu_sim.md says how each was chosen.
ASSUMPTIONS: dict[str, Assumption] = {
    "memory_efficiency": Assumption(
        0.25,
        0.8,
        "",
        "Jia et al. 2019 (arXiv:1912.03413): compiled loops reach 1/4 of SRAM peak, assembly 0.99",
    ),
    "collective_latency_s": Assumption(
        3e-6, 20e-6, "us", "a ring step is a Sync-Link sync (sub-us) plus staging through GCL's IO tiles (35 kB each)"
    ),
    "gateway_latency_s": Assumption(
        4e-6, 40e-6, "us", "IPU to gateway over PCIe Gen4 x8, a 100 GbE RoCE hop (and a switch in Bow Pod256), back"
    ),
    "gateway_growth": Assumption(
        0.0,
        1.0,
        "",
        "in-sample runs span at most 2 POD64s: from a crossing that does not multiply (0) to a cost per ring step (1)",
    ),
    "update_cycles_share": Assumption(
        0.0,
        1.0,
        "%",
        "of the update program's fixed cost fitted on the GC200: none (seconds) to all (28 % less at the Bow's clock)",
    ),
    "sync_s": Assumption(0.3e-6, 5e-6, "us", "Sync-Links carry BSP syncs in hardware; gc-hostsynclatencytest: ~0.3 us"),
    "gateway_sync_s": Assumption(
        4e-6, 40e-6, "us", "a sync spanning POD64s is packetised over GW-Links: a RoCE round trip, not a Sync-Link"
    ),
    "host_sync_s": Assumption(0.2e-3, 5e-3, "ms", "a host round trip's fixed cost: engine run, callbacks, outfeed"),
    "host_hop_s": Assumption(
        20e-6, 200e-6, "us", "one small TCP message between host processes over 100 GbE, MPI stack included"
    ),
    "instance_sync_s": Assumption(
        0.0,
        2.65e-3,
        "ms",
        "per host process per round trip: 0, up to 2.65 ms, where it leaves POD128's gateways at line rate",
    ),
    "loader_img_s_per_core": Assumption(
        400, 1100, "", "bench.loader's per-core rates on a 2.1 GHz Xeon, DALI-like to fused; the EPYC 7742 unmeasured"
    ),
    "catch_up_s": Assumption(
        0.30, 0.43, "s", "v1.1 logs: the epoch after a checkpoint over a steady one (POD128 0.30-0.34, POD16 0.41-0.43)"
    ),
    "checkpoint_s": Assumption(
        1.93,
        2.46,
        "s",
        "v1.1 logs: a checkpoint epoch over a steady one (POD128 1.93-1.96, POD16 2.05, POD64 2.83 less catch-up)",
        additive=True,
    ),
    "variables_checkpoint_s": Assumption(
        0.05,
        1.93,
        "s",
        "v2.0 saves no MetaGraphDef: centre 2x a v1.1 restore (POD16 0.116 s eval gap), up to a whole v1.1 checkpoint",
        additive=True,
    ),
    "eval_setup_s": Assumption(
        15.9,
        18.8,
        "s",
        "v1.1 logs: eval block start to the first evaluation and its extra over a later one (POD128 15.9, POD16 18.8)",
        additive=True,
    ),
    "broadcast_s_per_instance": Assumption(
        14.5e-3,
        23.1e-3,
        "ms",
        "v1.1 logs: the gap between evaluations over the other instances (POD64 14.5, POD16 16.6, POD128 18.9 ms),"
        " up to what each of POD128's 32 instances beyond POD64's added (0.739 s)",
        additive=True,
    ),
}
