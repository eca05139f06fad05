"""rn50perf: one MLPerf ResNet-50 training run, top to bottom.

    python train.py                               the embedded synthetic task (configs/experiment/embedded.yaml)
    python train.py optim=sgd run.max_epochs=20   any key can be overridden
    python train.py experiment=imagenet data.root=/data/imagenet
    python train.py hydra.run.dir=outputs/run1 run.resume=auto   continue run1 from its last checkpoint
    python train.py precision=fp16.16             fp16 weights with stochastic rounding (configs/precision/)
    python train.py run.mode=benchmark precision=bf16   time the train step on random batches
    python train.py run.mode=project experiment=mlperf_pod64    memory plan and time-to-train on a simulated IPU-POD64
    python train.py run.mode=project experiment=imagenet device=dgx_h100 device.nodes=8   time-to-train on 8 DGX H100s
    python train.py device=ipu_pod16 device.replicas=4 mlperf.clock=device   train on 4 simulated IPUs, log their time
    torchrun --nproc-per-node 2 train.py dist.bn_group_size=2   two processes, BatchNorm over both

Everything the run writes goes to its Hydra output directory (rundir names each file): config.yaml (resolved),
mlperf.log, metrics.csv, metrics.png, checkpoint.pt, and resume.sh after a stop. With several ranks, rank 0 picks the
directory and writes alone. SIGTERM, SIGINT and SIGUSR1 stop the run: at once before its loop starts, at the next
step boundary in it (stopsignals, distributed.stop).
backends.build.from_config builds what trains (model, optimizer, precision policy, on its device), data.build the
loaders, checkpoint/ saves and restores a run; run.mode=benchmark and run.mode=project are benchmark.py and
projection/mode.py.
"""

from __future__ import annotations

import stopsignals

stopsignals.catch()  # first: a stop signal during the seconds the imports below take ends the run with its status

import contextlib
import gc
import math
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import checkpoint
import distributed
import rundir
from backends import build
from backends.base import Backend, RunFacts
from backends.ipu_sim.backend import device_clock
from benchmark import benchmark
from checkpoint import CheckpointError, Loop, restore_point, restore_run
from configs.checks import ConfigError
from configs.errors import describe
from configs.schema import Config, register, training_fingerprint, validate
from data.build import decode_where_fastest, loader_workers, make_loader, open_splits
from data.datasets import describe_dataset
from data.loader import Loader
from data.split import DatasetError, Split
from data.synthetic import CACHE_ENV
from distributed import LaunchError, PeerLost, Topology
from distributed.stop import Resume, agreed_stop
from mlperf_logs.hyperparameters import Hyperparameters, Submission, log_hyperparameters, log_submission
from mlperf_logs.logger import SKIPPED_FILES, MLPerfLogger, constants
from monitor.metrics import EpochMetrics, EpochTimer, MetricsCSV, plot
from monitor.progress import Progress, Simulated, epoch_line, job_log, print_summary, say
from optim.precision import NonFiniteLoss, Policy
from optim.schedule import Schedule
from projection.mode import listed_cuts, project
from rundir import StorageError
from stopsignals import StopRequested

USER_ERRORS = (ConfigError, DatasetError, CheckpointError, LaunchError, HydraException, OmegaConfBaseException)
NOT_CONVERGED = 3  # the exit status of a run that ended short of the target (run.allow_not_converged=true: 0)
STORAGE_FAILED = 5  # a write of the run directory failed (no space, quota, read-only): its last checkpoint resumes it
NO_TRIAL_COMPLETED = "No trials are completed yet."  # optuna's study.best_trial, when every trial failed

