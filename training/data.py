"""Training data loading: partitions -> shuffled, frame-budgeted minibatches.

Input: `runs/<R>/repartition/<split>/part-*.parquet`, one row per utterance in the
`core.records` feature format, plus `k`, `topk_idx`, `topk_logit` when the targets
step produced soft targets; the global CMVN from `features/cmvn.json`.

Two stages, so that a pass is fully determined before any feature is read:

1. `SplitIndex.load` reads only the small columns of a worker's partitions (ids,
   `num_frames`, label presence) and decides which rows are usable (the rest are counted
   as rejects with a reason). Each worker gets a disjoint set of partitions:
   `partitions[rank::world]`.
2. `plan_pass` turns the index and a `PassSpec` into windows of `shuffle_partitions`
   partitions, each with its list of minibatches (which rows and frame ranges). Chunked
   mode cuts every utterance into `chunk_frames` sub-sequences (plus unscored left/right
   context frames; at an utterance's edges the window slides so that it keeps the full
   length) and shuffles the chunks of all utterances in the window; a minibatch
   holds `minibatch_frames // chunk_frames` chunks. Full-sequence mode batches whole
   utterances of similar length up to `minibatch_frames` padded frames. The plan depends
   only on (seed, pass, rank), so a resumed run skips exactly the minibatches it did.

`BatchLoader` then materialises the plan in a background thread (read partition ->
decode features -> frame offset -> CMVN -> pad into tensors) and hands minibatches over
a bounded queue, so the model never waits on I/O.

Frame offsets: only offset 0 is stored; for labeled data with 100 Hz `frame_labels` the
pass's offset o is derived with `records.shift_offset` / `records.offset_labels` (one
row fewer per utterance when o > 0). Soft targets exist for offset 0 only.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from core import records
from core.prefetch import Prefetch
from core.outcomes import StepError
from core.storage import Storage, join

from training.losses import IGNORE

log = logging.getLogger(__name__)

FEATURE_COLUMNS = ["num_frames", "feat_dim", "feat_dtype", "feats", "feat_min", "feat_scale"]


# ----------------------------------------------------------------- normalisation
@dataclass
class Normalizer:
    """The global CMVN, an affine map applied to the stored (causal-mean-normalised) rows."""

    mean: np.ndarray
    inv_std: np.ndarray

    @classmethod
    def from_stats(cls, stats: dict[str, Any] | None, feat_dim: int) -> "Normalizer":
        if not stats:
            return cls(np.zeros(feat_dim, np.float32), np.ones(feat_dim, np.float32))
        mean, inv_std = records.load_cmvn(stats)
        if len(mean) != feat_dim:
            if len(mean) == 0 or feat_dim % len(mean):
                raise StepError(f"cmvn.json has {len(mean)} dims; features have {feat_dim}")
            reps = feat_dim // len(mean)  # per-mel-bin stats applied to each stacked frame
            mean, inv_std = np.tile(mean, reps), np.tile(inv_std, reps)
        return cls(mean.astype(np.float32), inv_std.astype(np.float32))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) * self.inv_std


# ----------------------------------------------------------------- the index
def partition_uris(storage: Storage, split_uri: str) -> list[str]:
    return [u for u in storage.list(split_uri, suffix=".parquet")
            if u.rsplit("/", 1)[-1].startswith("part-")]


@dataclass
class SplitIndex:
    """The usable rows of some partitions, and why the others were rejected."""

    uris: list[str]
    target: str  # labels | topk
    part: np.ndarray  # int32 per row: index into uris
    row: np.ndarray  # int32 per row: row within the partition
    frames: np.ndarray  # int64 per row: num_frames at offset 0
    has_frame_labels: np.ndarray  # bool per row
    utt_ids: list[str]
    conditions: list[str]
    feat_dim: int
    rows_in: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    reject_ids: list[tuple[str, str]] = field(default_factory=list)
    # target "tokens" (the CTC student): each row's token ids (training/ctc/data.py)
    tokens: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.row)

    @property
    def total_frames(self) -> int:
        return int(self.frames.sum())

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected.values())

    @classmethod
    def load(cls, storage: Storage, uris: Sequence[str], target: str = "labels",
             feat_dim: int | None = None, transcripts: dict[str, np.ndarray] | None = None,
             out_per_row: float = 1.0) -> "SplitIndex":
        """`target`: labels (hard labels needed), topk (soft targets needed), auto (labels
        when any row has them, else topk), or tokens (the CTC student's: a transcript in
        `transcripts` that fits the row at `out_per_row` model outputs per row)."""
        metas = []
        for i, uri in enumerate(uris):
            t = records.read_table(storage, uri, ["utt_id", "condition", "num_frames",
                                                  "feat_dim", "labels", "frame_labels", "k",
                                                  "topk_idx", "topk_len"])
            n = t.num_rows

            def col(name: str, fill: Any) -> np.ndarray:
                return t.column(name).to_numpy(zero_copy_only=False) if name in t.column_names \
                    else np.full(n, fill)

            def count(name: str) -> np.ndarray:  # values per row, -1 when null or absent
                return records.value_counts(t, name)

            metas.append({
                "part": np.full(n, i, np.int32), "row": np.arange(n, dtype=np.int32),
                "utt": [str(u) for u in col("utt_id", "")],
                "cond": ["" if c is None else str(c) for c in col("condition", "")],
                "frames": col("num_frames", 0).astype(np.int64),
                "dim": col("feat_dim", 0).astype(np.int64),
                "labels_len": count("labels"), "flabels_len": count("frame_labels"),
                "k": np.nan_to_num(col("k", np.nan).astype(np.float64), nan=-1).astype(np.int64)
                if "k" in t.column_names else np.full(n, -1, np.int64),
                "topk_len": count("topk_idx"), "pruned_len": count("topk_len"),
            })
        if not metas:
            return cls(list(uris), "labels" if target == "auto" else target,
                       np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64),
                       np.zeros(0, bool), [], [], feat_dim or 0)
        m = {k: (np.concatenate([x[k] for x in metas]) if k not in ("utt", "cond")
                 else [v for x in metas for v in x[k]]) for k in metas[0]}
        frames = m["frames"]
        has_labels = m["labels_len"] == frames
        has_flabels = m["flabels_len"] >= frames  # 100 Hz: at least one per stacked row
        full_topk = frames * np.maximum(m["k"], 0)
        pruned = m["pruned_len"] == frames  # one count per frame; decode checks the sum
        has_topk = (m["k"] > 0) & np.where(
            pruned, (m["topk_len"] >= frames) & (m["topk_len"] <= full_topk),
            (m["pruned_len"] == -1) & (m["topk_len"] == full_topk))
        if target == "auto":
            target = "labels" if bool((has_labels | has_flabels).any()) else "topk"
        if target not in ("labels", "topk", "tokens"):
            raise ValueError(f"unknown target kind {target!r}")
        dims = m["dim"][frames > 0]
        if feat_dim is None:
            feat_dim = int(np.bincount(dims).argmax()) if len(dims) else 0
        reason = np.full(len(frames), "", dtype=object)
        reason[frames <= 0] = "empty_features"
        reason[(reason == "") & (m["dim"] != feat_dim)] = "feat_dim_mismatch"
        if target == "labels":
            reason[(reason == "") & ~(has_labels | has_flabels)] = "missing_labels"
        elif target == "tokens":
            from training.ctc.batches import token_reasons

            reason = token_reasons(reason, m["utt"], frames, transcripts or {}, out_per_row)
        else:
            reason[(reason == "") & ~has_topk] = "missing_soft_targets"
        ok = reason == ""
        rejected, reject_ids = _count_rejects(reason, m["utt"])
        keep = np.nonzero(ok)[0]
        tokens = [transcripts[m["utt"][i]] for i in keep] if transcripts else None
        return cls(list(uris), target, m["part"][keep], m["row"][keep], frames[keep],
                   has_flabels[keep] & (target == "labels"),
                   [m["utt"][i] for i in keep], [m["cond"][i] for i in keep], int(feat_dim),
                   rows_in=len(frames), rejected=rejected, reject_ids=reject_ids,
                   tokens=tokens)

    def subset(self, keep: np.ndarray) -> "SplitIndex":
        keep = np.asarray(keep)
        if keep.dtype == bool:
            keep = np.nonzero(keep)[0]
        return replace(self, part=self.part[keep], row=self.row[keep], frames=self.frames[keep],
                       has_frame_labels=self.has_frame_labels[keep],
                       utt_ids=[self.utt_ids[i] for i in keep],
                       conditions=[self.conditions[i] for i in keep],
                       tokens=None if self.tokens is None else [self.tokens[i] for i in keep])


def _count_rejects(reason: np.ndarray, utts: list[str]
                   ) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """({reason: rows}, [(utt_id, reason)]) of the rows with a reason."""
    rejected: dict[str, int] = {}
    reject_ids = []
    for i in np.nonzero(reason != "")[0]:
        rejected[reason[i]] = rejected.get(reason[i], 0) + 1
        reject_ids.append((utts[i], str(reason[i])))
    return rejected, reject_ids


def rank_partitions(uris: Sequence[str], rank: int, world: int, split: str) -> list[str]:
    """Worker `rank`'s disjoint share of a split's partitions."""
    mine = list(uris)[rank::world]
    if not mine:
        raise StepError(f"split '{split}' has {len(uris)} partitions, fewer than the "
                        f"{world} training workers: re-run repartition with train.workers={world}")
    return mine


# ----------------------------------------------------------------- pass planning
@dataclass(frozen=True)
class PassSpec:
    mode: str = "chunk"  # chunk | full
    offset: int = 0
    stack: int = 3
    chunk_frames: int = 32
    left_context: int = 0
    right_context: int = 0
    minibatch_frames: int = 2048
    shuffle: bool = True
    shuffle_partitions: int = 4
    seed: int = 0  # shuffles chunks and batches (vary per pass)
    order_seed: int = 0  # shuffles the partition order (fixed across ssl sub-epochs)
    span: tuple[float, float] = (0.0, 1.0)  # the slice of the data (ssl sub-epochs)
    sortagrad: bool = False  # minibatches in increasing utterance length (SortaGrad)


@dataclass
class Window:
    parts: list[int]  # partition indices read by this window
    batches: list[np.ndarray]  # each [n, 5]: utt, in_start, in_end, score_start, score_end


@dataclass
class PassPlan:
    spec: PassSpec
    windows: list[Window]
    utterances: int
    frames: int  # scored frames in the pass

    @property
    def num_batches(self) -> int:
        return sum(len(w.batches) for w in self.windows)


def effective_offset(index: SplitIndex, offset: int) -> np.ndarray:
    """Per row: the offset actually used (0 where no 100 Hz labels allow another; a
    transcript fits any offset: every row of two or more frames takes it)."""
    if index.target == "tokens" and offset:
        return np.where(index.frames > 1, offset, 0).astype(np.int64)
    if index.target != "labels" or offset == 0:
        return np.zeros(len(index), np.int64)
    return np.where(index.has_frame_labels, offset, 0).astype(np.int64)


def rows_at_offset(index: SplitIndex, offset: int) -> np.ndarray:
    eff = effective_offset(index, offset)
    return np.where(eff > 0, index.frames - 1, index.frames)


def _seed(*parts: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]))


def plan_pass(index: SplitIndex, spec: PassSpec) -> PassPlan:
    rows = rows_at_offset(index, spec.offset)
    nparts = len(index.uris)
    order = _seed(spec.order_seed, 7).permutation(nparts) if spec.shuffle else np.arange(nparts)
    pos = np.empty(nparts, np.int64)
    pos[order] = np.arange(nparts)
    units = np.lexsort((index.row, pos[index.part]))  # partitions in order, rows in order
    cum = np.cumsum(rows[units]) - rows[units]
    total = int(rows.sum())
    a, b = spec.span
    lo, hi = a * total, b * total
    sel = units[(cum >= lo) & ((cum < hi) if b < 1.0 else np.ones(len(units), bool))]
    sel = sel[rows[sel] > 0]
    windows: list[Window] = []
    frames = 0
    if len(sel):
        part_seq = index.part[sel]
        # group consecutive partitions into windows
        boundaries = np.nonzero(np.diff(part_seq))[0] + 1
        groups = np.split(sel, boundaries)
        for w0 in range(0, len(groups), spec.shuffle_partitions):
            members = np.concatenate(groups[w0:w0 + spec.shuffle_partitions])
            rng = _seed(spec.seed, w0, 11)
            batches = (_chunk_batches if spec.mode == "chunk" else _full_batches)(
                members, rows, spec, rng)
            parts = sorted({int(p) for p in index.part[members]})
            windows.append(Window(parts, batches))
            frames += int(rows[members].sum())
    if spec.sortagrad:
        windows = _sortagrad(windows, rows)
    return PassPlan(spec, windows, int(len(sel)), frames)


def _sortagrad(windows: list[Window], rows: np.ndarray) -> list[Window]:
    """SortaGrad (DeepSpeech2) within the windowed loader: windows in increasing mean
    utterance length, and in each its minibatches by their longest utterance (stable), so
    the pass runs from short to long utterances without reading more than a window."""
    def longest(bt: np.ndarray) -> int:
        return int(rows[bt[:, 0]].max())

    for w in windows:
        w.batches = sorted(w.batches, key=longest)
    means = [float(np.mean([rows[bt[:, 0]].mean() for bt in w.batches])) if w.batches else 0.0
             for w in windows]
    return [windows[i] for i in np.argsort(means, kind="stable")]


def _chunk_batches(members: np.ndarray, rows: np.ndarray, spec: PassSpec,
                   rng: np.random.Generator) -> list[np.ndarray]:
    c = spec.chunk_frames
    pieces = []
    for u in members:
        r = int(rows[u])
        starts = np.arange(0, r, c)
        ends = np.minimum(starts + c, r)
        p = np.empty((len(starts), 5), np.int64)
        p[:, 0] = u
        # Every input window has the same length W (when the utterance is that long):
        # at the edges of an utterance the missing context is taken from the other side,
        # so a bidirectional model needs no packing for chunk minibatches.
        w = c + spec.left_context + spec.right_context
        p[:, 1] = np.clip(starts - spec.left_context, 0, max(r - w, 0))
        p[:, 2] = np.minimum(p[:, 1] + w, r)
        p[:, 3] = starts
        p[:, 4] = ends
        pieces.append(p)
    allp = np.concatenate(pieces)
    if spec.shuffle:
        allp = allp[rng.permutation(len(allp))]
    per = max(1, spec.minibatch_frames // c)
    return [allp[i:i + per] for i in range(0, len(allp), per)]


def _full_batches(members: np.ndarray, rows: np.ndarray, spec: PassSpec,
                  rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(len(members)) if spec.shuffle else np.arange(len(members))
    cand = members[order]
    cand = cand[np.argsort(rows[cand], kind="stable")]  # similar lengths together
    batches, cur, longest = [], [], 0
    for u in cand:
        r = int(rows[u])
        if cur and max(longest, r) * (len(cur) + 1) > spec.minibatch_frames:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(u)
        longest = max(longest, r)
    if cur:
        batches.append(cur)
    out = []
    for bt in batches:
        p = np.zeros((len(bt), 5), np.int64)
        p[:, 0] = bt
        p[:, 2] = rows[bt]
        p[:, 4] = rows[bt]
        out.append(p)
    if spec.shuffle:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


# ----------------------------------------------------------------- minibatches
@dataclass
class Batch:
    x: torch.Tensor  # [B, T, D] float32, zero padded
    lengths: torch.Tensor  # [B] int64 input frames per sequence
    mask: torch.Tensor  # [B, T] bool: frames that are scored
    labels: torch.Tensor | None = None  # [B, T] int64, IGNORE where not scored
    topk_idx: torch.Tensor | None = None  # [B, T, k] int64
    topk_logit: torch.Tensor | None = None  # [B, T, k] float32
    frames: int = 0  # scored frames
    utts: list[int] | None = None  # index rows (full mode only; for per-utterance scoring)
    tokens: torch.Tensor | None = None  # [B, L] int64 CTC targets, zero padded
    token_lengths: torch.Tensor | None = None  # [B] int64

    def to(self, device: torch.device | str) -> "Batch":
        if str(device) == "cpu":
            return self
        mv = {k: (getattr(self, k).to(device, non_blocking=True)
                  if isinstance(getattr(self, k), torch.Tensor) else getattr(self, k))
              for k in ("x", "mask", "labels", "topk_idx", "topk_logit", "tokens",
                        "token_lengths")}
        return replace(self, **mv)


class _Utterances:
    """Decoded, normalised utterances of one window, at the pass's offset."""

    def __init__(self, storage: Storage, index: SplitIndex, normalizer: Normalizer,
                 offset: int, stack: int):
        self.storage = storage
        self.index = index
        self.norm = normalizer
        self.eff = effective_offset(index, offset)
        self.stack = stack
        self.cache: dict[int, tuple] = {}
        self.tables: dict[int, dict[str, list]] = {}

    def load_parts(self, parts: list[int], needed: np.ndarray) -> None:
        self.cache.clear()
        self.tables.clear()
        target = self.index.target
        want = FEATURE_COLUMNS + (["labels", "frame_labels"] if target == "labels"
                                  else list(records.TARGET_COLUMNS) if target == "topk" else [])
        for p in parts:
            t = records.read_table(self.storage, self.index.uris[p], want)
            self.tables[p] = records.columns(t)  # the arrays as numpy views, no copy
        for u in np.unique(needed):
            self.cache[int(u)] = self._decode(int(u))
        self.tables.clear()

    def _decode(self, u: int) -> tuple:
        idx = self.index
        tab = self.tables[int(idx.part[u])]
        r = int(idx.row[u])
        row = {c: tab[c][r] for c in tab}
        x = records.decode_feats(row)
        if x.shape[1] != idx.feat_dim:
            raise StepError(f"utterance {idx.utt_ids[u]}: feature dim {x.shape[1]} != "
                            f"{idx.feat_dim}")
        o = int(self.eff[u])
        if o:
            x = records.shift_offset(x, o, self.stack)
        x = self.norm(x).astype(np.float32, copy=False)
        n = x.shape[0]
        if idx.target == "tokens":
            return x, idx.tokens[u]  # type: ignore[index]
        if idx.target == "labels":
            lab = records.decode_int16(row.get("labels"))
            if o == 0 and lab is not None and len(lab) == n:
                return x, lab
            fl = records.decode_int16(row.get("frame_labels"))
            if fl is None or len(fl) == 0:
                raise StepError(f"utterance {idx.utt_ids[u]}: no usable labels")
            return x, records.offset_labels(fl, o, self.stack, n)
        row["utt_id"] = idx.utt_ids[u]
        try:
            ti, tv = records.decode_topk(row)
        except ValueError as e:
            raise StepError(str(e)) from e
        ti, tv = ti[:n], tv[:n]  # offsets 1 and 2 lose the last row
        if ti.shape[0] != n:
            raise StepError(f"utterance {idx.utt_ids[u]}: {ti.shape[0]} target frames for "
                            f"{n} feature frames")
        return x, ti, tv

    def collate(self, pieces: np.ndarray, keep_utts: bool) -> Batch:
        if self.index.target == "tokens":
            from training.ctc.batches import pad_tokens

            x, lens, mask, toks, tok_lens = pad_tokens(self.cache, pieces, self.index.feat_dim)
            return Batch(x, lens, mask, frames=int(tok_lens.sum()), tokens=toks,
                         token_lengths=tok_lens,
                         utts=[int(u) for u in pieces[:, 0]] if keep_utts else None)
        b = len(pieces)
        lens = (pieces[:, 2] - pieces[:, 1]).astype(np.int64)
        t = int(lens.max())
        d = self.index.feat_dim
        x = np.zeros((b, t, d), np.float32)
        mask = np.zeros((b, t), bool)
        soft = self.index.target == "topk"
        if soft:
            k = self.cache[int(pieces[0, 0])][1].shape[1]
            ti = np.zeros((b, t, k), np.int64)
            tv = np.zeros((b, t, k), np.float32)
        else:
            y = np.full((b, t), IGNORE, np.int64)
        for i, (u, s0, e0, s1, e1) in enumerate(pieces):
            item = self.cache[int(u)]
            x[i, :e0 - s0] = item[0][s0:e0]
            a, z = s1 - s0, e1 - s0
            mask[i, a:z] = True
            if soft:
                if item[1].shape[1] != k:
                    raise StepError("soft targets with different k in one minibatch")
                ti[i, a:z] = item[1][s1:e1]
                tv[i, a:z] = item[2][s1:e1]
            else:
                y[i, a:z] = item[1][s1:e1]
        out = Batch(torch.from_numpy(x), torch.from_numpy(lens), torch.from_numpy(mask),
                    frames=int(mask.sum()),
                    utts=[int(u) for u in pieces[:, 0]] if keep_utts else None)
        if soft:
            out.topk_idx, out.topk_logit = torch.from_numpy(ti), torch.from_numpy(tv)
        else:
            out.labels = torch.from_numpy(y)
        return out


