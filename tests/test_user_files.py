"""Nothing the project did not write is removed or overwritten: train.py pointed at a folder of a user's own images,
by every experiment, with and without data=imagenet, leaves every file in it as it was, byte for byte; a run
directory given by hand that holds a user's files is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import rundir
from tests import jpeg_samples
from tests.conftest import REPO, run_trains
from tests.user_folder import files, plant

EXPERIMENTS = sorted(path.stem for path in (REPO / "configs" / "experiment").glob("*.yaml"))
ENCODINGS = ("baseline-420", "progressive-420", "baseline-444")  # as cameras and editors save them
ONE_EPOCH = ("run.max_epochs=1", "optim.warmup_epochs=0")  # each recipe as it is, but for one epoch
SYNTHETIC = ("embedded", "smoke")  # the recipes on the synthetic set


def users_images(root: Path) -> dict[str, bytes]:
    """A user's photos of two classes in the README's layout (JPEG and PNG, odd sizes) and a note beside them;
    returns every file's bytes."""
    for split, per_class in (("train", 20), ("val", 4)):
        for label, name in enumerate(("cat", "dog")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                height, width = 48 + 7 * i % 30, 64 - 5 * i % 20
                if i % 4 == 3:
                    (folder / f"IMG_{i:04d}.png").write_bytes(jpeg_samples.png(height, width))
                else:
                    (folder / f"IMG_{i:04d}.jpg").write_bytes(
                        jpeg_samples.jpeg(ENCODINGS[i % 3], height, width + label)
                    )
    (root / "notes.txt").write_text("where each photo was taken\n")
    return files(root)


def users_run_dir(root: Path) -> dict[str, bytes]:
    """A folder of the user's own, given as hydra.run.dir, holding files named as a run's outputs; their bytes."""
    root.mkdir()
    return plant(root, rundir.CONFIG, rundir.FINAL_WEIGHTS)


@pytest.fixture(scope="module")
def runs(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every experiment, with and without data=imagenet, for one epoch on the user's folder of images; then a run
    into a run directory of the user's, and two runs refused before they start (into a new folder, and into a
    user's). The folders' bytes before, and each run's outcome by name."""
    scratch = tmp_path_factory.mktemp("user-files")
    images, own_dir, refused_new, refused_own = (scratch / name for name in ("mine", "work", "new", "notes"))
    images.mkdir()
    refused_own.mkdir()
    before = {
        "images": users_images(images),
        "run dir": users_run_dir(own_dir),
        "notes": plant(refused_own, "notes.txt", rundir.MLPERF_LOG),  # one a run writes too: an earlier run's
    }
    named = {
        f"{name} {'imagenet' if dataset else 'as recipe'}": [
            f"experiment={name}",
            *dataset,
            f"data.root={images}",
            *ONE_EPOCH,
            f"hydra.run.dir={scratch / name}{i}",
        ]
        for name in EXPERIMENTS
        for i, dataset in enumerate(([], ["data=imagenet"]))
    }
    named["own run dir"] = ["experiment=smoke", f"hydra.run.dir={own_dir}"]
    named["refused, new dir"] = ["experiment=smoke", "optim.base_lr=-1", f"hydra.run.dir={refused_new}"]
    named["refused, own dir"] = ["experiment=smoke", "optim.base_lr=-1", f"hydra.run.dir={refused_own}"]
    outcomes = dict(zip(named, run_trains(list(named.values()), cache_dir, at_once=2), strict=True))
    folders = {"images": images, "run dir": own_dir, "notes": refused_own, "new": refused_new}
    return {"before": before, "folders": folders, "runs": outcomes}


def test_every_experiment_on_a_folder_of_the_users_images_leaves_each_file_as_it_was(runs):
    assert files(runs["folders"]["images"]) == runs["before"]["images"]  # the same paths and bytes, none added


def test_the_synthetic_recipes_refuse_the_users_folder_in_one_line_naming_data_imagenet(runs):
    for name in SYNTHETIC:
        run = runs["runs"][f"{name} as recipe"]
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run
        assert "holds images of its own" in run.stderr and "give data=imagenet" in run.stderr, run


def test_your_own_images_train_with_the_documented_command(runs):
    """docs/data.md's "Your own images": experiment=smoke data=imagenet data.root=DIR trains (one epoch here, which
    ends short of the target: exit status 3, so that a script can tell it from a success)."""
    images, smoke = runs["folders"]["images"], runs["runs"]["smoke imagenet"]
    assert f"dataset: torchvision layout at {images}, 40 training images in 2 classes, 8 validation" in smoke.stdout
    assert "run_stop status aborted: 1 epochs" in smoke.stdout
    assert (smoke.returncode, smoke.stderr) == (
        3,
        "not converged: the run ended short of the target top-1 0.759 (exit status 3; "
        "run.allow_not_converged=true exits 0)\n",
    )


def test_a_batch_the_users_images_cannot_fill_is_refused_in_one_line_with_no_folder_left(runs):
    """The embedded recipe's batch of 64 to the IPU recipes' thousands, on 40 images: one line names the batch that
    fits, and the refused run leaves no folder (it used to leave its mlperf.log and config.yaml)."""
    imagenet = runs["runs"]["imagenet imagenet"]
    assert imagenet.stderr == (
        "error: data.global_batch: 3264 is more than the 40 training images: an epoch would have no step; "
        "give data.global_batch=32 (or fewer)\n"
    )
    for name in set(EXPERIMENTS) - {"smoke"}:
        for dataset in ("imagenet",) if name in SYNTHETIC else ("imagenet", "as recipe"):
            run = runs["runs"][f"{name} {dataset}"]
            assert run.returncode == 2 and "is more than the 40 training images" in run.stderr, run
            assert not Path(run.args[-1].removeprefix("hydra.run.dir=")).exists()


def test_a_run_directory_holding_a_users_files_is_refused_and_left_as_it_was(runs):
    run, own_dir = runs["runs"]["own run dir"], runs["folders"]["run dir"]
    assert run.returncode == 2
    assert run.stderr == (
        f"error: hydra.run.dir: {own_dir} already holds config.yaml, model.pt, which a run writes; "
        "give a new hydra.run.dir (nothing was changed)\n"
    )
    before, after = runs["before"]["run dir"], files(own_dir)
    assert {name: after[name] for name in before} == before
    assert set(after) <= {*before, *rundir.HYDRA_RECORD, rundir.JOB_LOG}  # Hydra's record of the job, as it starts


def test_a_run_refused_before_it_starts_removes_only_what_it_made(runs):
    assert runs["runs"]["refused, new dir"].returncode == runs["runs"]["refused, own dir"].returncode == 2
    assert not runs["folders"]["new"].exists()  # the folder Hydra made for it: gone
    after = files(runs["folders"]["notes"])
    assert {name: after[name] for name in runs["before"]["notes"]} == runs["before"]["notes"]
