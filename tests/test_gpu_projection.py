"""run.mode=project on a GPU cluster: the calibration on NVIDIA's in-sample results, the mechanisms the model claims,
the epochs from MLPerf's reference convergence points, and the projection of a step measured on one GPU."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hydra.errors import HydraException

from configs.checks import ConfigError
from configs.errors import describe
from configs.schema import batch_shape
from project import project
from projection.calibration import fitted_ranges
from projection.families import answer
from projection.gpu import calibrate, cost
from projection.gpu.calibrate import IN_SAMPLE
from projection.gpu.cost import Layout
from projection.gpu.measured import read_check
from projection.run import Schedule
from tests.conftest import chosen_experiment, composed, run_train

DEVICES = ("dgx_a100", "dgx_h100", "dgx_h200", "pcie_l40s")


@pytest.fixture(scope="module")
def fitted():
    fit = calibrate.CALIBRATION
    return fit.profile, fit.clusters, fit.central, fit.refit


def step(fitted, device: str, layout: Layout) -> cost.StepTime:
    profile, _, central, _ = fitted
    return cost.step_time(profile, calibrate.load_cluster(device), layout, central)[0]


def test_every_in_sample_system_is_projected_within_3_percent_inside_its_range():
    for published in IN_SAMPLE:
        spread = calibrate.CALIBRATION.in_sample_interval(published)
        projection = spread.central
        assert projection.throughput_img_s == pytest.approx(published.throughput_img_s, rel=0.03), published.system
        assert projection.time_to_train_min == pytest.approx(published.time_to_train_min, rel=0.03), published.system
        low, high = spread.time_to_train_min
        assert low <= published.time_to_train_min <= high, published.system


def test_the_fitted_constants_are_physical_and_every_run_gpu_bound(fitted):
    _, _, central, refit = fitted
    assert 0 < central.compute_efficiency <= 1 and 0 < central.traffic_fraction <= 1
    assert 0 < central.step_floor_s < 0.01 and central.eval_image_factor > 0 and central.eval_overhead_s >= 0
    assert calibrate.CALIBRATION.device_bound(central)
    ranges = fitted_ranges(refit, central, calibrate.ASSUMPTIONS, calibrate.FITTED)
    low, high = ranges["compute_efficiency"]  # the assumptions the in-sample systems do not pin move the fit
    assert 0 < low < central.compute_efficiency < high <= 1


def test_default_constants_are_the_calibrated_ones(fitted):
    _, _, central, _ = fitted
    for name in [*calibrate.FITTED, "warmup_epochs"]:
        assert getattr(cost.Constants(), name) == pytest.approx(getattr(central, name), rel=1e-3), name


def test_a_smaller_batch_per_gpu_lowers_each_gpus_rate(fitted):
    rates = [batch / step(fitted, "dgx_h100", Layout(1, 8, batch)).total_s for batch in (400, 200, 100, 50)]
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.8 * rates[0]


def test_more_nodes_add_only_the_time_across_nodes(fitted):
    steps = [step(fitted, "dgx_a100", Layout(nodes, 8, 51)) for nodes in (1, 2, 4, 8)]
    for fewer, more in itertools.pairwise(steps):
        assert more.allreduce_fabric_s > fewer.allreduce_fabric_s
        assert (more.compute_s, more.allreduce_node_s, more.optimizer_s) == (
            fewer.compute_s,
            fewer.allreduce_node_s,
            fewer.optimizer_s,
        )
    assert steps[0].allreduce_fabric_s == 0


def test_switches_that_reduce_take_over_at_the_scale_nvidia_used_them(fitted):
    profile, _, central, _ = fitted
    cluster = calibrate.load_cluster("dgx_h100")
    algorithm = {nodes: cost.allreduce_fabric(profile, cluster, Layout(nodes, 8, 40), central)[0] for nodes in (8, 64)}
    assert algorithm[64] == "in-network" and algorithm[8] != "in-network"
    no_sharp = dataclasses.replace(cluster, in_network_reduction=False)
    assert cost.allreduce_fabric(profile, no_sharp, Layout(64, 8, 40), central)[0] != "in-network"


def test_an_evaluation_takes_less_time_on_more_gpus(fitted):
    profile, _, central, _ = fitted
    cluster = calibrate.load_cluster("dgx_h100")
    times = [cost.evaluation_s(profile, cluster, Layout(n, 8, 40), central, Schedule(35)) for n in (1, 8, 64)]
    assert times == sorted(times, reverse=True) and times[-1] < times[0] / 10


@pytest.mark.parametrize("device", DEVICES)
def test_every_gpu_cluster_projects_with_the_ipu_reports_keys(device):
    cfg = composed("run.mode=project", "experiment=imagenet", f"device={device}", "device.nodes=2")
    text = answer(cfg, batch_shape(cfg, 1), command_line=[])
    figures = json.loads(text.splitlines()[-1])
    keys = {"throughput_img_s", "throughput_img_s_range", "time_to_train_min", "time_to_train_min_range"}
    assert keys | {"epoch_s", "most_sensitive", "beyond_calibration"} <= figures.keys()
    low, high = figures["time_to_train_min_range"]
    assert low < figures["time_to_train_min"] < high  # the assumptions move every cluster's time to train
    assert bool(figures["beyond_calibration"]) == (device in ("dgx_h200", "pcie_l40s"))  # their GPUs are not fitted
    assert "as MLPerf's reference runs for global batch 3,264 (its RCP) in mlperf-logging" in text
    for term in ("all-reduce within each node", "all-reduce across nodes", "optimizer (LARS)", "host feed"):
        assert term in text


def test_the_command_line_projects_a_cluster_and_keeps_it(tmp_path, cache_dir):
    result = run_train(
        "run.mode=project",
        "experiment=imagenet",
        "device=dgx_h100",
        "device.nodes=8",
        "data.global_batch=3200",
        "run.max_epochs=35",
        f"hydra.run.dir={tmp_path}",
        cache=cache_dir,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "projection.json").read_text()) == figures
    assert "epochs: 35 (run.max_epochs); a real run stops at the first evaluation after it converges" in result.stdout
    assert figures["time_to_train_min"] == pytest.approx(2.664, rel=0.03)  # the in-sample dgxh100_n8
    assert figures["beyond_calibration"] == []


def gpu_json(path, img_s: float, batch: int = 256) -> str:
    figures = {"stages": {"env": {"gpu": "NVIDIA H100 80GB HBM3"}, "step": {"batch": batch, "rows": {}}}}
    figures["stages"]["step"]["rows"] = {"bare": {"img_s": 9e9}, "base": {"img_s": img_s / 2}, "best": {"img_s": img_s}}
    path.write_text(json.dumps(figures))
    return str(path)


def test_a_step_measured_on_one_gpu_sets_the_compute_of_every_gpu(fitted, tmp_path):
    profile, _, central, _ = fitted
    measured = read_check(gpu_json(tmp_path / "gpu.json", img_s=4000.0)).step
    assert measured.img_s == 4000.0 and measured.batch == 256  # the best row, not the peer's
    cluster = calibrate.load_cluster("dgx_h100")
    at_its_batch, _ = cost.step_time(profile, cluster, Layout(1, 1, 256), central, measured)
    assert at_its_batch.compute_s + at_its_batch.optimizer_s == pytest.approx(256 / 4000.0)
    slower = read_check(gpu_json(tmp_path / "slower.json", img_s=2000.0)).step
    on_nodes = [cost.step_time(profile, cluster, Layout(8, 8, 100), central, m)[0] for m in (measured, slower)]
    assert on_nodes[1].compute_s > on_nodes[0].compute_s
    assert on_nodes[1].allreduce_fabric_s == on_nodes[0].allreduce_fabric_s


def projected_lines(capsys, *command_line: str) -> list[str]:
    """What `train.py COMMAND_LINE` prints for a projection, in process."""
    cfg = composed(*command_line)
    project(cfg, batch_shape(cfg, 1), None, command_line, chosen_experiment(*command_line))
    return capsys.readouterr().out.splitlines()


def test_a_projection_of_the_embedded_set_names_it_and_says_it_is_not_imagenet(fitted, capsys):
    """train.py run.mode=project device=dgx_h200 device.nodes=4, with no experiment: the embedded set at batch 64."""
    lines = projected_lines(capsys, "run.mode=project", "device=dgx_h200", "device.nodes=4")
    assert lines[:2] == [
        "projecting the embedded synthetic set (1,000 training images), recipe experiment=embedded, global batch 64",
        "not ImageNet: an epoch here is the embedded set's 1,000 images, not ImageNet's 1,281,167; add"
        " experiment=imagenet to project ImageNet",
    ]
    assert lines[2].startswith("projected time to train (") and "five runs' olympic mean" in lines[2]
    assert any(
        "MLPerf's reference runs for global batch 64 (the smallest RCP's, batch 1,632)" in line for line in lines
    )
    named = {"dataset": "synthetic", "train_images": 1000, "experiment": "embedded", "global_batch": 64}
    assert named.items() <= json.loads(lines[-1]).items()


def h200_check(path, with_train_stage: bool) -> str:
    """A gpu.json as make gpu-check writes it: the H200's step (docs/gpu-check/2026-11-27-h200-f.json) and, where
    asked, train.py's run end to end (2026-11-27-h200-g.json's train stage)."""
    rows = {"bare_compiled": {"img_s": 6837.6}, "best": {"img_s": 6895.4}}
    stages = {"env": {"gpu": "NVIDIA H200"}, "step": {"batch": 256, "rows": rows}}
    if with_train_stage:
        runs = {"defaults": {"img_s": 3631.4}, "decode=gpu": {"img_s": 3680.8}}
        stages["train"] = {"status": "ok", "runs": runs}
    path.write_text(json.dumps({"stages": stages}))
    return str(path)


def test_a_measured_projection_names_imagenet_and_says_what_rn50perfs_own_loader_fed(fitted, tmp_path, capsys):
    measured = f"device.measured={h200_check(tmp_path / 'gpu.json', with_train_stage=True)}"
    lines = projected_lines(
        capsys, "run.mode=project", "experiment=imagenet", "device=dgx_h200", "device.nodes=8", measured
    )
    assert lines[0] == "projecting ImageNet (1,281,167 training images), recipe experiment=imagenet, global batch 3,264"
    assert (
        "input: the step alone: rn50perf's own loader fed 3,631 img/s (0.53x) on that machine (train.py with its"
        " defaults, the check's train stage); this projection assumes an input pipeline that keeps up"
    ) in lines
    figures = json.loads(lines[-1])
    assert figures["end_to_end_img_s"] == 3631.4 and figures["experiment"] == "imagenet"


def test_a_check_without_an_end_to_end_run_leaves_the_loaders_rate_unknown(fitted, tmp_path, capsys):
    measured = f"device.measured={h200_check(tmp_path / 'gpu.json', with_train_stage=False)}"
    lines = projected_lines(capsys, "run.mode=project", "experiment=imagenet", "device=dgx_h200", measured)
    assert (
        "input: the step alone: whether rn50perf's own loader fed that rate on that machine is unknown (the check"
        " holds no end-to-end run: its train stage absent, its e2e stage absent); this projection assumes an input"
        " pipeline that keeps up"
    ) in lines
    assert json.loads(lines[-1])["end_to_end_img_s"] is None


def test_the_end_to_end_rate_is_read_from_each_kind_of_check():
    """The H200 check the README projects from timed the step but its train stage failed; an older H100 check ran
    the e2e stage, the loader feeding the step at the fastest settings it found."""
    failed = read_check("docs/gpu-check/2026-11-27-h200-f.json").fed
    assert failed.img_s is None and failed.what.endswith("its train stage failed, its e2e stage skipped")
    older = read_check("docs/gpu-check/2026-11-26-h100-c.json").fed
    assert older.img_s == 1892.2 and older.what.startswith("the check's e2e stage: precision=fp32")


def test_a_file_that_holds_no_measured_step_is_refused(tmp_path):
    broken = tmp_path / "gpu.json"
    broken.write_text('{"stages": {}}')
    with pytest.raises(ConfigError, match=r"device\.measured"):
        read_check(str(broken))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("experiment=smoke", "device=dgx_h100", "data.global_batch=64"), "device"),  # nothing executes on it
        (
            ("run.mode=project", "experiment=imagenet", "device=pcie_l40s", "device.gpus_per_node=8"),
            "device.gpus_per_node",
        ),
        (("run.mode=project", "experiment=imagenet", "device=dgx_a100", "device.nodes=5"), "data.global_batch"),
    ],
)
def test_a_cluster_the_run_cannot_use_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError) as refused:
        composed(*overrides)
    assert refused.value.key == key


@pytest.mark.parametrize(
    "overrides",
    [
        ("device=cuda", "device.nodes=2"),  # torchrun and SLURM place real ranks
        ("run.mode=project", "experiment=mlperf_pod16", "device.measured=gpu.json"),
    ],
)
def test_a_cluster_key_on_another_device_is_refused_naming_the_family_that_has_it(overrides):
    with pytest.raises(HydraException) as refused:
        composed(*overrides)
    key = overrides[-1].split("=")[0]
    assert describe(refused.value) == (
        f"{key}: this device has no such key; gpu_cluster devices have it"
        " (a cluster: device=dgx_a100, dgx_h100, dgx_h200 or pcie_l40s)"
    )
