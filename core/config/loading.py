"""Defaults <- YAML file <- `--set key=value` overrides <- presets, coerced and validated;
the one place a key's effective value is decided, and the record of where it came from."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.config.coercion import build, coerce, deep_update
from core.config.errors import ConfigError
from core.config.overlays import DEFAULT, apply_presets, apply_size, grown_stage_label, \
    mark_sources, new_key, read_preset_files, rename_old_keys
from core.config.schema import Config
from core.config.sizes import CorpusHours
from core.config.train import TRAIN_KEYS, TRAIN_SECTIONS, TrainConfig


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", parsed YAML scalar of c). Empty value is the empty string. An old
    key (`train.teacher_recipe`) comes back as its new name, with a WARNING."""
    if "=" not in item:
        raise ConfigError(item, "override must look like key=value")
    key, raw = item.split("=", 1)
    key = new_key(key.strip())
    if not key:
        raise ConfigError(item, "override has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key, value


def check_override(item: str) -> str | None:
    """None when `key=value` is a valid override on its own, else one short line naming
    the key ("unknown key train.foo", "train.lr: expected a number, got 'abc'"). The
    trigger form and the CLI share it; cross-key checks still run in load_config."""
    try:
        key, value = parse_override(str(item))
    except ConfigError as e:
        return f"{e.reason}: {item!r}"
    except yaml.YAMLError:
        return f"{str(item).split('=', 1)[0].strip()}: the value is not valid YAML"
    try:
        coerce(value, _field_type(key), key)
    except ConfigError as e:
        if e.reason.startswith("unknown key"):
            return f"unknown key {e.key}"
        reason = e.reason[5:] if e.reason.startswith("must ") else e.reason
        reason = "expected " + reason[3:] if reason.startswith("be ") else reason
        return f"{e.key}: {reason}"
    return None


def _field_type(key: str) -> Any:
    """The declared type of a dotted key; ConfigError for an unknown one. Only the key's
    own type: range and cross-key checks depend on the config file it lands in."""
    tp: Any = Config
    for i, part in enumerate(key.split(".")):
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            continue
        if tp is Any:
            return Any
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(".".join(key.split(".")[:i + 1]), "unknown key")
        if tp is TrainConfig and TRAIN_KEYS.get(part):  # a flat train key lives in a section
            tp = TRAIN_SECTIONS[TRAIN_KEYS[part]]
        hints = typing.get_type_hints(tp)
        if part not in hints:
            raise ConfigError(".".join(key.split(".")[:i + 1]), "unknown key")
        tp = hints[part]
    return tp


def _nest(key: str, value: Any) -> dict:
    out: dict = {}
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


@dataclass
class Resolved:
    """A loaded config and where each key's value came from: `sources` maps a user key
    (`train.lr`) to "--set", the config file's path, or the preset that set it
    ("train.teacher_preset (configs/presets/teacher.yaml)"); a key not in it is a default.
    `hours`: the corpus's hours model.size auto was resolved with (None: not known)."""
    config: Config
    sources: dict[str, str] = field(default_factory=dict)
    hours: CorpusHours | None = None

    def source(self, key: str) -> str:
        """Where `key`'s value came from: its own entry, else the nearest mapping above it
        that was set whole (`--set train.augment={...}`), else the schema's default."""
        while key:
            if key in self.sources:
                return self.sources[key]
            key = key.rpartition(".")[0]
        return DEFAULT


def resolve_config(path: str | Path | None = None, overrides: list[str] | None = None,
                   hours: CorpusHours | None = None) -> Resolved:
    """Defaults <- model.size's row <- YAML file <- `key=value` overrides <- the presets
    that apply (an explicit --set still wins over a preset), then every section validated.
    model.size auto takes its row from the corpus's `hours` (None: no row; the app finds
    them: amflow/model_size.py)."""
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    labels: dict[str, str] = {}  # preset -> the file it was read from
    if path:
        data = _read_config_file(Path(path))
        rename_old_keys(data)
        mark_sources(sources, data, str(path))
        read_preset_files(data, Path(path).parent, labels, sources)
    explicit: set[str] = set()
    for item in overrides or []:
        key, value = parse_override(item)
        explicit.add(key)
        deep_update(data, _nest(key, value))
        mark_sources(sources, _nest(key, value), "--set")
    rename_old_keys(data)  # a mapping --set whole may hold an old key
    apply_size(data, sources, hours)
    apply_presets(data, explicit, sources, labels)
    used = hours if sources.get("model.size", "").startswith("auto:") else None
    return Resolved(build(Config, data, ""), sources, used)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- `key=value` overrides <- presets, validated."""
    return resolve_config(path, overrides).config


def _read_config_file(p: Path) -> dict[str, Any]:
    if not p.exists():
        raise ConfigError("--config", f"file not found: {p}")
    loaded = yaml.safe_load(p.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ConfigError("--config", f"{p} must hold a mapping at the top level")
    return loaded


def with_overrides(cfg: Config, values: dict[str, Any]) -> Config:
    """A copy of `cfg` with user keys set (`{"train.lr": 0.5, "model.student.layers": 2}`),
    coerced and validated as `--set` would be (presets are not re-applied)."""
    data = cfg.to_dict()
    for key, value in values.items():
        deep_update(data, _nest(key, value))
    return build(Config, data, "")


def grown_stage(resolved: Resolved) -> Resolved:
    """train.grow's second stage: train.grow_preset's values over the training's own (the
    phone-class model grown into the leaves trains on with these; training/launch.py)."""
    cfg = resolved.config
    sources = dict(resolved.sources)
    mark_sources(sources, {"train": dict(cfg.train.grow_preset)}, grown_stage_label(sources))
    return Resolved(with_overrides(cfg, {f"train.{k}": v
                                         for k, v in cfg.train.grow_preset.items()}), sources)


def phone_stage(resolved: Resolved) -> Resolved:
    """train.grow's first stage: the training's own values without the phone term
    (train.phone_weight 0: its classes are the phones, so the term would score each frame's
    phone twice; training/launch.py phone_stage_plan trains it)."""
    sources = {**resolved.sources, "train.phone_weight": PHONE_STAGE_LABEL}
    return Resolved(with_overrides(resolved.config, {"train.phone_weight": 0.0}), sources)


PHONE_STAGE_LABEL = "train.grow's phone stage (one class per phone: no phone term)"


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
