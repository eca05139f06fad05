"""A producer thread that makes the next batches on the training device while the step runs on the current one.

data.decode=gpu and hybrid decode on the training device: done between two steps, the decode would add to each
step's time (the GPU check of 2026-11-27 measured it so: no faster than the CPU workers). Here a thread of the
training process takes each batch the workers read, decodes and crops it on the device (on a stream of its own,
`prepare`), and copies it into one of a few fixed buffers, in turn; the step reads a buffer while the thread fills
the next. A thread, not a process: decoding on a CUDA device waits in C++ with the GIL released (torchvision's
decode_jpeg), so the step's thread runs meanwhile.

The two streams are ordered by events both ways: the step's stream waits for the event recorded when its batch
was copied in (`ready`), and the thread writes a buffer again only after the step that read it was queued (the
buffer comes back through `free` with an event recorded on the step's stream, which the thread's stream waits
for). On the CPU (the tests' stand-in for the GPU) events are not needed: the queues alone order the two.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

T = TypeVar("T")
Batch = tuple[torch.Tensor, torch.Tensor]
BUFFERS = 3  # in turn: the step's, one ready ahead, one being filled (DALI prefetches 2 by default, NVIDIA's recipe 5)


@dataclass
class Buffer:
    """A fixed place for one batch on the device, and the event after which the step that last read it is done
    with it (None: no step has read it yet)."""

    images: torch.Tensor
    labels: torch.Tensor
    read: torch.cuda.Event | None = None


# What the thread hands the reader: a buffer filled with so many images and the event after their copy (None on the
# CPU), or the error that stopped it, or None at the end of the items.
Made = tuple[Buffer, int, torch.cuda.Event | None] | BaseException | None


class Feeder(Generic[T]):
    """The fixed buffers of one loader, and the time its reader waited for a batch (`waited_s`, over all epochs)."""

    def __init__(self, prepare: Callable[[T], Batch], batch: int, size: int, device: torch.device) -> None:
        self.prepare = prepare  # a worker's batch as (images, labels) on the device, made on the current stream
        self.device = device
        self.buffers = [
            Buffer(
                torch.empty((batch, size, size, 3), dtype=torch.uint8, device=device),
                torch.empty(batch, dtype=torch.int64, device=device),
            )
            for _ in range(BUFFERS)
        ]
        self.waited_s = 0.0

    def __call__(self, items: Iterator[T]) -> Generator[Batch]:
        """The batches made from `items`, each a view of a buffer that stays valid until the next is asked for."""
        free: queue.Queue[Buffer | None] = queue.Queue()
        for buffer in self.buffers:
            free.put(buffer)
        ready: queue.Queue[Made] = queue.Queue()
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(items, free, ready, stop), name="feeder", daemon=True)
        thread.start()
        reading: Buffer | None = None
        try:
            while True:
                if reading is not None:  # its step is queued: the thread may fill it again once that step is done
                    reading.read = self._record()
                    free.put(reading)
                started = time.perf_counter()
                made = ready.get()
                self.waited_s += time.perf_counter() - started
                if made is None:
                    return
                if isinstance(made, BaseException):
                    raise made
                reading, size, copied = made
                if copied is not None:
                    torch.cuda.current_stream(self.device).wait_event(copied)
                yield reading.images[:size], reading.labels[:size]
        finally:
            if reading is not None:  # its step is queued too: the next epoch's thread waits for it as for the others
                reading.read = self._record()
            stop.set()  # the reader is gone: the thread stops before its next batch
            free.put(None)
            thread.join()

    def _produce(
        self, items: Iterator[T], free: queue.Queue[Buffer | None], ready: queue.Queue[Made], stop: threading.Event
    ) -> None:
        """The thread: each item made into a batch on a stream of its own, then copied into the next free buffer
        once the step that read it last is done; the end of the items (None) or an error goes to the reader."""
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        try:
            with torch.cuda.stream(stream):  # None (the CPU): no stream to enter
                for item in items:
                    if stop.is_set():
                        return
                    images, labels = self.prepare(item)
                    buffer = free.get()
                    if buffer is None or stop.is_set():
                        return
                    if stream is not None and buffer.read is not None:
                        stream.wait_event(buffer.read)
                    buffer.images[: len(images)].copy_(images, non_blocking=True)
                    buffer.labels[: len(labels)].copy_(labels, non_blocking=True)
                    ready.put((buffer, len(images), self._record()))
            ready.put(None)
        except BaseException as err:  # the reader raises it, in the training process's own thread
            ready.put(err)

    def _record(self) -> torch.cuda.Event | None:
        """An event at the end of what this thread's current stream has queued so far (None on the CPU)."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event
