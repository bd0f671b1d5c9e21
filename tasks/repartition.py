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
- one Ray task per partition (`map_shards`, so re-runs skip finished partitions) gathers
  its rows from the feature (and target) shards and writes the partition atomically.
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

from amflow import records
from amflow.raycluster import map_shards
from amflow.runs import SUCCESS, Reject, StepContext, StepError, rejects_table

log = logging.getLogger(__name__)

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


def build_partition(ctx: StepContext, part_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Gather one partition's rows (in planned order) and write it."""
    t0 = time.perf_counter()
    st = ctx.storage
    wanted: list[tuple[str, str]] = payload["rows"]  # (shard, utt_id) in output order
    by_shard: dict[str, set[str]] = {}
    for shard, utt in wanted:
        by_shard.setdefault(shard, set()).add(utt)
    feats: dict[str, dict] = {}
    targets: dict[str, dict] = {}
    for shard, utts in by_shard.items():
        table = st.read_parquet(ctx.other("features", "shards", f"{shard}.parquet"))
        for row in table.to_pylist():
            if row["utt_id"] in utts:
                feats[row["utt_id"]] = row
        if payload["targets"]:
            turi = ctx.other("targets", "shards", f"{shard}.parquet")
            if st.exists(turi):
                for row in st.read_parquet(turi).to_pylist():
                    if row["utt_id"] in utts:
                        targets[row["utt_id"]] = row
    rows, rejects = [], []
    frames = 0
    for shard, utt in wanted:
        row = feats.get(utt)
        if row is None:
            raise StepError(f"{part_id}: utterance {utt} missing from feature shard {shard}")
        row = dict(row, k=None, topk_idx=None, topk_logit=None)
        t = targets.get(utt)
        if t is not None:
            if int(t["num_frames"]) != int(row["num_frames"]):
                rejects.append(Reject(utt, "target_mismatch",
                                      f"{t['num_frames']} target rows vs {row['num_frames']} "
                                      f"feature rows", part_id))
                continue
            row.update(k=t["k"], topk_idx=t["topk_idx"], topk_logit=t["topk_logit"])
        elif payload["targets"] and row["split"] == "unlabeled":
            rejects.append(Reject(utt, "missing_targets",
                                  f"no row in targets/shards/{shard}.parquet", part_id))
            continue
        rows.append(row)
        frames += int(row["num_frames"])
    table = pa.Table.from_pylist(rows, schema=PARTITION_SCHEMA) if rows else \
        PARTITION_SCHEMA.empty_table()
    nbytes = st.write_parquet(ctx.path(payload["split"], f"{payload['name']}.parquet"), table)
    st.write_parquet(ctx.path("rejects", f"{part_id}.parquet"), rejects_table(rejects))
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {"split": payload["split"], "name": payload["name"], "in": len(wanted),
            "out": len(rows), "rejected": len(rejects), "reasons": reasons, "rows": len(rows),
            "frames": frames, "bytes": nbytes, "with_targets": sum(r["k"] is not None
                                                                    for r in rows),
            "wall_s": round(time.perf_counter() - t0, 4)}


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
    jobs = []
    plans: dict[str, dict] = {}
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
        for i, idx in enumerate(plan):
            name = f"part-{i:05d}"
            jobs.append((f"{split}-{name}", {
                "split": split, "name": name, "targets": targets is not None,
                "rows": [(utt_shard[j], utt_ids[j]) for j in idx.tolist()]}))
    stats = map_shards(ctx, jobs, build_partition, unit="partitions")

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
    for s in stats:
        for k, v in s["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    hours_total = sum(p["hours"] for p in plans.values())
    wall = time.time() - ctx.started
    return ctx.finish(
        inputs={"features": ctx.other("features", SUCCESS),
                "targets": tsucc if targets else None, "workers": workers},
        counts={"in": sum(s["in"] for s in stats), "out": sum(s["out"] for s in stats),
                "rejected": sum(s["rejected"] for s in stats)},
        metrics={"splits": per_split, "reject_reasons": reasons,
                 "targets": targets is not None, "partitions": len(stats),
                 "audio_hours": round(hours_total, 6),
                 "xrt": round(hours_total * 3600.0 / wall, 2) if wall > 0 else None},
        bytes_written=total_bytes)