class BatchLoader:
    """Iterates the minibatches of one pass, produced ahead by a background thread.

    `start` skips the first minibatches (resume); `limit` truncates the pass (so that
    every worker runs the same number of steps).
    """

    def __init__(self, storage: Storage, index: SplitIndex, spec: PassSpec,
                 normalizer: Normalizer, start: int = 0, prefetch: int = 4,
                 keep_utts: bool = False):
        self.storage = storage
        self.index = index
        self.spec = spec
        self.norm = normalizer
        self.plan = plan_pass(index, spec)
        self.start = start
        self.limit = self.plan.num_batches
        self.prefetch = max(1, prefetch)
        self.keep_utts = keep_utts
        self._ahead = Prefetch(self.batches, self.prefetch, name="amflow-loader")

    @property
    def num_batches(self) -> int:
        return self.plan.num_batches

    def set_limit(self, n: int) -> None:
        self.limit = min(n, self.plan.num_batches)

    def batches(self) -> Iterator[Batch]:
        """Synchronous generator of the minibatches in [start, limit)."""
        utts = _Utterances(self.storage, self.index, self.norm, self.spec.offset,
                           self.spec.stack)
        pos = 0
        for w in self.plan.windows:
            n = len(w.batches)
            lo, hi = max(self.start - pos, 0), min(self.limit - pos, n)
            if lo < hi:
                needed = np.concatenate([bt[:, 0] for bt in w.batches[lo:hi]])
                utts.load_parts(w.parts, needed)
                for bt in w.batches[lo:hi]:
                    yield utts.collate(bt, self.keep_utts)
            pos += n
            if pos >= self.limit:
                break

    @property
    def wait_s(self) -> float:
        """Time the consumer spent waiting for data."""
        return self._ahead.wait_s

    @property
    def produce_s(self) -> float:
        return self._ahead.produce_s

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._ahead)

    def close(self) -> None:
        self._ahead.close()


