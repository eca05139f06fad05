"""Files and directories that appear whole: written under a temporary name beside them, then renamed."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path, partial: Path | None = None) -> Iterator[BinaryIO]:
    """A file at `path` that appears whole or not at all: written under a unique name beside it (or under
    `partial`, on the same filesystem, for a lone writer that resumes: a killed attempt's leftover is overwritten
    by the next one instead of left behind), flushed to disk, then renamed over `path`; on an error the partial
    file is removed."""
    if partial is None:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    else:
        descriptor, temporary = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), str(partial)
    try:
        with open(descriptor, "wb") as file:
            os.fchmod(file.fileno(), 0o644)  # mkstemp makes it private; datasets and indexes are shared
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def build_atomically(target: Path, build: Callable[[Path], object], is_done: Callable[[], bool]) -> None:
    """Run `build(staging)` in a new directory beside `target`, then rename it to `target` (an old one is moved
    aside first), so no process ever sees half of one. Several processes may build the same directory at once:
    one that finds it done (`is_done()`) when its own build ends leaves the other's in place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private
    try:
        build(staging)
        if not is_done():
            _install(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _install(staging: Path, target: Path) -> None:
    if target.exists():
        stale = staging.with_name(staging.name + ".stale")
        target.rename(stale)
        staging.rename(target)
        shutil.rmtree(stale)
    else:
        staging.rename(target)
