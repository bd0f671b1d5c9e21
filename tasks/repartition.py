"""`amflow repartition`: join features with targets into equal-size training partitions.

Reads  `runs/<R>/features/shards/*.parquet` (+ `shards.json`), and when
       `runs/<R>/targets/_SUCCESS.json` exists, `runs/<R>/targets/shards/<shard>.parquet`
       (records.target_schema, matched to the feature rows by utt_id).
Writes `runs/<R>/repartition/<split>/part-<i>.parquet`  rows in PARTITION_SCHEMA
       `runs/<R>/repartition/<split>/_index.json`      partitions with rows/frames/bytes
       `runs/<R>/repartition/_assign/<shard>.parquet`  utt_id -> (partition, position)
       `runs/<R>/repartition/rejects/<part>.parquet`, `_shards/<part>.json`, `_SUCCESS.json`

Rows are the feature rows (records.feature_schema, hard `labels` for labeled data) plus
the soft-target columns `k`, `topk_idx`, `topk_logit`, `topk_len` (null without targets),
in records.partition_schema: list columns of the types the inputs have. Inputs written
before the typed columns are read through records.read_table, so partitions are always
written in the current format.

Per split (all splits the features step produced, or `repartition.splits`):
- partition count P = ceil(split audio hours / partition_hours), rounded up to a multiple
  of `train.workers` (and at least `train.workers`), so every worker gets as many;
- shuffle windows: the P partitions are shared evenly among W = ceil(shards /
  window_shards) windows (at most P), and the split's shards, in random order (seed
  `repartition.seed`), each join the window with the fewest hours per partition. The
  driver only holds one line per shard; a split of a million hours is planned by W tasks
  and every shard feeds only its own window's partitions, so the shuffle writes
  shards x P / W buckets instead of shards x P;
- one plan task per window (`plan_window`) reads the `utt_id`/`num_frames` columns of its
  shards, shuffles the window's utterances and deals each, in that order, to the window's
  partition with the fewest frames so far: partitions of a window differ by at most one
  utterance's frames and each partition's rows stay in shuffled order. The assignment is
  written per shard (`_assign/`) and kept: it records where every utterance went;
- a map/reduce shuffle, so every input is read once whatever the partition count: one
  Ray task per feature shard (`map_shard`) reads the shard, its assignment and its target
  shard, joins them, applies the reject rules and writes one bucket per partition it
  feeds (`_buckets/<split>/part-<i>/<shard>.parquet`, rows tagged with their planned
  position); then one task per partition (`reduce_partition`) concatenates its buckets
  in planned order and writes the partition atomically. All three stages go through
  `map_shards`, so a re-run skips finished windows, shards and partitions; the buckets
  are deleted once every partition is written.
With a training window (repartition.days, from_date/to_date: amflow/steps/repartition.py)
the shards of daily_data's interval partitions join the run's own, named
`<partition run id>.<shard>`; the jobs of those shards carry their features and targets
URIs (`sources`), the run's own shards are found through the run layout as before.
A target row whose frame count differs from its feature row is rejected
(`target_mismatch`); an unlabeled row without a target row, when targets exist, is
rejected (`missing_targets`). Counts: in = feature rows of the partitioned splits.

`plan_partitions(frames, parts, seed)` and `shuffle_windows(...)` are the pure core.
"""
from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.config import RepartitionConfig, StorageConfig
from core import records
from core.outcomes import Reject, StepError, rejects_table, shard_marker_uri
from core.storage import Storage, join

log = logging.getLogger(__name__)

BUCKETS = "_buckets"
ASSIGN = "_assign"
ASSIGN_SCHEMA = pa.schema([pa.field("utt_id", pa.string()), pa.field("part", pa.int32()),
                          pa.field("pos", pa.int64())])
SPLIT_ORDER = ("labeled", "unlabeled", "dev", "test")
PARTITION_SCHEMA = records.partition_schema()  # the default types (uint8 features, fp16 targets)


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


