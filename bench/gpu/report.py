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
    lines += _step(stages.get("step", {})) + _variants(stages.get("variants", {})) + _trace(stages.get("trace", {}))
    lines += _decode(stages.get("decode", {})) + _loader(stages) + _train(stages) + _e2e(stages.get("e2e", {}))
    return "\n".join(lines) + "\n"


def winners(stages: dict[str, Figures]) -> Figures:
    """What won, for the defaults to be set from: each speed option against base, the fastest step's settings,
    the best step's fastest batch and whether padding the input helped it, the faster decode path at each worker
    count and overall, what data.decode=auto chose in train.py, the fastest train.py run."""
    found: Figures = {}
    rows = stages.get("step", {}).get("rows", {})
    base = _step_rate(stages, "base")
    options = {name[1:]: _rate(row) for name, row in rows.items() if name.startswith("+")}
    if base:
        found["options_over_base"] = {name: round(rate / base, 3) if rate else None for name, rate in options.items()}
    if "best" in stages.get("step", {}):
        found["step"] = stages["step"]["best"]
    found |= _variant_winners(stages.get("variants", {}).get("rows", {}))
    loader = _rated(stages.get("loader", {}).get("img_s_by_workers", {}))
    if loader:
        found["loader"] = max(loader, key=loader.get)
        found["decode"] = _path(found["loader"])
        found["decode_by_workers"] = _faster_decode(loader)
    runs = stages.get("train", {}).get("runs", {})
    auto = runs.get("defaults", {}).get("decode_auto") if isinstance(runs.get("defaults"), dict) else None
    if auto:
        found["decode_auto"] = auto
    rates = {name: run["img_s"] for name, run in runs.items() if _rate(run)}
    if rates:
        found["train"] = max(rates, key=rates.get)
    return found


def _variant_winners(rows: Figures) -> Figures:
    """The batch at which the best step ran fastest (of those measured), and whether padding its input helped."""
    found: Figures = {}
    same = {name: row for name, row in rows.items() if name == "best" or name.startswith("best@")}  # but the batch
    batches = {row["batch"]: row["img_s"] for row in same.values() if _rate(row) and row.get("batch")}
    if len(batches) > 1:
        found["batch"] = max(batches, key=batches.get)
    best, padded, unpadded = (_rate(rows.get(name)) for name in ("best", "best+pad", "best-pad"))
    if best and padded:  # the best step does not pad: padded against it
        found["pad_input_channels"] = {"over_best": round(padded / best, 3), "won": padded > best}
    if best and unpadded:  # the best step pads: it against the same step unpadded
        found["pad_input_channels"] = {"over_unpadded": round(best / unpadded, 3), "won": best > unpadded}
    return found


def _rated(rows: Figures) -> dict[str, float]:
    """The rows that hold a rate (a failed or skipped row holds why instead)."""
    return {key: rate for key, rate in rows.items() if isinstance(rate, int | float)}


def _path(key: str) -> str:
    """A loader row's decode path: "cpu" (the workers), "gpu" or "hybrid0.8" (0.8 of each batch on the GPU)."""
    return key.rpartition("/")[0] or "cpu"


def _faster_decode(loader: dict[str, float]) -> dict[str, str]:
    """For each worker count measured more than one way ("8", "gpu/8", "hybrid0.8/8"), the fastest decode path."""
    by_count: dict[str, dict[str, float]] = {}
    for key, rate in loader.items():
        by_count.setdefault(key.rpartition("/")[2], {})[_path(key)] = rate
    return {count: max(paths, key=paths.get) for count, paths in by_count.items() if len(paths) > 1}


def _notes(name: str, stage: Figures) -> str:
    if "error" in stage:
        return str(stage["error"]).replace("|", "/")[-400:]
    if name in ("step", "variants", "trace", "decode", "loader", "train", "e2e"):
        return "figures below"
    shown = {k: v for k, v in stage.items() if k not in ("status", "seconds")}
    return ", ".join(f"{k}: {v}" for k, v in shown.items()).replace("|", "/")


def _rate(row: object) -> float | None:
    return row.get("img_s") if isinstance(row, dict) else None


def _best_step_rate(stages: dict[str, Figures]) -> float | None:
    """The best step's img/s at the check's batch: the step stage's best row, else the variants stage's, else the
    decode stage's step alone."""
    beside = stages.get("decode", {}).get("beside")
    alone = beside.get("step_img_s_alone") if isinstance(beside, dict) else None
    return _step_rate(stages, "best") or _rate(stages.get("variants", {}).get("rows", {}).get("best")) or alone


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


