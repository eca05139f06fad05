"""How a recipe's training curve moves with the host's kernels: eval top-1 per epoch under each kernel setting.

    python -m bench.convergence [--recipe smoke-lars|smoke-sgd|embedded] [--epochs N]
                                [--kernels avx512:AVX512_CORE_AMX,avx512:AVX512_CORE,avx2:AVX2] [--out DIR]

oneDNN and ATen pick kernels by instruction set (capped by ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY, which
reproduce another host's choices here), so the same seed rounds differently on an AMX Xeon, an AVX-512 EPYC and
an AVX2-only CPU. For each setting the recipe runs once with the target at 1.0, so it does not stop at 0.759 and
its whole curve shows; with --epochs N it is stopped by SIGTERM after epoch N, which keeps the recipe's own
schedule (a shorter run.max_epochs would decay the learning rate sooner). The runs go one after another: two at
once on 2 cores slow each other tenfold. Then a table of top-1 per epoch, the first epoch at or above the target
and the best top-1 per setting; the last line is JSON.

The recipes: smoke-lars and smoke-sgd are the convergence tests' (tests/test_run.py), embedded is `make train`'s.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import rundir
from bench.folders import claim
from bench.precision import curves, outcome

REPO = Path(__file__).resolve().parent.parent
RECIPES = {
    "smoke-lars": ["experiment=smoke"],
    "smoke-sgd": ["experiment=smoke", "optim=sgd", "optim.base_lr=0.1"],
    "embedded": [],
}
KERNELS = "avx512:AVX512_CORE_AMX,avx512:AVX512_CORE,avx2:AVX2"  # as `make test-hosts` sets them
TARGET = 0.759


def train(recipe: str, kernels: str, epochs: int | None, run_dir: Path) -> list[dict[str, str]]:
    """The recipe's run under `kernels` ("aten:onednn"), stopped after `epochs` epochs if given; its metrics rows."""
    aten, isa = kernels.split(":")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": isa, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "train.py", *RECIPES[recipe], "mlperf.target_accuracy=1.0", "run.progress=lines"]
    command.append("run.allow_not_converged=true")  # every epoch of the budget is the point: none may stop early
    command.append(f"hydra.run.dir={run_dir}")
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier bench's run (its --out is the bench's own): a new run
    print(f"$ ATEN_CPU_CAPABILITY={aten} ONEDNN_MAX_CPU_ISA={isa} {' '.join(command[1:])}", flush=True)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finished = 0
    for line in process.stdout:
        print(line, end="", flush=True)
        finished += line.startswith("epoch ")
        if finished == epochs:
            process.send_signal(signal.SIGTERM)  # the run checkpoints, ends its log and exits 143
    if process.wait() not in (0, 128 + signal.SIGTERM):
        raise SystemExit(f"error: {' '.join(command[1:])} exited {process.returncode}")
    with (run_dir / rundir.METRICS).open(newline="") as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.convergence", description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=RECIPES, default="smoke-lars")
    parser.add_argument("--epochs", type=int, help="stop each run after this many epochs (default: all of them)")
    parser.add_argument("--kernels", default=KERNELS, help="comma-separated ATEN_CPU_CAPABILITY:ONEDNN_MAX_CPU_ISA")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "convergence")
    args = parser.parse_args(argv)
    settings = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if not settings or any(k.count(":") != 1 for k in settings):
        parser.error(f"--kernels: give ATEN:ONEDNN pairs, e.g. {KERNELS}")
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs must be 1 or more")

    out = claim(args.out, "--out") / args.recipe
    results = {k: outcome(train(args.recipe, k, args.epochs, out / k.replace(":", "-")), TARGET) for k in settings}
    print(f"\n{args.recipe}: eval top-1 per epoch, target at 1.0 (columns: ATEN_CPU_CAPABILITY:ONEDNN_MAX_CPU_ISA)")
    print(curves(results))
    print(f"\n{'kernels':<24} {'first epoch >= ' + str(TARGET):>20} {'best top-1':>11}")
    figures = {}
    for kernels, result in results.items():
        best = max((top1 for _, top1 in result["curve"]), default=None)
        figures[kernels] = {"curve": result["curve"], "epochs_to_target": result["epochs_to_target"], "best": best}
        shown = f"{best:.4f}" if best is not None else "-"
        print(f"{kernels:<24} {result['epochs_to_target'] or 'not reached'!s:>20} {shown:>11}")
    print()
    print(json.dumps({"recipe": args.recipe, "target": TARGET, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
