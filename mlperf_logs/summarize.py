"""A table of training runs: one row per MLPerf log under run or sweep directories, as text, CSV and plots.

    python -m mlperf_logs.summarize multirun/2026-11-22/10-00-00 [more dirs] [--csv PATH] [--plots DIR]

Each row names the overrides that differ between the runs (from the run's `.hydra/overrides.yaml`; a run
without one contributes its logged hyperparameters under their MLPerf names), the seed, the status, epochs to
target, time-to-train and training throughput, all read from the run's own MLPerf log (mlperf.log, or the name
its mlperf.log_file gave it: rundir.mlperf_log). A damaged log is listed as `incomplete`, a log the compliance
checker rejects as `fails checker`: no log is left out.

The table and the plots replace only a summary's own (a table with its figure columns, a PNG marked by it): a file
of the user's by one of their names is refused before anything is written (exit status 2).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from hydra.core.override_parser.overrides_parser import OverridesParser
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator
from mlperf_logging.compliance_checker.mlp_parser.ruleset_400 import TOKEN, LogLine, string_to_logline
from mlperf_logging.mllog import constants
from omegaconf import OmegaConf
from PIL import Image

import rundir
from mlperf_logs.compliance import complaints

TARGET = 0.759  # the closed division's ResNet top-1 target, drawn on the accuracy plot
SUCCESS, ABORTED, INCOMPLETE, FAILS_CHECKER = "success", "aborted", "incomplete", "fails checker"
STATUS_STYLE = {  # marker and colour per status on the sweep plots
    SUCCESS: ("o", "tab:blue"),
    ABORTED: ("x", "tab:red"),
    INCOMPLETE: ("^", "tab:gray"),
    FAILS_CHECKER: ("s", "tab:orange"),
}
NOT_HYPERPARAMETERS = {constants.CACHE_CLEAR, constants.INIT_START, constants.INIT_STOP, constants.SEED}
THROUGHPUT_SOURCE = "img/s: train_samples x epochs trained / time inside training blocks, from mlperf.log"
BAND = 0.86  # sweep plots: runs without a figure are drawn above this fraction of the panel's height
FIGURES = ("seed", "status", "epochs_to_target", "time_to_train_min", "train_img_s", "top1", "run_dir", "note")
MADE_BY = {"Software": "python -m mlperf_logs.summarize"}  # each plot's PNG metadata: a summary redraws only these


class UsageError(Exception):
    """An argument a user can fix: a directory without runs, or a file of theirs where the summary writes."""


@dataclass
class Run:
    """What one MLPerf log (and its Hydra run directory) says about the run."""

    directory: Path
    settings: dict[str, str]
    from_overrides: bool
    seed: str = ""
    status: str = INCOMPLETE
    epochs_to_target: int | None = None
    time_to_train_min: float | None = None
    train_img_s: float | None = None
    accuracy: list[tuple[int, float]] = field(default_factory=list)
    note: str = ""


def find_logs(directories: Sequence[Path]) -> list[Path]:
    """The MLPerf log of each run directory at or under `directories`, in natural order (sweep job 10 after 9)."""
    logs = []
    for directory in directories:
        if not directory.is_dir():
            raise UsageError(f"{directory}: {'not a directory' if directory.exists() else 'no such directory'}")
        found = sorted(map(rundir.mlperf_log, rundir.find_run_dirs(directory)), key=natural_key)
        if not found:
            raise UsageError(f"{directory}: holds no {rundir.MLPERF_LOG}")
        logs += found
    return logs


def natural_key(path: Path) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in path.parts)


def read_log(path: Path) -> tuple[list[LogLine], list[str]]:
    """The log's lines, each read by the checker's own line parser, and what is damaged in it.

    The checker's file reader skips lines without the `:::MLLOG` token and stops at a line that lacks a field;
    here both count as damage and the rest of the log is still read.
    """
    lines, unparsable = [], 0
    for lineno, text in enumerate(path.read_text(encoding="latin-1").splitlines()):
        if not text.strip():
            continue
        try:
            lines.append(string_to_logline(lineno, text[text.rindex(TOKEN) :].strip()))
        except (ValueError, KeyError, TypeError):  # no token, not JSON, a missing field or a value of a wrong type
            unparsable += 1
    return lines, [f"{unparsable} unparsable line{'s' if unparsable > 1 else ''}"] if unparsable else []


def first(lines: list[LogLine], key: str) -> LogLine | None:
    return next((line for line in lines if line.key == key), None)


def metadata(line: LogLine) -> dict[str, Any]:
    found = line.value.get("metadata")
    return found if isinstance(found, dict) else {}


def explains_abort(complaint: str) -> bool:
    """The closed ruleset rejects every log whose accuracy never reached the target: for an aborted run that
    complaint restates the abort, so it does not make the run `fails checker`."""
    return complaint.startswith(f"Failed checks for {constants.EVAL_ACCURACY}")


def run_settings(directory: Path, lines: list[LogLine]) -> dict[str, str]:
    """The run's command-line overrides, read by Hydra's parser; without them, its logged hyperparameters."""
    overrides = overrides_file(directory)
    if overrides.exists():
        parsed = OverridesParser.create().parse_overrides(list(OmegaConf.load(overrides)))
        settings = {o.key_or_group: "(deleted)" if o.is_delete() else str(o.value()) for o in parsed}
        settings.pop("run.seed", None)  # the seed has its own column, from the log
        return settings
    run_start = next((i for i, line in enumerate(lines) if line.key == constants.RUN_START), len(lines))
    return {
        line.key: str(line.value["value"])
        for line in lines[:run_start]
        if line.key not in NOT_HYPERPARAMETERS and not line.key.startswith("submission_")
    }


def overrides_file(directory: Path) -> Path:
    return directory / rundir.OVERRIDES


def summarize_run(path: Path) -> Run:
    lines, damage = read_log(path)
    run = Run(path.parent, run_settings(path.parent, lines), overrides_file(path.parent).exists())
    seed = first(lines, constants.SEED)
    run.seed = "" if seed is None else str(seed.value["value"])
    run.status, run.note = judge(lines, damage, complaints(path))
    try:
        add_figures(run, lines)
    except (ValueError, TypeError) as err:  # a logged figure that is not a number
        run.status, run.note = INCOMPLETE, f"unreadable value: {err}"
    return run


def add_figures(run: Run, lines: list[LogLine]) -> None:
    """Accuracy per epoch and throughput; epochs and time to target for a success, the time it ran otherwise."""
    run.accuracy = [
        (int(metadata(line)[constants.EPOCH_NUM]), float(line.value["value"]))
        for line in lines
        if line.key == constants.EVAL_ACCURACY and constants.EPOCH_NUM in metadata(line)
    ]
    run.train_img_s = training_throughput(lines)
    start, stop = first(lines, constants.RUN_START), first(lines, constants.RUN_STOP)
    if start is None or stop is None:
        return
    minutes = (stop.timestamp - start.timestamp) / 60_000
    if run.status == SUCCESS and run.accuracy:
        run.epochs_to_target, run.time_to_train_min = run.accuracy[-1][0], minutes
    elif run.status == ABORTED:
        run.note = f"stopped after {minutes:.2f} min"


def judge(lines: list[LogLine], damage: list[str], complaints: list[str]) -> tuple[str, str]:
    """The run's status and why, when it is not a plain success: a damaged or unfinished log first, then the
    checker's verdict, then the status run_stop logged."""
    stop = first(lines, constants.RUN_STOP)
    outcome: str | None = None if stop is None else metadata(stop).get(constants.STATUS)
    missing = [f"no {key}" for key in (constants.RUN_START, constants.RUN_STOP) if first(lines, key) is None]
    if stop is not None and outcome not in (SUCCESS, ABORTED):
        missing.append(f"run_stop status {outcome!r}")
    if damage or missing:
        return INCOMPLETE, "; ".join(damage + missing)
    assert outcome in (SUCCESS, ABORTED)  # any other status made the log incomplete, above
    if outcome == ABORTED:
        complaints = [c for c in complaints if not explains_abort(c)]
    if complaints:
        return FAILS_CHECKER, "checker: " + complaints[0]
    return outcome, ""


