"""Shared test helpers: run train.py as a user would, on tiny generated data, and read its MLPerf log."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

import rundir
from configs import schema
from configs.checks import ConfigError
from configs.errors import describe
from configs.schema import Config
from data.build import open_splits
from data.sources.split import Split
from data.sources.synthetic import CACHE_ENV
from distributed import Topology
from tests.filesystems import read_only_directory, small_filesystem  # noqa: F401 (fixtures for every test file)
from tests.forked import run_forked, start_fork_server

REPO = Path(__file__).resolve().parent.parent


# A run of a few seconds: 64 training images at 32 px, no warm-up, a fixed batch.
TINY_RUN = (
    "experiment=smoke",
    "data.image_size=32",
    "data.eval_resize=36",
    "data.synthetic.train_per_class=16",
    "data.synthetic.val_per_class=8",
    "data.global_batch=16",
    "optim.warmup_epochs=0",
)
# Every epoch of the budget trains, the target out of reach: a run not meant to converge, which then exits 0
# (without run.allow_not_converged, exit status 3).
ALL_EPOCHS = ("mlperf.target_accuracy=1.0", "run.allow_not_converged=true")


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests that open datasets in this process save their indexes in a cache of the session's, not the user's."""
    with pytest.MonkeyPatch.context() as session:
        session.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("index-cache")))
        yield


@pytest.fixture(autouse=True, scope="session")
def _fork_server() -> None:
    """The fork server that train.py's runs and the gloo ranks are forked from (tests/forked.py), started first."""
    start_fork_server()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic-data cache for the whole session, so each tiny dataset is generated once."""
    return tmp_path_factory.mktemp("rn50perf-cache")


def train_env(cache: Path, **extra: str) -> dict[str, str]:
    """The environment tests run train.py in: this one, with the test cache, unbuffered output and `extra`."""
    return {**os.environ, CACHE_ENV: str(cache), "PYTHONUNBUFFERED": "1", **extra}


def run_train(
    *overrides: str, cache: Path, timeout: float = 600, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python train.py OVERRIDES` in the repo, with the test cache (and `env` added), forked from a warm interpreter
    (tests/forked.py: `env` reaches the run, not torch's import); returns the finished process."""
    (result,) = run_forked([overrides], train_env(cache, **(env or {})), timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"train.py failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def run_trains(
    runs: Sequence[Sequence[str]], cache: Path, at_once: int, timeout: float = 600
) -> list[subprocess.CompletedProcess[str]]:
    """run_train for each of `runs` (overrides), `at_once` at a time; returns the finished processes in order. Two
    at a time suit runs that are mostly refused or short (one's Python leaves the other core idle); two training
    runs at once on 2 cores each take more than twice as long (the tiny straight runs: 35 s one at a time, 61 s
    two at a time)."""
    return run_forked(runs, train_env(cache), timeout, at_once)


# Tiny runs never stopped that tests read or compare with, by name: each test module declares its own as it is
# imported (straight_run), and the `straight_runs` fixture makes every declared one on first use.
STRAIGHT: dict[str, tuple[str, ...]] = {}


class StraightRun(NamedTuple):
    run_dir: Path  # alone in its parent folder
    status: int
    stdout: str
    stderr: str


def straight_run(name: str, *overrides: str) -> str:
    """Declare a run (`overrides`, without hydra.run.dir) for the `straight_runs` fixture; returns its name."""
    assert STRAIGHT.get(name, overrides) == overrides, f"two runs declared as {name!r}"
    STRAIGHT[name] = overrides
    return name


@pytest.fixture(scope="session")
def straight_runs(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, StraightRun]:
    """Every declared straight run, by name."""
    run_dirs = {name: tmp_path_factory.mktemp("straight") / "run" for name in STRAIGHT}
    runs = [(*STRAIGHT[name], f"hydra.run.dir={run_dirs[name]}") for name in STRAIGHT]
    finished = run_trains(runs, cache_dir, at_once=1)
    return {
        name: StraightRun(run_dirs[name], done.returncode, done.stdout, done.stderr)
        for name, done in zip(STRAIGHT, finished, strict=True)
    }


