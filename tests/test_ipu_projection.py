"""run.mode=project, the memory check at build, and the simulated device clock that MLPerf logs can carry."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest
import torch
from torch import nn

from backends.base import StepSettings
from backends.clock import DeviceClock
from configs.checks import ConfigError
from configs.schema import Config, batch_shape, validate
from mlperf_logs.logger import MLPerfLogger
from monitor.metrics import EpochMetrics
from monitor.progress import Simulated, epoch_line, print_summary
from project import project, subject
from projection.ipu import cost, report, simulator
from projection.ipu.assumptions import ASSUMPTIONS
from projection.ipu.backend import IpuSimBackend
from projection.ipu.calibrate import POD64
from projection.run import Schedule
from tests.conftest import assert_compliant, chosen_experiment, composed, mllog_events, record_margin, run_train
from tests.systems import system
from tests.user_folder import files

# ResNet-50 at 224 px, fp32, 8 images per micro-batch on one IPU: 1.2 GB without recomputation, 0.7 GB with it.
SMALL = ("data.image_size=32", "data.eval_resize=36")  # the probe at 32 px: a clock in a fraction of a second
OVERSUBSCRIBED = ("device=ipu_pod16", "data.image_size=224", "data.eval_resize=256", "data.global_batch=8")


def projected(*overrides: str, cache) -> tuple[str, dict]:
    result = run_train("run.mode=project", *overrides, cache=cache)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # tests/test_ipu_cost.py and test_ipu_memory.py check the model and the plan
def test_the_pod64_recipe_is_projected_within_10_percent_of_its_published_result(cache_dir):
    stdout, figures = projected("experiment=mlperf_pod64", cache=cache_dir)
    assert figures["throughput_img_s"] == pytest.approx(POD64.throughput_img_s, rel=0.10)
    assert figures["time_to_train_min"] == pytest.approx(POD64.time_to_train_min, rel=0.10)
    assert figures["epoch_s"] == pytest.approx(1_281_167 / figures["throughput_img_s"], rel=1e-3)
    assert figures["fits"] is True and len(figures["ipu_memory_mb"]) == 1 and figures["ipu_memory_mb"][0] < 900
    for line in (
        "IPU memory of one replica, MB (gc200)",
        "all-reduce within POD64s (IPU-Links)",
        "time to train (38 epochs)",
    ):
        assert line in stdout


# configs.yml of mlcommons/training_results_v2.0 (Graphcore/benchmarks/resnet/implementations/tensorflow):
# mk2_resnet50_mlperf_pod{16,64,128,256}_lars's micro-batch, accumulation, replicas, epochs and lr.
V2_0_RECIPES = {
    "mlperf_bow_pod16": ("bow_pod16", 22, 10, 16, 38, 10.72),
    "mlperf_bow_pod64": ("bow_pod64", 20, 4, 64, 40, 14.225),
    "mlperf_bow_pod128": ("bow_pod128", 20, 2, 128, 41, 12.1),
    "mlperf_bow_pod256": ("bow_pod256", 20, 2, 256, 45, 20.2),
}


def schedule_of(cfg: Config) -> Schedule:
    """The schedule run.mode=project gives the cost model (project.py)."""
    return Schedule(cfg.run.max_epochs, eval_every=cfg.mlperf.eval_every, first_eval=cfg.mlperf.first_eval)


@pytest.mark.parametrize("experiment", V2_0_RECIPES)
def test_each_v2_0_recipe_runs_on_its_bow_system_and_evaluates_where_v2_0s_train_py_checkpoints(experiment):
    """The experiment is configs.yml's recipe, on a system that runs v2.0's train.py; the harness's own evaluations
    fall after the epochs whose checkpoints that train.py writes, so no line says they moved."""
    cfg = composed(f"experiment={experiment}", "run.mode=project")
    name, micro_batch, grad_accum, replicas, epochs, lr = V2_0_RECIPES[experiment]
    shape = batch_shape(cfg, world_size=1)
    system = cfg.device.system
    assert system is not None and system.name == name and system.mlperf_round == "v2.0"
    assert (shape.micro_batch, shape.grad_accum, cfg.device.replicas) == (micro_batch, grad_accum, replicas)
    assert (cfg.run.max_epochs, cfg.optim.base_lr) == (epochs, lr)
    schedule = schedule_of(cfg)
    checkpointed = cost.checkpoint_schedule(system, schedule).eval_epochs()
    assert checkpointed == sorted(cfg.mlperf.eval_epochs(epochs)) and checkpointed[-1] == epochs
    assert checkpointed[0] == (epochs % 4 or 4)  # train.py: epochs % epochs_per_ckpt, 0 meaning the first at 4
    assert report.checkpoints_moved(system, schedule) == []


def test_a_v1_1_recipe_on_a_bow_system_is_told_where_its_checkpoints_moved():
    """v1.1's POD16 recipe (first_eval 2) run for 45 epochs on a Bow Pod256: v2.0's train.py checkpoints after
    epochs 1, 5, ..., 45, and the projection says so; the same on an IPU-POD256 keeps first_eval."""
    overrides = ("experiment=mlperf_pod16", "run.mode=project", "run.max_epochs=45")
    bow, ipu = (composed(*overrides, f"device={name}") for name in ("bow_pod256", "ipu_pod256"))
    assert bow.device.system is not None and ipu.device.system is not None
    (moved,) = report.checkpoints_moved(bow.device.system, schedule_of(bow))
    assert moved.startswith("checkpoints after epochs 1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, not from")
    assert "mlperf.first_eval=2: MLPerf v2.0's train.py counts them back from the last epoch" in moved
    assert report.checkpoints_moved(ipu.device.system, schedule_of(ipu)) == []


def test_a_pod256_recipe_is_projected_with_its_ranges_and_kept(tmp_path, capsys):
    command_line = ("run.mode=project", "experiment=mlperf_bow_pod256")
    cfg = composed(*command_line)
    project(cfg, batch_shape(cfg, 1), tmp_path, command_line, "mlperf_bow_pod256")
    stdout = capsys.readouterr().out
    figures = json.loads(stdout.strip().splitlines()[-1])
    assert (tmp_path / "projection.txt").read_text() == stdout  # the run directory keeps what was printed
    assert json.loads((tmp_path / "projection.json").read_text()) == figures
    low, high = figures["throughput_img_s_range"]
    assert low < figures["throughput_img_s"] < high
    first, last = figures["time_to_train_min_range"]
    assert first < figures["time_to_train_min"] < last
    assert figures["most_sensitive"] in ASSUMPTIONS
    assert "bow_pod256: 256 bow IPUs, 16 hosts, 2048 host cores" in stdout
    assert "all-reduce across POD64s (gateways)" in stdout
    assert "s (12 saved checkpoints, after training)" in stdout  # after epochs 1, 5, ..., 45
    assert any(
        reach.startswith("MLPerf v2.0's checkpoints (calibrated: v1.1)") for reach in figures["beyond_calibration"]
    )
    assert f"most sensitive to {figures['most_sensitive']} = " in stdout
    named_first, first, *_, named, _ = stdout.splitlines()
    assert named_first == (
        "projecting ImageNet (1,281,167 training images), recipe experiment=mlperf_bow_pod256, global batch 10,240"
    )
    answer = re.fullmatch(
        r"projected time to train \(45 epochs\): (\S+) min at \S+ img/s; 80 % of real results should land in (\S+) to"
        r" (\S+) min and .+ img/s",
        first,
    )
    assert answer, first  # the answer first, with its range
    expected = [figures["time_to_train_min"], *figures["time_to_train_min_range"]]
    assert [float(value) for value in answer.groups()] == pytest.approx(expected, abs=0.006)
    assert named == f"outputs: {tmp_path} (projection.txt: all of this; projection.json: the last line)"
    assert figures["dataset"] == "imagenet" and figures["train_images"] == 1_281_167
    assert (figures["experiment"], figures["global_batch"]) == ("mlperf_bow_pod256", 10_240)

    kept = files(tmp_path)  # a folder holding a projection's files, perhaps a user's: refused before any work
    with pytest.raises(ConfigError, match=r"already holds projection\.json, projection\.txt, which a projection"):
        project(cfg, batch_shape(cfg, 1), tmp_path, command_line, "mlperf_bow_pod256")
    assert files(tmp_path) == kept


@pytest.mark.parametrize(
    ("device", "recipe"),
    [("ipu_pod16", "mlperf_pod16"), ("bow_pod64", "mlperf_bow_pod64"), ("ipu_pod256", "mlperf_bow_pod256")],
)
def test_a_projection_of_the_embedded_set_says_which_recipe_projects_imagenet_on_the_system(device, recipe):
    """Graphcore's recipe for the system, or for one of its size (which keeps the device the command line names)."""
    command_line = ("run.mode=project", f"device={device}")
    said = subject(composed(*command_line), chosen_experiment(*command_line))
    assert said[0] == (
        "projecting the embedded synthetic set (1,000 training images), recipe experiment=embedded, global batch 64"
    )
    assert said[1].endswith(f"not ImageNet's 1,281,167; add experiment={recipe} to project ImageNet")
    assert composed(*command_line, f"experiment={recipe}").data.name == "imagenet"


