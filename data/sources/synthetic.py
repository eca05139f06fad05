"""The embedded synthetic dataset: ImageNet-like JPEGs that ResNet-50 learns in minutes on a CPU.

Each class is a main object with its own combination of shape, hue and surface texture (every factor is
shared with other classes, so no single one separates them all), drawn at a random position, size and
rotation over a photo-like scene: a blurred, low-saturation background lit from one side, with colour
blotches and clutter, a few small low-contrast distractor shapes, and sensor grain. Neither a single pixel
nor the file size gives the class away (tests/test_synthetic.py checks both).

The layout is ImageNet's: ``ROOT/train/<wnid>/<wnid>_<i>.JPEG``, ``ROOT/val/<wnid>/<wnid>_val_<i>.JPEG``
and ``ROOT/LOC_synset_mapping.txt``; ``ROOT/spec.json``, written last, marks the dataset complete. Every
image is seeded from (seed, split, class, index), so its bytes depend neither on the other images nor on
the number of worker threads.
"""

import colorsys
import functools
import hashlib
import io
import itertools
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

from data.config import SyntheticConfig
from data.sources.staging import build_atomically

GENERATOR_VERSION = 1  # bump whenever the images change, so that cached datasets are regenerated
SPLITS = ("train", "val")
SHAPES = ("circle", "square", "triangle", "star", "cross", "ring", "crescent", "heart")
HUES = {  # name -> hue in [0, 1)
    "red": 0.0,
    "orange": 0.08,
    "yellow": 0.15,
    "green": 0.33,
    "teal": 0.49,
    "blue": 0.61,
    "purple": 0.76,
    "pink": 0.89,
}
TEXTURES = ("plain", "striped", "dotted", "checked")
ASPECT_RATIOS = (4 / 3, 3 / 4, 3 / 2, 1.0, 16 / 9, 2 / 3)  # width / height, with ImageNet-like frequencies
ASPECT_WEIGHTS = (0.45, 0.2, 0.15, 0.1, 0.05, 0.05)
MARKER = "spec.json"
CACHE_ENV = "RN50PERF_CACHE"  # where generated sets live (default ~/.cache/rn50perf)
SYNSET_MAPPING = "LOC_synset_mapping.txt"
# every path _generate writes, relative to the dataset's root: what an outdated dataset may hold to be replaced
GENERATED = re.compile(
    rf"(train|val)(/n09\d{{6}}(/n09\d{{6}}(_val)?_\d+\.JPEG)?)?|{re.escape(SYNSET_MAPPING)}|{re.escape(MARKER)}"
)


def class_names(spec: SyntheticConfig) -> list[str]:
    """ImageNet-style wnids, sorted in class-index order."""
    return [f"n09{index:06d}" for index in range(spec.classes)]


def class_descriptions(spec: SyntheticConfig) -> list[str]:
    """What each class looks like, e.g. "striped red circle", in class-index order."""
    hue_names = list(HUES)
    return [f"{TEXTURES[t]} {hue_names[h]} {SHAPES[s]}" for s, h, t in _class_factors()[: spec.classes]]


