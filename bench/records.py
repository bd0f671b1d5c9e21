"""Typed Arrow list columns vs the binary blobs they replaced: bytes per audio hour and
read speed, side by side in one run.

    python -m bench.records [--hours 0.25] [--features RUN_DIR/features/shards] [--repeats 5]

Shards (each built once; every layout stores the same arrays):
  features   --hours of synthetic speech-like audio (bench/features.py's generator: 2-8 s
             utterances, harmonics + noise) through the features step's own code (64-bin
             fbank, causal CMN, LFR x3 = 192 dims, uint8 with one range per mel bin), with
             100 Hz frame labels and centre labels as a labeled shard holds them; and, with
             --features, the rows of a real run's feature shards (e.g. the tiny corpus's)
  targets    top-k targets for as many frames: a teacher with 200 classes (the demo's
             tree, sqrt31-u8 at mass 0.99, as configs/local.yaml) and 3,183 classes (aws,
             sqrt31-u16 at mass 0.99); and the default layout (fp16, k = 20, unpruned)

Layouts:
  blob        today's format before this change: raw array bytes in `binary` columns
  list        what amflow writes now: list<dtype> columns (records.to_table), their values
              in byte-stream-split pages (Storage.write_parquet, from the field metadata)
  list-dict   the same columns in pyarrow's default dictionary pages
  fixed       feat_min / feat_scale as fixed_size_list<float32, D>, feats as
              list<fixed_size_list<uint8, D>> (one Arrow value per frame), byte-stream-split
All written as core.storage.Storage.write_parquet writes (zstd; statistics for scalar
columns only): features at its default level, targets at targets.zstd_level (9).

Read: the file from memory -> pyarrow table of the columns the trainer reads -> every row
decoded to numpy as training/data.py does (blob: the per-row Python bytes and
np.frombuffer of the code before; list: records.columns' zero-copy views and
records.decode_*). The best of --repeats rounds, the layouts interleaved in each round.

The trainer end to end, each format read by its own code:

    python -m bench.records --partitions /tmp/p --hours 0.25
    PYTHONPATH=<checkout before typed columns> python bench/records.py \
        --loader /tmp/p/blob/part-00000.parquet
    python -m bench.records --loader /tmp/p/list/part-00000.parquet
"""
from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core import records
from core.config import FeaturesConfig
from core.storage import Storage

FEATURE_READ = ["num_frames", "feat_dim", "feat_dtype", "feats", "feat_min", "feat_scale",
                "labels", "frame_labels"]
TARGET_READ = list(records.TARGET_COLUMNS)


# ----------------------------------------------------------------- the shards
def synthetic_feature_rows(hours: float, seed: int = 0) -> list[dict[str, Any]]:
    """Feature rows of `hours` of synthetic audio, made by the features step's code."""
    from bench.features import _synth
    from tasks.features import encode_rows, featurize_stream
    import soundfile as sf

    fcfg = FeaturesConfig()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        utts = _synth(Path(tmp), hours * 3600.0, seed)
        waves = [sf.read(u["path"], dtype="float32")[0] for u in utts]
    rng = np.random.default_rng(seed)
    for spk in sorted({u["speaker_id"] for u in utts}):
        mine = [i for i, u in enumerate(utts) if u["speaker_id"] == spk]
        for i, x in zip(mine, featurize_stream([waves[i] for i in mine], fcfg)):
            fl = _labels(rng, x.shape[0] * fcfg.stack)
            rows.append({"utt_id": utts[i]["utt_id"], "speaker_id": spk, "split": "labeled",
                         "condition": "DP1", "shard": "bench",
                         **encode_rows(x, fcfg.storage_dtype, fcfg.stack),
                         "labels": records.encode_int16(
                             records.offset_labels(fl, 0, fcfg.stack, x.shape[0])),
                         "frame_labels": records.encode_int16(fl),
                         "_seconds": len(waves[i]) / 16000.0})
    return rows


