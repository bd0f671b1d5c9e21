"""The presets: train.* values laid over a config's own for one kind of training; the
model size's values laid under them (apply_size); and the record of where each key's
value came from.

`train.teacher_preset` (when train.model is teacher), `train.ctc_preset` (when train.model
is ctc), `train.sequence_preset` (when train.regime is sequence) and `train.grow_preset`
(train.grow's grown stage) are each a mapping of train.* keys, or the path of a YAML file
holding one (relative to the config file that names it; `--set` paths relative to the
working directory). The shipped presets, the sequence and grow defaults among them, are
files in configs/presets/. So a training's effective `train.lr` is read in one file, and
`amflow config show` says which.

They were called recipes (`train.teacher_recipe`, ...), and train.regime was train.recipe,
before "recipe" came to mean a named pipeline of runs (configs/recipes/): the old keys are
still read, with a WARNING naming the new one (OLD_KEYS).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from core.config.coercion import coerce
from core.config.errors import ConfigError
from core.config.schema import user_keys
from core.config.sizes import AUTO, NONE, SIZE_NAMES, SIZES_FILE, CorpusHours, size_of, \
    values, why
from core.config.train import GROW_PRESET, PRESETS_DIR, TRAIN_KEYS, TrainConfig, \
    read_preset_file, train_key_type

log = logging.getLogger(__name__)

DEFAULT = "default"
PRESET_NAMES = ("teacher_preset", "ctc_preset", "conformer_ctc_preset", "sequence_preset",
                "grow_preset")
# train.* names from before "recipe" meant a pipeline of runs: accepted, with a WARNING.
OLD_KEYS = {"teacher_recipe": "teacher_preset", "ctc_recipe": "ctc_preset",
            "sequence_recipe": "sequence_preset", "grow_recipe": "grow_preset",
            "recipe": "regime"}
# A grown stage's preset (train.grow_preset, train.teacher_preset.grow_preset) is the same
# training, grown: it cannot set what starts or names it.
NOT_IN_A_GROWN_PRESET = frozenset({"grow", "init_model", "tag", "grow_preset"})
_DEFAULT_FILES = {"sequence_preset": PRESETS_DIR / "sequence.yaml",
                  "grow_preset": PRESETS_DIR / "grow.yaml"}
# The train keys of a training's length: an epoch count the user gives (train.epochs, or
# train.min_updates) is their budget, so the size's are not laid beside it.
BUDGET = ("epochs", "min_updates", "pseudolabel_epochs", "finetune_epochs")
SIZE_LABEL = "model.size"  # how the values a size sets are labelled: "model.size small (...)"


def new_key(key: str) -> str:
    """A dotted user key with an old name (`train.teacher_recipe.epochs`, `train.recipe`)
    spelled the new way (`train.teacher_preset.epochs`, `train.regime`), with a WARNING
    naming both."""
    new = renamed(key)
    if new != key:
        _warn_old(key, new)
    return new


def renamed(key: str) -> str:
    """new_key without the WARNING (a record written before the rename is read as is)."""
    parts = key.split(".")
    if parts[0] != "train" or not OLD_KEYS.keys() & set(parts[1:3]):
        return key
    return ".".join([parts[0], *(OLD_KEYS.get(p, p) for p in parts[1:3]), *parts[3:]])


def rename_old_keys(data: dict[str, Any], warn: bool = True) -> None:
    """A config mapping's old train keys (train.teacher_recipe, train.recipe, and a
    teacher preset's grow_recipe) renamed in place to the new ones, with a WARNING naming
    both unless not `warn` (a record written before the rename)."""
    train = data.get("train")
    if not isinstance(train, dict):
        return
    _rename_in(train, "train", warn)
    teacher = train.get("teacher_preset")
    if isinstance(teacher, dict):
        _rename_in(teacher, "train.teacher_preset", warn)


def _rename_in(mapping: dict[str, Any], where: str, warn: bool = True) -> None:
    for old in [k for k in mapping if k in OLD_KEYS]:
        new = OLD_KEYS[old]
        if new in mapping:
            raise ConfigError(f"{where}.{old}", f"is the old name of {where}.{new}, which is "
                                                "set too: keep one")
        if warn:
            _warn_old(f"{where}.{old}", f"{where}.{new}")
        mapping[new] = mapping.pop(old)


def _warn_old(old: str, new: str) -> None:
    log.warning("config key %s is now %s (\"recipe\" now names a pipeline of runs, "
                "configs/recipes/; the train.* overlays are presets): reading it as %s",
                old, new, new)


def mark_sources(sources: dict[str, str], data: dict[str, Any], source: str,
                 prefix: str = "") -> None:
    """Record `source` for every user key `data` sets (a key that holds a mapping, e.g.
    runner.env or train.teacher_preset, is recorded whole); what it replaces is forgotten."""
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


def read_preset_files(data: dict[str, Any], base_dir: Path, labels: dict[str, str],
                      sources: dict[str, str]) -> None:
    """Replace each preset named by its file with the file's mapping (so `--set
    train.teacher_preset.epochs=3` still lays over the file's other keys), remembering in
    `labels` how the values it sets are labelled in the sources."""
    train = data.get("train")
    for name in PRESET_NAMES if isinstance(train, dict) else ():
        value = train.get(name)
        if isinstance(value, str):
            path = Path(value) if Path(value).is_absolute() else base_dir / value
            train[name] = read_preset_file(path, f"train.{name}")
            if name == "teacher_preset":  # a teacher preset file may hold a grow_recipe
                _rename_in(train[name], f"train.{name}")
            labels[name] = f"train.{name} ({_shown(path)})"
            sources[f"train.{name}"] = _shown(path)


def apply_size(data: dict[str, Any], sources: dict[str, str],
               hours: CorpusHours | None) -> None:
    """model.size's row laid under the user's values (the config file's and --set's, which
    `sources` holds so far), each key it sets recorded as the size's. auto chooses the
    row from `hours` (None: not known yet, so no row: the schema's defaults) and model.size
    then holds the row's name, its source saying why. The presets go over the result
    afterwards, as over a config file's values."""
    name = _size_name(data, sources, hours)
    if name in (AUTO, NONE):
        return
    label = f"{SIZE_LABEL} {name} ({_shown(SIZES_FILE)})"
    given = set(sources)
    budget_given = bool({"train.epochs", "train.min_updates"} & given)
    for key, value in _leaves(values(name)):
        last = key.rpartition(".")[2]
        if _given(key, given) or (key.startswith("train.") and last in BUDGET and budget_given):
            continue
        if last in MODEL_PRESET_NAMES:  # never over the user's train keys
            value = {k: v for k, v in value.items() if f"train.{k}" not in given
                     and not (k in BUDGET and budget_given)}
        _put(data, key, value)
        sources[key] = label


def _size_name(data: dict[str, Any], sources: dict[str, str],
               hours: CorpusHours | None) -> str:
    """model.size as given, checked; auto with known `hours`: the row they choose, written
    into model.size with why as its source."""
    model = data.get("model")
    setting = model.get("size", AUTO) if isinstance(model, dict) else AUTO
    if setting not in SIZE_NAMES:
        raise ConfigError("model.size", f"must be one of {', '.join(SIZE_NAMES)}, got "
                                        f"{setting!r}")
    if setting != AUTO or hours is None or not isinstance(data.setdefault("model", {}), dict):
        return setting
    data["model"]["size"] = name = size_of(hours)
    sources["model.size"] = f"{why(hours)} ({hours.source})"
    return name


def _leaves(mapping: dict[str, Any], prefix: str = ""):
    """(dotted user key, value) of each key a config mapping sets; a key that holds a
    mapping (train.teacher_preset) is one leaf."""
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in _mapping_keys():
            yield from _leaves(v, key + ".")
        else:
            yield key, v


def _given(key: str, given: set[str]) -> bool:
    """Whether the user set `key`, or a mapping above it whole (`--set model.teacher={...}`)."""
    return any(key == g or key.startswith(g + ".") for g in given)


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


# The model families that have presets of their own (train.model -> the presets' keys, laid
# in this order). Both CTC-head families train on whole transcripts and pseudo-labels alike:
# the CTC preset (epochs, minibatches, rate, SortaGrad, pseudolabel_epochs) is theirs; the
# Conformer's goes over it (a warm-up, a higher rate, more epochs: attention needs them).
MODEL_PRESETS = {"teacher": ("teacher_preset",), "ctc": ("ctc_preset",),
                 "conformer_ctc": ("ctc_preset", "conformer_ctc_preset")}
MODEL_PRESET_NAMES = tuple(n for n in PRESET_NAMES if any(n in v for v in MODEL_PRESETS.values()))


def apply_presets(data: dict[str, Any], explicit: set[str], sources: dict[str, str],
                  labels: dict[str, str]) -> None:
    """train.teacher_preset's keys replace train.* when train.model is teacher (the
    end-to-end students', train.ctc_preset, when it is ctc or conformer_ctc, and then
    train.conformer_ctc_preset's for conformer_ctc), then train.sequence_preset's when
    train.regime is sequence; sources records each.

    The teacher is trained differently from the students (bigger, longer, regularised
    harder) on the same labeled data, and sequence training is a short, slow-rate stage
    after either. An explicit `--set train.<key>` still wins.
    """
    train = data.get("train")
    if not isinstance(train, dict):
        return
    read_preset_files(data, Path.cwd(), labels, sources)  # `--set train.<preset>=FILE`
    labels = {name: labels.get(name) or _label(train, name, sources) for name in PRESET_NAMES}
    if isinstance(train.get("grow_preset"), dict):  # a key set: the others keep their defaults
        train["grow_preset"] = {**GROW_PRESET, **train["grow_preset"]}
    _preset_keys(train, "grow_preset")  # checked here, applied by train.grow's second stage
    applies = {*MODEL_PRESETS.get(train.get("model"), ()),
               "sequence_preset" if train.get("regime") == "sequence" else None}
    for name in (*MODEL_PRESET_NAMES, "sequence_preset"):  # in this order
        preset = _preset_keys(train, name)
        if name in applies:
            _lay_over(train, preset, explicit, sources, labels[name])
    _pseudolabel_epochs(train, explicit, sources)


def _pseudolabel_epochs(train: dict[str, Any], explicit: set[str],
                        sources: dict[str, str]) -> None:
    """train.pseudolabel_epochs replaces train.epochs for a CTC SSL student (train.model
    ctc or conformer_ctc with train.pseudolabels), unless train.epochs was --set."""
    epochs = train.get("pseudolabel_epochs")
    ctc = "ctc_preset" in MODEL_PRESETS.get(train.get("model"), ())
    if ctc and train.get("pseudolabels") and epochs and "train.epochs" not in explicit:
        train["epochs"] = epochs
        sources["train.epochs"] = (f"train.pseudolabel_epochs "
                                   f"({sources.get('train.pseudolabel_epochs', DEFAULT)})")


def _lay_over(train: dict[str, Any], preset: dict[str, Any], explicit: set[str],
              sources: dict[str, str], label: str) -> None:
    for k, v in preset.items():
        if f"train.{k}" in explicit:
            continue
        # a mapping (augment) merges: `--set train.augment.enabled=false` still wins
        mine = {sub.split(".", 2)[2] for sub in explicit if sub.startswith(f"train.{k}.")}
        if k == "grow_preset":  # the teacher's own grown stage, over the shared one
            v = {**(train.get(k) or GROW_PRESET), **v}  # (merged with it above)
        if isinstance(v, dict) and mine and isinstance(train.get(k), dict):
            v = {**v, **{m: train[k][m] for m in mine if m in train[k]}}
        train[k] = v
        laid = v  # train.augment's keys one by one: those --set here keep their source
        if isinstance(preset[k], dict) and k != "grow_preset":
            laid = {m: x for m, x in preset[k].items() if m not in mine}
        mark_sources(sources, {"train": {k: laid}}, label)
    _epochs_over_size_floor(train, preset, explicit, sources, label)


def _epochs_over_size_floor(train: dict[str, Any], preset: dict[str, Any],
                            explicit: set[str], sources: dict[str, str], label: str) -> None:
    """A preset's epoch count is not raised by the size's train.min_updates (a preset of
    the user's says how long its training is); one that sets both keeps both."""
    if ("epochs" in preset and "min_updates" not in preset
            and "train.min_updates" not in explicit and train.get("min_updates")
            and sources.get("train.min_updates", "").startswith(SIZE_LABEL + " ")):
        train["min_updates"] = 0
        sources["train.min_updates"] = label


def grown_stage_label(sources: dict[str, str]) -> str:
    """How values of train.grow's grown stage are labelled: the grow preset and its file."""
    where = sources.get("train.grow_preset") or _shown(_DEFAULT_FILES["grow_preset"])
    return f"train.grow_preset ({where})"


def _label(train: dict[str, Any], name: str, sources: dict[str, str]) -> str:
    """How values of a preset given inline (or the default file) are labelled."""
    if name not in train and name in _DEFAULT_FILES:
        return f"train.{name} ({_shown(_DEFAULT_FILES[name])})"
    return f"train.{name} (in {sources.get(f'train.{name}', DEFAULT)})"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _preset_keys(train: dict[str, Any], name: str) -> dict[str, Any]:
    """train.<name>, checked: a mapping of train.* keys with values of their types."""
    default = getattr(TrainConfig(), name)
    preset = train.get(name, default) or {}
    if not isinstance(preset, dict):
        raise ConfigError(f"train.{name}", "must be a mapping of train.* keys or the path "
                                           "of a YAML file holding one")
    names = set(TRAIN_KEYS) - {*PRESET_NAMES, "model", "regime"}
    if name == "teacher_preset":  # the teacher may grow longer than the students
        names.add("grow_preset")
    if name == "grow_preset":
        names -= NOT_IN_A_GROWN_PRESET
    _check_preset(preset, names, f"train.{name}")
    return preset


def _check_preset(preset: dict[str, Any], names: set[str], where: str) -> None:
    """Each key of `preset` one of `names`, its value of that train key's type (a nested
    grow_preset checked alike)."""
    for k, v in preset.items():
        if k not in names:
            raise ConfigError(f"{where}.{k}", f"not a train key that a preset can set "
                                              f"(known: {', '.join(sorted(names))})")
        if k == "grow_preset":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}.{k}", "must be a mapping of train.* keys")
            _check_preset(v, names - NOT_IN_A_GROWN_PRESET, f"{where}.{k}")
        else:
            coerce(v, train_key_type(k), f"{where}.{k}")
