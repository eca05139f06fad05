"""gpu.md: the GPU check's figures (gpu.json) as the tables docs/gpu.md keeps."""

from __future__ import annotations

import datetime

Figures = dict[str, object]
STEP_NOTES = {
    "bare": "torchvision ResNet-50, autocast bf16, fused SGD, channels-last: no harness code",
    "bare_again": "the bare loop timed again, last (the noise between two timings)",
    "timm": "timm resnet50, trained as the bare loop",
    "fp32": "harness, precision=fp32 (LARS)",
    "bf16": "harness, precision=bf16 (LARS)",
    "fp16": "harness, precision=fp16.32 (LARS, dynamic loss scaling)",
    "sgd": "harness, precision=bf16 optim=sgd",
    "base": "harness bf16, every speed option off",
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
    lines += _step(stages.get("step", {})) + _loader(stages) + _e2e(stages.get("e2e", {}))
    return "\n".join(lines) + "\n"


def _notes(name: str, stage: Figures) -> str:
    if "error" in stage:
        return str(stage["error"]).replace("|", "/")[-400:]
    if name in ("step", "loader", "e2e"):
        return "figures below"
    shown = {k: v for k, v in stage.items() if k not in ("status", "seconds")}
    return ", ".join(f"{k}: {v}" for k, v in shown.items()).replace("|", "/")


def _rate(row: object) -> float | None:
    return row.get("img_s") if isinstance(row, dict) else None


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
    step = _rate(stages.get("step", {}).get("rows", {}).get("bf16"))
    title = f"## The input pipeline: batch {loader.get('batch')} at {loader.get('image')} px, ImageNet-like JPEGs"
    lines = ["", title, "", "| workers | img/s | over the harness's bf16 step |", "|---|---|---|"]
    for count, rate in workers.items():
        lines.append(f"| {count} | {rate} | {f'{rate / step:.2f}x' if step else ''} |")
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
