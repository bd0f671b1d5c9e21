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
    topk_len : binary uint8[num_frames] or null

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
so the rebuilt argmax is the teacher's. The code's names: amflow/target_codes.py.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from core.target_codes import FP16_CODE, index_bytes, sqrt_levels

FEATURE_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("speaker_id", pa.string()), ("split", pa.string()),
    ("condition", pa.string()), ("shard", pa.string()),
    ("num_frames", pa.int32()), ("feat_dim", pa.int16()), ("feat_dtype", pa.string()),
    ("feats", pa.binary()), ("feat_min", pa.binary()), ("feat_scale", pa.binary()),
    ("labels", pa.binary()), ("frame_labels", pa.binary()),
])

TARGET_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("num_frames", pa.int32()), ("k", pa.int16()),
    ("topk_idx", pa.binary()), ("topk_logit", pa.binary()), ("topk_len", pa.binary()),
    ("topk_code", pa.string()),
])
TARGET_COLUMNS = ("k", "topk_idx", "topk_logit", "topk_len", "topk_code")

# The logit of a dropped entry: distillation's default fill (train.distill.topk_fill), so a
# pruned class weighs what a class outside the top-k weighs.
PAD_LOGIT = -1.0e4


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
        out["topk_len"] = lens.astype(np.uint8).tobytes()
    if code == FP16_CODE:
        out["topk_idx"] = np.ascontiguousarray(idx[keep], dtype=np.int16).tobytes()
        out["topk_logit"] = np.ascontiguousarray(logit[keep], dtype=np.float16).tobytes()
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
    out["topk_idx"] = cls.astype(np.uint16 if wide else np.uint8).tobytes()
    out["topk_logit"] = np.take_along_axis(q, order, 1)[keep].tobytes()
    return out


def _decode_entries(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One row's stored entries, flat: int64 classes and float32 logits."""
    code = row.get("topk_code")
    if not code:
        return (np.frombuffer(row["topk_idx"], dtype=np.int16).astype(np.int64),
                np.frombuffer(row["topk_logit"], dtype=np.float16).astype(np.float32))
    levels = sqrt_levels(code)
    width = np.uint8 if index_bytes(code) == 1 else np.uint16
    q = np.frombuffer(row["topk_logit"], dtype=np.uint8)
    if len(q) and q.min() < 1:
        raise ValueError(f"utterance {row.get('utt_id')}: a level 0 in {code} targets")
    return (np.frombuffer(row["topk_idx"], dtype=width).astype(np.int64),
            dequantize_sqrt(q, levels))


def decode_topk(row: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One row's targets as int64 indices and float32 logits, [frames, k]."""
    k = int(row["k"])
    idx, logit = _decode_entries(row)
    lens = None if row.get("topk_len") is None else \
        np.frombuffer(row["topk_len"], dtype=np.uint8).astype(np.int64)
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
