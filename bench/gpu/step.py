"""Stage `step`: the train step at 224 px, batch 256, on a synthetic batch already on the GPU.

Rows, each built fresh in this process and timed alone (warm-up steps first, the device drained around the
timed ones), with its peak GPU memory:

  bare           torchvision's ResNet-50, channels-last, forward under torch.autocast (bf16), loss in fp32,
                 torch.optim.SGD(fused=True, momentum 0.9): no harness code, the input a normalised float batch
  bare_compiled  the same loop with the model through torch.compile: what any PyTorch 2 user writes, the peer of
                 a compiled harness
  base, +OPTION  the harness (backends.native through projection.families.build_backend: LARS, the uint8 NHWC
                 batch normalised inside the model) in bf16 with every speed option of the config off, then each one
                 on alone
                 (SPEED_OPTIONS below: the set grows as options are added)
  best           bf16 with every option that beat base on together (the e2e stage's step), and its eval rate
  defaults       the harness as `device=cuda` gives it (bf16), where that differs from best
  eager          the defaults without device.compile and device.cuda_graphs: the eager step, against bare
  bare_again     the bare loop once more, last: how far two timings of the same loop differ

Stage `variants` (`python -m bench.gpu.step variants`): the best step (best_known: the step stage's best row's
settings where this machine's check measured them, else the device's defaults, which were those settings on
2026-11-27) and what might beat it, each row with its peak memory:

  best           the best step at batch 256, as the step stage measures it
  best@400       the same at batch 400 per GPU (NVIDIA's MLPerf recipe on an H200), then best@384
  best+pad       the same with device.pad_input_channels (the input padded to 4 channels: it lost alone, but
                 cuDNN's and the compiler's kernels may want it together); best-pad, without it, where the best
                 step pads already

Every row compiles anew (dynamo is reset between rows, so that no row inherits another's shapes as dynamic).
cuDNN's autotuner (torch.backends.cudnn.benchmark) is on for every row, as every GPU training script sets it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

from backends import build
from bench.gpu import stage
from configs.schema import batch_shape
from distributed import Topology
from models.resnet import MEAN_RGB, STD_RGB, random_batch
from projection import families

# The config's options for speed on a native device, as dotted keys: this check times the step with all of
# them off, then with each one on alone. An option added for speed joins this list.
SPEED_OPTIONS = (
    "device.channels_last",
    "device.foreach",
    "device.bn_16bit_input",
    "device.compile",
    "device.pad_input_channels",
    "device.cuda_graphs",
)

CLASSES = 1000
LABEL_SMOOTHING = 0.1
DEFAULTS = ["precision=bf16"]  # the harness as device=cuda gives it, in the precision the options are measured in
EAGER = [*DEFAULTS, "device.compile=false", "device.cuda_graphs=false"]
PEERS = {"torchvision": False, "torchvision compiled": True}  # the plain loop's rows: compiled or not
Step = Callable[[], object]


def plain_loop(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, compiled: bool = False) -> Step:
    """The step every PyTorch user writes: autocast forward, fp32 loss, backward, fused SGD; with `compiled`, the
    model through torch.compile (its forward and backward compiled at the first steps)."""
    on_gpu = images.is_cuda
    model = model.to(images.device, memory_format=torch.channels_last).train()
    if compiled:
        model.compile()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=on_gpu or None)
    mean, std = (torch.tensor(rgb, device=images.device).view(1, 3, 1, 1) for rgb in (MEAN_RGB, STD_RGB))
    inputs = ((images.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=torch.channels_last)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(images.device.type, dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def harness(overrides: list[str], sizes: stage.Sizes, images: torch.Tensor, labels: torch.Tensor) -> tuple[Step, Step]:
    """The harness's train step and eval step, built from the config as train.py builds them."""
    cfg = stage.composed([f"device={images.device.type}", *shape(sizes), *overrides])
    backend = families.build_backend(cfg, build.run_facts(cfg, Topology(), batch_shape(cfg, world_size=1)), CLASSES)
    lr = cfg.optim.base_lr / 100  # small enough to stay finite
    return (lambda: backend.train_step(images, labels, lr)), (lambda: backend.eval_step(images, labels))


def rows() -> dict[str, list[str] | str]:
    """Each row's harness overrides (a str names a peer loop)."""
    table: dict[str, list[str] | str] = {"bare": "torchvision", "bare_compiled": "torchvision compiled"}
    off = [f"{option}=false" for option in SPEED_OPTIONS]
    table["base"] = ["precision=bf16", *off]
    table |= {f"+{option}": ["precision=bf16", *off, f"{option}=true"] for option in SPEED_OPTIONS}
    table["bare_again"] = "torchvision"  # the first row timed again: the spread between them is the noise
    return table


def best(measured: stage.Figures) -> list[str]:
    """The overrides of the fastest harness step the `measured` rows point to: bf16, the precision each speed
    option was measured in, with each option on where its row beat base (off where it did not, or was not
    measured). The precision rows run the defaults, so their order says nothing of the options': on 2026-11-26
    fp32 led them, yet with every option on bf16 ran 1.8 times as fast as fp32 (docs/gpu.md)."""

    def rate(name: str) -> float:
        row = measured.get(name)
        return row["img_s"] if isinstance(row, dict) else 0.0

    options = [f"{option}={str(rate('+' + option) > rate('base')).lower()}" for option in SPEED_OPTIONS]
    return ["precision=bf16", *options]


