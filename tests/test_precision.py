"""Precision policies on a small conv net: where each dtype lives, loss scaling, and exact resumption."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import torch
from torch import nn

from backends.base import StepSettings
from backends.native import NativeBackend
from models import batchnorm, build_resnet50
from optim import precision
from optim.lars import LARS
from optim.params import param_groups
from optim.precision import DTYPES, MixedPrecision, NonFiniteLoss, Policy, emulates
from optim.sgd import FusedSGD
from tests.conftest import REPO

POLICIES = {
    "fp32": Policy("fp32"),
    "bf16": Policy("bf16", compute="bf16"),
    "bf16 emulated": Policy("bf16", compute="bf16", emulated=True),
    "bf16.16": Policy("bf16.16", compute="bf16", master="bf16", stochastic_rounding=True),
    "fp16.32": Policy("fp16.32", compute="fp16", loss_scaling="dynamic", emulated=True),
    "fp16.16": Policy(
        "fp16.16", compute="fp16", master="fp16", stochastic_rounding=True, loss_scaling="dynamic", emulated=True
    ),
}


class TinyNet(nn.Module):
    """Conv, BatchNorm, ReLU, pooling and a linear head: the layer kinds ResNet-50 has, on uint8 NHWC input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float() / 255
        return self.fc(self.pool(self.relu(self.bn(self.conv(x)))).flatten(1))


OPTIMIZERS = {  # the optimizer a step takes loss scaling's verdict to: on the host (sgd) or on the device
    "sgd": partial(torch.optim.SGD, momentum=0.9),
    "fused sgd": partial(FusedSGD, momentum=0.9),
    "lars": partial(LARS, momentum=0.9, foreach=False),
    "lars foreach": partial(LARS, momentum=0.9, foreach=True),
}


def backend_for(
    policy: Policy, seed: int = 0, lr_model_seed: int = 0, batchnorm_16bit: bool = False, optimizer: str = "sgd"
) -> NativeBackend:
    torch.manual_seed(lr_model_seed)
    model = TinyNet()
    cpu = torch.device("cpu")
    optimizer = OPTIMIZERS[optimizer](param_groups(model, 5e-5), lr=0.1)
    step = StepSettings(label_smoothing=0.1, policy=policy, seed=seed, batchnorm_16bit=batchnorm_16bit)
    return NativeBackend(model, optimizer, cpu, step)


HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__")


@contextmanager
def host_reads() -> Iterator[list[str]]:
    """The names of the Tensor methods that read a value back to the host, called while entered."""
    reads: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(self: torch.Tensor, *args: Any, _name: str = name, _original: Any = original) -> Any:
                reads.append(_name)
                return _original(self, *args)

            patch.setattr(torch.Tensor, name, counted)
        yield reads


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (8, 12, 12, 3), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, 4, (8,), generator=generator)


def on_grid(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return torch.equal(t, t.to(dtype).to(t.dtype))


@pytest.mark.parametrize("name", POLICIES)
def test_batchnorm_and_the_loss_run_in_fp32_under_every_policy(name):
    backend = backend_for(POLICIES[name])
    seen: list[torch.dtype] = []
    backend.model.bn.register_forward_hook(lambda m, inputs, output: seen.extend([inputs[0].dtype, output.dtype]))
    loss = backend.train_step(*batch(), lr=0.1)
    assert seen == [torch.float32, torch.float32] and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in backend.model.bn.parameters())
    assert backend.model.bn.running_var.dtype == torch.float32


def test_fp16_32_keeps_fp32_masters_that_leave_the_fp16_grid():
    backend = backend_for(POLICIES["fp16.32"])
    for step in range(3):
        backend.train_step(*batch(step), lr=0.1)
    weight = backend.model.conv.weight
    assert weight.dtype == torch.float32 and not on_grid(weight, torch.float16)


