"""A run's backend and batch shape, built from the composed config in one place each."""

import copy
import functools
from dataclasses import fields

import pytest
import torch
from torch._dynamo.utils import counters

from backends import build
from backends.base import Backend, BackendSection, StepSettings
from backends.build import facts_on
from backends.graphs import why_not_captured
from backends.native import NativeBackend, norm_layer
from configs.checks import ConfigError
from configs.device.sections import SECTIONS
from configs.schema import Config, batch_shape
from distributed import Topology
from distributed.batchnorm import DistributedBatchNorm2d
from optim.lars import LARS
from optim.params import param_groups
from optim.precision import Policy, PrecisionConfig
from projection import families
from projection.ipu.backend import IpuSimBackend
from tests.conftest import composed, config_error
from tests.test_precision import TinyNet


def built_from(cfg: Config, classes: int = 4) -> Backend:
    """The backend train.py builds from `cfg` on one rank."""
    return families.build_backend(cfg, build.run_facts(cfg, Topology(), batch_shape(cfg, 1)), classes)


def section_of(cfg: Config, world_size: int = 1) -> BackendSection:
    """The backend's section of `cfg`, as rank 0 of `world_size` ranks reads it."""
    return build.section_of(cfg, build.run_facts(cfg, Topology(world_size=world_size), batch_shape(cfg, world_size)))


def test_every_device_section_names_a_family_and_each_family_runs_or_is_projected():
    named = {name: families.family_of(Config(device=section(name=name))) for name, section in SECTIONS.items()}
    for name, family in named.items():
        section = SECTIONS[name]
        assert (family.build is not None) == (section().only_projected() is None), name
        assert (family.project is not None) == section.projected, name
    projected_only = {name for name, family in named.items() if family.build is None}
    assert projected_only == {"gpu_cluster"}  # run.mode=train refuses it


def test_the_policy_has_the_config_schemas_defaults():
    schema, policy = Config().precision, Policy()
    for field in fields(PrecisionConfig):
        assert getattr(policy, field.name) == getattr(schema, field.name), field.name
    assert Policy.for_device(schema, "cpu") == policy


def test_each_precision_file_means_the_policy_its_name_says():
    for name, emulated_on_cpu in [("fp32", False), ("fp16.32", True), ("fp16.16", True)]:
        policy = Policy.for_device(composed(f"precision={name}").precision, "cpu")
        assert policy.name == name and policy.emulated == emulated_on_cpu
        assert policy.master == ("fp16" if name.endswith(".16") else "fp32")


def test_a_cpu_backend_is_built_from_the_config_values_it_needs():
    cfg = composed("optim=lars", "precision=fp16.32", "optim.label_smoothing=0.1", "dist.grad_accum=2")
    backend = built_from(cfg, classes=7)
    assert type(backend) is NativeBackend and backend.device == torch.device("cpu")
    assert isinstance(backend.optimizer, LARS) and backend.model.fc.out_features == 7
    assert backend.policy == Policy.for_device(cfg.precision, "cpu") and backend.policy.emulated
    assert (backend.grad_accum, backend.label_smoothing) == (2, 0.1)


@pytest.mark.parametrize(("optimizer", "foreach"), [("lars", "true"), ("sgd", "false"), ("lars", "null")])
def test_device_foreach_picks_the_optimizers_implementation(optimizer, foreach):
    cfg = composed(f"optim={optimizer}", f"device.foreach={foreach}")
    backend = built_from(cfg)
    assert {group["foreach"] for group in backend.optimizer.param_groups} == {cfg.device.foreach}


@pytest.mark.parametrize(
    ("value", "on_cuda", "on_cpu"), [("null", True, False), ("true", True, True), ("false", False, False)]
)
def test_device_bn_16bit_input_is_on_for_cuda_unless_set(value, on_cuda, on_cpu):
    cfg = composed(f"device.bn_16bit_input={value}")
    for device, on in (("cuda", on_cuda), ("cpu", on_cpu)):
        facts = facts_on(cfg, Topology(), torch.device(device), batch_shape(cfg, 1))
        assert build.section_of(cfg, facts).step.batchnorm_16bit is on


def random_batch(batch: int, image_size: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, image_size, image_size, 3), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, classes, (batch,), generator=generator)


def trained_side_by_side(built: list[NativeBackend], shape: tuple[int, int], classes: int) -> list[torch.Tensor]:
    """Two steps of each backend on the same random uint8 batches of `shape` (batch, image size); the losses of
    the last."""
    for step in range(2):
        batch = random_batch(*shape, classes, seed=step)
        losses = [backend.train_step(*batch, lr=0.5) for backend in built]
    return losses


