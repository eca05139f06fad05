"""How a training run starts: MLPerf's init phase (its log's first lines, what trains, on which data, with which
schedule), which builds the `Run` that train.py's loop carries to its end, and the resumed run's return to where its
checkpoint left off."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import distributed
import rundir
from backends import build
from backends.base import Backend, RunFacts
from checkpoint import Loop
from checkpoint.checkpointer import Checkpointer
from configs.schema import Config
from data.build import decode_where_fastest, loader_workers
from data.datasets import describe_dataset
from data.loading.loader import Loader
from data.sources.split import Split
from distributed import Topology
from mlperf_logs.hyperparameters import Hyperparameters, Submission, log_hyperparameters, log_submission
from mlperf_logs.logger import MLPerfLogger, constants
from monitor.metrics import MetricsCSV
from monitor.progress import Simulated, say
from optim.precision import Policy
from optim.schedule import Schedule
from projection import families


@dataclass(kw_only=True)
class Run:
    """What one training run carries from start to end: its settings and ranks, where and what it logs, what
    trains and on which data, its checkpointer, and where its loop stands."""

    cfg: Config
    facts: RunFacts
    out_dir: Path
    log: MLPerfLogger
    metrics: MetricsCSV
    backend: Backend
    train_loader: Loader
    val_loader: Loader
    schedule: Schedule
    steps_per_epoch: int  # a whole epoch's (the loader's length is what is left of the epoch it was set to)
    simulated: Simulated | None  # a simulated system's clock, shown beside the host's
    checkpoints: Checkpointer
    loop: Loop = field(default_factory=Loop)
    skips_logged: int = 0  # the training files skipped so far that the log has named

    @property
    def topology(self) -> Topology:
        return self.facts.topology

    def log_sizes(self) -> dict[str, int]:
        """The sizes of rank 0's logs: a resumed run cuts them back to these."""
        assert self.log.path is not None and self.metrics.path is not None
        return {"mlperf": self.log.path.stat().st_size, "metrics": self.metrics.path.stat().st_size}

    def where(self) -> str:
        loop = self.loop
        return f"step {loop.step} (epoch {loop.epoch}, {loop.epoch_step} of its {self.steps_per_epoch} steps done)"


def initialise(
    cfg: Config,
    facts: RunFacts,
    out_dir: Path,
    splits: tuple[Split, Split],
    loaders: tuple[Loader, Loader],
    resolved: str,
    checkpoints: Checkpointer,
    *,
    fresh: bool,
) -> Run:
    """MLPerf's init phase: the log's first lines (a `fresh` run's), the model, optimizer and precision policy on
    the device, compiled and captured, and the schedule; every rank waits for the others at its end."""
    topology, (train_split, val_split), (train_loader, val_loader) = facts.topology, splits, loaders
    log = MLPerfLogger(out_dir / cfg.mlperf.log_file if topology.is_main else None)
    if topology.is_main:
        with rundir.writing(out_dir / rundir.CONFIG):
            (out_dir / rundir.CONFIG).write_text(resolved)
    if fresh:
        log.event(constants.CACHE_CLEAR, True)
        log.start(constants.INIT_START)
        platform = submission_platform(cfg, facts.policy)
        log_submission(log, Submission(cfg.mlperf.org, platform, cfg.mlperf.division, cfg.mlperf.status))
        log.event(constants.SEED, cfg.run.seed)
    if topology.is_main:
        say(describe_dataset(train_split, val_split))
        announce(cfg, facts)
    chosen = decode_where_fastest(cfg.data, loaders, facts)  # data.decode=auto, timed here
    if chosen and topology.is_main:
        say(chosen)

    # Model, optimizer with the MLPerf parameter groups and precision policy, on the device; the schedule by step.
    classes = len(train_split.classes)
    backend = families.build_backend(cfg, facts, classes)
    device = build.native_section(cfg)
    if device.compile or device.cuda_graphs:  # compiled and captured in MLPerf's init phase, not timed steps
        backend.compile_ahead(facts.shape.per_rank, val_loader.batch_sizes(), cfg.data.image_size, classes)
    checkpoints.refuse_a_directory_too_small(backend, topology.world_size)
    if cfg.mlperf.clock == "device":
        log.clock = backend.now  # from here on the log, and the time-to-train, are in the simulated IPUs' time
    steps_per_epoch = len(train_loader)
    schedule = Schedule.for_run(cfg.optim, cfg.run.max_epochs, steps_per_epoch)
    tensorboard = out_dir / rundir.TENSORBOARD if cfg.run.tensorboard else None
    run = Run(
        cfg=cfg,
        facts=facts,
        out_dir=out_dir,
        log=log,
        metrics=MetricsCSV(out_dir / rundir.METRICS if topology.is_main else None, tensorboard),
        backend=backend,
        train_loader=train_loader,
        val_loader=val_loader,
        schedule=schedule,
        steps_per_epoch=steps_per_epoch,
        simulated=simulated_clock(backend, logged=cfg.mlperf.clock == "device"),
        checkpoints=checkpoints,
    )
    if fresh:
        hp = Hyperparameters.of_run(cfg.optim, facts.shape, schedule.decay_steps, len(train_split), len(val_split))
        log_hyperparameters(log, hp)
        log.end(constants.INIT_STOP)
    distributed.barrier()  # every rank is ready when the clock starts
    return run


def simulated_clock(backend: Backend, logged: bool) -> Simulated | None:
    """The simulated system's clock of a backend that runs on one, as the run's lines show it; None elsewhere."""
    clock = backend.simulated_clock
    return None if clock is None else Simulated(clock, logged)


def announce(cfg: Config, facts: RunFacts) -> None:
    """The precision policy as it runs here, and the ranks."""
    policy, topology = facts.policy, facts.topology
    say(f"precision {policy.describe()}")
    if cfg.data.workers is None:
        say(f"data.workers=null: {loader_workers(cfg.data, topology)} loader processes, this rank's cores but one")
    if policy.emulated and policy.compute == "bf16" and cfg.precision.emulate == "auto":
        say("bf16 is emulated: this CPU has no native bf16 kernels (precision.emulate=never forces them)")
    if topology.distributed:
        say(f"{topology.world_size} ranks ({topology.launcher}), BN span {facts.shape.bn_span}")


def submission_platform(cfg: Config, policy: Policy) -> str:
    """The platform the log names; a log in simulated device time, or of emulated 16-bit arithmetic, says so."""
    if cfg.mlperf.clock == "device" and (platform := cfg.device.device_time_platform()):  # a simulated system's
        return platform
    return cfg.mlperf.platform + (f" ({policy.compute} emulated in fp32)" if policy.emulated else "")


def resume(run: Run, checkpoint: dict[str, Any]) -> None:
    """Continue exactly where the checkpoint left off; the logs are cut back to their sizes then."""
    run.loop, sizes = run.checkpoints.restore(checkpoint, run.backend, run.topology.rank)
    run.metrics.resume(sizes["metrics"], run.loop.step)
    run.log.resume(sizes["mlperf"], run.loop.step, run.loop.epoch)
    if run.topology.is_main:
        loop = run.loop
        say(f"resuming at epoch {loop.epoch} (step {loop.step}, {loop.epoch_step} steps into the epoch)")