@pytest.mark.slow  # tests/test_ipu_cost.py and test_ipu_memory.py check the model and the plan
def test_an_oversubscribed_plan_is_refused_with_the_table_and_recomputation_makes_it_fit(cache_dir, tmp_path):
    _, without = projected("experiment=smoke", *OVERSUBSCRIBED, cache=cache_dir)
    _, recomputed = projected("experiment=smoke", *OVERSUBSCRIBED, "device.recompute=auto", cache=cache_dir)
    assert without["fits"] is False and without["ipu_memory_mb"][0] > 900
    assert recomputed["fits"] is True and recomputed["ipu_memory_mb"][0] < 900

    result = run_train("experiment=smoke", *OVERSUBSCRIBED, f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 2
    assert "error: device: IPU out of memory" in result.stderr
    assert f"{without['ipu_memory_mb'][0]:.1f}" in result.stderr  # the table, with the total the plan predicted
    assert "try device.recompute=auto" in result.stderr


def tiny_backend(clock: DeviceClock) -> IpuSimBackend:
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))  # no BatchNorm: nothing to keep per replica group
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = StepSettings(label_smoothing=0.0)
    return IpuSimBackend(model, optimizer, torch.device("cpu"), step, replicas=2, clock=clock)


def test_the_device_clock_moves_by_the_cost_models_time_and_resumes_where_it_was():
    clock = DeviceClock(step_s=0.5, eval_image_s=0.01)
    backend = tiny_backend(clock)
    start = backend.now()
    images, labels = torch.randn(4, 2, 2, 3), torch.tensor([0, 1, 2, 0])
    for _ in range(3):
        backend.train_step(images, labels, lr=0.1)
    backend.eval_step(images, labels)
    assert backend.now() == pytest.approx(start + 3 * 0.5 + 4 * 0.01)

    resumed = tiny_backend(DeviceClock(step_s=0.5, eval_image_s=0.01))
    resumed.load_state_dict(backend.state_dict())
    assert resumed.now() == backend.now()
    assert resumed.simulated_clock is resumed.clock and resumed.clock.elapsed_s == pytest.approx(3 * 0.5 + 4 * 0.01)


