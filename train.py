"""rn50perf: one MLPerf ResNet-50 training run, top to bottom.

    python train.py                               the embedded synthetic task (configs/experiment/embedded.yaml)
    python train.py optim=sgd run.max_epochs=20   any key can be overridden
    python train.py experiment=imagenet data.root=/data/imagenet
    python train.py hydra.run.dir=outputs/run1 run.resume=auto   continue run1 from its last checkpoint
    python train.py precision=fp16.16             fp16 weights with stochastic rounding (configs/precision/)
    python train.py run.mode=benchmark precision=bf16   time the train step on random batches
    python train.py run.mode=project experiment=mlperf_pod64    memory plan and time-to-train on a simulated IPU-POD64
    python train.py device=ipu_pod16 device.replicas=4 mlperf.clock=device   train on 4 simulated IPUs, log their time
    torchrun --nproc-per-node 2 train.py dist.bn_group_size=2   two processes, BatchNorm over both

Everything the run writes goes to its Hydra output directory: config.yaml (resolved), mlperf.log,
metrics.csv, metrics.png, checkpoint.pt, and resume.sh after a stop. With several ranks, rank 0 picks the
directory and writes alone. SIGTERM, SIGINT and SIGUSR1 stop the run at the next step boundary (distributed.stop).
assemble.py builds the run's parts from the config; run.mode=benchmark and run.mode=project are benchmark.py and
projection.py.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NoReturn

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import backends
import distributed
from assemble import (
    bn_span,
    build_backend,
    hyperparameters,
    make_loader,
    make_schedule,
    open_splits,
    precision_policy,
    seed_everything,
    select_device,
    submission_platform,
)
from backends import checkpoint
from backends.checkpoint import CheckpointError
from benchmark import benchmark
from configs.errors import describe
from configs.schema import Config, ConfigError, register, training_fingerprint, validate
from data.datasets import describe_dataset
from data.loader import Loader
from data.split import DatasetError
from data.synthetic import CACHE_ENV
from distributed import LaunchError, PeerLost, Topology
from distributed.stop import RESUME_SCRIPT, StopRequested, catch_stop_signals, tell_how_to_resume
from mlperf_logs.hyperparameters import Submission, log_hyperparameters, log_submission
from mlperf_logs.logger import RESUMED, MLPerfLogger, constants, keep_attempt, truncate_to
from mlperf_logs.metrics import TENSORBOARD, EpochMetrics, EpochTimer, MetricsCSV, plot
from mlperf_logs.progress import Progress, epoch_line, job_log, print_summary, say
from optim import Schedule
from optim.precision import NonFiniteLoss
from projection import project

USER_ERRORS = (ConfigError, DatasetError, CheckpointError, LaunchError, HydraException, OmegaConfBaseException)
CHECKPOINT = "checkpoint.pt"
FINAL_WEIGHTS = "model.pt"
METRICS = "metrics.csv"
PLOT = "metrics.png"
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
        exit_in_one_line(err)  # here: raised on, it would get a line of Hydra's own before it


def exit_in_one_line(err: BaseException) -> NoReturn:
    """A mistake of the user's: one line that names it and says what to do, and exit status 2."""
    print(f"error: {describe(err)}", file=sys.stderr)
    sys.exit(2)


def run(raw: DictConfig) -> float | None:
    topology = distributed.from_environment()
    cfg: Config = OmegaConf.to_object(raw)
    validate(cfg, topology.world_size)
    with distributed.process_group(topology, cfg.device.name, cfg.dist.timeout_s):
        if cfg.run.mode == "benchmark":
            benchmark(cfg, topology)
        elif cfg.run.mode == "project":
            project(cfg, Path(HydraConfig.get().runtime.output_dir) if topology.is_main else None)
        else:
            catch_stop_signals()  # SIGTERM, SIGINT, SIGUSR1: checkpoint and end the log at the next step boundary
            out_dir = distributed.agree_on_output_dir(Path(HydraConfig.get().runtime.output_dir))
            with job_log():  # train.log holds what the terminal shows
                status, minutes = train(cfg, out_dir, topology, resolved=OmegaConf.to_yaml(raw, resolve=True))
            return sweep_objective(status, minutes)
    return None


def sweep_objective(status: str, minutes: float) -> float | None:
    """The time-to-train of a run that reached the target; None for one that missed it, which the Optuna sweeper
    marks failed (a NaN would make optuna 2.10's `tell` raise and stop the whole sweep)."""
    return minutes if status == constants.SUCCESS else None


@dataclass
class Loop:
    """Where the run stands: the epoch under way, the optimizer steps taken, when run_start was logged, and how
    far the epoch has come: its steps taken and their losses on this rank."""

    epoch: int = 1
    step: int = 0
    run_start: float = 0.0
    batch: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)