def assert_trained_alike(eager: NativeBackend, compiled: NativeBackend, losses: list[torch.Tensor]) -> None:
    """The same loss, and each tensor of the state within 1 % of its norm: compiled kernels sum in another order,
    which BatchNorm over a tiny batch amplifies (0.16 % at most for ResNet-50 here)."""
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0)
    ours, theirs = compiled.model.state_dict(), eager.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        if not tensor.is_floating_point():  # BatchNorm's count of batches
            assert torch.equal(ours[name], tensor), name
            continue
        assert (ours[name] - tensor).norm() <= 0.01 * tensor.norm() + 1e-12, name


@pytest.fixture
def own_inductor_cache(tmp_path, monkeypatch):
    """A compile cache of this test's own: inductor's shared one (/tmp/torchinductor_$USER) is not keyed by
    ATEN_CPU_CAPABILITY, and its code compiled under another setting gave NaN or crashed (make test-hosts)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def test_a_compiled_model_compiles_ahead_of_the_clock_then_trains_as_the_eager_one(monkeypatch):
    """device.compile's mechanism on a small net: compile_ahead compiles the train and eval steps on synthetic
    batches and leaves every state as it was; the steps after it compile nothing more (an evaluation's last, partial
    batch included) and train as eager does. Compiled by aot_eager: dynamo's graphs and AOTAutograd's backward as
    inductor gets them, without inductor's C++ (20 s here; the slow compiled runs of tests/test_run.py have it)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    built = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = TinyNet()
        optimizer = LARS(param_groups(model, 5e-5), lr=0.5)
        step = StepSettings(label_smoothing=0.1, compiled=compiled)
        built.append(NativeBackend(model, optimizer, torch.device("cpu"), step))
    eager, compiled = built
    before = copy.deepcopy((compiled.state_dict(), compiled.rank_state_dict()))
    graphs = counters["stats"]["unique_graphs"]
    compiled.compile_ahead(train_batch=8, eval_batches=[8, 3], image_size=12, classes=4)
    assert counters["stats"]["unique_graphs"] > graphs  # compiled: forward in training and in eval mode
    assert_same_state(before, (compiled.state_dict(), compiled.rank_state_dict()))
    graphs = counters["stats"]["unique_graphs"]
    losses = trained_side_by_side(built, (8, 12), classes=4)
    correct = [[int(backend.eval_step(*random_batch(batch, 12, 4))) for batch in (8, 3)] for backend in built]
    # nothing compiled once the clock would have started, for the evaluation's last, partial batch neither
    assert counters["stats"]["unique_graphs"] == graphs
    assert_trained_alike(eager, compiled, losses)
    assert correct[0] == correct[1]


def assert_same_state(before: object, after: object) -> None:
    """Two nested state dicts (tensors, numbers, lists) hold the same values."""
    if isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys()
        for key in before:
            assert_same_state(before[key], after[key])
    elif isinstance(before, list | tuple):
        assert len(before) == len(after)
        for a, b in zip(before, after, strict=True):
            assert_same_state(a, b)
    elif isinstance(before, torch.Tensor):
        assert torch.equal(before, after)
    else:
        assert before == after


@pytest.mark.slow  # compiling ResNet-50's forward and backward on the CPU takes over a minute
@pytest.mark.usefixtures("own_inductor_cache")
def test_a_compiled_resnet50_from_the_config_trains_and_evaluates_as_the_eager_one():
    shape = ("data.image_size=32", "data.eval_resize=32", "data.global_batch=4", "precision=fp32")
    built = []
    for compiled in ("false", "true"):
        torch.manual_seed(0)
        built.append(built_from(composed(*shape, f"device.compile={compiled}")))
    built[1].compile_ahead(train_batch=4, eval_batches=[4], image_size=32, classes=4)
    losses = trained_side_by_side(built, (4, 32), classes=4)
    assert_trained_alike(*built, losses)
    batch = random_batch(4, 32, 4)
    assert int(built[1].eval_step(*batch)) == int(built[0].eval_step(*batch))


def test_batchnorm_spans_the_configured_group_of_ranks():
    """DistributedBatchNorm2d over dist.bn_group_size ranks (the torchrun run of tests/test_distributed.py that
    trains to the target with it is slow); BatchNorm2d for a group of one."""
    over_both = norm_layer(section_of(composed("dist.bn_group_size=2", world_size=2), world_size=2))(8)
    assert isinstance(over_both, DistributedBatchNorm2d) and over_both.group_size == 2
    assert type(norm_layer(section_of(composed()))(8)) is torch.nn.BatchNorm2d


