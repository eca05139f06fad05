"""The one-shot GPU check (bench/gpu): a failing stage never costs the others, the budget is kept, the fastest
settings are chosen from what was measured, the table says what the figures say; the new stages' logic (the
decoders, the variants, the trace) on the CPU at tiny sizes; and (slow) the rehearsal on the GPU machine's stack
runs every stage."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import photos
from bench.folders import claim
from bench.gpu import check, decode, env, pipeline, report, smoke, stage, trace
from bench.gpu import step as step_stage
from bench.gpu import train as gpu_train
from bench.gpu.check import Stage
from bench.gpu.step import SPEED_OPTIONS
from tests.conftest import composed
from tests.user_folder import files, plant

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20
HYBRID_ROWS = ["hybrid0.5/2", "hybrid0.8/2", "hybrid0.95/2"]  # the tiny loader's: every worker, three shares


def python_stage(name: str, code: str, cap_s: float = 30) -> Stage:
    """A stage running `code`, which may write its figures to WORK/<name>.json as bench stages do."""
    bench = check.bench_stage(name, cap_s, "unused")
    return Stage(
        name,
        cap_s,
        lambda args: [sys.executable, "-c", code, str(args.work / bench.result)],
        bench.result,
        bench.figures,
    )


@pytest.fixture
def no_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    monkeypatch.setattr(check, "setup", lambda: ({"decoder": "built"}, env))


def test_a_stage_that_fails_or_hangs_is_recorded_and_the_next_one_runs(tmp_path: Path, no_setup: None) -> None:
    stages = (
        python_stage("broken", "print('reading the GPU'); raise SystemExit('no kernel image for this GPU')"),
        python_stage("hangs", "import time; time.sleep(60)", cap_s=1),
        python_stage("fine", "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'img_s': 123.4}))"),
    )
    args = check.parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    claim(args.work, "--work")
    (args.work / "broken.json").write_text('{"img_s": 999.0}')  # an earlier check's figures
    results = check.check(args, stages)

    assert results["broken"]["status"] == "failed"
    assert "img_s" not in results["broken"]
    assert results["broken"]["error"].startswith("exit status 1: ")
    assert "reading the GPU | no kernel image for this GPU" in results["broken"]["error"]
    assert results["hangs"]["status"] == "failed"
    assert results["hangs"]["error"].startswith("timed out after 1 s")
    assert results["fine"] == {"img_s": 123.4, "status": "ok", "seconds": results["fine"]["seconds"]}
    written = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert written == json.loads(check.relative(json.dumps({"stages": results, "winners": {}})))
    assert list(written["stages"]) == ["setup", "broken", "hangs", "fine"]
    table = (tmp_path / "out" / "gpu.md").read_text()
    assert "| broken | failed |" in table and "no kernel image for this GPU" in table
    logs = sorted(path.name for path in (tmp_path / "out").glob("*.log"))
    assert logs == ["broken.log", "fine.log", "hangs.log"]


@pytest.mark.parametrize("option", ["--out", "--work"])
def test_the_check_refuses_a_folder_of_the_users_files(tmp_path: Path, option: str, capsys) -> None:
    mine = tmp_path / "mine"
    planted = plant(mine, "gpu.json", "smoke/notes.txt", "step.json")  # names the check writes and removes
    other = "--work" if option == "--out" else "--out"
    with pytest.raises(SystemExit) as refused:
        check.main([option, str(mine), other, str(tmp_path / "new")])
    error = capsys.readouterr().err
    assert refused.value.code == 2 and error == f"error: {option} {mine} holds files that no bench made; " + (
        "give a new or empty folder\n"
    )
    assert files(mine) == planted


def test_a_stage_removes_and_writes_only_in_a_folder_of_its_own(tmp_path: Path, capsys) -> None:
    """The smoke stage removes WORK/smoke before its run: a --work of the user's is refused first, and so is a
    --json that names a user's file outside a bench's folder."""
    work = tmp_path / "work"
    planted = plant(work, "smoke/IMG_0001.jpg")
    with pytest.raises(SystemExit) as refused:
        stage.main(smoke.run, ["--json", str(tmp_path / "smoke.json"), "--work", str(work)])
    assert refused.value.code == 2 and files(work) == planted
    figures = plant(tmp_path, "figures.json")
    with pytest.raises(SystemExit) as refused:
        stage.main(smoke.run, ["--json", str(tmp_path / "figures.json"), "--work", str(tmp_path / "new")])
    assert refused.value.code == 2 and "--json" in capsys.readouterr().err.splitlines()[-1]
    assert (tmp_path / "figures.json").read_bytes() == figures["figures.json"]


def test_the_records_name_no_folder_of_the_machine(tmp_path: Path, no_setup: None) -> None:
    failing = f"raise SystemExit('{REPO}/bench/gpu/step.py: no kernel image')"
    args = check.parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    check.check(args, (python_stage("step", failing),))
    for name in ("gpu.json", "gpu.md"):
        written = (tmp_path / "out" / name).read_text()
        assert "bench/gpu/step.py: no kernel image" in written and str(REPO) not in written, name


def test_stages_past_the_budget_are_skipped_with_the_reason(tmp_path: Path, no_setup: None) -> None:
    stages = (python_stage("first", "pass"), python_stage("second", "pass"))
    args = check.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--budget", "5"])
    results = check.check(args, stages)
    assert [results[name]["status"] for name in ("first", "second")] == ["skipped", "skipped"]
    assert results["first"]["reason"] == "the check's time budget ran out"


def test_only_the_stages_asked_for_run(tmp_path: Path, no_setup: None) -> None:
    stages = (python_stage("env", "pass"), python_stage("step", "pass"))
    args = check.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--stages", "step"])
    assert list(check.check(args, stages)) == ["setup", "step"]


def test_a_check_split_over_two_calls_reports_every_stage_of_both(tmp_path: Path, no_setup: None) -> None:
    """The second call (--stages) adds its stages to what the first recorded in the scratch folder, and its
    winners are drawn from both: the step's figures from the first call, the loader's from the second."""
    write_step = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'best': ['precision=bf16']}))"
    write_loader = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'img_s_by_workers': {'8': 9.0}}))"
    stages = (python_stage("step", write_step), python_stage("loader", write_loader))
    work = ["--work", str(tmp_path / "work")]
    check.check(check.parse_args(["--out", str(tmp_path / "first"), *work, "--stages", "step"]), stages)
    check.check(check.parse_args(["--out", str(tmp_path / "second"), *work, "--stages", "loader"]), stages)
    written = json.loads((tmp_path / "second" / "gpu.json").read_text())
    assert list(written["stages"]) == ["setup", "step", "loader"]
    assert written["winners"] == {"step": ["precision=bf16"], "loader": "8", "decode": "cpu", "decode_by_workers": {}}
    fresh = check.check(check.parse_args(["--out", str(tmp_path / "third"), *work]), stages)
    assert list(fresh) == ["setup", "step", "loader"] and fresh["step"]["status"] == "ok"  # a whole check anew


def test_an_unknown_stage_name_is_refused_naming_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        check.parse_args(["--stages", "step,stpe"])
    assert exit_.value.code == 2
    stages = "env, tests, smoke, decode, loader, train, step, trace, variants, e2e"
    assert f"no stage stpe; the stages are {stages}" in capsys.readouterr().err


def test_a_preset_runs_its_stages_in_the_checks_order(tmp_path: Path, no_setup: None) -> None:
    args = check.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--preset", "feed"])
    assert args.stages == ["env", "tests", "smoke", "decode", "loader", "train"]
    stages = tuple(python_stage(stage.name, "pass") for stage in check.STAGES)
    assert list(check.check(args, stages)) == ["setup", "env", "tests", "smoke", "decode", "loader", "train"]
    args = check.parse_args(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--preset", "step-variants"])
    joined = ["setup", "env", "tests", "smoke", "decode", "loader", "train", "trace", "variants"]
    assert list(check.check(args, stages)) == joined  # the second call adds to what the first recorded
    with pytest.raises(SystemExit):  # one or the other
        check.parse_args(["--preset", "feed", "--stages", "env"])


def test_a_setup_without_the_wheels_says_how_to_make_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "NEEDED", ("a_module_nobody_has",))
    monkeypatch.setattr(check, "CARRIED", tmp_path)
    args = check.parse_args(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--stages", "env"])
    results = check.check(args, ())
    assert results["setup"]["status"] == "failed"
    assert "a_module_nobody_has missing and no wheels" in results["setup"]["error"]
    assert "run make gpu-wheels" in results["setup"]["error"]


def test_the_cuda_tests_are_counted_from_pytests_report(tmp_path: Path) -> None:
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite tests="21" failures="1" errors="0" skipped="2"></testsuite></testsuites>'
    )
    assert check.junit_counts(tmp_path / "tests.xml") == {
        "tests": 21,
        "failures": 1,
        "errors": 0,
        "skipped": 2,
        "passed": 18,
    }
    command = check.cuda_tests(check.parse_args(["--work", str(tmp_path)]))
    assert command[-1] == "tests/test_cuda.py" and "cuda" in command


def write_figures(work: Path, rows: dict[str, float], workers: dict[str, float]) -> None:
    step = {"rows": {name: {"img_s": rate} for name, rate in rows.items()} | {"bare_compiled": "skipped: no compiler"}}
    (work / "step.json").write_text(json.dumps(step))
    (work / "loader.json").write_text(json.dumps({"img_s_by_workers": workers}))


def test_end_to_end_runs_with_the_fastest_settings_measured(tmp_path: Path) -> None:
    rows = {"fp32": 2600.0, "bf16": 2500.0, "fp16": 2400.0, "base": 2000.0}  # options measured in bf16
    rows |= {f"+{option}": 2100.0 for option in SPEED_OPTIONS}
    write_figures(tmp_path, rows, {"4": 1900.0, "8": 3700.0, "15": 5500.0})
    overrides = pipeline.fastest(tmp_path)
    assert overrides == [
        "precision=bf16",
        *(f"{option}=true" for option in SPEED_OPTIONS),
        "data.workers=15",
        "data.decode=cpu",
    ]

    rows |= {f"+{option}": 1900.0 for option in SPEED_OPTIONS}  # an option that slows the step stays off
    write_figures(tmp_path, rows, {"4": 1900.0, "gpu/4": 6000.0})  # the device decoding beats the workers
    options_off = [f"{option}=false" for option in SPEED_OPTIONS]
    assert pipeline.fastest(tmp_path)[1:] == [*options_off, "data.workers=4", "data.decode=gpu"]


def test_the_table_shows_each_row_against_the_bare_loop_and_the_loader_and_train_py_against_the_step() -> None:
    stages = {
        "env": {"status": "ok", "seconds": 5, "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"},
        "step": {
            "status": "ok",
            "seconds": 100,
            "batch": 256,
            "image": 224,
            "rows": {
                "bare": {"img_s": 4000.0, "peak_gib": 11.0},
                "best": {"img_s": 2000.0},
                "bare_compiled": "skip: x",
            },
        },
        "loader": {"status": "ok", "seconds": 40, "batch": 256, "image": 224, "img_s_by_workers": {"15": 5000.0}},
        "train": {
            "status": "ok",
            "runs": {"defaults": {"img_s": 1800.0, "log_train_img_s": 1750.0}, "decode=gpu": "failed: no nvJPEG"},
        },
        "e2e": {"status": "failed", "seconds": 3, "error": "exit status 1: CUDA error | out of memory"},
    }
    table = report.table(stages)
    assert "NVIDIA H100 80GB HBM3; torch 2.11.0+cu130" in table
    assert "| best | 2000.0 |  | 0.50x |" in table
    assert "| bare_compiled | skip: x |" in table
    assert "| 15 | 15 workers | 5000.0 | 2.50x |" in table
    assert "| defaults | 1800.0 | 1750.0 | 0.90x |  |" in table  # bare_compiled was skipped: no ratio
    assert "| decode=gpu | failed: no nvJPEG |" in table
    assert "| e2e | failed | 3 | exit status 1: CUDA error / out of memory |" in table


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the rehearsal's own budget: about 8 minutes on 2 cores, the step stage 5 of them
def test_the_rehearsal_runs_every_stage_on_the_gpu_machines_stack() -> None:
    """`make gpu-rehearse`: torch 2.11 and torchvision 0.26 under Python 3.12, the carried wheels installed by the
    check itself, every stage on the CPU at tiny sizes; and what a device call carries stays under its 64 MiB."""
    subprocess.run(["make", "gpu-rehearse"], cwd=REPO, check=True, timeout=3600)
    stages = json.loads((REPO / "build" / "gpu-rehearse" / "gpu.json").read_text())["stages"]
    assert list(stages) == ["setup", *(stage.name for stage in check.STAGES)]
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(stages, "ok")
    assert stages["env"]["torch"].startswith("2.11.0") and stages["env"]["torchvision"].startswith("0.26.0")
    assert stages["env"]["python"].startswith("3.12") and stages["env"]["physical_cores"] >= 1
    assert stages["step"]["peak_gib"].startswith("skipped: ")
    assert stages["tests"]["skipped_reason"].startswith("no CUDA device")
    assert stages["smoke"]["checker"] == "passed"
    assert set(stages["step"]["rows"]) >= {"bare", "bare_compiled", "base", "best", "defaults", "eager", "bare_again"}
    assert list(stages["variants"]["rows"]) in (["best", "best@8", pad, "best@6"] for pad in ("best+pad", "best-pad"))
    assert stages["decode"]["pixels"]["passed"] and stages["decode"]["gpu"].startswith("skipped: ")
    assert stages["decode"]["beside"]["decode_img_s_beside"] > 0
    assert stages["trace"]["trace"]["top"] and stages["trace"]["gpu"].startswith("skipped: ")
    assert list(stages["loader"]["img_s_by_workers"]) == ["1", "2", "gpu/1", "gpu/2", *HYBRID_ROWS]
    assert {name: run["run_status"] for name, run in stages["train"]["runs"].items()} == {
        "defaults": "aborted",  # mlperf.target_accuracy=1.0: every run trains its epochs
        "decode=cpu": "aborted",
    }
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    carried = sum(path.stat().st_size for path in (REPO / ".gpu").rglob("*") if path.is_file())
    tree = sum((REPO / name).stat().st_size for name in tracked.decode().split("\0") if (REPO / name).is_file())
    assert carried + tree < 64 * MiB


def test_the_time_to_train_is_projected_from_the_imagenet_recipe(tmp_path: Path) -> None:
    cfg = composed("experiment=imagenet", f"data.root={tmp_path}")
    evaluations = len({3, 7, 11, 15, 19, 23, 27, 31, 35, 38})  # first_eval 3, every 4, and the last epoch
    expected_s = 38 * 1_281_167 / 6000 + evaluations * 50_000 / (3 * 6000)
    assert pipeline.projected_minutes(cfg, img_s=6000) == pytest.approx(expected_s / 60)
    measured_eval_s = 38 * 1_281_167 / 6000 + evaluations * 50_000 / 12_000  # the step stage's eval rate
    assert pipeline.projected_minutes(cfg, img_s=6000, eval_img_s=12_000) == pytest.approx(measured_eval_s / 60)


def test_the_winners_say_which_options_beat_base_and_which_decode_path_was_faster() -> None:
    stages = {
        "step": {
            "rows": {"base": {"img_s": 2000.0}, "+device.compile": {"img_s": 5000.0}, "+device.foreach": "failed: x"},
            "best": ["precision=bf16", "device.compile=true", "device.foreach=false"],
        },
        "loader": {"img_s_by_workers": {"4": 1900.0, "8": 3700.0, "gpu/4": 3000.0, "gpu/8": 3500.0}},
        "train": {"runs": {"defaults": {"img_s": 3400.0}, "decode=gpu": {"img_s": 3300.0}, "workers=15": "failed"}},
    }
    assert report.winners(stages) == {
        "options_over_base": {"device.compile": 2.5, "device.foreach": None},
        "step": ["precision=bf16", "device.compile=true", "device.foreach=false"],
        "loader": "8",
        "decode": "cpu",
        "decode_by_workers": {"4": "gpu", "8": "cpu"},
        "train": "defaults",
    }


def test_the_train_stage_reads_the_rate_train_py_logged_for_each_epoch(tmp_path: Path) -> None:
    """The median epoch after the first (whose batches wait for the workers to start), from metrics.csv."""
    (tmp_path / "metrics.csv").write_text("epoch,images_per_s\n1,900.0\n2,5000.0\n3,5200.0\n4,4000.0\n")
    rates = gpu_train.epoch_rates(tmp_path / "metrics.csv")
    assert rates == [900.0, 5000.0, 5200.0, 4000.0]
    assert gpu_train.steady_rate(rates) == 5000.0
    assert gpu_train.steady_rate([900.0]) == 900.0  # a run of one epoch has only that one


def test_env_reads_the_hosts_cores_and_threads_from_cpuinfo() -> None:
    """Two sockets of two cores of two threads each: eight logical CPUs, four physical cores."""
    blocks = []
    for processor in range(8):
        socket, core = processor // 4, processor % 2
        blocks.append(
            f"processor\t: {processor}\nmodel name\t: AMD EPYC 9454 48-Core Processor\n"
            f"physical id\t: {socket}\ncore id\t\t: {core}\nflags\t\t: avx2: yes"
        )
    found = env.host_cpu("\n\n".join(blocks) + "\n")
    assert found["cpu"] == "AMD EPYC 9454 48-Core Processor"
    assert (found["physical_cores"], found["threads_per_core"]) == (4, 2.0)
    assert found["cpu_count"] == os.cpu_count() and found["loader_workers_all"] == stage.ALL_WORKERS
    arm = env.host_cpu("processor\t: 0\nBogoMIPS\t: 50.00\n")  # no model name, no core ids
    assert (arm["cpu"], arm["physical_cores"], arm["threads_per_core"]) == (None, None, None)


def test_a_failing_measurement_is_recorded_and_the_figures_are_saved_at_once(tmp_path: Path) -> None:
    figures: stage.Figures = {"rows": {}}
    path = tmp_path / "stage.json"
    stage.attempt("fine", lambda: {"img_s": 1.0}, figures, path, into=figures["rows"])
    assert json.loads(path.read_text()) == {"rows": {"fine": {"img_s": 1.0}}}
    stage.attempt("broken", lambda: 1 / 0, figures, path, into=figures["rows"])
    assert figures["rows"]["broken"] == "failed: ZeroDivisionError: division by zero"
    assert figures["failed"] == ["broken"] and json.loads(path.read_text()) == figures


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten photo-like JPEGs of 96 x 72 pixels, in the layout imagenet_like makes."""
    return photos.generate(tmp_path_factory.mktemp("photos"), images=10, classes=2, size=(96, 72), workers=1).root