# ----------------------------------------------------------------- augmentation
def spec_augment(x: torch.Tensor, gen: torch.Generator, stack: int, freq_masks: int = 2,
                 freq_mask_bins: int = 8, time_masks: int = 2, time_mask_rows: int = 3
                 ) -> torch.Tensor:
    """SpecAugment-style masking of a padded batch [B, T, stack * bins] (a new tensor).

    Each sequence gets `freq_masks` bands of 0..freq_mask_bins mel bins, zeroed in every
    stacked frame of every row, and `time_masks` spans of 0..time_mask_rows rows. Zero is
    the global mean after CMVN. All randomness comes from `gen`, so a run seeded per
    minibatch is reproducible (and resumable) exactly.
    """
    b, t, d = x.shape
    bins = d // stack
    keep = torch.ones(b, t, d, dtype=x.dtype)
    if freq_masks and freq_mask_bins:
        idx = torch.arange(bins)
        fmask = torch.zeros(b, bins, dtype=torch.bool)
        for _ in range(freq_masks):
            w = torch.randint(0, freq_mask_bins + 1, (b, 1), generator=gen)
            f0 = (torch.rand(b, 1, generator=gen) * (bins - w + 1)).long()
            fmask |= (idx >= f0) & (idx < f0 + w)
        keep = keep * (~fmask).to(x.dtype).repeat(1, stack)[:, None, :]
    if time_masks and time_mask_rows:
        idx = torch.arange(t)
        tmask = torch.zeros(b, t, dtype=torch.bool)
        for _ in range(time_masks):
            w = torch.randint(0, time_mask_rows + 1, (b, 1), generator=gen)
            t0 = (torch.rand(b, 1, generator=gen) * (t - w + 1).clamp_min(1)).long()
            tmask |= (idx >= t0) & (idx < t0 + w)
        keep = keep * (~tmask).to(x.dtype)[:, :, None]
    return x * keep.to(x.device)


