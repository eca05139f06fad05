"""run.mode=benchmark (benchmark.py): the train step timed on random in-memory batches, in process."""

from __future__ import annotations

import json

from backends import build
from benchmark import benchmark
from configs.schema import batch_shape
from distributed import Topology
from tests.conftest import composed

TINY = ("run.mode=benchmark", "experiment=smoke", "data.image_size=32", "data.global_batch=4")


def test_the_benchmark_times_its_steps_and_prints_what_it_ran_then_one_json_line(capsys):
    cfg = composed(*TINY, "run.benchmark_steps=2", "optim=sgd")
    benchmark(cfg, build.run_facts(cfg, Topology(), batch_shape(cfg, 1)))
    *lines, last = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(last)
    assert figures["img_s"] > 0
    assert {key: figures[key] for key in ("precision", "batch", "image_size", "optimizer", "ranks", "device")} == {
        "precision": "fp32",
        "batch": 4,
        "image_size": 32,
        "optimizer": "sgd",
        "ranks": 1,
        "device": "cpu",
    }
    assert lines[0] == "precision fp32: compute fp32 (native), master weights fp32, loss scaling none"
    assert lines[1].startswith("2 steps of batch 4 at 32 px on cpu: ") and lines[1].endswith(" img/s")
