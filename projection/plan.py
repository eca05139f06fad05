"""python -m projection.plan: which system, how many chips and which global batch train ImageNet to MLPerf's target
in T minutes, across the families. For each system (a GPU cluster's nodes, a generation's IPU systems, a TPU
generation's slices) it finds the smallest size, and the best global batch there, whose projected time to train is
at most T at its 80 % range's upper end (`--central`: at its central figure); `--chips N` gives each system's time
at N chips instead. Each row is train.py's own projection (projection.families.answer) of the command it prints.

Only batches the recipe can take: a GPU or a TPU replica gets 8 to 256 images (a TPU's a multiple of 8), and the
global batch stays within MLPerf's reference convergence points (rcps_resnet.json), which give its epochs; an IPU
system runs Graphcore's recipe for it as it is."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import Any, NoReturn, cast

from configs.checks import ConfigError
from configs.schema import Config, composed, validate
from mlperf_logs import rcp
from projection.families import answer
from projection.gpu.config import ClusterConfig
from projection.ipu.config import IpuSimConfig
from projection.tpu.config import TpuSliceConfig

DEVICES = Path(__file__).resolve().parent.parent / "configs" / "device"
EXPERIMENTS = DEVICES.parent / "experiment"
PER_REPLICA = (8, 16, 32, 64, 128, 256)  # the images a GPU or TPU replica takes that the planner tries
SUBMISSION_RUNS = 5  # MLPerf's ResNet-50 result: five runs
TABLE, PICTURE = "plan.csv", "plan.png"  # what the planner writes into its --out folder
COLUMNS = ["family", "system", "chips", "global_batch", "time_to_train_min", "fastest_min", "slowest_min"]
COLUMNS += ["throughput_img_s", "chip_hours_per_run", "chip_hours_per_submission", "command"]


@dataclass(frozen=True)
class Size:
    """One size of a system: the config it varies (`base`, composed once), the device fields it sets there, its
    chips, and the global batches it may take."""

    chips: int
    base: tuple[str, ...]
    fields: tuple[tuple[str, int], ...]
    batches: tuple[int, ...]

    @property
    def overrides(self) -> tuple[str, ...]:
        return (*self.base, *(f"device.{name}={value}" for name, value in self.fields))


@dataclass(frozen=True)
class System:
    family: str  # gpu, ipu or tpu
    name: str  # the device (a GPU cluster, a TPU generation) or the IPU systems' generation
    sizes: Callable[[], list[Size]]  # ascending by chips


@dataclass(frozen=True)
class Row:
    system: System
    size: Size
    global_batch: int
    figures: dict[str, object]  # the projection's JSON line

    @property
    def command(self) -> str:
        overrides = (*self.size.overrides, f"data.global_batch={self.global_batch}")
        return "train.py run.mode=project " + " ".join(overrides)

    def minutes(self, central: bool) -> float:
        if central:
            return float(self.figures["time_to_train_min"])  # type: ignore[arg-type]
        return float(self.figures["time_to_train_min_range"][1])  # type: ignore[index]

    def json(self) -> dict[str, object]:
        return {
            "family": self.system.family,
            "system": self.system.name,
            "chips": self.size.chips,
            "global_batch": self.global_batch,
            "time_to_train_min": self.figures["time_to_train_min"],
            "time_to_train_min_range": self.figures["time_to_train_min_range"],
            "throughput_img_s": self.figures["throughput_img_s"],
            "chip_hours_per_run": round(self.chip_hours(), 2),
            "command": self.command,
        }

    def chip_hours(self) -> float:
        return self.size.chips * float(self.figures["time_to_train_min"]) / 60  # type: ignore[arg-type]


def largest_batch() -> int:
    """The largest global batch MLPerf's reference convergence points give epochs for."""
    return rcp.rcp_batch_sizes()[-1]


