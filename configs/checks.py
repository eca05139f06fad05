"""The error every configuration check raises, and the checks the config modules share. Imports nothing: each
component's config module (data/config.py, optim/config.py, ...) checks its own section with these."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A configuration value a user can fix: `key` names it, the message says what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # rank 0 sends its errors to the other ranks
        return type(self), (self.key, self.message)


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def one_of(value: str, key: str, allowed: tuple[str, ...]) -> None:
    require(value in allowed, key, f"{value!r} is not one of {', '.join(allowed)}")


def positive(value: float, key: str) -> None:
    require(value > 0 and math.isfinite(value), key, f"must be a positive number, got {value}")