def training_throughput(lines: list[LogLine]) -> float | None:
    """Images per second while training: train_samples x the epochs of every finished block / the blocks' time.

    It counts the dataset's samples (not padded batches) on the log's own clock, the one time-to-train uses,
    and leaves evaluation out.
    """
    samples = first(lines, constants.TRAIN_SAMPLES)
    started: dict[int | None, tuple[int, float]] = {}
    epochs, seconds = 0, 0.0
    for line in lines:
        first_epoch = metadata(line).get(constants.FIRST_EPOCH_NUM)
        if line.key == constants.BLOCK_START:
            started[first_epoch] = (metadata(line).get(constants.EPOCH_COUNT, 0), line.timestamp)
        elif line.key == constants.BLOCK_STOP and first_epoch in started:
            count, start_ms = started.pop(first_epoch)
            epochs, seconds = epochs + count, seconds + (line.timestamp - start_ms) / 1000
    if samples is None or seconds <= 0:
        return None
    return float(samples.value["value"]) * epochs / seconds


def swept_keys(runs: list[Run]) -> list[str]:
    """The settings whose values differ between runs of one kind, in the order they first appear. Among runs
    with overrides a key that a run does not override holds its default there; among runs with only logged
    hyperparameters a key missing from a damaged log is unknown, not different."""
    keys = []
    for from_overrides in (True, False):
        group = [run for run in runs if run.from_overrides == from_overrides]
        ordered = dict.fromkeys(key for run in group for key in run.settings)
        for key in ordered:
            values = {run.settings.get(key) for run in group if from_overrides or key in run.settings}
            keys += [key] if len(values) > 1 else []
    return keys


