"""The probe: one real forward and backward of a micro-batch on the host CPU, measured per pipeline stage.

FLOPs come from FlopCounterMode's per-module breakdown, activation memory from the tensors autograd saves for
backward (saved_tensors_hooks), both attributed to the stage (and recomputation segment) running at the time.
Recomputation is worked out from the same un-checkpointed pass: the forward is cut into pieces at stage starts
and checkpoint outputs, and each piece's saved bytes and FLOPs say what recomputing it costs.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import chain, pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchvision.models.resnet import Bottleneck

from models import batchnorm, build_resnet50
from projection.profile import ModelProfile, StageProfile

# Each layer's forward reads its input and weights and writes its output; its backward reads the saved input,
# the weights and the output gradient and writes the input and weight gradients: about twice the forward traffic.
TRAFFIC_PASSES = 3


@dataclass
class _Piece:
    """A stretch of the forward pass that starts at a stage start or a checkpoint's output."""

    stage: int
    inputs: dict[int, float]  # storage -> bytes of the tensors it starts from (stashed when it is recomputed)
    saved: dict[int, float] = field(default_factory=dict)  # storage -> bytes autograd saved for backward
    forward_flops: float = 0.0
    traffic: float = 0.0  # bytes its layers read and write in forward

    def saved_bytes(self, without_inputs: bool = False) -> float:
        return sum(size for key, size in self.saved.items() if not (without_inputs and key in self.inputs))

    def input_bytes(self) -> float:
        return sum(self.inputs.values())


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _bytes(tensor: torch.Tensor, dtype_bytes: int, numel: int | None = None) -> float:
    """Floating tensors at the IPU's activation dtype (the probe runs fp32), integer and bool ones as they are."""
    per_element = dtype_bytes if tensor.is_floating_point() else tensor.element_size()
    return (tensor.numel() if numel is None else numel) * per_element


class _Recorder:
    """Module hooks and a saved-tensor hook that record, in execution order, where each piece begins and what it
    saves; stages begin at the first call of each split module, pieces also after each checkpoint module."""

    def __init__(self, model: nn.Module, splits: list[str], checkpoints: set[str], dtype_bytes: int) -> None:
        self.names = {module: name for name, module in model.named_modules()}
        self.splits, self.checkpoints, self.dtype_bytes = splits, checkpoints, dtype_bytes
        self.state = {p.untyped_storage().data_ptr() for p in chain(model.parameters(), model.buffers())}
        self.order: list[str] = []  # module names by first call
        self.piece_of: dict[str, int] = {}  # module name -> the piece of its first call
        self.pieces: list[_Piece] = []

    def storages(self, value: Any) -> dict[int, float]:
        return {t.untyped_storage().data_ptr(): _bytes(t, self.dtype_bytes) for t in _tensors(value)}

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        name = self.names[module]
        if not self.pieces:
            self.pieces.append(_Piece(0, self.storages(args)))
        stage = self.pieces[-1].stage
        if stage < len(self.splits) and name == self.splits[stage]:
            self.pieces.append(_Piece(stage + 1, self.storages(args)))
        if name not in self.piece_of:
            self.order.append(name)
            self.piece_of[name] = len(self.pieces) - 1

    def post_hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        piece = self.pieces[-1]
        if next(module.children(), None) is None:
            weights = sum(p.numel() for p in module.parameters()) * self.dtype_bytes
            piece.traffic += sum(self.storages(args).values()) + sum(self.storages(output).values()) + weights
        if self.names[module] in self.checkpoints:
            self.pieces.append(_Piece(piece.stage, self.storages(output)))

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """Each storage once, whatever views of it are saved; parameters and buffers are state, not activations."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.state and storage.nbytes():
            self.pieces[-1].saved[key] = _bytes(tensor, self.dtype_bytes, storage.nbytes() // tensor.element_size())
        return tensor

    def hooks(self, model: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        modules = list(self.names)
        return [m.register_forward_pre_hook(self.pre_hook) for m in modules] + [
            m.register_forward_hook(self.post_hook) for m in modules
        ]


def _own_flops(counts: dict[str, dict[Any, int]], model: nn.Module) -> dict[str, float]:
    """FLOPs of each module's own operations (its children's excluded), by named_modules() name. The root ("")
    also takes those outside the model (the loss), so the total is FlopCounterMode's global count."""
    root = type(model).__name__
    total = {name: float(sum(counts.get(f"{root}.{name}" if name else root, {}).values())) for name in _names(model)}
    own = {
        name: total[name] - sum(total[f"{name}.{child}" if name else child] for child, _ in module.named_children())
        for name, module in model.named_modules()
    }
    own[""] += sum(counts.get("Global", {}).values()) - total[""]
    return own


def _names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules()]


