"""Real filesystems for tests of storage faults: a small tmpfs, a read-only directory, and a filler that leaves a
given number of bytes free. Mounting needs root or CAP_SYS_ADMIN; where it fails, the test is skipped and says so.

A test file uses the fixtures by importing them: `from tests.filesystems import read_only_directory, small_filesystem`.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(directory: Path, size: int, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` bytes (rounded up to whole pages by the kernel) mounted at `directory`, made if missing,
    and unmounted at the end, whatever happens. Skips the test where it cannot be mounted."""
    directory.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    if failed := _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)):
        pytest.skip(f"cannot mount a tmpfs here (it takes mount(8) and root or CAP_SYS_ADMIN): {failed}")
    try:
        yield directory
    finally:
        if busy := _run("umount", str(directory)):
            _run("umount", "--lazy", str(directory))  # detached now, freed once the file left open is closed
            raise AssertionError(f"a test left a file open on {directory}: {busy}")


def _run(*command: str) -> str | None:
    """Run `command`; None where it succeeds, else why it failed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as err:
        return str(err)
    return None if done.returncode == 0 else done.stderr.strip() or f"exit status {done.returncode}"


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """`small_filesystem(size)`: the mount point of a fresh tmpfs of `size` bytes under the test's tmp_path; each
    one is unmounted when the test ends."""
    numbers = itertools.count()
    with ExitStack() as mounts:
        yield lambda size: mounts.enter_context(mounted_tmpfs(tmp_path / f"fs{next(numbers)}", size))


@dataclass(frozen=True)
class ReadOnly:
    """A directory nothing can be written in, the reason a write there fails, and how StorageError's line begins."""

    path: Path
    reason: str
    says: str


@pytest.fixture
def read_only_directory(tmp_path: Path) -> Iterator[ReadOnly]:
    """A tmpfs mounted read-only (root ignores a directory's mode); where it cannot be mounted and the tests do not
    run as root, a directory of mode 0o555 instead."""
    directory = tmp_path / "read-only"
    if os.geteuid() != 0:
        directory.mkdir()
        directory.chmod(0o555)
        try:
            yield ReadOnly(directory, "permission denied", "permission denied on ")
        finally:
            directory.chmod(0o755)  # so that pytest can remove it
        return
    with mounted_tmpfs(directory, 64 * 1024, read_only=True):
        yield ReadOnly(directory, "read-only file system", f"read-only file system on {directory} (tmpfs) ")


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the filesystem that holds `directory` so that `leave` bytes stay free (tmpfs counts whole pages, so
    `leave` is rounded down to one); returns the filler file, whose removal frees the space again."""
    stats = os.statvfs(directory)
    filler = directory / "filler"
    with filler.open("wb") as f:
        os.posix_fallocate(f.fileno(), 0, stats.f_bavail * stats.f_frsize - leave)
    return filler
