"""Stage `env`: the versions the check runs on, the GPU's name, memory and clocks, and the decoder it loads."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import subprocess
import sys

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


def decoder() -> stage.Figures:
    """Which JPEG decoder the loader uses here: the compiled one, named by its file."""
    from data import jpeg

    return {"decoder": f"compiled: {jpeg._jpeg.__file__}"}


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    return versions() | gpu() | decoder()


if __name__ == "__main__":
    sys.exit(stage.main(run))
