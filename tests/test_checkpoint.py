"""A file that is not a checkpoint of this harness is refused in one line that says what to do, and kept."""

import os
from pathlib import Path

import pytest
import torch

import checkpoint
from checkpoint import CheckpointError
from checkpoint.checkpointer import Checkpointer
from configs.schema import RunConfig
from distributed.stop import Resume
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


# What the advice says: a run started again with a new hydra.run.dir (made with other modules' tiny runs:
# conftest.straight_runs).
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


def due_steps(every: int, steps_per_epoch: int, steps: int) -> list[int]:
    """The steps of a run at which a checkpoint saving every `every` steps is due within an epoch."""
    checkpoints = Checkpointer(Path("run"), True, {}, Resume([], {}), RunConfig(checkpoint_every_steps=every))
    positions = [
        checkpoint.Loop(step=step, epoch_step=(step - 1) % steps_per_epoch + 1) for step in range(1, steps + 1)
    ]
    return [loop.step for loop in positions if checkpoints.due_within_epoch(loop, steps_per_epoch)]


def test_a_checkpoint_is_due_every_few_steps_but_at_an_epochs_last_step_which_its_end_saves():
    assert due_steps(every=3, steps_per_epoch=5, steps=15) == [3, 6, 9, 12]  # 15 ends epoch 3
    assert due_steps(every=5, steps_per_epoch=5, steps=15) == []  # each falls on an epoch's end
    assert due_steps(every=0, steps_per_epoch=5, steps=15) == []  # run.checkpoint_every_steps=0: epoch ends only
