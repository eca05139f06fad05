"""`python -m mlperf_logs.package`: five ResNet run directories -> the MLCommons submission layout for training
ruleset 4.0.0, then mlperf_logging's package checker, result summarizer and RCP checker on it.

    python -m mlperf_logs.package --runs outputs/r1 outputs/r2 outputs/r3 outputs/r4 outputs/r5 \
        --org ACME --system cpu_box --out submission [--system-field host_storage_type=NVMe ...] [--impl pytorch]

    OUT/ORG/systems/NAME.json                                 the system description
    OUT/ORG/results/NAME/resnet/result_0.txt .. result_4.txt  the runs' MLPerf logs, ordered by seed
    OUT/ORG/benchmarks/resnet/implementations/IMPL/           the code that ran, and the runs' resolved config
    OUT/checks/                                               the checkers' logs and the result summary

Runs the package cannot hold, an existing result and an OUT/checks that an earlier package did not make are refused
(exit status 2) before anything is written; an existing system description or implementation is kept, never
replaced. A package the checker rejects is written and reported (exit status 1).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import yaml
from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.compliance_checker import mlp_parser
from mlperf_logging.system_desc_checker import system_desc_checker

import rundir
from configs.device import sections
from mlperf_logs import rcp
from mlperf_logs.compliance import RULESET, USAGE, complaints, root_handlers
from mlperf_logs.rcp import BENCHMARK

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where `git ls-files` is unavailable: what the source walk leaves out (environments, run outputs, caches).
NOT_SOURCE = {".git", ".venv", "outputs", "multirun", "__pycache__", ".pytest_cache", ".ruff_cache", "build"}
NOT_SOURCE_SUFFIXES = {".pt", ".pyc", ".so", ".log"}
# The log's submission_status -> the system description's status for training >= 4.0.
STATUS_NAMES = {
    "onprem": "Available on-premise",
    "cloud": "Available cloud",
    "preview": "Preview",
    "research": "Research, Development, or Internal (RDI)",
}
CHECKER_PASSED = "PACKAGE CHECKER FOUND NO ERRORS"
CHECKS_MARK = ".rn50perf-package"  # in OUT/checks: the folder is a package's, its checkers' logs rewritten each time
DESCRIPTION = "Write five ResNet runs as an MLCommons training 4.0.0 submission package and check it."


class Refusal(Exception):
    """Runs or a destination the package cannot be built from; the message says which and why."""


@dataclass(frozen=True)
class Run:
    directory: Path
    log: Path
    seed: int
    global_batch: int
    division: str
    status: str
    config: dict[str, Any]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = args.out / args.org / "results" / args.system / BENCHMARK
        if results.exists():
            raise Refusal(f"{results} already exists: a result is never overwritten; choose another --out or --system")
        if not checks_are_ours(args.out / "checks"):
            raise Refusal(
                f"{args.out / 'checks'} exists and was not made by a package: the checkers' logs are never written "
                "over its files; move it, or choose another --out"
            )
        fields = parse_fields(args.system_field)
        runs = read_runs(args.runs)
        description = system_description(runs, args.org, args.system, fields)
    except Refusal as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kept = write_package(args.out, args.org, args.system, args.impl, runs, description)
    report_written(args.out / args.org, args.system, args.impl, runs, description, kept)
    return check_package(args.out, args.org, args.system, args.rcp_bypass)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mlperf_logs.package", description=DESCRIPTION)
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="the run directories of one result")
    parser.add_argument("--org", type=plain_name, required=True, help="the submitting organisation")
    parser.add_argument("--system", type=plain_name, required=True, help="the system name (systems/NAME.json)")
    parser.add_argument(
        "--out",
        type=lambda path: Path(path).resolve(),  # absolute: the checkers run in OUT/checks
        required=True,
        help="the directory the ORG package is written into",
    )
    parser.add_argument(
        "--system-field", action="append", default=[], metavar="KEY=VALUE", help="set a system description field"
    )
    parser.add_argument("--impl", type=plain_name, default="pytorch", help="the implementation's directory name")
    parser.add_argument(
        "--rcp-bypass",
        action="store_true",
        help="pass --rcp-bypass to the package checker: a failed RCP check then passes with a warning, for the "
        "submission committee to review",
    )
    return parser.parse_args(argv)


def plain_name(value: str) -> str:
    """A name that is one path component."""
    if not value or value in (".", "..") or "/" in value or os.sep in value:
        raise argparse.ArgumentTypeError(f"{value!r} must be a plain name, not a path")
    return value


def parse_fields(pairs: list[str]) -> dict[str, str]:
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise Refusal(f"--system-field {pair!r}: expected KEY=VALUE")
        fields[key] = value
    return fields


def read_runs(directories: list[Path]) -> list[Run]:
    """The runs of one result, ordered by seed; refused unless they are as many as the benchmark needs, each
    complete and compliant, with seeds of their own and one global batch size."""
    needed = get_result_file_counts(USAGE)[BENCHMARK]
    if len(directories) != needed:
        named = ", ".join(str(d) for d in directories)
        raise Refusal(f"got {len(directories)} run directories ({named}); a ResNet result needs exactly {needed}")
    runs = [read_run(directory) for directory in directories]
    check_seeds(runs)
    check_batch_sizes(runs)
    return sorted(runs, key=lambda run: run.seed)


def read_run(directory: Path) -> Run:
    config = read_config(directory)
    log = rundir.mlperf_log(directory)  # the name mlperf.log_file gave it, recorded in config.yaml
    if not log.is_file():
        raise Refusal(f"{directory}: no {log.name} (not a run directory, or the run never started)")
    lines, errors = mlp_parser.parse_file(str(log), ruleset=RULESET)
    if errors:
        line, error = errors[0]
        raise Refusal(f"{directory}: {log.name} has lines that are not MLPerf log lines ({error}: {line.strip()!r})")
    events = {line.key: line.value for line in lines}
    if "run_stop" not in events:
        raise Refusal(f"{directory}: {log.name} is incomplete: it has no run_stop (still running, or killed)")
    problems = complaints(log)
    if problems:
        raise Refusal(f"{directory}: {log.name} fails the compliance checker ({USAGE} {RULESET}): {problems[0]}")
    if "seed" not in events:
        raise Refusal(f"{directory}: {log.name} logs no seed, which the package checker's seed check needs")
    return Run(
        directory=directory,
        log=log,
        seed=int(events["seed"]["value"]),
        global_batch=int(events["global_batch_size"]["value"]),
        division=events["submission_division"]["value"],
        status=events["submission_status"]["value"],
        config=config,
    )


def read_config(directory: Path) -> dict[str, Any]:
    """The run's resolved config.yaml; empty when the directory has none."""
    try:
        return rundir.recorded_config(directory)
    except yaml.YAMLError as err:
        raise Refusal(f"{directory}: {rundir.CONFIG} is not readable YAML ({err})") from err


