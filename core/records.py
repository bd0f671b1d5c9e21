"""Row formats shared by the data steps and the trainers, and their one codec.

Every array is an Arrow list column of its real dtype, so DuckDB, pandas or
ray.data.read_parquet read arrays; each field's metadata says its shape and code
(`amflow.shape`, `amflow.codec`), the schema's `amflow.records` the format version.

Feature rows (features step, repartition, data loader) hold one utterance each:

    utt_id, speaker_id, split, condition, shard : string
    num_frames   : int32   low-frame-rate rows (after stacking `stack` frames, offset 0)
    feat_dim     : int16   192 for 64 mel bins x 3
    feat_dtype   : string  "float16" | "uint8"
    feats        : list<uint8 | float16>  row-major num_frames x feat_dim
    feat_min     : list<float32>  [feat_dim] (uint8 only: per-column range of this row)
    feat_scale   : list<float32>  [feat_dim] (uint8 only): value = code * scale + min
    labels       : list<int16>  [num_frames] phone ids at offset 0 (centre frame), or null
    frame_labels : list<int16>  at the full 100 Hz rate, or null (derives offsets 1, 2)

Features are stored after the causal mean normalisation and before the global CMVN,
which is an affine map the loader applies from `features/cmvn.json`. Only offset 0 is
stored: with stack == subsample the offset-o rows are the offset-0 rows shifted by o
source frames, so `shift_offset` derives offsets 1 and 2 exactly (losing the last row).

Target rows (targets step) are aligned row for row with the features of the same shard:

    utt_id : string, num_frames : int32, k : int16,
    topk_idx : list<int16 | uint8 | uint16>, topk_logit : list<float16 | uint8>
    topk_len : list<uint8> [num_frames] or null, topk_code : string

With `topk_len` (targets.mass < 1) frame t keeps only its first topk_len[t] <= k entries
(the fewest whose teacher probability reaches the mass) and topk_idx / topk_logit hold
sum(topk_len) entries, frame after frame, as Kaldi stores pruned posteriors. decode_topk
gives every row the [num_frames x k] layout back: a dropped entry is a class the frame
does not keep, at logit PAD_LOGIT, i.e. no mass, as a class outside the top-k.

`topk_code` (targets.codec) says how the entries are coded; null is the layout above
(int16 index, fp16 logit, the frame's entries by rank: the paper's). `sqrt<L>-u8` /
`sqrt<L>-u16` store each frame's entries in class order (neighbouring frames then repeat
their index runs, which zstd finds) with uint8 / uint16 indices, and for each entry the
teacher's probability p as one byte q = round(L * sqrt(p)) in 1..L. A rounding step in
sqrt(p) is a relative error in p of ~1/(L sqrt(p)), so each entry adds about the same KL
whatever its size: a 0.7-probability class is kept to within ~2 %, a 0.01 one ~16 %, where
the fp16 bits of a small entry are wasted on a class that barely weighs. decode_topk
gives log p back as the logit (a constant shift per frame: the same softmax). Where the
best class would share a level with another, it is raised above it (quantize_ranked),
so the rebuilt argmax is the teacher's. The code's names: core/target_codes.py.

Writing: the encoders give numpy arrays; `to_table(rows, schema)` builds the columns
(`feature_schema(dtype)`, `target_schema(code)`, `partition_schema(...)`). Reading:
`read_table` (or `upgrade` on a table read otherwise), then `columns(table)` gives each
list column's rows as zero-copy numpy views (`ListRows`), which the decoders take.

Runs written before these columns (format 1: raw array bytes in `binary` columns) still
read: `upgrade` turns each such column into the list column above (the bytes
reinterpreted as the dtype their row's `feat_dtype` / `topk_code` names), so every
reader sees one format and the decoders have one path. A table whose rows mix feature
dtypes or top-k codes in one binary column cannot be turned into one typed column; it is
refused, naming the step to re-run.
"""
from __future__ import annotations

import bisect
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.storage import PARQUET_ENCODING
from core.target_codes import FP16_CODE, index_bytes, sqrt_levels