def train(cfg: Config, out_dir: Path, topology: Topology, resolved: str) -> tuple[str, float]:
    device = select_device(cfg.device.name, cfg.device.threads, topology.local_rank)
    policy = precision_policy(cfg, device)
    resumed = distributed.from_main(lambda: restore_point(cfg, out_dir, topology.world_size))
    log = MLPerfLogger(out_dir / cfg.mlperf.log_file if topology.is_main else None)
    if topology.is_main:
        (out_dir / "config.yaml").write_text(resolved)
    if resumed is None:
        log.event(constants.CACHE_CLEAR, True)
        log.start(constants.INIT_START)
        platform = submission_platform(cfg, policy)
        log_submission(log, Submission(cfg.mlperf.org, platform, cfg.mlperf.division, cfg.mlperf.status))
        log.event(constants.SEED, cfg.run.seed)
    seed_everything(cfg.run.seed, topology.rank)

    # Data: the index of both splits (the synthetic set is generated here on first use), then the loaders.
    train_split, val_split = open_splits(cfg, topology)
    per_rank_batch = cfg.data.global_batch // topology.world_size
    train_loader = make_loader(cfg, train_split, topology, train=True, batch=per_rank_batch, device=device)
    val_loader = make_loader(cfg, val_split, topology, train=False, batch=cfg.data.eval_batch, device=device)
    steps_per_epoch = len(train_loader)

    # Model, optimizer with the MLPerf parameter groups, precision policy; the schedule as a function of the step.
    if topology.is_main:
        say(describe_dataset(train_split, val_split))
        say(f"precision {policy.describe()}")
        if policy.emulate and policy.compute == "bf16" and cfg.precision.emulate == "auto":
            say("bf16 is emulated: this CPU has no native bf16 kernels (precision.emulate=never forces them)")
        if topology.distributed:
            say(f"{topology.world_size} ranks ({topology.launcher}), BN span {bn_span(cfg, topology.world_size)}")
    backend = build_backend(cfg, len(train_split.classes), device, topology, policy)
    if cfg.mlperf.clock == "device":
        log.clock = backend.now  # from here on the log, and the time-to-train, are in the simulated IPUs' time
    schedule = make_schedule(cfg, steps_per_epoch)

    tensorboard = out_dir / TENSORBOARD if cfg.run.tensorboard else None
    metrics = MetricsCSV(out_dir / METRICS if topology.is_main else None, tensorboard)
    if resumed is None:
        log_hyperparameters(log, hyperparameters(cfg, schedule, topology.world_size, train_split, val_split))
        log.end(constants.INIT_STOP)
        distributed.barrier()  # every rank is ready when the clock starts
        log.start(constants.RUN_START)
        loop = Loop(run_start=log.clock())
    else:
        loop = resume(resumed, backend, log, metrics, topology.rank)

    loaders = (train_loader, val_loader)
    quiet = not topology.is_main
    try:
        status, accuracy = train_to_target(cfg, backend, *loaders, schedule, loop, log, metrics, out_dir, quiet)
    except BaseException as err:  # a bad file under data.corrupt=fail, a lost rank, a stop: the log ends the run
        log.end(constants.RUN_STOP, metadata={constants.STATUS: constants.ABORTED})
        log.close()
        if topology.is_main:
            plot_so_far(metrics, out_dir, cfg.mlperf.target_accuracy)  # a stopped or failed run's epochs so far
        if isinstance(err, StopRequested):
            if topology.is_main:
                where = f"step {loop.step} (epoch {loop.epoch}, {loop.batch} of its {steps_per_epoch} steps done)"
                tell_how_to_resume(err, where, topology, HydraConfig.get().overrides.task, out_dir, [CACHE_ENV])
            distributed.barrier()  # rank 0's checkpoint and log are whole before any rank exits
        raise
    finally:
        for loader in loaders:
            loader.close()  # the workers, now: not left to the exit handlers (Loader.close says why)
    log.end(constants.RUN_STOP, metadata={constants.STATUS: status})
    minutes = (log.clock() - loop.run_start) / 60
    log.close()
    metrics.close()
    if topology.is_main:
        plot_so_far(metrics, out_dir, cfg.mlperf.target_accuracy)
        checkpoint.save_atomically(out_dir / FINAL_WEIGHTS, backend.state_dict()["model"])
        for name in (CHECKPOINT, RESUME_SCRIPT):  # the run is over: nothing is left to resume
            (out_dir / name).unlink(missing_ok=True)
        skipped = {**train_loader.skipped, **val_loader.skipped}
        warned = train_loader.warned | val_loader.warned
        print_summary(status, accuracy, loop.epoch - 1, minutes, out_dir, skipped, warned)
    return status, minutes


