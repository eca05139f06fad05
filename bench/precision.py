"""Does the precision policy change what training reaches? The embedded task under each policy, same seed.

    python -m bench.precision [--out DIR] [--policies fp32,fp16.32,fp16.16,fp16.16-nosr] [OVERRIDE ...]

Each policy trains the embedded task (`python train.py`, the default recipe, with the same seed and schedule)
into DIR/<policy>/. Then a table of final top-1 and epochs to the target, a PNG of top-1 against epoch
(DIR/precision.png), and a demonstration of why 16-bit master weights need stochastic rounding: 1,000 updates
of 1e-4 to weights of 1.0, in fp32, in fp16 rounded to nearest, and in fp16 rounded stochastically. The last
line is JSON. Extra arguments are passed to every run as overrides (e.g. run.max_epochs=8).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

import rundir
from bench.folders import claim
from optim.stochastic_rounding import accumulate_small_updates

REPO = Path(__file__).resolve().parent.parent
POLICIES = {
    "fp32": ["precision=fp32"],
    "fp16.32": ["precision=fp16.32"],
    "fp16.16": ["precision=fp16.16"],
    "fp16.16-nosr": ["precision=fp16.16", "precision.stochastic_rounding=false", "precision.name=fp16.16-nosr"],
}
STALL = {"start": 1.0, "step": 1e-4, "count": 1000, "weights": 10_000}


def train(policy: str, out: Path, overrides: list[str]) -> list[dict[str, str]]:
    """One run of train.py under `policy`; its metrics.csv rows."""
    run_dir = out / policy
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier bench's run (`out` is the bench's own): a new run
    command = [sys.executable, "train.py", *POLICIES[policy], f"hydra.run.dir={run_dir}", *overrides]
    command.append("run.allow_not_converged=true")  # a policy that misses the target is a finding, not a failure
    print(f"$ {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    with (run_dir / rundir.METRICS).open(newline="") as f:
        return list(csv.DictReader(f))


def outcome(rows: list[dict[str, str]], target: float) -> dict[str, object]:
    evals = [(int(r["epoch"]), float(r["eval_accuracy"])) for r in rows if r["eval_accuracy"]]
    reached = next((epoch for epoch, accuracy in evals if accuracy >= target), None)
    return {
        "top1": evals[-1][1] if evals else None,
        "epochs_to_target": reached,
        "skipped_steps": int(rows[-1]["skipped_steps"]) if rows else 0,
        "curve": evals,
    }


def stall() -> dict[str, float]:
    """The mean of many weights after many small updates: fp32, fp16 to nearest, fp16 stochastic."""
    weights = torch.full((STALL["weights"],), STALL["start"])
    args = (weights, STALL["step"], STALL["count"])
    generator = torch.Generator().manual_seed(0)
    return {
        "fp32": float(accumulate_small_updates(*args, torch.float32, stochastic=False).float().mean()),
        "fp16_nearest": float(accumulate_small_updates(*args, torch.float16, stochastic=False).float().mean()),
        "fp16_stochastic": float(
            accumulate_small_updates(*args, torch.float16, stochastic=True, generator=generator).float().mean()
        ),
    }


def draw(results: dict[str, dict[str, object]], target: float, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, result in results.items():
        curve = result["curve"]
        if curve:
            ax.plot(*zip(*curve, strict=True), "o-", label=policy)
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("eval top-1")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves(results: dict[str, dict[str, object]]) -> str:
    """The plot's curves as text: eval top-1 per epoch (rows) under each policy (columns)."""
    tops = {policy: dict(result["curve"]) for policy, result in results.items()}
    epochs = sorted({epoch for curve in tops.values() for epoch in curve})
    width = max([13, *map(len, tops)])
    lines = [f"{'epoch':>5} " + " ".join(f"{policy:>{width}}" for policy in tops)]
    for epoch in epochs:
        cells = (f"{tops[p][epoch]:.4f}" if epoch in tops[p] else "-" for p in tops)
        lines.append(f"{epoch:>5} " + " ".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "precision")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--target", type=float, default=0.759)
    parser.add_argument("overrides", nargs="*", help="train.py overrides for every run")
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    claim(args.out, "--out")
    results = {p: outcome(train(p, args.out, args.overrides), args.target) for p in policies}
    draw(results, args.target, args.out / "precision.png")

    print(f"\n{'policy':<14} {'final top-1':>11} {'epochs to target':>17} {'skipped steps':>14}")
    for policy, r in results.items():
        top1 = f"{r['top1']:.4f}" if r["top1"] is not None else "-"
        print(f"{policy:<14} {top1:>11} {r['epochs_to_target'] or 'not reached':>17} {r['skipped_steps']:>14}")
    print(f"\neval top-1 per epoch (the plot's curves)\n{curves(results)}")
    demo = stall()
    print(
        f"\n{STALL['count']} updates of {STALL['step']:g} to {STALL['start']:g} (mean of {STALL['weights']} weights): "
        f"fp32 {demo['fp32']:.4f}, fp16 to nearest {demo['fp16_nearest']:.4f}, "
        f"fp16 stochastic {demo['fp16_stochastic']:.4f}"
    )
    print(f"plot: {args.out / 'precision.png'}\n")
    summary = {p: {k: v for k, v in r.items() if k != "curve"} for p, r in results.items()}
    print(json.dumps({**summary, "stall": demo}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
