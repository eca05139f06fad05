"""What the README and the guides tell a user to type is what train.py accepts, and the README stays a guide."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from configs.schema import batch_shape
from tests.conftest import REPO, composed

GUIDES = ("README.md", "docs/data.md", "docs/gpu.md")


def train_commands(page: str) -> list[list[str]]:
    """The overrides of each single run (no -m) that the page's code blocks start with train.py."""
    blocks = re.findall(r"```(?:sh)?\n(.*?)```", (REPO / page).read_text(), re.DOTALL)
    commands = []
    for line in "\n".join(blocks).splitlines():
        command = line.removeprefix("$ ")
        if not command.startswith((".venv/bin/python train.py", "python train.py")):
            continue  # another tool, or what a command printed
        words = shlex.split(command, comments=True)
        if "-m" not in words:
            commands.append(words[2:])
    return commands


def with_data_here(overrides: list[str], root: Path) -> list[str]:
    """The command as a user with the data at `root` types it (the page's /data/imagenet or DIR)."""
    return [f"data.root={root}" if override.startswith("data.root=") else override for override in overrides]


@pytest.mark.parametrize("page", GUIDES)
def test_every_run_a_guide_shows_is_accepted_as_written(page, tmp_path):
    commands = train_commands(page)
    assert commands, f"{page} shows no train.py command"
    for overrides in commands:
        composed(*with_data_here(overrides, tmp_path))  # a ConfigError names the override that is wrong


def test_the_one_gpu_command_takes_the_mlperf_batch_in_micro_batches_that_fit(tmp_path):
    """docs/gpu.md opens with it: experiment=imagenet's global batch of 3,264 in 12 micro-batches of 272 (batch
    256 trained in 10.8 GiB on the H200), with every speed option device=cuda turns on."""
    first = train_commands("docs/gpu.md")[0]
    cfg = composed(*with_data_here(first, tmp_path))
    shape = batch_shape(cfg, world_size=1)
    assert (shape.global_batch, shape.grad_accum, shape.micro_batch) == (3264, 12, 272)
    assert (cfg.precision.name, cfg.device.compile, cfg.device.cuda_graphs) == ("bf16", True, True)
    assert first in train_commands("README.md")


def test_the_readme_is_a_guide_of_at_most_200_lines():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    sections = re.findall(r"^## (.+)$", readme, re.MULTILINE)
    assert sections[:2] == ["Two commands", "Your own images, and ImageNet"]
    assert sections[-1] == "Documentation"


def test_no_tracked_file_names_a_machine_path_or_a_file_outside_the_clone():
    """A clone holds no absolute path of the machine it was written on, and cites public sources, not the
    workplace's ../shared (tests may name such paths to check for them)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = []
    for name in tracked.splitlines():
        path = REPO / name
        if name.startswith("tests/") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # a binary file
            continue
        found += [f"{name}: {needle}" for needle in ("/work/", "../shared") if needle in text]
    assert found == []