def check_seeds(runs: list[Run]) -> None:
    seen: dict[int, Run] = {}
    for run in runs:
        if run.seed in seen:
            raise Refusal(
                f"{run.directory}: seed {run.seed} is also the seed of {seen[run.seed].directory}; "
                "the package checker requires every run to use its own seed"
            )
        seen[run.seed] = run


def check_batch_sizes(runs: list[Run]) -> None:
    first = runs[0]
    for run in runs[1:]:
        if run.global_batch != first.global_batch:
            raise Refusal(
                f"{run.directory}: global batch size {run.global_batch} differs from {first.global_batch} in "
                f"{first.directory}; the runs of one result share one global batch size"
            )


@functools.cache
def required_system_fields() -> tuple[str, ...]:
    """The fields system_desc_checker requires. The checker keeps its list inside `check_system_desc`, so an
    empty description is checked and its 'Missing field' reasons are read back."""
    reasons: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # The checker's logging.error('... %s : %s', system_name, invalid_reasons), a list of strings
            args = record.args
            if record.levelno >= logging.ERROR and isinstance(args, tuple) and len(args) == 2:
                reasons.extend(cast(list[str], args[1]))

    with tempfile.TemporaryDirectory() as tmp, root_handlers(Collect()):
        empty = Path(tmp) / "empty.json"
        empty.write_text("{}")
        system_desc_checker.check_system_desc(str(empty), USAGE, RULESET)
    return tuple(reason.removeprefix("Missing field ") for reason in reasons if reason.startswith("Missing field "))