register()


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(raw: DictConfig) -> float | None:
    """One run; returns what a sweeper (-m) minimises: the time-to-train in minutes, None without one."""
    try:
        return run(raw)
    except USER_ERRORS as err:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # a failed job of a sweep: its sweeper decides (Optuna's marks the trial failed, goes on)
        forget_refused_run(Path(HydraConfig.get().runtime.output_dir))
        exit_in_one_line(err)  # here: raised on, it would get a line of Hydra's own before it
    except NotConverged as err:  # the summary above says how far it got
        if distributed.from_environment().is_main:
            print(f"not converged: {err}", file=sys.stderr)
        sys.exit(NOT_CONVERGED)
    except StorageError:  # rank 0 said which write failed and how the run goes on
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        sys.exit(STORAGE_FAILED)
    except PeerLost as err:  # the log ended; rank 0 said how to resume
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the SLURM launcher requeues the job (hydra_plugins/rn50perf_slurm.py)
        print(f"error: {err}", file=sys.stderr)  # here: raised on, it would get a line of Hydra's own before it
        sys.exit(err.exit_status)


def forget_refused_run(directory: Path) -> None:
    """A run refused before it started leaves no folder: the one Hydra made for it holds only Hydra's record of the
    job and an empty train.log. Those files alone are removed, then the folders they leave empty; a folder holding
    anything more (an earlier run's, or a user's given as hydra.run.dir) stays as it is."""
    if not directory.is_dir():  # ranks but the first may have none
        return
    log = directory / rundir.JOB_LOG
    made_for_this_run = {path.name for path in directory.iterdir()} <= {rundir.HYDRA, rundir.JOB_LOG}
    if not made_for_this_run or (log.exists() and log.stat().st_size > 0):
        return
    for path in (*rundir.HYDRA_RECORD, rundir.JOB_LOG):
        (directory / path).unlink(missing_ok=True)
    for folder in (directory / rundir.HYDRA, directory):
        with contextlib.suppress(OSError):  # not empty: something else is there, and stays
            folder.rmdir()


def hydras_failed_write(err: BaseException) -> OSError | None:
    """The OSError of Hydra's making or writing of the run directory as a job starts (its folder, .hydra/, the
    train.log its logging opens: logging.config wraps that one in a ValueError), which comes before the run does;
    None for any other error."""
    failed = err if isinstance(err, OSError) else err.__cause__
    if not isinstance(failed, OSError) or not failed.filename:
        return None
    raised_in_run = any(frame.f_code is run.__code__ for frame, _ in traceback.walk_tb(err.__traceback__))
    return None if raised_in_run else failed


def exit_in_one_line(err: BaseException) -> NoReturn:
    """A mistake of the user's: one line that names it and says what to do, and exit status 2."""
    print(f"error: {describe(err)}", file=sys.stderr)
    sys.exit(2)


def run(raw: DictConfig) -> float | None:
    topology = distributed.from_environment()
    refuse_a_launcher_without_a_sweep()
    cfg = OmegaConf.to_object(raw)
    assert isinstance(cfg, Config)  # the schema is the base of every composed config (register)
    validate(cfg, topology.world_size)
    if listed_cuts(cfg):  # device.pipeline_splits=list: where the model can be cut, and nothing more
        return None
    with distributed.process_group(topology, cfg.device.name, cfg.dist.timeout_s):
        if cfg.run.mode == "benchmark":
            benchmark(cfg, topology)
        elif cfg.run.mode == "project":
            out_dir = Path(HydraConfig.get().runtime.output_dir) if topology.is_main else None
            project(cfg, out_dir, HydraConfig.get().overrides.task, HydraConfig.get().runtime.choices["experiment"])
        else:
            out_dir = distributed.agree_on_output_dir(Path(HydraConfig.get().runtime.output_dir))
            with job_log():  # train.log holds what the terminal shows
                status, minutes = train(cfg, out_dir, topology, resolved=OmegaConf.to_yaml(raw, resolve=True))
            refuse_to_pass_as_converged(status, cfg)
            return sweep_objective(status, minutes)
    return None


def refuse_a_launcher_without_a_sweep() -> None:
    """A launcher is for the jobs of a sweep: without -m, Hydra would run here and ignore it."""
    hydra_cfg = HydraConfig.get()
    launcher = hydra_cfg.runtime.choices.get("hydra/launcher")
    if hydra_cfg.mode == RunMode.RUN and launcher not in (None, "basic"):
        raise ConfigError("hydra/launcher", f"{launcher} launches the jobs of a sweep: add -m (python train.py -m ...)")


