"""bench.step runs end to end on tiny settings: a table, then the JSON figures (the real ones come from bench/)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import step

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # three policies, two ResNet-50s each: a minute or two
def test_step_bench_compares_the_harness_with_a_bare_loop_for_each_policy():
    command = [sys.executable, "-m", "bench.step", "--batch", "4", "--size", "32", "--steps", "1", "--warmup", "1"]
    command += ["--rounds", "1", "--threads", "1", "--ipu-replicas", "2"]  # one thread: a busy machine slows it less
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    lines = result.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    native = {"bf16_native"} if step.ONEDNN_BF16 else set()
    assert set(figures) == {"fp32", "bf16", "fp16", "ipu_sim", "min_ratio", "bf16_emulated", "bf16_over_fp32"} | native
    assert figures["bf16_emulated"] is not step.NATIVE_BF16
    assert figures["bf16_over_fp32"] == pytest.approx(
        figures["bf16"]["harness_img_s"] / figures["fp32"]["harness_img_s"], abs=2e-3
    )
    for policy in ("fp32", "bf16", "fp16"):
        row = figures[policy]
        harness, bare = row["harness_img_s"], row["bare_img_s"]  # rounded to 0.01, the ratio to 0.001
        assert harness > 0 and bare > 0.005
        low, high = (harness - 0.005) / (bare + 0.005), (harness + 0.005) / (bare - 0.005)
        assert low - 0.0005 <= row["ratio"] <= high + 0.0005  # the ratio of the rates, to rounding
        assert row["ratio_all_steps"] > 0
        assert any(line.startswith(f"{policy} ") for line in lines)
    assert figures["min_ratio"] == min(figures[policy]["ratio"] for policy in ("fp32", "bf16", "fp16"))
    ipu = figures["ipu_sim"]
    assert ipu["ipu_sim_img_s"] > 0 and ipu["native_img_s"] > 0 and ipu["ratio"] > 0
    assert any(line.startswith("ipu_sim, 2 virtual replicas") for line in lines)


def test_step_bench_refuses_an_unknown_policy(capsys):
    assert step.main(["--policies", "fp32,int8"]) == 2
    assert "int8" in capsys.readouterr().err


@pytest.mark.slow  # 10 s: every policy's two steps twice; the bench's own check, not the harness's
def test_the_bare_loops_do_the_harness_arithmetic_bit_for_bit():
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, step.CLASSES, (2,), generator=generator)
    pairs = {name: (step.harness(step.POLICIES[name]), step.bare(name)) for name in step.POLICIES}
    pairs["bf16 emulated"] = step.harness(step.EMULATED_BF16), step.bare("bf16", emulated_bf16=True)
    for policy, (harness, bare) in pairs.items():
        losses = [(harness.step(images, labels).item(), bare.step(images, labels).item()) for _ in range(2)]
        assert all(ours == theirs for ours, theirs in losses), (policy, losses)
