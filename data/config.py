"""The data section of a run's configuration: its keys, their defaults and their checks. configs/schema.py
composes it; the datasets, the loader and the synthetic generator take their choices from here, and this module
imports none of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from configs.checks import one_of, positive, require
from configs.fingerprint import not_training, training, training_section

DATASETS = ("synthetic", "imagenet")
FORMATS = ("files", "shards")  # a folder tree in any known layout, or indexed tar shards
CORRUPT_POLICIES = ("skip", "fail")
# data.max_skipped: the distinct files one rank's loader may skip in a run before the run stops. ImageNet as
# distributed reads whole (its odd files, a PNG, CMYK, bad Huffman codes, all decode), so a skip means a copy gone
# wrong. A handful replaced among 1.28 M images changes nothing a run measures (100 are 0.008 %); more points at a
# failing disk, a copy still being written or a dataset swapped under the run: better stopped than trained on.
MAX_SKIPPED = 100
# data.decode: the fused decoder in the workers (cpu), the training device (gpu), a share of each batch on each
# (hybrid), or the faster mix as measured at start-up on this machine (auto)
DECODERS = ("auto", "cpu", "gpu", "hybrid")
MAX_CLASSES = 8 * 8 * 4  # the synthetic generator's shapes x hues x textures (data/sources/synthetic.py; a test checks)


@dataclass
class SyntheticConfig:
    """The embedded synthetic set, as data/sources/synthetic.py generates it (the cache folder's name hashes these)."""

    classes: int = training(10)
    train_per_class: int = training(100)
    val_per_class: int = training(50)
    seed: int = training(0)


@dataclass
class DataConfig:
    name: str = training("synthetic")  # synthetic | imagenet
    root: str | None = not_training(None)  # None: the synthetic set's cache directory
    # files: a folder tree (torchvision's, Kaggle's or image-net.org's layout, recognised from what is there) |
    # shards: indexed tar shards written by `python -m data.shards` (root: their folder; synthetic: packed on first use)
    format: str = not_training("files")
    image_size: int = training(224)  # training and evaluation crop, pixels
    eval_resize: int = training(256)  # evaluation resizes the short side to this, then centre-crops image_size
    crop_area_min: float = training(0.08)  # random-resized crop: smallest fraction of the image area
    global_batch: int = training(256)
    eval_batch: int = not_training(256)
    # loader processes per rank; 0 loads in the training process; null: this rank's share of the machine's cores,
    # less one for the training process (data.loading.loader.workers_for_cores)
    workers: int | None = not_training(None)
    # skip: replace an unreadable or corrupt file by another sample, report it once | fail
    corrupt: str = not_training("skip")
    # corrupt=skip: stop the run when a rank's loader skips more distinct files
    max_skipped: int = not_training(MAX_SKIPPED)
    max_pixels: int = not_training(178_956_970)  # refuse an image whose header claims more pixels (Pillow's bomb limit)
    cache_bytes: bool = not_training(False)  # keep every file's bytes in memory (read once, shared by the workers)
    # cpu: the fused decoder in the workers | gpu: the workers read the bytes and draw the crops, the training
    # device decodes (nvJPEG on CUDA; on device=cpu the training process, which is how the tests run it), but for
    # files its fast path does not take (progressive, CMYK, not JPEG), which the workers decode | hybrid: the
    # device decodes data.device_share of each batch, the workers the rest | auto: on CUDA, both decoders timed
    # for a few seconds in MLPerf's init phase, and the mix that feeds most chosen (one line says which and why);
    # on other devices, cpu (the training process is the device: decoding there would slow its step)
    decode: str = not_training("auto")
    # data.decode=hybrid: DALI's default share for its hardware decoder (hw_decoder_load)
    device_share: float = not_training(0.65)
    synthetic: SyntheticConfig = training_section(SyntheticConfig, chosen_by="name")


def validate(data: DataConfig, reads_files: bool = True) -> None:
    """Raise ConfigError for the first wrong value (how the global batch deals is configs.schema's check: it
    depends on the device). `reads_files`: the run opens the dataset, so an ImageNet root must exist."""
    one_of(data.name, "data.name", DATASETS)
    if data.name == "imagenet" and reads_files:
        require(data.root is not None, "data.root", "ImageNet needs data.root=/path/to/imagenet")
        root = Path(str(data.root)).expanduser()
        require(root.is_dir(), "data.root", f"directory {root} does not exist")
    require(data.image_size >= 32, "data.image_size", f"must be at least 32 pixels, got {data.image_size}")
    require(
        data.eval_resize >= data.image_size,
        "data.eval_resize",
        f"must be at least data.image_size ({data.image_size}), got {data.eval_resize}",
    )
    require(0 < data.crop_area_min <= 1, "data.crop_area_min", f"must be in (0, 1], got {data.crop_area_min}")
    positive(data.global_batch, "data.global_batch")
    positive(data.eval_batch, "data.eval_batch")
    require(
        data.workers is None or data.workers >= 0, "data.workers", f"must be 0 or more, or null, got {data.workers}"
    )
    one_of(data.format, "data.format", FORMATS)
    one_of(data.corrupt, "data.corrupt", CORRUPT_POLICIES)
    require(data.max_skipped >= 0, "data.max_skipped", f"must be 0 or more, got {data.max_skipped}")
    one_of(data.decode, "data.decode", DECODERS)
    require(0 <= data.device_share <= 1, "data.device_share", f"must be in [0, 1], got {data.device_share}")
    positive(data.max_pixels, "data.max_pixels")
    validate_synthetic(data.synthetic)


def validate_synthetic(syn: SyntheticConfig) -> None:
    require(
        2 <= syn.classes <= MAX_CLASSES, "data.synthetic.classes", f"must be in [2, {MAX_CLASSES}], got {syn.classes}"
    )
    positive(syn.train_per_class, "data.synthetic.train_per_class")
    positive(syn.val_per_class, "data.synthetic.val_per_class")
