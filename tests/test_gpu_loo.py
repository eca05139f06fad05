"""The GPU model beyond the systems it is fitted to: each in-sample system projected by a fit on the other four
(leave-one-out), the half-widths that size every GPU projection's range, and the terms that grow past the in-sample
scale (the wait for the slowest GPU, an evaluation over thousands of GPUs, nodes whose GPUs meet over PCIe)."""

import dataclasses
import json
import math

import pytest

from projection.gpu import calibrate, cost
from projection.gpu.calibrate import IN_SAMPLE
from projection.gpu.cost import Layout
from projection.run import Schedule
from projection.uncertainty import interval, prediction_half_width


@pytest.fixture(scope="module")
def left_out():
    return calibrate.CALIBRATION.left_out


def test_every_in_sample_system_lies_in_the_range_a_fit_on_the_other_four_gives_it(left_out):
    assert [result.published for result in left_out] == list(IN_SAMPLE)
    for result in left_out:
        spread, published = calibrate.CALIBRATION.left_out_range(result), result.published
        low, high = spread.throughput_img_s
        assert low <= published.throughput_img_s <= high, published.system
        fastest, slowest = spread.time_to_train_min
        assert fastest <= published.time_to_train_min <= slowest, published.system


def test_a_systems_own_error_does_not_size_its_own_range(left_out):
    for result in left_out:
        rest = [other for other in left_out if other is not result]
        evidence = calibrate.CALIBRATION.left_out_range(result).evidence
        assert evidence is not None and result.published.system not in evidence.source
        assert evidence.throughput == pytest.approx(prediction_half_width([r.throughput_error_pct for r in rest]))
        assert evidence.time_to_train == pytest.approx(prediction_half_width([r.time_to_train_error_pct for r in rest]))


def test_each_system_left_out_is_projected_within_10_percent(left_out):
    for result in left_out:
        assert abs(result.throughput_error_pct) < 10, result.published.system
        assert abs(result.time_to_train_error_pct) < 10, result.published.system


def test_a_left_out_systems_projection_is_not_its_in_sample_one(left_out):
    """Its own figures shaped none of the constants that project it."""
    for result in left_out:
        own = calibrate.CALIBRATION.in_sample_interval(result.published)
        assert result.projection.throughput_img_s != pytest.approx(own.central.throughput_img_s, rel=1e-4)


def test_the_evidence_is_the_five_leave_one_out_errors_once_per_process(left_out):
    evidence = calibrate.CALIBRATION.evidence
    assert evidence is calibrate.CALIBRATION.evidence
    assert 0 < evidence.throughput < 0.1 and 0 < evidence.time_to_train < 0.1
    assert evidence.throughput == pytest.approx(prediction_half_width([r.throughput_error_pct for r in left_out]))
    assert evidence.source == "leave-one-out over the five in-sample systems"


def test_the_calibration_prints_the_leave_one_out_table_and_carries_it_in_its_json(capsys):
    calibrate.main([])
    out = capsys.readouterr().out
    assert "leave-one-out: each system projected by the constants fitted to the other four" in out
    assert "half-widths holding 80 % of a new system's error" in out
    figures = json.loads(out.splitlines()[-1])["leave_one_out"]
    assert set(figures["systems"]) == {published.system for published in IN_SAMPLE}
    assert all(figures["systems"][system]["inside"] == [True, True] for system in figures["systems"])
    assert 0 < figures["half_widths"]["throughput"] < 0.1


def test_the_wait_for_the_slowest_gpu_grows_as_the_log_of_the_gpus():
    assert cost.slowest_of(1) == pytest.approx(0.0, abs=1e-12)
    assert cost.slowest_of(2) == pytest.approx(0.5)  # H(2) - 1
    assert cost.slowest_of(4096) == pytest.approx(math.log(4096) + 0.5772 - 1, abs=1e-3)
    constants = cost.Constants()
    waits = [cost.straggler_s(Layout(nodes, 8, 16), constants) for nodes in (1, 8, 64, 512)]
    assert waits == sorted(waits)
    assert waits[-1] - waits[-2] == pytest.approx(constants.step_jitter_s * math.log(8), rel=1e-3)  # 8 times the GPUs


def test_the_calibration_leaves_the_stragglers_size_to_its_range_which_widens_beyond_the_in_sample_scale():
    """Every corner refits the floor, so the in-sample 64 nodes barely move with step_jitter_s; 512 nodes of GPUs with
    16 images each move more."""
    fit = calibrate.CALIBRATION
    cluster = calibrate.load_cluster("dgx_h100")
    only = {"step_jitter_s": calibrate.ASSUMPTIONS["step_jitter_s"]}

    def relative_spread(layout: Layout) -> float:
        spread = interval(
            lambda c: cost.project(fit.profile, cluster, layout, c, Schedule(50)), fit.refit, fit.central, only
        )
        low, high = spread.throughput_img_s
        return (high - low) / spread.central.throughput_img_s

    assert relative_spread(Layout(512, 8, 16)) > 2 * relative_spread(Layout(64, 8, 40))


def test_an_evaluation_pads_each_gpus_shard_to_whole_batches():
    assert cost.eval_images_per_gpu(Layout(64, 8, 40), Schedule(50)) == 120  # 98 images: three batches of 40
    assert cost.eval_images_per_gpu(Layout(512, 8, 16), Schedule(50)) == 16  # 13 images: one batch of 16
    assert cost.eval_images_per_gpu(Layout(1, 8, 400), Schedule(35)) == 6400


def test_an_evaluations_reductions_are_latency_that_grows_with_the_nodes():
    constants, cluster = cost.Constants(), calibrate.load_cluster("pcie_l40s")  # no reduction in the switches
    times = [cost.reduction_s(cluster, Layout(nodes, 4, 16), constants) for nodes in (1, 16, 512)]
    assert times == sorted(times) and times[-1] < 1e-3
    slower_links = dataclasses.replace(constants, fabric_efficiency=0.5, pcie_efficiency=0.35)
    assert cost.reduction_s(cluster, Layout(16, 4, 16), slower_links) == times[1]  # no bandwidth term


def test_gpus_that_meet_over_pcie_reduce_at_the_pcie_efficiency_and_nvlink_nodes_do_not():
    fit = calibrate.CALIBRATION
    slower = dataclasses.replace(fit.central, pcie_efficiency=0.35)
    for device, moved in (("pcie_l40s", True), ("dgx_h100", False)):
        cluster = calibrate.load_cluster(device)
        layout = Layout(16, cluster.max_gpus_per_node, 16)
        times = [cost.allreduce_node_s(fit.profile, cluster, layout, c) for c in (fit.central, slower)]
        assert (times[1] > times[0]) == moved, device
