"""Which configuration keys change training: the mark every field of a section carries, and the walk that builds
a checkpoint's fingerprint from the marks. Imports nothing: each config module marks its own fields with these.

A field is `training(default)` or `not_training(default)`; a nested section is `training_section(Section)`, whose
own fields say, or `not_training_section(Section)`, out whole, its fields unmarked. A training section can count
only when its owner chooses it: `training_section(SyntheticConfig, chosen_by="name")` counts where the owner's
`name` is the field's name (`data.name=synthetic`). The walk refuses a field that says neither, naming it, so a
new key cannot leave the fingerprint silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
TRAINING = "training"  # the metadata key: True, the field changes training; False, it does not
CHOSEN_BY = "chosen_by"  # a section's metadata key: the owner's field that must hold the section's name


class UnmarkedField(TypeError):
    """A config field that does not say whether it changes training: a mistake in the code, not the config."""


def training(default: T) -> T:
    """A field whose value changes what training computes: a checkpoint resumes only under the same value."""
    return field(default=default, metadata={TRAINING: True})


def not_training(default: T) -> T:
    """A field that changes where or how fast a run trains, or what it reports, but not what it computes."""
    return field(default=default, metadata={TRAINING: False})


def training_section(section: Callable[[], T], chosen_by: str | None = None) -> T:
    """A nested section whose fields each say whether they change training; with `chosen_by`, it counts only where
    the owner's field of that name holds this field's name."""
    return field(default_factory=section, metadata={TRAINING: True, CHOSEN_BY: chosen_by})


def not_training_section(section: Callable[[], T]) -> T:
    """A nested section none of whose fields changes training: the walk does not enter it."""
    return field(default_factory=section, metadata={TRAINING: False})


def fingerprint(section: DataclassInstance, prefix: str = "") -> dict[str, Any]:
    """The values of `section`'s fields that change training, as dotted keys. A section its owner does not choose
    is walked too, so that every field's mark is checked whatever the config chooses."""
    flat: dict[str, Any] = {}
    for item in fields(section):
        key = prefix + item.name
        if TRAINING not in item.metadata:
            raise UnmarkedField(f"{key}: say whether it changes training: training(...) or not_training(...)")
        if not item.metadata[TRAINING]:
            continue
        value = getattr(section, item.name)
        if is_dataclass(value) and not isinstance(value, type):
            inner = fingerprint(value, key + ".")  # walked even where not chosen, so its marks are checked
            if _chosen(section, item):
                flat |= inner
        else:
            flat[key] = value
    return flat


def _chosen(owner: DataclassInstance, item: Field[Any]) -> bool:
    chosen_by = item.metadata.get(CHOSEN_BY)
    return chosen_by is None or getattr(owner, chosen_by) == item.name
