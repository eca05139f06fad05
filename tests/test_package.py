"""`python -m mlperf_logs.package`: its refusals, the system description, the layout the package checker accepts,
and the RCP verdict in each case. One real tiny run (conftest.tiny_sweep's first, promoted to a success); the other
run directories are copies of it with the seed edited (in mlperf.log and config.yaml)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlperf_logging.system_desc_checker import system_desc_checker
from omegaconf import OmegaConf

from mlperf_logs import package, rcp
from tests.conftest import REPO, promoted
from tests.user_folder import files, plant

ORG, SYSTEM = "ACME", "cpu_box"


@pytest.fixture(scope="session")
def real_run(tiny_sweep: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiny run (the sweep's first), its log edited to reach the target: the packager judges logs, not how
    their accuracy came about."""
    directory = tmp_path_factory.mktemp("package") / "promoted"
    shutil.copytree(tiny_sweep / "0", directory, ignore=shutil.ignore_patterns("*.pt"))
    log = directory / "mlperf.log"
    log.write_text("".join(promoted(log.read_text().splitlines(keepends=True))))
    return directory


@pytest.fixture
def runs(real_run: Path, tmp_path: Path) -> list[Path]:
    """Five run directories with seeds 5, 1, 4, 2, 3 (in that order on the command line)."""
    return [copy_run(real_run, tmp_path / f"seed{seed}", seed) for seed in (5, 1, 4, 2, 3)]


def copy_run(run: Path, destination: Path, seed: int) -> Path:
    shutil.copytree(run, destination)
    edit_log(destination / "mlperf.log", "seed", seed)
    config = yaml.safe_load((destination / "config.yaml").read_text())
    config["run"]["seed"] = seed
    (destination / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return destination


def edit_log(log: Path, key: str, value: object) -> None:
    """Set the value of every `key` line of an MLPerf log (JSON after ':::MLLOG ')."""
    lines = []
    for line in log.read_text().splitlines():
        event = json.loads(line.split(":::MLLOG ", 1)[1])
        if event["key"] == key:
            line = ":::MLLOG " + json.dumps({**event, "value": value})
        lines.append(line)
    log.write_text("\n".join(lines) + "\n")


def drop_log_key(log: Path, key: str) -> None:
    lines = [line for line in log.read_text().splitlines() if f'"key": "{key}"' not in line]
    log.write_text("\n".join(lines) + "\n")


def package_main(runs: list[Path], out: Path, *extra: str) -> int:
    return package.main(["--runs", *map(str, runs), "--org", ORG, "--system", SYSTEM, "--out", str(out), *extra])


def assert_refused(capsys: pytest.CaptureFixture[str], code: int, *message: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    for part in message:
        assert part in err
    return err


def test_refuses_a_wrong_number_of_runs(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs[:4], out), "got 4 run directories", str(runs[0]), "exactly 5")
    assert not out.exists()


def test_refuses_duplicate_seeds(runs, tmp_path, capsys):
    edit_log(runs[1] / "mlperf.log", "seed", 5)
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs, out), f"{runs[1]}: seed 5 is also the seed of {runs[0]}")
    assert not out.exists()


def test_refuses_mixed_global_batch_sizes(runs, tmp_path, capsys):
    edit_log(runs[2] / "mlperf.log", "global_batch_size", 32)
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs, out), f"{runs[2]}: global batch size 32 differs from 8")
    assert not out.exists()


def test_refuses_a_log_without_run_stop(runs, tmp_path, capsys):
    drop_log_key(runs[3] / "mlperf.log", "run_stop")
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs, out), f"{runs[3]}: mlperf.log is incomplete: it has no run_stop")
    assert not out.exists()


def test_refuses_a_log_that_fails_the_compliance_checker(runs, tmp_path, capsys):
    edit_log(runs[4] / "mlperf.log", "lars_epsilon", 0.1)  # the ruleset requires 0.0
    out = tmp_path / "out"
    err = assert_refused(capsys, package_main(runs, out), f"{runs[4]}: mlperf.log fails the compliance checker")
    assert "lars_epsilon" in err
    assert not out.exists()


def test_refuses_a_run_directory_without_mlperf_log(runs, tmp_path, capsys):
    (runs[0] / "mlperf.log").unlink()
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs, out), f"{runs[0]}: no mlperf.log")
    assert not out.exists()


