"""A step measured on one GPU by `make gpu-check` (its gpu.json, bench/gpu), read for the GPU projection: rn50perf's
own step, so the cluster projection answers for this harness rather than for NVIDIA's."""

from __future__ import annotations

import json
from pathlib import Path

from configs.checks import ConfigError
from projection.gpu.cost import MeasuredStep

PEERS = ("bare", "bare_again", "bare_compiled", "timm")  # bench/gpu/step.py's rows that time another loop


def read_measured(path: str) -> MeasuredStep:
    """The step stage's `best` row (every option that helped, together), or, in a check from before it had one, the
    fastest of rn50perf's own rows; ConfigError (exit status 2) for a file that holds no measured step."""
    try:
        figures = json.loads(Path(path).read_text())
        step, env = figures["stages"]["step"], figures["stages"]["env"]
        rows = {name: row for name, row in step["rows"].items() if name not in PEERS}
        name = "best" if "best" in rows else max(rows, key=lambda row: rows[row]["img_s"])
        return MeasuredStep(env["gpu"], int(step["batch"]), float(rows[name]["img_s"]), f"{path}, row {name}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            "device.measured", f"{path} is not a gpu.json with a measured step (make gpu-check writes one): {err!r}"
        ) from err
