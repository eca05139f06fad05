"""A run's output directory: the name of every file and folder a run writes there, and how a later tool finds them.

A run writes only into its Hydra output directory (hydra.run.dir; in a sweep, hydra.sweep.dir/N), and there only
rank 0 writes (the ranks agree on the directory: distributed.agree_on_output_dir). Every module that writes or reads
one of these names takes it from here, so this table is the whole directory:

    name                 what, and when                                          written by (rank 0)
    .hydra/              config.yaml (unresolved), hydra.yaml, overrides.yaml    Hydra, as the job starts
                         (the command line's overrides)
    train.log            what the terminal shows, each attempt's lines appended  Hydra's job logging, `say`
    mlperf.log           the MLPerf log, init_start to run_stop (named by        mlperf_logs.logger
                         mlperf.log_file)
    config.yaml          the resolved configuration, as the run starts           train.py
    metrics.csv          a row per epoch                                         monitor.metrics
    tensorboard/         a point per epoch and scalar (run.tensorboard=true)     monitor.metrics
    metrics.png          loss and top-1 by epoch, at the run's end or its stop   monitor.metrics.plot
    checkpoint.pt        at each epoch's end and at a stop; removed at the end   checkpoint
    resume.sh            at a stop, the command that continues the run;          distributed.stop
                         removed at the end
    mlperf.attemptN.log  as a stopped run resumes: attempt N's whole log         mlperf_logs.logger
    model.pt             the trained model's state_dict, at the run's end        checkpoint
    .checkpoint.pt.tmp   checkpoint.pt, model.pt or resume.sh while it is        checkpoint,
    .model.pt.tmp        written, then renamed into place (a killed run may      distributed.stop
    .resume.sh.tmp       leave one)
    projection.txt       run.mode=project, instead of the training files:        project
    projection.json      all it printed, and its last line (the figures)

run.mode=benchmark writes nothing of its own. Later tools find runs with `find_run_dirs` (mlperf_logs.summarize) and
a run's log with `mlperf_log` (summarize, mlperf_logs.package), which honours the run's mlperf.log_file; what they
write (summarize's summary.csv and PNGs) is theirs, not the run's.

A write of the run directory that fails (no space left, a quota, a read-only filesystem, the directory gone) raises
`StorageError`, whose one line names the file, the filesystem and the room it needed and had: `writing` turns an
OSError into one, `appending` also cuts the file back so that it never ends in part of a line.

This package imports nothing of the project: anything may import it.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

HYDRA = ".hydra"  # Hydra's own record of the job (hydra.output_subdir)
OVERRIDES = f"{HYDRA}/overrides.yaml"  # the command line's overrides, as Hydra parsed them
# what Hydra writes in .hydra/ as a job starts (a refused run's are removed: train.py)
HYDRA_RECORD = tuple(f"{HYDRA}/{name}" for name in ("config.yaml", "hydra.yaml", "overrides.yaml"))
JOB_LOG = "train.log"  # Hydra's job logging names its file after the job, which is named after train.py
MLPERF_LOG = "mlperf.log"  # mlperf.log_file's default (mlperf_logs/config.py takes it from here)
CONFIG = "config.yaml"
METRICS = "metrics.csv"
TENSORBOARD = "tensorboard"  # a folder: the event files
PLOT = "metrics.png"
CHECKPOINT = "checkpoint.pt"
RESUME_SCRIPT = "resume.sh"
FINAL_WEIGHTS = "model.pt"
PROJECTION_TEXT = "projection.txt"
PROJECTION_JSON = "projection.json"
NAMES = frozenset(
    {
        HYDRA,
        JOB_LOG,
        MLPERF_LOG,
        CONFIG,
        METRICS,
        TENSORBOARD,
        PLOT,
        CHECKPOINT,
        RESUME_SCRIPT,
        FINAL_WEIGHTS,
        PROJECTION_TEXT,
        PROJECTION_JSON,
    }
)  # the fixed names; attempt logs, temporaries and a log named by mlperf.log_file come from the functions below


def attempt_log(log: Path, attempt: int) -> Path:
    """Where a stopped attempt's whole MLPerf log is kept once the run resumes: mlperf.log's first attempt is
    mlperf.attempt1.log, beside it (the log's stem first, so a run's logs list together)."""
    return log.with_name(f"{log.stem}.attempt{attempt}{log.suffix}")


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed over itself: a hidden sibling, on the same filesystem so that
    the rename is atomic."""
    return path.with_name(f".{path.name}.tmp")


