"""DistributedBatchNorm2d against nn.BatchNorm2d: on the group's concatenated batch, per rank, and in training.

Each spawn of gloo ranks costs seconds of imports, so one spawn of two ranks (the module-scoped fixture
`two_ranks`) runs every layer case and both trainings, and the tests check its results; only the check that
groups are consecutive pairs spawns four ranks of its own. Everything runs in float64, where the two must agree
to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distributed.allreduce import GradientBuckets
from distributed.batchnorm import DistributedBatchNorm2d
from tests.ranks import run_ranks

WORLD = 2
BATCHES = (3, 5)  # per-rank batch sizes differ: the count is reduced, not assumed
CHANNELS, STEPS = 4, 3
TOL = {"rtol": 0, "atol": 1e-12}
CL = torch.channels_last
# name: (group_size, BatchNorm2d keywords, memory format)
LAYER_CASES = {
    "group": (2, {}, torch.contiguous_format),
    "group_channels_last_cumulative": (2, {"momentum": None}, CL),
    "group_plain": (2, {"affine": False, "track_running_stats": False}, CL),
    "local_channels_last": (1, {}, CL),
}
GROUP_CASES = [name for name, (group_size, _, _) in LAYER_CASES.items() if group_size == 2]

Results = dict[str, torch.Tensor]


def _rank_rows(rank: int) -> slice:
    start = sum(BATCHES[:rank])
    return slice(start, start + BATCHES[rank])


def _layer_data(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """STEPS batches of inputs and output gradients (all ranks' rows), and the affine parameters."""
    g = torch.Generator().manual_seed(seed)
    shape = (STEPS, sum(BATCHES), CHANNELS, 5, 6)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 3  # a mean that the sums must not lose
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    weight = torch.rand(CHANNELS, generator=g, dtype=torch.float64) + 0.5
    bias = torch.randn(CHANNELS, generator=g, dtype=torch.float64)
    return x, dy, weight, bias


def _run_layer(layer: nn.BatchNorm2d, data: tuple[torch.Tensor, ...], memory_format: torch.memory_format) -> Results:
    """STEPS forward/backward passes of `layer` (float64, the given affine parameters if it has any) on (x, dy)."""
    x, dy, weight, bias = data
    layer = layer.double()
    if layer.affine:
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
    ys, dxs = [], []
    for step_x, step_dy in zip(x, dy, strict=True):
        step_x = step_x.to(memory_format=memory_format).requires_grad_()
        y = layer(step_x)
        y.backward(step_dy)
        ys.append(y.detach())
        dxs.append(step_x.grad)
    results = {
        "y": torch.stack(ys),
        "dx": torch.stack(dxs),
        "layout_kept": torch.tensor(y.is_contiguous(memory_format=memory_format)),
    }
    if layer.affine:
        results |= {"dweight": layer.weight.grad, "dbias": layer.bias.grad}
    if layer.track_running_stats:
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            results[key] = getattr(layer, key)
    return results


def _layers_on_rank(rank: int, world_size: int, data: tuple[torch.Tensor, ...]) -> dict[str, Results | str]:
    """Every layer case on this rank's rows, and the message of a group_size that does not divide the world."""
    x, dy, weight, bias = data
    mine = (x[:, _rank_rows(rank)], dy[:, _rank_rows(rank)], weight, bias)
    results: dict[str, Results | str] = {
        name: _run_layer(DistributedBatchNorm2d(CHANNELS, group_size=g, **kwargs), mine, fmt)
        for name, (g, kwargs, fmt) in LAYER_CASES.items()
    }
    try:
        DistributedBatchNorm2d(CHANNELS, group_size=3)
    except ValueError as e:
        results["error"] = str(e)
    return results


@pytest.fixture(scope="module")
def layers(two_ranks) -> tuple[tuple[torch.Tensor, ...], list[dict[str, Results | str]]]:
    layer_data, _, ranks = two_ranks
    return layer_data, [r["layers"] for r in ranks]


@pytest.mark.parametrize("case", GROUP_CASES)
def test_group_equals_batchnorm_on_concatenated_batch(layers, case: str) -> None:
    data, ranks = layers
    _, kwargs, fmt = LAYER_CASES[case]
    ref = _run_layer(nn.BatchNorm2d(CHANNELS, **kwargs), data, fmt)
    assert ranks[0][case].keys() == ref.keys()
    for key, expected in ref.items():
        if key in ("y", "dx"):
            for rank, got in enumerate(r[case][key] for r in ranks):
                torch.testing.assert_close(got, expected[:, _rank_rows(rank)], **TOL)
        elif key in ("dweight", "dbias"):  # each rank's share: together they are the concatenated batch's
            torch.testing.assert_close(sum(r[case][key] for r in ranks), expected, **TOL)
        else:  # running statistics and the layout: identical, not merely close, on every rank of the group
            torch.testing.assert_close(ranks[0][case][key], expected, **TOL)
            assert torch.equal(ranks[0][case][key], ranks[1][case][key])


def _pair_on_rank(rank: int, world_size: int, data: list[tuple[torch.Tensor, ...]]) -> Results:
    """Groups of 2 among 4 ranks: rank r takes its rows of pair r // 2's data."""
    x, dy, weight, bias = data[rank // 2]
    rows = _rank_rows(rank % 2)
    return _run_layer(DistributedBatchNorm2d(CHANNELS, group_size=2), (x[:, rows], dy[:, rows], weight, bias), CL)


@pytest.mark.slow
def test_groups_are_pairs_of_consecutive_ranks() -> None:
    data = [_layer_data(seed) for seed in (1, 2)]
    ranks = run_ranks(_pair_on_rank, 4, data)
    for pair, pair_data in enumerate(data):
        ref = _run_layer(nn.BatchNorm2d(CHANNELS), pair_data, CL)
        for member in (0, 1):
            got = ranks[2 * pair + member]
            torch.testing.assert_close(got["y"], ref["y"][:, _rank_rows(member)], **TOL)
            torch.testing.assert_close(got["running_var"], ref["running_var"], **TOL)


def test_group_size_1_is_batchnorm_on_each_rank(layers) -> None:
    (x, dy, weight, bias), ranks = layers
    _, kwargs, fmt = LAYER_CASES["local_channels_last"]
    for rank, got in enumerate(r["local_channels_last"] for r in ranks):
        mine = (x[:, _rank_rows(rank)], dy[:, _rank_rows(rank)], weight, bias)
        ref = _run_layer(nn.BatchNorm2d(CHANNELS, **kwargs), mine, fmt)
        assert got.keys() == ref.keys()
        for key in ref:
            torch.testing.assert_close(got[key], ref[key], **TOL)


def test_group_size_must_divide_world_size(layers) -> None:
    _, ranks = layers
    for rank in ranks:
        assert "group_size=3" in rank["error"] and "world size 2" in rank["error"]


@pytest.mark.parametrize("group_size", [0, -2])
def test_group_size_must_be_positive(group_size: int) -> None:
    with pytest.raises(ValueError, match=f"group_size={group_size}"):
        DistributedBatchNorm2d(CHANNELS, group_size=group_size)


@pytest.mark.parametrize("group_size", [1, 2])
def test_without_process_group_is_batchnorm(group_size: int) -> None:
    data = _layer_data()
    got = _run_layer(DistributedBatchNorm2d(CHANNELS, group_size=group_size), data, CL)
    ref = _run_layer(nn.BatchNorm2d(CHANNELS), data, CL)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], **TOL)
    x = data[0][0]
    layer = DistributedBatchNorm2d(CHANNELS, group_size=group_size).double().eval()
    torch.testing.assert_close(layer(x), nn.BatchNorm2d(CHANNELS).double().eval()(x), **TOL)


