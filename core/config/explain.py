"""Each user key of a resolved config with its value and where the value came from: what
`amflow config show` prints, and what each step records beside its outputs
(`<run>/<step>/_config.json`), so a run's effective settings are read in one place."""
from __future__ import annotations

import copy
import json
from typing import Any

from core.config.coercion import build
from core.config.loading import Resolved
from core.config.overlays import DEFAULT, rename_old_keys, renamed
from core.config.schema import Config, user_keys

CONFIG_RECORD = "_config.json"


def rows(resolved: Resolved, everything: bool = False) -> list[tuple[str, Any, str]]:
    """(key, value, source) for each user key, in the schema's order; only the keys whose
    value is not the schema's default unless `everything`."""
    out = []
    for key, _ in user_keys():
        source = resolved.source(key)
        if everything or source != DEFAULT:
            out.append((key, resolved.config.get(key), source))
    return out


def render(table: list[tuple[str, Any, str]]) -> str:
    """`key = value   # source` lines, the values as YAML/JSON scalars, aligned."""
    shown = [(k, json.dumps(v, default=str), s) for k, v, s in table]
    width = min(max((len(k) + len(v) + 3 for k, v, _ in shown), default=0), 56)
    return "\n".join(f"{f'{k} = {v}':<{width}}  # {s}" for k, v, s in shown)


def record(resolved: Resolved, argv: list[str]) -> dict[str, Any]:
    """What a finished step keeps of its config: the whole mapping, each set key's
    source, and the command line."""
    return {"config": resolved.config.to_dict(), "sources": dict(sorted(resolved.sources.items())),
            "argv": list(argv)}


def rows_of_record(rec: dict[str, Any], everything: bool = False) -> list[tuple[str, Any, str]]:
    """rows() of a recorded config (`_config.json`); one recorded before train.*_recipe
    became train.*_preset and train.recipe train.regime is shown under the new names."""
    data = copy.deepcopy(rec["config"])
    rename_old_keys(data, warn=False)
    sources = {renamed(k): v for k, v in rec.get("sources", {}).items()}
    return rows(Resolved(build(Config, data, ""), sources), everything)
