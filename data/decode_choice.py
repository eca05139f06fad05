"""data.decode=auto: who decodes, chosen from both decoders' rates timed on this machine at start-up.

The workers' fused decoder is timed on one core of the training process and counted once a worker; the device's
decoder (data.device_decode) is timed from one thread, as the producer thread runs it. Both take the same files
of the training set with their crops. The share of each batch that leaves both busy for the same time feeds the
most: device / (device + workers); a share within AUTO_SNAP of 0 or 1 is taken as cpu or gpu, where the other
decoder would add a few percent at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from data import jpeg
from data.device_decode import decode_crops
from data.loader import BatchDataset
from data.transforms import Box

SAMPLES = 64  # files timed, read once before the clocks start
AUTO_SNAP = 0.05
SHARE_STEP = 0.05  # the share chosen is rounded to this


@dataclass(frozen=True)
class Rates:
    """What was timed: the fused decoder on one core, the loader's workers, and the device's decoder."""

    cpu_img_s: float
    workers: int
    device_img_s: float

    @property
    def workers_img_s(self) -> float:
        """The workers together (a loader of no workers decodes in the training process: one core)."""
        return self.cpu_img_s * max(self.workers, 1)


@dataclass(frozen=True)
class Choice:
    share: float | None  # of each batch, decoded by the device; None: the workers decode it all
    line: str  # what was chosen and why, as the run prints it


def choose(rates: Rates) -> Choice:
    """The share of each batch for the device that keeps both decoders busy, and the line that says so."""
    share = rates.device_img_s / (rates.device_img_s + rates.workers_img_s)
    timed = (
        f"data.decode=auto: the fused decoder {rates.cpu_img_s:,.0f} img/s a core x {rates.workers} workers = "
        f"{rates.workers_img_s:,.0f} img/s, the device's decoder {rates.device_img_s:,.0f} img/s"
    )
    if share >= 1 - AUTO_SNAP:
        return Choice(1.0, f"{timed}: the device decodes (data.decode=gpu)")
    if share <= AUTO_SNAP:
        return Choice(None, f"{timed}: the workers decode (data.decode=cpu)")
    share = round(round(share / SHARE_STEP) * SHARE_STEP, 2)
    return Choice(
        share,
        f"{timed}: the device decodes {share:.0%} of each batch, the workers the rest "
        f"(data.decode=hybrid data.device_share={share})",
    )


def measure(dataset: BatchDataset, batch: int, workers: int, device: torch.device, seconds: float = 2.0) -> Rates:
    """Both decoders timed for about `seconds` each on the first SAMPLES files of `dataset` (those the device's
    decoder takes), with the crops a first epoch would give them."""
    samples = [dataset.read_with_crop(index, seed=index) for index in range(min(SAMPLES, len(dataset)))]
    samples = [sample for sample in samples if jpeg.sequential_rgb(sample[0])] or samples
    size = dataset.crops.size
    pixels = np.empty((size, size, 3), np.uint8)

    def on_cpu(data: bytes, box: Box, flip: bool) -> None:
        jpeg.decode_crop(data, box, (size, size), flip, out=pixels)

    encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data, _, _ in samples]
    groups = [range(start, min(start + batch, len(samples))) for start in range(0, len(samples), batch)]

    def on_device(group: range) -> None:
        decode_crops([encoded[i] for i in group], [samples[i][1] for i in group], [samples[i][2] for i in group],
                     size, device)  # fmt: skip

    on_device(groups[0])  # the decoder's first call sets it up: not timed
    cpu = _rate(lambda i: on_cpu(*samples[i % len(samples)]), lambda i: 1, seconds)
    gpu = _rate(lambda i: on_device(groups[i % len(groups)]), lambda i: len(groups[i % len(groups)]), seconds, device)
    return Rates(cpu, workers, gpu)


def _rate(
    work: Callable[[int], None], images: Callable[[int], int], seconds: float, device: torch.device | None = None
) -> float:
    """Images a second of `work(i)` for i = 0, 1, ... until `seconds` have passed (at least once)."""
    done, calls, started = 0, 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - started < seconds:
        work(calls)
        done += images(calls)
        calls += 1
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return done / (time.perf_counter() - started)
