"""What a run writes into its directory, as the README's table says: the job log, metrics.png of a stopped run,
no resume.sh once the run is over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.conftest import REPO, TINY_RUN, run_train, train_env

TWO_EPOCHS = (*TINY_RUN, "run.max_epochs=2", "mlperf.target_accuracy=1.0", "run.progress=lines")


def test_a_stopped_then_resumed_run_leaves_what_the_readme_lists(cache_dir, tmp_path):
    """SIGTERM in epoch 2 (after epoch 1's checkpoint), then a resume to the end: one run serves every check."""
    command = [sys.executable, "train.py", *TWO_EPOCHS, f"hydra.run.dir={tmp_path}"]
    process = subprocess.Popen(command, cwd=REPO, env=train_env(cache_dir), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "checkpoint.pt").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    stopped, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stopped
    assert (tmp_path / "metrics.png").stat().st_size > 0  # from epoch 1, the one ended before the stop
    assert (tmp_path / "resume.sh").exists()

    resumed = run_train(*TWO_EPOCHS, f"hydra.run.dir={tmp_path}", "run.resume=auto", cache=cache_dir, check=True)
    assert not (tmp_path / "resume.sh").exists() and not (tmp_path / "checkpoint.pt").exists()
    job_log = (tmp_path / "train.log").read_text()
    shown = [line for line in (stopped + resumed.stdout).splitlines() if line.startswith(("dataset:", "epoch "))]
    assert shown[0].startswith("dataset: torchvision layout at ")  # the synthetic set is in torchvision's layout
    assert len(shown) == 4  # each attempt's dataset line, and the two epochs' lines
    for line in [*shown, "run_stop status aborted: 2 epochs", "resuming at epoch 2"]:
        assert line in job_log, line