def test_a_simulated_ipu_backend_takes_its_ranks_share_of_the_replicas():
    overrides = ("device=ipu_pod16", "device.replicas=4", "data.global_batch=16", "dist.bn_group_size=2")
    cfg = composed(*overrides, world_size=2)
    backend = families.build_backend(cfg, build.run_facts(cfg, Topology(rank=1, world_size=2), batch_shape(cfg, 2)), 4)
    assert type(backend) is IpuSimBackend and backend.device == torch.device("cpu")
    assert (backend.replicas, backend.bn_group) == (2, 2)
    assert backend.clock.step_s > 0  # timed by the cost model once the memory plan fits


def test_the_batch_shape_deals_the_global_batch_to_ranks_replicas_and_micro_batches():
    native = batch_shape(composed("data.global_batch=64", "dist.grad_accum=2", "dist.bn_group_size=2", world_size=4), 4)
    assert (native.per_rank, native.micro_batch, native.bn_span) == (16, 8, 16)
    cfg = composed("device=ipu_pod16", "device.replicas=8", "data.global_batch=160", "dist.grad_accum=2", world_size=2)
    simulated = batch_shape(cfg, world_size=2)
    assert (simulated.per_rank, simulated.micro_batch, simulated.bn_span) == (80, 10, 10)


@pytest.mark.parametrize("key", ["dist.per_rank_batch=16", "device.micro_batch=20"])
def test_a_removed_batch_key_is_refused_in_one_line(key):
    assert config_error(key).startswith(f"{key.split('=')[0]}: no such key")


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ("layer9", "'layer9' is not a module of the model (e.g. conv1, bn1, relu, layer2, layer3.2)"),
        ("layer2.0.conv2", "the stage from 'layer2.0.conv2' takes 2 tensors; a cut must pass exactly one"),
    ],
)
def test_a_pipeline_split_that_is_not_a_module_boundary_is_a_config_error(split, message):
    """As train.py builds the backend, which it tells in one line with exit status 2 (tests/test_config.py)."""
    cfg = composed("device=ipu_pod16", "device.replicas=2", "data.global_batch=16", "dist.grad_accum=2")
    cfg.device.pipeline_splits = [split]
    with pytest.raises(ConfigError) as refused:
        built_from(cfg)
    assert refused.value.key == "device.pipeline_splits" and str(refused.value).endswith(message)


@pytest.mark.parametrize(
    ("device", "device_lr", "fp32_masters", "ranks", "reason"),
    [
        ("cpu", True, True, 1, "there is no CUDA graph on cpu"),
        ("cuda", False, True, 1, "the optimizer reads its lr on the host"),
        ("cuda", True, False, 1, "16-bit masters round with a generator"),
        ("cuda", True, True, 2, "the gradient all-reduce over several ranks"),
        ("cuda", True, True, 1, None),
    ],
)
def test_a_step_is_captured_only_where_nothing_in_it_needs_the_host(device, device_lr, fp32_masters, ranks, reason):
    why = why_not_captured(torch.device(device), device_lr, fp32_masters, ranks)
    assert why == reason if reason is None else why.startswith(reason)


def test_cuda_graphs_are_settled_before_the_clock_starts(capsys):
    """train.py's compile_ahead tries the capture in the init phase: on the CPU the reason is said there, once,
    and the first timed step neither tries again nor says it again."""
    shape = ("data.image_size=32", "data.eval_resize=32", "data.global_batch=4", "precision=fp32")
    backend = built_from(composed(*shape, "device.cuda_graphs=true"))
    backend.compile_ahead(train_batch=4, eval_batches=[4], image_size=32, classes=4)
    assert "device.cuda_graphs: there is no CUDA graph on cpu; the step runs eagerly" in capsys.readouterr().out
    backend.train_step(*random_batch(4, 32, 4), lr=0.1)
    assert capsys.readouterr().out == ""


def test_cuda_graphs_on_the_cpu_says_why_and_trains_eagerly(capsys):
    shape = ("data.image_size=32", "data.eval_resize=32", "data.global_batch=4", "precision=fp32")
    built = []
    for graphs in ("false", "true"):
        torch.manual_seed(0)
        built.append(built_from(composed(*shape, f"device.cuda_graphs={graphs}")))
    losses = trained_side_by_side(built, (4, 32), classes=4)
    out = capsys.readouterr().out
    assert out.count("device.cuda_graphs: there is no CUDA graph on cpu; the step runs eagerly") == 1
    assert torch.equal(losses[0], losses[1])
    for ours, theirs in zip(built[1].model.parameters(), built[0].model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