def system_description(runs: list[Run], org: str, name: str, overrides: dict[str, str]) -> dict[str, str]:
    """Every field the checker requires: from the runs, this machine and the overrides; unknown ones empty."""
    first = runs[0]
    device = first.config.get("device", {})
    description = {
        "submitter": org,
        "division": first.division,
        "status": STATUS_NAMES.get(first.status, first.status),
        "system_name": name,
        "number_of_nodes": "1",
        **host_fields(first.directory),
        **accelerator_fields(device),
        **software_fields(first.config),
    }
    description |= {field: "" for field in required_system_fields() if field not in description}
    return description | overrides


def host_fields(run_directory: Path) -> dict[str, str]:
    """The host that packages the runs, from /proc/cpuinfo and /proc/meminfo where Linux has them."""
    processors = cpuinfo()
    first = processors[0] if processors else {}
    vcpus = os.cpu_count() or 1
    memory_kb = meminfo().get("MemTotal", "0 kB").split()[0]
    storage_gb = shutil.disk_usage(run_directory).total / 1e9
    return {
        "host_processors_per_node": str(len({p.get("physical id") for p in processors}) or 1),
        "host_processor_model_name": first.get("model name") or platform.processor() or platform.machine(),
        "host_processor_core_count": first.get("cpu cores", str(vcpus)),
        "host_processor_vcpu_count": str(vcpus),
        "host_processor_frequency": f"{float(first['cpu MHz']):.0f} MHz" if "cpu MHz" in first else "",
        "host_processor_caches": f"{first['cache size']} (cache size in /proc/cpuinfo)"
        if "cache size" in first
        else "",
        "host_memory_capacity": f"{int(memory_kb) / 1024**2:.0f} GB" if int(memory_kb) else "",
        "host_storage_capacity": f"{storage_gb:.0f} GB",
    }


def cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical processor; empty where there is none."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return []
    blocks = [block for block in path.read_text().split("\n\n") if block.strip()]
    return [_fields(block.splitlines()) for block in blocks]


def meminfo() -> dict[str, str]:
    path = Path("/proc/meminfo")
    return _fields(path.read_text().splitlines()) if path.is_file() else {}


def _fields(lines: list[str]) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def accelerator_fields(device: dict[str, Any]) -> dict[str, str]:
    """The accelerators the run's device section describes (a simulated system's); else the CUDA devices of this
    machine, or none on the CPU."""
    if (described := sections.from_resolved(device).accelerator_fields()) is not None:
        return described
    if device.get("name") == "cuda":
        return cuda_fields()
    not_applicable = ["accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories"]
    not_applicable += ["accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect"]
    not_applicable += ["accelerator_interconnect_topology"]
    return {"accelerators_per_node": "0", "accelerator_model_name": "N/A"} | dict.fromkeys(not_applicable, "N/A")


def cuda_fields() -> dict[str, str]:
    """The GPUs of this machine (torch is imported only here, where a CUDA run needs it)."""
    import torch

    if not torch.cuda.is_available():
        return {"accelerators_per_node": "", "accelerator_model_name": ""}
    properties = torch.cuda.get_device_properties(0)
    return {
        "accelerators_per_node": str(torch.cuda.device_count()),
        "accelerator_model_name": properties.name,
        "accelerator_memory_capacity": f"{properties.total_memory / 1024**3:.0f} GB",
    }