# ----------------------------------------------------------------- a synthetic task
def synthetic_utterance(rng: np.random.Generator, means: np.ndarray, stack: int,
                        min_dur: int = 2, max_dur: int = 6, rows: tuple[int, int] = (20, 60),
                        noise: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """100 Hz frames (phone means + noise) and their labels; durations in stacked rows."""
    num_classes, d = means.shape
    target = int(rng.integers(rows[0], rows[1] + 1)) * stack
    labels: list[int] = []
    prev = -1
    while len(labels) < target:
        c = int(rng.integers(num_classes))
        if c == prev:
            continue
        labels += [c] * (int(rng.integers(min_dur, max_dur + 1)) * stack)
        prev = c
    lab = np.asarray(labels[:target], np.int64)
    x = means[lab] + noise * rng.standard_normal((target, d)).astype(np.float32)
    return x.astype(np.float32), lab


def synthetic_rows(n_utts: int, means: np.ndarray, stack: int, seed: int, split: str,
                   dtype: str = "float16", soft_k: int = 0, noise: float = 1.0,
                   teacher_sharpness: float = 4.0, condition: str = "DP1",
                   rows: tuple[int, int] = (20, 60)) -> list[dict[str, Any]]:
    """Rows in the repartition format for a learnable synthetic phone task.

    Labeled rows carry `labels` and `frame_labels`; with `soft_k` > 0 the rows carry
    top-k soft targets instead (an oracle teacher: the true class gets
    `teacher_sharpness` plus noise, the others noise).
    """
    rng = np.random.default_rng(seed)
    num_classes, d = means.shape
    out = []
    for i in range(n_utts):
        x100, lab100 = synthetic_utterance(rng, means, stack, noise=noise, rows=rows)
        t = len(x100) // stack
        feats = x100[: t * stack].reshape(t, stack * d)
        row: dict[str, Any] = {"utt_id": f"{split}-{seed}-{i:05d}", "speaker_id": f"spk{i % 7}",
                               "split": split, "condition": condition, "shard": "synthetic",
                               **records.encode_feats(feats, dtype)}
        if soft_k:
            centre = records.offset_labels(lab100, 0, stack, t)
            logits = rng.standard_normal((t, num_classes)).astype(np.float32)
            logits[np.arange(t), centre] += teacher_sharpness
            k = min(soft_k, num_classes)
            idx = np.argsort(-logits, axis=1)[:, :k]
            row.update(labels=None, frame_labels=None,
                       **records.encode_topk(idx, np.take_along_axis(logits, idx, 1)))
        else:
            row.update(labels=records.encode_int16(records.offset_labels(lab100, 0, stack, t)),
                       frame_labels=records.encode_int16(lab100))
        out.append(row)
    return out


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = records.feature_schema(rows[0]["feat_dtype"] if rows else "uint8")
    if rows and "k" in rows[0]:
        code = next((r.get("topk_code") for r in rows if r.get("topk_idx") is not None), None)
        schema = records.partition_schema(schema, records.target_schema(code))
    return records.to_table(rows, schema)


def cmvn_stats(tables: Sequence[pa.Table]) -> dict[str, Any]:
    s = ss = None
    n = 0
    for t in tables:
        for row in records.iter_rows(t.select(FEATURE_COLUMNS)):
            x = records.decode_feats(row).astype(np.float64)
            s = x.sum(0) if s is None else s + x.sum(0)
            ss = (x**2).sum(0) if ss is None else ss + (x**2).sum(0)
            n += len(x)
    return {"count": n, "sum": s.tolist(), "sumsq": ss.tolist()}


def make_synthetic_data(storage: Storage, features_dir: str, repartition_dir: str,
                        num_classes: int = 8, base_dim: int = 16, stack: int = 3,
                        splits: dict[str, dict[str, Any]] | None = None, seed: int = 0,
                        dtype: str = "float16", noise: float = 1.0) -> dict[str, Any]:
    """Write tiny training data: <features_dir>/{cmvn,phones}.json and
    <repartition_dir>/<split>/part-*.parquet (amflow.services.synthetic_run puts them in a
    run, with the steps' markers).

    `splits` maps a split name to {"utts": n, "parts": p, "soft_k": k (0 = labels)}.
    Returns {"phones", "feat_dim", "splits": {name: [uris]}}.
    """
    splits = splits or {"labeled": {"utts": 40, "parts": 2}, "dev": {"utts": 10, "parts": 1}}
    rng = np.random.default_rng(seed + 1000)
    means = (1.5 * rng.standard_normal((num_classes, base_dim))).astype(np.float32)
    phones = [f"p{i}" for i in range(num_classes)]
    out: dict[str, Any] = {"phones": phones, "feat_dim": base_dim * stack, "splits": {}}
    tables = []
    for si, (name, sp) in enumerate(sorted(splits.items())):
        rows = synthetic_rows(sp["utts"], means, stack, seed * 100 + si, name, dtype,
                              soft_k=sp.get("soft_k", 0), noise=noise,
                              rows=sp.get("rows", (20, 60)))
        parts = max(1, sp.get("parts", 1))
        uris = []
        for p in range(parts):
            t = rows_table(rows[p::parts])
            uri = join(repartition_dir, name, f"part-{p:05d}.parquet")
            storage.write_parquet(uri, t)
            uris.append(uri)
            if name != "dev":
                tables.append(t)
        out["splits"][name] = uris
    storage.write_json(join(features_dir, "cmvn.json"), cmvn_stats(tables))
    storage.write_json(join(features_dir, "phones.json"), phones)
    return out


def loader_throughput(storage: Storage, index: SplitIndex, spec: PassSpec, normalizer: Normalizer,
                      max_batches: int | None = None, prefetch: int = 4) -> dict[str, float]:
    """Frames/s of the loader alone (decode, CMVN, batching), draining one pass."""
    loader = BatchLoader(storage, index, spec, normalizer, prefetch=prefetch)
    if max_batches is not None:
        loader.set_limit(max_batches)
    t0 = time.perf_counter()
    frames = batches = 0
    for b in loader:
        frames += b.frames
        batches += 1
    dt = time.perf_counter() - t0
    return {"frames": frames, "batches": batches, "seconds": dt,
            "frames_per_s": frames / dt if dt > 0 else math.inf}
