"""The recipes as overlays: train.* values laid over a config's own for one kind of training,
and the record of where each key's value came from.

`train.teacher_recipe` (when train.model is teacher), `train.ctc_recipe` (when train.model
is ctc), `train.sequence_recipe` (when
train.recipe is sequence) and `train.grow_recipe` (train.grow's grown stage) are each a
mapping of train.* keys, or the path of a YAML file holding one (relative to the config file
that names it; `--set` paths relative to the working directory). The sequence and grow
defaults are files too (recipes/*.yaml beside this module). So a training's effective
`train.lr` is read in one file, and `amflow config show` says which.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config.coercion import coerce
from core.config.errors import ConfigError
from core.config.schema import user_keys
from core.config.train import GROW_RECIPE, RECIPES_DIR, TRAIN_KEYS, TrainConfig, \
    read_recipe_file, train_key_type

DEFAULT = "default"
RECIPE_NAMES = ("teacher_recipe", "ctc_recipe", "sequence_recipe", "grow_recipe")
# A grown stage's recipe (train.grow_recipe, train.teacher_recipe.grow_recipe) is the same
# training, grown: it cannot set what starts or names it.
NOT_IN_A_GROWN_RECIPE = frozenset({"grow", "init_model", "tag", "grow_recipe"})
_DEFAULT_FILES = {"sequence_recipe": RECIPES_DIR / "sequence.yaml",
                  "grow_recipe": RECIPES_DIR / "grow.yaml"}


def mark_sources(sources: dict[str, str], data: dict[str, Any], source: str,
                 prefix: str = "") -> None:
    """Record `source` for every user key `data` sets (a key that holds a mapping, e.g.
    runner.env or train.teacher_recipe, is recorded whole); what it replaces is forgotten."""
    whole = _mapping_keys()
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in whole:
            mark_sources(sources, v, source, key + ".")
            continue
        for old in [s for s in sources if s.startswith(key + ".")]:
            del sources[old]
        sources[key] = source


_MAPPING_KEYS: set[str] = set()


def _mapping_keys() -> set[str]:
    if not _MAPPING_KEYS:
        _MAPPING_KEYS.update(k for k, is_map in user_keys() if is_map)
    return _MAPPING_KEYS


def read_recipe_files(data: dict[str, Any], base_dir: Path, labels: dict[str, str],
                      sources: dict[str, str]) -> None:
    """Replace each recipe named by its file with the file's mapping (so `--set
    train.teacher_recipe.epochs=3` still lays over the file's other keys), remembering in
    `labels` how the values it sets are labelled in the sources."""
    train = data.get("train")
    for name in RECIPE_NAMES if isinstance(train, dict) else ():
        value = train.get(name)
        if isinstance(value, str):
            path = Path(value) if Path(value).is_absolute() else base_dir / value
            train[name] = read_recipe_file(path, f"train.{name}")
            labels[name] = f"train.{name} ({_shown(path)})"
            sources[f"train.{name}"] = _shown(path)


def apply_recipes(data: dict[str, Any], explicit: set[str], sources: dict[str, str],
                  labels: dict[str, str]) -> None:
    """train.teacher_recipe's keys replace train.* when train.model is teacher (the
    end-to-end student's, train.ctc_recipe, when it is ctc), then
    train.sequence_recipe's when train.recipe is sequence; sources records each.

    The teacher is trained differently from the students (bigger, longer, regularised
    harder) on the same labeled data, and sequence training is a short, slow-rate stage
    after either. An explicit `--set train.<key>` still wins.
    """
    train = data.get("train")
    if not isinstance(train, dict):
        return
    read_recipe_files(data, Path.cwd(), labels, sources)  # `--set train.<recipe>=FILE`
    labels = {name: labels.get(name) or _label(train, name, sources) for name in RECIPE_NAMES}
    if isinstance(train.get("grow_recipe"), dict):  # a key set: the others keep their defaults
        train["grow_recipe"] = {**GROW_RECIPE, **train["grow_recipe"]}
    _recipe_keys(train, "grow_recipe")  # checked here, applied by train.grow's second stage
    for name, applies in (("teacher_recipe", train.get("model") == "teacher"),
                          ("ctc_recipe", train.get("model") == "ctc"),
                          ("sequence_recipe", train.get("recipe") == "sequence")):
        recipe = _recipe_keys(train, name)
        if applies:
            _lay_over(train, recipe, explicit, sources, labels[name])
    _pseudolabel_epochs(train, explicit, sources)


def _pseudolabel_epochs(train: dict[str, Any], explicit: set[str],
                        sources: dict[str, str]) -> None:
    """train.pseudolabel_epochs replaces train.epochs for the CTC SSL student (train.model
    ctc with train.pseudolabels), unless train.epochs was --set."""
    epochs = train.get("pseudolabel_epochs")
    if (train.get("model") == "ctc" and train.get("pseudolabels") and epochs
            and "train.epochs" not in explicit):
        train["epochs"] = epochs
        sources["train.epochs"] = (f"train.pseudolabel_epochs "
                                   f"({sources.get('train.pseudolabel_epochs', DEFAULT)})")


def _lay_over(train: dict[str, Any], recipe: dict[str, Any], explicit: set[str],
              sources: dict[str, str], label: str) -> None:
    for k, v in recipe.items():
        if f"train.{k}" in explicit:
            continue
        # a mapping (augment) merges: `--set train.augment.enabled=false` still wins
        mine = {sub.split(".", 2)[2] for sub in explicit if sub.startswith(f"train.{k}.")}
        if k == "grow_recipe":  # the teacher's own grown stage, over the shared one
            v = {**(train.get(k) or GROW_RECIPE), **v}  # (merged with it above)
        if isinstance(v, dict) and mine and isinstance(train.get(k), dict):
            v = {**v, **{m: train[k][m] for m in mine if m in train[k]}}
        train[k] = v
        laid = v  # train.augment's keys one by one: those --set here keep their source
        if isinstance(recipe[k], dict) and k != "grow_recipe":
            laid = {m: x for m, x in recipe[k].items() if m not in mine}
        mark_sources(sources, {"train": {k: laid}}, label)


def grown_stage_label(sources: dict[str, str]) -> str:
    """How values of train.grow's grown stage are labelled: the grow recipe and its file."""
    where = sources.get("train.grow_recipe") or _shown(_DEFAULT_FILES["grow_recipe"])
    return f"train.grow_recipe ({where})"


def _label(train: dict[str, Any], name: str, sources: dict[str, str]) -> str:
    """How values of a recipe given inline (or the default file) are labelled."""
    if name not in train and name in _DEFAULT_FILES:
        return f"train.{name} ({_shown(_DEFAULT_FILES[name])})"
    return f"train.{name} (in {sources.get(f'train.{name}', DEFAULT)})"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _recipe_keys(train: dict[str, Any], name: str) -> dict[str, Any]:
    """train.<name>, checked: a mapping of train.* keys with values of their types."""
    default = getattr(TrainConfig(), name)
    recipe = train.get(name, default) or {}
    if not isinstance(recipe, dict):
        raise ConfigError(f"train.{name}", "must be a mapping of train.* keys or the path "
                                           "of a YAML file holding one")
    names = set(TRAIN_KEYS) - {*RECIPE_NAMES, "model", "recipe"}
    if name == "teacher_recipe":  # the teacher may grow longer than the students
        names.add("grow_recipe")
    if name == "grow_recipe":
        names -= NOT_IN_A_GROWN_RECIPE
    _check_recipe(recipe, names, f"train.{name}")
    return recipe


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
