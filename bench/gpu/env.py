"""Stage `env`: the versions the check runs on, the GPU's name, memory and clocks, the host's CPU (its model, cores
and threads per core, from /proc/cpuinfo), and the decoder it loads."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from bench.gpu import stage

PACKAGES = ("torchvision", "hydra-core", "omegaconf", "mlperf-logging", "numpy", "pillow", "pillow-simd", "timm")
SMI_FIELDS = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"


def versions() -> stage.Figures:
    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    found["cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    return found


def gpu() -> stage.Figures:
    """The device as PyTorch sees it and, where nvidia-smi answers, its clocks as found (never changed)."""
    if not torch.cuda.is_available():
        return {"gpu": stage.no_gpu("the GPU's name")}
    props = torch.cuda.get_device_properties(0)
    figures: stage.Figures = {
        "gpu": props.name,
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
    }
    query = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"]
    try:
        line = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as err:
        return {**figures, "nvidia_smi": f"unavailable: {err}"}
    read = zip(SMI_FIELDS.split(","), line.split(","), strict=True)
    return figures | {f"smi_{key.replace('.', '_')}": value.strip() for key, value in read}


def host_cpu(cpuinfo: str | None = None) -> stage.Figures:
    """The host's CPU from /proc/cpuinfo (or the text given): its model, the logical CPUs (os.cpu_count) and those
    this process may use, the physical cores (distinct physical id and core id pairs) and threads per core; a
    figure the file does not hold (on some architectures) is None."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    processors = []
    for block in cpuinfo.strip().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        processors.append({key.strip(): value.strip() for key, value in fields.items()})
    models = [p["model name"] for p in processors if "model name" in p]
    cores = {(p["physical id"], p["core id"]) for p in processors if "physical id" in p and "core id" in p}
    logical = len([p for p in processors if "processor" in p])
    return {
        "cpu": models[0] if models else None,
        "cpu_count": os.cpu_count(),
        "cpu_usable": len(os.sched_getaffinity(0)),
        "physical_cores": len(cores) or None,
        "threads_per_core": round(logical / len(cores), 2) if cores and logical else None,
        "loader_workers_all": stage.ALL_WORKERS,
    }


def decoder() -> stage.Figures:
    """Which JPEG decoder the loader uses here: the compiled one, named by its file."""
    from data import jpeg

    return {"decoder": f"compiled: {jpeg._jpeg.__file__}"}


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    return versions() | gpu() | host_cpu() | decoder()


if __name__ == "__main__":
    sys.exit(stage.main(run))
