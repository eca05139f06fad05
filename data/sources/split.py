"""What the loader reads: a split is a sequence of (name, label) samples whose bytes it can read.

Two kinds implement it: a folder tree's compact index (data.sources.folder_index) and indexed tar shards
(data.shards.read).
"""

from __future__ import annotations

from typing import Protocol


class DatasetError(ValueError):
    """A dataset that cannot be used as it is (unknown layout, missing split, no images, unknown class)."""


class UnreadableSample(OSError):
    """A sample whose bytes cannot be read as the index recorded them: its file removed, unreadable, or of another
    size than when indexed; its shard member past the shard's end or not under its own tar header. The message
    names the sample and says why, and the loader treats it as any unreadable file (data.corrupt)."""


class Split(Protocol):
    """One split of a dataset: `split[i] -> (name, label)`, `len(split)`, `split.classes`, `split.read(i)`.

    `name` says where sample i lives (a path, or a shard and member) for messages; `read(i)` returns its bytes, or
    raises an OSError (an UnreadableSample where it can say why) for a sample that went bad since it was indexed.
    """

    @property
    def classes(self) -> tuple[str, ...]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[str, int]: ...

    def read(self, index: int) -> bytes: ...