def _checkpoints(model: nn.Module, recompute: str | Sequence[str]) -> list[str] | None:
    """None without recomputation; "auto" checkpoints the output of every torchvision Bottleneck block."""
    if recompute == "none":
        return None
    if recompute == "auto":
        return [name for name, module in model.named_modules() if isinstance(module, Bottleneck)]
    if isinstance(recompute, str):
        raise ValueError(f"recompute must be 'none', 'auto' or a list of module names, not {recompute!r}")
    return list(recompute)


def _check_names(model: nn.Module, names: Iterable[str], what: str) -> None:
    valid = set(_names(model)) - {""}
    for name in names:
        if name not in valid:
            top = ", ".join(child for child, _ in model.named_children())
            nested = next(n for n in _names(model) if "." in n)
            raise ValueError(f"{what} {name!r} is not a module of the model; valid names: {top}, or nested: {nested}")


def _check_runs(order: list[str], names: Iterable[str], what: str) -> None:
    for name in names:
        if name not in order:
            raise ValueError(f"{what} {name!r} never runs in the forward pass")


def _check_splits(model: nn.Module, order: list[str], splits: list[str]) -> None:
    """Splits must run, in the given order, and leave every pipeline stage some layer."""
    _check_runs(order, splits, "split")
    positions = [order.index(name) for name in splits]
    for before, name, start, end in zip(splits, splits[1:], positions, positions[1:], strict=False):
        if end <= start:
            raise ValueError(f"split {name!r} runs before {before!r}: splits must be in execution order")
    leaves = {name for name, module in model.named_modules() if next(module.children(), None) is None}
    bounds = [0, *positions, len(order)]
    for stage, (start, end) in enumerate(pairwise(bounds)):
        if not leaves & set(order[start:end]):
            name = splits[min(stage, len(splits) - 1)]
            raise ValueError(f"split {name!r} leaves pipeline stage {stage} without a layer")


def _measure(model: nn.Module, images: torch.Tensor, recorder: _Recorder) -> tuple[dict[str, float], dict[str, float]]:
    """Forward (with the loss, which the last stage computes) and backward under the recorder's hooks; returns each
    module's own forward and backward FLOPs."""
    labels = torch.zeros(images.shape[0], dtype=torch.long)
    handles = recorder.hooks(model)
    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.enable_grad():
            with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda tensor: tensor):
                loss = F.cross_entropy(model(images), labels)
            forward = _own_flops(counter.get_flop_counts(), model)
            loss.backward()
        total = _own_flops(counter.get_flop_counts(), model)
    finally:
        for handle in handles:
            handle.remove()
    return forward, {name: total[name] - forward[name] for name in total}


def _recomputed(pieces: list[_Piece], last_stage: bool) -> tuple[list[_Piece], list[_Piece]]:
    """(recomputed, kept) pieces of a stage with checkpoints. A piece that saves anything keeps only its input
    and runs again in backward; all but the last stage's last piece, whose backward follows its forward at once
    (Graphcore's pipelines run the last stage's forward and backward together), so its tensors are still there."""
    live = [piece for piece in pieces if piece.saved]
    kept = live[-1:] if last_stage else []
    return live[: len(live) - len(kept)], kept


def _activations(pieces: list[_Piece], recompute: bool, last_stage: bool) -> tuple[float, float]:
    """(activation_bytes, recompute_peak_bytes): everything saved, each storage once, without recomputation;
    with it, the recomputed pieces' inputs, and the largest piece's saved tensors while it runs backward."""
    if not recompute:
        saved: dict[int, float] = {}
        for piece in pieces:
            saved.update(piece.saved)
        return sum(saved.values()), 0.0
    redone, kept = _recomputed(pieces, last_stage)
    peaks = [piece.saved_bytes(without_inputs=True) for piece in redone] + [piece.saved_bytes() for piece in kept]
    return sum(piece.input_bytes() for piece in redone), max(peaks, default=0.0)


def _stage(
    model: nn.Module, recorder: _Recorder, index: int, backward: dict[str, float], recompute: bool
) -> StageProfile:
    pieces = [piece for piece in recorder.pieces if piece.stage == index]
    last = index == len(recorder.splits)
    redone = _recomputed(pieces, last)[0] if recompute else []
    activations, peak = _activations(pieces, recompute, last)
    owned = [name for name, piece in recorder.piece_of.items() if recorder.pieces[piece].stage == index]
    modules = dict(model.named_modules())
    following = [piece for piece in recorder.pieces if piece.stage == index + 1]
    return StageProfile(
        first_module=recorder.splits[index - 1] if index else recorder.order[1],
        forward_flops=sum(piece.forward_flops for piece in pieces),
        backward_flops=sum(backward[name] for name in owned),
        recompute_flops=sum(piece.forward_flops for piece in redone),
        # every layer's forward and backward traffic, and the forward again of what is recomputed
        memory_bytes=TRAFFIC_PASSES * sum(piece.traffic for piece in pieces) + sum(piece.traffic for piece in redone),
        param_count=sum(p.numel() for name in owned for p in modules[name].parameters(recurse=False)),
        activation_bytes=activations,
        recompute_peak_bytes=peak,
        output_bytes=following[0].input_bytes() if following else 0.0,
    )


