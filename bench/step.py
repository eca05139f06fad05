"""What the harness's train step costs over a bare PyTorch loop that does the same arithmetic.

    python -m bench.step [--batch 32] [--size 96] [--steps 6] [--warmup 2] [--rounds 2]
                         [--policies fp32,bf16,fp16] [--ipu-replicas 4] [--threads N]

For each precision policy two ResNet-50s are built the same way from the same seed (1000 classes, BatchNorm,
zero-initialised residual gammas, channels-last, uint8 NHWC input normalised inside the model), each with
torch.optim.SGD (momentum 0.9), and trained on the same random batch:

  harness  backends.native.NativeBackend(...).train_step(images, labels, lr) under optim.precision.Policy
  bare     the same step written plainly here, with no harness code: zero_grad(set_to_none=True), forward,
           label-smoothed cross-entropy in fp32, backward, SGD step, with the policy's numerics done by hand:
    fp32   nothing more
    bf16   on a CPU with native bf16 (AVX512_BF16 or AMX, optim.precision.cpu_has_native_bf16): forward under
           torch.autocast("cpu", bfloat16), BatchNorm inputs cast to fp32 by a pre-hook; on one without, where
           the harness emulates bf16, emulated as fp16 is below, in bf16 and without loss scaling
    fp16   emulated: fp32 arithmetic, the image entering conv1 and the outputs of Conv2d/Linear/BatchNorm2d/ReLU/
           MaxPool2d/AdaptiveAvgPool2d rounded to fp16 by hooks, the conv/linear weights rounded to fp16 through
           torch.func.functional_call, the loss scaled, the gradients unscaled and checked in one
           torch._amp_foreach_non_finite_check_and_unscale_ and one host sync, the update skipped (and the
           scale halved) when one is not finite

The JSON also carries bf16_over_fp32, the harness's bf16 rate over its fp32 rate: what bf16 buys on this CPU,
emulated or not. Where oneDNN has bf16 kernels at all (AVX-512 and up) a last row (bf16_native) times the
harness's bf16 run natively (precision.emulate=never) against it emulated (always): the one the harness picks by
default there must be the faster. With AVX2 alone oneDNN's bf16 is reference code, too slow to time here.

The ipu_sim row (--ipu-replicas R, 0 leaves it out) compares the simulated IPU's step with the native one at the
same numerics, in fp32: projection.ipu.backend.IpuSimBackend with R virtual replicas (BatchNorm per replica, each with
its own running statistics, and the simulated clock) against NativeBackend accumulating R micro-batches: both run
R forward and backward passes of batch/R images and one update, so what differs is the simulation's bookkeeping.

The two loops of a row are interleaved step by step: each round runs `warmup` untimed steps of each, then `steps` timed
steps of each in the order harness, bare, bare, harness, harness, ... (the next round starts with the other
one), so that both see the same machine: here its speed drifts by 10-20% over seconds, which rounds of one
loop at a time turn into ratios off by as much. A loop's rate in a round is its images over its summed step
times, and its best round counts (the machine is shared, and interference only ever slows a step down); the
ratio over all timed steps is shown beside it (it averages the step-to-step noise over every pair, where the
best rounds rest on one round each). The last line is JSON: per policy both rates and their ratio
(harness / bare), and the smallest ratio; for ipu_sim both rates and ipu_sim / native.

Both loops free the last step's gradients at the start of the next, as the harness does: interleaved, where
each one frees them decides whose freed memory the other reuses, and with the bare loop freeing them at the
end of its step it came out 3-6% slower than the harness in emulated fp16 (either built first).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from backends.base import StepSettings
from backends.native import NativeBackend
from models import batchnorm, build_resnet50
from optim.precision import Policy, emulates
from projection.ipu.backend import IpuSimBackend

CLASSES = 1000
LR = 0.01
MOMENTUM = 0.9
LABEL_SMOOTHING = 0.1
SEED = 0
INIT_SCALE = 2.0**15

NATIVE_BF16 = not emulates("bf16", "auto", "cpu")
ONEDNN_BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # kernels of its own, native or not
POLICIES = {
    "fp32": Policy("fp32"),
    "bf16": Policy("bf16", compute="bf16", emulated=not NATIVE_BF16),
    "fp16": Policy("fp16.32", compute="fp16", loss_scaling="dynamic", init_scale=INIT_SCALE, emulated=True),
}
EMULATED_BF16 = Policy("bf16", compute="bf16", emulated=True)
NATIVE_BF16_POLICY = Policy("bf16", compute="bf16", emulated=False)
ROUNDED_LAYERS = (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d)


@dataclass
class Loop:
    """One way of training: `step(images, labels)` runs one training step; `skipped()` counts skipped updates."""

    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    skipped: Callable[[], int]


def build_model() -> nn.Module:
    torch.manual_seed(SEED)
    return build_resnet50(CLASSES, batchnorm(0.1, 1e-5), zero_init_residual=True, channels_last=True)


def sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def harness(policy: Policy, grad_accum: int = 1) -> Loop:
    model = build_model()
    step = StepSettings(label_smoothing=LABEL_SMOOTHING, policy=policy, seed=SEED, grad_accum=grad_accum)
    backend = NativeBackend(model, sgd(model), torch.device("cpu"), step)
    return backend_loop(backend)


def ipu_sim(replicas: int) -> Loop:
    model = build_model()
    step = StepSettings(label_smoothing=LABEL_SMOOTHING, seed=SEED)
    backend = IpuSimBackend(model, sgd(model), torch.device("cpu"), step, replicas=replicas)
    return backend_loop(backend)


def backend_loop(backend: NativeBackend) -> Loop:
    return Loop(lambda images, labels: backend.train_step(images, labels, LR), lambda: backend.skipped_steps)


def bare(policy: str, emulated_bf16: bool = not NATIVE_BF16) -> Loop:
    """The plain loop for `policy` (a key of POLICIES); bf16 emulated or native as the harness does it here."""
    model = build_model()
    model.train()
    optimizer = sgd(model)
    if policy == "fp32" or (policy == "bf16" and not emulated_bf16):
        bf16 = policy == "bf16"
        if bf16:
            for module in model.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.register_forward_pre_hook(lambda module, inputs: (inputs[0].float(),))

        def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(images)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=LABEL_SMOOTHING)
            loss.backward()
            optimizer.step()
            return loss.detach()

        return Loop(step, lambda: 0)

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[policy]
    for module in model.modules():
        if isinstance(module, ROUNDED_LAYERS):
            module.register_forward_hook(lambda module, inputs, output: output.to(dtype).float())
    model.conv1.register_forward_pre_hook(lambda module, inputs: (inputs[0].to(dtype).float(),))
    weights = {
        f"{prefix}.{name}": param
        for prefix, module in model.named_modules()
        if isinstance(module, (nn.Conv2d, nn.Linear))
        for name, param in module.named_parameters(recurse=False)
    }
    params = list(model.parameters())
    state = {"scale": INIT_SCALE if policy == "fp16" else 1.0, "skipped": 0}

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        rounded = {name: weight.to(dtype).float() for name, weight in weights.items()}
        logits = functional_call(model, rounded, (images,), strict=False)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=LABEL_SMOOTHING)
        (loss * state["scale"]).backward()
        found_inf = torch.zeros(())
        grads = [p.grad for p in params if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.full((), 1.0 / state["scale"]))
        if found_inf.item():
            state["scale"] /= 2.0
            state["skipped"] += 1
        else:
            optimizer.step()
        return loss.detach()

    return Loop(step, lambda: state["skipped"])


def timed_rounds(
    loops: dict[str, Loop], images: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Each loop's images per second in each round, the loops interleaved step by step (ABBA)."""
    rates: dict[str, list[float]] = {name: [] for name in loops}
    for index in range(args.rounds):
        order = list(loops) if index % 2 == 0 else list(reversed(loops))
        for _ in range(args.warmup):
            for name in order:
                loops[name].step(images, labels)
        gc.collect()
        elapsed = dict.fromkeys(loops, 0.0)
        for step in range(args.steps):
            for name in order if step % 2 == 0 else reversed(order):
                start = time.perf_counter()
                loops[name].step(images, labels)  # on the CPU the step has finished when it returns
                elapsed[name] += time.perf_counter() - start
        for name in loops:
            rates[name].append(args.steps * len(labels) / elapsed[name])
    return rates