def test_a_run_on_a_simulated_system_shows_its_throughput_and_time_to_train_beside_the_hosts(tmp_path, capsys):
    """The lines train.py prints on device=ipu_pod16 device.replicas=4: each epoch's and the summary, with the host's
    clock in the log (the default) and with the simulated one (mlperf.clock=device)."""
    cfg = composed("device=ipu_pod16", "device.replicas=4", "dist.bn_group_size=2", "data.global_batch=16", *SMALL)
    clock = simulator.clock(cfg, batch_shape(cfg, world_size=1), simulator.build_model(cfg, 10), announce=False)
    for _ in range(3):
        clock.step()
    clock.evaluate(500)
    rate, seconds = 16 / clock.step_s, 3 * clock.step_s + 500 * clock.eval_image_s
    row = EpochMetrics(epoch=1, step=3, lr=2.0, train_loss=2.1317, images_per_s=30.6, eval_accuracy=0.434, elapsed_s=5)
    start = "epoch   1/16  loss 2.1317  lr 2        "
    assert epoch_line(16, row, Simulated(clock, logged=False)) == (
        f"{start}   30.6 img/s host  {rate:.1f} img/s simulated  data wait   0%  eval top-1 0.4340"
    )
    logged = dataclasses.replace(row, images_per_s=rate)  # mlperf.clock=device: the log's rate is the system's
    assert epoch_line(16, logged, Simulated(clock, logged=True)) == (
        f"{start}{rate:7.1f} img/s simulated  data wait   0%  eval top-1 0.4340"
    )
    print_summary("success", 0.766, 6, 5.32, tmp_path, {}, set(), Simulated(clock, logged=False))
    print_summary("success", 0.766, 6, seconds / 60, tmp_path, {}, set(), Simulated(clock, logged=True))
    print_summary("success", 0.766, 6, 5.32, tmp_path, {}, set())  # a run here: as before
    simulated = f"simulated ipu_pod16 (4 gc200 IPUs): {rate:,.0f} img/s, time to train {seconds:.2f} s"
    assert capsys.readouterr().out.strip().split("\n\n") == [
        "run_stop status success: 6 epochs, eval top-1 0.7660, time to train 5.32 min of host wall time\n"
        f"{simulated} (mlperf.clock=device logs it)\noutputs: {tmp_path}",
        f"run_stop status success: 6 epochs, eval top-1 0.7660, time to train {seconds / 60:.2f} min of simulated"
        f" time (mlperf.clock=device)\n{simulated}\noutputs: {tmp_path}",
        f"run_stop status success: 6 epochs, eval top-1 0.7660, time to train 5.32 min\noutputs: {tmp_path}",
    ]


