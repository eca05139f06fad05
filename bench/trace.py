"""Where the harness's eager bf16 train step allocates, casts and dispatches more than the plain PyTorch loop.

    python -m bench.trace [--batch 8] [--image 64] [--steps 2] [--warmup 1] [--top 8] [--threads N]
                          [--defaults cuda|cpu] [OVERRIDE ...]

Both steps run on the CPU under torch.profiler (https://pytorch.org/docs/stable/profiler.html:
`torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True)`), on the same
random batch, after `warmup` untimed steps (the first creates the momentum buffers):

  harness  bench.gpu.step.harness(): projection.families.build_backend on the composed config with device=cpu and
           bench.gpu.step.EAGER (precision=bf16 device.compile=false device.cuda_graphs=false: the eager bf16 step),
           the config's optimizer (LARS), the uint8 NHWC batch normalised inside the model. precision.emulate=never:
           natively in bf16, on the same dtype path as the plain loop's autocast (the harness's default on a CPU
           without native bf16 is fp32 arithmetic rounded per layer, another path altogether).
           --defaults cuda (the default) first sets the speed options (bench.gpu.step.SPEED_OPTIONS) as a CUDA
           run gets them: configs/device/cuda.yaml's values, and true for device.foreach and
           device.bn_16bit_input, which the config leaves None and the native backend turns on for CUDA only:
           the step a CUDA user gets, on the CPU. --defaults cpu leaves them as the CPU resolves them.
           OVERRIDEs come last, e.g. device.bn_16bit_input=false.
  plain    bench.gpu.step.plain_loop(): torchvision's resnet50, channels-last, forward under
           torch.autocast(bfloat16), loss in fp32, SGD momentum 0.9 (fused where available: on CUDA), the input
           a float batch normalised once outside the step.

Per step, each side's:

  op calls     every aten:: operator call the profiler recorded, nested ones included (aten::conv2d and the
               aten::convolution inside it are two): what the dispatcher did
  allocated    the bytes of every CPU allocation made during the step: the profiler's [memory] events with
               positive size, summed (from its raw events, `prof.profiler.kineto_results.events()`: the
               FunctionEvents fold those made inside an op into its memory usage). Not the ops' self CPU memory,
               which nets each allocation against the frees in the same op and so hides temporaries. Each
               allocation is attributed to the outermost aten:: operator around it (the call the Python code or
               the autograd engine made) for the table of ops.
  cast bytes   the bytes written by dtype casts: every aten::copy_ whose destination's dtype differs from its
               source's (aten::to and aten::_to_copy end in one), its destination's size
  top ops      by calls (every aten:: name) and by bytes allocated (outermost aten:: operator)

and the ratio harness / plain of each. The last line is JSON: "ops_ratio", "bytes_ratio", "cast_bytes_ratio"
and both sides' raw figures per step ("harness" and "plain": "ops", "bytes", "cast_bytes").
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

from bench.gpu import stage
from bench.gpu.step import CLASSES, EAGER, SPEED_OPTIONS, harness, plain_loop
from models import random_batch

MEMORY = "[memory]"  # the profiler's name for an allocation (positive bytes) or a free (negative)
OUTSIDE = "(no aten op)"
# the dtype names record_shapes reports (c10's), with their sizes in bytes
ITEMSIZE = {
    "double": 8,
    "float": 4,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::complex<double>": 16,
    "c10::complex<float>": 8,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
NATIVE = "precision.emulate=never"  # bf16 kernels, as autocast runs them, where the CPU's default may emulate


def eager_keys() -> set[str]:
    return {override.split("=")[0] for override in EAGER}


def as_on_cuda() -> list[str]:
    """The speed options as a CUDA run gets them by default, set explicitly: configs/device/cuda.yaml's values,
    and true for those it leaves None (the native backend turns them on for CUDA only); but device.compile and
    device.cuda_graphs, which the eager step (bench.gpu.step.EAGER) turns off."""
    device = stage.composed(["device=cuda"]).device
    options = []
    for option in SPEED_OPTIONS:
        if option not in eager_keys():
            value = getattr(device, option.removeprefix("device."))
            options.append(f"{option}={'true' if value is None else str(value).lower()}")
    return options


def harness_overrides(defaults: str, extra: list[str]) -> list[str]:
    """The harness's config overrides: CUDA's speed options (`defaults` "cuda") or the CPU's, the eager bf16 step
    of bench.gpu.step, native bf16, then `extra`."""
    return [*(as_on_cuda() if defaults == "cuda" else []), *EAGER, NATIVE, *extra]


@dataclass
class Trace:
    """One side's figures per step."""

    ops: float = 0.0
    bytes: float = 0.0
    cast_bytes: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)  # aten:: name -> calls per step
    allocated: Counter[str] = field(default_factory=Counter)  # outermost aten:: name -> bytes per step
    casts: Counter[str] = field(default_factory=Counter)  # "src->dst" -> bytes per step

    def figures(self) -> dict[str, float]:
        return {"ops": round(self.ops, 1), "bytes": round(self.bytes), "cast_bytes": round(self.cast_bytes)}