def software_fields(config: dict[str, Any]) -> dict[str, str]:
    stack = f"Python {platform.python_version()}, mlperf-logging {metadata.version('mlperf-logging')}"
    notes = [f"precision {config['precision']['name']}"] if "precision" in config else []
    if config.get("mlperf", {}).get("clock") == "device":
        notes.append("the MLPerf log is in simulated device time (mlperf.clock=device)")
    return {
        "framework": f"PyTorch {metadata.version('torch')}",
        "other_software_stack": stack,
        "operating_system": operating_system(),
        "sw_notes": "; ".join(notes),
    }


def operating_system() -> str:
    try:
        name = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        name = platform.system()
    return f"{name} ({platform.system()} {platform.release()})"


def checks_are_ours(checks: Path) -> bool:
    """Whether the checkers may write into `checks`: it is new, empty, or marked by an earlier package."""
    return not checks.exists() or (checks / CHECKS_MARK).is_file() or (checks.is_dir() and not any(checks.iterdir()))


def write_package(
    out: Path, org: str, system: str, impl: str, runs: list[Run], description: dict[str, str]
) -> list[Path]:
    """Build the package in a staging directory under OUT, then move its parts into OUT/ORG, results last;
    if anything fails on the way, the staging directory goes and OUT/ORG gains no half-written result. A part
    that exists already (a system description or implementation another result shares, or the user's) is kept:
    returns those."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".package-", dir=out))
    try:
        parts = [
            write_system(staging, system, description),
            write_implementation(staging, impl, system, runs),
            write_results(staging, system, runs),
        ]
        kept = []
        for part in parts:
            destination = out / org / part.relative_to(staging)
            if destination.exists():
                option = "--impl" if part.is_dir() else "--system"
                print(f"kept the existing {destination} (nothing is overwritten; another {option} writes beside it)")
                kept.append(destination)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, destination)
        return kept
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_system(root: Path, system: str, description: dict[str, str]) -> Path:
    path = root / "systems" / f"{system}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(description, indent=2) + "\n")
    return path


def write_results(root: Path, system: str, runs: list[Run]) -> Path:
    results = root / "results" / system / BENCHMARK
    results.mkdir(parents=True)
    for index, run in enumerate(runs):
        shutil.copyfile(run.log, results / f"result_{index}.txt")
    return results


def write_implementation(root: Path, impl: str, system: str, runs: list[Run]) -> Path:
    """The source that ran, and result_0's resolved configuration as config_<system>.yaml."""
    implementation = root / "benchmarks" / BENCHMARK / "implementations" / impl
    for relative in source_files(REPO_ROOT):
        target = implementation / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / relative, target)
    seeds = ", ".join(f"result_{index}: seed {run.seed}" for index, run in enumerate(runs))
    header = f"# The resolved configuration of result_0 on {system}; the runs differ only in run.seed ({seeds}).\n"
    (implementation / f"config_{system}.yaml").write_text(header + yaml.safe_dump(runs[0].config, sort_keys=False))
    return implementation


