"""`amflow repartition`: join the run's features (and targets) into equal training partitions.

Resolves features/targets through the run layout; the plan, map and reduce stages live in
`tasks.repartition` and fan out over Ray through `map_shards`.
"""
from __future__ import annotations

import time
from typing import Any

from core.raycluster import map_shards
from core.runs import SUCCESS, StepContext, StepError
from tasks.repartition import (BUCKETS, SPLIT_ORDER, forget_lost_buckets, shard_jobs,
                               plan_fingerprint, plan_reduce_jobs, map_shard, plan_window,
                               reduce_partition, split_indexes)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    st, rcfg = ctx.storage, ctx.cfg.repartition
    feat = ctx.require("features")
    tsucc = ctx.other("targets", SUCCESS)
    targets = st.read_json(tsucc) if st.exists(tsucc) else None
    fp = plan_fingerprint(ctx, feat, targets)
    done = ctx.resume_plan(fp)
    if done is not None:
        return done

    index = st.read_json(ctx.other("features", "shards.json"))
    order = index["order"]
    info = {s["shard"]: s for s in index["shards"]}
    present = {s["split"] for s in index["shards"]}
    splits = [s for s in SPLIT_ORDER if s in present and (not rcfg.splits or s in rcfg.splits)]
    if not splits:
        raise StepError(f"no feature shards for splits {rcfg.splits or 'any'} "
                        f"(features has {sorted(present)})")
    workers = ctx.cfg.train.workers
    plan_jobs, map_jobs, plans = shard_jobs(rcfg, workers, splits, order, info, targets is not None)
    planned = map_shards(ctx, plan_jobs, plan_window, ctx, unit="windows")
    mapped = map_shards(ctx, map_jobs, map_shard, ctx, unit="shards")
    reduce_jobs = plan_reduce_jobs(splits, plans, mapped)
    if forget_lost_buckets(ctx, reduce_jobs):
        mapped = map_shards(ctx, map_jobs, map_shard, ctx, unit="shards")
        reduce_jobs = plan_reduce_jobs(splits, plans, mapped)
    stats = map_shards(ctx, reduce_jobs, reduce_partition, ctx, unit="partitions")
    if sum(s["rows"] for s in stats) != sum(m["out"] for m in mapped):
        raise StepError(f"repartition: partitions hold {sum(s['rows'] for s in stats)} rows "
                        f"but the map stage routed {sum(m['out'] for m in mapped)}: re-run "
                        f"with --force")
    st.delete_dir(ctx.path(BUCKETS))

    entries, per_split = split_indexes(stats, splits, plans, workers, targets is not None)
    total_bytes = 0
    for split, entry in entries.items():
        st.write_json(ctx.path(split, "_index.json"), entry)
        total_bytes += sum(p["bytes"] for p in entry["partitions"])
    reasons: dict[str, int] = {}
    for m in mapped:
        for k, v in m["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    hours_total = sum(p["hours"] for p in plans.values())
    wall = time.time() - ctx.started
    return ctx.finish(
        inputs={"features": ctx.other("features", SUCCESS),
                "targets": tsucc if targets else None, "workers": workers},
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
                 "xrt": round(hours_total * 3600.0 / wall, 2) if wall > 0 else None},
        bytes_written=total_bytes)