def written_by_run(name: str, log_file: str = MLPERF_LOG) -> bool:
    """Whether `name`, an entry of a run directory whose MLPerf log is named `log_file`, is one that a run writes."""
    log = Path(log_file)
    attempt = re.escape(log.stem) + r"\.attempt[1-9][0-9]*" + re.escape(log.suffix)
    partial = {temporary(Path(kept)).name for kept in (CHECKPOINT, FINAL_WEIGHTS, RESUME_SCRIPT)}
    return name in NAMES | partial | {log_file} or re.fullmatch(attempt, name) is not None


def refusal_to_overwrite(directory: Path, writes: Callable[[str], bool], writer: str) -> str | None:
    """One line refusing `directory` as a run directory when it already holds an entry that `writer` writes
    (`writes(name)`), Hydra's own aside (its .hydra/ record and train.log, which Hydra has written as the job
    starts); None when it holds none."""
    names = (path.name for path in directory.iterdir()) if directory.is_dir() else ()
    clashes = sorted(name for name in names if writes(name) and name not in (HYDRA, JOB_LOG))
    if not clashes:
        return None
    listed = ", ".join(clashes)
    return f"{directory} already holds {listed}, which {writer} writes; give a new hydra.run.dir (nothing was changed)"


def recorded_config(directory: Path) -> dict[str, Any]:
    """The resolved configuration the run in `directory` recorded (its config.yaml), as plain data; {} where it has
    none, or one that is not a mapping. Raises yaml.YAMLError for a file that is not YAML."""
    path = directory / CONFIG
    if not path.is_file():
        return {}
    config = yaml.safe_load(path.read_text())
    return config if isinstance(config, dict) else {}


def mlperf_log(directory: Path) -> Path:
    """The MLPerf log of the run in `directory`: the mlperf.log_file its config.yaml records, else MLPERF_LOG.

    A damaged config.yaml falls back to the default too, so that a summary still finds the usual log; a tool that
    needs the config itself reads it with `recorded_config` and says what is wrong with it.
    """
    try:
        mlperf = recorded_config(directory).get("mlperf")
    except (yaml.YAMLError, UnicodeDecodeError):
        mlperf = None
    name = mlperf.get("log_file") if isinstance(mlperf, dict) else None
    return directory / (name if isinstance(name, str) and name else MLPERF_LOG)


def is_run_dir(directory: Path) -> bool:
    """Whether `directory` is a training run's: it holds the run's MLPerf log, which train.py opens as the run starts
    (a projection's or a benchmark's directory holds none, and a run refused before it started leaves no directory)."""
    return directory.is_dir() and mlperf_log(directory).is_file()


def find_run_dirs(root: Path) -> list[Path]:
    """`root` and every directory under it that is a run directory (a run, a sweep's jobs, a folder of either), in
    the order the filesystem lists them."""
    return [directory for directory in (root, *root.rglob("*")) if is_run_dir(directory)]


MB = 10**6  # StorageError's line gives sizes in SI megabytes, as df -H does


