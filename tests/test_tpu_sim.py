"""The simulated TPU slice: its replicas' BatchNorm groups, its clock's host calls, the precision it computes, each
replica's memory plan, its refusals, and train.py on device=tpu_v4 device.chips=4: a tiny run in device time, and
the same stopped at a host call's end and resumed to the same run (slow: the smoke task to its target)."""

from __future__ import annotations

import signal
from functools import cache
from pathlib import Path

import pytest
import torch
from torch import nn

from backends import build
from backends.base import StepSettings
from backends.clock import DeviceClock
from backends.native import NativeBackend
from configs.checks import ConfigError
from configs.schema import Config, batch_shape
from distributed import Topology
from monitor.metrics import EpochMetrics
from monitor.progress import Simulated, epoch_line, print_summary
from projection.ipu.backend import IpuSimBackend
from projection.profile import ModelProfile
from projection.tpu import simulator
from projection.tpu.backend import TpuSimBackend
from tests.conftest import (
    ALL_EPOCHS,
    StraightRun,
    assert_compliant,
    assert_compliant_but_for_accuracy,
    assert_same_run,
    composed,
    config_error,
    mllog_events,
    record_margin,
    run_train,
    run_trains,
    straight_run,
    train_env,
)
from tests.forked import stopped_forked

TPU = ("device=tpu_v4", "device.chips=4")  # a v4-8: 4 replicas, one per megacore chip
# 96 training images at 32 px in batches of 32 (8 a replica): an epoch of 3 steps that never reaches the target,
# in device time, the host calling the slice every 2 steps: a call of 2 steps, then one of the epoch's last
DEVICE_TIME = (
    "experiment=smoke",
    "data.image_size=32",
    "data.eval_resize=36",
    "data.synthetic.train_per_class=24",
    "data.synthetic.val_per_class=8",
    "data.global_batch=32",
    "optim.warmup_epochs=0",
    *ALL_EPOCHS,
    *TPU,
    "run.max_epochs=1",
    "device.steps_per_call=2",
    "mlperf.clock=device",
)
STRAIGHT = straight_run("test_tpu_sim device time", *DEVICE_TIME)


@pytest.fixture(scope="module")
def straight(straight_runs) -> StraightRun:
    """DEVICE_TIME run once, never stopped."""
    run = straight_runs[STRAIGHT]
    assert run.status == 0, f"train.py failed ({run.status}):\n{run.stdout}\n{run.stderr}"
    return run


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ).double()


def sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_batchnorm_over_a_group_of_replicas_is_batchnorm_over_the_groups_images():
    """4 replicas in BatchNorm groups of 2 against the host's BatchNorm over each group's images: a native step of 2
    micro-batches, the first the images replicas 0 and 1 take (samples 0, 4, ... and 1, 5, ...), the second those
    of replicas 2 and 3. The weights come out the same, bit for bit."""
    step = StepSettings(label_smoothing=0.1)
    tpu_model, native_model = net(), net()
    tpu = TpuSimBackend(tpu_model, sgd(tpu_model), torch.device("cpu"), step, replicas=4, bn_group=2)
    native = NativeBackend(native_model, sgd(native_model), torch.device("cpu"), StepSettings(0.1, grad_accum=2))
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        images, labels = (
            torch.randn(16, 3, 6, 6, generator=g, dtype=torch.float64),
            torch.randint(5, (16,), generator=g),
        )
        tpu.train_step(images, labels, lr=0.1)
        native.train_step(torch.cat([images[r::4] for r in range(4)]), torch.cat([labels[r::4] for r in range(4)]), 0.1)
    for (name, ours), theirs in zip(tpu_model.named_parameters(), native_model.parameters(), strict=True):
        assert torch.equal(ours, theirs), name


def tiny_backend(clock: DeviceClock) -> TpuSimBackend:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    step = StepSettings(label_smoothing=0.0)
    return TpuSimBackend(
        model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"), step, replicas=2, clock=clock
    )