class NotConverged(Exception):
    """The run ended (its epoch budget spent, or its loss not finite) short of the target accuracy."""


def refuse_to_pass_as_converged(status: str, cfg: Config) -> None:
    """A run that missed the target exits NOT_CONVERGED, so a script or a scheduler can tell it from a success;
    in a sweep, its sweeper decides instead (Optuna's marks the trial failed), and run.allow_not_converged=true
    lets a run that is not meant to converge (a timing or a smoke run) exit 0."""
    if status != constants.SUCCESS and HydraConfig.get().mode == RunMode.RUN and not cfg.run.allow_not_converged:
        target = cfg.mlperf.target_accuracy
        raise NotConverged(
            f"the run ended short of the target top-1 {target} (exit status {NOT_CONVERGED}; "
            "run.allow_not_converged=true exits 0)"
        )


def sweep_objective(status: str, minutes: float) -> float | None:
    """The time-to-train of a run that reached the target; None for one that missed it, which the Optuna sweeper
    marks failed (a NaN would make optuna 2.10's `tell` raise and stop the whole sweep)."""
    return minutes if status == constants.SUCCESS else None


@dataclass
class Run:
    """What one training run carries from start to end: its settings and ranks, where and what it logs, what
    trains and on which data, and where its loop stands."""

    cfg: Config
    out_dir: Path
    topology: Topology
    log: MLPerfLogger
    metrics: MetricsCSV
    backend: Backend
    train_loader: Loader
    val_loader: Loader
    schedule: Schedule
    steps_per_epoch: int  # a whole epoch's (the loader's length is what is left of the epoch it was set to)
    simulated: Simulated | None  # a simulated system's clock, shown beside the host's
    loop: Loop = field(default_factory=Loop)
    saved_step: int | None = None  # the step of the checkpoint in out_dir, None before the first
    skips_logged: int = 0  # the training files skipped so far that the log has named

    def log_sizes(self) -> dict[str, int]:
        """The sizes of rank 0's logs: a resumed run cuts them back to these."""
        assert self.log.path is not None and self.metrics.path is not None
        return {"mlperf": self.log.path.stat().st_size, "metrics": self.metrics.path.stat().st_size}


def train(cfg: Config, out_dir: Path, topology: Topology, resolved: str) -> tuple[str, float]:
    """The run from its log's init_start (or the checkpoint it resumes) to its run_stop; returns its status and
    its time-to-train in minutes."""
    facts = build.run_facts(cfg, topology)  # this rank's device, its precision policy, the batch shape: worked out once
    fingerprint = training_fingerprint(cfg, topology.world_size)
    checkpoint = distributed.from_main(lambda: restore_point(out_dir, cfg.mlperf.log_file, cfg.run.resume, fingerprint))
    distributed.seed_everything(cfg.run.seed, topology.rank)

    # Data: the index of both splits (the synthetic set is generated here on first use), then the loaders; a set
    # the run cannot use is refused here, before the run has a log or a config.yaml (and so no folder).
    splits = open_splits(cfg.data, topology)
    train_loader = make_loader(cfg.data, splits[0], facts, seed=cfg.run.seed, train=True)
    val_loader = make_loader(cfg.data, splits[1], facts, seed=cfg.run.seed, train=False)
    with train_loader, val_loader:  # the workers end with the run, however it ends (Loader.close says why)
        # A stop, a refusal or a failure before the clock starts: the same command again.
        with forgotten_unless_started(out_dir, cfg.mlperf.log_file, topology.is_main):
            run = initialise(cfg, out_dir, facts, splits, (train_loader, val_loader), resolved, checkpoint is None)
            if checkpoint is not None:
                resume(run, checkpoint)
        with stopsignals.running():  # from here a stop signal waits for the next step boundary
            try:
                if checkpoint is None:
                    run.log.start(constants.RUN_START)
                    run.loop.run_start = run.log.clock()
                status, accuracy = train_to_target(run)
            except BaseException as err:  # a bad file, a lost rank, a stop, a full disk: the log ends the run
                lost = distributed.as_lost_peer(err)  # a collective that failed, as the rank it lost
                end_stopped(run, lost or err)
                if lost is not None and lost is not err:
                    raise lost from err
                raise
    return finish(run, status, accuracy)