def replica_batches(replicas: int, recipe: int) -> tuple[int, ...]:
    """The global batches of PER_REPLICA images on each of `replicas`, and the recipe's own where it deals evenly,
    within the reference points."""
    batches = {replicas * each for each in PER_REPLICA} | ({recipe} if recipe % replicas == 0 else set())
    return tuple(sorted(batch for batch in batches if batch <= largest_batch()))


@cache
def base(overrides: tuple[str, ...]) -> Config:
    """The config of `overrides`, composed once: each size and batch varies it (Hydra composes in a quarter second)."""
    return composed(("run.mode=project", *overrides))


def gpu_sizes(device: str) -> list[Size]:
    """1, 2, ... nodes of every GPU, while 8 images a GPU stay within the reference points."""
    chosen = ("experiment=imagenet", f"device={device}")
    cfg = base(chosen)
    assert isinstance(cfg.device, ClusterConfig)
    gpus = cfg.device.gpus_per_node
    nodes = range(1, largest_batch() // (gpus * PER_REPLICA[0]) + 1)
    return [Size(n * gpus, chosen, (("nodes", n),), replica_batches(n * gpus, cfg.data.global_batch)) for n in nodes]


def tpu_sizes(device: str) -> list[Size]:
    """Every slice the generation offers, while 8 images a replica stay within the reference points."""
    chosen = ("experiment=imagenet", f"device={device}")
    cfg = base(chosen)
    section, sizes = cfg.device, []
    assert isinstance(section, TpuSliceConfig)
    for chips in section.chosen_chip.offered():
        replicas = replace(section, chips=chips).replicas
        if batches := replica_batches(replicas, cfg.data.global_batch):
            sizes.append(Size(chips, chosen, (("chips", chips),), batches))
    return sizes


def ipu_sizes(prefix: str) -> list[Size]:
    """Each IPU system of a generation (ipu_pod16, ... or bow_pod16, ...) on Graphcore's recipe for it."""
    sizes = []
    for device in (path.stem for path in DEVICES.glob(f"{prefix}*.yaml")):
        recipes = base((f"device={device}",)).device.imagenet_experiments()
        recipe = next(name for name in recipes if (EXPERIMENTS / f"{name}.yaml").is_file())
        chosen = (f"experiment={recipe}", f"device={device}")
        cfg = base(chosen)
        assert isinstance(cfg.device, IpuSimConfig)
        sizes.append(Size(cfg.device.chosen_system.ipus, chosen, (), (cfg.data.global_batch,)))
    return sorted(sizes, key=lambda size: size.chips)


def systems() -> list[System]:
    """Every system the families know, in the order the table prints them."""
    gpus = [path.stem for path in sorted(DEVICES.glob("*.yaml")) if "gpu_cluster" in path.read_text()]
    tpus = sorted(path.stem for path in DEVICES.glob("tpu_*.yaml"))
    return [
        *(System("gpu", device, partial(gpu_sizes, device)) for device in gpus),
        *(System("ipu", prefix, partial(ipu_sizes, prefix)) for prefix in ("ipu_pod", "bow_pod")),
        *(System("tpu", device, partial(tpu_sizes, device)) for device in tpus),
    ]


def projected(size: Size, global_batch: int) -> dict[str, object] | None:
    """train.py's projection of `size` at `global_batch` (its JSON figures), or None where the config refuses it."""
    cfg = base(size.base)
    fields: dict[str, Any] = dict(size.fields)
    cfg = replace(cfg, device=replace(cfg.device, **fields), data=replace(cfg.data, global_batch=global_batch))
    try:
        shape = validate(cfg, 1)
        figures = answer(cfg, shape, ()).rsplit("\n", 1)[1]
    except ConfigError:
        return None
    return cast(dict[str, object], json.loads(figures))


@dataclass
class Search:
    """The rows of one system's sizes, each at its best batch, projected once each."""

    system: System
    central: bool
    sizes: list[Size]
    best: dict[int, Row | None]

    @classmethod
    def of(cls, system: System, central: bool) -> Search:
        return cls(system, central, system.sizes(), {})

    def at(self, index: int) -> Row | None:
        """The fastest row of the size at `index` over the batches it takes (None: it takes none)."""
        if index not in self.best:
            size = self.sizes[index]
            rows = [
                Row(self.system, size, batch, figures)
                for batch in size.batches
                if (figures := projected(size, batch)) is not None
            ]
            self.best[index] = min(rows, key=lambda row: row.minutes(self.central), default=None)
        return self.best[index]

    def reaches(self, index: int, minutes: float) -> bool:
        row = self.at(index)
        return row is not None and row.minutes(self.central) <= minutes

    def smallest(self, minutes: float) -> Row | None:
        """The smallest size that trains in `minutes`: a binary search, the time to train falling as chips grow
        (tests/test_plan.py checks it against every size); None where the largest cannot."""
        low, high = 0, len(self.sizes) - 1
        if not self.reaches(high, minutes):
            return None
        while low < high:
            middle = (low + high) // 2
            if self.reaches(middle, minutes):
                high = middle
            else:
                low = middle + 1
        return self.at(low)

    def at_chips(self, chips: int) -> Row | None:
        """The smallest size of at least `chips` chips, at its best batch; None where the system has none."""
        index = next((i for i, size in enumerate(self.sizes) if size.chips >= chips), None)
        return None if index is None else self.at(index)


def refuse(message: str) -> NoReturn:
    """A mistake in the planner's arguments, told in one line, with exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def chosen_systems(families: Sequence[str], names: Sequence[str]) -> list[System]:
    """The systems `--family` and `--system` narrow the search to (all where neither is given)."""
    chosen = [s for s in systems() if (not families or s.family in families) and (not names or s.name in names)]
    if not chosen:
        known = ", ".join(s.name for s in systems())
        asked = " ".join([*(f"--family {family}" for family in families), *(f"--system {name}" for name in names)])
        refuse(f"no system matches {asked}; the systems: {known}")
    return chosen


HEADER = f"{'system':<10} {'chips':>6} {'batch':>7} {'a chip':>7} {'TTT min':>8} {'range':>15} "
HEADER += f"{'img/s':>10} {'chip-h':>8} {'x5':>8}"


def line(row: Row) -> str:
    figures = row.figures
    low, high = cast(list[float], figures["time_to_train_min_range"])
    return (
        f"{row.system.name:<10} {row.size.chips:>6,} {row.global_batch:>7,} {row.global_batch // row.size.chips:>7,}"
        f" {figures['time_to_train_min']:>8.3f} {f'{low:.3f}-{high:.3f}':>15}"
        f" {figures['throughput_img_s']:>10,.0f} {row.chip_hours():>8.2f} {SUBMISSION_RUNS * row.chip_hours():>8.2f}"
    )


def plan(searches: Sequence[Search], minutes: float | None, chips: int | None) -> tuple[list[Row], list[str]]:
    """Each system's row (its smallest size within `minutes`, or its size at `chips`), and what could not."""
    rows, missed = [], []
    for search in searches:
        row = search.smallest(minutes) if minutes is not None else search.at_chips(chips or 0)
        if row is None:
            largest = search.sizes[-1].chips
            missed.append(
                f"{search.system.name}: its largest configuration ({largest:,} chips) cannot train in {minutes} min"
                if minutes is not None
                else f"{search.system.name}: no size of {chips:,} chips or more"
            )
        else:
            rows.append(row)
    return rows, missed


def refuse_to_overwrite(out: Path) -> None:
    """The planner writes only files it names; a folder already holding one of them is refused, as it may be a
    user's."""
    held = [name for name in (TABLE, PICTURE) if (out / name).exists()]
    if held:
        refuse(f"--out {out} already holds {', '.join(held)}; give a new --out (nothing was changed)")


def write_table(rows: Sequence[Row], path: Path) -> None:
    """The rows as CSV, with the chip-hours of a run and of a five-run submission."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for row in rows:
            fastest, slowest = cast(list[float], row.figures["time_to_train_min_range"])
            hours = row.chip_hours()
            writer.writerow([
                row.system.family, row.system.name, row.size.chips, row.global_batch,
                row.figures["time_to_train_min"], fastest, slowest, row.figures["throughput_img_s"],
                round(hours, 2), round(SUBMISSION_RUNS * hours, 2), row.command,
            ])  # fmt: skip


def draw(searches: Sequence[Search], minutes: float | None, path: Path) -> None:
    """Time to train against chips on log-log axes, a line and a band (the 80 % range) for each system, over the
    sizes the search projected, and the time asked for."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure  # imported here: a planner that is only asked for its table starts sooner

    fig = Figure(figsize=(9, 5.5))
    ax = fig.subplots()
    palette = colormaps["tab20"]
    assert isinstance(palette, ListedColormap)
    colours = list(palette.colors)  # type: ignore[arg-type]
    for colour, search in zip(colours, searches, strict=False):
        rows = sorted((row for row in search.best.values() if row is not None), key=lambda row: row.size.chips)
        if not rows:
            continue
        chips = [row.size.chips for row in rows]
        central = [row.minutes(central=True) for row in rows]
        bands = [cast(list[float], row.figures["time_to_train_min_range"]) for row in rows]
        ax.plot(chips, central, "o-", color=colour, markersize=3, label=search.system.name)
        ax.fill_between(chips, [low for low, _ in bands], [high for _, high in bands], color=colour, alpha=0.2)
    if minutes is not None:
        ax.axhline(minutes, color="black", linestyle="--", label=f"{minutes:g} min asked")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("chips (GPUs, IPUs, TPU chips)")
    ax.set_ylabel("projected time to train ImageNet, minutes")
    ax.set_title("time to train against chips: each system's projection and its 80 % range", fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m projection.plan", description=__doc__.split("\n\n")[0])
    asked = parser.add_mutually_exclusive_group(required=True)
    asked.add_argument("--minutes", type=float, help="the time to train to reach, in minutes")
    asked.add_argument("--chips", type=int, help="each system's time to train at this many chips (or the next size)")
    parser.add_argument("--family", action="append", default=[], choices=("gpu", "ipu", "tpu"))
    parser.add_argument("--system", action="append", default=[], help="a system's name, as the table prints it")
    parser.add_argument("--central", action="store_true", help="within T at the central figure, not the range's end")
    parser.add_argument("--out", type=Path, help="the folder of plan.csv and plan.png (outputs/plan/DATE/TIME)")
    args = parser.parse_args(argv)
    if (args.minutes or args.chips or 0) <= 0:
        refuse("--minutes and --chips must be positive")
    out = args.out or Path("outputs", "plan", time.strftime("%Y-%m-%d"), time.strftime("%H-%M-%S"))
    refuse_to_overwrite(out)
    searches = [Search.of(system, args.central) for system in chosen_systems(args.family, args.system)]
    rows, missed = plan(searches, args.minutes, args.chips)
    where = "central figure" if args.central else "80 % range's upper end"
    asked_for = f"within {args.minutes} min at the {where}" if args.minutes is not None else f"at {args.chips} chips"
    print(f"ImageNet to MLPerf's target {asked_for}: the smallest size of each system and its fastest global batch")
    print(HEADER)
    for row in rows:
        print(line(row))
        print(f"  {row.command}")
    for said in missed:
        print(said)
    out.mkdir(parents=True, exist_ok=True)
    write_table(rows, out / TABLE)
    draw(searches, args.minutes, out / PICTURE)
    print(f"outputs: {out} ({TABLE}: the table; {PICTURE}: time to train against chips)")
    print(json.dumps({"rows": [row.json() for row in rows]}))


if __name__ == "__main__":
    main(sys.argv[1:])
