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
data.build opens the loaders, starting.py is MLPerf's init phase (what trains, built by backends.build, and the log's
first lines), checkpoint's Checkpointer saves and restores the run, ending.py ends it (its run_stop, what it leaves,
the exit status); run.mode=benchmark and run.mode=project are benchmark.py and project.py.
"""

from __future__ import annotations

import stopsignals

stopsignals.catch()  # first: a stop signal during the seconds the imports below take ends the run with its status

import gc
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import distributed
import ending
import starting
from backends import build
from backends.base import Backend, RunFacts
from benchmark import benchmark
from checkpoint.checkpointer import Checkpointer
from configs.checks import ConfigError
from configs.schema import Config, register, training_fingerprint, validate
from data.build import make_loader, open_splits
from data.loading.loader import Loader
from data.sources.synthetic import CACHE_ENV
from distributed.stop import Resume, agreed_stop
from mlperf_logs.logger import SKIPPED_FILES, constants
from monitor.metrics import EpochMetrics, EpochTimer
from monitor.progress import Progress, epoch_line, job_log, say
from optim.precision import NonFiniteLoss
from project import listed_cuts, project
from starting import Run

register()


@dataclass(frozen=True)
class Job:
    """What Hydra says of this job, read once and passed where it is needed."""

    output_dir: Path
    sweep: bool  # one job of a sweep (-m): its sweeper decides what a failed job means
    overrides: list[str]  # the command line's, as Hydra parsed them
    experiment: str
    launcher: str | None

    @classmethod
    def of(cls, hydra_cfg: HydraConf) -> Job:
        choices = hydra_cfg.runtime.choices
        sweep = hydra_cfg.mode == RunMode.MULTIRUN
        output_dir = Path(hydra_cfg.runtime.output_dir)
        return cls(
            output_dir, sweep, list(hydra_cfg.overrides.task), choices["experiment"], choices.get("hydra/launcher")
        )


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(raw: DictConfig) -> float | None:
    """One run; returns what a sweeper (-m) minimises: the time-to-train in minutes, None without one."""
    job = Job.of(HydraConfig.get())
    try:
        with ending.raised_in_the_run():  # what run raises is its own, not Hydra's (ending.hydras_failed_write)
            return run(raw, job)
    except ending.ERRORS as err:
        if job.sweep:
            raise  # its sweeper decides: Optuna's marks the trial failed, the SLURM launcher requeues a lost rank's job
        ending.leave(err, job.output_dir)


def run(raw: DictConfig, job: Job) -> float | None:
    """The config checked (a ConfigError names the first wrong value), then the mode it names: train, benchmark or
    project; returns what main returns."""
    topology = distributed.from_environment()
    if not job.sweep and job.launcher not in (None, "basic"):  # without -m, Hydra would run here and ignore it
        raise ConfigError(
            "hydra/launcher", f"{job.launcher} launches the jobs of a sweep: add -m (python train.py -m ...)"
        )
    cfg = OmegaConf.to_object(raw)
    assert isinstance(cfg, Config)  # the schema is the base of every composed config (register)
    shape = validate(cfg, topology.world_size)  # how each global batch deals over the ranks: worked out once
    if listed_cuts(cfg, shape):  # device.pipeline_splits=list: where the model can be cut, and nothing more
        return None
    with distributed.process_group(topology, cfg.device.name, cfg.dist.timeout_s):
        if cfg.run.mode == "benchmark":
            benchmark(cfg, build.run_facts(cfg, topology, shape))
        elif cfg.run.mode == "project":
            project(cfg, shape, job.output_dir if topology.is_main else None, job.overrides, job.experiment)
        else:
            out_dir = distributed.agree_on_output_dir(job.output_dir)
            facts = build.run_facts(cfg, topology, shape)  # this rank's device, its precision policy, the shape
            with job_log():  # train.log holds what the terminal shows
                status, minutes = train(cfg, facts, out_dir, job, resolved=OmegaConf.to_yaml(raw, resolve=True))
            if status != constants.SUCCESS and not job.sweep and not cfg.run.allow_not_converged:
                raise ending.NotConverged(cfg.mlperf.target_accuracy)  # a script or a scheduler tells it from a success
            # A sweeper minimises the time-to-train; a run that missed the target gives None, which Optuna's marks
            # failed (a NaN would make optuna 2.10's `tell` raise and stop the whole sweep).
            return minutes if status == constants.SUCCESS else None
    return None


def train(cfg: Config, facts: RunFacts, out_dir: Path, job: Job, resolved: str) -> tuple[str, float]:
    """The run from its log's init_start (or the checkpoint it resumes) to its run_stop; returns its status and
    its time-to-train in minutes."""
    topology = facts.topology
    fingerprint = training_fingerprint(cfg, topology.world_size)  # what a checkpoint shares with the run resuming it
    resume = Resume.of(topology, job.overrides, out_dir, [CACHE_ENV])  # the command that continues the run
    checkpoints = Checkpointer(out_dir, topology.is_main, fingerprint, resume, cfg.run)
    checkpoint = checkpoints.restore_point(cfg.mlperf.log_file)
    distributed.seed_everything(cfg.run.seed, topology.rank)

    # Data: the index of both splits (the synthetic set is generated here on first use), then the loaders; a set
    # the run cannot use is refused here, before the run has a log or a config.yaml (and so no folder).
    splits = open_splits(cfg.data, topology)
    train_loader = make_loader(cfg.data, splits[0], facts, seed=cfg.run.seed, train=True)
    val_loader = make_loader(cfg.data, splits[1], facts, seed=cfg.run.seed, train=False)
    with train_loader, val_loader:  # the workers end with the run, however it ends (Loader.close says why)
        # A stop, a refusal or a failure before the clock starts: the same command again.
        with ending.forgotten_unless_started(out_dir, cfg.mlperf.log_file, topology.is_main):
            loaders = (train_loader, val_loader)
            fresh = checkpoint is None
            run = starting.initialise(cfg, facts, out_dir, splits, loaders, resolved, checkpoints, fresh=fresh)
            if checkpoint is not None:
                starting.resume(run, checkpoint)
        with stopsignals.running():  # from here a stop signal waits for the next step boundary
            try:
                if checkpoint is None:
                    run.log.start(constants.RUN_START)
                    run.loop.run_start = run.log.clock()
                status, accuracy = train_to_target(run)
            except BaseException as err:  # a bad file, a lost rank, a stop, a full disk: the log ends the run
                lost = distributed.as_lost_peer(err)  # a collective that failed, as the rank it lost
                ending.end_stopped(run, lost or err)
                if lost is not None and lost is not err:
                    raise lost from err
                raise
    return ending.finish(run, status, accuracy)


def train_to_target(run: Run) -> tuple[str, float | None]:
    """Epochs in blocks that end with an evaluation, until the target accuracy or the epoch budget.

    Every rank takes the same decisions: the loss and the accuracy they rest on are reduced over the ranks.
    Times are on the log's clock.
    """
    cfg, backend, log, loop = run.cfg, run.backend, run.log, run.loop
    evals, global_batch = cfg.mlperf.eval_epochs(cfg.run.max_epochs), run.facts.shape.global_batch
    quiet = not run.topology.is_main
    progress = Progress("none" if quiet else cfg.run.progress, cfg.run.max_epochs, global_batch)
    timer = EpochTimer(lambda: run.train_loader.waited_s, lambda: backend.allreduce_s)
    accuracy: float | None = None
    for epoch in range(loop.epoch, cfg.run.max_epochs + 1):
        timer.start()
        block_first = max((e + 1 for e in evals if e < epoch), default=1)
        if epoch == block_first and loop.epoch_step == 0:
            block_last = min(e for e in evals if e >= epoch)
            log.start(
                constants.BLOCK_START,
                metadata={constants.FIRST_EPOCH_NUM: epoch, constants.EPOCH_COUNT: block_last - epoch + 1},
            )
        started, first_step = log.clock(), loop.epoch_step
        try:
            loss, lr = train_epoch(run, progress)
        except NonFiniteLoss as err:
            say(f"error: {err} in epoch {epoch}; stopping (run_stop aborted)", error=True)
            return constants.ABORTED, accuracy
        backend.end_epoch()
        images_per_s = (loop.epoch_step - first_step) * global_batch / (log.clock() - started)
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
        loop.epoch, loop.epoch_step, loop.losses = epoch + 1, 0, []
        if accuracy is not None and accuracy >= cfg.mlperf.target_accuracy:
            return constants.SUCCESS, accuracy
        if epoch < cfg.run.max_epochs:
            stop_if_requested(run)  # a signal during the evaluation stops the run here, between two epochs
            if run.checkpoints.at_epoch_ends:
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
    after each host call of the backend's steps (each step, where they run here); returns the epoch's mean loss over
    the ranks (one host sync per epoch) and its last lr.

    Updates that loss scaling skipped (non-finite loss or gradients) are left out of the mean; an epoch with no
    finite loss raises NonFiniteLoss, as loss scaling does after too many skips in a row.
    """
    loop, backend, schedule = run.loop, run.backend, run.schedule
    run.train_loader.set_epoch(loop.epoch, first_batch=loop.epoch_step)
    progress.start_epoch(loop.epoch, loop.epoch_step + len(run.train_loader), done=loop.epoch_step)
    due = False  # a checkpoint came due (run.checkpoint_every_steps) in the call under way
    for images, labels in run.train_loader:
        lr = schedule(loop.step)
        distributed.record_step(loop.step + 1)
        loss = backend.train_step(images, labels, lr)
        loop.step += 1
        loop.epoch_step += 1
        loop.losses.append(loss)
        due = due or run.checkpoints.due_within_epoch(loop, run.steps_per_epoch)
        if not call_ends(loop.epoch_step, backend.steps_per_call, run.steps_per_epoch):
            continue  # the device runs on through the call's steps, without the host
        backend.end_call()
        progress.step(loop.epoch_step, loss, lr)
        stop_if_requested(run)
        if due and loop.epoch_step < run.steps_per_epoch:  # the epoch's end saves its last step
            save(run)
        due = False
    losses = torch.stack(loop.losses)
    finite = losses[torch.isfinite(losses)]
    mean = distributed.mean_over_ranks(float(finite.mean()) if len(finite) else math.inf)
    if not math.isfinite(mean):
        raise NonFiniteLoss(f"the training loss is {mean}")
    return mean, schedule(loop.step - 1)


def call_ends(epoch_step: int, steps_per_call: int | None, steps_per_epoch: int) -> bool:
    """Whether the host's call of the device ends after the epoch's `epoch_step`-th step: every `steps_per_call`
    steps of the epoch (None: the whole epoch), and at the epoch's end, which ends the call under way."""
    return epoch_step == steps_per_epoch or (steps_per_call is not None and epoch_step % steps_per_call == 0)


def stop_if_requested(run: Run) -> None:
    """At a step boundary, on every rank: once any rank has received a stop signal, checkpoint where the run
    stands and raise StopRequested."""
    stop = agreed_stop()
    if stop is not None:
        save(run)
        raise stop


def save(run: Run) -> None:
    """The run's checkpoint, written by rank 0 with every rank's own state."""
    run.checkpoints.save(run.backend, run.loop, run.log_sizes)


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
    except (*ending.USER_ERRORS, OSError, ValueError) as err:  # the overrides, Hydra's run directory, a sweep's end
        ending.leave_before_the_run(err)
        raise
