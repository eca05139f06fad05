"""The simulated IPU computes what the IPU system would: virtual replicas against torchrun ranks (float64)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from backends.base import StepSettings
from backends.native import NativeBackend
from configs.checks import ConfigError
from configs.schema import Config, validate
from distributed.batchnorm import DistributedBatchNorm2d
from optim.precision import Policy
from projection.ipu.backend import IpuSimBackend
from projection.ipu.config import IpuSimConfig
from tests.ranks import run_ranks
from tests.systems import system

REPLICAS, MICRO, ACCUM, STEPS = 4, 2, 2, 4
GLOBAL = REPLICAS * MICRO * ACCUM


def net(norm: type[nn.Module] | partial) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        norm(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        norm(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).double()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(GLOBAL, 3, 6, 6, generator=g, dtype=torch.float64), torch.randint(5, (GLOBAL,), generator=g))
        for _ in range(STEPS)
    ]


def train(backend: NativeBackend, steps: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    for images, labels in steps:
        backend.train_step(images, labels, lr=0.1)
    backend.end_epoch()
    return backend.state_dict()["model"]


def sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


def _native_rank(rank: int, world_size: int, bn_group: int) -> dict[str, torch.Tensor]:
    model = net(partial(DistributedBatchNorm2d, group_size=bn_group))
    backend = NativeBackend(model, sgd(model), torch.device("cpu"), StepSettings(label_smoothing=0.1, grad_accum=ACCUM))
    return train(backend, [(x[rank::world_size], y[rank::world_size]) for x, y in batches()])


def ipu_sim_backend(model: nn.Module, replicas: int, bn_group: int = 1, **step: object) -> IpuSimBackend:
    settings = StepSettings(label_smoothing=0.1, grad_accum=ACCUM, **step)
    return IpuSimBackend(model, sgd(model), torch.device("cpu"), settings, replicas=replicas, bn_group=bn_group)


def ipu_sim(bn_group: int) -> dict[str, torch.Tensor]:
    return train(ipu_sim_backend(net(nn.BatchNorm2d), REPLICAS, bn_group=bn_group), batches())


@pytest.mark.parametrize(  # 2: groups that swap statistics; 1 and REPLICAS (the model's own statistics) are slow
    "bn_group", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(REPLICAS, marks=pytest.mark.slow)]
)
def test_virtual_replicas_train_to_the_weights_of_as_many_ranks(bn_group):
    ranks = run_ranks(_native_rank, REPLICAS, bn_group)
    simulated = ipu_sim(bn_group)
    for key, value in ranks[0].items():
        torch.testing.assert_close(simulated[key], value, rtol=0, atol=1e-9, msg=f"bn_group {bn_group}: {key}")


def test_replicas_stopped_in_the_middle_of_an_epoch_resume_with_each_groups_statistics():
    """Mid-epoch, each BatchNorm group's running statistics are its own (the epoch's end averages them): a
    checkpoint holds them (rank_state_dict), or a resumed run would end the epoch with other statistics."""
    straight = ipu_sim_backend(net(nn.BatchNorm2d), REPLICAS, bn_group=2)
    expected = train(straight, batches())
    stopped = ipu_sim_backend(net(nn.BatchNorm2d), REPLICAS, bn_group=2)
    for images, labels in batches()[:2]:
        stopped.train_step(images, labels, lr=0.1)
    saved = {"state": stopped.state_dict(), "rank": stopped.rank_state_dict()}
    resumed = ipu_sim_backend(net(nn.BatchNorm2d), REPLICAS, bn_group=2)
    resumed.load_state_dict(saved["state"])
    resumed.load_rank_state_dict(saved["rank"])
    actual = train(resumed, batches()[2:])
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


FP16_16 = Policy("fp16.16", compute="fp16", master="fp16", stochastic_rounding=True, emulated=True)


def first_layer_outputs(rank: int, world_size: int) -> dict[tuple[int, int], torch.Tensor]:
    """One step of fp16.16 with this rank's share of the replicas, every replica given the same images: the first
    layer's rounded output per (global replica, micro-batch)."""
    model = net(nn.BatchNorm2d).float()
    backend = ipu_sim_backend(model, REPLICAS // world_size, policy=FP16_16, seed=7)
    outputs: list[torch.Tensor] = []
    model[0].register_forward_hook(lambda module, inputs, output: outputs.append(output.detach()))
    images, labels = (t[: GLOBAL // REPLICAS].repeat_interleave(REPLICAS, dim=0) for t in batches()[0])
    backend.train_step(images[rank::world_size].float(), labels[rank::world_size], lr=0.1)
    passes = [(r, k) for r in range(REPLICAS // world_size) for k in range(ACCUM)]  # the order of forward_passes
    return {(rank + world_size * r, k): output for (r, k), output in zip(passes, outputs, strict=True)}


def test_each_replica_rounds_with_its_own_stream_wherever_it_runs():
    virtual = first_layer_outputs(0, 1)
    on_ranks = {key: value for rank in run_ranks(first_layer_outputs, 2) for key, value in rank.items()}
    assert virtual.keys() == on_ranks.keys()
    for key, output in virtual.items():
        assert torch.equal(output, on_ranks[key]), f"replica {key[0]}, micro-batch {key[1]}"
        assert torch.equal(output, output.half().float())  # on the fp16 grid
    assert not torch.equal(virtual[(0, 0)], virtual[(1, 0)])  # the same images, rounded with another stream


def ipu_config(**device: object) -> Config:
    cfg = Config()
    cfg.device = IpuSimConfig(name="ipu_sim", system=system("ipu_pod16"))
    cfg.data.global_batch = 64
    for key, value in device.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return cfg


@pytest.mark.parametrize(
    ("settings", "key", "message"),
    [
        (
            {"device__replicas": 3},
            "data.global_batch",
            "64 images do not deal evenly to 3 replicas x dist.grad_accum 1; the nearest that does is"
            " data.global_batch=63",
        ),
        ({"device__pipeline_splits": ["layer3"]}, "dist.grad_accum", "a pipeline of 2 stages needs at least 2"),
        (
            {"device__replicas": 16, "device__pipeline_splits": ["layer3"], "dist__grad_accum": 2},
            "device.replicas",
            "16 replicas x 2 IPUs each",
        ),
        ({"device__replicas": 4, "dist__bn_group_size": 3}, "dist.bn_group_size", "groups of 3 replicas"),
        ({"device__system": None}, "device", "ipu_sim needs a system"),
        ({"device__optimizer_state": "disk"}, "device.optimizer_state", "'disk' is not one of on_chip, streaming"),
    ],
)
def test_an_ipu_layout_that_does_not_add_up_is_refused(settings, key, message):
    with pytest.raises(ConfigError) as err:
        validate(ipu_config(**settings))
    assert err.value.key == key and message in str(err.value)