def _labels(rng: np.random.Generator, n: int, classes: int = 200) -> np.ndarray:
    """Phone-like 100 Hz labels: runs of 4-15 frames."""
    out, t = np.zeros(n, np.int64), 0
    while t < n:
        d = int(rng.integers(4, 16))
        out[t:t + d] = rng.integers(classes)
        t += d
    return out


def real_feature_rows(shards: str) -> list[dict[str, Any]]:
    """The rows of a run's feature shards (either format), 100 Hz frames = 3 x rows."""
    from core.storage import Storage

    st = Storage()
    rows = []
    for uri in sorted(st.list(shards, suffix=".parquet")):
        for r in records.iter_rows(records.read_table(st, uri)):
            rows.append({**r, "_seconds": 0.03 * r["num_frames"]})  # 30 ms per LFR row
    return rows


def target_rows(frames: list[int], classes: int, code: str, mass: float, k: int = 20,
                seed: int = 0) -> list[dict[str, Any]]:
    """Top-k rows of a peaky synthetic teacher (a run of frames per phone-like class)."""
    import torch
    from tasks.targets import top_entries

    rng = np.random.default_rng(seed)
    out = []
    for i, t in enumerate(frames):
        logits = rng.standard_normal((t, classes)).astype(np.float32) * 2.0
        centre = _labels(rng, t, classes)
        logits[np.arange(t), centre] += rng.uniform(4.0, 9.0, t).astype(np.float32)
        near = (centre + 1) % classes
        logits[np.arange(t), near] += 3.0
        idx, val, lens = top_entries(torch.from_numpy(logits), k, code, mass)
        out.append({"utt_id": f"u{i:06d}",
                    **records.encode_topk(idx, val, lens, code, classes)})
    return out


# ----------------------------------------------------------------- the layouts
def _blob(table: pa.Table) -> pa.Table:
    """The same rows as binary columns of the arrays' bytes (the format before; no field
    metadata, so Storage writes them as it did)."""
    cols = {}
    for f in table.schema:
        col = table.column(f.name)
        if pa.types.is_list(f.type):
            rows = records.ListRows(col)
            col = pa.array([None if rows[i] is None else rows[i].tobytes()
                            for i in range(len(rows))], pa.binary())
        cols[f.name] = col
    return pa.table(cols)


def _fixed(table: pa.Table) -> pa.Table:
    d = int(table.column("feat_dim")[0].as_py())
    out = table
    for name in ("feats", "feat_min", "feat_scale"):
        col = table.column(name).combine_chunks()
        if name == "feats":
            inner = pa.FixedSizeListArray.from_arrays(col.values, d)
            arr = pa.ListArray.from_arrays(pa.array(col.offsets.to_numpy() // d), inner,
                                           mask=col.is_null())
        else:
            vals = col.values if col.null_count == 0 else None
            if vals is None:
                return table  # float16 rows have no ranges: nothing to fix
            arr = pa.FixedSizeListArray.from_arrays(vals, d)
        out = out.set_column(out.schema.get_field_index(name), pa.field(name, arr.type), arr)
    return out


def write(table: pa.Table, level: int | None, mode: str = "storage") -> bytes:
    """storage: as core.storage.Storage.write_parquet writes (what amflow writes: the array
    columns byte-stream-split, statistics for the scalar columns only); dict: the array
    columns in dictionary pages instead (pyarrow's default); bss: every leaf of the array
    columns byte-stream-split (for the fixed-size layout's nested leaves)."""
    if mode == "storage":
        with tempfile.TemporaryDirectory() as tmp:
            Storage().write_parquet(f"{tmp}/t.parquet", table, compression_level=level)
            return Path(f"{tmp}/t.parquet").read_bytes()
    stats = [f.name for f in table.schema
             if not (pa.types.is_binary(f.type) or pa.types.is_nested(f.type))]
    kw: dict[str, Any] = {}
    if mode == "bss":
        probe = io.BytesIO()
        pq.write_table(table.slice(0, 1), probe)
        leaves = [c.path for c in pq.ParquetFile(probe).schema if "." in c.path]
        kw = {"use_dictionary": [c.path for c in pq.ParquetFile(probe).schema
                                 if c.path not in leaves],
              "column_encoding": {p: "BYTE_STREAM_SPLIT" for p in leaves}}
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", compression_level=level,
                   write_statistics=stats, **kw)
    return buf.getvalue()