def shape(sizes: stage.Sizes) -> list[str]:
    """The overrides of a harness row's batch and image size."""
    return [f"data.global_batch={sizes.batch}", f"data.image_size={sizes.image}", f"data.eval_resize={sizes.image}"]


def settings(overrides: list[str], sizes: stage.Sizes) -> tuple[object, ...]:
    """What a harness row runs: its composed device and precision settings."""
    cfg = stage.composed([f"device={stage.device().type}", *shape(sizes), *overrides])
    return cfg.device, cfg.precision


def measure(
    row: list[str] | str, sizes: stage.Sizes, images: torch.Tensor, labels: torch.Tensor, evaluation: bool = False
) -> stage.Figures:
    """A row's training rate, last loss and peak memory; with `evaluation`, a harness row's eval rate too (the
    projected time to train takes it)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    evaluate = None
    if isinstance(row, str) and row in PEERS:
        step = plain_loop(torchvision.models.resnet50(num_classes=CLASSES), images, labels, compiled=PEERS[row])
    else:
        step, evaluate = harness(row, sizes, images, labels)
    seconds = stage.timed_steps(step, sizes.warmup, sizes.steps)
    loss = float(step())
    if not math.isfinite(loss):
        raise RuntimeError(f"the loss is {loss}")
    figures: stage.Figures = {"img_s": round(sizes.steps * sizes.batch / seconds, 1), "loss": round(loss, 3)}
    if torch.cuda.is_available():
        figures["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if evaluation and evaluate is not None:
        figures["eval_img_s"] = round(sizes.steps * sizes.batch / stage.timed_steps(evaluate, 2, sizes.steps), 1)
    return figures


def inputs(sizes: stage.Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' batch of `sizes`: random uint8 NHWC images and labels, on the device."""
    batch = random_batch(sizes.batch, sizes.image, CLASSES, torch.Generator().manual_seed(0))
    images, labels = (t.to(stage.device()) for t in batch)
    return images, labels


def fresh() -> None:
    """Free what the last row held, and forget its compiled code: the next row compiles its own (a second shape of
    the same model would otherwise be compiled with dynamic sizes)."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    """Every row in turn, the figures so far written after each (a stage cut short by its time cap keeps them)."""
    torch.backends.cudnn.benchmark = True
    images, labels = inputs(sizes)
    measured: stage.Figures = {}
    figures: stage.Figures = {"batch": sizes.batch, "image": sizes.image, "steps": sizes.steps, "rows": measured}
    if not torch.cuda.is_available():
        figures["peak_gib"] = stage.no_gpu("peak GPU memory")

    def measure_and_save(name: str, row: list[str] | str) -> None:
        evaluation = name == "best"
        stage.attempt(name, lambda: measure(row, sizes, images, labels, evaluation), figures, args.json, measured)
        fresh()

    table = rows()
    last = table.pop("bare_again")
    for name, row in table.items():
        measure_and_save(name, row)
    figures["best"] = best(measured)
    measure_and_save("best", figures["best"])
    if settings(DEFAULTS, sizes) != settings(figures["best"], sizes):
        measure_and_save("defaults", DEFAULTS)
    else:
        measured["defaults"] = "the best row: device=cuda's defaults are its settings"
    measure_and_save("eager", EAGER)
    measure_and_save("bare_again", last)
    return figures


def best_known(work: Path) -> list[str]:
    """The best step's overrides: the step stage's best row where a check on this machine measured it (WORK's
    step.json), else DEFAULTS, the device's defaults in bf16 (on 2026-11-27, the best row's settings exactly)."""
    return list(stage.recorded(work, "step").get("best") or DEFAULTS)


def variant_rows(overrides: list[str], sizes: stage.Sizes) -> dict[str, tuple[list[str], stage.Sizes]]:
    """Stage `variants`' rows in the order measured (the likeliest to matter first, in case the time cap cuts the
    stage): the best step, then at the first larger batch, padded (or, where the best step pads already, not:
    "best-pad"), then at the other larger batches."""
    pads = "device.pad_input_channels=true" in overrides
    unpadded = [o for o in overrides if not o.startswith("device.pad_input_channels=")]
    padded = ([*unpadded, f"device.pad_input_channels={str(not pads).lower()}"], sizes)
    larger = [(f"best@{batch}", (overrides, dataclasses.replace(sizes, batch=batch))) for batch in sizes.batches]
    return dict([("best", (overrides, sizes)), *larger[:1], ("best-pad" if pads else "best+pad", padded), *larger[1:]])


def run_variants(args: argparse.Namespace, sizes: stage.Sizes) -> stage.Figures:
    """Stage `variants`: each row in turn, its figures saved as soon as measured."""
    torch.backends.cudnn.benchmark = True
    overrides = best_known(args.work)
    measured: stage.Figures = {}
    figures: stage.Figures = {"image": sizes.image, "steps": sizes.steps, "best": overrides, "rows": measured}
    if not torch.cuda.is_available():
        figures["peak_gib"] = stage.no_gpu("peak GPU memory")
    for name, (row, row_sizes) in variant_rows(overrides, sizes).items():

        def measure_variant(row: list[str] = row, row_sizes: stage.Sizes = row_sizes) -> stage.Figures:
            images, labels = inputs(row_sizes)
            return {"batch": row_sizes.batch, **measure(row, row_sizes, images, labels)}

        stage.attempt(name, measure_variant, figures, args.json, measured)
        fresh()
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["variants"]:
        sys.exit(stage.main(run_variants, argv=sys.argv[2:]))
    sys.exit(stage.main(run))
