"""The one-shot GPU check: everything the harness must show on a GPU, in one command of at most 10 minutes.

    make gpu-check                   # on the GPU machine: python3 -m bench.gpu.check --out $OUT
    make gpu-rehearse                # here: the same on the CPU with torch 2.11, at tiny sizes (--tiny)
    python -m bench.gpu.check --out DIR [--tiny] [--stages step,e2e | --preset NAME] [--budget 570]

The next GPU session measures GPU decoding and the step's shape in two calls on the same warm machine, about
6 and 4 minutes on an H200:

    make gpu-check ARGS="--preset feed"            # = --stages env,tests,smoke,decode,loader,train
    make gpu-check ARGS="--preset step-variants"   # = --stages trace,variants

First `setup`: the wheels `make gpu-wheels` carried (hydra-core, omegaconf, mlperf-logging, ...) installed into
build/gpu-site where this Python lacks them, and the JPEG decoder compiled (`make native`, against the carried
libjpeg-turbo headers when they came along). Then each stage runs in its own process, with its own time cap cut
to what is left of the budget; a stage that fails or runs out of time is recorded with the tail of its log (and
the figures it saved before), and the next one runs:

  env       versions, the GPU's name, memory and clocks, the host's CPU, the decoder      bench/gpu/env.py
  tests     the tests marked cuda (pytest -m cuda)                                      tests/test_cuda.py
  smoke     train.py experiment=smoke on the device, decoding there, to its target,
            log checked                                                                 bench/gpu/smoke.py
  decode    the fused CPU decoder per core, decode_crops on the GPU alone and beside
            the best step, and their pixels compared                                    bench/gpu/decode.py
  loader    the input pipeline at 224 px with 4, 8 and every core but one of workers,
            decoding in them, on the GPU, or split (data.decode=hybrid)                 bench/gpu/pipeline.py
  train     train.py with device=cuda's defaults on the photos (data.decode=auto; and
            data.decode=cpu): the headline figure                                       bench/gpu/train.py
  step      the step at 224 px, batch 256: plain loops, the harness and its options     bench/gpu/step.py
  trace     the best step under torch.profiler: its top kernels, the GPU busy and idle  bench/gpu/trace.py
  variants  the best step at batch 400 and 384, and with its input padded               bench/gpu/step.py
  e2e       the harness end to end, the loader feeding, fastest settings found          bench/gpu/pipeline.py

The whole check no longer fits its budget (the step stage alone takes about 220 s); a session splits it with
--stages or --preset, on the same warm machine. DIR receives gpu.json ({"stages": {name: {"status": "ok" |
"failed" | "skipped", "seconds": ..., figures}}, "winners": the settings that won, from report.winners}), gpu.md
(the tables) and one log per stage. With --stages or --preset, the stages run now join those an earlier check on
this machine recorded in WORK/gpu.json, so a check may be split over two device calls on the same warm machine.
DIR and WORK are the check's own (bench.folders): new, empty or an earlier check's; a folder of other files is
refused.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.folders import claim

REPO = Path(__file__).resolve().parents[2]
CARRIED = REPO / ".gpu"  # what `make gpu-wheels` prepares: wheels/, jpeg/ (libjpeg-turbo), include/ (Python)
SITE = REPO / "build" / "gpu-site"
NEEDED = ("hydra", "omegaconf", "mlperf_logging", "submitit", "hydra_plugins.hydra_submitit_launcher")
TAIL_LINES = 15
REHEARSAL_CAPS = 4
Figures = dict[str, object]


@dataclass(frozen=True)
class Stage:
    """A command run in its own process, and how to read what it measured from the scratch folder afterwards."""

    name: str
    cap_s: float  # on a GPU; the rehearsal's (--tiny) are REHEARSAL_CAPS times longer: its smoke run is on a CPU
    command: Callable[[argparse.Namespace], list[str]]  # from the check's arguments (its scratch folder, --tiny)
    result: str  # the file in the scratch folder that it writes what it measured to
    figures: Callable[[Path], Figures]  # read from that file


def bench_stage(name: str, cap_s: float, module: str, *module_args: str) -> Stage:
    """A stage that is a bench.gpu module: it writes its figures to WORK/<name>.json (bench/gpu/stage.py)."""

    def command(args: argparse.Namespace) -> list[str]:
        tiny = ["--tiny"] if args.tiny else []
        return [sys.executable, "-m", module, *module_args, "--json", str(args.work / f"{name}.json"),
                "--work", str(args.work), *tiny]  # fmt: skip

    return Stage(name, cap_s, command, f"{name}.json", lambda path: json.loads(path.read_text()))


def cuda_tests(args: argparse.Namespace) -> list[str]:
    """pytest -m cuda over the test files that hold cuda tests (the others may import what the GPU machine lacks)."""
    files = sorted(
        str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py") if "mark.cuda" in path.read_text()
    )
    junit = args.work / "tests.xml"
    return [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]


def junit_counts(path: Path) -> Figures:
    """Passed, failed, skipped and errors from pytest's JUnit XML report."""
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    if counts["skipped"] and not counts["passed"]:
        counts["skipped_reason"] = "no CUDA device: every cuda test skips here"
    return counts


