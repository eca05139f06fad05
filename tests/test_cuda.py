"""Every branch of the code on CUDA: where a path can run on the CPU it runs here (with torch.cuda reporting no
GPU where that is the branch); the GPU side of each is marked `cuda` and skipped without a GPU (make gpu-check)."""

from __future__ import annotations

import io
import math
import random
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import checkpoint
import distributed
from backends.base import StepSettings
from backends.build import facts_on
from backends.native import NativeBackend
from configs.checks import ConfigError
from configs.device.native import NativeConfig
from configs.schema import Config, batch_shape
from data.build import make_loader
from data.loading.device_decode import decode_crops
from data.sources.folder_index import find_classes, open_split
from data.sources.split import Split
from distributed import group
from distributed.allreduce import Stopwatch
from distributed.topology import Topology
from mlperf_logs import package
from models import batchnorm, build_resnet50
from optim import precision
from optim.lars import LARS
from optim.params import param_groups
from optim.precision import DTYPES, MixedPrecision, Policy, emulates
from optim.stochastic_rounding import round_stochastic
from tests import test_data
from tests.ranks import free_port
from tests.test_data import loader_for
from tests.test_precision import POLICIES, TinyNet, on_grid
from tests.test_stochastic_rounding import FP16_TINY, Z_LIMIT, neighbours, probability_up, ulp16

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
tiny_tree = test_data.tiny_tree  # the fixture: a folder dataset of six training and four validation JPEGs
IGNORE_NO_ACCELERATOR = "ignore:'pin_memory' argument is set as true but no accelerator:UserWarning"


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda says there is no GPU, as on a CPU machine, also where there is one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def config(workers: int = 0) -> Config:
    cfg = Config()
    cfg.data.global_batch, cfg.data.image_size, cfg.data.workers = 4, 32, workers
    return cfg


def train_split(root: Path) -> Split:
    return open_split(root / "train", find_classes(root / "train"))


# select_device (backends/native.py) and the policy's emulation choice (optim/precision.py emulates)


def test_cuda_without_a_gpu_is_a_config_error_that_says_what_to_use(no_gpu: None) -> None:
    with pytest.raises(ConfigError) as refused:
        NativeBackend.select_device(NativeConfig(name="cuda"), local_rank=0)
    assert refused.value.key == "device.name"
    assert "no CUDA device is available" in refused.value.message and "device=cpu" in refused.value.message


def test_each_local_rank_gets_its_own_gpu_and_a_rank_without_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert NativeBackend.select_device(NativeConfig(name="cuda"), local_rank=1) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=re.escape("local rank 2 has no GPU (2 here)")):
        NativeBackend.select_device(NativeConfig(name="cuda"), local_rank=2)


@pytest.mark.parametrize("compute", ["fp32", "bf16", "fp16"])
def test_16_bit_compute_on_cuda_is_native_unless_emulation_is_forced(
    compute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)  # the host CPU has no say on a GPU
    assert not emulates(compute, "auto", "cuda") and not emulates(compute, "never", "cuda")
    assert emulates(compute, "always", "cuda") == (compute != "fp32")
    cfg = config()
    cfg.precision.compute = compute
    assert not Policy.for_device(cfg.precision, "cuda").emulated
    assert Policy.for_device(cfg.precision, "cpu").emulated == (compute != "fp32")


# the loader's pinned memory (data.build.make_loader, data/loading/loader.py)


def test_batches_are_pinned_for_a_cuda_device_only(tiny_tree: Path) -> None:
    split = train_split(tiny_tree)
    for device, pinned in ((torch.device("cpu"), False), (CUDA, True)):
        loader = make_loader(
            config().data, split, facts_on(config(), Topology(), device, batch_shape(config(), 1)), seed=1, train=True
        )
        assert loader._loader.pin_memory is pinned, device


