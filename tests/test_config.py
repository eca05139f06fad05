"""A wrong value stops train.py before any work: exit status 2, one message naming the key, no traceback."""

import pytest

from configs.schema import Config, ConfigError, validate
from tests.conftest import run_train


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.base_lr=-1"], "optim.base_lr: must be a positive number"),
        (["optim.base_lr=abc"], "optim.base_lr"),
        (["optim.name=adam"], "optim.name: 'adam' is not one of lars, sgd"),
        (["optim=adam"], "Could not find 'optim/adam'"),
        (["data.global_batch=64", "dist.grad_accum=3"], "data.global_batch: 64 is not divisible"),
        (["data=imagenet", "data.root=/nonexistent/imagenet"], "data.root: directory /nonexistent/imagenet"),
        (["optim.weight_decay=3e-4"], "optim.weight_decay: closed division allows 0.0001 * 2^N"),
        (["optim.no_such_key=1"], "no_such_key"),
        (["mlperf.first_eval=5"], "mlperf.first_eval: must be in [1, mlperf.eval_every=1]"),
        (["data.synthetic.classes=300"], "data.synthetic.classes: must be in [2, 256], got 300"),
    ],
)
def test_bad_values_exit_2_with_a_message_naming_the_key(overrides, message, tmp_path):
    result = run_train(*overrides, f"hydra.run.dir={tmp_path}", cache=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_open_division_accepts_the_weight_decay_closed_refuses():
    cfg = Config()
    cfg.optim.weight_decay = 3e-4
    with pytest.raises(ConfigError, match=r"optim\.weight_decay"):
        validate(cfg)
    cfg.mlperf.division = "open"
    validate(cfg)


def test_sgd_closed_division_rules():
    cfg = Config()
    cfg.optim.name = "sgd"
    cfg.optim.base_lr = 0.2555
    with pytest.raises(ConfigError, match=r"multiple of 0\.001"):
        validate(cfg)
    cfg.optim.base_lr = 0.256
    validate(cfg)


def test_synthetic_root_that_is_not_a_dataset_is_refused_untouched(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    result = run_train(f"data.root={root}", f"hydra.run.dir={tmp_path / 'run'}", cache=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is not a synthetic dataset" in result.stderr and "Traceback" not in result.stderr
    assert (root / "notes.txt").read_text() == "keep me"


def test_synthetic_set_is_generated_into_a_new_root(tmp_path):
    cfg = Config()
    cfg.data.root = str(tmp_path / "not-yet-there")
    validate(cfg)