def plot_so_far(metrics: MetricsCSV, out_dir: Path, target: float) -> None:
    """metrics.png from the epochs ended so far, on rank 0 (which writes metrics.csv); none before the first."""
    if metrics.path is not None and (rows := metrics.read()):
        plot(rows, out_dir / PLOT, target)


def train_to_target(
    cfg: Config,
    backend: backends.Backend,
    train_loader: Loader,
    val_loader: Loader,
    schedule: Schedule,
    loop: Loop,
    log: MLPerfLogger,
    metrics: MetricsCSV,
    out_dir: Path,
    quiet: bool = False,
) -> tuple[str, float | None]:
    """Epochs in blocks that end with an evaluation, until the target accuracy or the epoch budget.

    Every rank takes the same decisions: the loss and the accuracy they rest on are reduced over the ranks.
    Times are on the log's clock.
    """
    evals = eval_epochs(cfg.run.max_epochs, cfg.mlperf.first_eval, cfg.mlperf.eval_every)
    progress = Progress("none" if quiet else cfg.run.progress, cfg.run.max_epochs, cfg.data.global_batch)
    stop_if_requested = partial(checkpoint_if_stopped, cfg, backend, loop, log, metrics, out_dir)
    timer = EpochTimer(lambda: train_loader.waited_s, lambda: backend.allreduce_s)
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
            loss, lr = train_epoch(backend, train_loader, schedule, loop, progress, stop_if_requested)
            loss = distributed.mean_over_ranks(loss)
            backend.end_epoch()
        except NonFiniteLoss as err:
            say(f"error: {err} in epoch {epoch}; stopping (run_stop aborted)", error=True)
            return constants.ABORTED, accuracy
        images_per_s = (loop.batch - first_batch) * cfg.data.global_batch / (log.clock() - started)
        if not math.isfinite(loss):
            say(f"error: the training loss is {loss} in epoch {epoch}; stopping (run_stop aborted)", error=True)
            return constants.ABORTED, accuracy
        accuracy = None
        if epoch in evals:
            log.end(constants.BLOCK_STOP, metadata={constants.FIRST_EPOCH_NUM: block_first})
            log.start(constants.EVAL_START, metadata={constants.EPOCH_NUM: epoch})
            with timer.evaluating():
                accuracy = evaluate(backend, val_loader)
            log.event(constants.EVAL_ACCURACY, accuracy, metadata={constants.EPOCH_NUM: epoch})
            log.end(constants.EVAL_STOP, metadata={constants.EPOCH_NUM: epoch})
        elapsed = log.clock() - loop.run_start
        row = EpochMetrics(
            epoch, loop.step, lr, loss, images_per_s, accuracy, elapsed, backend.loss_scale, backend.skipped_steps,
            **timer.fractions(),
        )  # fmt: skip
        metrics.append(row)
        progress.end_epoch(epoch_line(cfg.run.max_epochs, row))
        loop.epoch, loop.batch, loop.losses = epoch + 1, 0, []
        if accuracy is not None and accuracy >= cfg.mlperf.target_accuracy:
            return constants.SUCCESS, accuracy
        if epoch < cfg.run.max_epochs:
            stop_if_requested()  # a signal during the evaluation stops the run here, between two epochs
            if cfg.run.checkpoint:
                save_checkpoint(cfg, backend, loop, log, metrics, out_dir)
    return constants.ABORTED, accuracy


def train_epoch(
    backend: backends.Backend,
    loader: Loader,
    schedule: Schedule,
    loop: Loop,
    progress: Progress,
    stop_if_requested: Callable[[], None],
) -> tuple[float, float]:
    """Epoch `loop.epoch` from where it stands (its start, or where a stopped run left it), with a chance to stop
    after each step; returns the epoch's mean loss (one host sync per epoch) and its last lr.

    Updates that loss scaling skipped (non-finite loss or gradients) are left out of the mean.
    """
    loader.set_epoch(loop.epoch, first_batch=loop.batch)
    progress.start_epoch(loop.epoch, loop.batch + len(loader), done=loop.batch)
    for images, labels in loader:
        lr = schedule(loop.step)
        distributed.record_step(loop.step + 1)
        loss = backend.train_step(images, labels, lr)
        loop.step += 1
        loop.batch += 1
        loop.losses.append(loss)
        progress.step(loop.batch, loss, lr)
        stop_if_requested()
    losses = torch.stack(loop.losses)
    finite = losses[torch.isfinite(losses)]
    return float(finite.mean()) if len(finite) else math.inf, schedule(loop.step - 1)


def checkpoint_if_stopped(
    cfg: Config, backend: backends.Backend, loop: Loop, log: MLPerfLogger, metrics: MetricsCSV, out_dir: Path
) -> None:
    """At a step boundary, on every rank: once any rank has received a stop signal, checkpoint where the run
    stands and raise StopRequested."""
    stop = StopRequested.agreed()
    if stop is not None:
        save_checkpoint(cfg, backend, loop, log, metrics, out_dir)
        raise stop


