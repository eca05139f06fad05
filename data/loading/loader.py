"""Batches of uint8 NHWC images, decoded in worker processes straight into shared memory, or on the training device.

Each worker takes a whole batch of (index, seed) pairs, reads each file (or its cached bytes), draws the crop
box from the header size, and decodes only the box into the batch's slot. The batch tensor lives in shared
memory from the start, so it reaches the training process without a copy; uint8 travels, the model normalises.
An unreadable or corrupt file, or one removed, truncated or replaced since the index was built, is replaced by
another sample drawn from its slot's own seed and reported once, or ends the run, as `corrupt` says; more than
`max_skipped` distinct files skipped end it too. A replacement changes that slot alone: every other sample, in its
batch and in every later one, is the sample it would have been, so a resumed run stays bitwise.
With a share of each batch left to the training device (data.decode=gpu or hybrid), the worker reads those files'
bytes and draws their crops only, and a producer thread of the training process decodes them (data.loading.feeder).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from data import jpeg
from data.config import CORRUPT_POLICIES, MAX_SKIPPED
from data.loading.crop_boxes import Box, centre_crop_box, random_resized_crop_box
from data.loading.device_decode import decode_each, resize_crops
from data.loading.feeder import Feeder
from data.loading.sampler import ShardedSampler
from data.sources.split import DatasetError, Split

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
T = TypeVar("T")
REPLACEMENT_TRIES = 10
WORKER_TIMEOUT_S = 600  # a worker that sends nothing for this long is an error, not a hang
WORKER_EXIT_S = 5.0  # a worker told to stop that has not exited after this long is killed


@dataclass(frozen=True)
class Crops:
    """How a split is cropped: random-resized crops and flips for training, a centre crop for evaluation."""

    train: bool
    size: int
    area_min: float = 0.08
    eval_resize: int = 256


class Decoded(NamedTuple):
    """One worker's batch: the images, their labels, the files it skipped (path, reason), the files decoded
    despite libjpeg's corrupt-data warnings (data/jpeg: as PIL decodes them) and a fatal error.

    Data errors travel back as values, so the training process raises them with a plain message.
    """

    images: torch.Tensor
    labels: torch.Tensor
    skipped: list[tuple[str, str]]
    warned: list[str]
    error: str | None


class Encoded(NamedTuple):
    """One worker's batch for the training device to decode (data.decode=gpu or hybrid): the files it leaves to
    the device, their bytes end to end (file i is data[offsets[i] : offsets[i + 1]]), the crop box and flip each
    was given, the slot of the batch each goes to, and what a replacement on the host needs (dataset index and
    seed); the other slots decoded here by the fused decoder (`host_images`, into `host_slots`); every slot's
    label, and what `Decoded` reports."""

    data: torch.Tensor
    offsets: torch.Tensor
    boxes: list[Box]
    flips: list[bool]
    device_slots: list[int]
    items: list[tuple[int, int]]
    host_images: torch.Tensor
    host_slots: list[int]
    labels: torch.Tensor
    skipped: list[tuple[str, str]]
    warned: list[str]
    error: str | None


class BatchDataset(Dataset[Decoded | Encoded]):
    """One split, indexed by a whole batch of (dataset index, sample seed) pairs."""

    def __init__(
        self,
        split: Split,
        crops: Crops,
        *,
        corrupt: str = "skip",
        cache_bytes: bool = False,
        max_pixels: int = jpeg.MAX_PIXELS,
        device_share: float | None = None,
    ) -> None:
        if corrupt not in CORRUPT_POLICIES:
            raise ValueError(f"corrupt must be one of {CORRUPT_POLICIES}, not {corrupt!r}")
        self.split = split
        self.crops = crops
        self.corrupt = corrupt
        self.max_pixels = max_pixels
        # None: the workers decode every sample (Decoded batches); a share: that share of each batch is left to
        # the training device (Encoded batches), but for files its decoder's fast path does not take
        self.device_share = device_share
        # Read in the parent before the workers fork, so they share the pages instead of each reading the files.
        self.cache = [_read_or_none(split, index) for index in range(len(split))] if cache_bytes else None

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, items: list[tuple[int, int]]) -> Decoded | Encoded:
        if self.device_share is not None:
            return self.encode(items)
        size = self.crops.size
        images = torch.empty((len(items), size, size, 3), dtype=torch.uint8)
        if get_worker_info() is not None:
            images.share_memory_()  # decode into the memory the batch is handed over in
        labels = torch.empty(len(items), dtype=torch.int64)
        skipped: list[tuple[str, str]] = []
        warned: list[str] = []
        try:
            for slot, (index, seed) in enumerate(items):
                labels[slot] = self.decode_or_replace(images[slot].numpy(), index, seed, skipped, warned)
        except DatasetError as err:
            return Decoded(images, labels, skipped, warned, str(err))
        return Decoded(images, labels, skipped, warned, None)

    def decode_or_replace(
        self, out: np.ndarray, index: int, seed: int, skipped: list[tuple[str, str]], warned: list[str]
    ) -> int:
        """Decode sample `index` into `out` and return its label; an unreadable file is swapped for another, a
        file decoded despite libjpeg's warnings is noted in `warned`."""

        def decode(index: int) -> int:
            self.decode_crop_into(out, index, *self.read_with_crop(index, seed), warned)
            return self.split[index][1]

        return self._or_replacement(decode, index, seed, skipped)

    def _or_replacement(self, attempt: Callable[[int], T], index: int, seed: int, skipped: list[tuple[str, str]]) -> T:
        """`attempt(index)`; where it finds the file unreadable, the file is reported in `skipped` (or ends the run
        under corrupt=fail) and the attempt is made on another sample, drawn from `seed`."""
        for tried in range(REPLACEMENT_TRIES):
            try:
                return attempt(index)
            except (OSError, jpeg.DecodeError) as err:
                if self.corrupt == "fail":
                    raise DatasetError(f"unreadable file {err}") from err
                skipped.append((self.split[index][0], str(err)))
                index = (index + 1 + (seed + tried) % max(len(self) - 1, 1)) % len(self)
        raise DatasetError(f"{REPLACEMENT_TRIES} unreadable files in a row, the last {skipped[-1][0]}")

    def decode_crop_into(
        self, out: np.ndarray, index: int, data: bytes, box: Box, flip: bool, warned: list[str]
    ) -> None:
        """Decode the crop `box` of sample `index` (its bytes `data`) into `out`, flipped if asked; its name goes
        into `warned` where libjpeg warned of corrupt data it decoded anyway."""
        name, size, warnings = self.split[index][0], (self.crops.size, self.crops.size), jpeg.corrupt_warnings()
        jpeg.decode_crop(data, box, size, flip, out=out, name=name, max_pixels=self.max_pixels)
        if jpeg.corrupt_warnings() > warnings:
            warned.append(name)

    def read(self, index: int) -> bytes:
        """Sample `index`'s bytes, from memory where data.cache_bytes kept them (a file that could not be kept is
        read again, to say why)."""
        cached = self.cache[index] if self.cache is not None else None
        return cached if cached is not None else self.split.read(index)

    def read_with_crop(self, index: int, seed: int) -> tuple[bytes, Box, bool]:
        """Sample `index`'s bytes, and the crop box and flip drawn from its header's size (and `seed`)."""
        data = self.read(index)
        return data, *self.crop(data, seed, name=self.split[index][0])

    def crop(self, data: bytes, seed: int, name: str | None = None) -> tuple[Box, bool]:
        """The crop box and flip of the file `data` (named `name` in errors), drawn from its header's size: a
        random-resized crop from `seed` when training, the centre crop when evaluating."""
        height, width = jpeg.image_size(data, name=name, max_pixels=self.max_pixels)
        crops = self.crops
        if crops.train:
            return random_resized_crop_box(height, width, crops.area_min, seed)
        return centre_crop_box(height, width, crops.eval_resize, crops.size), False

    def encode(self, items: list[tuple[int, int]]) -> Encoded:
        """The batch's first `device_share` slots as bytes and crops for the device (each file whose header does
        not read replaced, as when decoding; errors in its pixels show when the device decodes it, and the loader
        then decodes that sample on the host), the others decoded here: the rest of the batch, and each file the
        device's decoder would not take on its fast path (jpeg.sequential_rgb)."""
        assert self.device_share is not None
        on_device = round(self.device_share * len(items))
        size = self.crops.size
        host = torch.empty((len(items), size, size, 3), dtype=torch.uint8)
        files: list[bytes] = []
        boxes: list[Box] = []
        flips: list[bool] = []
        device_slots: list[int] = []
        kept: list[tuple[int, int]] = []
        host_slots: list[int] = []
        labels = torch.empty(len(items), dtype=torch.int64)
        skipped: list[tuple[str, str]] = []
        warned: list[str] = []
        try:
            for slot, (index, seed) in enumerate(items):
                if slot < on_device:
                    out = host[len(host_slots)].numpy()
                    read = partial(self._read_for_device, out=out, seed=seed, warned=warned)
                    index, data, box, flip = self._or_replacement(read, index, seed, skipped)
                    labels[slot] = self.split[index][1]
                    if data is not None:
                        files.append(data)
                        boxes.append(box)
                        flips.append(flip)
                        device_slots.append(slot)
                        kept.append((index, seed))
                        continue
                else:
                    labels[slot] = self.decode_or_replace(host[len(host_slots)].numpy(), index, seed, skipped, warned)
                host_slots.append(slot)
        except DatasetError as err:
            empty = torch.empty(0, dtype=torch.uint8)
            return Encoded(empty, torch.zeros(1, dtype=torch.int64), [], [], [], [], empty, [], labels, skipped,
                           warned, str(err))  # fmt: skip
        host = host[: len(host_slots)].clone() if len(host_slots) < len(items) else host
        offsets = torch.tensor([0, *itertools.accumulate(len(data) for data in files)])
        joined = torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8) if files else host.new_empty(0)
        if get_worker_info() is not None:
            for tensor in (joined, host):
                tensor.share_memory_()
        return Encoded(joined, offsets, boxes, flips, device_slots, kept, host, host_slots, labels,
                       skipped, warned, None)  # fmt: skip

    def _read_for_device(
        self, index: int, out: np.ndarray, seed: int, warned: list[str]
    ) -> tuple[int, bytes | None, Box, bool]:
        """Sample `index`'s bytes and crop for the device; a file its decoder would not take is decoded into
        `out` here instead (its bytes then None, and its name in `warned` if libjpeg warned)."""
        data, box, flip = self.read_with_crop(index, seed)
        if jpeg.sequential_rgb(data):
            return index, data, box, flip
        self.decode_crop_into(out, index, data, box, flip, warned)
        return index, None, box, flip


