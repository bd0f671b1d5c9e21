"""`amflow repartition`: join the run's features (and targets) into equal training partitions.

Resolves features/targets through the run layout; the plan, map and reduce stages live in
`tasks.repartition` and fan out over Ray through `map_shards` (below `ray.inline_hours` of
audio, in this process).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from core.raycluster import map_shards, runs_inline
from core.runs import SUCCESS, StepContext, StepError
from amflow.services.daily_window import window_partitions
from tasks.interval_window import Partition, check_settings, merge_cmvn, window_asked
from tasks.repartition import (BUCKETS, SPLIT_ORDER, RepartitionJob, forget_lost_buckets, shard_jobs,
                               plan_fingerprint, plan_reduce_jobs, map_shard, plan_window,
                               reduce_partition, split_indexes)

log = logging.getLogger(__name__)


def _window(ctx: StepContext) -> tuple[list[Partition], list[str]]:
    """The daily_data partitions of the training window (none when no window is asked)."""
    rcfg = ctx.cfg.repartition
    if not window_asked(rcfg):
        return [], []
    found, missing = window_partitions(ctx.storage, ctx.cfg.storage.root,
                                       ctx.cfg.daily.dataset, rcfg)
    check_settings(ctx.storage, ctx.other("features"), found)
    return found, missing


def _sources(index: dict, window: list[Partition]
             ) -> tuple[list[str], dict[str, dict], dict[str, tuple[str, str]]]:
    """(shard order, shard info, {window shard: (features URI, targets URI)}): the run's
    own shards, then each window partition's, named `<run_id>.<shard>`. With a window its
    partitions are the unlabeled data (select leaves the run's own unlabeled out)."""
    own = {s["shard"]: s for s in index["shards"]
           if not (window and s["split"] == "unlabeled")}
    order = [x for x in index["order"] if x in own]
    info = dict(own)
    sources: dict[str, tuple[str, str]] = {}
    for p in window:
        by_name = {s["shard"]: s for s in p.shards}
        for shard in p.order:
            key = p.key(shard)
            order.append(key)
            info[key] = {**by_name[shard], "shard": key}
            sources[key] = (p.features_uri(shard), p.targets_uri(shard))
    return order, info, sources


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    st, rcfg = ctx.storage, ctx.cfg.repartition
    feat = ctx.require("features")
    tsucc = ctx.other("targets", SUCCESS)
    targets = st.read_json(tsucc) if st.exists(tsucc) else None
    window, missing = _window(ctx)
    fp = plan_fingerprint(rcfg, ctx.cfg.train.workers, feat, targets)
    if window:  # which partitions, as made when (another version of one: redone)
        fp["window"] = [[p.run_id, p.digest] for p in window]
    done = ctx.resume_plan(fp)
    if done is not None:
        return done

    index = st.read_json(ctx.other("features", "shards.json"))
    order, info, sources = _sources(index, window)
    present = {s["split"] for s in info.values()}
    splits = [s for s in SPLIT_ORDER if s in present and (not rcfg.splits or s in rcfg.splits)]
    if not splits:
        raise StepError(f"no feature shards for splits {rcfg.splits or 'any'} "
                        f"(features has {sorted(present)})")
    workers = ctx.cfg.train.workers
    with_targets = targets is not None or bool(window)
    plan_jobs, map_jobs, plans = shard_jobs(rcfg, workers, splits, order, info,
                                            targets is not None, sources)
    job = RepartitionJob(ctx.cfg.storage, ctx.other("features"), ctx.other("targets"),
                         ctx.step_uri)
    # below ray.inline_hours of the run's own audio (no window): in this process
    inline = not window and runs_inline(ctx.cfg, feat.get("metrics", {}).get("audio_hours"))
    planned = map_shards(ctx, plan_jobs, plan_window, job, unit="windows", inline=inline)
    mapped = map_shards(ctx, map_jobs, map_shard, job, unit="shards", inline=inline)
    reduce_jobs = plan_reduce_jobs(splits, plans, mapped)
    if forget_lost_buckets(st, ctx.step_uri, reduce_jobs, ctx.force):
        mapped = map_shards(ctx, map_jobs, map_shard, job, unit="shards", inline=inline)
        reduce_jobs = plan_reduce_jobs(splits, plans, mapped)
    stats = map_shards(ctx, reduce_jobs, reduce_partition, job, unit="partitions",
                       inline=inline)
    if sum(s["rows"] for s in stats) != sum(m["out"] for m in mapped):
        raise StepError(f"repartition: partitions hold {sum(s['rows'] for s in stats)} rows "
                        f"but the map stage routed {sum(m['out'] for m in mapped)}: re-run "
                        f"with --force")
    st.delete_dir(ctx.path(BUCKETS))

    entries, per_split = split_indexes(stats, splits, plans, workers, with_targets)
    total_bytes = 0
    for split, entry in entries.items():
        st.write_json(ctx.path(split, "_index.json"), entry)
        total_bytes += sum(p["bytes"] for p in entry["partitions"])
    window_metrics = write_window(ctx, window, missing)
    reasons: dict[str, int] = {}
    for m in mapped:
        for k, v in m["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    hours_total = sum(p["hours"] for p in plans.values())
    wall = time.time() - ctx.started
    return ctx.finish(
        inputs={"features": ctx.other("features", SUCCESS),
                "targets": tsucc if targets else None, "workers": workers,
                **({"window": [p.run_id for p in window]} if window else {})},
        counts={"in": sum(m["in"] for m in mapped), "out": sum(m["out"] for m in mapped),
                "rejected": sum(m["rejected"] for m in mapped)},
        metrics={"splits": per_split, "reject_reasons": reasons,
                 "targets": targets is not None, "partitions": len(stats),
                 "shards_read": len(mapped),
                 "windows": len(planned),
                 "window_frames_spread_max": max((p["frames_spread"] for p in planned),
                                                 default=0),
                 "bucket_bytes": sum(m["bucket_bytes"] for m in mapped),
                 "audio_hours": round(hours_total, 6),
                 "xrt": round(hours_total * 3600.0 / wall, 2) if wall > 0 else None,
                 **window_metrics},
        bytes_written=total_bytes)


def write_window(ctx: StepContext, window: list[Partition], missing: list[str]
                 ) -> dict[str, Any]:
    """With a window: `window.json` (the partitions learned from, with their digests: the
    model card copies it) and `cmvn.json`, the union's CMVN (the run's features and the
    window's), which the trainer then normalises with. Returns the window's metrics."""
    if not window:
        return {}
    st = ctx.storage
    entries = [p.card_entry() for p in window]
    st.write_json(ctx.path("window.json"), {"dataset": ctx.cfg.daily.dataset,
                                            "intervals": entries, "missing_days": missing})
    own = ctx.other("features", "cmvn.json")
    st.write_json(ctx.path("cmvn.json"),
                  merge_cmvn([st.read_json(own) if st.exists(own) else None,
                              *(p.cmvn for p in window)]))
    teachers = sorted({str(e["teacher_digest"]) for e in entries})
    if len(teachers) > 1:  # e.g. a backfill after a new teacher that has not reached all days
        log.warning("repartition: the window's partitions were scored by %d teachers (%s): "
                    "re-score them (airflow backfill create --dag-id daily_data "
                    "--reprocess-behavior completed ...) to learn from one", len(teachers),
                    ", ".join(teachers))
    return {"window_intervals": len(window), "window_missing_days": len(missing),
            "window_teachers": teachers,
            "window_first": window[0].date, "window_last": window[-1].date,
            "window_hours": round(sum(e["audio_hours"] for e in entries), 6)}
