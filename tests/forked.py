"""`python train.py OVERRIDES` forked from a warm interpreter: multiprocessing's fork server imports torch, Hydra and
train.py's modules once for the session (PRELOAD), and each run is a fork of it that becomes train.py's __main__,
a process of its own with its own stdout, stderr and exit status. A new interpreter spends seconds on those imports
(about 5 s on a 2-core AVX2 host), dozens of times a suite.

A fork is not a new interpreter in two ways, so the tests that depend on them start `python train.py` themselves:
its command line is the fork server's, which names no run (tests find a run's processes, its loader's workers, by
their command line: conftest.processes_mentioning), and torch read the environment as the fork server imported it
(the CPU kernels' variables, the thread counts): the environment a run is given reaches the run, not that import."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing import connection, forkserver
from multiprocessing.process import BaseProcess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What the fork server imports before its first fork: torch, and what train.py (its plot's matplotlib too) and the
# tests' ranks (tests/ranks.py) import.
PRELOAD = ["torch", "torch.distributed", "torchvision", "hydra", "matplotlib.figure", "matplotlib.backends.backend_agg"]
PRELOAD += ["starting", "ending", "benchmark", "project", "tests.conftest"]


def fork_server() -> multiprocessing.context.ForkServerContext:
    """multiprocessing's fork server, told what to import before its first fork."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    return multiprocessing.get_context("forkserver")


def start_fork_server() -> None:
    """Start the fork server now: it imports PRELOAD while the first tests run, and a tool under test that asks for a
    fork server with imports of its own (bench.allreduce) finds this one."""
    fork_server()
    forkserver.ensure_running()


def _become_train_py(argv: Sequence[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the fork: `python train.py ARGV` in the repo with `env`, writing to the files named, ending as the
    interpreter would (SystemExit's status; atexit's handlers run)."""
    os.chdir(REPO)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        with open(path, "wb") as file:
            os.dup2(file.fileno(), fd)
    sys.argv = ["train.py", *argv]
    try:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    finally:
        atexit._run_exitfuncs()


def run_forked(
    runs: Sequence[Sequence[str]], env: dict[str, str], timeout: float, at_once: int = 1
) -> list[subprocess.CompletedProcess[str]]:
    """Each of `runs` (train.py's arguments) forked (see above) with `env`, `at_once` at a time; returns the finished
    processes in order, as subprocess.run does (a negative status: killed by that signal)."""
    commands = [[sys.executable, "train.py", *argv] for argv in runs]
    finished: dict[int, subprocess.CompletedProcess[str]] = {}
    running: dict[int, tuple[BaseProcess, float]] = {}  # by index: the fork and its deadline
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for i in range(len(runs)):
                while len(running) == at_once:
                    finished.update(_reap(running, commands, tmp, timeout))
                outputs = (f"{tmp}/{i}.out", f"{tmp}/{i}.err")
                process = fork_server().Process(target=_become_train_py, args=(runs[i], env, *outputs))
                process.start()
                running[i] = process, time.monotonic() + timeout
            while running:
                finished.update(_reap(running, commands, tmp, timeout))
        finally:
            for process, _ in running.values():
                process.kill()
                process.join()
    return [finished[i] for i in range(len(runs))]


def _reap(
    running: dict[int, tuple[BaseProcess, float]], commands: list[list[str]], tmp: str, timeout: float
) -> dict[int, subprocess.CompletedProcess[str]]:
    """Waits until one of the `running` forks ends (or passes its deadline: TimeoutExpired); takes the ended ones out
    of `running` and returns them, finished."""
    connection.wait([process.sentinel for process, _ in running.values()], timeout=1)
    ended = {}
    for i, (process, deadline) in list(running.items()):
        if process.exitcode is None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(commands[i], timeout)
        if process.exitcode is not None:
            del running[i]
            out, err = Path(f"{tmp}/{i}.out").read_text(), Path(f"{tmp}/{i}.err").read_text()
            ended[i] = subprocess.CompletedProcess(commands[i], process.exitcode, out, err)
    return ended


def stopped_forked(
    argv: Sequence[str], env: dict[str, str], ready: Callable[[], bool], signum: int, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """train.py forked (see above) with `env`, sent `signum` once `ready()` holds (polled every 5 ms); the ended
    process as subprocess.run gives it (a negative status: killed by that signal)."""
    command = [sys.executable, "train.py", *argv]
    with tempfile.TemporaryDirectory() as tmp:
        outputs = (f"{tmp}/out", f"{tmp}/err")
        process = fork_server().Process(target=_become_train_py, args=(argv, env, *outputs))
        process.start()
        try:
            deadline = time.monotonic() + timeout
            while not ready():
                if process.exitcode is not None or time.monotonic() > deadline:
                    output = Path(outputs[0]).read_text() + Path(outputs[1]).read_text()
                    raise AssertionError(f"the run ended or hung before the point to stop it: {output}")
                time.sleep(0.005)
            os.kill(process.pid, signum)
            process.join(timeout=120)
        finally:
            process.kill()
            process.join()
        out, err = Path(outputs[0]).read_text(), Path(outputs[1]).read_text()
    return subprocess.CompletedProcess(command, process.exitcode, out, err)