def _read_or_none(split: Split, index: int) -> bytes | None:
    """Sample `index`'s bytes, or None where they cannot be read (its read in training then says why)."""
    try:
        return split.read(index)
    except OSError:
        return None


class Loader:
    """Iterates (images, labels) batches for one rank; reports each skipped file once, by its path, and keeps them
    (`skipped`: path -> the reason, a line that starts with the path) until more than `max_skipped` end the
    iteration with a DatasetError; keeps the paths of the files decoded despite libjpeg's warnings (`warned`), and
    counts the seconds its reader spent waiting for a batch (`waited_s`, over all epochs)."""

    def __init__(
        self,
        dataset: BatchDataset,
        sampler: ShardedSampler,
        *,
        batch: int,
        workers: int,
        pin: bool,
        device: torch.device | None = None,
        max_skipped: int = MAX_SKIPPED,
    ):
        self.dataset = dataset
        self.device = device  # where Encoded batches are decoded, and where a CUDA device's batches are sent ahead
        self.sampler = sampler
        self.batch = batch
        self.skipped: dict[str, str] = {}  # over the loader's life: every epoch of this attempt
        self.max_skipped = max_skipped
        self.warned: set[str] = set()
        self._waited_s = 0.0
        self._feeder: Feeder[Encoded] | None = None
        self._fed: Generator[Batch] | None = None  # the feeder's batches now being read, closed with the loader
        self._loader = DataLoader(
            dataset,
            batch_size=None,
            # torch annotates BatchSampler for int indices; it batches whatever the sampler yields, here pairs
            sampler=BatchSampler(sampler, batch, drop_last=dataset.crops.train),  # type: ignore[arg-type]
            num_workers=workers,
            pin_memory=pin,
            persistent_workers=workers > 0,
            prefetch_factor=2 if workers > 0 else None,
            timeout=WORKER_TIMEOUT_S if workers > 0 else 0,
            worker_init_fn=_leave_stop_signals_to_the_parent if workers > 0 else None,
        )
        _unclosed.add(self)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes now, and kill any that does not exit within WORKER_EXIT_S.

        The loader owns its workers' lifetime. Workers ignore the stop signals (the training process decides), so
        they must be stopped by their loader: left to garbage collection, a run that ends in an exception (a stop
        signal's included, whose traceback holds the loader) reaches multiprocessing's exit handler first, which
        terminates them with SIGTERM, which they ignore, and then waits for them for ever. torch has no public
        call that ends a DataLoader's persistent workers, so this uses its iterator's own shutdown. The feeder's
        thread, which reads from the workers, is stopped first."""
        if self._fed is not None:
            self._fed.close()
            self._fed = None
        iterator, self._loader._iterator = self._loader._iterator, None
        if not isinstance(iterator, _MultiProcessingDataLoaderIter):  # no workers (data.workers=0), or not started
            return
        workers = list(iterator._workers)
        iterator._shutdown_workers()  # asks each worker to exit, and waits for it a while
        for worker in workers:
            worker.join(timeout=WORKER_EXIT_S)
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signal.SIGKILL)
                worker.join()

    def set_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """Iterate `epoch` from its `first_batch` on (a run resumed in the middle of the epoch)."""
        self.sampler.set_epoch(epoch, start=first_batch * self.batch)

    def __len__(self) -> int:
        return len(self._loader)

    def batch_sizes(self) -> list[int]:
        """The sizes of this rank's batches in an epoch, largest first: one for training (full batches only),
        and for evaluation a last, smaller one where the rank's share does not fill its batches."""
        return sorted({len(batch) for batch in self._loader.sampler}, reverse=True)

    def decode_on_device(self, share: float | None) -> None:
        """Leave `share` of each batch to the training device from now on (None: the workers decode it all):
        data.decode=auto's choice, made before the first batch (persistent workers keep the dataset as it was when
        they started)."""
        if self._loader._iterator is not None:
            raise RuntimeError("the decoder is chosen before the loader's first batch")
        self.dataset.device_share = share

    @property
    def waited_s(self) -> float:
        return self._waited_s + (self._feeder.waited_s if self._feeder is not None else 0.0)

    def __iter__(self) -> Iterator[Batch]:
        batches = iter(self._loader)  # here, in the caller's thread: the workers are forked now, not by the feeder
        if self.dataset.device_share is not None:
            self._fed = self.feeder(self._read(batches))
            return self._fed
        if self.device is not None and self.device.type == "cuda":
            return sent_ahead(self._read(batches), self.device)
        return self._read(batches)

    @property
    def feeder(self) -> Feeder[Encoded]:
        """The producer thread's buffers, made at the first batch decoded on the device."""
        if self._feeder is None:
            device = self.device or torch.device("cpu")
            self._feeder = Feeder(self._on_device, self.batch, self.dataset.crops.size, device)
        return self._feeder

    def _read(self, batches: Iterator[Decoded | Encoded]) -> Iterator[Any]:
        """The workers' batches: Decoded ones as (images, labels), Encoded ones as they come (for the feeder)."""
        while True:
            started = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            self._report(batch.skipped, batch.warned)
            if batch.error is not None:
                raise DatasetError(batch.error)
            if isinstance(batch, Encoded):
                yield batch
                continue
            self._waited_s += time.perf_counter() - started
            yield batch.images, batch.labels

    def _report(self, skipped: list[tuple[str, str]], warned: list[str]) -> None:
        """Each skipped file once, by its path; the files decoded despite libjpeg's warnings. A DatasetError once
        more than `max_skipped` files are skipped."""
        for path, reason in skipped:
            if path not in self.skipped:
                self.skipped[path] = reason
                log.warning("skipped an unreadable file: %s", reason)
                if len(self.skipped) > self.max_skipped:
                    raise DatasetError(
                        f"{len(self.skipped)} unreadable files skipped, more than data.max_skipped={self.max_skipped}"
                        f"; the last {reason}. Repair the dataset, or raise data.max_skipped"
                    )
        self.warned.update(warned)

    def _on_device(self, batch: Encoded) -> Batch:
        """A worker's Encoded batch made whole on the training device: its files decoded and cropped there, the
        slots the worker decoded copied in. A file the device does not decode (errors in its pixels, anything its
        decoder refuses) is decoded here by the fused decoder, or replaced, as a worker would."""
        size, device = self.dataset.crops.size, self.feeder.device
        images = torch.empty((len(batch.labels), size, size, 3), dtype=torch.uint8, device=device)
        labels = batch.labels.clone()
        files = [batch.data[start:end] for start, end in itertools.pairwise(batch.offsets.tolist())]
        decoded = decode_each(files, device)
        done = [file for file, image in enumerate(decoded) if image is not None]
        if done:
            resized = resize_crops(
                [decoded[file] for file in done],  # type: ignore[misc]  # None is left out above
                [batch.boxes[file] for file in done],
                [batch.flips[file] for file in done],
                size,
            )
            images[[batch.device_slots[file] for file in done]] = resized
        if batch.host_slots:
            images[batch.host_slots] = batch.host_images.to(device, non_blocking=True)
        for file, image in enumerate(decoded):
            if image is None:
                slot = batch.device_slots[file]
                pixels, labels[slot] = self._on_host(batch.items[file])
                images[slot] = pixels.to(device)
        return images, labels.to(device, non_blocking=True)

    def _on_host(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """Sample `item` (dataset index, seed) by the fused decoder here (replaced if unreadable, reported as a
        worker reports), and its label."""
        size = self.dataset.crops.size
        pixels = np.empty((size, size, 3), np.uint8)
        skipped: list[tuple[str, str]] = []
        warned: list[str] = []
        label = self.dataset.decode_or_replace(pixels, *item, skipped, warned)
        self._report(skipped, warned)
        return torch.from_numpy(pixels), label


def sent_ahead(batches: Iterator[Batch], device: torch.device) -> Iterator[Batch]:
    """The batches on a CUDA `device`, each copied on a side stream while the step before it runs: the copy of
    batch k + 1 is queued before batch k is handed over, and the compute stream waits for a copy only where it
    uses its batch."""
    side = torch.cuda.Stream(device)
    pending: Batch | None = None
    for images, labels in batches:
        with torch.cuda.stream(side):
            copied = (images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        if pending is not None:
            yield pending
        compute = torch.cuda.current_stream(device)
        compute.wait_stream(side)
        for tensor in copied:
            tensor.record_stream(compute)  # its memory is not reused before the compute stream is done with it
        pending = copied
    if pending is not None:
        yield pending


_unclosed: weakref.WeakSet[Loader] = weakref.WeakSet()


@atexit.register
def _close_unclosed_loaders() -> None:
    """The safety net for loaders their owner did not close. It runs before multiprocessing's own exit handler
    (registered earlier, so run later), which would wait for ever for workers that ignore its SIGTERM."""
    for loader in list(_unclosed):
        loader.close()


def workers_for_cores(local_ranks: int, usable: int | None = None, machine: int | None = None) -> int:
    """data.workers=null: the cores this rank may use, less one for the training process. A rank may use the
    cores its affinity allows (`usable`: what SLURM's or taskset's binding leaves it) and no more than its share
    of the `machine`'s cores among the `local_ranks` ranks on it (torchrun's ranks all see every core)."""
    usable = len(os.sched_getaffinity(0)) if usable is None else usable
    machine = (os.cpu_count() or 1) if machine is None else machine
    return max(0, min(usable, machine // local_ranks) - 1)


def _leave_stop_signals_to_the_parent(worker_id: int) -> None:
    """Workers ignore SIGTERM, SIGINT and SIGUSR1, which SLURM, a terminal or `kill` may send to every process of
    the run: the training process decides when to stop, and shuts its workers down (torch's own SIGTERM handler
    would kill a worker mid-epoch, and the training process with it)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)


def build_loader(
    split: Split,
    crops: Crops,
    sampler: ShardedSampler,
    *,
    batch: int,
    workers: int,
    pin_memory: bool = False,
    corrupt: str = "skip",
    cache_bytes: bool = False,
    max_pixels: int = jpeg.MAX_PIXELS,
    device: torch.device | None = None,
    device_share: float | None = None,
    max_skipped: int = MAX_SKIPPED,
) -> Loader:
    """Full batches (training) or every sample with a trailing partial batch (evaluation), uint8 NHWC, for the
    training `device` (a CUDA one gets each batch copied ahead on a side stream): decoded by the workers, or with
    a `device_share` (data.decode=gpu or hybrid), that share of each batch by the device, in a producer thread
    (data.loading.feeder), from the bytes the workers read."""
    dataset = BatchDataset(
        split, crops, corrupt=corrupt, cache_bytes=cache_bytes, max_pixels=max_pixels, device_share=device_share
    )
    return Loader(
        dataset, sampler, batch=batch, workers=workers, pin=pin_memory, device=device, max_skipped=max_skipped
    )
