"""`make train` as a user runs it on a terminal, where Ctrl-C sends SIGINT to every process of the foreground
process group: make and the run alike. The run stops at a step boundary with its checkpoint and resume.sh; make
waits for it, then ends by SIGINT as well, so the shell's $? is the run's status, 130 (docs/running.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sysconfig
import time

from tests.conftest import ALL_EPOCHS, REPO, TINY_RUN, train_env

# The venv and the decoder this test runs with, taken as set up: make must not set them up again under a running
# test (the Makefile's own rules would, where the Makefile or the decoder's source is newer than they are).
SET_UP = ("-o", ".venv/.installed", "-o", f"data/jpeg/_jpeg{sysconfig.get_config_var('EXT_SUFFIX')}")


def top_level(env: dict[str, str]) -> dict[str, str]:
    """`env` without what an enclosing make passes down (`make test` runs this test), so that this make is the
    user's, at the top level: its lines are make's, not make[1]'s."""
    return {name: value for name, value in env.items() if name not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}


def test_ctrl_c_during_make_train_ends_make_by_sigint_after_the_run_checkpointed(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = " ".join((*TINY_RUN, "run.max_epochs=2", *ALL_EPOCHS, f"hydra.run.dir={run_dir}"))
    output = tmp_path / "make.out"
    # make keeps SIGINT ignored if it starts so (as GNU make does), and a shell's background job starts with it
    # ignored: make test run from a script with `&` would hand that on. A terminal's make starts without.
    inherited = signal.signal(signal.SIGINT, signal.SIG_DFL)
    with output.open("w") as sink:
        make = subprocess.Popen(
            ["make", *SET_UP, "train", f"ARGS={args}"], cwd=REPO, env=top_level(train_env(cache_dir)), stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    signal.signal(signal.SIGINT, inherited)
    try:
        log = run_dir / "mlperf.log"
        deadline = time.monotonic() + 300
        while not (log.exists() and "run_start" in log.read_text()):
            assert make.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
        os.killpg(make.pid, signal.SIGINT)  # the terminal's Ctrl-C
        make.wait(timeout=120)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    said = output.read_text()
    assert make.returncode == -signal.SIGINT, said  # ended by SIGINT, which a shell shows as 128 + 2 = 130
    assert "stopped by SIGINT at step 1 (epoch 1, 1 of its 4 steps done): checkpoint written" in said
    assert re.fullmatch(r"make: \*\*\* \[Makefile:\d+: train\] Error 130", said.splitlines()[-1]), said
    assert (run_dir / "checkpoint.pt").exists()
    assert f"hydra.run.dir={run_dir} run.resume=auto" in (run_dir / "resume.sh").read_text()
