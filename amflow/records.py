"""Row formats shared by the data steps and the trainers.

Feature rows (features step, repartition, data loader) hold one utterance each:

    utt_id, speaker_id, split, condition, shard : string
    num_frames   : int32   low-frame-rate rows (after stacking `stack` frames, offset 0)
    feat_dim     : int16   192 for 64 mel bins x 3
    feat_dtype   : string  "float16" | "uint8"
    feats        : binary  row-major num_frames x feat_dim
    feat_min     : binary  float32[feat_dim] (uint8 only: per-column range of this row)
    feat_scale   : binary  float32[feat_dim] (uint8 only)
    labels       : binary  int16[num_frames] phone ids at offset 0 (centre frame), or null
    frame_labels : binary  int16 at the full 100 Hz rate, or null (derives offsets 1, 2)

Features are stored after the causal mean normalisation and before the global CMVN,
which is an affine map the loader applies from `features/cmvn.json`. Only offset 0 is
stored: with stack == subsample the offset-o rows are the offset-0 rows shifted by o
source frames, so `shift_offset` derives offsets 1 and 2 exactly (losing the last row).

Target rows (targets step) are aligned row for row with the features of the same shard:

    utt_id : string, num_frames : int32, k : int16,
    topk_idx : binary int16[num_frames x k], topk_logit : binary float16[num_frames x k]
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa

FEATURE_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("speaker_id", pa.string()), ("split", pa.string()),
    ("condition", pa.string()), ("shard", pa.string()),
    ("num_frames", pa.int32()), ("feat_dim", pa.int16()), ("feat_dtype", pa.string()),
    ("feats", pa.binary()), ("feat_min", pa.binary()), ("feat_scale", pa.binary()),
    ("labels", pa.binary()), ("frame_labels", pa.binary()),
])

TARGET_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("num_frames", pa.int32()), ("k", pa.int16()),
    ("topk_idx", pa.binary()), ("topk_logit", pa.binary()),
])


def encode_feats(x: np.ndarray, dtype: str) -> dict[str, Any]:
    """float32 [T, D] -> the feature columns of one row."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    t, d = x.shape
    out: dict[str, Any] = {"num_frames": t, "feat_dim": d, "feat_dtype": dtype,
                           "feat_min": None, "feat_scale": None}
    if dtype == "float16":
        out["feats"] = x.astype(np.float16).tobytes()
    elif dtype == "uint8":
        lo = x.min(axis=0) if t else np.zeros(d, np.float32)
        hi = x.max(axis=0) if t else np.zeros(d, np.float32)
        scale = np.maximum(hi - lo, 1e-6) / 255.0
        q = np.clip(np.rint((x - lo) / scale), 0, 255).astype(np.uint8)
        out.update(feats=q.tobytes(), feat_min=lo.astype(np.float32).tobytes(),
                   feat_scale=scale.astype(np.float32).tobytes())
    else:
        raise ValueError(f"unknown feature dtype {dtype!r}")
    return out


def decode_feats(row: Mapping[str, Any]) -> np.ndarray:
    """The feature columns of one row -> float32 [T, D]."""
    t, d, dtype = int(row["num_frames"]), int(row["feat_dim"]), row["feat_dtype"]
    if dtype == "float16":
        return np.frombuffer(row["feats"], dtype=np.float16).reshape(t, d).astype(np.float32)
    if dtype == "uint8":
        q = np.frombuffer(row["feats"], dtype=np.uint8).reshape(t, d).astype(np.float32)
        lo = np.frombuffer(row["feat_min"], dtype=np.float32)
        scale = np.frombuffer(row["feat_scale"], dtype=np.float32)
        return q * scale + lo
    raise ValueError(f"unknown feature dtype {dtype!r}")


def encode_int16(a: np.ndarray | None) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a, dtype=np.int16).tobytes()


def decode_int16(b: bytes | None) -> np.ndarray | None:
    return None if b is None else np.frombuffer(b, dtype=np.int16).astype(np.int64)


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


def encode_topk(idx: np.ndarray, logit: np.ndarray) -> dict[str, Any]:
    return {"num_frames": int(idx.shape[0]), "k": int(idx.shape[1]),
            "topk_idx": np.ascontiguousarray(idx, dtype=np.int16).tobytes(),
            "topk_logit": np.ascontiguousarray(logit, dtype=np.float16).tobytes()}


def decode_topk(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    t, k = int(row["num_frames"]), int(row["k"])
    idx = np.frombuffer(row["topk_idx"], dtype=np.int16).reshape(t, k).astype(np.int64)
    logit = np.frombuffer(row["topk_logit"], dtype=np.float16).reshape(t, k).astype(np.float32)
    return idx, logit


def load_cmvn(stats: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """`cmvn.json` ({count, sum, sumsq}) -> (mean, inv_std) float32 vectors."""
    n = float(stats["count"])
    s = np.asarray(stats["sum"], dtype=np.float64)
    ss = np.asarray(stats["sumsq"], dtype=np.float64)
    mean = s / n
    var = np.maximum(ss / n - mean**2, 1e-8)
    return mean.astype(np.float32), (1.0 / np.sqrt(var)).astype(np.float32)