def initialise(
    cfg: Config,
    out_dir: Path,
    facts: RunFacts,
    splits: tuple[Split, Split],
    loaders: tuple[Loader, Loader],
    resolved: str,
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
    backend = build.from_config(cfg, facts, classes)
    if cfg.device.compile or cfg.device.cuda_graphs:  # compiled and captured in MLPerf's init phase, not timed steps
        backend.compile_ahead(facts.shape.per_rank, val_loader.batch_sizes(), cfg.data.image_size, classes)
    if topology.is_main:
        checkpoint.refuse_a_directory_too_small(out_dir, backend, topology.world_size)
    if cfg.mlperf.clock == "device":
        log.clock = backend.now  # from here on the log, and the time-to-train, are in the simulated IPUs' time
    steps_per_epoch = len(train_loader)
    schedule = Schedule.for_run(cfg.optim, cfg.run.max_epochs, steps_per_epoch)
    tensorboard = out_dir / rundir.TENSORBOARD if cfg.run.tensorboard else None
    metrics = MetricsCSV(out_dir / rundir.METRICS if topology.is_main else None, tensorboard)
    simulated = simulated_clock(backend, logged=cfg.mlperf.clock == "device")
    run = Run(
        cfg, out_dir, topology, log, metrics, backend, train_loader, val_loader, schedule, steps_per_epoch, simulated
    )
    if fresh:
        hp = Hyperparameters.of_run(cfg.optim, facts.shape, schedule.decay_steps, len(train_split), len(val_split))
        log_hyperparameters(log, hp)
        log.end(constants.INIT_STOP)
    distributed.barrier()  # every rank is ready when the clock starts
    return run


@contextlib.contextmanager
def forgotten_unless_started(out_dir: Path, log_file: str, is_main: bool) -> Iterator[None]:
    """A run that ends before its clock starts (a stop signal, a refusal, a failure of its init phase) takes away
    the files it wrote in the run directory (its log's first lines, config.yaml, metrics.csv), so that the same
    command, or the requeued job, starts it again. A run directory it cannot write refuses the run (exit status 2)."""
    before = {path.name for path in out_dir.iterdir()} if is_main else set()
    try:
        yield
    except BaseException as err:
        if is_main:
            remove_written_since(out_dir, before, log_file)
        if isinstance(err, StopRequested) and is_main:
            say(f"{err} before the run started: nothing to resume; the same command starts it again", error=True)
        if isinstance(err, StorageError):
            raise ConfigError("hydra.run.dir", str(err)) from err
        raise


def remove_written_since(out_dir: Path, before: set[str], log_file: str) -> None:
    """The files a run writes that `out_dir` did not hold (`before`): what was there stays (a stopped run's
    checkpoint and logs, the user's files), and so do Hydra's record of the job and train.log, which say what
    happened."""
    for path in out_dir.iterdir():
        new = path.name not in before and path.name not in (rundir.HYDRA, rundir.JOB_LOG)
        if new and path.is_file() and rundir.written_by_run(path.name, log_file):
            path.unlink()


def simulated_clock(backend: Backend, logged: bool) -> Simulated | None:
    """The simulated system's clock of a backend that runs on one, as the run's lines show it; None elsewhere."""
    clock = device_clock(backend)
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
    system = cfg.device.system
    if cfg.mlperf.clock == "device" and system is not None:  # validate: device time is a simulated system's
        return f"{system.name} simulated by rn50perf ipu_sim (device time)"
    return cfg.mlperf.platform + (f" ({policy.compute} emulated in fp32)" if policy.emulated else "")


def resume(run: Run, checkpoint: dict[str, Any]) -> None:
    """Continue exactly where the checkpoint left off; the logs are cut back to their sizes then."""
    run.loop, sizes = restore_run(checkpoint, run.backend, run.topology.rank)
    run.saved_step = run.loop.step
    run.metrics.resume(sizes["metrics"], run.loop.step)
    run.log.resume(sizes["mlperf"], run.loop.step, run.loop.epoch)
    if run.topology.is_main:
        loop = run.loop
        say(f"resuming at epoch {loop.epoch} (step {loop.step}, {loop.batch} steps into the epoch)")


def end_stopped(run: Run, err: BaseException) -> None:
    """The log of a run that did not end on its own ends aborted, where it can still be written; a stopped one, or
    one that lost a rank or a write of its directory after its first checkpoint, says how to resume it."""
    log_ended = end_log_aborted(run.log)
    if run.topology.is_main and not isinstance(err, StorageError):  # nothing more on a filesystem that failed
        plot_so_far(run)  # a stopped or failed run's epochs so far
    if isinstance(err, StopRequested):
        if run.topology.is_main:
            say_how_to_resume(f"{err} at {where(run)}: checkpoint written, log ended (run_stop aborted)", run)
        distributed.barrier()  # rank 0's checkpoint and log are whole before any rank exits
    elif isinstance(err, StorageError) and run.topology.is_main:
        unended = "" if log_ended else "; the log could not take its run_stop"
        say(f"error: {err}{unended}; {how_to_go_on_after_storage(run)}", error=True)
    elif isinstance(err, PeerLost) and run.topology.is_main:
        lost = f"a rank was lost at {where(run)}: log ended (run_stop aborted)"
        if run.saved_step is None:
            say(f"\n{lost}; no checkpoint yet, so start the run again with a new hydra.run.dir", error=True)
        else:
            again = run.loop.step - run.saved_step
            say_how_to_resume(f"{lost}; its checkpoint is at step {run.saved_step} ({again} steps to take again)", run)


def end_log_aborted(log: MLPerfLogger) -> bool:
    """run_stop aborted, and the log closed; False where its filesystem could not take the line (the log then
    ends with its last whole line)."""
    try:
        log.end(constants.RUN_STOP, metadata={constants.STATUS: constants.ABORTED})
    except StorageError:
        return False
    finally:
        log.close()
    return True


def how_to_go_on_after_storage(run: Run) -> str:
    """What a run whose directory's filesystem failed a write leaves to resume, and how: resume.sh where the
    filesystem still takes it, else the command itself."""
    if run.saved_step is None:
        return "no checkpoint yet: free space and start the run again with a new hydra.run.dir"
    what = f"{rundir.CHECKPOINT} (step {run.saved_step}) is intact and resumes the run"
    resume = resume_of(run)
    try:
        script = resume.write_script(run.out_dir, what)
    except StorageError:
        return f"{what}: free space and run {resume.line()}"
    return f"{what}: free space and run {script}"


def where(run: Run) -> str:
    loop = run.loop
    return f"step {loop.step} (epoch {loop.epoch}, {loop.batch} of its {run.steps_per_epoch} steps done)"


def say_how_to_resume(what: str, run: Run) -> None:
    """Say `what` ended the run, and write resume.sh: the run's launcher and overrides, in its directory."""
    distributed.stop.tell_how_to_resume(what, resume_of(run), run.out_dir)


def resume_of(run: Run) -> Resume:
    """The command that continues `run` from its checkpoint."""
    return Resume.of(run.topology, HydraConfig.get().overrides.task, run.out_dir, [CACHE_ENV])


def finish(run: Run, status: str, accuracy: float | None) -> tuple[str, float]:
    """run_stop, the plot and the final weights; nothing is left to resume. Returns the status and minutes."""
    try:
        run.log.end(constants.RUN_STOP, metadata={constants.STATUS: status})
        minutes = (run.log.clock() - run.loop.run_start) / 60
        run.log.close()
        if run.topology.is_main:
            plot_so_far(run)
            checkpoint.save_atomically(run.out_dir / rundir.FINAL_WEIGHTS, run.backend.state_dict()["model"])
    except StorageError as err:  # the last checkpoint trains the last steps again, to the same end
        if run.topology.is_main:
            say(f"error: {err}; {how_to_go_on_after_storage(run)}", error=True)
        raise
    if run.topology.is_main:
        for name in (rundir.CHECKPOINT, rundir.RESUME_SCRIPT):
            (run.out_dir / name).unlink(missing_ok=True)
        skipped = {**run.train_loader.skipped, **run.val_loader.skipped}
        warned = run.train_loader.warned | run.val_loader.warned
        print_summary(status, accuracy, run.loop.epoch - 1, minutes, run.out_dir, skipped, warned, run.simulated)
    return status, minutes


def plot_so_far(run: Run) -> None:
    """metrics.png from the epochs ended so far, on rank 0 (which writes metrics.csv); none before the first."""
    if run.metrics.path is not None and (rows := run.metrics.read()):
        plot(rows, run.out_dir / rundir.PLOT, run.cfg.mlperf.target_accuracy)


def train_to_target(run: Run) -> tuple[str, float | None]:
    """Epochs in blocks that end with an evaluation, until the target accuracy or the epoch budget.

    Every rank takes the same decisions: the loss and the accuracy they rest on are reduced over the ranks.
    Times are on the log's clock.
    """
    cfg, backend, log, loop = run.cfg, run.backend, run.log, run.loop
    evals = cfg.mlperf.eval_epochs(cfg.run.max_epochs)
    quiet = not run.topology.is_main
    progress = Progress("none" if quiet else cfg.run.progress, cfg.run.max_epochs, cfg.data.global_batch)
    timer = EpochTimer(lambda: run.train_loader.waited_s, lambda: backend.allreduce_s)
    accuracy: float | None = None
    for epoch in range(loop.epoch, cfg.run.max_epochs + 1):
        timer.start()
        block_first = max((e + 1 for e in evals if e < epoch), default=1)
        if epoch == block_first and loop.batch == 0:
            block_last = min(e for e in evals if e >= epoch)
            log.start(
                constants.BLOCK_START,
                metadata={constants.FIRST_EPOCH_NUM: epoch, constants.EPOCH_COUNT: block_last - epoch + 1},
            )
        started, first_batch = log.clock(), loop.batch
        try:
            loss, lr = train_epoch(run, progress)
        except NonFiniteLoss as err:
            say(f"error: {err} in epoch {epoch}; stopping (run_stop aborted)", error=True)
            return constants.ABORTED, accuracy
        backend.end_epoch()
        images_per_s = (loop.batch - first_batch) * cfg.data.global_batch / (log.clock() - started)
        accuracy = None
        if epoch in evals:
            log.end(constants.BLOCK_STOP, metadata={constants.FIRST_EPOCH_NUM: block_first})
            log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})
            with timer.evaluating():
                accuracy = evaluate(backend, run.val_loader)
            log.event(constants.EVAL_ACCURACY, accuracy, metadata={constants.EPOCH_NUM: epoch})
            log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})
        row = EpochMetrics(
            epoch=epoch,
            step=loop.step,
            lr=lr,
            train_loss=loss,
            images_per_s=images_per_s,
            eval_accuracy=accuracy,
            elapsed_s=log.clock() - loop.run_start,
            loss_scale=backend.loss_scale,
            skipped_steps=backend.skipped_steps,
            **timer.fractions(),
        )
        run.metrics.append(row)
        log_new_skips(run, epoch)
        progress.end_epoch(epoch_line(cfg.run.max_epochs, row, run.simulated))
        loop.epoch, loop.batch, loop.losses = epoch + 1, 0, []
        if accuracy is not None and accuracy >= cfg.mlperf.target_accuracy:
            return constants.SUCCESS, accuracy
        if epoch < cfg.run.max_epochs:
            stop_if_requested(run)  # a signal during the evaluation stops the run here, between two epochs
            if cfg.run.checkpoint:
                save(run)
    return constants.ABORTED, accuracy


