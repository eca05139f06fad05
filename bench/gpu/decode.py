"""Stage `decode`: the two JPEG decoders on the check's photo-like JPEGs (bench.gpu.pipeline.imagenet_like), at the
step's image size, each figure saved as soon as it is measured:

  cpu     the fused decoder per core: data.jpeg.decode_crop in this one thread, each file's random-resized crop box
          drawn from its header's size (data.jpeg.image_size, data.loading.crop_boxes.random_resized_crop_box), as
          a loader worker does
  device  data.loading.device_decode.decode_crops on the training device from one thread, in batches of the step's
          batch
  beside  the best step (bench.gpu.step.best_known) timed alone, then timed while a second thread decodes batches
          with decode_crops continuously on a CUDA stream of its own: the step's rate both ways, how many times
          slower it ran beside the decoding, and the decoding's rate meanwhile
  pixels  decode_crops on the device against the fused decoder, for the same boxes and flips, on 100 images: each
          image's mean absolute difference, their max and mean; passed where every one is under 6
          (tests/test_device_decode.py's bound, the fused decoder's own loss against the source)

In the rehearsal (no CUDA) the device is the CPU (torchvision's libjpeg-turbo decode): the same code runs, and the
figures say so ("device": "cpu"); they say nothing of a GPU.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from bench.gpu import stage
from bench.gpu import step as step_stage
from bench.gpu.pipeline import imagenet_like
from data import jpeg
from data.loading import decode_choice
from data.loading.crop_boxes import Box, random_resized_crop_box
from data.loading.device_decode import decode_crops

AREA_MIN = 0.08  # the random-resized crop's smallest share of the image (data.crop_area_min's default)
FILES = {False: 1024, True: 40}  # the photos held in memory for the timed loops (full, tiny)
SECONDS = {False: 3.0, True: 0.5}  # each rate's timed loop, at least
PIXEL_IMAGES = 100
PIXEL_BOUND = 6.0  # tests/test_device_decode.py: the fused decoder's own loss against the source is 5.7
BESIDE_STEPS = 3  # the beside row times this many times the step stage's steps, so the decoding runs a while


class Sample:
    """One file's bytes (as bytes for the fused decoder, as a tensor for the device), its crop box and flip."""

    def __init__(self, data: bytes, seed: int) -> None:
        self.data = data
        self.encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.box, self.flip = crop(data, seed)


def crop(data: bytes, seed: int) -> tuple[Box, bool]:
    """The random-resized crop box and flip a loader worker draws for this file (from its header's size)."""
    height, width = jpeg.image_size(data)
    return random_resized_crop_box(height, width, area_min=AREA_MIN, seed=seed)


def samples(root: Path, count: int) -> list[Sample]:
    """The first `count` training photos under `root`, in the order of their paths."""
    paths = sorted((root / "train").rglob("*.JPEG"))[:count]
    return [Sample(path.read_bytes(), seed) for seed, path in enumerate(paths)]


def batches(found: list[Sample], batch: int) -> list[list[Sample]]:
    """`found` dealt into batches of `batch`, the photos reused from the start to fill the last (or the only)."""
    count = max(batch, len(found) // batch * batch)
    cycled = [found[i % len(found)] for i in range(count)]
    return [cycled[start : start + batch] for start in range(0, count, batch)]


def on_device(batch: list[Sample], size: int, device: torch.device) -> torch.Tensor:
    """One batch decoded by decode_crops on `device`."""
    return decode_crops([s.encoded for s in batch], [s.box for s in batch], [s.flip for s in batch], size, device)


def cpu_rate(found: list[Sample], size: int, seconds: float) -> stage.Figures:
    """The fused decoder in this thread, as a worker decodes and as data.decode=auto times it: read the header,
    draw the box, decode the crop into a slot."""
    return {"img_s_per_core": round(decode_choice.fused_rate([s.data for s in found], crop, size, seconds), 1)}


def device_rate(found: list[Sample], size: int, batch: int, device: torch.device, seconds: float) -> stage.Figures:
    """decode_crops from this one thread, batch after batch, as data.decode=auto times it."""
    files = [s.data for s in found]
    img_s = decode_choice.device_rate(files, crop, size, batch, device, seconds)
    return {"img_s": round(img_s, 1), "batch": batch, "device": device.type}


class Decoding(threading.Thread):
    """decode_crops batch after batch until stopped, on a CUDA stream of its own (the feeder's way), counting the
    images whose batch the device has finished."""

    def __init__(self, work: list[list[Sample]], size: int, device: torch.device) -> None:
        super().__init__(daemon=True)
        self.work, self.size, self.device = work, size, device
        self.images = 0
        self.error: BaseException | None = None
        self.started_decoding = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        try:
            with torch.cuda.stream(stream):  # None (the rehearsal's CPU): no stream to enter
                while not self.stopping.is_set():
                    for batch in self.work:
                        on_device(batch, self.size, self.device)
                        if stream is not None:
                            stream.synchronize()
                        self.images += len(batch)
                        self.started_decoding.set()
                        if self.stopping.is_set():
                            break
        except BaseException as err:  # told to the main thread, which raises it
            self.error = err
            self.started_decoding.set()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"the decoding thread failed: {self.error!r}") from self.error


