"""A wrong value stops train.py before any work: exit status 2, one message naming the key, no traceback.

The messages are checked in process, through the calls train.py makes (Hydra's compose, the schema's validate,
configs.errors.describe); two runs of train.py check the line and the exit status, for a mistake Hydra finds while
composing and for one the schema finds."""

import dataclasses
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from configs.checks import ConfigError
from configs.fingerprint import UnmarkedField
from configs.schema import Config, training_fingerprint, validate
from data.config import DataConfig, SyntheticConfig
from data.sources.split import DatasetError
from data.sources.synthetic import CACHE_ENV
from optim.config import OptimConfig
from tests.conftest import REPO, composed, config_error, configured_dataset, run_train


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.base_lr=-1"], "optim.base_lr: must be a positive number"),
        (["optim.name=adam"], "optim.name: 'adam' is not one of lars, sgd"),
        (["optim=adam"], "optim=adam: no such option; optim is one of lars, sgd"),
        (
            ["data.global_batch=64", "dist.grad_accum=3"],
            "data.global_batch: 64 images do not deal evenly to 1 ranks x dist.grad_accum 3; the nearest that does is"
            " data.global_batch=63",
        ),
        (
            ["run.mode=project", "experiment=imagenet", "device=dgx_h100", "device.nodes=5"],
            "data.global_batch: 3264 images do not deal evenly to 40 GPUs x dist.grad_accum 1; the nearest that does"
            " is data.global_batch=3280",
        ),
        (["data=imagenet", "data.root=/nonexistent/imagenet"], "data.root: directory /nonexistent/imagenet"),
        (["optim.weight_decay=3e-4"], "optim.weight_decay: closed division allows 0.0001 * 2^N"),
        (["mlperf.first_eval=5"], "mlperf.first_eval: must be in [1, mlperf.eval_every=1]"),
        (["data.synthetic.classes=300"], "data.synthetic.classes: must be in [2, 256], got 300"),
        (["device=ipu_pod16", "device.compile=true"], "device.compile: a simulated IPU runs eager"),
        (["device=ipu_pod16", "device.cuda_graphs=true"], "device.cuda_graphs: a simulated IPU runs eager"),
        (["data.decode=nvjpeg"], "data.decode: 'nvjpeg' is not one of auto, cpu, gpu, hybrid"),
        (["data.device_share=1.5"], "data.device_share: must be in [0, 1], got 1.5"),
        (["data.workers=-1"], "data.workers: must be 0 or more, or null, got -1"),
        (["run.checkpoint=false", "run.checkpoint_every_steps=100"], "run.checkpoint_every_steps: needs run.check"),
    ],
)
def test_a_bad_value_is_told_in_one_line_naming_the_key(overrides, message):
    told = config_error(*overrides)
    assert told.startswith(message) and "\n" not in told


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.base_lrr=4"], "optim.base_lrr: no such key; did you mean optim.base_lr?"),
        (["data.synthetic.clases=3"], "data.synthetic.clases: no such key; did you mean data.synthetic.classes?"),
        (["run.global_batch=64"], "run.global_batch: no such key; did you mean data.global_batch?"),
        (["optm.base_lr=1"], "optm: no such key; did you mean optim?"),
        (["hydra.run.dirr=x"], "hydra.run.dirr: no such key; did you mean hydra.run.dir?"),
        (
            ["optim.lr=1"],
            "optim.lr: no such key; the keys of optim are name, base_lr, momentum, weight_decay, eta, "
            "warmup_epochs, decay_epochs, end_lr, poly_power, label_smoothing",
        ),
        (["run.max_epochs=ten"], "run.max_epochs: expects an integer, got 'ten'"),
        (["data.workers=many"], "data.workers: expects an integer or null, got 'many'"),
        (["run.checkpoint=maybe"], "run.checkpoint: expects true or false, got 'maybe'"),
        (["optim.base_lr=abc"], "optim.base_lr: expects a number, got 'abc'"),
        (["optim.decay_epochs=x"], "optim.decay_epochs: expects a number or null, got 'x'"),
        (
            ["device=ipu_pod16", "device.pipeline_splits=3"],
            "device.pipeline_splits: expects module names such as [layer2,layer3], auto or list, got 3",
        ),
        (["device=ipu_pod16", "device.system.ipus=x"], "device.system.ipus: expects an integer, got 'x'"),
        (["experiment=smok"], "experiment=smok: no such option; did you mean experiment=smoke?"),
        (
            ["+optim.zzz=1"],
            "optim.zzz: no such key; the keys of optim are name, base_lr, momentum, weight_decay, eta, "
            "warmup_epochs, decay_epochs, end_lr, poly_power, label_smoothing",
        ),
        (["+optim.base_lrr=4"], "optim.base_lrr: no such key; did you mean optim.base_lr?"),
        (["+run.seeed=3"], "run.seeed: no such key; did you mean run.seed?"),
        (
            ["+zzz=1"],
            "zzz: no such key; the keys of the configuration are model, data, optim, precision, device, "
            "dist, mlperf, run, hydra",
        ),
    ],
)
def test_each_composition_mistake_is_told_in_one_line_with_the_closest_key(overrides, message):
    assert config_error(*overrides) == message


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.max_epochs=ten"], "run.max_epochs: expects an integer, got 'ten'"),  # Hydra's, before the run
        (["optim.base_lr=-1"], "optim.base_lr: must be a positive number, got -1.0"),  # the schema's, in the run
    ],
)
def test_train_py_tells_a_mistake_in_one_line_and_exits_2_leaving_no_folder(overrides, message, tmp_path):
    result = run_train(*overrides, f"hydra.run.dir={tmp_path / 'run'}", cache=tmp_path / "cache")
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {message}\n"
    assert not (tmp_path / "run").exists()  # Hydra made it for the run; refused, the run leaves nothing