@pytest.mark.parametrize("name", ["fp16.16", "bf16.16"])
def test_16_bit_masters_stay_on_their_grid_and_batchnorm_stays_fp32(name):
    policy = POLICIES[name]
    backend = backend_for(policy)
    for step in range(3):
        backend.train_step(*batch(step), lr=0.1)
    grid = {"fp16": torch.float16, "bf16": torch.bfloat16}[policy.master]
    assert on_grid(backend.model.conv.weight, grid) and on_grid(backend.model.fc.weight, grid)
    assert not on_grid(backend.model.bn.weight, grid)  # BatchNorm keeps fp32 masters


@pytest.mark.parametrize("name", POLICIES)
def test_batchnorm_16bit_takes_native_16_bit_activations_as_they_are_and_steps_as_the_cast_does(name):
    policy = POLICIES[name]
    cast, as_is = backend_for(policy), backend_for(policy, batchnorm_16bit=True)
    seen: list[torch.dtype] = []
    as_is.model.bn.register_forward_hook(lambda m, inputs, output: seen.extend([inputs[0].dtype, output.dtype]))
    losses = [backend.train_step(*batch(), lr=0.1) for backend in (cast, as_is)]
    native_16bit = policy.compute != "fp32" and not policy.emulated  # emulated activations are fp32 already
    assert seen == [DTYPES[policy.compute] if native_16bit else torch.float32] * 2
    bn = as_is.model.bn
    assert {t.dtype for t in (bn.weight, bn.bias, bn.weight.grad, bn.running_mean, bn.running_var)} == {torch.float32}
    assert losses[1].dtype == torch.float32
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-2, atol=0)  # one bf16 rounding of BatchNorm's output
    for theirs, ours in zip(cast.model.parameters(), as_is.model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=2**-7, atol=1e-3)  # 16-bit masters: a rounding may flip


@pytest.mark.parametrize("name", ["fp16.16", "bf16.16"])
def test_16_bit_masters_are_views_of_one_buffer_that_an_update_rounds_in_one_pass(name, monkeypatch):
    backend = backend_for(POLICIES[name])
    masters, params = backend.precision.masters, list(backend.precision.low_precision.values())
    assert masters is not None and masters.numel() == sum(p.numel() for p in params)
    assert {p.untyped_storage().data_ptr() for p in params} == {masters.untyped_storage().data_ptr()}
    rounded: list[int] = []
    original = precision.round_stochastic
    monkeypatch.setattr(precision, "round_stochastic", lambda x, *args: rounded.append(x.numel()) or original(x, *args))
    backend.train_step(*batch(), lr=0.1)
    assert rounded == [masters.numel()]


def test_a_channels_last_model_keeps_its_layout_and_weights_in_the_masters_buffer():
    torch.manual_seed(0)
    model = build_resnet50(10, batchnorm(0.1, 1e-5), channels_last=True)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    mixed = MixedPrecision(POLICIES["bf16.16"], model, torch.device("cpu"), seed=0)
    for name, param in mixed.low_precision.items():
        assert param.is_contiguous(memory_format=torch.channels_last) or param.dim() != 4, name
        assert torch.equal(param, before[name].to(torch.bfloat16).float()), name  # rounded to nearest, in place


def test_emulated_fp16_rounds_every_layer_output_to_fp16():
    backend = backend_for(POLICIES["fp16.32"])
    outputs: list[torch.Tensor] = []
    for module in (backend.model.conv, backend.model.bn, backend.model.relu, backend.model.fc):
        module.register_forward_hook(lambda m, i, output: outputs.append(output))
    backend.train_step(*batch(), lr=0.1)
    assert len(outputs) == 4 and all(o.dtype == torch.float32 and on_grid(o, torch.float16) for o in outputs)