def profile_model(
    model: nn.Module,
    *,
    micro_batch: int,
    image_size: int,
    splits: Sequence[str] = (),
    recompute: str | Sequence[str] = "none",
    activation_dtype_bytes: int = 2,
    input_bytes_per_pixel: int = 1,
) -> ModelProfile:
    """Profile one training micro-batch of random uint8 NHWC images, per pipeline stage.

    `splits` name the modules at whose first call a new stage begins, `recompute` is "none", "auto" (checkpoints
    at every Bottleneck output) or the checkpoint module names; splits and checkpoints are meant at points where
    the module's input (or output) is the only live activation, as at block boundaries. The caller's model is left
    untouched: the probe runs a deep copy, in fp32 and training mode. A profile depends on the model's layers and
    which of its weights train, never on their values, so a process probes each architecture and layout once (an
    IPU projection's run and its calibration probe the same ResNet-50, seconds each)."""
    layout = (micro_batch, image_size, list(splits), recompute, activation_dtype_bytes, input_bytes_per_pixel)
    trained = tuple(param.requires_grad for param in model.parameters())
    key = (repr(model), trained, *(str(setting) for setting in layout))
    if key not in _PROFILES:
        _PROFILES[key] = _probed(model, *layout)
    return _PROFILES[key]


_PROFILES: dict[tuple[object, ...], ModelProfile] = {}  # profile_model's, by architecture and layout


def _probed(
    model: nn.Module,
    micro_batch: int,
    image_size: int,
    splits: list[str],
    recompute: str | Sequence[str],
    activation_dtype_bytes: int,
    input_bytes_per_pixel: int,
) -> ModelProfile:
    model = copy.deepcopy(model).float().train()
    for param in model.parameters():
        param.grad = None
    checkpoints = _checkpoints(model, recompute)
    _check_names(model, splits, "split")
    _check_names(model, checkpoints or [], "checkpoint")
    recorder = _Recorder(model, splits, set(checkpoints or []), activation_dtype_bytes)
    generator = torch.Generator().manual_seed(0)  # the caller's random streams stay where they were
    images = torch.randint(0, 256, (micro_batch, image_size, image_size, 3), dtype=torch.uint8, generator=generator)
    forward, backward = _measure(model, images, recorder)
    _check_splits(model, recorder.order, splits)
    _check_runs(recorder.order, checkpoints or [], "checkpoint")
    for name, piece in recorder.piece_of.items():
        recorder.pieces[piece].forward_flops += forward[name]
    return ModelProfile(
        micro_batch=micro_batch,
        image_size=image_size,
        activation_dtype_bytes=activation_dtype_bytes,
        stages=tuple(_stage(model, recorder, i, backward, checkpoints is not None) for i in range(len(splits) + 1)),
        gradient_tensors=sum(param.grad is not None for param in model.parameters()),
        input_bytes=micro_batch * image_size**2 * 3 * input_bytes_per_pixel,
    )


def matmul_rows(model: nn.Module, image_size: int) -> tuple[tuple[int, float], ...]:
    """Each convolution's and linear layer's output rows per image (its output pixels: the rows of the matrix
    product it is) and its share of those layers' forward FLOPs, from one forward pass of one image."""
    flops: dict[int, float] = {}

    def count(module: nn.Module, _: object, output: torch.Tensor) -> None:
        rows = output[0, 0].numel() if isinstance(module, nn.Conv2d) else 1
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        per_row = weight.numel()  # a row's multiply-adds: its inputs times its outputs
        flops[rows] = flops.get(rows, 0.0) + 2.0 * rows * per_row

    probe = copy.deepcopy(model).float().eval()
    hooks = [m.register_forward_hook(count) for m in probe.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    with torch.no_grad():
        probe(torch.zeros(1, image_size, image_size, 3, dtype=torch.uint8))
    for hook in hooks:
        hook.remove()
    total = sum(flops.values())
    return tuple((rows, share / total) for rows, share in sorted(flops.items()))


@cache
def resnet50_profile() -> ModelProfile:
    """ResNet-50 v1.5, one training image of 224 px probed on the host once per process (a few seconds): its FLOPs,
    traffic, parameters and matrix products' rows, as the GPU and TPU cost models read them."""
    model = build_resnet50(1000, batchnorm(0.1, 1e-5), channels_last=True)
    profile = profile_model(model, micro_batch=1, image_size=224)
    return dataclasses.replace(profile, matmul_rows=matmul_rows(model, 224))
