"""A run remembers its settings: `runs/<id>/_run.json`.

The first step of a run records the config file it was given (its absolute path and
digest) and the `--set` overrides that describe the run: every key but the ones that
name which model a step works on (`INSTANCE_KEYS`) and those in the sections the step
reads itself (its own `--set`s live in its `_config.json`). Every later step of that run starts
from that record, so `amflow <step> --run-id R` alone is enough (with the default
storage root; a run under another root is found with `--config` or
`--set storage.root=...`).

The keys that name which model a step works on are the run's first step's unless a
command names its own (`amflow decode --run-id R` decodes the model R started with).

A later `--set` (or another `--config`) that changes a key a finished step of the run
read is refused, naming the key, the step and the value it ran with: the run's outputs
would no longer agree with its settings. `--force` lets it through and writes the change
into the record's history (`amflow config show --run-id R` prints it). Changes to keys no
finished step read become run settings for the steps after.

With model.size auto, every resolution of the run's config takes the size the run chose
(`runs/<id>/_size.json`, amflow.model_size), so a size is no change between its steps.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amflow.model_size import auto_hours, sized
from core.config import ConfigError, Config, resolve_config
from core.config.loading import Resolved
from core.runs import SUCCESS, run_uri, step_dir_of
from core.storage import Storage, basename, join

RUN_RECORD = "_run.json"

# Keys that say which model or output folder of the run a step works on: the teacher and
# the baseline are two trainings of one run, so these differ from step to step by design.
# decode.chunking says which chunking of a Conformer a decode or serve runs (each its own
# decode.tag), as train.tag says which training.
INSTANCE_KEYS = frozenset({"train.model", "train.regime", "train.recipe", "train.tag", "train.pseudolabels",
                           "train.init_model", "decode.tag", "evaluate.tag", "export.tag",
                           "decode.chunking"})

def is_instance_key(key: str) -> bool:
    return key in INSTANCE_KEYS or key.endswith(".tag")


def sections_read(step: str) -> tuple[str, ...]:
    """The config sections a step's outputs depend on: its own and those its registry
    entry names (`config_sections`)."""
    from amflow.steps.registry import STEPS

    spec = STEPS.get(step)
    return (step, *(spec.config_sections if spec else ()))


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].strip()


def _file_digest(path: str | None) -> str:
    if not path or not Path(path).exists():
        return ""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _now() -> str:
    return dt.datetime.now(tz=dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Change:
    key: str
    before: Any
    after: Any


@dataclass
class RunSettings:
    """The record of one run, and the rules for a step that joins it."""
    storage: Storage
    uri: str                                  # the run's folder
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, cfg: Config, run_id: str) -> RunSettings:
        storage = Storage(cfg.storage)
        uri = run_uri(cfg, run_id)
        rec_uri = join(uri, RUN_RECORD)
        record = storage.read_json(rec_uri) if storage.exists(rec_uri) else {}
        return cls(storage, uri, record)

    @property
    def known(self) -> bool:
        return bool(self.record)

    @property
    def config_path(self) -> str | None:
        return self.record.get("config") or None

    @property
    def sets(self) -> list[str]:
        return list(self.record.get("sets", []))

    @property
    def model(self) -> list[str]:
        """The run's first step's model keys (train.model, train.tag, ...): what a later
        command that names no model works on."""
        return list(self.record.get("model", []))

    def finished_steps(self) -> list[str]:
        """The step folders of this run that have a `_SUCCESS.json`."""
        return [basename(d) for d in self.storage.subdirs(self.uri)
                if self.storage.exists(join(d, SUCCESS))]

    def recorded_config(self, folder: str) -> dict[str, Any] | None:
        from core.config.explain import CONFIG_RECORD

        uri = join(self.uri, folder, CONFIG_RECORD)
        return self.storage.read_json(uri) if self.storage.exists(uri) else None

    def remember(self, config_path: str | None, overrides: list[str], step: str,
                 forced: list[Change], folder: str = "") -> None:
        """Write the record: the first step's config and run-wide sets, later steps' new
        run-wide sets (a key set again replaces its value), and forced changes. What a
        step sets in the sections it reads itself (`amflow evaluate --set
        evaluate.baseline=...`, train.* of train-baseline) is that step's, kept in its own
        `_config.json`, not the run's: run again without it, it is gone."""
        own = sections_read(step)
        run_sets = [s for s in overrides if not is_instance_key(_key_of(s))
                    and _key_of(s).split(".")[0] not in own]
        rec = dict(self.record) or {"config": config_path, "config_digest":
                                    _file_digest(config_path), "created": _now(),
                                    "first_step": step, "sets": [], "history": [],
                                    "model": [s for s in overrides
                                              if is_instance_key(_key_of(s))]}
        kept = {_key_of(s): s for s in rec.get("sets", [])}
        kept.update({_key_of(s): s for s in run_sets})
        if rec.get("sets") != list(kept.values()) or forced or not self.record:
            rec["sets"] = list(kept.values())
            if forced:
                rec.setdefault("history", []).append({
                    "time": _now(), "step": step, "forced": True,
                    "changed": {c.key: [c.before, c.after] for c in forced}})
            self.storage.write_json(join(self.uri, RUN_RECORD), rec)
            self.record = rec