# Slow: make test checks the same in tests/test_user_files.py, where a run refused for this mistake leaves a folder
# holding an earlier run's mlperf.log and a user's notes as it was
# (test_a_run_refused_before_it_starts_removes_only_what_it_made).
@pytest.mark.slow
def test_a_refused_run_leaves_an_earlier_runs_folder_as_it_was(tmp_path):
    (tmp_path / "mlperf.log").write_text(":::MLLOG {}\n")
    result = run_train("optim.base_lr=-1", f"hydra.run.dir={tmp_path}", cache=tmp_path / "cache")
    assert result.returncode == 2
    assert (tmp_path / "mlperf.log").read_text() == ":::MLLOG {}\n"


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
    with pytest.raises(DatasetError, match=r"^data\.root: .*mine holds files rn50perf did not write"):
        configured_dataset(f"data.root={root}")
    assert (root / "notes.txt").read_text() == "keep me"


def test_synthetic_set_is_generated_into_a_new_root(tmp_path, monkeypatch):
    """Through the calls train.py makes: a data.root that does not exist yet is accepted and the synthetic set is
    generated there, whole; with no data.root it is generated under the cache that CACHE_ENV names."""
    tiny = ("data.synthetic.classes=2", "data.synthetic.train_per_class=3", "data.synthetic.val_per_class=1")
    root = tmp_path / "not-yet-there"
    train, val = configured_dataset(f"data.root={root}", *tiny)
    assert (len(train), len(val), train.classes) == (6, 2, ("n09000000", "n09000001"))
    images = sorted(path.relative_to(root).as_posix() for path in root.rglob("*.JPEG"))
    assert images == [
        *(f"train/n0900000{c}/n0900000{c}_{i}.JPEG" for c in (0, 1) for i in range(3)),
        *(f"val/n0900000{c}/n0900000{c}_val_0.JPEG" for c in (0, 1)),
    ]
    assert all(Path(train[i][0]).is_relative_to(root) for i in range(len(train)))
    assert (root / "spec.json").is_file()  # written last: the set is complete
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    train, _ = configured_dataset(*tiny)
    (cached,) = (tmp_path / "cache").glob("synthetic-*/spec.json")
    assert Path(train[0][0]).is_relative_to(cached.parent)
    assert sorted(path.relative_to(cached.parent).as_posix() for path in cached.parent.rglob("*.JPEG")) == images


def test_the_schema_composes_config_modules_and_imports_no_implementation():
    """Importing configs.schema loads each component's config module (data/config.py, optim/config.py, ...), which
    import no loader, model or torch: the configuration sits under the code it configures, not on top of it."""
    probe = "import sys, configs.schema; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    project = {path.parent.name for path in REPO.glob("*/__init__.py")} | {"torch"}
    ours = {name for name in loaded.stdout.split() if name.split(".")[0] in project}
    init = {name: REPO / name.replace(".", "/") / "__init__.py" for name in ours}
    empty_packages = {name for name, path in init.items() if path.is_file() and "import" not in path.read_text()}
    modules = ours - empty_packages  # a package whose __init__ holds code counts as a module
    assert modules == {
        "configs.checks",
        "configs.device.base",
        "projection.gpu.config",
        "projection.ipu.config",
        "projection.tpu.config",
        "configs.device.native",
        "configs.device.sections",
        "configs.fingerprint",
        "configs.schema",
        "configs.shape",
        "data.config",
        "mlperf_logs.config",
        "monitor.config",
        "optim.config",
        "rundir",
    }


