"""`model.size`: model shapes and a training budget that fit the corpus.

The table is configs/presets/sizes.yaml: rows (small, medium, large), each with `up_to`
(the most transcribed and untranscribed hours it is for) and the `model.*` and `train.*`
values it sets, written as a config file writes them. `model.size: auto` (the default)
takes the first row whose bounds hold the corpus's hours (`CorpusHours`, found by the app:
amflow/model_size.py); a row's name takes that row; `none` takes none (the schema's
defaults). overlays.apply_size lays the row under the user's values.

This module reads the table only (model.py imports the names to validate the key; it must
not import the schema).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config.errors import ConfigError
from core.config.train import PRESETS_DIR, read_preset_file

SIZES_FILE = PRESETS_DIR / "sizes.yaml"
AUTO, NONE = "auto", "none"
# What a row may hold besides its values: its bounds.
_BOUNDS = ("labeled_hours", "unlabeled_hours")
_SECTIONS = ("model", "train")


@dataclass(frozen=True)
class CorpusHours:
    """What model.size auto chooses from: the corpus's transcribed (labeled) and
    untranscribed (unlabeled) hours, where they were read, and a choice made from them
    before (a run's record: the run keeps it), else ""."""
    labeled: float
    unlabeled: float
    source: str
    size: str = ""


def read_table(path: Path = SIZES_FILE) -> dict[str, dict[str, Any]]:
    """The rows, smallest first, each checked for its shape (its values are checked as a
    config's when a config takes the row)."""
    table = read_preset_file(path, "model.size")
    for name, row in table.items():
        where = f"model.size ({path}: {name})"
        if name in (AUTO, NONE) or not isinstance(row, dict):
            raise ConfigError(where, "a row is a mapping named other than auto and none")
        unknown = set(row) - {"up_to", *_SECTIONS}
        if unknown:
            raise ConfigError(where, f"unknown keys {sorted(unknown)} (a row holds up_to, "
                                     "model and train)")
        bounds = row.get("up_to") or {}
        if set(bounds) - set(_BOUNDS) or not all(isinstance(v, (int, float))
                                                 for v in bounds.values()):
            raise ConfigError(where, f"up_to takes numbers for {', '.join(_BOUNDS)}")
    return table


SIZES = read_table()
SIZE_NAMES = (AUTO, *SIZES, NONE)


def choose(labeled: float, unlabeled: float, table: dict[str, dict] = SIZES) -> str:
    """The first row whose bounds hold both hours; past every bound, the last row. One
    row for the run: the teacher and the students of a corpus are sized together."""
    for name, row in table.items():
        bounds = row.get("up_to") or {}
        if (labeled <= bounds.get("labeled_hours", math.inf)
                and unlabeled <= bounds.get("unlabeled_hours", math.inf)):
            return name
    return list(table)[-1]


def size_of(hours: CorpusHours) -> str:
    """The row for `hours`: the choice recorded before when it still names a row."""
    return hours.size if hours.size in SIZES else choose(hours.labeled, hours.unlabeled)


def why(hours: CorpusHours) -> str:
    """`auto: 0.45 h transcribed, 2.1 h untranscribed -> small`."""
    return (f"auto: {_hours(hours.labeled)} h transcribed, {_hours(hours.unlabeled)} h "
            f"untranscribed -> {size_of(hours)}")


def _hours(h: float) -> str:
    return f"{h:.0f}" if h >= 10 else f"{h:.1f}" if h >= 1 else f"{h:.2f}"


def values(name: str) -> dict[str, Any]:
    """The user keys row `name` sets, as a config file's mapping ({model: ..., train: ...})."""
    return {k: v for k, v in SIZES[name].items() if k in _SECTIONS}