def shuffle_windows(hours: list[float], window_shards: int, parts: int, seed: int
                    ) -> list[tuple[list[int], int]]:
    """Shard indices per shuffle window and the window's partition count.

    One window (in input order) when the split fits in `window_shards` (or it is 0).
    Else W = min(ceil(S / window_shards), parts) windows share the partitions as evenly
    as integers allow, and the shards, in random order, each go to the window whose hours
    per partition stay lowest: window partitions then differ in size by about one shard's
    share, not by the rounding of a partition count.
    """
    n = len(hours)
    windows = 1 if window_shards <= 0 else max(1, min(math.ceil(n / window_shards), parts))
    if windows == 1:
        return [(list(range(n)), parts)]
    base, extra = divmod(parts, windows)
    counts = [base + (1 if w < extra else 0) for w in range(windows)]
    members: list[list[int]] = [[] for _ in range(windows)]
    # Windows share one of at most two partition counts; within a count, (load + h) /
    # count grows with the load, so one heap per count, ordered by (non-empty, load,
    # index), finds the choice in O(log W): the driver places every shard of the split.
    heaps = {c: [(False, 0.0, w) for w in range(windows) if counts[w] == c]
             for c in sorted(set(counts))}
    for i in np.random.default_rng(seed).permutation(n).tolist():
        # an empty window first, so every window gets a shard
        h = hours[i]
        offers = {c: _cheapest(heap, h, c) for c, heap in heaps.items()}
        pick = min(offers, key=lambda c: offers[c][0])
        for c, (_, (filled, load, w)) in offers.items():
            heapq.heappush(heaps[c], (True, load + h, w) if c == pick else (filled, load, w))
        members[offers[pick][1][2]].append(i)
    return [(sorted(m), c) for m, c in zip(members, counts)]


def _cheapest(heap: list, h: float, count: int) -> tuple[tuple, tuple]:
    """Pop the window of `heap` that is lowest in (non-empty, (load + h) / count, index).

    The heap orders by load; windows whose (load + h) / count rounds to the same float as
    the top's are popped too and the lowest index wins, the others go back.
    """
    group = [heapq.heappop(heap)]
    key = (group[0][0], (group[0][1] + h) / count)
    while heap and (heap[0][0], (heap[0][1] + h) / count) == key:
        group.append(heapq.heappop(heap))
    best = min(group, key=lambda e: e[2])
    for e in group:
        if e is not best:
            heapq.heappush(heap, e)
    return (*key, best[2]), best


@dataclass(frozen=True)
class RepartitionJob:
    """What every plan/map/reduce task needs: the storage, the run's features and targets
    (`*_uri`: their shards/; a daily_data window's shards come by URI in the payload) and
    where the partitions go (`out_uri`: <split>/part-*.parquet, and the shuffle's _assign/
    and _buckets/ scratch)."""
    storage: StorageConfig
    features_uri: str
    targets_uri: str
    out_uri: str


def plan_fingerprint(r: RepartitionConfig, workers: int, feat: dict, targets: dict | None
                     ) -> dict:
    return {"workers": workers, "partition_hours": r.partition_hours,
            "seed": r.seed, "splits": r.splits, "window_shards": r.window_shards,
            "features_finished_at": feat.get("finished_at"),
            "targets_finished_at": targets.get("finished_at") if targets else None}


def _assign_uri(out_uri: str, shard: str) -> str:
    return join(out_uri, ASSIGN, f"{shard}.parquet")


