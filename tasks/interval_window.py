"""A training window: the daily_data interval partitions a student learns from.

`repartition.days` (the last N days) or `repartition.from_date`..`to_date` name days;
each day's partition is a run of its own (tasks/intervals.py), complete when its targets
finished. The app finds them (amflow.services.daily_window) and hands each day's features
and targets folders and summaries to `day_partition`; `merge_cmvn` sums the feature statistics of several runs (sufficient statistics: the
union's CMVN is their sum).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.config import RepartitionConfig
from core.outcomes import StepError
from core.storage import Storage, join


@dataclass
class Partition:
    """One day's finished partition: where its shards are and what identifies it."""

    date: str
    run_id: str
    features_dir: str  # its features step's folder
    targets_dir: str  # its targets step's folder
    features: dict[str, Any]  # its features step's summary
    targets: dict[str, Any]  # its targets step's summary
    shards: list[dict[str, Any]] = field(default_factory=list)  # features/shards.json entries
    order: list[str] = field(default_factory=list)
    cmvn: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # its features plan's features.*

    def key(self, shard: str) -> str:
        """A shard's name in the student's repartition: unique across partitions."""
        return f"{self.run_id}.{shard}"

    def features_uri(self, shard: str) -> str:
        return join(self.features_dir, "shards", f"{shard}.parquet")

    def targets_uri(self, shard: str) -> str:
        return join(self.targets_dir, "shards", f"{shard}.parquet")

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


def window_asked(rcfg: RepartitionConfig) -> bool:
    return bool(rcfg.days or rcfg.from_date)


def day_partition(st: Storage, date: str, run_id: str, features_dir: str, targets_dir: str,
                  features: dict[str, Any], targets: dict[str, Any]) -> Partition:
    """Day `date`'s partition (run `run_id`): its features and targets folders and their
    summaries, with the shard index, CMVN and feature settings read from the features."""
    index = st.read_json(join(features_dir, "shards.json"))
    cmvn_uri = join(features_dir, "cmvn.json")
    return Partition(date=date, run_id=run_id, features_dir=features_dir,
                     targets_dir=targets_dir, features=features, targets=targets,
                     shards=index.get("shards", []), order=index.get("order", []),
                     cmvn=st.read_json(cmvn_uri) if st.exists(cmvn_uri) else None,
                     settings=_features_settings(st, features_dir))


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
