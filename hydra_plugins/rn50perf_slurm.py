"""Hydra's SLURM launcher (hydra-submitit-launcher), made to carry runs through a real cluster.

configs/hydra/launcher/slurm.yaml names `SlurmLauncher`. What it adds to the stock launcher, and why:
- The task travels by name. The stock launcher pickles train.py's task by value: cloudpickle copies what `__main__`
  defines together with every global its code touches, and fails on the first one that cannot be pickled
  (`TypeError: cannot pickle '_Classes' object`: torch.classes, reached through `torch` and any attribute that
  happens to be called `classes`). Here a job imports the script and takes the task from it.
- A job imports the project wherever the multirun was launched from: its script puts the repository on PYTHONPATH.
- Only rank 0's Hydra writes the job's directory (.hydra/ and the job's log), as under torchrun.
- srun ends a job's tasks once one exits on error (--kill-on-bad-exit): the survivors of a lost rank stop, and a
  frozen rank with them.
- Every job runs with run.resume=auto, so a job that SLURM requeues (`scontrol requeue`, preemption) continues from
  its checkpoint. A run that SIGUSR1 stopped (SLURM's warning before the time limit, `--signal=USR1@N`) requeues
  its own job, as submitit's checkpointing would; so does one that lost a rank (a node, a link, a frozen task), up to
  MAX_REQUEUES times; after a SIGTERM the job follows SLURM's decision (requeued, preempted or cancelled).
- A job's process notes the stop signals from the moment it loads this module (stopsignals), before torch's
  seconds of imports, and raises one it noted as the task starts: SLURM may send its warning up to a minute early,
  and a job warned while it starts requeues itself too.
"""

from __future__ import annotations

import os

import stopsignals

if "SUBMITIT_FOLDER" in os.environ:  # a job's process (submitit's process_job sets it before it loads the task)
    stopsignals.catch(at_once=False)  # noted until the task starts (SlurmLauncher.__call__)

import contextlib
import importlib.util
import io
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import TaskFunction
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import DictConfig

from distributed.group import PeerLost
from distributed.topology import QUIET_HYDRA, LaunchError, from_environment
from stopsignals import StopRequested

REPO = Path(__file__).resolve().parent.parent  # this file is in its hydra_plugins/, where Hydra looks for launchers
RESUME = "run.resume=auto"
MAX_REQUEUES = 3  # a job that keeps losing a rank stops being requeued (as examples/slurm/train.sbatch's MAX_REQUEUES)