def compare(
    row: str, loops: dict[str, Loop], images: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace
) -> dict[str, float]:
    """Two loops timed side by side: the rates of each, and the first's over the second's."""
    rates = timed_rounds(loops, images, labels, args)
    print(f"{row}: img/s per round, " + ", ".join(f"{n} " + " ".join(f"{r:.1f}" for r in rates[n]) for n in loops))
    best = {name: max(rates[name]) for name in loops}
    pooled = {name: len(rates[name]) / sum(1 / rate for rate in rates[name]) for name in loops}  # all timed steps
    subject, peer = loops
    return {
        **{f"{name}_img_s": round(best[name], 2) for name in loops},
        "ratio": round(best[subject] / best[peer], 3),
        "ratio_all_steps": round(pooled[subject] / pooled[peer], 3),
        **{f"{name}_skipped": loops[name].skipped() for name in loops},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=96, help="image height and width")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument("--ipu-replicas", type=int, default=4, help="ipu_sim row's virtual replicas (0: no row)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown or not policies:
        print(f"error: --policies: unknown {unknown or 'empty'}; choose from {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    if args.ipu_replicas < 0 or (args.ipu_replicas and args.batch % args.ipu_replicas):
        print(f"error: --ipu-replicas {args.ipu_replicas} must be 0 or divide --batch {args.batch}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)

    generator = torch.Generator().manual_seed(SEED)
    images = torch.randint(0, 256, (args.batch, args.size, args.size, 3), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, CLASSES, (args.batch,), generator=generator)
    figures: dict[str, dict[str, float] | float] = {}
    for policy in policies:
        figures[policy] = compare(
            policy, {"harness": harness(POLICIES[policy]), "bare": bare(policy)}, images, labels, args
        )
        gc.collect()
    if args.ipu_replicas:
        replicas = args.ipu_replicas
        loops = {"ipu_sim": ipu_sim(replicas), "native": harness(POLICIES["fp32"], grad_accum=replicas)}
        figures["ipu_sim"] = compare("ipu_sim", loops, images, labels, args)
    if ONEDNN_BF16 and "bf16" in policies:
        loops = {"native": harness(NATIVE_BF16_POLICY), "emulated": harness(EMULATED_BF16)}
        figures["bf16_native"] = compare("bf16_native", loops, images, labels, args)

    print(
        f"\nResNet-50, batch {args.batch} at {args.size}x{args.size}, SGD momentum {MOMENTUM}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"best of {args.rounds} interleaved rounds of {args.steps} steps (+{args.warmup} warm-up)\n"
    )
    print(f"{'policy':<8} {'harness img/s':>14} {'bare img/s':>11} {'ratio':>7} {'all steps':>10} {'skipped h/b':>12}")
    for policy in policies:
        f = figures[policy]
        skipped = f"{f['harness_skipped']}/{f['bare_skipped']}"
        print(
            f"{policy:<8} {f['harness_img_s']:14.2f} {f['bare_img_s']:11.2f} {f['ratio']:6.3f}x "
            f"{f['ratio_all_steps']:9.3f}x {skipped:>12}"
        )
    figures["min_ratio"] = min(figures[policy]["ratio"] for policy in policies)
    if {"fp32", "bf16"} <= set(policies):
        bf16_over_fp32 = figures["bf16"]["harness_img_s"] / figures["fp32"]["harness_img_s"]
        figures |= {"bf16_emulated": not NATIVE_BF16, "bf16_over_fp32": round(bf16_over_fp32, 3)}
        how = "native" if NATIVE_BF16 else "emulated: this CPU has no native bf16"
        print(f"\nbf16 ({how}) over fp32, harness: {bf16_over_fp32:.3f}x")
    if args.ipu_replicas:
        f = figures["ipu_sim"]
        print(
            f"\nipu_sim, {args.ipu_replicas} virtual replicas, fp32: {f['ipu_sim_img_s']:.2f} img/s against native "
            f"accumulating {args.ipu_replicas} micro-batches {f['native_img_s']:.2f} img/s: {f['ratio']:.3f}x "
            f"({f['ratio_all_steps']:.3f}x over all steps)"
        )
    if "bf16_native" in figures:
        f = figures["bf16_native"]
        print(
            f"bf16 native {f['native_img_s']:.2f} img/s against emulated {f['emulated_img_s']:.2f} img/s: "
            f"{f['ratio']:.3f}x"
        )
    print()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
