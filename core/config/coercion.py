"""Typing a user's mapping into the schema's dataclasses: each value coerced to its key's
declared type and each section validated, errors naming the dotted key."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import types
import typing
from typing import Any

import yaml

from core.config.errors import ConfigError, check
from core.config.schema import to_data
from core.config.train import TRAIN_KEYS, TrainConfig, replace_train, train_key_type


def coerce(value: Any, tp: Any, key: str) -> Any:
    if tp is Any:  # checked where it is used (e.g. train.teacher_preset)
        return value
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):  # e.g. targets.fp16: bool | str
        return _coerce_either(value, typing.get_args(tp), key)
    if tp is TrainConfig:
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build_train(value, key)
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return build(tp, value, key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [yaml.safe_load(v.strip()) if item_tp is not str else v.strip()
                     for v in value.split(",") if v.strip()]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # `--set decode.acwt=0.5`: a list of one
        check(isinstance(value, list), key, f"must be a list, got {type(value).__name__}")
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return {str(k): coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        check(ok, key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        check(ok, key, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, (_dt.date, _dt.datetime)):  # YAML reads 2026-03-01 as a date
            return value.isoformat()
        check(isinstance(value, (str, int, float)) and not isinstance(value, bool), key,
               f"must be a string, got {value!r}")
        return str(value)
    raise ConfigError(key, f"unsupported type {tp}")


def _coerce_either(value: Any, options: tuple, key: str) -> Any:
    """`value` as the first of `options` it can be (the section's validate() then checks
    which values of that type it takes); else the error of each, named by the key."""
    reasons = []
    for tp in options:
        try:
            return coerce(value, tp, key)
        except ConfigError as e:
            reasons.append(e.reason)
    raise ConfigError(key, " or ".join(reasons))


def build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else k
            raise ConfigError(where, f"unknown key (known: {', '.join(sorted(names))})")
    obj = cls()
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        current = getattr(obj, k)
        if dataclasses.is_dataclass(current) and isinstance(v, dict):
            merged = to_data(current)
            deep_update(merged, v)
            v = merged
        setattr(obj, k, coerce(v, hints[k], key))
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def _build_train(data: dict[str, Any], prefix: str) -> TrainConfig:
    """TrainConfig from the user's flat `train.*` mapping: each key checked and coerced
    under the name the user wrote (`train.lr`), then placed in its section."""
    for k in data:
        if k not in TRAIN_KEYS:
            raise ConfigError(f"{prefix}.{k}",
                              f"unknown key (known: {', '.join(sorted(TRAIN_KEYS))})")
    merged = TrainConfig().to_flat()
    deep_update(merged, data)
    tc = replace_train(TrainConfig(), **{
        k: coerce(v, train_key_type(k), f"{prefix}.{k}") for k, v in merged.items()})
    tc.validate(prefix)
    return tc


def deep_update(base: dict, update: dict) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v