FORMAT_KEY = b"amflow.records"
ENCODING_KEY = PARQUET_ENCODING  # field metadata that core.storage.write_parquet applies
FORMAT = b"2"  # 1 (no key): the arrays as raw bytes in binary columns
FEAT_TYPES = {"float16": pa.float16(), "uint8": pa.uint8()}


def list_type(value_type: pa.DataType) -> pa.ListType:
    """The type of every array column: a list of non-null values, named as Parquet's
    compliant lists name them (so a file read back has the same type)."""
    return pa.list_(pa.field("element", value_type, nullable=False))


def _list_field(name: str, value_type: pa.DataType, shape: str, codec: str,
                nullable: bool = True) -> pa.Field:
    """Each array column says its shape and code, and asks Storage.write_parquet for
    byte-stream-split pages without a dictionary: zstd then sees each value's bytes much as
    it saw the blob's (the dictionary's bit-packed indices cost up to 17 % more bytes, and
    plain pages store a uint8 in 4; docs/results/2026-11-29-arrow-columns.md). float16
    values (two-byte FIXED_LEN_BYTE_ARRAY in Parquet) are plain: DuckDB reads no
    byte-stream-split page of that type, and plain is already their raw bytes."""
    encoding = b"PLAIN" if value_type == pa.float16() else b"BYTE_STREAM_SPLIT"
    return pa.field(name, list_type(value_type), nullable=nullable, metadata={
        b"amflow.shape": shape.encode(), b"amflow.codec": codec.encode(),
        ENCODING_KEY: encoding})


def feature_schema(dtype: str = "uint8") -> pa.Schema:
    """The feature rows' schema for `features.storage_dtype` = dtype."""
    if dtype not in FEAT_TYPES:
        raise ValueError(f"unknown feature dtype {dtype!r}: float16 or uint8")
    codec = "float16 values" if dtype == "float16" else \
        "uint8 codes: value[t, j] = feats[t, j] * feat_scale[j] + feat_min[j]"
    return pa.schema([
        ("utt_id", pa.string()), ("speaker_id", pa.string()), ("split", pa.string()),
        ("condition", pa.string()), ("shard", pa.string()),
        ("num_frames", pa.int32()), ("feat_dim", pa.int16()), ("feat_dtype", pa.string()),
        _list_field("feats", FEAT_TYPES[dtype], "[num_frames, feat_dim] row-major", codec,
                    nullable=False),
        _list_field("feat_min", pa.float32(), "[feat_dim]", "uint8 rows only: column minimum"),
        _list_field("feat_scale", pa.float32(), "[feat_dim]", "uint8 rows only: code step"),
        _list_field("labels", pa.int16(), "[num_frames]", "class of each row's centre frame"),
        _list_field("frame_labels", pa.int16(), "[source frames] (100 Hz)",
                    "class of each source frame"),
    ], metadata={FORMAT_KEY: FORMAT})


def topk_types(code: str | None) -> tuple[pa.DataType, pa.DataType]:
    """A row's `topk_code` -> the Arrow types of its (topk_idx, topk_logit) values."""
    if not code or code == FP16_CODE:
        return pa.int16(), pa.float16()
    sqrt_levels(code)  # a ValueError naming the code when it is none of ours
    return (pa.uint8() if index_bytes(code) == 1 else pa.uint16()), pa.uint8()


def target_schema(code: str | None = None) -> pa.Schema:
    """The target rows' schema for the rows' `topk_code` (None: the fp16 layout)."""
    idx_type, val_type = topk_types(code)
    entries = "[sum(topk_len)] when topk_len is set, else [num_frames, k] row-major"
    return pa.schema([
        ("utt_id", pa.string()), ("num_frames", pa.int32()), ("k", pa.int16()),
        _list_field("topk_idx", idx_type, entries,
                    "class ids: each frame's by rank (null topk_code) or by class (sqrt<L>)"),
        _list_field("topk_logit", val_type, entries,
                    "null topk_code: fp16 logits; sqrt<L>-u8|u16: round(L * sqrt(p)) in 1..L"),
        _list_field("topk_len", pa.uint8(), "[num_frames]", "entries kept per frame, or null"),
        ("topk_code", pa.string()),
    ], metadata={FORMAT_KEY: FORMAT})


