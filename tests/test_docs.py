"""What the README and the guides tell a user to type is what train.py accepts, and the README stays a guide."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from configs.schema import batch_shape
from tests.conftest import REPO, composed

GUIDES = ("README.md", "docs/data.md", "docs/gpu.md")
# Config folders that are not groups a user picks: a device option composes its IPU chip or its GPU from them.
NOT_GROUPS = ("device/chip", "device/gpu")
FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


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


def test_running_md_names_every_option_of_every_config_group():
    """docs/running.md's Configuration lists each group's options: a new device or experiment joins the list."""
    page = (REPO / "docs/running.md").read_text()
    configs = REPO / "configs"
    options = [path.relative_to(configs) for path in sorted(configs.glob("*/**/*.yaml"))]
    missing = [
        f"{option.parent}={option.stem}"
        for option in options
        if str(option.parent) not in NOT_GROUPS and f"`{option.stem}`" not in page
    ]
    assert len(options) > 30 and missing == []


def github_anchor(heading: str) -> str:
    """The #anchor GitHub gives a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor outside code blocks, a repeated one numbered as GitHub numbers it (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCED.sub("", page.read_text()), re.MULTILINE):
        anchor = github_anchor(heading)
        found.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_github_anchors_follow_githubs_rule():
    assert github_anchor("Against the fastest peer: `python -m bench.loader`") == (
        "against-the-fastest-peer-python--m-benchloader"
    )
    assert github_anchor("bench.trace: what the eager bf16 step allocates and casts") == (
        "benchtrace-what-the-eager-bf16-step-allocates-and-casts"
    )


def test_every_relative_link_in_the_docs_reaches_a_file_and_its_heading():
    """Each Markdown page's links to files of the repository (outside code blocks) resolve, and a #anchor names a
    heading of the page it points to."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    broken = []
    for name in sorted(set(listed)):
        page = REPO / name
        if not page.is_file():
            continue
        for target in LINK.findall(FENCED.sub("", page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            destination = (page.parent / file) if file else page
            if not destination.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and (destination.is_dir() or anchor not in anchors(destination)):
                broken.append(f"{name}: {target} (no such heading)")
    assert broken == []