def evaluate(backend: backends.Backend, loader: Loader) -> float:
    """Top-1 accuracy over every validation image, as a fraction; each rank evaluates its share."""
    correct = sum(backend.eval_step(images, labels) for images, labels in loader)
    return int(distributed.sum_over_ranks(torch.as_tensor(correct, device=backend.device))) / len(loader.dataset)


def eval_epochs(max_epochs: int, first: int, every: int) -> set[int]:
    """The MLPerf schedule: every `every` epochs starting at `first`, and the last epoch of the budget."""
    return set(range(first, max_epochs + 1, every)) | {max_epochs}


def restore_point(cfg: Config, out_dir: Path, world_size: int) -> dict | None:
    """The checkpoint to continue from (run.resume=auto and one exists in the output directory), else None.

    A new run never writes into a directory that already holds an MLPerf log: two runs in one log would
    make it fail the checker.
    """
    path = out_dir / CHECKPOINT
    if cfg.run.resume == "auto" and path.exists():
        return checkpoint.load(path, training_fingerprint(cfg) | {"world_size": world_size})
    if (out_dir / cfg.mlperf.log_file).exists():
        state = "a finished run" if (out_dir / FINAL_WEIGHTS).exists() else "a run with no checkpoint to resume"
        advice = "give a new hydra.run.dir"
        if path.exists():
            state = "a stopped run"
            advice = f"continue it with run.resume=auto (as {out_dir / RESUME_SCRIPT} does), or {advice}"
        raise ConfigError("run.resume", f"{out_dir} already holds {state}; {advice}")
    return None


def resume(state: dict, backend: backends.Backend, log: MLPerfLogger, metrics: MetricsCSV, rank: int) -> Loop:
    """Continue exactly where the checkpoint left off; logs written after it are cut back to its sizes, and the
    MLPerf log says where the run was resumed, and where the stopped attempt's whole log is kept."""
    own = state["ranks"][rank]
    try:
        backend.load_state_dict(state["backend"])
        backend.load_rank_state_dict(own["backend"])
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"checkpoint does not fit this model and optimizer: {err}") from err
    checkpoint.set_rng_state(own["rng"])
    loop = Loop(**state["loop"], losses=list(own["losses"].to(backend.device).unbind()))
    metrics.resume(state["log_sizes"]["metrics"], loop.step)
    if log.path is not None:
        attempt = keep_attempt(log.path)
        truncate_to(log.path, state["log_sizes"]["mlperf"])
        log.event(RESUMED, {"step": loop.step, "epoch": loop.epoch, "stopped_attempt_log": attempt.name})
        say(f"resuming at epoch {loop.epoch} (step {loop.step}, {loop.batch} steps into the epoch)")
    return loop


def save_checkpoint(
    cfg: Config, backend: backends.Backend, loop: Loop, log: MLPerfLogger, metrics: MetricsCSV, out_dir: Path
) -> None:
    """Rank 0 writes the checkpoint, with what each rank holds alone: its generator states, its losses of the
    epoch so far and its backend's own state (BatchNorm statistics that the epoch's end has not averaged yet)."""
    own = {
        "rng": checkpoint.rng_state(),
        "losses": torch.stack(loop.losses).cpu() if loop.losses else torch.empty(0),
        "backend": backend.rank_state_dict(),
    }
    ranks = distributed.gather_to_main(own)
    if log.path is None or metrics.path is None:
        return
    checkpoint.save(
        out_dir / CHECKPOINT,
        {
            "backend": backend.state_dict(),
            "loop": {key: value for key, value in vars(loop).items() if key != "losses"},  # losses: per rank
            "ranks": ranks,
            "log_sizes": {"mlperf": log.path.stat().st_size, "metrics": metrics.path.stat().st_size},
            "fingerprint": training_fingerprint(cfg) | {"world_size": len(ranks)},
        },
    )


if __name__ == "__main__":
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let configuration errors reach the handler below as exceptions
    try:
        if not distributed.from_environment().is_main:
            sys.argv += distributed.QUIET_HYDRA
        main()
    except USER_ERRORS as err:  # a mistake in the overrides, found before the run started
        exit_in_one_line(err)
    except PeerLost as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except StopRequested as stop:  # the run was checkpointed and its log ended; resume.sh says how to go on
        sys.exit(stop.exit_status)
    except ValueError as err:  # optuna's answer when a sweep has no best trial; anything else is a bug
        if str(err) != NO_TRIAL_COMPLETED:
            raise
        print("error: no trial of the sweep reached the target, so there is no best one", file=sys.stderr)
        sys.exit(1)
