"""Defaults <- YAML file <- `--set key=value` overrides, coerced and validated."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from core.config.errors import ConfigError, check
from core.config.schema import Config, to_data
from core.config.train import GROW_RECIPE, TRAIN_KEYS, TRAIN_SECTIONS, TrainConfig, replace_train, train_key_type

def coerce(value: Any, tp: Any, key: str) -> Any:
    if tp is Any:  # checked where it is used (e.g. train.teacher_recipe)
        return value
    origin = typing.get_origin(tp)
    if tp is TrainConfig:
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build_train(value, key)
    if dataclasses.is_dataclass(tp):
        check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
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
        check(isinstance(value, (str, int, float)) and not isinstance(value, bool), key,
               f"must be a string, got {value!r}")
        return str(value)
    raise ConfigError(key, f"unsupported type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
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


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", parsed YAML scalar of c). Empty value is the empty string."""
    if "=" not in item:
        raise ConfigError(item, "override must look like key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- `key=value` overrides, then validate every section."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.exists():
            raise ConfigError("--config", f"file not found: {p}")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError("--config", f"{p} must hold a mapping at the top level")
        data = loaded
    explicit: set[str] = set()
    for item in overrides or []:
        key, value = parse_override(item)
        explicit.add(key)
        deep_update(data, _nest(key, value))
    _apply_recipes(data, explicit)
    return _build(Config, data, "")


def with_overrides(cfg: Config, values: dict[str, Any]) -> Config:
    """A copy of `cfg` with user keys set (`{"train.lr": 0.5, "model.student.layers": 2}`),
    coerced and validated as `--set` would be (recipes are not re-applied)."""
    data = cfg.to_dict()
    for key, value in values.items():
        deep_update(data, _nest(key, value))
    return _build(Config, data, "")


def _apply_recipes(data: dict[str, Any], explicit: set[str]) -> None:
    """train.teacher_recipe's keys replace train.* when train.model is teacher, then
    train.sequence_recipe's when train.recipe is sequence.

    The teacher is trained differently from the students (bigger, longer, regularised
    harder) on the same labeled data, and sequence training is a short, slow-rate stage
    after either; one config holds every recipe. An explicit `--set train.<key>` still wins.
    """
    train = data.get("train")
    if not isinstance(train, dict):
        return
    if isinstance(train.get("grow_recipe"), dict):  # a key set: the others keep their defaults
        train["grow_recipe"] = {**GROW_RECIPE, **train["grow_recipe"]}
    _recipe_keys(train, "grow_recipe")  # checked here, applied by train.grow's second stage
    for name, applies in (("teacher_recipe", train.get("model") == "teacher"),
                          ("sequence_recipe", train.get("recipe") == "sequence")):
        recipe = _recipe_keys(train, name)
        if applies:
            for k, v in recipe.items():
                if f"train.{k}" in explicit:
                    continue
                # a mapping (augment) merges: `--set train.augment.enabled=false` still wins
                mine = {sub.split(".", 2)[2] for sub in explicit
                        if sub.startswith(f"train.{k}.")}
                if k == "grow_recipe":  # the teacher's own grown stage, over the shared one
                    v = {**(train.get(k) or GROW_RECIPE), **v}  # (merged with it above)
                if isinstance(v, dict) and mine and isinstance(train.get(k), dict):
                    v = {**v, **{m: train[k][m] for m in mine if m in train[k]}}
                train[k] = v


def _recipe_keys(train: dict[str, Any], name: str) -> dict[str, Any]:
    """train.<name>, checked: a mapping of train.* keys with values of their types."""
    default = getattr(TrainConfig(), name)
    recipe = train.get(name, default) or {}
    if not isinstance(recipe, dict):
        raise ConfigError(f"train.{name}", "must be a mapping of train.* keys")
    names = set(TRAIN_KEYS) - {"teacher_recipe", "sequence_recipe", "grow_recipe", "model",
                               "recipe"}
    if name == "teacher_recipe":  # the teacher may grow longer than the students
        names.add("grow_recipe")
    if name == "grow_recipe":
        names -= NOT_IN_A_GROWN_RECIPE
    _check_recipe(recipe, names, f"train.{name}")
    return recipe


# A grown stage's recipe (train.grow_recipe, train.teacher_recipe.grow_recipe) is the same
# training, grown: it cannot set what starts or names it.
NOT_IN_A_GROWN_RECIPE = frozenset({"grow", "init_model", "tag", "grow_recipe"})


def _check_recipe(recipe: dict[str, Any], names: set[str], where: str) -> None:
    """Each key of `recipe` one of `names`, its value of that train key's type (a nested
    grow_recipe checked alike)."""
    for k, v in recipe.items():
        if k not in names:
            raise ConfigError(f"{where}.{k}", f"not a train key that a recipe can set "
                                              f"(known: {', '.join(sorted(names))})")
        if k == "grow_recipe":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}.{k}", "must be a mapping of train.* keys")
            _check_recipe(v, names - NOT_IN_A_GROWN_RECIPE, f"{where}.{k}")
        else:
            coerce(v, train_key_type(k), f"{where}.{k}")


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
