"""data.decode=auto: who decodes, chosen from both decoders' rates timed on this machine at start-up.

The workers' fused decoder is timed on one core of the training process, as a worker decodes (the header read,
the crop drawn, the crop decoded into a slot), and counted once a worker; the device's decoder
(data.loading.device_decode) is timed from one thread, as the producer thread runs it. Both take the same files of the
training set. The share of each batch that leaves both busy for the same time feeds the most: device / (device +
workers); a share within AUTO_SNAP of 0 or 1 is taken as cpu or gpu, where the other decoder would add a few
percent at most. The GPU check's decode stage (bench/gpu/decode.py) times the two the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from data import jpeg
from data.loading.crop_boxes import Box
from data.loading.device_decode import decode_crops
from data.loading.loader import BatchDataset

SAMPLES = 64  # files timed, read once before the clocks start
AUTO_SNAP = 0.05
SHARE_STEP = 0.05  # the share chosen is rounded to this
Draw = Callable[[bytes, int], tuple[Box, bool]]  # a file's crop box and flip, from its bytes and a seed


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
    """Both decoders timed for about `seconds` each on the first SAMPLES files of `dataset` that the device's
    decoder takes, with the crops an epoch would draw for them."""
    files = [dataset.read(index) for index in range(min(SAMPLES, len(dataset)))]
    files = [data for data in files if jpeg.sequential_rgb(data)] or files
    size = dataset.crops.size
    cpu = fused_rate(files, dataset.crop, size, seconds)
    return Rates(cpu, workers, device_rate(files, dataset.crop, size, batch, device, seconds))


def fused_rate(files: Sequence[bytes], draw: Draw, size: int, seconds: float) -> float:
    """Images a second of the fused decoder on this one core, as a worker decodes file after file (the i-th call
    with seed i): its header read, its crop drawn, the crop decoded into a slot."""
    pixels = np.empty((size, size, 3), np.uint8)

    def decode(call: int) -> int:
        data = files[call % len(files)]
        box, flip = draw(data, call)
        jpeg.decode_crop(data, box, (size, size), flip, out=pixels)
        return 1

    return images_a_second(decode, seconds)


def device_rate(
    files: Sequence[bytes], draw: Draw, size: int, batch: int, device: torch.device, seconds: float
) -> float:
    """Images a second of data.loading.device_decode.decode_crops from this one thread, the files dealt in batches of
    `batch` (the last filled from the first), their crops drawn beforehand as the workers draw them; the first
    batch, which sets the decoder up, untimed."""
    count = max(batch, len(files) // batch * batch)
    encoded = [torch.frombuffer(bytearray(files[i % len(files)]), dtype=torch.uint8) for i in range(count)]
    crops = [draw(files[i % len(files)], i) for i in range(count)]
    batches = [range(start, start + batch) for start in range(0, count, batch)]

    def decode(call: int) -> int:
        chosen = batches[call % len(batches)]
        boxes, flips = zip(*(crops[i] for i in chosen), strict=True)
        decode_crops([encoded[i] for i in chosen], boxes, flips, size, device)
        return len(chosen)

    decode(0)
    return images_a_second(decode, seconds, device)


def images_a_second(work: Callable[[int], int], seconds: float, device: torch.device | None = None) -> float:
    """Images a second of `work(call)` (returning the images it did) for call = 0, 1, ... until `seconds` have
    passed, at least once; a CUDA `device` drained before the clock stops."""
    done, calls, started = 0, 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - started < seconds:
        done += work(calls)
        calls += 1
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return done / (time.perf_counter() - started)