def log_new_skips(run: Run, epoch: int) -> None:
    """The training files this epoch skipped that no earlier one had (data.corrupt=skip), in the log."""
    skipped = list(run.train_loader.skipped)
    if len(skipped) > run.skips_logged:
        new = skipped[run.skips_logged :]
        run.log.event(SKIPPED_FILES, {"epoch": epoch, "files": new, "total": len(skipped)})
        run.skips_logged = len(skipped)


def train_epoch(run: Run, progress: Progress) -> tuple[float, float]:
    """Epoch `loop.epoch` from where it stands (its start, or where a stopped run left it), with a chance to stop
    after each step; returns the epoch's mean loss over the ranks (one host sync per epoch) and its last lr.

    Updates that loss scaling skipped (non-finite loss or gradients) are left out of the mean; an epoch with no
    finite loss raises NonFiniteLoss, as loss scaling does after too many skips in a row.
    """
    loop, backend, schedule = run.loop, run.backend, run.schedule
    run.train_loader.set_epoch(loop.epoch, first_batch=loop.batch)
    progress.start_epoch(loop.epoch, loop.batch + len(run.train_loader), done=loop.batch)
    for images, labels in run.train_loader:
        lr = schedule(loop.step)
        distributed.record_step(loop.step + 1)
        loss = backend.train_step(images, labels, lr)
        loop.step += 1
        loop.batch += 1
        loop.losses.append(loss)
        progress.step(loop.batch, loss, lr)
        stop_if_requested(run)
        checkpoint_if_due(run)
    losses = torch.stack(loop.losses)
    finite = losses[torch.isfinite(losses)]
    mean = distributed.mean_over_ranks(float(finite.mean()) if len(finite) else math.inf)
    if not math.isfinite(mean):
        raise NonFiniteLoss(f"the training loss is {mean}")
    return mean, schedule(loop.step - 1)