def test_the_clock_moves_by_whole_host_calls_which_end_after_their_steps_or_at_the_epochs_end():
    images, labels = torch.randn(16, 2, 2, 3), torch.randint(3, (16,))
    backend = tiny_backend(DeviceClock(step_s=0.5, eval_image_s=0.01, images=16, steps_per_call=3, call_s=0.25))
    start = backend.now()
    for taken, shown in [(1, 0.0), (2, 0.0), (3, 1.75), (4, 1.75)]:
        backend.train_step(images, labels, lr=0.1)
        assert backend.now() - start == pytest.approx(shown), f"after step {taken}"
    backend.end_epoch()  # the epoch's end ends the call of its last step
    assert backend.now() - start == pytest.approx(1.75 + 0.5 + 0.25)
    assert backend.steps_per_call == 3 and backend.simulated_clock.img_s == 32

    resumed = tiny_backend(DeviceClock(step_s=0.5, eval_image_s=0.01, steps_per_call=3, call_s=0.25))
    resumed.load_state_dict(backend.state_dict())
    assert resumed.now() == backend.now()

    whole_epoch = tiny_backend(DeviceClock(step_s=0.5, eval_image_s=0.01, steps_per_call=None, call_s=0.25))
    start = whole_epoch.now()
    for _ in range(5):
        whole_epoch.train_step(images, labels, lr=0.1)
    assert whole_epoch.now() == start and whole_epoch.steps_per_call is None
    whole_epoch.end_call()  # the loop's end of the call, at the epoch's last step
    assert whole_epoch.now() - start == pytest.approx(5 * 0.5 + 0.25)


def test_backends_that_run_their_steps_here_call_every_step():
    model = net()
    step = StepSettings(label_smoothing=0.0)
    assert NativeBackend(model, sgd(model), torch.device("cpu"), step).steps_per_call == 1
    assert IpuSimBackend(model, sgd(model), torch.device("cpu"), step, replicas=2).steps_per_call == 1


def test_a_tpu_computes_fp32_as_bf16_and_refuses_fp16():
    facts = {
        precision: build.run_facts(cfg, Topology(), batch_shape(cfg, 1)).policy
        for precision in ("fp32", "bf16", "bf16.16")
        for cfg in [composed("experiment=smoke", *TPU, "data.global_batch=32", f"precision={precision}")]
    }
    assert (facts["fp32"].name, facts["fp32"].compute, facts["fp32"].master) == ("bf16", "bf16", "fp32")
    assert facts["fp32"] == facts["bf16"]
    assert (facts["bf16.16"].compute, facts["bf16.16"].master) == ("bf16", "bf16")
    with pytest.raises(ConfigError) as refused:  # by the config's check, before anything runs
        composed("experiment=smoke", *TPU, "data.global_batch=32", "precision=fp16.32")
    assert refused.value.key == "precision" and "not fp16" in str(refused.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            (),  # the smoke task's 16 images
            "data.global_batch: 16 images give each of the 4 replicas 4, not a multiple of 8 as a TPU takes them;"
            " the nearest that fits is data.global_batch=32 (8 per replica)",
        ),
        (("device.chips=5",), "device.chips: TPU v4 offers no slice of 5 chips; the nearest is 4 (v4-8)"),
        (("device.chips=5000",), "device.chips: 5000 chips exceed the largest TPU v4 slice, 4,096 chips (v4-8192)"),
    ],
    ids=["batch per replica", "chips not offered", "more chips than the largest"],
)
def test_a_layout_a_tpu_slice_does_not_take_is_refused_naming_what_would_fit(overrides, message):
    assert config_error("experiment=smoke", *TPU, *overrides) == message


