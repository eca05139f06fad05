"""The one-shot GPU check (bench/gpu): a failing stage never costs the others, the budget is kept, the fastest
settings are chosen from what was measured, the table says what the figures say; and (slow) the rehearsal on the
GPU machine's stack runs every stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.folders import claim
from bench.gpu import check, pipeline, report, smoke, stage
from bench.gpu import train as gpu_train
from bench.gpu.check import Stage
from bench.gpu.step import SPEED_OPTIONS
from tests.conftest import composed
from tests.user_folder import files, plant

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20


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
    assert written["winners"] == {"step": ["precision=bf16"], "loader": "8", "decode_by_workers": {}}
    fresh = check.check(check.parse_args(["--out", str(tmp_path / "third"), *work]), stages)
    assert list(fresh) == ["setup", "step", "loader"] and fresh["step"]["status"] == "ok"  # a whole check anew


def test_an_unknown_stage_name_is_refused_naming_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        check.parse_args(["--stages", "step,stpe"])
    assert exit_.value.code == 2
    assert "no stage stpe; the stages are env, tests, smoke, step, train, loader, e2e" in capsys.readouterr().err


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
    assert "| 15 | 5000.0 | 2.50x |" in table
    assert "| defaults | 1800.0 | 1750.0 | 0.90x |  |" in table  # bare_compiled was skipped: no ratio
    assert "| decode=gpu | failed: no nvJPEG |" in table
    assert "| e2e | failed | 3 | exit status 1: CUDA error / out of memory |" in table


@pytest.mark.slow
def test_the_rehearsal_runs_every_stage_on_the_gpu_machines_stack() -> None:
    """`make gpu-rehearse`: torch 2.11 and torchvision 0.26 under Python 3.12, the carried wheels installed by the
    check itself, every stage on the CPU at tiny sizes; and what a device call carries stays under its 64 MiB."""
    subprocess.run(["make", "gpu-rehearse"], cwd=REPO, check=True, timeout=3600)
    stages = json.loads((REPO / "build" / "gpu-rehearse" / "gpu.json").read_text())["stages"]
    assert list(stages) == ["setup", "env", "tests", "smoke", "step", "train", "loader", "e2e"]
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(stages, "ok")
    assert stages["env"]["torch"].startswith("2.11.0") and stages["env"]["torchvision"].startswith("0.26.0")
    assert stages["env"]["python"].startswith("3.12")
    assert stages["step"]["peak_gib"].startswith("skipped: ")
    assert stages["tests"]["skipped_reason"].startswith("no CUDA device")
    assert stages["smoke"]["checker"] == "passed"
    assert set(stages["step"]["rows"]) >= {"bare", "bare_compiled", "base", "best", "defaults", "eager", "bare_again"}
    assert {name: run["run_status"] for name, run in stages["train"]["runs"].items()} == {
        "defaults": "aborted",  # mlperf.target_accuracy=1.0: every run trains its epochs
        "decode=gpu": "aborted",
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
