"""Stage `smoke`: `train.py experiment=smoke` on the GPU, as a user starts it, to its target, its JPEGs decoded on
the GPU (`data.decode=gpu`: data.decode=auto could leave the smoke set's small files to the workers); then its MLPerf
log through mlperf_logging's compliance checker (mlperf_logs.summarize reads and judges it as for any run)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import rundir
from bench.gpu import stage
from data.sources.synthetic import CACHE_ENV
from mlperf_logs.summarize import SUCCESS, summarize_run


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    out = args.work / "smoke"
    shutil.rmtree(out, ignore_errors=True)  # a new run each time
    overrides = ["experiment=smoke", f"device={stage.device().type}", "data.decode=gpu", f"hydra.run.dir={out}",
                 "run.progress=lines"]  # fmt: skip
    env = {**os.environ, CACHE_ENV: str(args.work / "cache"), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "train.py", *overrides]  # the same run in the rehearsal: smaller ones miss the target
    finished = subprocess.run(command, env=env, text=True, capture_output=True, check=False)
    print(finished.stdout[-4000:], finished.stderr[-4000:], sep="\n")
    if finished.returncode != 0:
        raise SystemExit(f"train.py exited {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}")
    result = summarize_run(rundir.mlperf_log(out))  # judged by the compliance checker too
    if result.status != SUCCESS:
        raise SystemExit(f"the run's log says {result.status!r}: {result.note}")
    return {
        "run_status": result.status,
        "epochs_to_target": result.epochs_to_target,
        "accuracy": result.accuracy[-1][1],
        "time_to_train_min": round(result.time_to_train_min, 3),
        "train_img_s": round(result.train_img_s, 1),
        "checker": "passed",
        "decode": "gpu",
    }


if __name__ == "__main__":
    sys.exit(stage.main(run))