def beside(args: argparse.Namespace, sizes: stage.Sizes, work: list[list[Sample]]) -> stage.Figures:
    """The best step alone, then with the decoding thread running; the step's rates, the slowdown, and the
    decoding's rate while the step ran."""
    torch.backends.cudnn.benchmark = True
    device = stage.device()
    overrides = step_stage.best_known(args.work)
    images, labels = step_stage.inputs(sizes)
    train_step, _ = step_stage.harness(overrides, sizes, images, labels)
    steps = sizes.steps * BESIDE_STEPS
    alone = steps * sizes.batch / stage.timed_steps(train_step, sizes.warmup, steps)
    decoding = Decoding(work, sizes.image, device)
    decoding.start()
    try:
        decoding.started_decoding.wait(timeout=120)
        for _ in range(sizes.warmup):
            train_step()
        stage.synchronize()
        decoded, started = decoding.images, time.perf_counter()
        for _ in range(steps):
            train_step()
        stage.synchronize()
        seconds, decoded = time.perf_counter() - started, decoding.images - decoded
    finally:
        decoding.stop()
    with_decoding = steps * sizes.batch / seconds
    return {
        "step_img_s_alone": round(alone, 1),
        "step_img_s_beside": round(with_decoding, 1),
        "slowdown": round(alone / with_decoding, 3),  # how many times slower the step ran beside the decoding
        "decode_img_s_beside": round(decoded / seconds, 1),
        "steps": steps,
        "overrides": " ".join(overrides),
        "device": device.type,
    }


def pixels(found: list[Sample], size: int, device: torch.device, batch: int) -> stage.Figures:
    """decode_crops against the fused decoder on the first PIXEL_IMAGES photos: each image's mean absolute
    difference over its pixels."""
    chosen = found[:PIXEL_IMAGES]
    differences = []
    for start in range(0, len(chosen), batch):
        part = chosen[start : start + batch]
        ours = on_device(part, size, device).cpu().numpy().astype(np.int16)
        for slot, sample in enumerate(part):
            fused = jpeg.decode_crop(sample.data, sample.box, (size, size), sample.flip).astype(np.int16)
            differences.append(float(np.abs(ours[slot] - fused).mean()))
    return judged(differences) | {"device": device.type}


def judged(differences: list[float]) -> stage.Figures:
    """The per-image mean absolute differences' max and mean, and whether every one is under PIXEL_BOUND."""
    worst = max(differences)
    return {
        "images": len(differences),
        "max_mean_abs_diff": round(worst, 3),
        "mean_mean_abs_diff": round(sum(differences) / len(differences), 3),
        "worst_image": differences.index(worst),
        "bound": PIXEL_BOUND,
        "passed": worst < PIXEL_BOUND,
    }


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    device = stage.device()
    found = samples(imagenet_like(args.work / "photos", sizes.photos), FILES[args.tiny])
    work = batches(found, sizes.batch)
    seconds = SECONDS[args.tiny]
    figures: stage.Figures = {"image": sizes.image, "batch": sizes.batch, "photos": len(found)}
    if device.type != "cuda":
        figures["gpu"] = stage.no_gpu("nvJPEG (the device rows ran torchvision's CPU decode)")
    stage.attempt("cpu", lambda: cpu_rate(found, sizes.image, seconds), figures, args.json)
    stage.attempt("device", lambda: device_rate(found, sizes.image, sizes.batch, device, seconds), figures, args.json)
    stage.attempt("beside", lambda: beside(args, sizes, work), figures, args.json)
    stage.attempt("pixels", lambda: pixels(found, sizes.image, device, sizes.batch), figures, args.json)
    return figures


if __name__ == "__main__":
    sys.exit(stage.main(run))