def stop_if_requested(run: Run) -> None:
    """At a step boundary, on every rank: once any rank has received a stop signal, checkpoint where the run
    stands and raise StopRequested."""
    stop = agreed_stop()
    if stop is not None:
        save(run)
        raise stop


def checkpoint_if_due(run: Run) -> None:
    """Every run.checkpoint_every_steps steps within an epoch (its end saves after its evaluation): a lost rank
    then costs at most that many steps."""
    every, loop = run.cfg.run.checkpoint_every_steps, run.loop
    if every and loop.step % every == 0 and loop.batch < run.steps_per_epoch:
        save(run)


def save(run: Run) -> None:
    """The run's checkpoint, written by rank 0 with every rank's own state."""
    path = run.out_dir / rundir.CHECKPOINT if run.topology.is_main else None
    fingerprint = training_fingerprint(run.cfg, run.topology.world_size)
    checkpoint.save_run(path, run.backend, run.loop, run.log_sizes, fingerprint)
    run.saved_step = run.loop.step


def evaluate(backend: Backend, loader: Loader) -> float:
    """Top-1 accuracy over every validation image, as a fraction; each rank evaluates its share."""
    correct = sum(backend.eval_step(images, labels) for images, labels in loader)
    return int(distributed.sum_over_ranks(torch.as_tensor(correct, device=backend.device))) / len(loader.dataset)


if __name__ == "__main__":
    gc.freeze()  # the imported modules live as long as the process: no collection (nor the exit) walks them again
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let configuration errors reach the handler below as exceptions
    try:
        if not distributed.from_environment().is_main:
            sys.argv += distributed.QUIET_HYDRA
        main()
    except USER_ERRORS as err:  # a mistake in the overrides, found before the run started
        exit_in_one_line(err)
    except (OSError, ValueError) as err:  # Hydra could not write the run directory, or a sweep has no best trial
        if unwritable := hydras_failed_write(err):
            exit_in_one_line(ConfigError("hydra.run.dir", str(StorageError.of(Path(unwritable.filename), unwritable))))
        if str(err) != NO_TRIAL_COMPLETED:  # optuna's answer when a sweep has no best trial; anything else is a bug
            raise
        print("error: no trial of the sweep reached the target, so there is no best one", file=sys.stderr)
        sys.exit(1)
