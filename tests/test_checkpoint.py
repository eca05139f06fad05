"""A file that is not a checkpoint of this harness is refused in one line that says what to do, and kept."""

import os

import pytest
import torch

import checkpoint
from checkpoint import CheckpointError
from tests.conftest import ALL_EPOCHS, TINY_RUN, run_train, straight_run

ADVICE = (
    "is damaged or not a checkpoint of this harness: the run cannot continue; start it again with a new hydra.run.dir"
)


@pytest.mark.parametrize(
    "write",
    [
        lambda path: path.write_bytes(os.urandom(5000)),  # noise
        lambda path: torch.save({"model": torch.zeros(2)}, path),  # another program's checkpoint
        lambda path: torch.save(torch.nn.Linear(2, 2), path),  # a whole module: weights_only refuses it
        lambda path: torch.save({"format": checkpoint.FORMAT, "model": {}}, path),  # our format's number alone
    ],
    ids=["noise", "foreign", "pickled-module", "format-only"],
)
def test_a_file_that_is_not_our_checkpoint_is_refused_with_what_to_do(write, tmp_path):
    path = tmp_path / "checkpoint.pt"
    write(path)
    with pytest.raises(CheckpointError) as refused:
        checkpoint.load(path, {})
    assert str(refused.value) == f"{path} {ADVICE}"


# What the advice says: a run started again with a new hydra.run.dir (made with other modules' tiny runs in one
# process: conftest.straight_runs).
STARTED_AGAIN = straight_run(
    "test_checkpoint started again", *TINY_RUN, "run.max_epochs=1", *ALL_EPOCHS, "run.resume=auto"
)


def test_train_py_refuses_a_garbage_checkpoint_in_one_line_with_exit_status_2(cache_dir, straight_runs, tmp_path):
    """In the directory of a stopped run, whose log and config it leaves as they were."""
    (tmp_path / "checkpoint.pt").write_bytes(os.urandom(5000))
    (tmp_path / "mlperf.log").write_text(':::MLLOG {"key": "run_stop"}\n')
    (tmp_path / "config.yaml").write_text("the stopped run's\n")
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}
    result = run_train(*TINY_RUN, "run.resume=auto", f"hydra.run.dir={tmp_path}", cache=cache_dir)
    assert result.returncode == 2, result.stderr
    (message,) = result.stderr.splitlines()  # one line: no traceback, no line of Hydra's
    assert message == f"error: {tmp_path / 'checkpoint.pt'} {ADVICE}"
    assert {path: path.read_bytes() for path in before} == before
    again = straight_runs[STARTED_AGAIN]
    assert again.status == 0, again.stderr  # the advice works: the run starts again there


def test_a_checkpoint_written_before_epoch_step_was_named_resumes_at_the_same_step_of_its_epoch():
    """Format 2's checkpoints of before 2026-11-30 named the steps taken in the epoch "batch"."""
    position = {"epoch": 3, "step": 17, "run_start": 12.5}
    older = checkpoint.Loop.saved({**position, "batch": 5}, [])
    assert older == checkpoint.Loop.saved({**position, "epoch_step": 5}, []) == checkpoint.Loop(3, 17, 12.5, 5)