def step_name_of(folder: str) -> str:
    """The step a run folder belongs to (`train-teacher` -> train), "" when none."""
    from amflow.steps.registry import STEPS

    steps = STEPS
    name = folder
    while name and name not in steps:
        name = name.rpartition("-")[0]
    return name


def changed_keys(before: Config, after: Config) -> list[Change]:
    """Every user key whose value differs between two resolved configs."""
    from core.config.schema import user_keys

    out = []
    for key, _ in user_keys():
        a, b = before.get(key), after.get(key)
        if a != b:
            out.append(Change(key, a, b))
    return out


def conflicts(settings: RunSettings, step: str, folder: str, changes: list[Change],
              interval_run: bool = False) -> list[tuple[Change, str]]:
    """Why each change would make a finished step of the run disagree with its settings:
    the step read the key's section and ran with another value. A sibling (the same step
    with another tag, e.g. train-baseline beside train-teacher) is its own model. In an
    interval's run (daily_data's partition: `interval_run`), the per-interval steps are
    keyed by their inputs and redo what changed when they next run (targets after a new
    teacher): a change to what they read is the point of a reprocessing backfill."""
    from amflow.steps.registry import STEPS

    out = []
    for done in settings.finished_steps():
        name = step_name_of(done)
        if not name or (name == step and done != folder) or (interval_run and STEPS[name].per_interval):
            continue
        record = settings.recorded_config(done)
        if record is None:
            continue
        ran = _ran_with(record)
        for c in changes:
            if is_instance_key(c.key) or c.key.split(".")[0] not in sections_read(name):
                continue
            if ran.get(c.key) != c.after:
                out.append((Change(c.key, ran.get(c.key), c.after),
                            f"{c.key} = {c.after!r} would change the inputs of step "
                            f"{done!r}, which finished with {c.key} = {ran.get(c.key)!r}"))
    return out


def _ran_with(record: dict[str, Any]) -> Config:
    """The config a finished step recorded (`<run>/<step>/_config.json`)."""
    from core.config.coercion import build

    return build(Config, record["config"], "")


def settle(cfg_path: str | None, default_path: str | None, overrides: list[str],
           step_sets: list[str], run_id: str | None, step: str, force: bool,
           names_model: bool = False
           ) -> tuple[Resolved, RunSettings | None, list[Change], str | None]:
    """The config `amflow <step> --run-id R` runs with: the run's record (its config file
    and run-wide sets) under this command's overrides. Refuses (ConfigError naming the key
    and the finished step) a change a finished step read, unless `force`. Returns the
    resolved config, the run's settings, the changes forced through and the config path.
    `names_model`: the command names its model (`--model train-baseline`), so the run's
    first model keys (decode.tag=teacher of a teacher run) are not its."""
    here = cfg_path or default_path
    first = resolve_config(here, [*overrides, *step_sets])
    if not run_id or "/" in run_id:
        return sized(first, here, [*overrides, *step_sets]), None, [], here
    settings = RunSettings.open(first.config, run_id)
    if not settings.known:
        return sized(first, here, [*overrides, *step_sets], run_id), settings, [], here
    path = cfg_path or settings.config_path
    if path and not Path(path).exists():
        raise ConfigError("storage.root", f"run {run_id!r} was started with --config {path}, "
                          "which no longer exists: give --config")
    instance = [s for s in overrides if is_instance_key(_key_of(s))]
    model = [] if instance or names_model else settings.model  # else the run's first one
    resolved = resolve_config(path, [*settings.sets, *model, *overrides, *step_sets])
    hours = auto_hours(resolved.config, run_id)  # model.size auto: the run's one size
    before = resolve_config(settings.config_path,
                            [*settings.sets, *model, *instance, *step_sets], hours)
    if hours is not None:
        resolved = resolve_config(path, [*settings.sets, *model, *overrides, *step_sets], hours)
    changes = [c for c in changed_keys(before.config, resolved.config)
               if not is_instance_key(c.key)]
    folder = step_dir_of(step, resolved.config)
    found = conflicts(settings, step, folder, changes,
                      interval_run=bool(resolved.config.select.interval_start))
    if found and not force:
        raise ConfigError(
            found[0][0].key, f"run {run_id!r} remembers its settings ({join(settings.uri, RUN_RECORD)}): "
            + "; ".join(why for _, why in found) + ". Use another --run-id, or --force to "
            "record the change (this step is then redone; the finished steps are not)")
    forced = list({c.key: c for c, _ in found}.values())
    return resolved, settings, forced, path
