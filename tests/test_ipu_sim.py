"""The simulated IPU computes what the IPU system would: virtual replicas against torchrun ranks (float64)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from backends.ipu_sim.backend import IpuSimBackend
from backends.native import NativeBackend
from distributed.batchnorm import DistributedBatchNorm2d
from tests.ranks import run_ranks

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
    backend = NativeBackend(model, sgd(model), torch.device("cpu"), label_smoothing=0.1, grad_accum=ACCUM)
    return train(backend, [(x[rank::world_size], y[rank::world_size]) for x, y in batches()])


def ipu_sim(bn_group: int) -> dict[str, torch.Tensor]:
    model = net(nn.BatchNorm2d)
    backend = IpuSimBackend(
        model,
        sgd(model),
        torch.device("cpu"),
        label_smoothing=0.1,
        grad_accum=ACCUM,
        replicas=REPLICAS,
        bn_group=bn_group,
    )
    return train(backend, batches())


def test_virtual_replicas_train_to_the_weights_of_as_many_ranks():
    for bn_group in (1, 2):
        ranks = run_ranks(_native_rank, REPLICAS, bn_group)
        simulated = ipu_sim(bn_group)
        for key, value in ranks[0].items():
            torch.testing.assert_close(simulated[key], value, rtol=0, atol=1e-9, msg=f"bn_group {bn_group}: {key}")
