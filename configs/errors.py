"""Configuration mistakes that Hydra and OmegaConf report, told in one line: the key, and what is allowed.

Hydra answers an unknown key with a hint to append it (`+key=value`, the wrong fix here), a value of the wrong
type and an unknown group option with several lines of node types or search paths. `describe` turns each into
`key: what is wrong; what to do`, with the closest known key or option where there is one.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence
from functools import cache

from hydra.conf import HydraConf
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from configs.device.base import DeviceConfig
from configs.device.sections import SECTIONS
from configs.schema import Config, UnknownKey

KINDS: dict[object, str] = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
SHOWN_KEYS = 12  # a group's keys listed when no key is close to the one given


def describe(err: BaseException) -> str:
    """The one-line message for a mistake in the configuration; other errors say what they say."""
    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file is not None:
        return unknown_option(err.missing_cfg_file, err.options)
    if isinstance(err, UnknownKey):
        return unknown_key(err.key)
    detail = err.__cause__ if isinstance(err, HydraException) else err
    if isinstance(detail, OmegaConfBaseException) and detail.full_key:
        return wrong_key_or_value(detail, detail.full_key)
    return f"{err}\n{detail}" if detail is not err and detail is not None else str(err)


def wrong_key_or_value(err: OmegaConfBaseException, key: str) -> str:
    """An unknown key, a value of the wrong type for its key, or another mistake at a key (`err.full_key`)."""
    if isinstance(err, (ConfigAttributeError, ConfigKeyError)):
        return unknown_key(key)
    if isinstance(err, ValidationError) and key in schema_keys():
        return f"{key}: expects {kind(schema_keys()[key])}, got {err.value!r}"
    return f"{key}: {str(err).strip().splitlines()[0]}"


def unknown_key(key: str) -> str:
    """`key: no such key`, with the family whose device has it, or the closest known key, or else the keys of the
    group it would be in."""
    owner = section_with(key)
    if owner is not None:
        return f"{key}: this device has no such key; {owner.schema} devices have it ({owner.needs})"
    close = closest_key(key)
    if close:
        return f"{key}: no such key; did you mean {close}?"
    group = key.rpartition(".")[0]
    known = [name.rpartition(".")[2] for name in schema_keys() if name.rpartition(".")[0] == group]
    if not known:
        return f"{key}: no such key"
    shown = ", ".join(known[:SHOWN_KEYS]) + ", ..." * (len(known) > SHOWN_KEYS)
    return f"{key}: no such key; the keys of {group or 'the configuration'} are {shown}"


def closest_key(key: str) -> str | None:
    """A key of the same group spelled alike, or else a key of another group with (nearly) the same name."""
    group, _, name = key.rpartition(".")
    siblings = {known.rpartition(".")[2]: known for known in schema_keys() if known.rpartition(".")[0] == group}
    close = difflib.get_close_matches(name, siblings, n=1)
    if close:
        return siblings[close[0]]
    elsewhere = {known.rpartition(".")[2]: known for known in reversed(schema_keys()) if "." in known}
    close = difflib.get_close_matches(name, elsewhere, n=1, cutoff=0.8)
    return elsewhere[close[0]] if close else None


def unknown_option(missing: str, options: Sequence[str]) -> str:
    """`group=option: no such option`, with the closest one, or else the group's options."""
    group, _, option = missing.rpartition("/")
    close = difflib.get_close_matches(option, options, n=1)
    if close:
        return f"{group}={option}: no such option; did you mean {group}={close[0]}?"
    return f"{group}={option}: no such option; {group} is one of {', '.join(options)}"


def section_with(key: str) -> type[DeviceConfig] | None:
    """The first device section that has `key` (device.<name>), where the device chosen has no such key."""
    group, _, name = key.partition(".")
    found = (
        section
        for section in SECTIONS.values()
        if group == "device" and f"device.{name}" in _fields(section, "device.")
    )
    return next(found, None)


@cache
def schema_keys() -> dict[str, object]:
    """Every key of the run's schema, every device section's among them, and of Hydra's own (under `hydra`), dotted,
    with its type, groups first."""
    devices = {key: hint for section in SECTIONS.values() for key, hint in _fields(section, "device.").items()}
    return {**_fields(Config, ""), **devices, "hydra": HydraConf, **_fields(HydraConf, "hydra.")}


def _fields(schema: type, prefix: str) -> dict[str, object]:
    """The fields of a dataclass and of the dataclasses it holds (an Optional one too), dotted under `prefix`."""
    keys: dict[str, object] = {}
    for name, hint in typing.get_type_hints(schema).items():
        if name not in {field.name for field in dataclasses.fields(schema)}:
            continue
        keys[prefix + name] = hint
        inner = _dataclass_in(hint)
        if inner is not None:
            keys |= _fields(inner, f"{prefix}{name}.")
    return keys


def _dataclass_in(hint: object) -> type | None:
    """The dataclass that `hint` is, or is Optional of; None otherwise."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def kind(hint: object) -> str:
    """What a value of type `hint` is, in words: 'an integer', 'a number or null', 'a list such as [a,b]', ..."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [kind(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        return " or ".join(options) + " or null" * (type(None) in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return "a list such as [a,b]"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"the keys of a {hint.__name__}"
    return KINDS.get(hint, str(hint))