def stage_args(tmp_path: Path, name: str) -> argparse.Namespace:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return argparse.Namespace(json=tmp_path / f"{name}.json", work=work, tiny=True)


def test_the_decode_stage_keeps_every_figure_when_one_measurement_fails(
    tmp_path: Path, small_photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode, "imagenet_like", lambda root, images: small_photos)
    monkeypatch.setattr(decode, "SECONDS", {True: 0.05})

    def beside(*args: object) -> stage.Figures:
        raise RuntimeError("no kernel image for this GPU")

    monkeypatch.setattr(decode, "beside", beside)
    args = stage_args(tmp_path, "decode")
    figures = decode.run(args, stage.TINY)
    assert figures["photos"] == 10 and figures["gpu"].startswith("skipped: nvJPEG")
    assert figures["cpu"]["img_s_per_core"] > 0
    assert figures["device"]["img_s"] > 0 and figures["device"]["device"] == "cpu"
    assert figures["beside"] == "failed: RuntimeError: no kernel image for this GPU"
    assert figures["failed"] == ["beside"]
    pixels = figures["pixels"]  # torchvision's CPU decode against the fused decoder, as the CPU test compares them
    assert pixels["images"] == 10 and pixels["passed"] and pixels["max_mean_abs_diff"] < decode.PIXEL_BOUND
    assert json.loads(args.json.read_text()) == figures