def test_emulated_bf16_stores_what_native_bf16_stores_layer_by_layer():
    """Each layer's emulated output is its fp32 result cast to bf16 as torch casts it (round to nearest even), from
    bf16 inputs and bf16 compute copies of the weights; against the layer run natively in bf16 (autocast, or bf16
    tensors) it differs at most where fp32 accumulation order tips a rounding, by one bf16 step."""
    backend = backend_for(POLICIES["bf16 emulated"])
    model = backend.model
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor, name: str) -> None:
        seen[name] = (inputs[0].clone(), output.clone())  # clones: the ReLU after BatchNorm works in place

    for name in ("conv", "bn", "relu", "pool", "fc"):
        getattr(model, name).register_forward_hook(partial(keep, name=name))
    with torch.no_grad():
        backend.precision.forward(model.train(), batch()[0])
    weights = {name: getattr(model, name).weight.to(torch.bfloat16) for name in ("conv", "fc")}
    native = {
        "conv": lambda x: nn.functional.conv2d(x.to(torch.bfloat16), weights["conv"], padding=1),
        "bn": lambda x: model.bn(x).to(torch.bfloat16),  # BatchNorm computes in fp32 under every policy
        "relu": lambda x: torch.relu(x.to(torch.bfloat16)),
        "pool": lambda x: nn.functional.adaptive_avg_pool2d(x.to(torch.bfloat16), 1),
        "fc": lambda x: nn.functional.linear(x.to(torch.bfloat16), weights["fc"], model.fc.bias.to(torch.bfloat16)),
    }
    for name, (inputs, stored) in seen.items():
        assert stored.dtype == torch.float32 and on_grid(stored, torch.bfloat16), name
        assert on_grid(inputs, torch.bfloat16), name  # the first's too: the image as a bf16 device holds it
        with torch.no_grad():
            natively = native[name](inputs).float()
        ulp = stored.abs().clamp_min(1e-30) * 2.0**-7
        assert bool(((stored - natively).abs() <= ulp).all()), name
        assert float((stored == natively).float().mean()) > 0.9, name


def test_emulated_bf16_rounds_stochastically_inside_streams_and_to_nearest_outside():
    backend = backend_for(Policy("bf16.16", compute="bf16", master="bf16", stochastic_rounding=True, emulated=True))
    images, _ = batch()
    model = backend.model.eval()
    nearest = backend.precision.forward(model, images)
    with backend.precision.stochastic_streams([torch.Generator().manual_seed(1)]):
        stochastic = backend.precision.forward(model, images)
    assert on_grid(nearest, torch.bfloat16) and on_grid(stochastic, torch.bfloat16)
    assert not torch.equal(nearest, stochastic)
    torch.testing.assert_close(stochastic, nearest, rtol=0.05, atol=1e-2)


@pytest.mark.parametrize(
    ("compute", "emulate", "device", "expected"),
    [
        ("fp16", "auto", "cpu", True),
        ("fp16", "auto", "cuda", False),
        ("bf16", "auto", "cuda", False),
        ("bf16", "always", "cuda", True),
        ("bf16", "never", "cpu", False),
        ("fp32", "auto", "cpu", False),
    ],
)
def test_when_16_bit_compute_is_emulated(compute, emulate, device, expected):
    assert emulates(compute, emulate, device) is expected


