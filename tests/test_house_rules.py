"""The house rules hold in CI and before each commit, and the docs say which tests exercise each room.

CI (.ci/run) runs `make lint` and `make test`, and fails if either does; the pre-commit hooks run the commands of
the Makefile's lint target, so the two cannot drift; docs/testing.md's table of tests has a row for every room of
docs/architecture.md, naming test files that exist."""

import os
import re
import shlex
import subprocess

import yaml

from tests.conftest import REPO

TESTS_OF_EACH_ROOM = "\n## Which tests exercise each room\n"
# Rooms that no test exercises yet: their row in docs/testing.md says "none yet". A gap to close, not a rule: the
# test that closes one takes the room off this list.
UNTESTED: tuple[str, ...] = ()


def make_variables(makefile: str) -> dict[str, str]:
    """The Makefile's assignments (NAME := value, NAME ?= value, NAME = value)."""
    return dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*(.*?)\s*$", makefile, re.MULTILINE))


def recipe(target: str) -> list[str]:
    """The commands of a Makefile target's recipe as make runs them: variables expanded, continued lines joined,
    commands chained by `&&` apart, make's own prefixes (@, -) dropped, spaces normalised."""
    makefile = (REPO / "Makefile").read_text()
    variables = make_variables(makefile)
    found = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert found, f"the Makefile has no target {target}"
    text = found.group(1).replace("\\\n", " ")
    for _ in range(10):  # a variable may name others; one never set (ARGS) is empty, as in make
        text = re.sub(r"\$\(([A-Z_]+)\)", lambda name: variables.get(name.group(1), ""), text)
    commands = [part for line in text.splitlines() for part in line.split("&&")]
    return [shlex.join(shlex.split(command.strip().lstrip("@-"))) for command in commands]


def test_the_pre_commit_hooks_run_the_commands_of_make_lint_with_nothing_downloaded():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # no hook repository fetched
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    # each runs as written, over the whole tree whatever was staged: no file names added to mypy's or ruff's
    assert all(hook["language"] == "unsupported" and hook["pass_filenames"] is False for hook in hooks)
    assert all(hook["always_run"] is True for hook in hooks)
    commands = [shlex.join([*shlex.split(hook["entry"]), *hook.get("args", [])]) for hook in hooks]
    lint = recipe("lint")
    assert len(lint) == 3 and all(command.startswith(".venv/bin/") for command in lint)  # ruff, its format, mypy
    assert commands == lint


def test_the_makefile_reader_expands_variables_and_splits_chained_commands():
    assert recipe("train") == [".venv/bin/python train.py"]  # $(ARGS) is empty
    assert recipe("lint")[1] == ".venv/bin/ruff format --check ."


def run_ci(tmp_path, failing: str) -> tuple[int, list[str]]:
    """.ci/run with a `make` that records its target and fails for `failing`: the exit status and the targets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    made = tmp_path / "made"
    made.write_text("")
    fake = bin_dir / "make"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(made))}\n[ "$*" != {shlex.quote(failing)} ]\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, made.read_text().splitlines()


def test_ci_runs_make_lint_and_make_test_and_fails_if_either_fails(tmp_path):
    assert run_ci(tmp_path, failing="none") == (0, ["lint", "test"])
    status, made = run_ci(tmp_path, failing="lint")
    assert status != 0 and made == ["lint", "test"]  # the tests still run: CI shows both verdicts
    status, made = run_ci(tmp_path, failing="test")
    assert status != 0 and made == ["lint", "test"]
    readme = (REPO / "README.md").read_text()
    assert re.search(r"^make test\b", readme, re.MULTILINE)  # CI's test command is the one the README gives


def rooms_of(page: str) -> dict[str, str]:
    """A table's rows that name a room (`name` in the first cell): room -> the rest of the row."""
    return {line.split("`")[1]: line.split("|", 2)[2] for line in page.splitlines() if line.startswith("| `")}


def test_the_testing_page_names_the_tests_of_every_room_on_the_map():
    """docs/testing.md's table of tests has a row for each room of docs/architecture.md's, and no other; every file
    a row names exists; a room whose row names none is one of UNTESTED, and its row says so."""
    rooms = rooms_of((REPO / "docs" / "architecture.md").read_text())
    testing = (REPO / "docs" / "testing.md").read_text()
    assert TESTS_OF_EACH_ROOM in testing
    table = rooms_of(testing.split(TESTS_OF_EACH_ROOM, 1)[1].split("\n## ", 1)[0])
    assert sorted(table) == sorted(rooms)
    named = {room: re.findall(r"\btests/[\w/]+\.py\b", row) for room, row in table.items()}
    assert [name for names in named.values() for name in names if not (REPO / name).is_file()] == []
    assert sorted(room for room, names in named.items() if not names) == sorted(UNTESTED)
    assert all("none yet" in table[room] for room in UNTESTED)