# ----------------------------------------------------------------- the readers
def read_blob_features(data: bytes) -> int:
    """training/data.py before: per-row Python bytes, np.frombuffer per array."""
    t = pq.read_table(io.BytesIO(data), columns=FEATURE_READ)
    cols = {c: t.column(c).to_pylist() for c in t.column_names}
    n = 0
    for i in range(t.num_rows):
        r = {c: cols[c][i] for c in cols}
        q = np.frombuffer(r["feats"], np.uint8).reshape(r["num_frames"], r["feat_dim"])
        x = q.astype(np.float32) * np.frombuffer(r["feat_scale"], np.float32) + \
            np.frombuffer(r["feat_min"], np.float32)
        for name in ("labels", "frame_labels"):
            if r[name] is not None:
                n += len(np.frombuffer(r[name], np.int16).astype(np.int64))
        n += x.size
    return n


def read_list_features(data: bytes) -> int:
    """training/data.py now: records.columns' numpy views, records.decode_*."""
    return _decode_features(pq.read_table(io.BytesIO(data), columns=FEATURE_READ))


def _decode_features(t: pa.Table) -> int:
    cols = records.columns(t)
    n = 0
    for i in range(t.num_rows):
        r = {c: cols[c][i] for c in cols}
        x = records.decode_feats(r)
        for name in ("labels", "frame_labels"):
            if r[name] is not None:
                n += len(records.decode_int16(r[name]))
        n += x.size
    return n


def read_fixed_features(data: bytes) -> int:
    """The fixed-size layout: its values seen as the flat lists (offsets x D), then as
    read_list_features."""
    t = pq.read_table(io.BytesIO(data), columns=FEATURE_READ)
    for name in ("feats", "feat_min", "feat_scale"):
        col = t.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):  # [D] per row
            size = col.type.list_size
            col = pa.ListArray.from_arrays(
                pa.array(np.arange(len(col) + 1, dtype=np.int32) * size), col.values)
        elif pa.types.is_fixed_size_list(col.type.value_type):  # [T] of [D] per row
            size = col.type.value_type.list_size
            col = pa.ListArray.from_arrays(pa.array(col.offsets.to_numpy() * size),
                                           col.values.values, mask=col.is_null())
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return _decode_features(t)


def read_blob_targets(data: bytes) -> int:
    t = pq.read_table(io.BytesIO(data), columns=TARGET_READ)
    cols = {c: t.column(c).to_pylist() for c in t.column_names}
    n = 0
    for i in range(t.num_rows):
        r = {c: cols[c][i] for c in cols}
        it, vt = records.topk_types(r["topk_code"])
        # the rows as the code before saw them: bytes through np.frombuffer
        r = {**r, "topk_idx": np.frombuffer(r["topk_idx"], it.to_pandas_dtype()),
             "topk_logit": np.frombuffer(r["topk_logit"], vt.to_pandas_dtype()),
             "topk_len": None if r["topk_len"] is None else
             np.frombuffer(r["topk_len"], np.uint8)}
        n += records.decode_topk(r)[0].size
    return n


def read_list_targets(data: bytes) -> int:
    t = pq.read_table(io.BytesIO(data), columns=TARGET_READ)
    cols = records.columns(t)
    n = 0
    for i in range(t.num_rows):
        n += records.decode_topk({c: cols[c][i] for c in cols})[0].size
    return n