class ScriptTask(NamedTuple):  # not a dataclass: Hydra's plugin scan runs this module before it is in sys.modules
    """A `@hydra.main` task function named by its script and name, which a job imports to call it."""

    script: str
    name: str

    @classmethod
    def of(cls, task: TaskFunction) -> TaskFunction:
        """`task` itself if it lives in an importable module; a ScriptTask if the running script defines it."""
        if task.__module__ != "__main__":
            return task
        script = sys.modules["__main__"].__file__
        assert script is not None  # the running script, which defines the task
        # mypy takes no NamedTuple for a Callable, __call__ or not (python/mypy#9858)
        return cls(str(Path(script).resolve()), task.__name__)  # type: ignore[return-value]

    def __call__(self, cfg: DictConfig) -> Any:
        name = Path(self.script).stem
        spec = importlib.util.spec_from_file_location(name, self.script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the script defines them
        spec.loader.exec_module(module)
        return getattr(module, self.name).__wrapped__(cfg)  # the function that @hydra.main wrapped


class SlurmLauncher(SubmititSlurmLauncher):
    """Each job of a multirun is one SLURM job of `tasks_per_node` x `nodes` ranks (see the module's docstring)."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        on_path = f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"
        self.params["setup"] = [on_path, *(self.params.get("setup") or [])]
        # A rank that exits on error (a lost peer) ends the job's other tasks, a frozen one among them.
        self.params["srun_args"] = ["--kill-on-bad-exit=1", *(self.params.get("srun_args") or [])]

    def setup(self, *, hydra_context: Any, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=ScriptTask.of(task_function), config=config)
        # The sweeper makes the sweep's folder after this, as the sweep begins: a folder already there is the user's.
        self.sweep_folder_was_there = Path(config.hydra.sweep.dir).exists()

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """The stock launch; a cluster that cannot take the jobs (no sbatch here, its controller out of reach) is
        told in one line, sbatch's last, in place of submitit's traceback and of sbatch's own lines (which submitit
        prints before it raises), and the sweep's folder, which then holds no job, goes if the sweep made it."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        assert self.config is not None  # Hydra calls setup first
        sweep = Path(self.config.hydra.sweep.dir)
        printed = io.StringIO()  # what submitit prints while it submits and waits: passed on once the jobs end
        try:
            with contextlib.redirect_stderr(printed):
                jobs = super().launch(job_overrides, initial_job_idx)
        except FileNotFoundError as err:
            forget_unsubmitted_sweep(sweep, made_by_this_sweep=not self.sweep_folder_was_there)
            raise LaunchError(
                f"hydra/launcher=slurm: {err.filename or 'sbatch'} is not on this machine's PATH"
            ) from err
        except (FailedJobError, FailedSubmissionError) as err:
            if submitted(sweep):
                sys.stderr.write(printed.getvalue())  # a job that ran and failed: everything submitit said
                raise
            forget_unsubmitted_sweep(sweep, made_by_this_sweep=not self.sweep_folder_was_there)
            said = [line.strip() for line in str(err).splitlines() if line.strip()] or ["no reason given"]
            raise LaunchError(f"hydra/launcher=slurm: sbatch could not submit the jobs: {said[-1]}") from err
        sys.stderr.write(printed.getvalue())
        return jobs

    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        """One task of a job: rank `SLURM_PROCID` of the run."""
        is_main = from_environment().is_main
        overrides = [*sweep_overrides, RESUME, *([] if is_main else QUIET_HYDRA)]
        try:
            stopsignals.catch()  # in place of submitit's handlers (which drop SIGTERM); one noted so far raises here
            result = super().__call__(overrides, job_dir_key, job_num, job_id, singleton_state)
        except StopRequested as stop:  # checkpointed and its log ended, or not started: the requeued job goes on
            if stop.signum == signal.SIGUSR1 and is_main:
                requeue_this_job()
            raise SystemExit(stop.code) from None
        if result.status == JobStatus.FAILED:
            try:
                _ = result.return_value  # raises what the run raised
            except PeerLost as lost:  # the log ended; the last checkpoint continues the run in the requeued job
                if is_main and int(os.environ.get("SLURM_RESTART_COUNT", 0)) < MAX_REQUEUES:
                    requeue_this_job()
                raise SystemExit(lost.exit_status) from None
        return result


def submitted(sweep: Path) -> bool:
    """Whether a job of the sweep in this folder reached SLURM: submitit makes a folder for each job it submitted."""
    return any(path.is_dir() for path in (sweep / ".submitit").glob("*"))


def forget_unsubmitted_sweep(folder: Path, made_by_this_sweep: bool) -> None:
    """Remove the folder of a sweep none of whose jobs reached SLURM, if the sweep made it and it holds only what
    Hydra and submitit wrote before sbatch (multirun.yaml, .submitit's submission files). A folder that was there
    before is the user's: nothing in it is removed."""
    if made_by_this_sweep and {path.name for path in folder.iterdir()} <= {"multirun.yaml", ".submitit"}:
        shutil.rmtree(folder, ignore_errors=True)


def requeue_this_job() -> None:
    """Put this batch job back in SLURM's queue, where it keeps its id (and so its run directory). SLURM ends the
    running one; the requeued one becomes eligible to start about two minutes later."""
    job = os.environ["SLURM_JOB_ID"]
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if result.returncode == 0:
        print(f"job {job} requeued: it resumes from the checkpoint", file=sys.stderr, flush=True)
    else:
        print(f"error: scontrol requeue {job} failed: {result.stderr.strip()}", file=sys.stderr, flush=True)
