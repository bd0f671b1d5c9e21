"""`amflow repartition`: join features with targets into equal-size training partitions.

Reads  `runs/<R>/features/shards/*.parquet` (+ `shards.json`), and when
       `runs/<R>/targets/_SUCCESS.json` exists, `runs/<R>/targets/shards/<shard>.parquet`
       (records.TARGET_SCHEMA, matched to the feature rows by utt_id).
Writes `runs/<R>/repartition/<split>/part-<i>.parquet`  rows in PARTITION_SCHEMA
       `runs/<R>/repartition/<split>/_index.json`      partitions with rows/frames/bytes
       `runs/<R>/repartition/rejects/<part>.parquet`, `_shards/<part>.json`, `_SUCCESS.json`

Rows are the feature rows (records.FEATURE_SCHEMA, hard `labels` for labeled data) plus
the soft-target columns `k`, `topk_idx`, `topk_logit` (null without targets).

Per split (all splits the features step produced, or `repartition.splits`):
- partition count P = ceil(split audio hours / partition_hours), rounded up to a multiple
  of `train.workers` (and at least `train.workers`), so every worker gets as many;
- the split's utterances are shuffled again (seed `repartition.seed`, per split) and each,
  in that order, goes to the partition with the fewest frames so far: partitions differ
  by at most one utterance's frames, and each partition's rows stay in shuffled order;
- a map/reduce shuffle, so every input is read once whatever the partition count: one
  Ray task per feature shard (`map_shard`) reads the shard and its target shard, joins
  them, applies the reject rules and writes one bucket per partition it feeds
  (`_buckets/<split>/part-<i>/<shard>.parquet`, rows tagged with their planned
  position); then one task per partition (`reduce_partition`) concatenates its buckets
  in planned order and writes the partition atomically. Both stages go through
  `map_shards`, so a re-run skips finished shards and partitions; the buckets are deleted
  once every partition is written.
A target row whose frame count differs from its feature row is rejected
(`target_mismatch`); an unlabeled row without a target row, when targets exist, is
rejected (`missing_targets`). Counts: in = feature rows of the partitioned splits.

`plan_partitions(utts, frames, parts, seed)` is the pure core.
"""
from __future__ import annotations

import heapq
import logging
import math
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from amflow import records
from amflow.raycluster import map_shards
from amflow.runs import SUCCESS, Reject, StepContext, StepError, rejects_table

log = logging.getLogger(__name__)

BUCKETS = "_buckets"
SPLIT_ORDER = ("labeled", "unlabeled", "dev", "test")
PARTITION_SCHEMA = pa.schema(list(records.FEATURE_SCHEMA) + [
    pa.field("k", pa.int16()), pa.field("topk_idx", pa.binary()),
    pa.field("topk_logit", pa.binary())])


def partition_count(audio_hours: float, partition_hours: float, workers: int) -> int:
    n = max(1, math.ceil(audio_hours / partition_hours - 1e-9))
    return max(workers, workers * math.ceil(n / workers))