# In the order they run. The caps are what each may take on an H200 (the step stage took 220 s there on 2026-11-27;
# each new shape or setting of the compiled step about 50 s the first time, about 10 s once compiled on the machine).
STAGES = (
    bench_stage("env", 30, "bench.gpu.env"),
    Stage("tests", 90, cuda_tests, "tests.xml", junit_counts),
    bench_stage("smoke", 150, "bench.gpu.smoke"),
    bench_stage("decode", 120, "bench.gpu.decode"),  # compiles the best step: the later stages find it compiled
    bench_stage("loader", 90, "bench.gpu.pipeline", "loader"),
    bench_stage("train", 180, "bench.gpu.train"),
    bench_stage("step", 330, "bench.gpu.step"),
    bench_stage("trace", 60, "bench.gpu.trace"),
    bench_stage("variants", 220, "bench.gpu.step", "variants"),  # three new compiles: last, saved row by row
    bench_stage("e2e", 90, "bench.gpu.pipeline", "e2e"),
)
# Named sets of stages, for one device call each (they run in STAGES' order).
PRESETS = {
    # Feeding the GPU: a run to its target decoding on the GPU, the decoders, the loader's split, train.py with
    # data.decode=auto. About 390 s on an H200 (env 15 s, tests 40, smoke 90, decode 80, loader 55, train 110, by
    # the 2026-11-27 calls' timings).
    "feed": ("env", "tests", "smoke", "decode", "loader", "train"),
    # The step's shape: its CUDA trace, then the best step at batch 400 and 384 and padded. About 240 s (the best
    # step compiled once more on a fresh process, 25 s of trace, 165 s for the variants' three new compiles).
    "step-variants": ("trace", "variants"),
}


def setup() -> tuple[Figures, dict[str, str]]:
    """Install the carried wheels where this Python lacks them and compile the decoder; the figures and the
    environment the stages run in."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    figures: Figures = {}
    missing = [name for name in NEEDED if not _importable(name)]
    if missing:
        wheels = sorted(str(path) for path in (CARRIED / "wheels").glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"{', '.join(missing)} missing and no wheels in {CARRIED}/wheels: run make gpu-wheels")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        _run([*pip, "--upgrade", "--target", str(SITE), *wheels], env)
        figures["wheels"] = f"{len(wheels)} installed into {SITE.relative_to(REPO)} for {', '.join(missing)}"
    if SITE.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), str(REPO), env.get("PYTHONPATH")]))
    figures["decoder"] = build_decoder(env)
    return figures, env


def build_decoder(env: dict[str, str]) -> str:
    """`make native` for this Python, against the carried libjpeg-turbo where it came along (its library then
    found by rpath), with the carried Python headers where this Python has none."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        include = CARRIED / "include" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    jpeg = CARRIED / "jpeg" / "usr"
    prefix = jpeg if (jpeg / "include" / "jpeglib.h").exists() else Path("/usr")
    make = [
        "make",
        "--no-print-directory",
        "native",
        f"PYTHON={sys.executable}",
        f"PY_INCLUDE={include}",
        f"JPEG_PREFIX={prefix}",
    ]
    output = _run(make, env)
    return f"make native JPEG_PREFIX={prefix} PY_INCLUDE={include}: {output.strip().splitlines()[-1]}"