def plan_window(job: RepartitionJob, window_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Plan one shuffle window: every utterance of its shards -> (partition, position)."""
    t0 = time.perf_counter()
    st, shards = Storage(job.storage), payload["shards"]
    uris = payload.get("uris") or {}  # shards of daily_data partitions (a window)
    cols = [st.read_parquet(uris.get(s) or join(job.features_uri, "shards", f"{s}.parquet"),
                            columns=["utt_id", "num_frames"]) for s in shards]
    frames = np.concatenate([c.column("num_frames").to_numpy() for c in cols]) if cols \
        else np.zeros(0, np.int64)
    plan = plan_partitions(frames.astype(np.int64), payload["parts"], payload["seed"])
    part = np.zeros(len(frames), np.int32)
    pos = np.zeros(len(frames), np.int64)
    for i, idx in enumerate(plan):
        part[idx] = payload["offset"] + i
        pos[idx] = np.arange(len(idx))
    start = 0
    for shard, c in zip(shards, cols):
        rows = slice(start, start + c.num_rows)
        st.write_parquet(_assign_uri(job.out_uri, shard), pa.table(
            {"utt_id": c.column("utt_id"), "part": pa.array(part[rows]),
             "pos": pa.array(pos[rows])}, schema=ASSIGN_SCHEMA))
        start += c.num_rows
    loads = [int(frames[idx].sum()) for idx in plan]
    return {"split": payload["split"], "window": window_id, "shards": len(shards),
            "utts": len(frames), "parts": payload["parts"],
            "frames_spread": (max(loads) - min(loads)) if loads else 0,
            "wall_s": round(time.perf_counter() - t0, 4)}


def _bucket_uri(out_uri: str, split: str, part: int, shard: str) -> str:
    return join(out_uri, BUCKETS, split, f"part-{part:05d}", f"{shard}.parquet")


def _join_targets(feats: pa.Table, targets: pa.Table | None, shard: str, split: str
                  ) -> tuple[pa.Table, list[Reject], np.ndarray]:
    """Feature rows + their soft-target columns, with mismatched or missing targets
    rejected; the mask says which feature rows were kept."""
    n = feats.num_rows
    schema = records.partition_schema(
        feats.schema, records.TARGET_SCHEMA if targets is None else targets.schema)
    cols = {name: feats.column(name) for name in records.FEATURE_SCHEMA.names}
    if targets is None:
        for f in schema:
            if f.name not in cols:
                cols[f.name] = pa.nulls(n, f.type)
        return pa.table(cols, schema=schema), [], np.ones(n, bool)
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
    for name in records.TARGET_COLUMNS:
        # targets written before `topk_len` existed have no such column: all unpruned
        taken = targets.column(name).combine_chunks().take(pa.array(idx)) \
            if targets.num_rows and name in targets.column_names else \
            pa.nulls(n, schema.field(name).type)
        cols[name] = pc.if_else(mask, taken, pa.nulls(n, schema.field(name).type))
    keep = ~(mismatch | missing)
    return pa.table(cols, schema=schema).filter(pa.array(keep)), rejects, keep


def map_shard(job: RepartitionJob, map_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Read one feature shard (and its targets) once; write one bucket per partition."""
    t0 = time.perf_counter()
    st, shard, split = Storage(job.storage), payload["shard"], payload["split"]
    feats = records.read_table(st, payload.get("features_uri")
                               or join(job.features_uri, "shards", f"{shard}.parquet"))
    targets = None
    if payload["targets"]:
        turi = payload.get("targets_uri") or join(job.targets_uri, "shards", f"{shard}.parquet")
        targets = records.read_table(st, turi) if st.exists(turi) else \
            records.TARGET_SCHEMA.empty_table()
    assign = st.read_parquet(_assign_uri(job.out_uri, shard))
    planned = assign.column("utt_id").combine_chunks()
    at = pc.index_in(feats.column("utt_id").combine_chunks(), value_set=planned)
    if at.null_count or feats.num_rows != assign.num_rows:
        unplanned = feats.column("utt_id").filter(at.is_null()).to_pylist()
        raise StepError(f"{map_id}: feature shard {shard} changed since it was planned "
                        f"({feats.num_rows} rows, {assign.num_rows} planned, e.g. "
                        f"{unplanned[:3]} unplanned): re-run with --force")
    table, rejects, keep = _join_targets(feats, targets, shard, split)
    part = assign.column("part").take(at).to_numpy()[keep]
    table = table.append_column("_pos", assign.column("pos").take(at).filter(pa.array(keep)))
    buckets: list[int] = []
    nbytes = 0
    for p in np.unique(part).tolist():
        rows = table.filter(pa.array(part == p))
        nbytes += st.write_parquet(_bucket_uri(job.out_uri, split, p, shard), rows)
        buckets.append(int(p))
    st.write_parquet(join(job.out_uri, "rejects", f"{map_id}.parquet"), rejects_table(rejects))
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {"split": split, "source": shard, "in": feats.num_rows, "out": table.num_rows,
            "rejected": len(rejects), "reasons": reasons, "buckets": buckets,
            "bucket_bytes": nbytes, "wall_s": round(time.perf_counter() - t0, 4)}


def reduce_partition(job: RepartitionJob, part_id: str, payload: dict[str, Any]
                     ) -> dict[str, Any]:
    """Concatenate one partition's buckets in planned order and write it."""
    t0 = time.perf_counter()
    st, split, part = Storage(job.storage), payload["split"], payload["part"]
    pieces = [st.read_parquet(_bucket_uri(job.out_uri, split, part, shard))
              for shard in payload["shards"]]
    table = records.concat_tables(pieces) if pieces else \
        PARTITION_SCHEMA.append(pa.field("_pos", pa.int64())).empty_table()
    table = table.sort_by("_pos").drop_columns(["_pos"])
    nbytes = st.write_parquet(join(job.out_uri, split, f"part-{part:05d}.parquet"), table)
    return {"split": split, "name": f"part-{part:05d}", "rows": table.num_rows,
            "frames": int(pc.sum(table.column("num_frames")).as_py() or 0),
            "bytes": nbytes, "with_targets": table.num_rows - table.column("k").null_count,
            "wall_s": round(time.perf_counter() - t0, 4)}


def shard_jobs(rcfg: RepartitionConfig, workers: int, splits: list[str], order: list[str], info: dict,
          with_targets: bool, sources: dict[str, tuple[str, str]] | None = None
          ) -> tuple[list, list, dict]:
    """Plan jobs (one per shuffle window), map jobs (one per shard), per-split plan.
    `sources`: {shard: (features URI, targets URI)} of shards from outside the run (a
    window of daily_data partitions); the others are the run's own."""
    sources = sources or {}
    plan_jobs, map_jobs, plans = [], [], {}
    for si, split in enumerate(splits):
        shards = [s for s in order if info[s]["split"] == split]
        hours = sum(info[s]["audio_s"] for s in shards) / 3600.0
        parts = partition_count(hours, rcfg.partition_hours, workers)
        rows = sum(info[s].get("out", 0) for s in shards)
        if rows < parts:
            log.warning("repartition: split %s has %d utterances for %d partitions; some "
                        "partitions are empty", split, rows, parts)
        seeds = np.random.SeedSequence([rcfg.seed, si]).generate_state(2)
        windows = shuffle_windows([info[s]["audio_s"] for s in shards], rcfg.window_shards,
                                  parts, int(seeds[1]))
        offset = 0
        for w, (members, count) in enumerate(windows):
            # one window keeps the split's seed: the plan of a global shuffle
            seed = int(seeds[0]) if len(windows) == 1 else \
                int(np.random.SeedSequence([rcfg.seed, si, w]).generate_state(1)[0])
            mine = [shards[i] for i in members]
            job = {"split": split, "shards": mine, "parts": count, "offset": offset,
                   "seed": seed}
            if any(x in sources for x in mine):
                job["uris"] = {x: sources[x][0] for x in mine if x in sources}
            plan_jobs.append((f"plan-{split}-w{w:05d}", job))
            offset += count
        plans[split] = {"parts": parts, "hours": hours, "windows": len(windows)}
        map_jobs += [(f"map-{shard}", _map_job(split, shard, with_targets, sources))
                     for shard in shards]
    return plan_jobs, map_jobs, plans


def _map_job(split: str, shard: str, with_targets: bool,
             sources: dict[str, tuple[str, str]]) -> dict[str, Any]:
    job: dict[str, Any] = {"split": split, "shard": shard,
                           "targets": with_targets or shard in sources}
    if shard in sources:
        job["features_uri"], job["targets_uri"] = sources[shard]
    return job


def plan_reduce_jobs(splits: list[str], plans: dict[str, dict], mapped: list[dict]
                 ) -> list[tuple[str, dict]]:
    feeds: dict[tuple[str, int], list[str]] = {}
    for m in mapped:
        for part in m["buckets"]:
            feeds.setdefault((m["split"], part), []).append(m["source"])
    return [(f"{split}-part-{i:05d}", {"split": split, "part": i,
                                       "shards": feeds.get((split, i), [])})
            for split in splits for i in range(plans[split]["parts"])]


def forget_lost_buckets(st: Storage, out_uri: str, reduce_jobs: list[tuple[str, dict]],
                        force: bool = False) -> bool:
    """Un-mark the map tasks whose buckets an unfinished partition needs but are gone.

    Buckets are deleted once every partition is written; a partition lost after that
    (or a half-cleaned step directory) needs its source shards mapped again.
    """
    have = set(st.list(join(out_uri, BUCKETS), suffix=".parquet", recursive=True))
    lost: set[str] = set()
    for part_id, job in reduce_jobs:
        if not force and st.exists(shard_marker_uri(out_uri, part_id)):
            continue
        lost |= {shard for shard in job["shards"]
                 if _bucket_uri(out_uri, job["split"], job["part"], shard) not in have}
    for shard in sorted(lost):
        st.delete(shard_marker_uri(out_uri, f"map-{shard}"))
    if lost:
        log.warning("repartition: buckets of %d shards are gone; mapping them again", len(lost))
    return bool(lost)


def split_indexes(stats: list[dict], splits: list[str], plans: dict[str, dict], workers: int,
                  has_targets: bool) -> tuple[dict[str, dict], dict[str, dict]]:
    """(the `<split>/_index.json` of each split, the per-split metrics) from reduce stats."""
    entries, per_split = {}, {}
    for split in splits:
        mine = [s for s in stats if s["split"] == split]
        parts = [{"path": f"{s['name']}.parquet", "rows": s["rows"], "frames": s["frames"],
                  "bytes": s["bytes"]} for s in sorted(mine, key=lambda s: s["name"])]
        frames_list = [p["frames"] for p in parts]
        entry = {"split": split, "workers": workers, "partitions": parts,
                 "rows": sum(p["rows"] for p in parts), "frames": sum(frames_list),
                 "audio_hours": round(plans[split]["hours"], 6),
                 "targets": has_targets,
                 "with_targets": sum(s["with_targets"] for s in mine)}
        entries[split] = entry
        per_split[split] = {"partitions": len(parts), "windows": plans[split]["windows"],
                            "rows": entry["rows"],
                            "frames": entry["frames"], "frames_min": min(frames_list),
                            "frames_max": max(frames_list),
                            "with_targets": entry["with_targets"]}
    return entries, per_split
