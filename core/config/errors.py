"""ConfigError: a bad key or value, the message starting with the dotted key."""
from __future__ import annotations

class ConfigError(ValueError):
    """A bad config key or value; the message starts with the dotted key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key '{key}': {message}")
        self.key = key
        self.reason = message


def check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)