@pytest.mark.filterwarnings(IGNORE_NO_ACCELERATOR)
@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_asked_to_pin_gives_the_same_batches_with_or_without_a_gpu(tiny_tree: Path, workers: int) -> None:
    plain = list(loader_for(tiny_tree, batch=2, workers=workers))
    pinned = list(loader_for(tiny_tree, batch=2, workers=workers, pin_memory=True))
    assert len(pinned) == len(plain) == 3
    for (images, labels), (expected_images, expected_labels) in zip(pinned, plain, strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("workers", [0, 1])
def test_batches_for_a_gpu_arrive_on_it_copied_ahead_on_a_side_stream(tiny_tree: Path, workers: int) -> None:
    cfg = config(workers)
    cfg.data.global_batch = 2  # three batches of the six images: each copied while the one before is in use
    on_host = list(
        make_loader(
            cfg.data, train_split(tiny_tree), facts_on(cfg, Topology(), CPU, batch_shape(cfg, 1)), seed=1, train=True
        )
    )
    loader = make_loader(
        cfg.data, train_split(tiny_tree), facts_on(cfg, Topology(), CUDA, batch_shape(cfg, 1)), seed=1, train=True
    )
    assert loader._loader.pin_memory  # the side stream's copies are from pinned memory, so they do not block
    on_gpu = [(images.clone(), labels.clone()) for images, labels in loader]  # clones: on the compute stream
    torch.cuda.synchronize()
    assert len(on_gpu) == len(on_host) == 3
    for (images, labels), (expected, expected_labels) in zip(on_gpu, on_host, strict=True):
        assert images.is_cuda and labels.is_cuda
        assert torch.equal(images.cpu(), expected) and torch.equal(labels.cpu(), expected_labels)


# Stopwatch (distributed/allreduce.py): wall time on the CPU, CUDA events on a GPU


def test_the_cpu_stopwatch_adds_up_wall_time() -> None:
    watch = Stopwatch(torch.device("cpu"))
    for _ in range(2):
        with watch.timing():
            time.sleep(0.02)
    assert 0.04 <= watch.seconds < 1.0 and not watch._events


@pytest.mark.cuda
@needs_gpu
def test_the_cuda_stopwatch_times_the_device_not_the_host() -> None:
    watch = Stopwatch(CUDA)
    torch.cuda.synchronize()
    started = time.perf_counter()
    with watch.timing():
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU clock cycles; the host only queues them
    queued_s = time.perf_counter() - started
    seconds = watch.seconds
    assert seconds > max(0.005, 2 * queued_s)
    assert watch.seconds == seconds and not watch._events  # events are read once, then counted in the total


# process groups (distributed/group.py): gloo on the host, nccl (and a gloo control group) on CUDA


def test_one_rank_opens_no_process_group() -> None:
    with distributed.process_group(Topology(), "cuda", timeout_s=10):
        assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("device_type", "backend"),
    [
        ("cpu", "gloo"),
        ("ipu_sim", "gloo"),  # the simulated IPU runs on the host
        pytest.param("cuda", "nccl", marks=[pytest.mark.cuda, needs_gpu]),
    ],
)
def test_each_device_opens_its_process_group_and_collectives_run_on_it(
    device_type: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank, with the group opened as for several (process_group opens none for one): nccl cannot put two
    ranks on one GPU, and a group of one still runs every collective the loop uses."""
    monkeypatch.setattr(Topology, "distributed", property(lambda self: True))
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    with distributed.process_group(Topology(master_port=free_port()), device_type, timeout_s=30):
        assert dist.get_backend() == backend
        assert (group._control is not None) == (device_type == "cuda")
        if device_type == "cuda":
            assert torch.cuda.current_device() == 0 and dist.get_backend(group._control) == "gloo"
        values = torch.arange(4.0, device=device)
        assert torch.equal(distributed.sum_over_ranks(values.clone()), values)
        stats = [values.clone(), values[:2] * 2]
        distributed.average_over_ranks(stats)
        assert torch.equal(stats[0], values) and torch.equal(stats[1], values[:2] * 2)
        distributed.broadcast_from_main([stats[0]])
        assert distributed.mean_over_ranks(2.5) == 2.5 and distributed.max_over_ranks(7) == 7
        assert distributed.from_main(lambda: "rank 0") == "rank 0" and distributed.gather_to_main(3) == [3]
        distributed.barrier()
    assert not dist.is_initialized() and group._control is None


# round_stochastic (optim/stochastic_rounding.py): one chunk on a GPU, a generator on the tensor's device

ROUNDING_CASES = [
    (torch.float16, 1 + 0.3 * ulp16(1.0)),  # normal
    (torch.float16, FP16_TINY * (5 + 0.25)),  # between two subnormals
    (torch.float16, 0.37 * FP16_TINY),  # below the smallest subnormal: 0 or 2**-24
    (torch.bfloat16, 1 + 0.3 * 2.0**-7),
]


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize(("dtype", "value"), ROUNDING_CASES, ids=["fp16", "fp16-subnormal", "fp16-tiny", "bf16"])
def test_stochastic_rounding_on_cuda_is_unbiased_and_seeded(dtype: torch.dtype, value: float) -> None:
    n = 1 << 20  # more than the CPU's chunk: a GPU rounds it in one
    x = torch.full((n,), value, device=CUDA)
    out = round_stochastic(x, dtype, torch.Generator(CUDA).manual_seed(1))
    assert out.device == x.device and out.dtype == dtype
    lo, hi = (float(v) for v in neighbours(x[:1].cpu(), dtype))
    assert bool(((out == lo) | (out == hi)).all()), "every result is one of the two neighbours"
    p = float(probability_up(x[:1].cpu(), dtype))
    standard_error = (hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(float(out.double().mean()) - float(x[0])) < Z_LIMIT * standard_error  # x[0]: value in fp32
    assert torch.equal(out, round_stochastic(x, dtype, torch.Generator(CUDA).manual_seed(1)))
    assert not torch.equal(out, round_stochastic(x, dtype, torch.Generator(CUDA).manual_seed(2)))


# NativeBackend and MixedPrecision (backends/native.py, optim/precision.py) on a GPU

CUDA_POLICIES = {name: replace(p, emulated=name.endswith("emulated")) for name, p in POLICIES.items()}


def resnet_on_cuda(policy: Policy, seed: int = 0, batchnorm_16bit: bool = False) -> NativeBackend:
    torch.manual_seed(0)
    model = build_resnet50(10, batchnorm(0.1, 1e-5), channels_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = StepSettings(label_smoothing=0.1, policy=policy, seed=seed, batchnorm_16bit=batchnorm_16bit)
    return NativeBackend(model, optimizer, CUDA, step)


def images_and_labels(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, 10, (4,), generator=generator)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("batchnorm_16bit", [False, True], ids=["bn fp32 input", "bn 16-bit input"])
@pytest.mark.parametrize("name", CUDA_POLICIES)
def test_resnet50_trains_on_cuda_under_every_policy(name: str, batchnorm_16bit: bool) -> None:
    policy = CUDA_POLICIES[name]
    backend = resnet_on_cuda(policy, batchnorm_16bit=batchnorm_16bit)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    steps = 3
    for step in range(steps):
        loss = backend.train_step(*images_and_labels(step), lr=0.1)
        assert loss.is_cuda and loss.dtype == torch.float32 and bool(torch.isfinite(loss)), step
    assert backend.skipped_steps < steps
    if policy.loss_scaling == "dynamic":
        assert backend.loss_scale == policy.init_scale / 2**backend.skipped_steps
    after = backend.model.state_dict()
    assert not torch.equal(after["conv1.weight"], before["conv1.weight"])
    assert not torch.equal(after["fc.weight"], before["fc.weight"])
    if policy.master != "fp32":
        assert all(on_grid(p, DTYPES[policy.master]) for p in backend.precision.low_precision.values())


@pytest.mark.cuda
@needs_gpu
def test_resnet50_evaluates_on_cuda() -> None:
    backend = resnet_on_cuda(CUDA_POLICIES["bf16"])
    correct = backend.eval_step(*images_and_labels(0))
    assert correct.is_cuda and correct.dtype == torch.int64 and 0 <= int(correct) <= 4


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("compute", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("batchnorm_16bit", [False, True])
def test_autocast_on_cuda_computes_in_the_policy_dtype_and_batchnorm_as_configured(
    compute: str, batchnorm_16bit: bool
) -> None:
    model = TinyNet().to(CUDA)
    mixed = MixedPrecision(Policy(compute, compute=compute), model, CUDA, seed=0, batchnorm_16bit=batchnorm_16bit)
    seen: dict[str, torch.dtype] = {}
    model.conv.register_forward_hook(lambda m, inputs, output: seen.update(conv=output.dtype))
    model.bn.register_forward_hook(lambda m, inputs, output: seen.update(bn=inputs[0].dtype))
    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8, device=CUDA)
    logits = mixed.forward(model, images)
    bn_input = DTYPES[compute] if batchnorm_16bit else torch.float32
    assert seen == {"conv": DTYPES[compute], "bn": bn_input} and logits.dtype == DTYPES[compute]


# checkpoints (checkpoint/): the global CUDA generators and the stochastic-rounding stream


def test_generator_states_round_trip_without_cuda(tmp_path: Path, no_gpu: None) -> None:
    state = checkpoint.rng_state()
    assert state["cuda"] == []
    checkpoint.save(tmp_path / "ckpt.pt", {"fingerprint": {}, "rng": state})
    expected = random.random(), np.random.rand(), torch.rand(3)
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "ckpt.pt", {})["rng"])
    again = random.random(), np.random.rand(), torch.rand(3)
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


@pytest.mark.cuda
@needs_gpu
def test_cuda_generator_states_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    state = checkpoint.rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    checkpoint.save(tmp_path / "ckpt.pt", {"fingerprint": {}, "rng": state})
    expected = torch.rand(8, device=CUDA)
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "ckpt.pt", {})["rng"])  # loaded to the CPU
    assert torch.equal(torch.rand(8, device=CUDA), expected)


@pytest.mark.cuda
@needs_gpu
def test_the_stochastic_rounding_stream_on_cuda_resumes_from_a_checkpoint() -> None:
    first = resnet_on_cuda(CUDA_POLICIES["fp16.16"], seed=5)
    first.train_step(*images_and_labels(0), lr=0.1)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    second = resnet_on_cuda(CUDA_POLICIES["fp16.16"], seed=99)
    second.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), map_location="cpu", weights_only=True))
    assert second.precision.generator.device == CUDA
    assert second.precision.scaler.state_dict() == first.precision.scaler.state_dict()
    x = torch.full((1024,), 1 + 0.3 * ulp16(1.0), device=CUDA)
    rounded = [round_stochastic(x, torch.float16, b.precision.generator) for b in (first, second)]
    assert torch.equal(*rounded)


# package.cuda_fields (mlperf_logs/package.py): the system description's accelerator fields


def test_without_a_gpu_the_cuda_accelerator_fields_are_left_for_the_user(no_gpu: None) -> None:
    empty = {"accelerators_per_node": "", "accelerator_model_name": ""}
    assert package.cuda_fields() == empty and package.accelerator_fields({"name": "cuda"}) == empty


@pytest.mark.cuda
@needs_gpu
def test_the_cuda_accelerator_fields_name_this_machines_gpus() -> None:
    fields = package.accelerator_fields({"name": "cuda"})
    assert fields["accelerator_model_name"] == torch.cuda.get_device_name(0)
    assert fields["accelerators_per_node"] == str(torch.cuda.device_count())
    assert re.fullmatch(r"[1-9]\d* GB", fields["accelerator_memory_capacity"])


# optim.lars.LARS: foreach=None takes the multi-tensor path for CUDA parameters (the CPU side: tests/test_lars.py)


@pytest.mark.cuda
@needs_gpu
def test_lars_on_cuda_steps_with_multi_tensor_ops_and_a_device_lr_without_a_host_sync() -> None:
    """The same weights as the per-parameter path, and no synchronisation (torch's sync debug mode raises on one)."""
    torch.manual_seed(0)
    models = [build_resnet50(10, batchnorm(0.1, 1e-5), channels_last=True).to(CUDA) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for model in models:
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(CUDA)
    per_param = LARS(param_groups(models[0], 5e-5), lr=1.0, foreach=False)
    multi = LARS(param_groups(models[1], 5e-5), lr=torch.tensor(1.0, device=CUDA), foreach=None)
    per_param.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        multi.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16.32", "bf16.16"])
def test_a_resnet50_step_on_cuda_never_waits_for_the_host(name: str) -> None:
    """The harness's step with LARS (the lr and loss scaling's verdict on the device) under sync debug mode."""
    torch.manual_seed(0)
    model = build_resnet50(10, batchnorm(0.1, 1e-5), channels_last=True)
    optimizer = LARS(param_groups(model, 5e-5), lr=0.1, foreach=None)
    backend = NativeBackend(model, optimizer, CUDA, StepSettings(label_smoothing=0.1, policy=CUDA_POLICIES[name]))
    batches = [tuple(t.to(CUDA) for t in images_and_labels(step)) for step in range(3)]
    backend.train_step(*batches[0], lr=0.1)  # creates the momentum buffers; cuDNN picks its kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [backend.train_step(*batch, lr=0.1) for batch in batches[1:]]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(bool(torch.isfinite(loss)) for loss in losses)


# data.loading.device_decode: nvJPEG on CUDA (the CPU side: tests/test_device_decode.py)


@pytest.mark.cuda
@needs_gpu
def test_a_batch_decoded_on_cuda_is_the_batch_decoded_on_the_cpu(tiny_tree: Path) -> None:
    files = sorted((tiny_tree / "train").rglob("*.JPEG"))
    encoded = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in files]
    boxes = [(10, 20, 90, 120)] * len(files)
    flips = [slot % 2 == 0 for slot in range(len(files))]
    on_gpu = decode_crops(encoded, boxes, flips, 32, CUDA)
    on_cpu = decode_crops(encoded, boxes, flips, 32, torch.device("cpu"))
    assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape == (len(files), 32, 32, 3)
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().float().mean() < 2  # nvJPEG's IDCT against libjpeg-turbo's


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("share", [1.0, 0.5], ids=["gpu", "hybrid"])
def test_a_loader_decoding_on_cuda_gives_the_workers_batches_from_its_fixed_buffers(
    tiny_tree: Path, share: float
) -> None:
    with (
        loader_for(tiny_tree, batch=2, workers=1) as on_host,
        loader_for(tiny_tree, batch=2, workers=1, device=CUDA, device_share=share, pin_memory=True) as on_gpu,
    ):
        for (images, labels), (ours, our_labels) in zip(on_host, on_gpu, strict=True):
            assert ours.is_cuda and our_labels.is_cuda and torch.equal(our_labels.cpu(), labels)
            assert any(ours.data_ptr() == buffer.images.data_ptr() for buffer in on_gpu.feeder.buffers)
            assert (ours.cpu().int() - images.int()).abs().float().mean() < 2


@pytest.mark.cuda
@needs_gpu
def test_the_feeder_never_overwrites_a_batch_a_slow_step_has_not_read_yet() -> None:
    """Each step sleeps on the GPU before it reads its batch, while the producer's stream fills the other buffers
    at once: without the events a buffer would be refilled before its step read it."""
    from data.loading.feeder import Feeder

    def prepare(item: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((4, 8, 8, 3), item, dtype=torch.uint8, device=CUDA), torch.full((4,), item, device=CUDA)

    read = []
    for images, labels in Feeder(prepare, batch=4, size=8, device=CUDA)(iter(range(12))):
        torch.cuda._sleep(20_000_000)  # about 10 ms of the step's stream, queued before the batch is read
        read.append((images.float().mean(), labels.float().mean()))
    assert [(float(mean), float(label)) for mean, label in read] == [(float(i), float(i)) for i in range(12)]


# backends.graphs: device.cuda_graphs (the CPU side: tests/test_backends.py)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize(
    ("name", "ahead"), [("fp32", False), ("bf16", False), ("fp16.32", False), ("bf16", True)], ids=str
)
def test_a_captured_step_trains_as_the_eager_one(name: str, ahead: bool) -> None:
    """The first step captures (its warm-up steps undone), or `compile_ahead` before the clock starts, as
    train.py does; every later step replays: the losses and weights of eager steps, the loss scale kept on the
    device."""
    built = []
    for cuda_graphs in (False, True):
        torch.manual_seed(0)
        model = build_resnet50(10, batchnorm(0.1, 1e-5), channels_last=True)
        optimizer = LARS(param_groups(model, 5e-5), lr=0.1, foreach=None)
        settings = StepSettings(label_smoothing=0.1, policy=CUDA_POLICIES[name], cuda_graphs=cuda_graphs)
        built.append(NativeBackend(model, optimizer, CUDA, settings))
    eager, graphed = built
    if ahead:
        graphed.compile_ahead(train_batch=4, eval_batches=[4], image_size=32, classes=10)
        assert graphed.graphs.captured is not None
    batches = [tuple(t.to(CUDA) for t in images_and_labels(step)) for step in range(4)]
    for step, batch in enumerate(batches):
        losses = [backend.train_step(*batch, lr=0.1 / (step + 1)) for backend in built]
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-3, atol=1e-4, msg=f"step {step}")
    assert graphed.graphs.captured is not None and eager.graphs.captured is None
    if ahead:  # a resumed run loads the optimizer's state after compile_ahead: its tensors are new, so is the graph
        graphed.load_state_dict(graphed.state_dict())
        assert graphed.graphs.captured is None and graphed.graphs.pending
    assert graphed.loss_scale == eager.loss_scale and graphed.skipped_steps == eager.skipped_steps
    for ours, theirs in zip(graphed.model.state_dict().values(), eager.model.state_dict().values(), strict=True):
        if ours.is_floating_point():
            assert (ours - theirs).norm() <= 0.01 * theirs.norm() + 1e-6
        else:
            assert torch.equal(ours, theirs)  # BatchNorm's count: the warm-up's batches not counted
