"""A step measured on one GPU by `make gpu-check` (its gpu.json, bench/gpu), read for the GPU projection: rn50perf's
own step, so the cluster projection answers for this harness rather than for NVIDIA's; and what rn50perf's own input
pipeline fed train.py in the same check, where it ran end to end."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.checks import ConfigError
from projection.gpu.cost import MeasuredStep

PEERS = ("bare", "bare_again", "bare_compiled", "timm")  # bench/gpu/step.py's rows that time another loop
END_TO_END = ("train", "e2e")  # the check's stages that run the loader feeding the step (bench/gpu/check.py)


@dataclass(frozen=True)
class Fed:
    """train.py's rate end to end in the check, rn50perf's own loader feeding the step (`img_s`), and which run that
    was; or None, and why the check holds none."""

    img_s: float | None
    what: str


@dataclass(frozen=True)
class Check:
    """What one `make gpu-check` says of rn50perf: its measured `step`, and what its own loader `fed` train.py."""

    step: MeasuredStep
    fed: Fed


def read_check(path: str) -> Check:
    """The check's gpu.json at `path`, read once; ConfigError (exit status 2) for a file that holds no measured
    step."""
    try:
        stages = json.loads(Path(path).read_text())["stages"]
        return Check(measured_step(stages, path), fed(stages))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(
            "device.measured", f"{path} is not a gpu.json with a measured step (make gpu-check writes one): {err!r}"
        ) from err


def measured_step(stages: dict[str, Any], path: str) -> MeasuredStep:
    """The step stage's `best` row (every option that helped, together), or, in a check from before it had one, the
    fastest of rn50perf's own rows."""
    step, env = stages["step"], stages["env"]
    rows = {name: row for name, row in step["rows"].items() if name not in PEERS}
    name = "best" if "best" in rows else max(rows, key=lambda row: rows[row]["img_s"])
    return MeasuredStep(env["gpu"], int(step["batch"]), float(rows[name]["img_s"]), f"{path}, row {name}")


def fed(stages: dict[str, Any]) -> Fed:
    """The train stage's run of train.py with its defaults, or in a check from before that stage, the e2e stage's
    rate (the fastest settings it found)."""
    train, e2e = (stage if isinstance(stage := stages.get(name), dict) else {} for name in END_TO_END)
    defaults = train.get("runs", {}).get("defaults")
    if isinstance(defaults, dict) and "img_s" in defaults:
        return Fed(float(defaults["img_s"]), "train.py with its defaults, the check's train stage")
    if "img_s" in e2e:
        return Fed(float(e2e["img_s"]), f"the check's e2e stage: {e2e.get('overrides')}")
    ended = f"its train stage {train.get('status', 'absent')}, its e2e stage {e2e.get('status', 'absent')}"
    return Fed(None, f"the check holds no end-to-end run: {ended}")