def table_rows(runs: list[Run], keys: list[str]) -> list[dict[str, str]]:
    return [{**{key: run.settings.get(key, "") for key in keys}, **figures_of(run)} for run in runs]


def figures_of(run: Run) -> dict[str, str]:
    values = (
        run.seed,
        run.status,
        "" if run.epochs_to_target is None else str(run.epochs_to_target),
        shown(run.time_to_train_min, 3),
        shown(run.train_img_s, 1),
        shown(run.accuracy[-1][1] if run.accuracy else None, 4),
        str(run.directory),
        run.note,
    )
    return dict(zip(FIGURES, values, strict=True))


def shown(value: float | None, decimals: int) -> str:
    return "" if value is None else f"{value:.{decimals}f}"


def format_table(rows: list[dict[str, str]]) -> str:
    """Aligned columns, by hand: the requirements pin no table library (prettytable only comes with optuna)."""
    header = list(rows[0])
    widths = [max(len(name), *(len(row[name]) for row in rows)) for name in header]
    lines = ["  ".join(name.ljust(width) for name, width in zip(header, widths, strict=True))]
    lines += ["  ".join(row[name].ljust(width) for name, width in zip(header, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def write_csv(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def categories(values: list[str]) -> list[str]:
    """The distinct values of a swept key, numerically sorted when they are all numbers."""
    distinct = list(dict.fromkeys(values))
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return sorted(distinct)


def positions(values: list[str], order: list[str]) -> list[float]:
    """Each run's x: its value's place, runs sharing a value spread a little apart so none hides another."""
    offsets = []
    for i, value in enumerate(values):
        same = [j for j, other in enumerate(values) if other == value]
        offsets.append(order.index(value) + (same.index(i) - (len(same) - 1) / 2) * 0.08)
    return offsets


def plot_sweep(runs: list[Run], key: str, path: Path) -> None:
    """Time-to-train and epochs-to-target against one swept key."""
    values = [run.settings.get(key, "(default)") for run in runs]
    order = categories(values)
    xs = positions(values, order)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    draw_panel(axes[0], runs, xs, [run.time_to_train_min for run in runs], "time to train (min)")
    draw_panel(axes[1], runs, xs, [run.epochs_to_target for run in runs], "epochs to target", integer=True)
    for ax in axes:
        ax.set_xticks(range(len(order)), order)
        ax.set_xlim(-0.5, len(order) - 0.5)
        ax.set_xlabel(key)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata=MADE_BY)
    plt.close(fig)


def draw_panel(
    ax: Axes, runs: list[Run], xs: list[float], ys: list[float | None], label: str, integer: bool = False
) -> None:
    """Runs with a figure at their value; the others in a grey band above every figure, in their status's
    marker, so that a failed run is seen and never reads as a fast one."""
    band = ax.get_xaxis_transform()  # x in data, y in axes fractions
    labelled: set[str] = set()
    for run, x, y in zip(runs, xs, ys, strict=True):
        marker, colour = STATUS_STYLE[run.status]
        name = None if run.status in labelled else run.status
        labelled.add(run.status)
        if y is None:
            ax.plot(x, (1 + BAND) / 2, marker, color=colour, ms=9, label=name, transform=band)
        else:
            ax.plot(x, y, marker, color=colour, label=name)
    top = max((y for y in ys if y is not None), default=1) / 0.8  # figures stay below the band
    ax.yaxis.set_major_locator(MaxNLocator(integer=True) if integer else MaxNLocator())
    ax.set_ylim(0, top)
    ax.set_yticks([tick for tick in ax.get_yticks() if 0 <= tick <= top * BAND])  # no scale inside the band
    ax.add_patch(Rectangle((0, BAND), 1, 1 - BAND, transform=ax.transAxes, color="0.92", zorder=0))
    ax.text(0.01, 0.975, "did not succeed: no figure", transform=ax.transAxes, va="top", fontsize="x-small")
    ax.set_ylabel(label)
    ax.legend(fontsize="small", loc="lower right")


def plot_accuracy(runs: list[Run], keys: list[str], path: Path) -> None:
    """Eval top-1 against epoch, a line per run; runs that did not succeed are dashed."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        if run.accuracy:
            epochs, top1 = zip(*run.accuracy, strict=True)
            style = "o-" if run.status == SUCCESS else "o--"
            ax.plot(epochs, top1, style, label=f"{run_label(run, keys)} ({run.status})")
    ax.axhline(TARGET, color="black", linestyle=":", label=f"closed-division target {TARGET}")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("eval top-1")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: labels can be long
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata=MADE_BY)
    plt.close(fig)


def run_label(run: Run, keys: list[str]) -> str:
    return " ".join([*(f"{key}={run.settings[key]}" for key in keys if key in run.settings), f"seed={run.seed}"])


def plot_file(directory: Path, name: str) -> Path:
    safe = re.sub(r"[^\w.-]", "_", name)
    return directory / f"summary_{safe}.png"


def plot_paths(keys: list[str], directory: Path) -> list[Path]:
    """A plot per swept key, then the accuracy plot."""
    return [plot_file(directory, name) for name in (*keys, "accuracy")]


def draw_plots(runs: list[Run], keys: list[str], paths: list[Path]) -> None:
    paths[-1].parent.mkdir(parents=True, exist_ok=True)
    for key, path in zip(keys, paths, strict=False):
        plot_sweep(runs, key, path)
    plot_accuracy(runs, keys, paths[-1])


def refuse_others(csv_path: Path, plots: list[Path]) -> None:
    """A UsageError where a file the summary would write exists and is not a summary's own."""
    for path in (csv_path, *plots):
        if path.exists() and not written_by_summary(path, plot=path in plots):
            raise UsageError(
                f"{path} exists and was not written by a summary; refusing to overwrite it (move it, or write "
                "elsewhere with --csv and --plots)"
            )


def written_by_summary(path: Path, plot: bool) -> bool:
    """A table whose last columns are FIGURES; a PNG marked MADE_BY."""
    try:
        if plot:
            with Image.open(path) as image:
                return all(image.info.get(key) == value for key, value in MADE_BY.items())
        with path.open(newline="") as file:
            return tuple(next(csv.reader(file), [])[-len(FIGURES) :]) == FIGURES
    except (OSError, ValueError, csv.Error):  # unreadable, not text, not an image: not a summary's
        return False


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mlperf_logs.summarize", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run or sweep directories")
    parser.add_argument("--csv", type=Path, help="where to write the table (default: DIR/summary.csv, first DIR)")
    parser.add_argument("--plots", type=Path, help="where to draw the PNGs (default: the first DIR)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    csv_path = args.csv or args.dirs[0] / "summary.csv"
    try:
        runs = [summarize_run(log) for log in find_logs(args.dirs)]
        keys = swept_keys(runs)
        plots = plot_paths(keys, args.plots or args.dirs[0])
        refuse_others(csv_path, plots)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = table_rows(runs, keys)
    write_csv(rows, csv_path)
    draw_plots(runs, keys, plots)
    print(f"{len(runs)} runs; time to train = run_stop - run_start; {THROUGHPUT_SOURCE}\n")
    print(format_table(rows))
    print(f"\ncsv: {csv_path}\nplots: {', '.join(map(str, plots))}")
    counts = {status.replace(" ", "_"): sum(run.status == status for run in runs) for status in STATUS_STYLE}
    figures = {"runs": len(runs), "succeeded": counts[SUCCESS], "failed": len(runs) - counts[SUCCESS], **counts}
    print(json.dumps({**figures, "swept": keys, "csv": str(csv_path), "plots": list(map(str, plots))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
