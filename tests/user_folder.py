"""A folder of a user's files that a tool must leave as it found them, byte for byte."""

from __future__ import annotations

from pathlib import Path


def plant(folder: Path, *names: str) -> dict[str, bytes]:
    """A few bytes of the user's in each of `names` (paths under `folder`, made as needed), as `files` reads them."""
    planted = {name: f"the user's own {name} ({number})\n".encode() for number, name in enumerate(names)}
    for name, data in planted.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return planted


def files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too) and its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}