def itemsize(dtype: str) -> int:
    if dtype not in ITEMSIZE:
        raise ValueError(f"a cast to {dtype!r}, whose size bench.trace does not know: add it to ITEMSIZE")
    return ITEMSIZE[dtype]


def analyse(events: list, steps: int) -> Trace:
    """The figures of `steps` steps from the profiler's raw (kineto) events, per step."""
    trace = Trace()
    ops: dict[int, list] = {}  # thread -> its operator events
    allocations: list = []
    for event in events:
        if event.device_type() != torch.autograd.DeviceType.CPU:
            continue
        if event.name() == MEMORY:
            if event.nbytes() > 0:
                allocations.append(event)
            continue
        ops.setdefault(event.start_thread_id(), []).append(event)
        name = event.name()
        if not name.startswith("aten::"):
            continue
        trace.calls[name] += 1
        dtypes = event.dtypes()
        if name == "aten::copy_" and len(dtypes) >= 2 and dtypes[0] != dtypes[1]:
            size = math.prod(event.shapes()[0]) * itemsize(dtypes[0])
            trace.casts[f"{dtypes[1]}->{dtypes[0]}"] += size
    for owner, size in attribute(ops, allocations):
        trace.allocated[owner] += size
    trace.ops = sum(trace.calls.values()) / steps
    trace.bytes = sum(trace.allocated.values()) / steps
    trace.cast_bytes = sum(trace.casts.values()) / steps
    for counter in (trace.calls, trace.allocated, trace.casts):
        for key in counter:
            counter[key] /= steps
    return trace


def attribute(ops: dict[int, list], allocations: list) -> list[tuple[str, int]]:
    """Each allocation's size with the outermost aten:: operator running on its thread when it was made."""
    tops: dict[int, tuple[list[int], list[int], list[str]]] = {}
    for thread, events in ops.items():
        starts, ends, names = [], [], []
        for event in sorted(events, key=lambda e: (e.start_ns(), -e.end_ns())):
            if not event.name().startswith("aten::"):
                continue
            if ends and event.start_ns() < ends[-1]:
                continue  # inside the last outermost aten op
            starts.append(event.start_ns())
            ends.append(event.end_ns())
            names.append(event.name())
        tops[thread] = (starts, ends, names)
    owned = []
    for allocation in allocations:
        starts, ends, names = tops.get(allocation.start_thread_id(), ([], [], []))
        i = bisect.bisect_right(starts, allocation.start_ns()) - 1
        inside = i >= 0 and allocation.start_ns() <= ends[i]
        owned.append((names[i] if inside else OUTSIDE, allocation.nbytes()))
    return owned


def profiled(step: Callable[[], object], warmup: int, steps: int) -> Trace:
    """`step` run `warmup` times, then `steps` times under the profiler: its figures per step."""
    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU]
    with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        for _ in range(steps):
            step()
    return analyse(list(prof.profiler.kineto_results.events()), steps)


def ratio(subject: float, peer: float) -> float:
    return round(subject / peer, 4) if peer else float("inf")