def test_decoded_pixels_pass_only_if_every_image_is_within_the_bound() -> None:
    assert decode.judged([1.0, 2.0, 3.0]) == {
        "images": 3,
        "max_mean_abs_diff": 3.0,
        "mean_mean_abs_diff": 2.0,
        "worst_image": 2,
        "bound": 6.0,
        "passed": True,
    }
    assert not decode.judged([1.0, 6.0, 0.5])["passed"]


def test_the_decode_batches_reuse_the_photos_to_fill_the_step_batch(small_photos: Path) -> None:
    found = decode.samples(small_photos, 10)
    assert len({sample.box for sample in found}) > 1  # each file its own crop, drawn from its header
    assert [len(batch) for batch in decode.batches(found, 4)] == [4, 4]
    assert [len(batch) for batch in decode.batches(found, 16)] == [16]  # fewer photos than a batch: reused
    assert decode.batches(found, 16)[0][10] is found[0]


def test_beside_the_step_a_thread_decodes_and_the_step_is_timed_both_ways(
    tmp_path: Path, small_photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step (here a stand-in that takes 2 ms) alone, then while the decoding thread runs; the thread is stopped
    after, and a thread that fails says so."""
    calls = []

    def harness(overrides: list[str], *rest: object) -> tuple[object, object]:
        calls.append(overrides)
        return (lambda: time.sleep(0.002)), None

    monkeypatch.setattr(step_stage, "harness", harness)
    monkeypatch.setattr(step_stage, "inputs", lambda sizes: (None, None))
    sizes = dataclasses.replace(stage.TINY, steps=10)
    work = decode.batches(decode.samples(small_photos, 10), 4)
    figures = decode.beside(stage_args(tmp_path, "decode"), sizes, work)
    assert calls == [list(step_stage.DEFAULTS)]  # no step stage measured here: the device's defaults
    assert figures["steps"] == 30 and figures["device"] == "cpu"
    assert figures["step_img_s_alone"] > 0 and figures["step_img_s_beside"] > 0 and figures["decode_img_s_beside"] > 0
    assert figures["slowdown"] == pytest.approx(figures["step_img_s_alone"] / figures["step_img_s_beside"], rel=0.01)

    broken = decode.samples(small_photos, 1)[0]
    broken.encoded = torch.zeros(64, dtype=torch.uint8)  # not a JPEG: the device's decoder refuses it
    with pytest.raises(RuntimeError, match="the decoding thread failed"):
        decode.beside(stage_args(tmp_path, "decode"), sizes, [[broken]])


def test_the_variants_are_the_best_step_at_larger_batches_and_padded(tmp_path: Path) -> None:
    best = ["precision=bf16", "device.compile=true", "device.pad_input_channels=false"]
    rows = step_stage.variant_rows(best, stage.FULL)
    assert list(rows) == ["best", "best@400", "best+pad", "best@384"]  # 400 (NVIDIA's) before the cap can cut
    assert {name: sizes.batch for name, (_, sizes) in rows.items()} == {
        "best": 256,
        "best@400": 400,
        "best+pad": 256,
        "best@384": 384,
    }
    assert rows["best@400"][0] == best
    assert rows["best+pad"][0] == ["precision=bf16", "device.compile=true", "device.pad_input_channels=true"]
    padded = [*best[:2], "device.pad_input_channels=true"]  # a best step that pads already: the row without
    assert step_stage.variant_rows(padded, stage.FULL)["best-pad"][0] == best
    assert step_stage.best_known(tmp_path) == step_stage.DEFAULTS  # no step stage ran on this machine
    (tmp_path / "step.json").write_text(json.dumps({"best": best}))
    assert step_stage.best_known(tmp_path) == best


def test_the_trace_counts_busy_time_once_and_ranks_the_kernels() -> None:
    """Two steps of 10 ms: a 4 ms kernel overlapping a 2 ms one on another stream (5 ms busy), then a 1 ms copy."""
    spans = []
    for step in range(2):
        at = step * 10_000
        spans += [
            trace.Span("sm90_xmma_fprop_implicit_gemm_bf16" + "x" * 200, at, at + 4000),
            trace.Span("triton_poi_fused_relu_1", at + 3000, at + 5000),
            trace.Span("Memcpy DtoD (Device -> Device)", at + 8000, at + 9000),
        ]
    assert trace.busy_us(spans) == 12_000
    found = trace.figures_of(spans, steps=2, wall_s=0.020, top=2)
    assert (found["wall_ms_per_step"], found["busy_ms_per_step"], found["idle_ms_per_step"]) == (10.0, 6.0, 4.0)
    assert found["busy_share"] == 0.6 and found["activities_per_step"] == 3.0
    assert [top["ms_per_step"] for top in found["top"]] == [4.0, 2.0] and found["top"][1]["share"] == 0.2
    assert len(found["top"][0]["name"]) == trace.NAME_CHARS


def test_the_loader_rows_cover_each_decode_path_and_read_back_as_overrides() -> None:
    sizes = dataclasses.replace(stage.FULL, workers=(4, 8, 31))  # a 32-core machine: every core but one
    keys = pipeline.loader_keys(sizes)
    assert keys == ["4", "8", "31", "gpu/4", "gpu/8", "gpu/31", "hybrid0.5/31", "hybrid0.8/31", "hybrid0.95/31"]
    assert pipeline.loader_overrides("hybrid0.8/31") == [
        "data.workers=31",
        "data.decode=hybrid",
        "data.device_share=0.8",
    ]
    assert pipeline.loader_overrides("gpu/8") == ["data.workers=8", "data.decode=gpu"]
    assert stage.FULL.workers[-1] == max(stage.FULL.workers) == stage.ALL_WORKERS  # 4, 8 and 15 on 16 cores


def test_end_to_end_takes_a_hybrid_winner_and_passes_over_a_failed_row(tmp_path: Path) -> None:
    write_figures(tmp_path, {"base": 2000.0}, {"15": 4900.0, "gpu/15": "failed: x", "hybrid0.8/15": 6100.0})
    assert pipeline.fastest(tmp_path)[-3:] == ["data.workers=15", "data.decode=hybrid", "data.device_share=0.8"]


def test_the_train_stage_keeps_what_data_decode_auto_chose() -> None:
    output = "run dir ...\n  data.decode=auto: hybrid, device_share 0.8 (gpu 5200 img/s, cpu 4100)\nepoch 1 ...\n"
    assert gpu_train.auto_line(output) == "data.decode=auto: hybrid, device_share 0.8 (gpu 5200 img/s, cpu 4100)"
    assert gpu_train.auto_line("epoch 1 ...\n") is None


NEW_STAGES: dict[str, stage.Figures] = {
    "decode": {
        "status": "ok",
        "image": 224,
        "photos": 1024,
        "cpu": {"img_s_per_core": 400.0},
        "device": {"img_s": 6000.0, "batch": 256, "device": "cuda"},
        "beside": {
            "step_img_s_alone": 7000.0,
            "step_img_s_beside": 5000.0,
            "slowdown": 1.4,
            "decode_img_s_beside": 3000.0,
            "steps": 90,
        },
        "pixels": {"images": 100, "max_mean_abs_diff": 2.5, "mean_mean_abs_diff": 1.2, "bound": 6.0, "passed": True},
    },
    "loader": {
        "status": "ok",
        "batch": 256,
        "image": 224,
        "img_s_by_workers": {"15": 5000.0, "gpu/15": 6000.0, "hybrid0.8/15": 7700.0, "hybrid0.95/15": "failed: x"},
    },
    "train": {
        "status": "ok",
        "runs": {
            "defaults": {"img_s": 6500.0, "log_train_img_s": 6400.0, "decode_auto": "data.decode=auto: hybrid 0.8"},
            "decode=cpu": {"img_s": 4800.0, "log_train_img_s": 4700.0, "decode_auto": None},
        },
    },
    "trace": {
        "status": "ok",
        "batch": 256,
        "overrides": "precision=bf16",
        "trace": {
            "steps": 5,
            "wall_ms_per_step": 37.0,
            "busy_ms_per_step": 35.0,
            "idle_ms_per_step": 2.0,
            "busy_share": 0.946,
            "activities_per_step": 900.0,
            "top": [{"name": "sm90_xmma_dgrad", "ms_per_step": 6.0, "share": 0.162}],
        },
    },
    "variants": {
        "status": "ok",
        "image": 224,
        "best": ["precision=bf16"],
        "rows": {
            "best": {"batch": 256, "img_s": 7000.0, "peak_gib": 10.8},
            "best@400": {"batch": 400, "img_s": 7350.0, "peak_gib": 16.5},
            "best+pad": {"batch": 256, "img_s": 6930.0, "peak_gib": 10.9},
            "best@384": "failed: timed out",
        },
    },
}


def test_the_table_and_winners_show_the_decoders_the_hybrid_rows_the_variants_and_the_trace() -> None:
    table = report.table(NEW_STAGES)
    assert "| the fused decoder (data.jpeg.decode_crop), one core | 400.0 img/s |" in table
    assert "| decode_crops on the cuda alone, batches of 256 | 6000.0 img/s, as many as 15.0 cores |" in table
    assert "| the best step, decode_crops running beside it | 5000.0 img/s: 1.4x slower |" in table
    assert "(100 images) | max 2.5, mean 1.2: passed (under 6.0) |" in table
    # the loader against the best step, here the variants' best row (no step stage ran)
    assert "| hybrid0.8/15 | the GPU 0.8 of each batch, 15 workers the rest | 7700.0 | 1.10x |" in table
    assert "| hybrid0.95/15 | the GPU 0.95 of each batch, 15 workers the rest | failed: x |  |" in table
    assert "| best@400 | 400 | 7350.0 | 16.5 | 1.050x |" in table
    assert "| best@384 | | failed: timed out | | |" in table
    assert "wall 37.0 ms, device busy 35.0 ms (0.946 of the wall time), idle 2.0 ms" in table
    assert "| sm90_xmma_dgrad | 6.0 | 0.162 |" in table
    assert "defaults: data.decode=auto chose, as train.py said: `data.decode=auto: hybrid 0.8`" in table
    assert "decode=cpu: data.decode=auto chose" not in table
    assert report.winners(NEW_STAGES) == {
        "batch": 400,
        "pad_input_channels": {"over_best": 0.99, "won": False},
        "loader": "hybrid0.8/15",
        "decode": "hybrid0.8",
        "decode_by_workers": {"15": "hybrid0.8"},
        "decode_auto": "data.decode=auto: hybrid 0.8",
        "train": "defaults",
    }
    rows = NEW_STAGES["variants"]["rows"]
    padded = {"best": rows["best"], "best-pad": {"batch": 256, "img_s": 6930.0}}  # a best step that pads already
    winners = report.winners({"variants": {"rows": padded}})
    assert winners == {"pad_input_channels": {"over_unpadded": 1.01, "won": True}}
    faster_padded = rows | {"best+pad": {"batch": 256, "img_s": 7500.0}}  # the batch is judged on the best settings
    assert report.winners({"variants": {"rows": faster_padded}})["batch"] == 400