def cache_root() -> Path:
    """Where generated data and saved indexes live: ``$RN50PERF_CACHE``, or ``~/.cache/rn50perf``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rn50perf")


def default_root(spec: SyntheticConfig) -> Path:
    """``cache_root()`` / ``synthetic-<hash of the spec>``."""
    return cache_root() / f"synthetic-{hashlib.sha256(_spec_json(spec).encode()).hexdigest()[:12]}"


def ensure_dataset(root: Path, spec: SyntheticConfig, workers: int = 0) -> Path:
    """Return ``root`` holding the dataset of ``spec``, generating it first unless it is already complete.

    Generation happens in a sibling directory that is renamed into place when done, so an interrupted run
    never leaves a dataset that looks complete. ``workers`` threads render the images (0: one per CPU).
    Threads, not processes: PIL and NumPy release the GIL for part of the work only, so a first generation takes
    longer (README), but forking a process that has threads of its own (rank 0 of a distributed run has gloo's)
    may leave a child deadlocked on a lock it inherited held (CPython warns of it from 3.12): a run that hangs.
    An outdated dataset of its own at ``root`` (its marker, and nothing but its own files) is replaced; a folder
    holding anything else is refused (NotOurs), untouched.
    """
    root = Path(root)
    if _is_complete(root, spec):
        return root
    refuse_unless_ours(root)
    generate = partial(_generate, spec=spec, workers=workers or os.cpu_count() or 1)
    build_atomically(root, generate, lambda: _is_complete(root, spec))
    return root


def _spec_json(spec: SyntheticConfig) -> str:
    return json.dumps({"generator_version": GENERATOR_VERSION, **asdict(spec)}, sort_keys=True)


def _is_complete(root: Path, spec: SyntheticConfig) -> bool:
    marker = root / MARKER
    return marker.is_file() and marker.read_text() == _spec_json(spec)


class NotOurs(FileExistsError):
    """A folder given as the synthetic set's root that holds files the generator did not write."""


def refuse_unless_ours(root: Path) -> None:
    """Raise NotOurs unless `root` is missing, an empty folder, or a dataset this generator wrote (recognised by
    its marker alone, and holding nothing but the files it writes), so that nothing else is ever replaced."""
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        return
    if root.is_dir() and _has_marker(root) and _only_generated_files(root):
        return
    if (root / "train").is_dir():
        raise NotOurs(
            f"{root} holds images of its own (train/), not rn50perf's synthetic set, which is generated only into "
            "a new or empty folder; to train on them give data=imagenet (nothing there was changed)"
        )
    raise NotOurs(
        f"{root} holds files rn50perf did not write; the synthetic set is generated only into a new or empty "
        "folder: give another data.root, or none for its cache (nothing there was changed)"
    )


def _has_marker(root: Path) -> bool:
    try:
        spec = json.loads((root / MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(spec, dict) and "generator_version" in spec


def _only_generated_files(root: Path) -> bool:
    """Whether every entry under `root` has a name `_generate` gives (stopping at the first that has not)."""
    return all(GENERATED.fullmatch(path.relative_to(root).as_posix()) for path in root.rglob("*"))


class _ImageJob(NamedTuple):
    path: Path
    seed: int
    split: str
    class_index: int
    index_in_class: int


def _generate(directory: Path, spec: SyntheticConfig, workers: int) -> None:
    names = class_names(spec)
    jobs = []
    for split, per_class in zip(SPLITS, (spec.train_per_class, spec.val_per_class), strict=True):
        infix = "_val" if split == "val" else ""
        for class_index, name in enumerate(names):
            (directory / split / name).mkdir(parents=True)
            for i in range(per_class):
                path = directory / split / name / f"{name}{infix}_{i}.JPEG"
                jobs.append(_ImageJob(path, spec.seed, split, class_index, i))
    with ThreadPoolExecutor(max(1, min(workers, len(jobs)))) as pool:
        for _ in pool.map(_write_image, jobs):  # each result, so that a failed write raises here
            pass
    lines = [f"{n} {d}\n" for n, d in zip(names, class_descriptions(spec), strict=True)]
    (directory / SYNSET_MAPPING).write_text("".join(lines))
    (directory / MARKER).write_text(_spec_json(spec))


def _write_image(job: _ImageJob) -> None:
    job.path.write_bytes(render_jpeg(job.seed, job.split, job.class_index, job.index_in_class))


@functools.cache
def _class_factors() -> list[tuple[int, int, int]]:
    """(shape, hue, texture) per class. Each class differs from all earlier ones in as many factors as
    possible (the default ten pairwise in at least two), using the least-used factor values."""
    sizes = (len(SHAPES), len(HUES), len(TEXTURES))
    combos = np.array(list(itertools.product(*map(range, sizes))))
    combos = combos[np.random.default_rng(1).permutation(len(combos))]  # so the factors vary independently
    nearest = np.full(len(combos), len(sizes))  # how many factors each combination differs in, at least
    uses = [np.zeros(size, dtype=int) for size in sizes]
    chosen: list[tuple[int, int, int]] = []
    for _ in range(len(combos)):
        overuse = sum(uses[k][combos[:, k]] for k in range(len(sizes)))
        pick = int(np.argmax(nearest * len(combos) - overuse))
        shape, hue, texture = combos[pick]
        chosen.append((int(shape), int(hue), int(texture)))
        nearest = np.minimum(nearest, (combos != combos[pick]).sum(axis=1))
        nearest[pick] = -1
        for k, value in enumerate(combos[pick]):
            uses[k][value] += 1
    return chosen


def _shape_outlines() -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
    """Filled polygons and holes of each shape, inscribed in the unit circle."""
    t = np.linspace(0, 2 * math.pi, 72, endpoint=False)
    circle = np.stack([np.cos(t), np.sin(t)], axis=1)

    def regular(corners: int, radii: tuple[float, ...] = (1.0,)) -> np.ndarray:
        angles = np.linspace(0, 2 * math.pi, corners * len(radii), endpoint=False) - math.pi / 2
        r = np.resize(radii, len(angles))
        return np.stack([r * np.cos(angles), r * np.sin(angles)], axis=1)

    arm = 0.3
    cross = [(arm, 1), (arm, arm), (1, arm), (1, -arm), (arm, -arm), (arm, -1)]
    cross += [(-x, -y) for x, y in cross]
    s = np.sin(t)
    heart = np.stack([16 * s**3, -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))], 1)
    return {
        "circle": ([circle], []),
        "square": ([regular(4) @ np.array([[1, 1], [-1, 1]]) / math.sqrt(2)], []),
        "triangle": ([regular(3)], []),
        "star": ([regular(5, (1.0, 0.42))], []),
        "cross": ([np.array(cross, dtype=float)], []),
        "ring": ([circle], [0.55 * circle]),
        "crescent": ([circle], [0.85 * circle + [0.45, -0.1]]),
        "heart": ([heart / 17 + [0, 0.1]], []),
    }


SHAPE_OUTLINES = _shape_outlines()


def render_jpeg(seed: int, split: str, class_index: int, index: int) -> bytes:
    """One image of the dataset, as JPEG bytes (quality 90, 4:2:0)."""
    rng = np.random.default_rng([seed, SPLITS.index(split), class_index, index])
    height, width = _image_size(rng)
    image = _background(rng, height, width)
    _draw_distractors(rng, image)
    _draw_object(rng, image, *_class_factors()[class_index])
    buffer = io.BytesIO()
    _add_grain(rng, image).save(buffer, "JPEG", quality=90, subsampling="4:2:0")
    return buffer.getvalue()


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width): short side 300-500 px, an ImageNet-like aspect ratio with some jitter."""
    short = int(rng.integers(300, 501))
    aspect = rng.choice(ASPECT_RATIOS, p=ASPECT_WEIGHTS) * rng.uniform(0.96, 1.04)
    long = round(short * max(aspect, 1 / aspect))
    return (short, long) if aspect >= 1 else (long, short)


def _hsv(hue: float, saturation: float, value: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue % 1, saturation, value), dtype=np.float32)


def _background(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """A low-saturation scene lit from one side, with colour blotches and clutter, out of focus: it is
    drawn at a quarter of the resolution, blurred and scaled up."""
    y = np.linspace(0, 1, -(-height // 4), dtype=np.float32)[:, None]
    x = np.linspace(0, 1, -(-width // 4), dtype=np.float32)[None, :]
    base = _hsv(rng.random(), rng.uniform(0.03, 0.3), rng.uniform(0.3, 0.85))
    light = rng.uniform(0, 2 * math.pi)
    shading = 1 + rng.uniform(0.2, 0.7) * ((x - 0.5) * math.cos(light) + (y - 0.5) * math.sin(light))
    rgb = base * shading[..., None]
    for _ in range(4):  # low-frequency colour noise
        fx, fy = rng.uniform(-2.5, 2.5, size=2).tolist()
        wave = np.cos(2 * math.pi * (fx * x + fy * y + rng.random()))
        rgb += wave[..., None] * rng.normal(0, 0.015, size=3).astype(np.float32)
    scene = Image.fromarray(np.clip(rgb * 255 + 0.5, 0, 255).astype(np.uint8))
    _draw_clutter(rng, scene, base)
    return scene.filter(ImageFilter.GaussianBlur(1)).resize((width, height), Image.Resampling.BICUBIC)


def _draw_clutter(rng: np.random.Generator, scene: Image.Image, base: np.ndarray) -> None:
    draw = ImageDraw.Draw(scene)
    w, h = scene.size
    for _ in range(int(rng.integers(3, 9))):
        colour = np.clip(base * rng.uniform(0.6, 1.4) + rng.normal(0, 0.04, size=3), 0, 1)
        fill = tuple(int(c * 255) for c in colour)
        x0, x1 = sorted(rng.uniform(-0.2, 1.2, size=2) * w)
        y0, y1 = sorted(rng.uniform(-0.2, 1.2, size=2) * h)
        kind = rng.integers(3)
        if kind == 0:
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif kind == 1:
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        else:
            draw.line((x0, y0, x1, y1), fill=fill, width=int(rng.integers(1, 4)))


def _shape_mask(shape: str, radius: float, angle: float) -> Image.Image:
    """A soft-edged mask of the rotated shape, centred on a square patch of side 2 * ceil(radius) + 4."""
    side = 2 * math.ceil(radius) + 4
    rotation = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    filled, holes = SHAPE_OUTLINES[shape]
    for polygon, fill in [(p, 255) for p in filled] + [(p, 0) for p in holes]:
        draw.polygon([tuple(p) for p in (polygon @ rotation * radius + side / 2).tolist()], fill=fill)
    return mask.filter(ImageFilter.GaussianBlur(0.8))


def _draw_distractors(rng: np.random.Generator, image: Image.Image) -> None:
    """A few small shapes in colours close to the background behind them."""
    for _ in range(int(rng.integers(2, 6))):
        radius = rng.uniform(0.03, 0.075) * min(image.size)
        mask = _shape_mask(SHAPES[rng.integers(len(SHAPES))], radius, rng.uniform(0, 2 * math.pi))
        cx, cy = int(rng.integers(image.width)), int(rng.integers(image.height))
        behind = np.array(image.getpixel((cx, cy)), dtype=np.float32) / 255
        colour = np.clip(behind * rng.uniform(0.75, 1.25) + rng.normal(0, 0.03, size=3), 0, 1)
        image.paste(tuple(int(c * 255) for c in colour), (cx - mask.width // 2, cy - mask.height // 2), mask)


def _draw_object(rng: np.random.Generator, image: Image.Image, shape: int, hue: int, texture: int) -> None:
    """The class's object: 35-75% of the short side across, anywhere in the frame, with a soft shadow."""
    radius = rng.uniform(0.175, 0.375) * min(image.size)
    angle = rng.uniform(0, 2 * math.pi)
    mask = _shape_mask(SHAPES[shape], radius, angle)
    cx = rng.uniform(0.6 * radius, image.width - 0.6 * radius)
    cy = rng.uniform(0.6 * radius, image.height - 0.6 * radius)
    corner = (round(cx) - mask.width // 2, round(cy) - mask.height // 2)
    # the surface is smooth, so it is computed at half the resolution
    half = _surface(rng, mask.width // 2, radius / 2, angle, list(HUES.values())[hue], TEXTURES[texture])
    surface = Image.fromarray(half).resize(mask.size, Image.Resampling.BILINEAR)
    shadow = mask.filter(ImageFilter.GaussianBlur(0.08 * radius)).point(lambda v: v * 2 // 5)
    dx, dy = (round(d) for d in rng.normal(0, 0.06 * radius, size=2).tolist())
    image.paste((0, 0, 0), (corner[0] + dx, corner[1] + dy), shadow)
    image.paste(surface, corner, mask)


def _surface(rng: np.random.Generator, side: int, radius: float, angle: float, hue: float, texture: str) -> np.ndarray:
    """The object's colours on its patch: two tones of the class hue in the texture's pattern (which turns
    with the object), under light from one side."""
    hue += rng.normal(0, 0.012)
    primary = _hsv(hue, rng.uniform(0.65, 1.0), rng.uniform(0.6, 0.95))
    if rng.random() < 0.5:
        secondary = _hsv(hue, rng.uniform(0.1, 0.35), rng.uniform(0.9, 1.0))
    else:
        secondary = primary * rng.uniform(0.3, 0.45)
    coords = (np.arange(side, dtype=np.float32) - side / 2 + 0.5) / radius
    y, x = coords[:, None], coords[None, :]
    period = rng.uniform(0.35, 0.55)
    a = 2 * math.pi * ((x * math.cos(angle) - y * math.sin(angle)) / period + rng.random())
    b = 2 * math.pi * ((x * math.sin(angle) + y * math.cos(angle)) / period + rng.random())
    tone = np.clip(0.5 + 2 * _pattern(texture, a, b), 0, 1)  # 0: primary, 1: secondary
    light = rng.uniform(0, 2 * math.pi)
    shading = 1 + rng.uniform(0.1, 0.35) * (x * math.cos(light) + y * math.sin(light))
    rgb = np.multiply.outer(shading, 255 * primary) + np.multiply.outer(tone * shading, 255 * (secondary - primary))
    return np.clip(rgb, 0, 255, out=rgb).astype(np.uint8)


def _pattern(texture: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Positive where the texture shows the secondary tone; a and b are phases along the object's axes."""
    if texture == "striped":
        return np.sin(a)
    if texture == "dotted":
        return np.cos(a) + np.cos(b) - 1
    if texture == "checked":
        return 2 * np.sin(a) * np.sin(b)
    return np.full_like(a, -1)


NORMAL_QUANTILES = np.array([NormalDist().inv_cdf((k + 0.5) / 256) for k in range(256)])


def _add_grain(rng: np.random.Generator, image: Image.Image) -> Image.Image:
    """Sensor grain of a per-image strength, which makes JPEG sizes vary regardless of the class."""
    lut = np.clip(128 + rng.uniform(0.5, 6.0) * NORMAL_QUANTILES, 0, 255).round().astype(np.uint8)
    grain = Image.fromarray(rng.integers(0, 256, size=image.size[::-1], dtype=np.uint8)).point(lut.tolist())
    return ImageChops.add(image, Image.merge("RGB", (grain, grain, grain)), offset=-128)