def _variants(variants: Figures) -> list[str]:
    rows = variants.get("rows", {})
    if not rows:
        return []
    best = _rate(rows.get("best"))
    lines = [
        "",
        f"## The best step's variants at {variants.get('image')} px: {' '.join(map(str, variants.get('best', [])))}",
        "",
        "| row | batch | img/s | peak GiB | over best |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        if not isinstance(row, dict):
            lines.append(f"| {name} | | {row} | | |")
            continue
        ratio = f"{row['img_s'] / best:.3f}x" if best else ""
        lines.append(f"| {name} | {row.get('batch')} | {row['img_s']} | {row.get('peak_gib', '')} | {ratio} |")
    return lines


def _trace(trace: Figures) -> list[str]:
    found = trace.get("trace")
    if found is None:
        return []
    title = f"## Where the best step's GPU time goes: batch {trace.get('batch')}, {trace.get('overrides')}"
    if not isinstance(found, dict):
        return ["", title, "", str(found)]
    lines = ["", title, ""]
    if "gpu" in trace:
        lines += [f"{trace['gpu']}", ""]
    if "graphs" in trace:
        lines += [f"CUDA graphs {trace['graphs']}", ""]
    lines += [
        f"Per step over {found['steps']} traced steps: wall {found['wall_ms_per_step']} ms, device busy"
        f" {found['busy_ms_per_step']} ms ({found['busy_share']} of the wall time), idle {found['idle_ms_per_step']}"
        f" ms; {found['activities_per_step']} device activities a step.",
        "",
        "| kernel | ms per step | share of the step |",
        "|---|---|---|",
    ]
    for top in found["top"]:
        lines.append(f"| {str(top['name']).replace('|', '/')} | {top['ms_per_step']} | {top['share']} |")
    return lines


def _decode(decode: Figures) -> list[str]:
    parts = [name for name in ("cpu", "device", "beside", "pixels") if name in decode]
    if not parts:
        return []
    title = (
        f"## The decoders: {decode.get('photos')} photo-like JPEGs, random-resized crops to {decode.get('image')} px"
    )
    lines = ["", title, ""]
    if "gpu" in decode:
        lines += [str(decode["gpu"]), ""]
    lines += ["| what | figure |", "|---|---|"]
    cpu, device, beside, pixels = (decode.get(name) for name in ("cpu", "device", "beside", "pixels"))
    per_core = cpu.get("img_s_per_core") if isinstance(cpu, dict) else None
    lines.append(f"| the fused decoder (data.jpeg.decode_crop), one core | {per_core or cpu} img/s |")
    if isinstance(device, dict):
        cores = f", as many as {device['img_s'] / per_core:.1f} cores" if per_core else ""
        what = f"decode_crops on the {device.get('device')} alone, batches of {device.get('batch')}"
        lines.append(f"| {what} | {device['img_s']} img/s{cores} |")
    elif device is not None:
        lines.append(f"| decode_crops on the device alone | {device} |")
    if isinstance(beside, dict):
        lines += [
            f"| the best step alone ({beside.get('steps')} steps) | {beside['step_img_s_alone']} img/s |",
            f"| the best step, decode_crops running beside it | {beside['step_img_s_beside']} img/s:"
            f" {beside['slowdown']}x slower |",
            f"| decode_crops beside the step | {beside['decode_img_s_beside']} img/s |",
        ]
    elif beside is not None:
        lines.append(f"| the best step beside decode_crops | {beside} |")
    if isinstance(pixels, dict):
        verdict = "passed" if pixels["passed"] else "FAILED"
        lines.append(
            f"| decode_crops against the fused decoder, mean absolute difference per image"
            f" ({pixels['images']} images) | max {pixels['max_mean_abs_diff']}, mean {pixels['mean_mean_abs_diff']}:"
            f" {verdict} (under {pixels['bound']}) |"
        )
    elif pixels is not None:
        lines.append(f"| decode_crops against the fused decoder | {pixels} |")
    return lines


def _decoded_by(key: str) -> str:
    """Who decodes in a loader row, in words."""
    path, _, workers = key.rpartition("/")
    if path.startswith("hybrid"):
        share = float(path.removeprefix("hybrid"))
        return f"the GPU {share:g} of each batch, {workers} workers the rest"
    return f"the GPU ({workers} workers read)" if path == "gpu" else f"{workers} workers"


def _loader(stages: dict[str, Figures]) -> list[str]:
    loader = stages.get("loader", {})
    workers = loader.get("img_s_by_workers", {})
    if not workers:
        return []
    step = _best_step_rate(stages)
    title = f"## The input pipeline: batch {loader.get('batch')} at {loader.get('image')} px, ImageNet-like JPEGs"
    lines = ["", title, "", "| row | decoded by | img/s | over the best step |", "|---|---|---|---|"]
    for key, rate in workers.items():
        over = f"{rate / step:.2f}x" if step and isinstance(rate, int | float) else ""
        lines.append(f"| {key} | {_decoded_by(key)} | {rate} | {over} |")
    return lines


def _train(stages: dict[str, Figures]) -> list[str]:
    train = stages.get("train", {})
    runs = train.get("runs", {})
    if not runs:
        return []
    best, compiled = _best_step_rate(stages), _step_rate(stages, "bare_compiled")
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
    for name, run in runs.items():
        if isinstance(run, dict) and run.get("decode_auto"):
            lines += ["", f"{name}: data.decode=auto chose, as train.py said: `{run['decode_auto']}`"]
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