def plan_partitions(frames: np.ndarray, parts: int, seed: int) -> list[np.ndarray]:
    """Utterance indices per partition: shuffled, then greedily balanced by frames."""
    order = np.random.default_rng(seed).permutation(len(frames))
    heap = [(0, i) for i in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for u in order:
        load, i = heapq.heappop(heap)
        out[i].append(int(u))
        heapq.heappush(heap, (load + int(frames[u]), i))
    return [np.array(p, dtype=np.int64) for p in out]


def _plan_fingerprint(ctx: StepContext, feat: dict, targets: dict | None) -> dict:
    r = ctx.cfg.repartition
    return {"workers": ctx.cfg.train.workers, "partition_hours": r.partition_hours,
            "seed": r.seed, "splits": r.splits,
            "features_finished_at": feat.get("finished_at"),
            "targets_finished_at": targets.get("finished_at") if targets else None}


def _assignments(plan: list[np.ndarray], utt_shard: list[str], utt_ids: list[str]
                 ) -> dict[str, dict[str, tuple[int, int]]]:
    """shard -> {utt_id: (partition, position in it)}: what each map task routes where."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for part, idx in enumerate(plan):
        for pos, j in enumerate(idx.tolist()):
            out.setdefault(utt_shard[j], {})[utt_ids[j]] = (part, pos)
    return out


def _bucket_uri(ctx: StepContext, split: str, part: int, shard: str) -> str:
    return ctx.path(BUCKETS, split, f"part-{part:05d}", f"{shard}.parquet")


def _join_targets(feats: pa.Table, targets: pa.Table | None, shard: str, split: str
                  ) -> tuple[pa.Table, list[Reject]]:
    """Feature rows + their soft-target columns; mismatched or missing targets rejected."""
    n = feats.num_rows
    cols = {name: feats.column(name) for name in records.FEATURE_SCHEMA.names}
    if targets is None:
        for f in PARTITION_SCHEMA:
            if f.name not in cols:
                cols[f.name] = pa.nulls(n, f.type)
        return pa.table(cols, schema=PARTITION_SCHEMA), []
    at = pc.index_in(feats.column("utt_id").combine_chunks(),
                     value_set=targets.column("utt_id").combine_chunks())
    has = at.is_valid().to_numpy(zero_copy_only=False)
    idx = at.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    ffr = feats.column("num_frames").to_numpy()
    tfr = targets.column("num_frames").to_numpy()[idx] if targets.num_rows else ffr
    mismatch = has & (tfr != ffr)
    missing = ~has & (split == "unlabeled")
    utts = feats.column("utt_id").to_pylist()
    rejects = [Reject(utts[i], "target_mismatch",
                      f"{tfr[i]} target rows vs {ffr[i]} feature rows", shard)
               for i in np.flatnonzero(mismatch)]
    rejects += [Reject(utts[i], "missing_targets",
                       f"no row in targets/shards/{shard}.parquet", shard)
                for i in np.flatnonzero(missing)]
    mask = pa.array(has)
    for name in ("k", "topk_idx", "topk_logit"):
        taken = targets.column(name).combine_chunks().take(pa.array(idx)) \
            if targets.num_rows else \
            pa.nulls(n, PARTITION_SCHEMA.field(name).type)
        cols[name] = pc.if_else(mask, taken, pa.nulls(n, PARTITION_SCHEMA.field(name).type))
    keep = pa.array(~(mismatch | missing))
    return pa.table(cols, schema=PARTITION_SCHEMA).filter(keep), rejects


def map_shard(ctx: StepContext, map_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Read one feature shard (and its targets) once; write one bucket per partition."""
    t0 = time.perf_counter()
    st, shard, split = ctx.storage, payload["shard"], payload["split"]
    feats = st.read_parquet(ctx.other("features", "shards", f"{shard}.parquet"))
    targets = None
    if payload["targets"]:
        turi = ctx.other("targets", "shards", f"{shard}.parquet")
        targets = st.read_parquet(turi) if st.exists(turi) else \
            records.TARGET_SCHEMA.empty_table()
    assign: dict[str, list[int]] = payload["assign"]
    unplanned = [u for u in feats.column("utt_id").to_pylist() if u not in assign]
    if unplanned or feats.num_rows != len(assign):
        raise StepError(f"{map_id}: feature shard {shard} changed since it was planned "
                        f"({feats.num_rows} rows, {len(assign)} planned, e.g. "
                        f"{unplanned[:3]} unplanned): re-run with --force")
    table, rejects = _join_targets(feats, targets, shard, split)
    where = np.array([assign[u] for u in table.column("utt_id").to_pylist()],
                     dtype=np.int64).reshape(-1, 2)
    table = table.append_column("_pos", pa.array(where[:, 1]))
    buckets: list[int] = []
    nbytes = 0
    for part in np.unique(where[:, 0]).tolist():
        rows = table.filter(pa.array(where[:, 0] == part))
        nbytes += st.write_parquet(_bucket_uri(ctx, split, part, shard), rows)
        buckets.append(int(part))
    st.write_parquet(ctx.path("rejects", f"{map_id}.parquet"), rejects_table(rejects))
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {"split": split, "source": shard, "in": feats.num_rows, "out": table.num_rows,
            "rejected": len(rejects), "reasons": reasons, "buckets": buckets,
            "bucket_bytes": nbytes, "wall_s": round(time.perf_counter() - t0, 4)}


def reduce_partition(ctx: StepContext, part_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Concatenate one partition's buckets in planned order and write it."""
    t0 = time.perf_counter()
    st, split, part = ctx.storage, payload["split"], payload["part"]
    pieces = [st.read_parquet(_bucket_uri(ctx, split, part, shard))
              for shard in payload["shards"]]
    table = pa.concat_tables(pieces) if pieces else \
        PARTITION_SCHEMA.append(pa.field("_pos", pa.int64())).empty_table()
    table = table.sort_by("_pos").drop_columns(["_pos"])
    nbytes = st.write_parquet(ctx.path(split, f"part-{part:05d}.parquet"), table)
    return {"split": split, "name": f"part-{part:05d}", "rows": table.num_rows,
            "frames": int(pc.sum(table.column("num_frames")).as_py() or 0),
            "bytes": nbytes, "with_targets": table.num_rows - table.column("k").null_count,
            "wall_s": round(time.perf_counter() - t0, 4)}


def _reduce_jobs(splits: list[str], plans: dict[str, dict], mapped: list[dict]
                 ) -> list[tuple[str, dict]]:
    feeds: dict[tuple[str, int], list[str]] = {}
    for m in mapped:
        for part in m["buckets"]:
            feeds.setdefault((m["split"], part), []).append(m["source"])
    return [(f"{split}-part-{i:05d}", {"split": split, "part": i,
                                       "shards": feeds.get((split, i), [])})
            for split in splits for i in range(plans[split]["parts"])]


def _forget_lost_buckets(ctx: StepContext, reduce_jobs: list[tuple[str, dict]]) -> bool:
    """Un-mark the map tasks whose buckets an unfinished partition needs but are gone.

    Buckets are deleted once every partition is written; a partition lost after that
    (or a half-cleaned step directory) needs its source shards mapped again.
    """
    st = ctx.storage
    have = set(st.list(ctx.path(BUCKETS), suffix=".parquet", recursive=True))
    lost: set[str] = set()
    for part_id, job in reduce_jobs:
        if ctx.shard_done(part_id) is not None:
            continue
        lost |= {shard for shard in job["shards"]
                 if _bucket_uri(ctx, job["split"], job["part"], shard) not in have}
    for shard in sorted(lost):
        st.delete(ctx.shard_marker(f"map-{shard}"))
    if lost:
        log.warning("repartition: buckets of %d shards are gone; mapping them again", len(lost))
    return bool(lost)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    st, rcfg = ctx.storage, ctx.cfg.repartition
    feat = ctx.require("features")
    tsucc = ctx.other("targets", SUCCESS)
    targets = st.read_json(tsucc) if st.exists(tsucc) else None
    plan_uri = ctx.path("_plan.json")
    fp = _plan_fingerprint(ctx, feat, targets)
    if not ctx.force and st.exists(ctx.path(SUCCESS)) and st.exists(plan_uri) \
            and st.read_json(plan_uri) == fp:
        log.info("repartition: %s exists, nothing to do (use --force to redo)",
                 ctx.path(SUCCESS))
        return st.read_json(ctx.path(SUCCESS))
    if ctx.force or (st.exists(plan_uri) and st.read_json(plan_uri) != fp):
        if not ctx.force:
            log.warning("repartition: inputs or settings changed since the last attempt; "
                        "starting over")
        st.delete_dir(ctx.step_uri)
    st.write_json(plan_uri, fp)

    index = st.read_json(ctx.other("features", "shards.json"))
    order = index["order"]
    info = {s["shard"]: s for s in index["shards"]}
    present = {s["split"] for s in index["shards"]}
    splits = [s for s in SPLIT_ORDER if s in present and (not rcfg.splits or s in rcfg.splits)]
    if not splits:
        raise StepError(f"no feature shards for splits {rcfg.splits or 'any'} "
                        f"(features has {sorted(present)})")
    workers = ctx.cfg.train.workers
    map_jobs, plans = [], {}
    for si, split in enumerate(splits):
        shards = [s for s in order if info[s]["split"] == split]
        utt_shard, utt_ids, frames = [], [], []
        for shard in shards:
            t = st.read_parquet(ctx.other("features", "shards", f"{shard}.parquet"),
                                columns=["utt_id", "num_frames"])
            ids = t.column("utt_id").to_pylist()
            utt_ids += ids
            utt_shard += [shard] * len(ids)
            frames += t.column("num_frames").to_pylist()
        hours = sum(info[s]["audio_s"] for s in shards) / 3600.0
        parts = partition_count(hours, rcfg.partition_hours, workers)
        if len(utt_ids) < parts:
            log.warning("repartition: split %s has %d utterances for %d partitions; some "
                        "partitions are empty", split, len(utt_ids), parts)
        plan = plan_partitions(np.asarray(frames, dtype=np.int64), parts,
                               int(np.random.SeedSequence([rcfg.seed, si]).generate_state(1)[0]))
        plans[split] = {"parts": parts, "hours": hours}
        assign = _assignments(plan, utt_shard, utt_ids)
        map_jobs += [(f"map-{shard}", {"split": split, "shard": shard,
                                       "targets": targets is not None,
                                       "assign": assign.get(shard, {})}) for shard in shards]
    mapped = map_shards(ctx, map_jobs, map_shard, unit="shards")
    reduce_jobs = _reduce_jobs(splits, plans, mapped)
    if _forget_lost_buckets(ctx, reduce_jobs):
        mapped = map_shards(ctx, map_jobs, map_shard, unit="shards")
        reduce_jobs = _reduce_jobs(splits, plans, mapped)
    stats = map_shards(ctx, reduce_jobs, reduce_partition, unit="partitions")
    if sum(s["rows"] for s in stats) != sum(m["out"] for m in mapped):
        raise StepError(f"repartition: partitions hold {sum(s['rows'] for s in stats)} rows "
                        f"but the map stage routed {sum(m['out'] for m in mapped)}: re-run "
                        f"with --force")
    st.delete_dir(ctx.path(BUCKETS))

    total_bytes = 0
    per_split = {}
    for split in splits:
        mine = [s for s in stats if s["split"] == split]
        parts = [{"path": f"{s['name']}.parquet", "rows": s["rows"], "frames": s["frames"],
                  "bytes": s["bytes"]} for s in sorted(mine, key=lambda s: s["name"])]
        frames_list = [p["frames"] for p in parts]
        entry = {"split": split, "workers": workers, "partitions": parts,
                 "rows": sum(p["rows"] for p in parts), "frames": sum(frames_list),
                 "audio_hours": round(plans[split]["hours"], 6),
                 "targets": targets is not None,
                 "with_targets": sum(s["with_targets"] for s in mine)}
        st.write_json(ctx.path(split, "_index.json"), entry)
        total_bytes += sum(p["bytes"] for p in parts)
        per_split[split] = {"partitions": len(parts), "rows": entry["rows"],
                            "frames": entry["frames"], "frames_min": min(frames_list),
                            "frames_max": max(frames_list),
                            "with_targets": entry["with_targets"]}
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
                 "bucket_bytes": sum(m["bucket_bytes"] for m in mapped),
                 "audio_hours": round(hours_total, 6),
                 "xrt": round(hours_total * 3600.0 / wall, 2) if wall > 0 else None},
        bytes_written=total_bytes)