class StorageError(Exception):
    """A write of the run directory failed: `path` the file, `reason` why (the OSError's, e.g. "no space left",
    "disk quota exceeded", "read-only file system"), `filesystem` the mount point holding it and `fstype` its type
    (None where /proc/self/mounts does not say), `needed` the bytes the write needed (None: unknown), `free` the
    bytes free there once the failed write was cleaned up, and `errno` the OSError's."""

    def __init__(
        self,
        path: Path,
        reason: str,
        filesystem: Path,
        fstype: str | None,
        needed: int | None,
        free: int,
        errno: int | None = None,
    ) -> None:
        super().__init__(path, reason, filesystem, fstype, needed, free, errno)  # args as given: it pickles
        self.path = path
        self.reason = reason
        self.filesystem = filesystem
        self.fstype = fstype
        self.needed = needed
        self.free = free
        self.errno = errno

    @classmethod
    def of(cls, path: Path, err: OSError, needed: int | None = None) -> StorageError:
        """The error for `err`, raised writing `path`, which needed `needed` bytes where known."""
        reason = "no space left" if err.errno == errno.ENOSPC else _lowercase_first(err.strerror or str(err))
        mount = filesystem(path)
        return cls(path, reason, mount, filesystem_type(mount), needed, free_bytes(path), err.errno)

    def __str__(self) -> str:
        fstype = f" ({self.fstype})" if self.fstype else ""
        return f"{self.reason} on {self.filesystem}{fstype} writing {self.path.name}{self._room()}"

    def _room(self) -> str:
        """The figures that explain a lack of room: what the write needed and, for a full filesystem, what it has
        free (a quota's own room is not the filesystem's free space, so none is shown for it). Needs are rounded up
        and free space down, so that a write that did not fit never reads as one that would have."""
        if self.errno not in (errno.ENOSPC, errno.EDQUOT):
            return ""
        figures = [f"needs {math.ceil(self.needed / MB)} MB"] if self.needed is not None else []
        if self.errno == errno.ENOSPC:
            figures.append(f"{self.free // MB} MB free")
        return f" ({', '.join(figures)})" if figures else ""


def _lowercase_first(text: str) -> str:
    return text[:1].lower() + text[1:]


@contextmanager
def writing(path: Path, needed: Callable[[], int] | None = None) -> Iterator[None]:
    """A block that writes `path`: an OSError raised in it becomes StorageError (with `needed()` bytes, asked only
    then), raised from it. Other exceptions pass."""
    try:
        yield
    except OSError as err:
        raise StorageError.of(path, err, needed() if needed else None) from err


@contextmanager
def appending(path: Path) -> Iterator[None]:
    """A block that appends to `path` (a log's line, a CSV's row): if it fails, the file is cut back to the size it
    had before, so that it never ends in part of a line (cutting needs no free space), and StorageError is raised."""
    with writing(path):
        before = path.stat().st_size if path.exists() else 0
        try:
            yield
        except OSError:
            with suppress(OSError):  # a file that is gone, or on a read-only filesystem, holds nothing to cut
                os.truncate(path, before)
            raise


def _existing_ancestor(path: Path) -> Path:
    """`path` resolved, or its deepest ancestor that exists (the run directory may be gone)."""
    resolved = path.resolve()
    return next(folder for folder in (resolved, *resolved.parents) if os.path.exists(folder))


def filesystem(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (or would: its deepest existing ancestor's)."""
    folder = _existing_ancestor(path)
    while not os.path.ismount(folder):
        folder = folder.parent
    return folder


def filesystem_type(mount_point: Path) -> str | None:
    """The type of the filesystem mounted at `mount_point` (tmpfs, ext4, nfs, ...), from /proc/self/mounts (the last
    mount there is the one on top); None where it cannot be read (not Linux) or does not list it."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    fstype = None
    for line in mounts:
        _device, mounted_at, kind, *_options = line.split()
        if _unescape(mounted_at) == str(mount_point):
            fstype = kind
    return fstype


def _unescape(field: str) -> str:
    """A path as /proc/self/mounts writes it: a space, tab, newline or backslash as an octal escape (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal[1], 8)), field)


def free_bytes(path: Path) -> int:
    """The bytes free to an unprivileged writer on the filesystem that holds `path` (its deepest existing
    ancestor's): statvfs's f_bavail blocks of f_frsize."""
    stats = os.statvfs(_existing_ancestor(path))
    return stats.f_bavail * stats.f_frsize


__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "FINAL_WEIGHTS",
    "HYDRA",
    "HYDRA_RECORD",
    "JOB_LOG",
    "METRICS",
    "MLPERF_LOG",
    "NAMES",
    "OVERRIDES",
    "PLOT",
    "PROJECTION_JSON",
    "PROJECTION_TEXT",
    "RESUME_SCRIPT",
    "TENSORBOARD",
    "StorageError",
    "appending",
    "attempt_log",
    "filesystem",
    "filesystem_type",
    "find_run_dirs",
    "free_bytes",
    "is_run_dir",
    "mlperf_log",
    "recorded_config",
    "refusal_to_overwrite",
    "temporary",
    "writing",
    "written_by_run",
]
