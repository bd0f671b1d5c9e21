"""A training window: the daily_data interval partitions a student learns from.

`repartition.days` (the last N days) or `repartition.from_date`..`to_date` name days;
each day's partition is the run `<storage.root>/runs/<daily.dataset>-YYYY-MM-DD/`
(tasks/intervals.py), complete when its targets finished. `window_partitions` finds them
and says which days of the window have none (no audio that day, or not processed yet);
`merge_cmvn` sums the feature statistics of several runs (sufficient statistics: the
union's CMVN is their sum).
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.outcomes import SUCCESS, StepError
from core.storage import Storage, join
from tasks.intervals import IntervalError, day_runs, window_dates

log = logging.getLogger(__name__)


@dataclass
class Partition:
    """One day's finished partition: where its shards are and what identifies it."""

    date: str
    run_id: str
    run_uri: str
    features: dict[str, Any]  # its features/_SUCCESS.json
    targets: dict[str, Any]  # its targets/_SUCCESS.json
    shards: list[dict[str, Any]] = field(default_factory=list)  # features/shards.json entries
    order: list[str] = field(default_factory=list)
    cmvn: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # its features plan's features.*

    def key(self, shard: str) -> str:
        """A shard's name in the student's repartition: unique across partitions."""
        return f"{self.run_id}.{shard}"

    def features_uri(self, shard: str) -> str:
        return join(self.run_uri, "features", "shards", f"{shard}.parquet")

    def targets_uri(self, shard: str) -> str:
        return join(self.run_uri, "targets", "shards", f"{shard}.parquet")

    @property
    def digest(self) -> str:
        """Its identity: the digest of its features' and targets' summaries (what they
        were made from and when); a partition made again has another."""
        blob = json.dumps([self.features, self.targets], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def card_entry(self) -> dict[str, Any]:
        """What a model card records of it."""
        m = self.features.get("metrics", {})
        return {"date": self.date, "run_id": self.run_id, "digest": self.digest,
                "teacher_digest": self.targets.get("inputs", {}).get("teacher_digest"),
                "utts": self.targets.get("counts", {}).get("out", 0),
                "audio_hours": m.get("audio_hours", 0.0),
                "features_finished_at": self.features.get("finished_at"),
                "targets_finished_at": self.targets.get("finished_at")}


def window_asked(rcfg: Any) -> bool:
    return bool(rcfg.days or rcfg.from_date)


def window_partitions(st: Storage, root: str, dataset: str, rcfg: Any
                      ) -> tuple[list[Partition], list[str]]:
    """(the finished partitions of the window's days, oldest first; the days of the
    window without one). A StepError when a window is asked for and none is there."""
    runs_uri = join(root, "runs")
    runs = day_runs([u.rsplit("/", 1)[-1] for u in st.subdirs(runs_uri)], dataset)
    done = {d: r for d, r in runs.items()
            if st.exists(join(runs_uri, r, "targets", SUCCESS))}
    try:
        dates = window_dates(rcfg.days, rcfg.from_date, rcfg.to_date, max(done, default=None))
    except IntervalError as exc:
        raise StepError(str(exc)) from exc
    found = [_partition(st, runs_uri, d, done[d]) for d in dates if d in done]
    missing = [d for d in dates if d not in done]
    if not found:
        raise StepError(
            f"repartition.days={rcfg.days} / from_date={rcfg.from_date!r} / to_date="
            f"{rcfg.to_date!r}: no finished daily_data partition ({runs_uri}/{dataset}-"
            f"YYYY-MM-DD/targets/_SUCCESS.json) for the days {dates[:1]}..{dates[-1:]} "
            f"(partitions with targets: {sorted(done)[:5] or 'none'}); run daily_data for "
            f"them (airflow backfill create --dag-id daily_data ...) or change the keys")
    if missing:
        log.warning("repartition: %d of the window's %d days have no finished daily_data "
                    "partition (no audio, or not processed yet): %s", len(missing), len(dates),
                    ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    return found, missing


def _partition(st: Storage, runs_uri: str, date: str, run_id: str) -> Partition:
    run = join(runs_uri, run_id)
    index = st.read_json(join(run, "features", "shards.json"))
    cmvn_uri = join(run, "features", "cmvn.json")
    return Partition(date=date, run_id=run_id, run_uri=run,
                     features=st.read_json(join(run, "features", SUCCESS)),
                     targets=st.read_json(join(run, "targets", SUCCESS)),
                     shards=index.get("shards", []), order=index.get("order", []),
                     cmvn=st.read_json(cmvn_uri) if st.exists(cmvn_uri) else None,
                     settings=_features_settings(st, join(run, "features")))


def _features_settings(st: Storage, features_uri: str) -> dict[str, Any]:
    """The features.* a run's features were made with (its _plan.json), label keys
    aside: they shape the labels of labeled rows, not the features."""
    uri = join(features_uri, "_plan.json")
    plan = st.read_json(uri) if st.exists(uri) else {}
    return {k: v for k, v in (plan.get("features") or {}).items()
            if k not in ("labels", "label_frame_tolerance")}


def check_settings(st: Storage, own_features_uri: str, found: list[Partition]) -> None:
    """The window's features must be the student's kind of features (same fbank, stacking,
    storage): a StepError naming the keys that differ."""
    own = _features_settings(st, own_features_uri)
    for p in found:
        diff = sorted(k for k in set(own) | set(p.settings) if own.get(k) != p.settings.get(k))
        if own and p.settings and diff:
            raise StepError(
                f"daily_data partition {p.run_id} was made with other features settings "
                f"than this run ({', '.join(f'features.{k}' for k in diff[:6])}): run "
                f"daily_data with the same features.* as the student, or leave it out of "
                f"the window (repartition.from_date / to_date)")


def merge_cmvn(stats: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The CMVN statistics of a union: counts, sums and sums of squares added."""
    have = [s for s in stats if s and s.get("count")]
    if not have:
        raise StepError("no CMVN statistics to merge: every source has zero frames")
    dims = {len(s["sum"]) for s in have}
    if len(dims) != 1:
        raise StepError(f"the window's features differ in dimension ({sorted(dims)}): they "
                        "were made with other features.* settings")
    out = {"count": int(sum(s["count"] for s in have)),
           "sum": np.sum([s["sum"] for s in have], axis=0).tolist(),
           "sumsq": np.sum([s["sumsq"] for s in have], axis=0).tolist(),
           "dim": dims.pop()}
    out["splits"] = sorted({x for s in have for x in s.get("splits", [])})
    return out
