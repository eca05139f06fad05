"""`python -m data.shards`: pack a dataset into indexed tar shards, or check a shard directory.

data.shards.write packs them; data.shards.read reads and checks them.

    python -m data.shards --root DIR --out DIR          a dataset in any folder layout data.datasets opens
    python -m data.shards --archives DIR --out DIR      image-net.org's archives, unpacked as they are read
    python -m data.shards --check DIR                   every shard's size and sha256, and the index
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data.config import SyntheticConfig
from data.datasets import open_dataset
from data.shards.read import DEFAULT_SHARD_SIZE, MANIFEST, check_shards, open_shards
from data.shards.write import open_archives, pack
from data.sources.split import DatasetError, Split


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m data.shards`: pack (or resume packing) a dataset, or check a shard directory."""
    args = parse_args(argv)
    try:
        if args.check:
            shards, samples = check_shards(args.check)
            print(f"{args.check}: {shards} shards, {samples} samples; sizes, sha256 and index match the manifest")
        elif args.root and args.out.resolve().is_relative_to(args.root.resolve()):
            raise DatasetError(f"--out {args.out} is inside the dataset {args.root}; pack into a directory outside it")
        elif (args.out / MANIFEST).is_file():
            open_shards(args.out)
            print(f"{args.out} is already packed ({MANIFEST}); nothing to do")
        else:
            source = args.root or args.archives
            splits = open_archives(source) if args.archives else _open_folder_dataset(source)
            manifest = pack(splits, args.out, shard_size=args.shard_size, source=str(source.resolve()))
            print(_summary(args.out, manifest))
    except (DatasetError, OSError) as err:  # bad data, or a path that cannot be read or written
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m data.shards", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--root", type=Path, help="a dataset in any folder layout data.datasets opens")
    source.add_argument(
        "--archives",
        type=Path,
        help="a directory holding image-net.org's ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and "
        "ILSVRC2012_devkit_t12.tar.gz",
    )
    source.add_argument("--check", type=Path, metavar="DIR", help="verify a shard directory: sizes, sha256, index")
    parser.add_argument("--out", type=Path, help="the directory to pack into: new, empty, or an interrupted pack's")
    parser.add_argument(
        "--shard-size", type=parse_size, default=DEFAULT_SHARD_SIZE, help="bytes per shard, at most (default 1GB)"
    )
    args = parser.parse_args(argv)
    if args.check is None and args.out is None:
        parser.error("--out is required with --root and --archives")
    return args


def parse_size(text: str) -> int:
    """Bytes in a size such as "1GB" (10**9), "512MiB" (2**29) or "4096"."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?", text.strip(), re.IGNORECASE)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 1GB, 512MiB or 4096")
    base = 1024 if match[3] else 1000
    return int(float(match[1]) * base ** " kmgt".index(match[2].lower() or " "))


def _open_folder_dataset(root: Path) -> dict[str, Split]:
    train, val = open_dataset("imagenet", str(root), SyntheticConfig())
    return {"train": train, "val": val}


def _summary(out: Path, manifest: dict[str, Any]) -> str:
    splits = manifest["splits"]
    counts = " and ".join(f"{entry['count']} {name}" for name, entry in splits.items())
    shards = sum(len(entry["shards"]) for entry in splits.values())
    return f"packed {counts} samples into {shards} shards in {out} ({MANIFEST} written last)"


if __name__ == "__main__":
    sys.exit(main())