def test_state_dict_loads_into_torchvision_resnet50() -> None:
    # Imported here, not at the top: the spawned ranks import this module, and torchvision takes seconds.
    import torchvision

    from models import ResNet50

    assert DistributedBatchNorm2d(CHANNELS).state_dict().keys() == nn.BatchNorm2d(CHANNELS).state_dict().keys()
    model = ResNet50(norm_layer=partial(DistributedBatchNorm2d, group_size=2))
    torchvision.models.resnet50().load_state_dict(model.state_dict())


# Training: a small net, SGD with momentum, 2 ranks x batch B against one process x batch 2B.

B, TRAIN_STEPS = 4, 20


def _net(norm: Callable[[int], nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        norm(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
        norm(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).double()


def _train_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    images = torch.randn(TRAIN_STEPS, WORLD * B, 3, 8, 8, generator=g, dtype=torch.float64)
    labels = torch.randint(10, (TRAIN_STEPS, WORLD * B), generator=g)
    return images, labels


def _train(model: nn.Module, images: Iterable[torch.Tensor], labels: torch.Tensor, parts: int = 1) -> Results:
    """The state after TRAIN_STEPS steps. Each step's loss is the mean of the losses of the batch's `parts` equal
    parts, each a forward pass of its own; with a process group the gradients are averaged over the ranks by
    the bulk all-reduce the native backend uses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gradients = GradientBuckets(list(model.parameters()))
    for step_images, step_labels in zip(images, labels, strict=True):
        gradients.zero_()
        gradients.arm()
        parts_x, parts_y = step_images.chunk(parts), step_labels.chunk(parts)
        loss = sum(F.cross_entropy(model(x), y) for x, y in zip(parts_x, parts_y, strict=True)) / parts
        loss.backward()
        gradients.reduce()
        optimizer.step()
    return model.state_dict()


def _train_on_rank(rank: int, world_size: int, images: torch.Tensor, labels: torch.Tensor) -> dict[int, Results]:
    """This rank's half of each batch, channels_last, with BatchNorm groups of 1 and 2 ranks."""
    rows = slice(rank * B, (rank + 1) * B)
    mine = [step.contiguous(memory_format=CL) for step in images[:, rows]]
    return {
        g: _train(_net(partial(DistributedBatchNorm2d, group_size=g)).to(memory_format=CL), mine, labels[:, rows])
        for g in (1, 2)
    }


@pytest.fixture(scope="module")
def trained(two_ranks) -> tuple[tuple[torch.Tensor, torch.Tensor], list[dict[int, Results]]]:
    _, train_data, ranks = two_ranks
    return train_data, [r["trained"] for r in ranks]


def test_training_group_2_equals_one_process_on_whole_batch(trained) -> None:
    data, ranks = trained
    ref = _train(_net(nn.BatchNorm2d), *data)
    for rank in ranks:
        assert rank[2].keys() == ref.keys()
        for key, value in ref.items():
            torch.testing.assert_close(rank[2][key], value, rtol=0, atol=1e-9, msg=key)


def test_training_group_1_equals_one_process_on_each_half(trained) -> None:
    data, ranks = trained
    model = _net(nn.BatchNorm2d)
    _train(model, *data, parts=WORLD)
    for rank in ranks:
        for key, value in model.named_parameters():
            torch.testing.assert_close(rank[1][key], value.detach(), rtol=0, atol=1e-9, msg=key)


# The one spawn of two ranks behind the `layers` and `trained` fixtures.


def _on_rank(
    rank: int, world_size: int, layer_data: tuple[torch.Tensor, ...], train_data: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, Any]:
    return {
        "layers": _layers_on_rank(rank, world_size, layer_data),
        "trained": _train_on_rank(rank, world_size, *train_data),
    }


@pytest.fixture(scope="module")
def two_ranks() -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor], list[dict[str, Any]]]:
    """The layer cases and the trainings, in one spawn."""
    layer_data, train_data = _layer_data(), _train_data()
    return layer_data, train_data, run_ranks(_on_rank, WORLD, layer_data, train_data)