# What a mistake in the overrides raises before a run starts; train.py tells each in one line, with exit status 2.
CONFIG_ERRORS = (ConfigError, HydraException, OmegaConfBaseException)


def composed(*overrides: str, world_size: int = 1) -> Config:
    """configs/config.yaml with `overrides`, composed and validated as train.py does it on `world_size` ranks."""
    return schema.composed(overrides, world_size)


def chosen_experiment(*overrides: str) -> str:
    """The experiment Hydra composes for `overrides` (configs/config.yaml's default where they choose none), which
    train.py hands a projection as its recipe."""
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return str(
            compose("config", overrides=list(overrides), return_hydra_config=True).hydra.runtime.choices.experiment
        )


def config_error(*overrides: str, world_size: int = 1) -> str:
    """The message of the line `error: ...` with which train.py refuses `overrides` (configs.errors.describe)."""
    with pytest.raises(CONFIG_ERRORS) as refused:
        composed(*overrides, world_size=world_size)
    return describe(refused.value)


def configured_dataset(*overrides: str) -> tuple[Split, Split]:
    """The dataset train.py opens for `overrides` (the synthetic set generated first where it is missing); a
    DatasetError it raises is train.py's one line and exit status 2 (tests/test_data.py runs train.py into one)."""
    return open_splits(composed(*overrides).data, Topology())


MARGINS: list[str] = []  # one line per convergence test, printed at the end of the session


def record_margin(test: str, log: Path, max_epochs: int, target: float = 0.759) -> None:
    """Note how far a run cleared the target: the epoch its evaluation first reached it, of how many, and by
    how much (`make test-hosts` prints these under each host's kernels)."""
    evals = [(e["metadata"]["epoch_num"], e["value"]) for e in mllog_events(log) if e["key"] == "eval_accuracy"]
    reached = next(((epoch, top1) for epoch, top1 in evals if top1 >= target), None)
    if reached is None:
        best = max((top1 for _, top1 in evals), default=0.0)
        MARGINS.append(f"{test}: target {target} MISSED in {max_epochs} epochs, best top-1 {best:.4f}")
        return
    epoch, top1 = reached
    MARGINS.append(
        f"{test}: target {target} reached at epoch {epoch} of {max_epochs} ({max_epochs - epoch} to spare), "
        f"top-1 {top1:.4f} (+{top1 - target:.3f})"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MARGINS:
        isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "all")
        kernels = f"ATen {torch.backends.cpu.get_cpu_capability()} kernels, ONEDNN_MAX_CPU_ISA={isa}"
        terminalreporter.write_sep("-", f"convergence margins ({kernels})")
        for line in MARGINS:
            terminalreporter.write_line(line)


def mllog_events(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG" in line]


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The TensorBoard scalars in a run directory, by tag, as (step, value) as TensorBoard shows them: the points
    a stopped run wrote after its checkpoint are gone once it resumed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / rundir.TENSORBOARD))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def assert_same_run(expected: Path, actual: Path) -> None:
    """The same final weights, evaluations and per-epoch losses and learning rates; one run_start in the log."""
    weights = tuple(torch.load(run / rundir.FINAL_WEIGHTS, weights_only=True) for run in (expected, actual))
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name

    def accuracies(run: Path) -> list[float]:
        return [e["value"] for e in mllog_events(rundir.mlperf_log(run)) if e["key"] == "eval_accuracy"]

    def losses_and_rates(run: Path) -> list[tuple[str, ...]]:
        rows = list(csv.DictReader((run / rundir.METRICS).open()))
        return [(row["epoch"], row["step"], row["lr"], row["train_loss"]) for row in rows]

    assert accuracies(actual) == accuracies(expected)
    assert losses_and_rates(actual) == losses_and_rates(expected)  # none twice, none lost
    assert tensorboard_scalars(actual)["train/loss"] == tensorboard_scalars(expected)["train/loss"]
    assert [e["key"] for e in mllog_events(rundir.mlperf_log(actual))].count("run_start") == 1