def test_train_py_refuses_a_batch_per_replica_and_fp16_in_one_line_with_exit_status_2(cache_dir, tmp_path):
    batch, fp16 = run_trains(
        [
            ("experiment=smoke", *TPU, f"hydra.run.dir={tmp_path / 'batch'}"),
            (
                "experiment=smoke",
                *TPU,
                "data.global_batch=32",
                "precision=fp16.16",
                f"hydra.run.dir={tmp_path / 'fp16'}",
            ),
        ],
        cache_dir,
        at_once=2,
    )
    assert batch.returncode == 2 and batch.stderr.startswith("error: data.global_batch: 16 images give each")
    assert "the nearest that fits is data.global_batch=32" in batch.stderr and batch.stderr.count("\n") == 1
    assert fp16.returncode == 2 and fp16.stderr == (
        "error: precision: a TPU computes in bf16, not fp16 (precision=fp16.16): use precision=bf16 or bf16.16\n"
    )
    assert not (tmp_path / "batch").exists() and not (tmp_path / "fp16").exists()


def test_each_replicas_memory_plan_holds_its_share_of_the_chip_and_one_that_does_not_fit_is_refused():
    """At 32 px: the largest batch per replica that fits a v4 megacore chip's 32 GiB, refused at 8 more, naming it;
    a v3 replica is a TensorCore, with half of its chip's HBM."""
    cfg, profile = probed()
    policy = build.run_facts(cfg, Topology(), batch_shape(cfg, 1)).policy
    plan = simulator.memory_plan(cfg, batch_shape(cfg, 1), profile, policy)
    assert plan.where == "a v4 megacore chip" and plan.limit == 32 * 2**30 and plan.fits
    assert plan.weights == profile.param_count * (4 + 2) and plan.gradients == profile.param_count * 4
    fits = plan.largest_micro_batch()
    over = composed("experiment=smoke", *TPU, f"data.global_batch={(fits + 8) * 4}")
    with pytest.raises(ConfigError) as refused:
        simulator.memory_plan(over, batch_shape(over, 1), profile, policy)
    assert refused.value.key == "data.global_batch"
    assert str(refused.value).startswith(f"data.global_batch: TPU out of memory: {fits + 8} images a replica (a v4")
    assert f"GiB over; at most {fits} fit, so data.global_batch={fits * 4} or less, or more device.chips" in str(
        refused.value
    )
    v3 = composed("experiment=smoke", "device=tpu_v3", "device.chips=4", "data.global_batch=64")
    halved = simulator.memory_plan(v3, batch_shape(v3, 1), profile, policy)
    assert halved.where == "a TensorCore of a v3 chip" and halved.limit == 16 * 2**30


@cache
def probed() -> tuple[Config, ModelProfile]:
    """DEVICE_TIME's config and its model as the simulator probes it."""
    cfg = composed(*DEVICE_TIME)
    return cfg, simulator.profile(cfg, simulator.build_model(cfg, 4))


def test_a_tiny_run_in_device_time_logs_each_host_call_and_its_log_passes_the_checker(straight, tmp_path):
    """The epoch's 3 steps are two host calls (2 steps, then the epoch's last): the log's block takes their steps
    and two calls' time on the simulated clock. The run says the replicas' memory and the precision it computes."""
    log = straight.run_dir / "mlperf.log"
    assert_compliant_but_for_accuracy(log, tmp_path)
    cfg, profile = probed()
    clock = simulator.clock(cfg, batch_shape(cfg, 1), profile)
    events = mllog_events(log)
    (start,), (stop,) = ([e["time_ms"] for e in events if e["key"] == key] for key in ("block_start", "block_stop"))
    assert abs(stop - start - 1000 * (3 * clock.step_s + 2 * clock.call_s)) <= 1  # two stamps, each to the ms
    platform = next(e["value"] for e in events if e["key"] == "submission_platform")
    assert platform == "v4-8 (4 TPU v4 chips) simulated by rn50perf (device time)"
    lines = straight.stdout.splitlines()  # a CPU without bf16 kernels adds a line saying it emulates them
    assert any(line.startswith("precision bf16: compute bf16") for line in lines)
    memory = next(line for line in lines if line.startswith("TPU memory of a replica (a v4 megacore chip): "))
    assert memory.endswith("GiB free")
    assert (
        "precision=fp32 on a TPU computes as precision=bf16: bf16 matmuls accumulated in fp32, fp32 master weights"
    ) in lines
    assert any(" img/s simulated  data wait" in line for line in lines)
    assert "of simulated time (mlperf.clock=device)\nsimulated v4-8 (4 TPU v4 chips): " in straight.stdout


