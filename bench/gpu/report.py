"""gpu.md: the GPU check's figures (gpu.json) as the tables docs/gpu.md keeps."""

from __future__ import annotations

import datetime

Figures = dict[str, object]
STEP_NOTES = {
    "bare": "torchvision ResNet-50, autocast bf16, fused SGD, channels-last: no harness code",
    "bare_compiled": "the bare loop with the model through torch.compile",
    "bare_again": "the bare loop timed again, last (the noise between two timings)",
    "base": "harness bf16, every speed option off",
    "defaults": "harness, precision=bf16 and the device's defaults (what device=cuda gives)",
    "eager": "harness, the defaults without device.compile and device.cuda_graphs",
}


def table(stages: dict[str, Figures]) -> str:
    lines = [f"# GPU check, {datetime.date.today().isoformat()}", ""]
    env = stages.get("env", {})
    if "gpu" in env:
        versions = ", ".join(f"{k} {env[k]}" for k in ("python", "torch", "torchvision", "cuda", "cudnn") if k in env)
        lines += [f"{env['gpu']}; {versions}", ""]
    lines += ["| stage | status | seconds | notes |", "|---|---|---|---|"]
    for name, stage in stages.items():
        lines.append(f"| {name} | {stage['status']} | {stage.get('seconds', '')} | {_notes(name, stage)} |")
    lines += _step(stages.get("step", {})) + _loader(stages) + _train(stages) + _e2e(stages.get("e2e", {}))
    return "\n".join(lines) + "\n"


def winners(stages: dict[str, Figures]) -> Figures:
    """What won, for the defaults to be set from: each speed option against base, the fastest step's settings,
    the faster decode path at each worker count and overall, the fastest train.py run."""
    found: Figures = {}
    rows = stages.get("step", {}).get("rows", {})
    base = _step_rate(stages, "base")
    options = {name[1:]: _rate(row) for name, row in rows.items() if name.startswith("+")}
    if base:
        found["options_over_base"] = {name: round(rate / base, 3) if rate else None for name, rate in options.items()}
    if "best" in stages.get("step", {}):
        found["step"] = stages["step"]["best"]
    loader = stages.get("loader", {}).get("img_s_by_workers", {})
    if loader:
        found["loader"] = max(loader, key=loader.get)
        found["decode_by_workers"] = _faster_decode(loader)
    runs = {name: run["img_s"] for name, run in stages.get("train", {}).get("runs", {}).items() if _rate(run)}
    if runs:
        found["train"] = max(runs, key=runs.get)
    return found


def _faster_decode(loader: dict[str, float]) -> dict[str, str]:
    """For each worker count measured both ways ("8" and "gpu/8"), the decode path that was faster."""
    return {
        workers: "gpu" if loader[f"gpu/{workers}"] > rate else "cpu"
        for workers, rate in loader.items()
        if f"gpu/{workers}" in loader
    }


def _notes(name: str, stage: Figures) -> str:
    if "error" in stage:
        return str(stage["error"]).replace("|", "/")[-400:]
    if name in ("step", "loader", "train", "e2e"):
        return "figures below"
    shown = {k: v for k, v in stage.items() if k not in ("status", "seconds")}
    return ", ".join(f"{k}: {v}" for k, v in shown.items()).replace("|", "/")


def _rate(row: object) -> float | None:
    return row.get("img_s") if isinstance(row, dict) else None


def _step_rate(stages: dict[str, Figures], row: str) -> float | None:
    """The img/s of the step stage's `row`, None where it was not measured."""
    return _rate(stages.get("step", {}).get("rows", {}).get(row))


def _step(step: Figures) -> list[str]:
    rows = step.get("rows", {})
    if not rows:
        return []
    bare = _rate(rows.get("bare"))
    lines = [
        "",
        f"## The step: batch {step.get('batch')} at {step.get('image')} px, input already on the device",
        "",
        "| row | img/s | peak GiB | over bare | what |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        what = STEP_NOTES.get(name, f"harness bf16, speed options off but {name[1:]}")
        if name == "best":
            what = f"harness, the fastest measured: {' '.join(map(str, step.get('best', [])))}"
        if isinstance(row, str):
            lines.append(f"| {name} | {row} | | | {what} |")
            continue
        ratio = f"{row['img_s'] / bare:.2f}x" if bare else ""
        lines.append(f"| {name} | {row['img_s']} | {row.get('peak_gib', '')} | {ratio} | {what} |")
    return lines


def _loader(stages: dict[str, Figures]) -> list[str]:
    loader = stages.get("loader", {})
    workers = loader.get("img_s_by_workers", {})
    if not workers:
        return []
    step = _step_rate(stages, "best")
    title = f"## The input pipeline: batch {loader.get('batch')} at {loader.get('image')} px, ImageNet-like JPEGs"
    lines = ["", title, "", "| workers (gpu/: decoded on the device) | img/s | over the best step |", "|---|---|---|"]
    for count, rate in workers.items():
        lines.append(f"| {count} | {rate} | {f'{rate / step:.2f}x' if step else ''} |")
    return lines


def _train(stages: dict[str, Figures]) -> list[str]:
    train = stages.get("train", {})
    runs = train.get("runs", {})
    if not runs:
        return []
    best, compiled = _step_rate(stages, "best"), _step_rate(stages, "bare_compiled")
    title = f"## train.py: batch {train.get('batch')} at {train.get('image')} px, {train.get('epochs')} epochs"
    header = "| run | img/s (median epoch but the first) | from mlperf.log | over the best step | over bare_compiled |"
    lines = ["", title, "", header, "|---|---|---|---|---|"]
    for name, run in runs.items():
        if not isinstance(run, dict):
            lines.append(f"| {name} | {run} | | | |")
            continue
        rate = run["img_s"]
        over = [f"{rate / peer:.2f}x" if peer else "" for peer in (best, compiled)]
        lines.append(f"| {name} | {rate} | {run.get('log_train_img_s')} | {over[0]} | {over[1]} |")
    return lines


def _e2e(e2e: Figures) -> list[str]:
    if "img_s" not in e2e:
        return []
    lines = ["", f"## End to end: {e2e['img_s']} img/s (the loader feeding the step; {e2e.get('overrides')})"]
    if "projected_ttt_min" in e2e:
        lines += [
            "",
            f"Projected time to train ImageNet to 75.9 % on this one GPU at that rate: {e2e['projected_ttt_min']} min"
            f" (experiment=imagenet's epochs and evaluations; evaluation at {e2e.get('eval_img_s')} img/s, the"
            " step stage's best row, or assumed at 3x the training rate)",
        ]
    return lines