def flatten(mapping: dict, prefix: str = "") -> dict[str, object]:
    """A nested mapping's values by dotted key."""
    flat: dict[str, object] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def option_values(path: Path, group: str) -> dict[str, object]:
    """What a group option's YAML sets, as dotted keys (from the root for a `@package _global_` file)."""
    text = path.read_text()
    values = yaml.safe_load(text) or {}
    values.pop("defaults", None)
    return flatten(values, "" if text.startswith("# @package _global_") else f"{group}.")


GROUPS = ("model", "data", "optim", "precision", "device", "dist", "mlperf")


@pytest.mark.parametrize("group", GROUPS)
def test_each_default_is_given_once_by_the_schema_and_no_option_restates_it(group):
    """The rule (docs/architecture.md): a key's default is its dataclass's; a YAML option sets only what makes it
    that option, and the group's default option sets nothing. Before, the YAML won silently where they disagreed
    (optim.base_lr 10.0 in the schema, 4.0 in optim/lars.yaml; device.channels_last False and true)."""
    defaults = flatten(dataclasses.asdict(Config()))
    composition = yaml.safe_load((REPO / "configs/config.yaml").read_text())["defaults"]
    chosen = {name: option for item in composition if isinstance(item, dict) for name, option in item.items()}
    for path in sorted((REPO / "configs" / group).glob("*.yaml")):
        values = option_values(path, group)
        restated = {key: value for key, value in values.items() if key in defaults and defaults[key] == value}
        assert restated == {}, f"{path.name} gives the schema's defaults again"
        if path.stem == chosen[group]:
            assert values == {}, f"{path.name} is {group}'s default option: the schema gives its values"


# The fingerprint's keys as configs/schema.py listed them by hand before each field said whether it changes
# training: the checkpoints written since hold these, so the walk over the marks must give the same.
FINGERPRINT_KEYS = (
    *("model.zero_init_residual", "model.bn_momentum", "model.bn_eps"),
    *("optim.name", "optim.base_lr", "optim.momentum", "optim.weight_decay", "optim.eta", "optim.warmup_epochs"),
    *("optim.decay_epochs", "optim.end_lr", "optim.poly_power", "optim.label_smoothing"),
    *("precision.name", "precision.compute", "precision.master", "precision.stochastic_rounding"),
    *("precision.loss_scaling", "precision.init_scale", "precision.growth_interval", "precision.emulate"),
    *("dist.grad_accum", "dist.bn_group_size", "dist.bucket_mb", "dist.overlap", "dist.timeout_s"),
    *("data.name", "data.image_size", "data.eval_resize", "data.crop_area_min", "data.global_batch"),
    *("run.seed", "run.max_epochs"),
)
SYNTHETIC_KEYS = tuple(f"data.synthetic.{key}" for key in ("classes", "train_per_class", "val_per_class", "seed"))


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        ((), FINGERPRINT_KEYS + SYNTHETIC_KEYS),
        (("experiment=smoke",), FINGERPRINT_KEYS + SYNTHETIC_KEYS),
        (("data=imagenet", "optim=sgd", "precision=bf16"), FINGERPRINT_KEYS),  # the synthetic set's keys: not chosen
    ],
)
def test_the_fingerprint_from_the_fields_marks_is_the_one_checkpoints_hold(overrides, keys, tmp_path):
    cfg = composed(*overrides, f"data.root={tmp_path}", world_size=2)
    expected = {key: operator.attrgetter(key)(cfg) for key in keys} | {"world_size": 2}
    assert training_fingerprint(cfg, world_size=2) == expected


def test_every_field_of_every_section_says_whether_it_changes_training():
    """The walk enters every section that changes training, chosen or not (the synthetic set's on ImageNet too),
    and refuses a field that says neither; the device and mlperf sections are out whole."""
    for name in ("synthetic", "imagenet"):
        training_fingerprint(Config(data=DataConfig(name=name)), world_size=1)


def widened(section: type) -> type:
    """`section` with one more field that does not say whether it changes training, as a developer might add it."""
    return dataclasses.make_dataclass(
        section.__name__, [("new_key", int, dataclasses.field(default=0))], bases=(section,)
    )


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (Config(optim=widened(OptimConfig)()), "optim.new_key"),
        (Config(data=DataConfig(name="imagenet", synthetic=widened(SyntheticConfig)())), "data.synthetic.new_key"),
        (Config(data=widened(DataConfig)()), "data.new_key"),
    ],
)
def test_a_field_that_does_not_say_whether_it_changes_training_is_refused_by_name(cfg, key):
    """Before, a new key that changed training and was not in the hand-kept list let a resumed run accept a
    checkpoint trained differently, silently."""
    with pytest.raises(UnmarkedField, match=rf"^{key}: say whether it changes training"):
        training_fingerprint(cfg, world_size=1)
