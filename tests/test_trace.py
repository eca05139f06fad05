"""bench.trace profiles the harness's eager bf16 step against the plain loop: tiny sizes here (figures: bench/)."""

import json

import pytest
import torch

from bench import trace

TINY = ["--batch", "2", "--image", "32", "--steps", "1", "--warmup", "1"]


def figures_of(capsys, arguments: list[str]) -> tuple[dict, str]:
    assert trace.main([*TINY, *arguments]) == 0
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1]), out


def test_the_harness_step_allocates_and_casts_as_the_plain_loop_does_with_cudas_defaults(capsys):
    figures, out = figures_of(capsys, [])
    assert {"ops_ratio", "bytes_ratio", "cast_bytes_ratio", "harness", "plain", "overrides"} <= set(figures)
    for side in ("harness", "plain"):
        assert set(figures[side]) == {"ops", "bytes", "cast_bytes"}
        assert all(value > 0 for value in figures[side].values()), figures[side]
    for key in ("ops", "bytes", "cast_bytes"):
        assert figures[f"{key}_ratio"] == round(figures["harness"][key] / figures["plain"][key], 4)
    assert {"precision.emulate=never", "device.bn_16bit_input=true", "device.foreach=true"} <= set(figures["overrides"])
    # At 32 px the weights' traffic (their bf16 copies, fp32 gradients) is most of a step's 0.5 GB: within 1%,
    # where LARS's update formed as a temporary (102 MB a step) gave 1.2 and BatchNorm's fp32 input casts 1.02.
    assert figures["bytes_ratio"] <= 1.01 and figures["cast_bytes_ratio"] <= 1.01, figures
    assert "allocated" in out and "top ops by bytes allocated per step" in out


@pytest.mark.slow  # 5 s; shows the trace can see a cast, which the test above relies on
def test_the_trace_sees_batchnorms_fp32_input_cast(capsys):
    """A step that casts more is measured so: BatchNorm's input cast to fp32 and its fp32 output (the CPU's
    default, device.bn_16bit_input off) add casts and allocations that the plain loop does not make."""
    figures, out = figures_of(capsys, ["--defaults", "cpu", "device.foreach=true"])
    assert "device.bn_16bit_input=true" not in figures["overrides"]
    assert figures["cast_bytes_ratio"] > 1.02 and figures["bytes_ratio"] > 1.01, figures  # 1.035 and 1.017 here
    assert "c10::BFloat16->float" in out


class Event:
    """The few methods of a profiler (kineto) event that bench.trace reads."""

    def __init__(self, name, start, end, nbytes=0, shapes=(), dtypes=(), thread=1):
        self._name, self._start, self._end, self._nbytes = name, start, end, nbytes
        self._shapes, self._dtypes, self._thread = list(shapes), list(dtypes), thread

    def name(self):
        return self._name

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end

    def nbytes(self):
        return self._nbytes

    def shapes(self):
        return self._shapes

    def dtypes(self):
        return self._dtypes

    def start_thread_id(self):
        return self._thread

    def device_type(self):
        return torch.autograd.DeviceType.CPU


def test_allocations_go_to_the_outermost_operator_and_casts_count_their_destination():
    events = [
        Event("autograd::engine::evaluate_function: ToCopyBackward0", 0, 100),
        Event("aten::to", 10, 50),
        Event("aten::_to_copy", 11, 49),
        Event("aten::empty_strided", 12, 13),
        Event("[memory]", 12, 12, nbytes=800),
        Event("aten::copy_", 14, 48, shapes=[[10, 20], [10, 20]], dtypes=["float", "c10::BFloat16"]),
        Event("aten::copy_", 60, 70, shapes=[[5], [5]], dtypes=["float", "float"]),  # no cast
        Event("[memory]", 80, 80, nbytes=-800),  # a free
        Event("[memory]", 90, 90, nbytes=16),  # outside any aten op
        Event("aten::mul", 200, 210),
        Event("[memory]", 205, 205, nbytes=64, thread=2),  # another thread's: not the mul's
    ]
    result = trace.analyse(events, steps=2)
    assert result.allocated == {"aten::to": 400, trace.OUTSIDE: 40}
    assert result.bytes == 440
    assert result.casts == {"c10::BFloat16->float": 400}  # 200 floats per step
    assert result.cast_bytes == 400
    assert result.calls["aten::copy_"] == 1 and result.ops == pytest.approx(3.0)  # 6 aten calls in 2 steps
