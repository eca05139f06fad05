"""rundir: the names a run's directory holds, and how a later tool finds a run and its MLPerf log (tests/test_run.py
holds real runs' directories to these names; tests/test_summarize.py summarises a run whose log has its own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rundir
from tests.conftest import REPO
from tests.test_architecture import library_modules

NAMED = yaml.safe_dump({"mlperf": {"log_file": "named.log"}})


def run_dir(directory: Path, config: str | None, *files: str) -> Path:
    """`directory` with `config` as its config.yaml (None: none) and each of `files`, empty."""
    directory.mkdir(parents=True)
    if config is not None:
        (directory / rundir.CONFIG).write_text(config)
    for name in files:
        (directory / name).write_text("")
    return directory


@pytest.mark.parametrize(
    ("config", "log"),
    [
        (None, "mlperf.log"),
        (NAMED, "named.log"),
        (yaml.safe_dump({"mlperf": {"clock": "wall"}}), "mlperf.log"),
        (yaml.safe_dump({"mlperf": "closed"}), "mlperf.log"),
        ("just a line\n", "mlperf.log"),
        ("mlperf: [not closed\n", "mlperf.log"),
    ],
    ids=["no-config", "named", "unnamed", "mlperf-not-a-mapping", "config-not-a-mapping", "not-yaml"],
)
def test_a_runs_log_is_the_one_its_config_names_else_the_default(tmp_path, config, log):
    assert rundir.mlperf_log(run_dir(tmp_path / "run", config)) == tmp_path / "run" / log


def test_a_run_directory_is_one_that_holds_its_log(tmp_path):
    named = run_dir(tmp_path / "0", NAMED, "named.log")
    (named / rundir.HYDRA).mkdir()  # Hydra's own config.yaml names the log too, but .hydra/ holds none
    (named / rundir.HYDRA / rundir.CONFIG).write_text(NAMED)
    bare = run_dir(tmp_path / "1", None, rundir.MLPERF_LOG)
    run_dir(tmp_path / "2", None, rundir.PROJECTION_TEXT, rundir.PROJECTION_JSON)  # run.mode=project's
    run_dir(tmp_path / "3", NAMED, rundir.MLPERF_LOG)  # not the log its run wrote
    assert sorted(rundir.find_run_dirs(tmp_path)) == [named, bare]
    assert rundir.find_run_dirs(named) == [named] and rundir.is_run_dir(bare)
    assert not rundir.is_run_dir(tmp_path / "missing") and not rundir.is_run_dir(bare / rundir.MLPERF_LOG)


def test_the_names_of_attempt_logs_and_temporaries(tmp_path):
    assert rundir.attempt_log(tmp_path / "mlperf.log", 2) == tmp_path / "mlperf.attempt2.log"
    assert rundir.temporary(tmp_path / rundir.CHECKPOINT) == tmp_path / ".checkpoint.pt.tmp"
    assert all(rundir.written_by_run(name) for name in ("mlperf.attempt12.log", ".model.pt.tmp", *rundir.NAMES))
    assert rundir.written_by_run("named.log", "named.log") and rundir.written_by_run("named.attempt1.log", "named.log")
    assert not any(rundir.written_by_run(name) for name in ("notes.txt", "mlperf.attempt0.log", "named.log"))


def test_rundir_imports_nothing_of_the_project():
    """A leaf: every module may import it, and it imports none of theirs."""
    ours = {path.stem for path in REPO.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()}
    probe = "import sys, rundir; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert {name.split(".")[0] for name in loaded.stdout.split()} & ours == {"rundir"}


def test_no_module_but_rundir_spells_a_run_file_name():
    """Every module takes the run directory's names from rundir: a string in the library that is one of them, or a
    path ending in one (f"{out}/metrics.csv"), is a second place to change when a name does. Help text may mention
    them."""
    spelled = [
        f"{module}:{node.lineno} {node.value!r}"
        for module, path in library_modules().items()
        if module.split(".")[0] != "rundir" and path.suffix == ".py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and names_a_run_file(node.value)
    ]
    assert spelled == []


def names_a_run_file(text: str) -> bool:
    return any(text == name or text.endswith(f"/{name}") for name in rundir.NAMES)


def test_a_path_that_ends_in_a_run_file_name_is_found():
    assert names_a_run_file("/checkpoint.pt") and names_a_run_file("metrics.csv")
    assert not names_a_run_file("img/s from mlperf.log") and not names_a_run_file("model.pth")