def megabytes(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def calls(count: float) -> str:
    return f"{count:g}"


def side_by_side(title: str, rows: list[list[tuple[str, str]]], width: int = 44) -> None:
    """Two columns of (name, value) rows, harness's then plain's."""
    print(f"\n{title}")
    print(f"  {'harness':<{width + 13}}   plain")
    for i in range(max(len(column) for column in rows)):
        cells = [column[i] if i < len(column) else ("", "") for column in rows]
        print("  " + "   ".join(f"{name[:width]:<{width}} {value:>12}" for name, value in cells))


def table(traces: dict[str, Trace], top: int) -> None:
    ours, theirs = traces["harness"], traces["plain"]
    print(f"{'per step':<16} {'harness':>14} {'plain':>14} {'harness/plain':>14}")
    for label, key, show in (
        ("op calls", "ops", calls),
        ("allocated", "bytes", megabytes),
        ("cast bytes", "cast_bytes", megabytes),
    ):
        a, b = getattr(ours, key), getattr(theirs, key)
        print(f"{label:<16} {show(a):>14} {show(b):>14} {ratio(a, b):>13.3f}x")
    for title, key, show in (("calls", "calls", calls), ("bytes allocated", "allocated", megabytes)):
        columns = [[(n, show(v)) for n, v in getattr(t, key).most_common(top)] for t in (ours, theirs)]
        side_by_side(f"top ops by {title} per step", columns)
    print("\nwhere the harness differs most per step (harness - plain)")
    for title, key, show in (("calls", "calls", calls), ("bytes allocated", "allocated", megabytes)):
        a, b = getattr(ours, key), getattr(theirs, key)
        differences = sorted(((a[n] - b[n], n) for n in set(a) | set(b)), key=lambda d: -abs(d[0]))[:top]
        shown = ", ".join(f"{name} {'+' if d > 0 else '-'}{show(abs(d))}" for d, name in differences if d)
        print(f"  {title}: {shown or 'none'}")
    print("\ncasts (source->destination) per step")
    for side, trace in traces.items():
        casts = ", ".join(f"{kind} {megabytes(size)}" for kind, size in trace.casts.most_common(top) if size >= 1e3)
        print(f"  {side:<8} {casts or 'none'}")


def run(args: argparse.Namespace) -> dict[str, object]:
    if args.threads:
        torch.set_num_threads(args.threads)
    images, labels = random_batch(args.batch, args.image, CLASSES, torch.Generator().manual_seed(0))
    overrides = harness_overrides(args.defaults, args.overrides)
    sizes = stage.Sizes(batch=args.batch, image=args.image, warmup=args.warmup, steps=args.steps, photos=0, workers=())
    torch.manual_seed(0)
    harness_step, _ = harness(overrides, sizes, images, labels)
    traces = {"harness": profiled(harness_step, args.warmup, args.steps)}
    del harness_step
    torch.manual_seed(0)
    plain_step = plain_loop(torchvision.models.resnet50(num_classes=CLASSES), images, labels)
    traces["plain"] = profiled(plain_step, args.warmup, args.steps)

    print(
        f"ResNet-50 train step, batch {args.batch} at {args.image}x{args.image}, bf16 autocast on the CPU (native bf16 "
        f"kernels in both: the harness with precision.emulate=never), {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}; {args.steps} profiled steps after {args.warmup} warm-up"
    )
    how = "CUDA's defaults, set explicitly" if args.defaults == "cuda" else "the CPU's defaults"
    print(f"harness overrides ({how}): {' '.join(overrides)}\n")
    table(traces, args.top)
    harness_trace, plain = traces["harness"], traces["plain"]
    figures: dict[str, object] = {
        "batch": args.batch,
        "image": args.image,
        "steps": args.steps,
        "defaults": args.defaults,
        "overrides": overrides,
        "harness": harness_trace.figures(),
        "plain": plain.figures(),
    }
    for key in ("ops", "bytes", "cast_bytes"):
        figures[f"{key}_ratio"] = ratio(harness_trace.figures()[key], plain.figures()[key])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=64, help="image height and width")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=1, help="steps before the profiled ones (at least 1)")
    parser.add_argument("--top", type=int, default=8, help="ops listed per table")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--defaults",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda: device.bn_16bit_input=true device.foreach=true, as they resolve on CUDA; cpu: as on the CPU",
    )
    parser.add_argument("overrides", nargs="*", help="more harness config overrides")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.image < 32 or args.steps < 1 or args.warmup < 1:
        print("error: --batch and --steps and --warmup must be at least 1, --image at least 32", file=sys.stderr)
        return 2
    figures = run(args)
    print()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
