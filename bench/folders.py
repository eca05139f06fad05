"""The folders a bench writes into (its output, its scratch): its own alone. A folder is a bench's when it was new
or empty, and then marked, or carries the mark of an earlier bench; any other is refused in one line with exit status
2, so that no bench replaces or removes a file of the user's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

MARK = ".rn50perf-bench"


def claim(folder: Path, option: str) -> Path:
    """`folder`, made and marked where it is new or empty; refused where it holds files that no bench made."""
    if folder.exists() and not is_ours(folder) and not (folder.is_dir() and not any(folder.iterdir())):
        refuse(f"{option} {folder} holds files that no bench made; give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARK).touch()
    return folder


def is_ours(folder: Path) -> bool:
    return (folder / MARK).is_file()


def refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