# ----------------------------------------------------------------- the run
def best_of(fns: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def compare(name: str, rows: list[dict[str, Any]], schema: pa.Schema, level: int | None,
            readers: dict[str, Callable[[bytes], int]], repeats: int) -> list[dict[str, Any]]:
    hours = sum(r.get("_seconds", 0.0) for r in rows) / 3600.0
    typed = records.to_table(rows, schema)
    layouts = {"blob": write(_blob(typed), level), "list": write(typed, level),
               "list-dict": write(typed, level, "dict")}
    if "feats" in schema.names:
        layouts["fixed"] = write(_fixed(typed), level, "bss")
    values = {k: readers[k](v) for k, v in layouts.items()}
    assert len(set(values.values())) == 1, values  # every layout decodes the same arrays
    times = best_of({k: (lambda k=k: readers[k](layouts[k])) for k in layouts}, repeats)
    out = []
    for k, data in layouts.items():
        out.append({"shard": name, "layout": k, "rows": len(rows),
                    "audio_h": round(hours, 4), "MB_per_audio_h": len(data) / 1e6 / hours,
                    "bytes_ratio": len(data) / len(layouts["blob"]),
                    "read_s": times[k], "read_ratio": times[k] / times["blob"]})
    return out


def write_partitions(out: str, hours: float) -> None:
    """The synthetic feature rows as one training partition in each format:
    OUT/blob/part-00000.parquet and OUT/list/part-00000.parquet."""
    typed = records.to_table(synthetic_feature_rows(hours), records.feature_schema("uint8"))
    Storage().write_parquet(f"{out}/blob/part-00000.parquet", _blob(typed))
    Storage().write_parquet(f"{out}/list/part-00000.parquet", typed)


def loader_seconds(uri: str, repeats: int) -> float:
    """The trainer's own loader over one partition (index, read, decode, CMVN, chunked
    minibatches; training/data.py of whichever checkout is on the path): best of repeats."""
    from training.data import BatchLoader, Normalizer, PassSpec, SplitIndex

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        idx = SplitIndex.load(Storage(), [uri], "labels")
        for _b in BatchLoader(Storage(), idx, PassSpec(), Normalizer.from_stats(None,
                                                                              idx.feat_dim)):
            pass
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hours", type=float, default=0.25, help="synthetic audio per shard")
    p.add_argument("--features", help="a run's features/shards folder to measure as well")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--partitions", help="only write the two partitions to this folder")
    p.add_argument("--loader", help="only time the trainer's loader over this partition")
    a = p.parse_args(argv)
    if a.partitions:
        write_partitions(a.partitions, a.hours)
        return []
    if a.loader:
        print(f"{a.loader} loader best of {a.repeats}: {loader_seconds(a.loader, a.repeats):.4f} s")
        return []
    freaders = {"blob": read_blob_features, "list": read_list_features,
                "list-dict": read_list_features, "fixed": read_fixed_features}
    treaders = {"blob": read_blob_targets, "list": read_list_targets,
                "list-dict": read_list_targets}
    results = []
    shards = [("features synthetic", synthetic_feature_rows(a.hours))]
    if a.features:
        shards.append(("features " + a.features.rstrip("/").split("/")[-3],
                       real_feature_rows(a.features)))
    for name, rows in shards:
        results += compare(name, rows, records.feature_schema("uint8"), None, freaders,
                           a.repeats)
    frames = [r["num_frames"] for r in shards[0][1]]
    seconds = sum(r["_seconds"] for r in shards[0][1])
    for classes, code, mass in ((200, "sqrt31", 0.99), (3183, "sqrt31", 0.99),
                                (200, "fp16", 1.0)):
        rows = target_rows(frames, classes, code, mass)
        rows[0]["_seconds"] = seconds
        name = f"targets {classes} classes {rows[0]['topk_code'] or 'fp16'} mass {mass}"
        results += compare(name, rows, records.target_schema(rows[0]["topk_code"]), 9,
                           treaders, a.repeats)
    _print(results)
    return results


def _print(results: list[dict[str, Any]]) -> None:
    print(f"{'shard':<44} {'layout':<12} {'MB/audio h':>10} {'bytes/blob':>10} "
          f"{'read s':>8} {'read/blob':>9}")
    for r in results:
        print(f"{r['shard']:<44} {r['layout']:<12} {r['MB_per_audio_h']:>10.3f} "
              f"{r['bytes_ratio']:>10.3f} {r['read_s']:>8.4f} {r['read_ratio']:>9.3f}")


if __name__ == "__main__":
    main()