FEATURE_SCHEMA = feature_schema("uint8")
TARGET_SCHEMA = target_schema(None)
TARGET_COLUMNS = ("k", "topk_idx", "topk_logit", "topk_len", "topk_code")
LIST_COLUMNS = ("feats", "feat_min", "feat_scale", "labels", "frame_labels",
                "topk_idx", "topk_logit", "topk_len")


def partition_schema(features: pa.Schema = FEATURE_SCHEMA,
                     targets: pa.Schema = TARGET_SCHEMA) -> pa.Schema:
    """Feature rows plus the target columns (repartition's partitions), in the value types
    of the given feature and target schemas (a target column they lack: the fp16 layout's)."""
    feats = features.field("feats").type
    dtype = "float16" if pa.types.is_list(feats) and feats.value_type == pa.float16() \
        else "uint8"
    fields = list(feature_schema(dtype))
    for name in TARGET_COLUMNS:
        f = TARGET_SCHEMA.field(name)
        fields.append(f.with_type(targets.field(name).type) if name in targets.names else f)
    return pa.schema(fields, metadata={FORMAT_KEY: FORMAT})


# ----------------------------------------------------------------- tables
def list_array(values: Sequence[Any], value_type: pa.DataType, name: str = "") -> pa.ListArray:
    """Per row a numpy array (or None: a null row) -> one Arrow list array, built from one
    concatenation and the offsets (not value by value)."""
    dtype = np.dtype(value_type.to_pandas_dtype())
    arrays = [None if v is None else _cast(np.ravel(np.asarray(v)), dtype, name)
              for v in values]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([0 if a is None else len(a) for a in arrays], out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{name}: {offsets[-1]} values in one table; write fewer rows per file")
    flat = np.concatenate([a for a in arrays if a is not None] or [np.zeros(0, dtype)])
    mask = pa.array([a is None for a in arrays], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                    pa.array(flat, value_type), list_type(value_type), mask=mask)


def _cast(a: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    if a.dtype == dtype:
        return a
    out = a.astype(dtype)
    if dtype.kind in "iu" and not np.array_equal(out, a):
        raise ValueError(f"{name}: values outside {dtype}")
    return out


def to_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (the encoders' dicts; a missing key is null) -> a table of `schema`."""
    if "topk_code" in schema.names:
        codes = sorted({r.get("topk_code") for r in rows if r.get("topk_idx") is not None},
                       key=str)
        types = (schema.field("topk_idx").type.value_type,
                 schema.field("topk_logit").type.value_type)
        if len(codes) > 1 or (codes and topk_types(codes[0]) != types):
            raise ValueError(f"target rows of top-k codes {codes} for a "
                             f"schema of {schema.field('topk_idx').type}: one table holds "
                             f"one code (records.target_schema(code))")
    cols = [list_array([r.get(f.name) for r in rows], f.type.value_type, f.name)
            if pa.types.is_list(f.type) else pa.array([r.get(f.name) for r in rows], f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


def concat_tables(tables: Sequence[pa.Table]) -> pa.Table:
    """Tables of one schema but for the value type of all-null list columns (a shard without
    target rows next to a sqrt<L>-coded one) -> one table, in the type of the values."""
    tables = list(tables)
    out = []
    for t in tables:
        for i, f in enumerate(t.schema):
            held = {u.schema.field(f.name).type for u in tables
                    if u.column(f.name).null_count < u.num_rows}
            if len(held) > 1:
                raise ValueError(f"`{f.name}` is {sorted(map(str, held))} in different inputs "
                                 f"(features.storage_dtype or targets.codec changed within a "
                                 f"run): re-run that step with --force, then repartition")
            want = pa.field(f.name, held.pop(), metadata=f.metadata) if held else f
            if want.type != f.type and t.column(f.name).null_count == t.num_rows:
                t = t.set_column(i, want, pa.nulls(t.num_rows, want.type))
        out.append(t)
    return pa.concat_tables(out)


class ListRows:
    """One list column's rows as numpy views of its values (no copy), None for a null row."""

    def __init__(self, column: pa.ChunkedArray | pa.Array):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._starts = [0]
        for c in chunks:
            if len(c):
                valid = c.is_valid().to_numpy(zero_copy_only=False) if c.null_count else None
                self._parts.append((c.values.to_numpy(zero_copy_only=False),
                                    c.offsets.to_numpy(), valid))
                self._starts.append(self._starts[-1] + len(c))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> np.ndarray | None:
        if not 0 <= i < len(self):
            raise IndexError(i)
        p = 0 if len(self._parts) == 1 else bisect.bisect_right(self._starts, i) - 1
        values, offsets, valid = self._parts[p]
        j = i - self._starts[p]
        if valid is not None and not valid[j]:
            return None
        return values[offsets[j]:offsets[j + 1]]


def columns(table: pa.Table) -> dict[str, Sequence[Any]]:
    """Column name -> its rows: numpy views for the list columns, Python values otherwise."""
    return {name: ListRows(col) if pa.types.is_list(col.type) else col.to_pylist()
            for name, col in zip(table.column_names, table.columns)}


def iter_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of a (format-2) table as dicts of numpy views and Python values."""
    cols = columns(table)
    for i in range(table.num_rows):
        yield {name: col[i] for name, col in cols.items()}


def value_counts(table: pa.Table, name: str) -> np.ndarray:
    """int64 per row: the values in list column `name`, -1 where null or absent."""
    if name not in table.column_names:
        return np.full(table.num_rows, -1, np.int64)
    n = pc.fill_null(pc.list_value_length(table.column(name)), -1)
    return n.to_numpy(zero_copy_only=False).astype(np.int64)


# ----------------------------------------------------------------- format 1 (binary)
_LEGACY_DTYPES = {"feat_min": np.float32, "feat_scale": np.float32, "labels": np.int16,
                  "frame_labels": np.int16, "topk_len": np.uint8}
# What says a binary column's dtype, and the step that writes that column.
_LEGACY_KEYS = {"feats": ("feat_dtype", "features"), "topk_idx": ("topk_code", "targets"),
                "topk_logit": ("topk_code", "targets")}


def read_schema(storage: Any, uri: str) -> pa.Schema:
    fs, path = storage.resolve(uri)
    return storage.retry(lambda: pq.read_schema(path, filesystem=fs), f"schema {uri}")


def read_table(storage: Any, uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A records file (either format) with list columns; of `columns`, those the file has."""
    if columns is None:  # one read, no schema request
        return upgrade(storage.read_parquet(uri), uri)
    schema = read_schema(storage, uri)
    want = [c for c in columns if c in schema.names]
    extra = [key for name, (key, _) in _LEGACY_KEYS.items()
             if name in want and key in schema.names and key not in want
             and not pa.types.is_list(schema.field(name).type)]
    table = upgrade(storage.read_parquet(uri, columns=want + sorted(set(extra))), uri)
    return table.select(want)


def upgrade(table: pa.Table, where: str = "table") -> pa.Table:
    """Format-1 binary array columns -> the list columns of this format (the same values)."""
    for i, f in enumerate(table.schema):
        if f.name in LIST_COLUMNS and (pa.types.is_binary(f.type)
                                       or pa.types.is_large_binary(f.type)):
            dtype = _legacy_dtype(table, f.name, where)
            arr = pa.chunked_array([_bytes_to_list(c, dtype, f.name, where)
                                    for c in table.column(i).chunks],
                                   list_type(pa.from_numpy_dtype(dtype)))
            table = table.set_column(i, pa.field(f.name, arr.type), arr)
    return table


def _legacy_dtype(table: pa.Table, name: str, where: str) -> np.dtype:
    if name in _LEGACY_DTYPES:
        return np.dtype(_LEGACY_DTYPES[name])
    key, step = _LEGACY_KEYS[name]
    if key not in table.column_names:
        if key == "feat_dtype":
            raise ValueError(f"{where}: binary `feats` without `feat_dtype`: read both")
        codes = [None]  # targets written before topk_code existed: the fp16 layout
    else:
        present = table.column(name).is_valid()
        codes = sorted(set(table.column(key).filter(present).to_pylist()), key=str)
    if len(codes) > 1:
        raise ValueError(f"{where}: its rows mix {key} {codes} in one binary `{name}` column "
                         f"(the format before typed columns), which no one typed column "
                         f"holds: re-run `amflow {step}` (and repartition) to rewrite it")
    if name == "feats":
        kind = codes[0] if codes else "uint8"
        if kind not in FEAT_TYPES:
            raise ValueError(f"{where}: unknown feature dtype {kind!r}")
        return np.dtype(kind)
    types = topk_types(codes[0] if codes else None)
    return np.dtype((types[0] if name == "topk_idx" else types[1]).to_pandas_dtype())


def _bytes_to_list(chunk: pa.Array, dtype: np.dtype, name: str, where: str) -> pa.ListArray:
    """A binary array of raw `dtype` bytes per row -> list<dtype> (a null stays null)."""
    _, offs_buf, data_buf = chunk.buffers()[:3]
    ot = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
    offs = np.frombuffer(offs_buf, ot)[chunk.offset:chunk.offset + len(chunk) + 1] \
        if len(chunk) else np.zeros(1, ot)
    size = np.diff(offs)
    if (size % dtype.itemsize).any():
        bad = int(np.flatnonzero(size % dtype.itemsize)[0])
        raise ValueError(f"{where}: row {bad}'s `{name}` holds {size[bad]} bytes, no whole "
                         f"number of {dtype}")
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    values = np.frombuffer(data[offs[0]:offs[-1]].tobytes(), dtype)  # aligned copy
    mask = chunk.is_null() if chunk.null_count else None
    return pa.ListArray.from_arrays(pa.array(((offs - offs[0]) // dtype.itemsize)
                                             .astype(np.int32)), pa.array(values),
                                    list_type(pa.from_numpy_dtype(dtype)), mask=mask)


# ----------------------------------------------------------------- codecs
# The logit of a dropped entry: distillation's default fill (train.distill.topk_fill), so a
# pruned class weighs what a class outside the top-k weighs.
PAD_LOGIT = -1.0e4


def encode_feats(x: np.ndarray, dtype: str, stack: int = 1) -> dict[str, Any]:
    """float32 [T, D] -> the feature columns of one row.

    uint8 codes each column within this row's range. With `stack` > 1 (D = stack x mel
    bins) the `stack` columns holding the same mel bin share one range (over all the
    utterance's frames of that bin): `feat_min` and `feat_scale` are then the same D/stack
    values repeated `stack` times, which Parquet's zstd stores for about a third of the
    bytes (~1 MB less per audio hour on 3 s utterances)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    t, d = x.shape
    out: dict[str, Any] = {"num_frames": t, "feat_dim": d, "feat_dtype": dtype,
                           "feat_min": None, "feat_scale": None}
    if dtype == "float16":
        out["feats"] = x.astype(np.float16).reshape(-1)
        return out
    if dtype != "uint8":
        raise ValueError(f"unknown feature dtype {dtype!r}")
    if stack > 1 and t and d % stack == 0:
        v = x.reshape(t * stack, d // stack)
        lo = np.tile(v.min(axis=0), stack)
        scale = np.tile(np.maximum(v.max(axis=0) - v.min(axis=0), 1e-6) / 255.0, stack)
        q = (x - lo) / scale
        np.rint(q, out=q)
        np.clip(q, 0, 255, out=q)
    else:
        lo = x.min(axis=0) if t else np.zeros(d, np.float32)
        hi = x.max(axis=0) if t else np.zeros(d, np.float32)
        scale = np.maximum(hi - lo, 1e-6) / 255.0
        q = np.clip(np.rint((x - lo) / scale), 0, 255)
    out.update(feats=q.astype(np.uint8).reshape(-1), feat_min=lo.astype(np.float32),
               feat_scale=scale.astype(np.float32))
    return out


def _values(row: Mapping[str, Any], name: str, dtype: Any) -> np.ndarray:
    """A row's list value as a numpy array of `dtype`: the numpy view `columns` gives (or a
    Python list, as table.to_pylist() gives); a stored array of another dtype is refused."""
    v = row[name]
    dtype = np.dtype(dtype)
    if isinstance(v, np.ndarray):
        if v.dtype != dtype:
            raise ValueError(f"utterance {row.get('utt_id')}: `{name}` holds {v.dtype}, "
                             f"its code says {dtype}")
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        raise ValueError(f"`{name}` holds raw bytes (the format before typed columns): "
                         f"read the table with core.records.read_table or upgrade")
    return np.asarray(v, dtype)


def decode_feats(row: Mapping[str, Any]) -> np.ndarray:
    """The feature columns of one row -> float32 [T, D]."""
    t, d, dtype = int(row["num_frames"]), int(row["feat_dim"]), row["feat_dtype"]
    if dtype not in FEAT_TYPES:
        raise ValueError(f"unknown feature dtype {dtype!r}")
    q = _values(row, "feats", dtype).reshape(t, d).astype(np.float32)
    if dtype == "float16":
        return q
    return q * _values(row, "feat_scale", np.float32) + _values(row, "feat_min", np.float32)


def encode_int16(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(a, dtype=np.int16).reshape(-1)


def decode_int16(v: Any) -> np.ndarray | None:
    """A labels / frame_labels value (int16) -> int64, None for a null."""
    return None if v is None else _values({"v": v}, "v", np.int16).astype(np.int64)


def shift_offset(x: np.ndarray, offset: int, stack: int) -> np.ndarray:
    """Offset-0 stacked rows [T, stack*d] -> the rows at frame offset `offset` (< stack).

    Row t at offset o holds source frames 3t+o .. 3t+o+2, i.e. the tail of row t and
    the head of row t+1. The result has T-1 rows when offset > 0.
    """
    if offset == 0:
        return x
    d = x.shape[1] // stack
    flat = x.reshape(-1, d)[offset:]
    n = flat.shape[0] // stack
    return flat[: n * stack].reshape(n, stack * d)


def offset_labels(frame_labels: np.ndarray, offset: int, stack: int, num_rows: int) -> np.ndarray:
    """100 Hz labels -> one label per stacked row at `offset`: the centre source frame."""
    idx = np.arange(num_rows) * stack + offset + stack // 2
    idx = np.minimum(idx, len(frame_labels) - 1)
    return frame_labels[idx]


def quantize_sqrt(logp: np.ndarray, levels: int) -> np.ndarray:
    """log-probabilities -> uint8 round(levels * sqrt(p)), at least 1 (a kept class keeps
    some mass)."""
    q = np.rint(levels * np.exp(0.5 * np.asarray(logp, np.float64)))
    return np.clip(q, 1, levels).astype(np.uint8)


def quantize_ranked(logp: np.ndarray, keep: np.ndarray, levels: int) -> np.ndarray:
    """[T, k] log-probabilities of each frame's top k, best first, and which are kept ->
    uint8 levels, with each frame's best class strictly above its other kept entries: two
    classes within a level would otherwise tie, and the rebuilt distribution's argmax
    (the student's frame accuracy against its teacher) would be the lower class id on ~2 %
    of the demo teacher's frames. The best class is raised one level above the others
    (or they are lowered under the top level); it costs a little KL on those frames."""
    q = quantize_sqrt(logp, levels)
    if q.shape[1] < 2:
        return q
    others = np.where(keep[:, 1:], q[:, 1:], 0).max(1)
    clash = others >= q[:, 0]
    q[clash, 0] = np.minimum(others[clash] + 1, levels)
    at_top = clash & (others >= levels)
    q[at_top, 1:] = np.minimum(q[at_top, 1:], levels - 1)
    return q


def dequantize_sqrt(q: np.ndarray, levels: int) -> np.ndarray:
    """uint8 levels -> float32 log-probabilities."""
    return (2.0 * np.log(np.asarray(q, np.float64) / levels)).astype(np.float32)


def encode_topk(idx: np.ndarray, logit: np.ndarray, lens: np.ndarray | None = None,
                code: str = FP16_CODE, num_classes: int | None = None) -> dict[str, Any]:
    """[T, k] top-k indices and logits (and, pruned, the entries kept per frame) -> the
    target columns of one row, each frame's entries best first (as tasks.targets.topk
    gives them). With a `sqrt<L>` code `logit` must be the teacher's log-probabilities
    (log_softmax over every class) and `num_classes` picks the index width."""
    t, k = idx.shape
    out = {"num_frames": int(t), "k": int(k), "topk_len": None, "topk_code": None}
    keep = np.ones((t, k), bool)
    if lens is not None:
        lens = np.asarray(lens)
        if len(lens) != t or (t and (lens.min() < 1 or lens.max() > k)):
            raise ValueError(f"topk_len must give 1..{k} entries for each of {t} frames")
        keep = np.arange(k) < lens[:, None]
        out["topk_len"] = lens.astype(np.uint8)
    if code == FP16_CODE:
        out["topk_idx"] = np.ascontiguousarray(idx[keep], dtype=np.int16)
        out["topk_logit"] = np.ascontiguousarray(logit[keep], dtype=np.float16)
        return out
    levels = sqrt_levels(code)
    wide = num_classes is None or num_classes > 256
    q = quantize_ranked(logit, keep, levels)
    # Each frame's kept entries by class (runs repeat frame to frame); the dropped ones,
    # the tail of each row, sort last. A sort per row of k gives the bytes one lexsort over
    # every entry gave, 3-6x faster: that sort had been 85 % of the encoding (bench/GPU.md).
    order = np.argsort(np.where(keep, idx.astype(np.int32), np.int32(2**31 - 1)), axis=1)
    cls = np.take_along_axis(idx, order, 1)[keep]
    out["topk_code"] = f"sqrt{levels}-u{16 if wide else 8}"
    out["topk_idx"] = cls.astype(np.uint16 if wide else np.uint8)
    out["topk_logit"] = np.ascontiguousarray(np.take_along_axis(q, order, 1)[keep])
    return out


def _decode_entries(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One row's stored entries, flat: int64 classes and float32 logits."""
    code = row.get("topk_code")
    idx_type, val_type = topk_types(code)
    idx = _values(row, "topk_idx", idx_type.to_pandas_dtype()).astype(np.int64)
    vals = _values(row, "topk_logit", val_type.to_pandas_dtype())
    if not code:
        return idx, vals.astype(np.float32)
    if len(vals) and vals.min() < 1:
        raise ValueError(f"utterance {row.get('utt_id')}: a level 0 in {code} targets")
    return idx, dequantize_sqrt(vals, sqrt_levels(code))


def decode_topk(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One row's targets as int64 indices and float32 logits, [frames, k]."""
    k = int(row["k"])
    idx, logit = _decode_entries(row)
    lens = None if row.get("topk_len") is None else \
        _values(row, "topk_len", np.uint8).astype(np.int64)
    held = len(idx) if lens is None else int(lens.sum())
    if len(logit) != len(idx) or held != len(idx) or (lens is None and len(idx) % k):
        raise ValueError(f"utterance {row.get('utt_id')}: {len(idx)} top-k indices and "
                         f"{len(logit)} logits for k={k}"
                         + ("" if lens is None else f" and {held} entries in topk_len"))
    if lens is None:
        return idx.reshape(-1, k), logit.reshape(-1, k)
    t = len(lens)
    keep = np.arange(k) < lens[:, None]
    out_idx = _unkept_classes(idx, lens, k)
    out_idx[keep] = idx
    out_logit = np.full((t, k), PAD_LOGIT, np.float32)
    out_logit[keep] = logit
    return out_idx, out_logit


def _unkept_classes(idx: np.ndarray, lens: np.ndarray, k: int) -> np.ndarray:
    """[T, k]: in each frame's dropped slots, the smallest classes that frame does not
    keep (all < k), so no class appears twice in a frame."""
    t = len(lens)
    frame = np.repeat(np.arange(t), lens)
    kept = np.zeros((t, k), bool)
    small = idx < k
    kept[frame[small], idx[small]] = True
    free = np.argsort(kept, axis=1, kind="stable")  # the unkept classes first, ascending
    slot = np.clip(np.arange(k)[None, :] - lens[:, None], 0, k - 1)
    return np.take_along_axis(free, slot, axis=1)


def load_cmvn(stats: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """`cmvn.json` ({count, sum, sumsq}) -> (mean, inv_std) float32 vectors."""
    n = float(stats["count"])
    s = np.asarray(stats["sum"], dtype=np.float64)
    ss = np.asarray(stats["sumsq"], dtype=np.float64)
    mean = s / n
    var = np.maximum(ss / n - mean**2, 1e-8)
    return mean.astype(np.float32), (1.0 / np.sqrt(var)).astype(np.float32)