def test_on_the_hosts_clock_a_runs_lines_show_the_slices_throughput_and_time_beside_the_hosts(tmp_path, capsys):
    """What train.py prints on the host's clock (the smoke run to the target shows it too): each epoch's img/s on
    the host, then the slice's; the summary's host time to train, then the slice's."""
    cfg, profile = probed()
    clock = simulator.clock(cfg, batch_shape(cfg, 1), profile)
    for _ in range(3):
        clock.step()
    clock.end_call()
    row = EpochMetrics(epoch=1, step=3, lr=0.2, train_loss=1.5, images_per_s=30.6, eval_accuracy=0.25, elapsed_s=5)
    assert f"   30.6 img/s host  {32 / clock.step_s:.1f} img/s simulated  data wait" in epoch_line(
        1, row, Simulated(clock, logged=False)
    )
    print_summary("aborted", 0.25, 1, 0.1, tmp_path, {}, set(), Simulated(clock, logged=False))
    took = 3 * clock.step_s + 2 * clock.call_s  # a call of 2 steps, and the epoch's last
    assert (
        f"time to train 0.10 min of host wall time\nsimulated v4-8 (4 TPU v4 chips): {32 / clock.step_s:,.0f} img/s,"
        f" time to train {took:.2f} s (mlperf.clock=device logs it)"
    ) in capsys.readouterr().out


def test_a_run_stopped_in_a_host_call_stops_at_its_end_and_resumes_to_the_same_run(straight, cache_dir, tmp_path):
    """SIGUSR1 as the loop starts: the run goes on to the end of the first call (2 steps), checkpoints there and
    stops; resumed, it ends with the weights, evaluations, losses and simulated time of the run never stopped."""
    run_dir = tmp_path / "run"
    log = run_dir / "mlperf.log"

    def loop_started() -> bool:
        return log.exists() and '"run_start"' in log.read_text()

    argv = (*DEVICE_TIME, f"hydra.run.dir={run_dir}")
    stopped = stopped_forked(argv, train_env(cache_dir), loop_started, signal.SIGUSR1)
    assert stopped.returncode == 128 + signal.SIGUSR1, stopped.stdout + stopped.stderr
    assert "stopped by SIGUSR1 at step 2 (epoch 1, 2 of its 3 steps done)" in stopped.stdout + stopped.stderr
    resumed = run_train(*DEVICE_TIME, f"hydra.run.dir={run_dir}", "run.resume=auto", cache=cache_dir, check=True)
    assert "resuming at epoch 1 (step 2, 2 steps into the epoch)" in resumed.stdout
    never_stopped = straight.run_dir
    assert_same_run(never_stopped, run_dir)

    def took_ms(run: Path) -> int:
        events = {e["key"]: e["time_ms"] for e in mllog_events(run / "mlperf.log")}
        return events["run_stop"] - events["run_start"]

    assert abs(took_ms(run_dir) - took_ms(never_stopped)) <= 1  # the simulated clock went on where it was


@pytest.mark.slow  # a minute; the tiny run in device time checks the log, the clocks and the stop
@pytest.mark.convergence
def test_the_smoke_task_trains_to_its_target_on_a_v4_8_and_prints_both_clocks(cache_dir, tmp_path):
    """The smoke task on a simulated TPU v4-8 at 8 images a replica, on the host's clock: each epoch's img/s on
    the host and on the slice, and both times to train."""
    overrides = ("experiment=smoke", *TPU, "data.global_batch=32", f"hydra.run.dir={tmp_path}")
    result = run_train(*overrides, cache=cache_dir, check=True).stdout
    record_margin("smoke lars, a simulated TPU v4-8 (4 replicas of 8)", tmp_path / "mlperf.log", max_epochs=10)
    assert "run_stop status success" in result
    assert " img/s host  " in result and " img/s simulated  data wait" in result
    assert " of host wall time\nsimulated v4-8 (4 TPU v4 chips): " in result
    assert_compliant(tmp_path / "mlperf.log")
