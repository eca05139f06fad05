"""Sweeps: a real Optuna search through train.py (a missed target is a failed trial, not a fast one), and the SLURM
launcher config (the SLURM jobs themselves: tests/slurm)."""

from __future__ import annotations

import math
import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.plugins.launcher import Launcher
from hydra.utils import instantiate

from configs.schema import register
from tests.conftest import REPO, TINY_RUN, run_train, time_to_train_min

TINY = (*TINY_RUN, "run.max_epochs=1", "run.checkpoint=false")


@pytest.mark.slow  # 10 s; the sweep, its table and its exit status: the 2 x 2 grid (tests/test_summarize.py)
def test_an_optuna_sweep_minimises_time_to_train_and_fails_the_trials_that_miss_the_target(cache_dir, tmp_path):
    # Two trials, one per target: TPE's seed 3 draws 0.01 (reached in one epoch) and then 1.0 (missed).
    sweep = run_train(
        "-m",
        "hparams_search=ttt_optuna",
        *TINY,
        "mlperf=open",
        "mlperf.target_accuracy=choice(0.01,1.0)",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=3",
        f"hydra.sweep.dir={tmp_path}",
        cache=cache_dir,
        check=True,
    )
    outcomes = [time_to_train_min(tmp_path / str(trial)) for trial in range(2)]
    statuses = sorted(status for status, _ in outcomes)
    assert statuses == ["aborted", "success"], f"the seed no longer draws both targets: {outcomes}"
    output = sweep.stdout + sweep.stderr
    assert output.count("Failed experiment: Return value must be float-castable. Got 'None'.") == 1
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    best_minutes = next(minutes for status, minutes in outcomes if status == "success")
    assert math.isclose(results["best_value"], best_minutes, abs_tol=0.01)  # the log's time_ms are whole ms
    assert results["best_params"]["mlperf.target_accuracy"] == 0.01
    assert 1.0 <= results["best_params"]["optim.base_lr"] <= 16.0  # drawn from ttt_optuna's search space


@pytest.mark.slow
def test_an_optuna_sweep_whose_trials_all_miss_the_target_ends_with_a_message(cache_dir, tmp_path):
    sweep = run_train(
        "-m",
        "hparams_search=ttt_optuna",
        *TINY,
        "mlperf.target_accuracy=1.0",
        "hydra.sweeper.n_trials=1",
        f"hydra.sweep.dir={tmp_path}",
        cache=cache_dir,
    )
    assert sweep.returncode == 1
    assert (
        sweep.stderr.strip().splitlines()[-1]
        == "error: no trial of the sweep reached the target, so there is no best one"
    )
    assert "Traceback" not in sweep.stderr
    assert not (tmp_path / "optimization_results.yaml").exists()


def test_a_launcher_without_a_sweep_is_told_in_one_line(tmp_path):
    """Without -m, Hydra runs the job here and would ignore hydra/launcher=slurm."""
    result = run_train("hydra/launcher=slurm", f"hydra.run.dir={tmp_path / 'run'}", cache=tmp_path / "cache")
    assert result.returncode == 2
    assert (
        result.stderr == "error: hydra/launcher: slurm launches the jobs of a sweep: add -m (python train.py -m ...)\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs SLURM's sbatch (tests/slurm/local_cluster.sh can)")
def test_a_slurm_that_cannot_take_the_jobs_is_told_in_one_line(tmp_path):
    """The real sbatch on a machine with no cluster to reach (an empty slurm.conf, as a machine that SLURM was
    installed on but never configured): one line, with sbatch's last, in place of submitit's traceback and
    sbatch's own lines; the sweep's folder, with no job in it, goes."""
    (tmp_path / "slurm.conf").write_text("")
    overrides = ("-m", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    result = run_train(*overrides, cache=tmp_path / "cache", env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: hydra/launcher=slurm: sbatch could not submit the jobs: sbatch: fatal: ")
    assert not (tmp_path / "sweep").exists()


def test_the_slurm_launcher_config_composes_into_submitits_slurm_launcher():
    register()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        overrides = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "optim.base_lr=8"]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)  # resolves the target and every interpolation
    assert isinstance(launcher, Launcher)
    assert type(launcher).__module__ == "hydra_plugins.rn50perf_slurm"
    params = launcher.params
    assert params["partition"] == "gpu"
    assert params["tasks_per_node"] == params["gpus_per_node"]  # one rank per GPU (distributed/topology.py)
    assert params["gpus_per_task"] is None  # each task must see its node's GPUs to pick SLURM_LOCALID's
    assert params["submitit_folder"].endswith("/.submitit/%j")
    # The time-limit warning that train.py checkpoints on, at the delay the config sets; a job SLURM may requeue.
    assert params["additional_parameters"] == {"signal": f"USR1@{params['signal_delay_s']}", "requeue": True}