@pytest.mark.parametrize(("isa", "emulated"), [("AVX512_CORE", True), ("AVX512_CORE_BF16", False)])
def test_bf16_on_the_cpu_is_emulated_without_bf16_instructions(isa, emulated):
    """oneDNN's dispatch is capped to `isa` (as on a host that has no more); what the CPU lacks it cannot add. The
    two sets either side of bf16's instructions: below AVX512_CORE (AVX2) and above AVX512_CORE_BF16 (AMX) the
    answer is theirs, and each costs a process's seconds of importing torch."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa}
    probe = "from optim.precision import emulates; print(emulates('bf16', 'auto', 'cpu'))"
    answer = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True)
    if not emulated and not torch.cpu._is_avx512_bf16_supported():
        assert answer.stdout.strip() == "True"  # this host lacks them whatever the cap
    else:
        assert answer.stdout.strip() == str(emulated)


def test_stochastic_streams_round_each_share_of_the_batch_with_its_own_generator():
    backend = backend_for(POLICIES["fp16.16"])
    images, _ = batch()
    twice = torch.cat([images[:4], images[:4]])  # two replicas given the same images

    def logits(seeds: tuple[int, ...]) -> torch.Tensor:
        with backend.precision.stochastic_streams([torch.Generator().manual_seed(s) for s in seeds]):
            return backend.precision.forward(backend.model.eval(), twice)

    nearest = backend.precision.forward(backend.model.eval(), twice)
    first, again, swapped = logits((1, 2)), logits((1, 2)), logits((2, 1))
    assert on_grid(first, torch.float16) and not torch.equal(first, nearest)
    assert torch.equal(first, again)  # a stream is its seed
    assert not torch.equal(first[:4], first[4:])  # the two replicas' roundings differ
    assert torch.equal(first[:4], swapped[4:]) and torch.equal(first[4:], swapped[:4])  # each share its own stream
    torch.testing.assert_close(first, nearest, rtol=0.02, atol=1e-3)  # within fp16 rounding of each other


def poison_next_gradient(param: nn.Parameter) -> None:
    handle = None

    def to_inf(grad: torch.Tensor) -> torch.Tensor:
        handle.remove()
        return torch.full_like(grad, float("inf"))

    handle = param.register_hook(to_inf)


@pytest.mark.parametrize("optimizer", ["fused sgd", "lars", "lars foreach"])
@pytest.mark.parametrize("name", POLICIES)
def test_a_step_reads_nothing_back_to_the_host(name, optimizer):
    backend = backend_for(POLICIES[name], optimizer=optimizer)
    backend.train_step(*batch(0), lr=0.1)  # the first step creates the optimizer's state
    for step in (1, 2):
        with host_reads() as reads:
            loss = backend.train_step(*batch(step), lr=0.1 / step)
        assert reads == [], step
    assert 0 < float(loss) < 10 and backend.skipped_steps == 0


def test_host_reads_are_counted():  # the control: the host path of loss scaling reads its verdict
    backend = backend_for(POLICIES["fp16.32"], optimizer="sgd")
    with host_reads() as reads:
        backend.train_step(*batch(), lr=0.1)
    assert "__bool__" in reads


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_dynamic_loss_scaling_skips_a_non_finite_update_halves_and_regrows_the_scale(optimizer):
    policy = Policy(
        "fp16.32", compute="fp16", loss_scaling="dynamic", emulated=True, init_scale=1024.0, growth_interval=2
    )
    backend = backend_for(policy, optimizer=optimizer)
    before = [p.detach().clone() for p in backend.model.parameters()]
    poison_next_gradient(backend.model.fc.weight)
    backend.train_step(*batch(), lr=0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, backend.model.parameters(), strict=True))
    assert (backend.loss_scale, backend.skipped_steps) == (512.0, 1)
    backend.train_step(*batch(1), lr=0.1)
    assert not torch.equal(before[0], backend.model.conv.weight)
    backend.train_step(*batch(2), lr=0.1)
    assert (backend.loss_scale, backend.skipped_steps) == (1024.0, 1)  # two good updates: doubled


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
def test_a_gradient_that_stays_non_finite_stops_the_run(optimizer):
    policy = Policy("fp16.32", compute="fp16", loss_scaling="dynamic", emulated=True, max_skipped=3)
    backend = backend_for(policy, optimizer=optimizer)
    with pytest.raises(NonFiniteLoss, match="3 updates in a row"):
        for step in range(3):
            poison_next_gradient(backend.model.fc.weight)
            backend.train_step(*batch(step), lr=0.1)


@pytest.mark.parametrize("name", POLICIES)
def test_a_checkpoint_resumes_exactly_under_the_same_policy(name):
    policy = POLICIES[name]
    first = backend_for(policy, seed=5)
    for step in range(2):
        first.train_step(*batch(step), lr=0.1)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    second = backend_for(policy, seed=99, lr_model_seed=1)  # different init and stream: all must come from the state
    second.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    for step in (2, 3):
        first.train_step(*batch(step), lr=0.1)
        second.train_step(*batch(step), lr=0.1)
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