def test_a_run_is_read_from_the_log_its_config_names(real_run, tmp_path):
    """A run started with mlperf.log_file=named.log (its config.yaml records it): its log is that file, as
    mlperf_logs.summarize finds it too (rundir.mlperf_log)."""
    directory = tmp_path / "named"
    shutil.copytree(real_run, directory)
    (directory / "mlperf.log").rename(directory / "named.log")
    config = yaml.safe_load((directory / "config.yaml").read_text())
    config["mlperf"]["log_file"] = "named.log"
    (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert package.read_run(directory).log == directory / "named.log"


def test_refuses_to_overwrite_a_result(runs, tmp_path, capsys):
    results = tmp_path / "out" / ORG / "results" / SYSTEM / "resnet"
    results.mkdir(parents=True)
    (results / "result_0.txt").write_text("earlier\n")
    assert_refused(capsys, package_main(runs, tmp_path / "out"), f"{results} already exists")
    left = sorted(p.name for p in (tmp_path / "out").rglob("*"))
    assert left == sorted([ORG, "results", SYSTEM, "resnet", "result_0.txt"])
    assert (results / "result_0.txt").read_text() == "earlier\n"


def test_refuses_a_checks_folder_that_a_package_did_not_make(tmp_path, capsys):
    out = tmp_path / "out"
    planted = plant(out, "checks/summary.csv", "checks/package_checker.log", "checks/notes.txt")  # names ours too
    runs = [str(tmp_path / f"seed{seed}") for seed in range(5)]  # refused before they are read
    code = package.main(["--runs", *runs, "--org", ORG, "--system", SYSTEM, "--out", str(out)])
    assert_refused(capsys, code, f"{out / 'checks'} exists and was not made by a package")
    assert files(out) == planted and sorted(path.name for path in out.iterdir()) == ["checks"]
    (out / "checks" / package.CHECKS_MARK).touch()  # an earlier package's: its logs are rewritten
    assert package.checks_are_ours(out / "checks") and package.checks_are_ours(tmp_path / "empty")


def test_a_system_description_or_implementation_that_exists_is_kept_byte_for_byte(tmp_path):
    out = tmp_path / "out"
    implementation = f"{ORG}/benchmarks/resnet/implementations/pytorch"
    planted = plant(out, f"{ORG}/systems/{SYSTEM}.json", f"{implementation}/train.py")
    log = tmp_path / "run" / "mlperf.log"
    log.parent.mkdir()
    log.write_text(":::MLLOG {}\n")
    run = package.Run(log.parent, log, 1, 8, "closed", "onprem", {})
    kept = package.write_package(out, ORG, SYSTEM, "pytorch", [run], {"system_name": SYSTEM})
    assert kept == [out / ORG / "systems" / f"{SYSTEM}.json", out / implementation]
    written = files(out)
    assert (
        written.items() >= planted.items()
        and written[f"{ORG}/results/{SYSTEM}/resnet/result_0.txt"] == b":::MLLOG {}\n"
    )


def checker_required_fields(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> list[str]:
    """The fields mlperf_logging's system_desc_checker reports missing from an empty description."""
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with caplog.at_level(logging.ERROR):
        valid, *_ = system_desc_checker.check_system_desc(str(empty), "training", "4.0.0")
    assert not valid
    reasons = [reason for record in caplog.records for reason in record.args[1]]
    return [reason.removeprefix("Missing field ") for reason in reasons]


def test_system_description_holds_every_field_the_checker_requires(runs, tmp_path, caplog):
    required = checker_required_fields(caplog, tmp_path)
    assert len(required) == 33 and "accelerator_on-chip_memories" in required
    description = package.system_description(
        package.read_runs(runs), ORG, SYSTEM, {"cooling": "air", "host_storage_type": "NVMe"}
    )
    assert set(required) <= set(description)
    assert description["submitter"] == ORG and description["system_name"] == SYSTEM
    assert description["division"] == "closed" and description["status"] == "Available on-premise"
    assert description["framework"].startswith("PyTorch ") and description["accelerators_per_node"] == "0"
    assert description["cooling"] == "air" and description["host_storage_type"] == "NVMe"
    written = tmp_path / f"{SYSTEM}.json"
    written.write_text(json.dumps(description))
    assert system_desc_checker.check_system_desc(str(written), "training", "4.0.0")[0]


def test_simulated_ipus_and_the_cpu_are_described():
    """The device section as a resolved config.yaml holds it (OmegaConf writes 1.33e9 as a float)."""
    chip = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "device" / "chip" / "gc200.yaml"))
    system = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "device" / "ipu_pod16.yaml"))["system"]
    system["chip"] = chip
    simulated = package.accelerator_fields({"name": "ipu_sim", "system": system})
    assert simulated["accelerator_model_name"] == "simulated ipu_pod16 (gc200 IPU)"
    assert simulated["accelerators_per_node"] == "16" and simulated["number_of_nodes"] == "1"
    cpu = package.accelerator_fields({"name": "cpu"})
    assert cpu["accelerators_per_node"] == "0" and cpu["accelerator_model_name"] == "N/A"


