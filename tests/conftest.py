"""Shared test helpers: run train.py as a user would, on tiny generated data, and read its MLPerf log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic-data cache for the whole session, so each tiny dataset is generated once."""
    return tmp_path_factory.mktemp("rn50perf-cache")


def run_train(
    *overrides: str, cache: Path, timeout: float = 600, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python train.py OVERRIDES` in the repo, with the test cache (and `env` added); returns the finished
    process."""
    env = {**os.environ, "RN50PERF_CACHE": str(cache), "PYTHONUNBUFFERED": "1", **(env or {})}
    result = subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"train.py failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def mllog_events(log: Path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines() if ":::MLLOG" in line]


def compliance_check(log: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        "training",
        "--ruleset",
        "4.0.0",
    ]
    return subprocess.run([*command, str(log)], capture_output=True, text=True, cwd=log.parent)