def source_files(repo: Path) -> list[Path]:
    """The repository's source: tracked files plus new ones git does not ignore (the code that ran may not be
    committed yet); without git, a walk that leaves out environments, run outputs and caches."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\0")
        files = [Path(name) for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        files = [path.relative_to(repo) for path in repo.rglob("*") if not _excluded(path.relative_to(repo))]
    return sorted(path for path in files if (repo / path).is_file())


def _excluded(relative: Path) -> bool:
    return bool(NOT_SOURCE & set(relative.parts)) or relative.suffix in NOT_SOURCE_SUFFIXES


def report_written(
    package: Path, system: str, impl: str, runs: list[Run], description: dict[str, str], kept: list[Path]
) -> None:
    implementation = package / "benchmarks" / BENCHMARK / "implementations" / impl
    files = sum(1 for path in implementation.rglob("*") if path.is_file())
    system_kept = package / "systems" / f"{system}.json" in kept
    print(f"wrote {package}:")
    print(f"  systems/{system}.json" + (" (kept)" if system_kept else ""))
    print(f"  results/{system}/{BENCHMARK}/result_0.txt .. result_{len(runs) - 1}.txt (seeds ", end="")
    print(", ".join(str(run.seed) for run in runs) + ")")
    print(f"  benchmarks/{BENCHMARK}/implementations/{impl}/ ({files} files)")
    empty = [field for field, value in description.items() if value == ""]
    if empty and not system_kept:
        print(f"system fields left empty (set them with --system-field KEY=VALUE): {', '.join(empty)}")


def check_package(out: Path, org: str, system: str, rcp_bypass: bool) -> int:
    """The package checker, the result summarizer and the RCP checker, then the RCP verdict in plain words;
    0 when the package checker accepts the package."""
    checks = out / "checks"
    checks.mkdir(exist_ok=True)
    (checks / CHECKS_MARK).touch()
    package, results = out / org, out / org / "results" / system / BENCHMARK
    passed = run_package_checker(package, checks, rcp_bypass)
    run_result_summarizer(package, system, checks)
    run_rcp_checker(results, checks)
    verdict = rcp.judge_results(results)
    if verdict is not None:
        print(f"\nRCP verdict at global batch {verdict.reference.batch} ({verdict.reference.case}):")
        print(rcp.explain(verdict))
    return 0 if passed else 1


def run_module(module: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in `cwd`, where the checkers leave the files they write by default."""
    command = [sys.executable, "-m", module, *map(str, args)]
    print(f"\n$ python {' '.join(command[1:])}")
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


def run_package_checker(package: Path, checks: Path, rcp_bypass: bool) -> bool:
    log = checks / "package_checker.log"
    bypass = ["--rcp-bypass"] if rcp_bypass else []
    result = run_module(
        "mlperf_logging.package_checker", package, USAGE, RULESET, "--log_output", log, *bypass, cwd=checks
    )
    output = result.stdout + result.stderr
    passed = CHECKER_PASSED in output
    print(f"package checker: {'PASSED' if passed else 'FAILED'} (log: {log})")
    for line in output.splitlines():
        if line.startswith("ERROR") or ("WARNING" in line and "RCP" in line):
            print(f"  {line}")
    return passed


def run_result_summarizer(package: Path, system: str, checks: Path) -> None:
    summary = checks / "summary.csv"
    result = run_module("mlperf_logging.result_summarizer", package, USAGE, RULESET, "--csv", summary, cwd=checks)
    for line in (result.stdout + result.stderr).splitlines():
        if "ERROR" in line or "NOTICE" in line:
            print(f"  {line}")
    row = summary_row(checks / "summary_detailed.json", system)
    if row.get(f"{BENCHMARK}:time_to_train") is None:
        print(f"result summarizer: no score for {system} (see above)")
        return
    print(
        f"result summarizer: score {row[f'{BENCHMARK}:time_to_train']:.4f} minutes for {system}, the olympic mean "
        f"of time-to-train times the scaling factor {row[f'{BENCHMARK}:rcp_scaling_factor']:g} "
        f"(RCP column: {row.get(f'{BENCHMARK}:RCP')}; table: {summary})"
    )


def summary_row(path: Path, system: str) -> dict[str, Any]:
    """The summarizer's row for `system` in the JSON it writes next to its CSV; empty when there is none."""
    rows = json.loads(path.read_text()) if path.is_file() else []
    return next((row for row in rows if row.get("system") == system), {})


def run_rcp_checker(results: Path, checks: Path) -> None:
    log = checks / "rcp_checker.log"
    result = run_module(
        "mlperf_logging.rcp_checker", results, "--rcp_version", RULESET, "--log_output", log, cwd=checks
    )
    verdicts = [line for line in (result.stdout + result.stderr).splitlines() if "RCP test" in line]
    print(f"RCP checker: {verdicts[-1] if verdicts else f'exit status {result.returncode}'} (log: {log})")


if __name__ == "__main__":
    sys.exit(main())