def test_refuses_a_system_field_without_a_value(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(capsys, package_main(runs, out, "--system-field", "cooling"), "expected KEY=VALUE")
    assert not out.exists()


def test_a_good_set_of_five_is_packaged_and_judged(runs, tmp_path):
    out = tmp_path / "out"
    relative = [str(run.relative_to(tmp_path)) for run in runs]  # as `make submission` passes them
    command = [sys.executable, "-m", "mlperf_logs.package", "--runs", *relative, "--org", ORG]
    command += ["--system", SYSTEM, "--out", "out", "--system-field", "cooling=air"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    org = out / ORG
    results = org / "results" / SYSTEM / "resnet"
    assert sorted(p.name for p in results.iterdir()) == [f"result_{i}.txt" for i in range(5)]
    by_seed = sorted(runs, key=lambda run: int(run.name.removeprefix("seed")))
    for index, run in enumerate(by_seed):
        assert (results / f"result_{index}.txt").read_text() == (run / "mlperf.log").read_text()
    assert json.loads((org / "systems" / f"{SYSTEM}.json").read_text())["cooling"] == "air"
    implementation = org / "benchmarks" / "resnet" / "implementations" / "pytorch"
    for source in ("train.py", "README.md", "mlperf_logs/package.py", f"config_{SYSTEM}.yaml"):
        assert (implementation / source).is_file(), source
    assert not (implementation / ".venv").exists() and not (implementation / "outputs").exists()
    assert not list(out.glob(".package-*"))

    # The tiny task "converges" in one epoch at batch 8, far below the smallest RCP: the package checker's only
    # error is the RCP check, and its --rcp-bypass (for the submission committee to review) lets the package pass.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "package checker: FAILED" in result.stdout
    assert "ERROR - RCP Test Failed: Missing RCP, please submit RCP with BS = 8" in result.stdout
    assert sum(line.startswith("  ERROR - ") for line in result.stdout.splitlines()) == 1
    assert "result summarizer: score " in result.stdout
    assert "RCP checker: ERROR - Missing RCP, please submit RCP with BS = 8" in result.stdout
    assert "RCP verdict at global batch 8 (below smallest)" in result.stdout
    bypassed = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.package_checker", str(org), "training", "4.0.0", "--rcp-bypass"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert package.CHECKER_PASSED in bypassed.stdout + bypassed.stderr


def sizes() -> list[int]:
    return rcp.rcp_batch_sizes()


def test_rcp_exists_at_exactly_this_batch_size():
    batch = sizes()[1]
    mean = rcp.reference_for(batch).record["RCP Mean"]
    verdict = rcp.judge(batch, [mean + 1] * 5)
    assert verdict.reference.case == rcp.EXACT and verdict.passed and verdict.norm_factor == 1.0
    text = rcp.explain(verdict)
    assert f"An RCP exists at exactly global batch {batch}" in text
    assert "RCP verdict: PASS" in text and "Normalisation factor 1:" in text


def test_rcp_is_interpolated_between_two_rcp_batch_sizes():
    low, high = sizes()[:2]
    batch = (low + high) // 2
    reference = rcp.reference_for(batch)
    assert reference.case == rcp.INTERPOLATED and reference.between == (low, high)
    means = [rcp.reference_for(b).record["RCP Mean"] for b in (low, high)]
    assert min(means) <= reference.record["RCP Mean"] <= max(means)
    assert f"it lies between the RCPs at {low} and {high}" in rcp.explain(rcp.judge(batch, [40] * 5))


def test_below_the_smallest_rcp_batch_size_the_smallest_rcp_judges():
    smallest = sizes()[0]
    batch = smallest // 2
    fast = rcp.judge(batch, [4, 4, 5, 3, 4])
    assert fast.reference.case == rcp.BELOW_SMALLEST and fast.reference.record["BS"] == smallest
    assert not fast.passed
    text = rcp.explain(fast)
    assert f"below the smallest RCP batch size ({smallest})" in text
    assert f"'Missing RCP, please submit RCP with BS = {batch}'" in text
    assert "RCP verdict: FAIL" in text and "--rcp-bypass" in text and "not normalised" in text
    slow = rcp.judge(batch, [40] * 5)
    assert slow.passed and "RCP verdict: PASS" in rcp.explain(slow)


def test_faster_than_the_reference_within_its_spread_is_normalised():
    batch = sizes()[1]
    record = rcp.reference_for(batch).record
    epochs = (record["Min Epochs"] + record["RCP Mean"]) / 2
    verdict = rcp.judge(batch, [epochs] * 5)
    assert verdict.passed
    assert verdict.norm_factor == pytest.approx(record["RCP Mean"] / epochs)
    assert verdict.norm_factor > 1
    text = rcp.explain(verdict)
    assert f"= {verdict.norm_factor:.4f}" in text and "scaling.json" in text
    assert not rcp.judge(batch, [record["Min Epochs"] - 1] * 5).passed


def test_above_the_largest_rcp_batch_size_fails():
    batch = sizes()[-1] * 2
    verdict = rcp.judge(batch, [100] * 5)
    assert verdict.reference.case == rcp.ABOVE_LARGEST and not verdict.passed
    assert f"above the largest RCP batch size ({sizes()[-1]})" in rcp.explain(verdict)


def test_more_than_one_run_that_did_not_converge_fails():
    verdict = rcp.judge(sizes()[1], [36, 36, 36, rcp.NOT_CONVERGED, rcp.NOT_CONVERGED])
    assert not verdict.passed and "Insufficient convergence" in rcp.explain(verdict)
