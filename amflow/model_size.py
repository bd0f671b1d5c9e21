"""model.size auto in a run: the corpus's hours found, the size chosen once per run.

The config layer chooses a row of configs/presets/sizes.yaml from the corpus's hours
(core/config/sizes.py); this module finds the hours, for every step that resolves a
config (amflow.cli, amflow.run_settings, `amflow config show`):

1. the run's record, `runs/<id>/_size.json`: the size its first step chose, kept for
   every later step of the run (the corpus may grow in between: a teacher trained at
   3 x 256 stays 3 x 256 for the targets, decode and export steps' configs; they load
   the model's shape from its model card in any case);
2. the corpus's `_SUCCESS.json` (`amflow import`, `amflow corpus`): the seconds of its
   labeled and unlabeled splits (train.labeled_split, train.unlabeled_split), each
   counted at most select.hours. The corpus's, not a run's selection, so the teacher run
   and the SSL run of `amflow run ssl` (which select other splits) choose the same size;
3. a corpus without one (metadata written by other tools): the run's select summary
   (the hours it selected per split).

None of them (the corpus not made yet, no run): the hours are not known and auto takes
no row (the schema's defaults); the steps before select read no model or train key. A
run that trained a model with no record (before model.size existed) keeps the defaults.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from core.config import Config, resolve_config
from core.config.loading import Resolved
from core.config.sizes import AUTO, NONE, CorpusHours, why
from core.outcomes import SUCCESS
from core.runs import Run
from core.storage import Storage, basename, join

SIZE_RECORD = "_size.json"


def resolve_sized(path: str | None, overrides: list[str],
                  run_id: str | None = None) -> Resolved:
    """resolve_config, with model.size auto taken from the hours `auto_hours` finds."""
    return sized(resolve_config(path, overrides), path, overrides, run_id)


def sized(resolved: Resolved, path: str | None, overrides: list[str],
          run_id: str | None = None) -> Resolved:
    """`resolved` (resolve_config of `path` and `overrides`) again with the corpus's hours
    when its model.size is auto and they are known; else as it is."""
    hours = auto_hours(resolved.config, run_id)
    return resolved if hours is None else resolve_config(path, overrides, hours)


def auto_hours(cfg: Config, run_id: str | None = None) -> CorpusHours | None:
    """The hours model.size auto chooses from (the module doc's order); None when the
    size is named, or the hours are not known."""
    if cfg.model.size != AUTO:
        return None
    st = Storage(cfg.storage)
    if run_id:
        record = _record(st, cfg, run_id)
        if record is not None:
            return record
        if _trained_unsized(st, cfg, run_id):
            return None
    return _corpus_hours(st, cfg) or (_selected_hours(st, cfg, run_id) if run_id else None)


def _record_uri(cfg: Config, run_id: str) -> str:
    return join(Run(cfg.storage.root, run_id).uri, SIZE_RECORD)


def _record(st: Storage, cfg: Config, run_id: str) -> CorpusHours | None:
    uri = _record_uri(cfg, run_id)
    if not st.exists(uri):
        return None
    rec = st.read_json(uri)
    return CorpusHours(float(rec["labeled_hours"]), float(rec["unlabeled_hours"]),
                       f"kept for the run: {uri}", str(rec["size"]))


def _trained_unsized(st: Storage, cfg: Config, run_id: str) -> bool:
    """Whether a model of the run finished without a size record: trained before
    model.size existed (or with the hours unknown), at the schema's defaults, which the
    rest of the run keeps (its finished steps recorded model.size auto)."""
    return any(basename(d).split("-")[0] in ("train", "sequence")
               and st.exists(join(d, SUCCESS))
               for d in st.subdirs(Run(cfg.storage.root, run_id).uri))


def _corpus_hours(st: Storage, cfg: Config) -> CorpusHours | None:
    uri = join(cfg.data.corpus, SUCCESS)
    if not st.exists(uri):
        return None
    seconds = st.read_json(uri).get("split_seconds")
    if not isinstance(seconds, dict):  # a corpus summary from before it kept them
        return None
    cap = cfg.select.hours  # a run selects at most that many hours of the corpus
    return _hours({k: min(float(v) / 3600.0, cap) for k, v in seconds.items()}, cfg, uri)


def _selected_hours(st: Storage, cfg: Config, run_id: str) -> CorpusHours | None:
    run = Run(cfg.storage.root, run_id)
    summary = run.summary(st, "select")
    if summary is None:
        return None
    per_split = summary.get("metrics", {}).get("per_split", {})
    return _hours({k: float(v.get("hours", 0.0)) for k, v in per_split.items()}, cfg,
                  run.success("select"))


def _hours(by_split: dict[str, float], cfg: Config, source: str) -> CorpusHours:
    b = cfg.train.batches
    return CorpusHours(round(by_split.get(b.labeled_split, 0.0), 4),
                       round(by_split.get(b.unlabeled_split, 0.0), 4), source)


def remember_size(storage: Storage, cfg: Config, run_id: str, resolved: Resolved) -> None:
    """The first step of a run that chose the size from the corpus's hours records the
    choice (`runs/<id>/_size.json`); every later step of the run reads it instead of the
    corpus (auto_hours), so the run keeps one size."""
    hours = resolved.hours
    if hours is None or hours.size:  # not chosen from hours, or read from the record
        return
    uri = _record_uri(cfg, run_id)
    if storage.exists(uri):
        return
    storage.write_json(uri, {
        "size": resolved.config.model.size, "why": why(hours),
        "labeled_hours": hours.labeled, "unlabeled_hours": hours.unlabeled,
        "hours_from": hours.source,
        "chosen": dt.datetime.now(tz=dt.timezone.utc).isoformat(timespec="seconds")})


def size_summary(storage: Storage, cfg: Config, run_id: str) -> dict[str, Any]:
    """What a training's summary says of its size: {size, why} (and where the hours
    were read, when they chose it)."""
    size = cfg.model.size
    uri = _record_uri(cfg, run_id)
    record = storage.read_json(uri) if storage.exists(uri) else None
    if record is not None and record.get("size") == size:
        return {"size": size, "why": record["why"], "hours_from": record["hours_from"],
                "kept_in": uri}
    if size == AUTO:
        reason = ("auto, but the corpus's hours are not known (no corpus _SUCCESS.json, no "
                  "finished select step): the schema's defaults")
    elif size == NONE:
        reason = "none: the config's own values over the schema's defaults"
    else:
        reason = f"{size}: named by model.size"
    return {"size": size, "why": reason}
