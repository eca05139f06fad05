"""Shared test helpers: run train.py as a user would, on tiny generated data."""

from __future__ import annotations

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
    *overrides: str, cache: Path, timeout: float = 600, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python train.py OVERRIDES` in the repo, with the test cache; returns the finished process."""
    env = {**os.environ, "RN50PERF_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
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
