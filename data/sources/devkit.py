"""image-net.org's ILSVRC2012 devkit: the class (wnid) of each validation image.

The devkit holds `data/meta.mat` (the synsets: ILSVRC2012_ID, WNID, ..., num_children) and
`data/ILSVRC2012_validation_ground_truth.txt` (one ILSVRC2012_ID per validation image, in file-name order).
The ids are not in wnid order, so labels go through the wnid. Layout as torchvision's `parse_devkit_archive` reads it.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

from data.sources.split import DatasetError

META = "data/meta.mat"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"


def val_wnids(devkit: Path) -> list[str]:
    """The wnid of each validation image (ILSVRC2012_val_00000001 first), from a devkit folder or its .tar.gz."""
    meta, truth = _read_members(devkit)
    wnid_of = _leaf_wnids(meta)
    try:
        return [wnid_of[int(line)] for line in truth.decode().split()]
    except (KeyError, ValueError) as err:
        raise DatasetError(f"{devkit}: {GROUND_TRUTH} names an ILSVRC2012_ID that meta.mat lacks: {err}") from None


def devkit_files(devkit: Path) -> tuple[Path, ...]:
    """The files `val_wnids` reads: the archive, or meta.mat and the ground truth in the unpacked folder."""
    files = (devkit / META, devkit / GROUND_TRUTH) if devkit.is_dir() else (devkit,)
    for file in files:
        if not file.is_file():
            raise DatasetError(f"{devkit} is not an ILSVRC2012 devkit: {file} is missing")
    return files


def _leaf_wnids(meta: bytes) -> dict[int, str]:
    """ILSVRC2012_ID -> wnid of the 1,000 leaf synsets (those without children), as meta.mat lists them."""
    import scipy.io  # ~85 ms: imported only where image-net.org's layout or archives are read

    synsets = scipy.io.loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0}


def _read_members(devkit: Path) -> tuple[bytes, bytes]:
    """meta.mat and the ground truth, from the unpacked folder or straight from the archive."""
    try:
        if devkit.is_dir():
            return (devkit / META).read_bytes(), (devkit / GROUND_TRUTH).read_bytes()
        with tarfile.open(devkit) as archive:
            by_tail = {m.name.split("/", 1)[-1]: m for m in archive.getmembers() if m.isfile()}

            def read(name: str) -> bytes:
                file = archive.extractfile(by_tail[name])
                assert file is not None  # by_tail holds regular files, which always have contents
                return file.read()

            return read(META), read(GROUND_TRUTH)
    except (OSError, KeyError, tarfile.TarError) as err:
        raise DatasetError(f"{devkit} is not a readable ILSVRC2012 devkit ({META}, {GROUND_TRUTH}): {err}") from None


def write_devkit(devkit: Path, wnids: list[str], val_classes: list[str]) -> None:
    """A miniature devkit folder: `wnids` as the leaf synsets (ids 1..n in the given order) and one ground-truth
    line per validation image of class `val_classes[i]` (for tests and the fake full-size tree)."""
    ids = {wnid: i + 1 for i, wnid in enumerate(wnids)}
    fields = ["ILSVRC2012_ID", "WNID", "words", "num_children"]
    synsets = [(ids[w], w, w, 0) for w in wnids] + [(len(wnids) + 1, "n00000000", "entity", len(wnids))]
    (devkit / "data").mkdir(parents=True, exist_ok=True)
    import scipy.io

    table = np.array(synsets, dtype=[(f, object) for f in fields])
    scipy.io.savemat(devkit / META, {"synsets": table})
    (devkit / GROUND_TRUTH).write_text("".join(f"{ids[c]}\n" for c in val_classes))