def time_to_train_min(run_dir: Path) -> tuple[str, float]:
    """A run's status and its time to train in minutes, from its MLPerf log."""
    events = {e["key"]: e for e in mllog_events(rundir.mlperf_log(run_dir))}
    stop, start = events["run_stop"], events["run_start"]
    return stop["metadata"]["status"], (stop["time_ms"] - start["time_ms"]) / 60_000


def assert_compliant(log: Path) -> None:
    """The compliance checker passes the log."""
    checker = compliance_check(log)
    assert checker.returncode == 0 and "SUCCESS" in checker.stdout + checker.stderr, checker.stdout + checker.stderr


def assert_compliant_but_for_accuracy(log: Path, scratch: Path) -> None:
    """The compliance checker passes the log of a run that ended at its epoch budget below the target as it would
    had the run reached it (a copy of the log in `scratch`, promoted): every rule but the accuracy, which the
    tests of convergence check."""
    copy = scratch / "promoted" / log.name
    copy.parent.mkdir()
    copy.write_text("".join(promoted(log.read_text().splitlines(keepends=True))))
    assert_compliant(copy)


def assert_read_whole(log: Path) -> None:
    """The compliance checker reads every line of the log (a stopped run's log need not pass it)."""
    checker = compliance_check(log)
    assert "parsing errors" not in checker.stdout + checker.stderr


def compliance_check(log: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        "training",
        "--ruleset",
        "4.0.0",
    ]
    return subprocess.run([*command, str(log)], capture_output=True, text=True, cwd=log.parent)


# A Hydra sweep of 2 learning rates x 2 seeds, one epoch of 32 images at 32 px each (a few seconds a run; one
# thread per run keeps a shared 2-core machine from thrashing). No run reaches the target.
TINY_SWEEP = (
    "-m",
    "experiment=smoke",
    "run.max_epochs=1",
    "optim.warmup_epochs=0",
    "optim.base_lr=2,4",
    "run.seed=1,2",
    "data.synthetic.train_per_class=8",
    "data.synthetic.val_per_class=4",
    "data.global_batch=8",
    "data.image_size=32",
    "data.eval_resize=36",
    "device.threads=1",
    "run.progress=none",
)


@pytest.fixture(scope="session")
def tiny_sweep(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep directory of TINY_SWEEP: run directories 0 to 3."""
    directory = tmp_path_factory.mktemp("sweep")
    run_train(*TINY_SWEEP, f"hydra.sweep.dir={directory}", cache=cache_dir, check=True)
    return directory


def promoted(lines: list[str]) -> list[str]:
    """MLPerf log lines as if the run's evaluations had reached the target: a log the checker passes as a success."""
    edited = []
    for line in lines:
        payload = json.loads(line.split(":::MLLOG ", 1)[1])
        if payload["key"] == "eval_accuracy":
            payload["value"] = 0.8
        if payload["key"] == "run_stop":
            payload["metadata"]["status"] = "success"
        edited.append(f":::MLLOG {json.dumps(payload)}\n")
    return edited


def processes_mentioning(*markers: str) -> list[int]:
    """The processes whose command line contains one of `markers` (a run's directory: its ranks and loader
    workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            if any(marker in cmdline for marker in markers):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def importing_torch(marker: str) -> bool:
    """Whether a process whose command line names `marker` (a run's directory) has begun to import torch: its
    libraries are mapped, and the import takes seconds more."""
    for pid in processes_mentioning(marker):
        with contextlib.suppress(OSError):
            if "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                return True
    return False