def run_stage(stage: Stage, env: dict[str, str], args: argparse.Namespace, cap_s: float) -> Figures:
    """One stage in its own process, its log in OUT/<name>.log; its status, seconds and figures, and where it
    failed, why, with the tail of its log."""
    command = stage.command(args)
    result_file = args.work / stage.result
    result_file.unlink(missing_ok=True)  # no figures of an earlier check
    log = args.out / f"{stage.name}.log"
    started = time.perf_counter()
    with log.open("w") as out:
        out.write(" ".join(command) + "\n\n")
        out.flush()
        try:
            done = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=cap_s)
            problem = None if done.returncode == 0 else f"exit status {done.returncode}"
        except subprocess.TimeoutExpired:
            problem = f"timed out after {cap_s:.0f} s"
    result: Figures = {"status": "ok" if problem is None else "failed"}
    result["seconds"] = round(time.perf_counter() - started, 1)
    if result_file.exists():
        result = stage.figures(result_file) | result
    if problem:
        result["error"] = f"{problem}: " + " | ".join(log.read_text().splitlines()[-TAIL_LINES:])
    return result


def check(args: argparse.Namespace, stages: tuple[Stage, ...] = STAGES) -> dict[str, Figures]:
    """Setup, then each wanted stage while the budget lasts; gpu.json and gpu.md rewritten after each."""
    deadline = time.perf_counter() + args.budget
    claim(args.out, "--out")
    claim(args.work, "--work")
    results = earlier(args.work) if args.stages else {}
    started = time.perf_counter()
    try:
        figures, env = setup()
        results["setup"] = {"status": "ok", **figures}
    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
        results["setup"] = {"status": "failed", "error": str(err)[-2000:]}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    results["setup"]["seconds"] = round(time.perf_counter() - started, 1)
    for stage in stages:
        if args.stages and stage.name not in args.stages:
            continue
        left = deadline - time.perf_counter()
        if left < 10:
            results[stage.name] = {"status": "skipped", "seconds": 0, "reason": "the check's time budget ran out"}
        else:
            cap_s = stage.cap_s * (REHEARSAL_CAPS if args.tiny else 1)
            results[stage.name] = run_stage(stage, env, args, min(cap_s, left))
        print(f"{stage.name}: {results[stage.name]['status']} in {results[stage.name]['seconds']} s", flush=True)
        write(results, args.out, args.work)
    return results


def earlier(work: Path) -> dict[str, Figures]:
    """The stages an earlier check recorded in WORK (none where there was none)."""
    path = work / "gpu.json"
    return json.loads(path.read_text())["stages"] if path.exists() else {}


def write(stages: dict[str, Figures], out: Path, work: Path) -> None:
    """gpu.json and gpu.md into OUT, gpu.json into WORK too (for a later --stages to add to); the repository's
    paths relative to it, so that no record names the machine's folders."""
    from bench.gpu.report import table, winners

    text = json.dumps({"stages": stages, "winners": winners(stages)}, indent=1)
    (out / "gpu.json").write_text(relative(text))
    (work / "gpu.json").write_text(text)
    (out / "gpu.md").write_text(relative(table(stages)))


def relative(text: str) -> str:
    """`text` with the repository's absolute paths made relative to it."""
    return text.replace(f"{REPO}/", "")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... failed: {(done.stdout + done.stderr)[-1500:]}")
    return done.stdout or "done"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "build/gpu-check"))
    parser.add_argument("--work", type=Path, default=REPO / "build" / "gpu-work", help="the stages' scratch folder")
    parser.add_argument("--tiny", action="store_true", help="the CPU rehearsal: tiny sizes")
    names = [stage.name for stage in STAGES]
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--stages", type=lambda text: text.split(","), help=f"of {','.join(names)} (default: all)")
    presets = "; ".join(f"{name}: {','.join(stages)}" for name, stages in PRESETS.items())
    chosen.add_argument("--preset", choices=sorted(PRESETS), help=f"a named set of stages ({presets})")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for all stages, setup included")
    args = parser.parse_args(argv)
    if args.preset:
        args.stages = list(PRESETS[args.preset])
    if unknown := set(args.stages or ()) - set(names):
        parser.error(f"--stages: no stage {', '.join(sorted(unknown))}; the stages are {', '.join(names)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = check(args)
    print((args.out / "gpu.md").read_text())
    return 0 if all(result["status"] != "failed" for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
