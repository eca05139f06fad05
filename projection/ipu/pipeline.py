"""Pipelining on the simulated IPU: one replica's micro-batches through the model's stages in Graphcore's grouped
schedule, so that what a pipelined replica computes, and in what order, is what runs here.

Micro-batch m enters stage s at cycle m + s; the last stage runs its forward and backward back to back, and the
backward then moves back one stage per cycle, reaching stage s at cycle m + 2 (S - 1) - s. With S = 3, K = 4:

    cycle     0    1    2      3      4      5      6    7
    stage 0   F0   F1   F2     F3     B0     B1     B2   B3
    stage 1        F0   F1     F2 B0  F3 B1  B2     B3
    stage 2             F0 B0  F1 B1  F2 B2  F3 B3

Ramp-up fills the pipeline with forwards, in the main phase (cycles 2 (S - 1) to K - 1, when K >= 2S - 1) every
stage runs one forward and one backward per cycle, ramp-down drains the backwards. Stage s stashes the
activations of 2 (S - 1 - s) + 1 micro-batches at most, as `memory.in_flight` counts.

Sharded (device.pipeline_mode=sharded), the stages take turns instead: each micro-batch goes forward through every
stage and back before the next enters, one IPU busy at a time and one micro-batch's activations stashed per stage.

Either way each stage's parameters see their micro-batches' gradients in micro-batch order and each BatchNorm layer
its micro-batches' forwards in micro-batch order, so the step computes the unpipelined step's numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import NamedTuple

import torch
from torch import fx, nn

from backends.native import Pass
from projection.ipu.config import pipeline_short_of_micro_batches

Forward = Callable[[nn.Module, torch.Tensor], torch.Tensor]  # a stage's forward under the precision policy
Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, labels) -> loss, its backward run


class Event(NamedTuple):
    cycle: int
    stage: int
    kind: str  # "forward" or "backward"
    micro_batch: int


def schedule(stages: int, micro_batches: int, sharded: bool = False) -> list[Event]:
    """The grouped pipeline's events in execution order: by cycle, then stage, a stage's forward before its
    backward (the last stage runs a micro-batch's backward right after its forward, in the same cycle). Sharded,
    one event a cycle: each micro-batch's forwards up the stages, then its backwards down."""
    if why := pipeline_short_of_micro_batches(stages, micro_batches, sharded):
        raise ValueError(why)
    if sharded:
        turns = [(s, "forward") for s in range(stages)] + [(s, "backward") for s in reversed(range(stages))]
        order = [(m, s, kind) for m in range(micro_batches) for s, kind in turns]
        return [Event(cycle, s, kind, m) for cycle, (m, s, kind) in enumerate(order)]
    last = stages - 1
    events = [
        event
        for m in range(micro_batches)
        for s in range(stages)
        for event in (Event(m + s, s, "forward", m), Event(m + 2 * last - s, s, "backward", m))
    ]
    return sorted(events, key=lambda e: (e.cycle, e.stage, e.kind == "backward"))


def cut(model: nn.Module, splits: Sequence[str]) -> list[fx.GraphModule]:
    """The model's forward as stage modules, stage s + 1 starting at the first call of `splits[s]` (the probe's
    naming). Each stage must call a layer, and one tensor cross each cut (as at a block's input)."""
    graph = fx.symbolic_trace(model).graph
    nodes = [node for node in graph.nodes if node.op != "output"]
    bounds = [0, *_starts(model, nodes, splits), len(nodes)]
    starts, ends = ["the model's start", *splits], [*splits, None]
    stages: list[fx.GraphModule] = []
    carried: fx.Node | None = None
    for stage, ((first, stop), start, end) in enumerate(zip(pairwise(bounds), starts, ends, strict=True)):
        part = nodes[first:stop]
        if not any(node.op == "call_module" for node in part):
            raise ValueError(f"split {end or start!r} leaves pipeline stage {stage} without a layer")
        module, carried = _stage(model, part, carried, graph.output_node(), start, end)
        stages.append(module)
    return stages


def cut_points(model: nn.Module) -> list[str]:
    """Where a pipeline stage can begin, in forward order: the modules (two levels deep at most, so ResNet-50's
    blocks) at whose first call one tensor crosses from what ran before, each place once by its first name."""
    graph = fx.symbolic_trace(model).graph
    nodes = [node for node in graph.nodes if node.op != "output"]
    points: dict[int, str] = {}
    for name, _ in model.named_modules():
        if not name or name.count(".") > 1:
            continue
        try:
            (start,) = _starts(model, nodes, [name])
            before = nodes[:start]
            if start in points or not any(node.op == "call_module" for node in before):
                continue
            _passed_on(before, name)
        except ValueError:  # never runs, or two tensors cross (inside a residual block)
            continue
        points[start] = name
    return [points[start] for start in sorted(points)]


def _starts(model: nn.Module, nodes: list[fx.Node], splits: Sequence[str]) -> list[int]:
    """The index of each split module's first node, in increasing order."""
    modules = dict(model.named_modules())
    starts: list[int] = []
    for name in splits:
        if name not in modules or name == "":
            raise ValueError(f"split {name!r} is not a module of the model")
        first = next((i for i, node in enumerate(nodes) if name in (node.meta.get("nn_module_stack") or {})), None)
        if first is None:
            raise ValueError(f"split {name!r} never runs in the forward pass")
        if starts and first <= starts[-1]:
            raise ValueError(f"split {name!r} does not start after the previous split: an empty or reversed stage")
        starts.append(first)
    return starts


def _stage(
    model: nn.Module, part: list[fx.Node], carried: fx.Node | None, output: fx.Node, start: str, end: str | None
) -> tuple[fx.GraphModule, fx.Node | None]:
    """The stage from split `start` to split `end` (None: the model's output) running `part` on the value
    `carried` from the previous stage, and the value it passes to the next (None from the last stage)."""
    graph = fx.Graph()
    env = {carried: graph.placeholder("x")} if carried is not None else {}

    def value(node: fx.Node) -> fx.Node:
        if node not in env:
            if node.op != "get_attr":
                raise ValueError(f"the stage from {start!r} needs {node.name} from an earlier stage besides its input")
            assert isinstance(node.target, str)  # a get_attr node's target: the attribute's name
            env[node] = graph.get_attr(node.target)  # a parameter or buffer read again: state, not an activation
        return env[node]

    for node in part:
        env[node] = graph.node_copy(node, value)
    passed = None if end is None else _passed_on(part, end)
    graph.output(env[passed] if passed is not None else fx.map_arg(output.args[0], value))
    module = fx.GraphModule(model, graph)
    for name, child in model.named_children():
        setattr(module, name, child)  # the model's own tree: its parameter names (the policy's) hold in the stage
    return module, passed


def _passed_on(part: list[fx.Node], end: str) -> fx.Node:
    """The one value of `part` that later stages use."""
    members = set(part)
    leaving = [n for n in part if n.op != "get_attr" and any(user not in members for user in n.users)]
    if len(leaving) != 1:
        raise ValueError(f"the stage from {end!r} takes {len(leaving)} tensors; a cut must pass exactly one")
    return leaving[0]


class Pipeline:
    """A model cut into pipeline stages, running one replica's passes through them in the grouped schedule, or
    sharded: one stage at a time."""

    def __init__(self, model: nn.Module, splits: Sequence[str], sharded: bool = False) -> None:
        self.stages = cut(model, splits)
        self.sharded = sharded

    def run(
        self, passes: Sequence[Pass], forward: Forward, objective: Objective, before_last_backward: Callable[[], None]
    ) -> list[torch.Tensor]:
        """Every pass's stage forwards and backwards in schedule order, each stage forward inside its pass's scope;
        returns the passes' losses in pass order. `before_last_backward` runs before the last event."""
        flight = _Flight(self.stages, passes, forward, objective)
        events = schedule(len(self.stages), len(passes), self.sharded)
        for i, event in enumerate(events, 1):
            if i == len(events):
                before_last_backward()
            step = flight.forward if event.kind == "forward" else flight.backward
            step(event.stage, event.micro_batch)
        return flight.losses


class _Flight:
    """The micro-batches in flight: each stage's output, held with its graph until that stage's backward, and each
    stage's input, a leaf whose gradient the previous stage's backward takes."""

    def __init__(
        self, stages: list[fx.GraphModule], passes: Sequence[Pass], forward: Forward, objective: Objective
    ) -> None:
        self.stages, self.passes, self.forward_under_policy, self.objective = stages, passes, forward, objective
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.losses: list[torch.Tensor] = []

    def forward(self, stage: int, micro_batch: int) -> None:
        images, _, scope = self.passes[micro_batch]
        x = images
        if stage:
            x = self.outputs[stage - 1, micro_batch].detach().requires_grad_()
            self.inputs[stage, micro_batch] = x
        with scope:
            self.outputs[stage, micro_batch] = self.forward_under_policy(self.stages[stage], x)

    def backward(self, stage: int, micro_batch: int) -> None:
        output = self.outputs.pop((stage, micro_batch))
        if stage == len(self.stages) - 1:
            self.losses.append(self.objective(output, self.passes[micro_batch][1]))
        else:
            torch.autograd.backward(output, self.inputs.pop((stage + 1, micro_batch)).grad)