def test_the_mlperf_log_is_stamped_by_its_clock(tmp_path):
    log = MLPerfLogger(tmp_path / "mlperf.log", clock=lambda: 1234.5678)
    log.event("seed", 1)
    log.close()
    assert [event["time_ms"] for event in mllog_events(tmp_path / "mlperf.log")] == [1234568]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("mlperf.clock", "device", "device time is a simulated system's"), ("run.mode", "project", "project times")],
)
def test_device_time_and_projection_need_a_simulated_ipu(key, value, message):
    cfg = Config()
    section, name = key.split(".")
    setattr(getattr(cfg, section), name, value)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.slow
@pytest.mark.convergence
def test_the_smoke_task_trains_on_4_replicas_in_device_time_and_its_log_passes_the_checker(cache_dir, tmp_path):
    overrides = ("device.replicas=4", "dist.bn_group_size=2", "mlperf.clock=device", f"hydra.run.dir={tmp_path}")
    started = time.time()
    result = run_train("experiment=smoke", "device=ipu_pod16", *overrides, cache=cache_dir)
    wall_s = time.time() - started
    assert result.returncode == 0, result.stdout + result.stderr
    record_margin("smoke lars, 4 simulated IPU replicas", tmp_path / "mlperf.log", max_epochs=10)
    assert "run_stop status success" in result.stdout
    assert "img/s simulated  data wait" in result.stdout and "of simulated time (mlperf.clock=device)" in result.stdout
    assert "\nsimulated ipu_pod16 (4 gc200 IPUs): " in result.stdout
    assert_compliant(tmp_path / "mlperf.log")
    events = {e["key"]: e for e in mllog_events(tmp_path / "mlperf.log")}
    assert "simulated" in events["submission_platform"]["value"]
    assert 0 < events["run_stop"]["time_ms"] - events["run_start"]["time_ms"] < 1000 * wall_s / 10
    assert system("ipu_pod16").name in events["submission_platform"]["value"]
    assert events["model_bn_span"]["value"] == 16 // 4 * 2  # micro-batch 4, BatchNorm over 2 replicas


@pytest.mark.slow
@pytest.mark.convergence
def test_the_smoke_task_trains_cut_where_auto_chose_and_its_log_passes_the_checker(cache_dir, tmp_path):
    pipelined = ("device.replicas=2", "device.pipeline_splits=auto", "device.ipus_per_replica=2", "dist.grad_accum=2")
    result = run_train("experiment=smoke", "device=ipu_pod16", *pipelined, f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "device.pipeline_splits=auto cut 2 stages at: [" in result.stdout
    assert " img/s host  " in result.stdout and " img/s simulated  data wait" in result.stdout
    assert " of host wall time\nsimulated ipu_pod16 (4 gc200 IPUs): " in result.stdout
    record_margin("smoke lars, 2 simulated replicas of 2 auto-cut stages", tmp_path / "mlperf.log", max_epochs=10)
    assert "run_stop status success" in result.stdout
    assert_compliant(tmp_path / "mlperf.log")
