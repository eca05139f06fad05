"""The compiled decoder, data/jpeg/_jpeg.c over libjpeg-turbo (`make native` builds it beside this file), loaded
once for the package and its PIL fallback."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

EXTENSION = "data.jpeg._jpeg"


def _load_extension() -> ModuleType:
    """`_jpeg` beside this file, or the build at $RN50PERF_JPEG_EXT (the ASan build that `make fuzz-asan` tests),
    which then is `data.jpeg._jpeg` for every importer."""
    path = os.environ.get("RN50PERF_JPEG_EXT")
    if not path:
        return importlib.import_module(EXTENSION)
    spec = importlib.util.spec_from_file_location(EXTENSION, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"RN50PERF_JPEG_EXT={path} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from data.jpeg import _jpeg as _jpeg  # its interface, for mypy: _jpeg.pyi (exported: the package uses it)
else:
    _jpeg = _load_extension()
