"""`amflow features`: per-speaker log-mel streams, causal CMN, LFR rows, global CMVN stats.

Reads  `runs/<R>/select/shards/*.parquet` (+ `shards.json`), the audio they point at,
       `<corpus>/alignments.ctm` and optional `<corpus>/phones.txt`.
Writes `runs/<R>/features/shards/<shard_id>.parquet`  rows in records.feature_schema(features.storage_dtype)
       `runs/<R>/features/rejects/<shard_id>.parquet` rejected utterances with reasons
       `runs/<R>/features/_shards/<shard_id>.json`    per-shard done-marker and stats
       `runs/<R>/features/cmvn.json`                  {count, sum, sumsq} over 192-d rows
       `runs/<R>/features/phones.json`                class names; index = class id
       `runs/<R>/features/shards.json`                shard index in the shuffled order
       `runs/<R>/features/_SUCCESS.json`

Public, pure functions (what `amflow evaluate` calls to featurise audio the same way):

    featurize_stream(waves, fcfg) -> list[np.ndarray]
        One speaker's utterances in time order (float32 mono [-1, 1] at fcfg.sample_rate)
        -> per utterance float32 [rows, stack * bins] low-frame-rate rows at offset 0,
        after the causal mean normalisation and before the global CMVN (which the loader
        applies from cmvn.json). Utterances too short for one row give a [0, D] array.
    stack_frames(x, stack, subsample) -> [rows, stack * bins]
    encode_rows(x, dtype, stack) -> the feature columns of one row (uint8 / float16)
    StreamCMN(dim, window, min_window).apply(frames) -> normalised frames (stateful)
    process_shard(job, shard_id, payload) -> stats       the Ray task of one shard

The causal mean normalisation (Kaldi's `apply-cmvn-sliding --center=false
--norm-vars=false`, applied to a speaker's whole stream): the speaker's utterances, sorted
by `created_at`, are concatenated into one stream of 100 Hz fbank frames x_0 .. x_{N-1}.
Frame t becomes x_t - mean(x_s .. x_t) with s = max(0, t - cmn_window + 1), i.e. the mean
of the last `cmn_window` frames up to and including t, carried across utterance
boundaries. Only where that window would hold fewer than `cmn_min_window` frames (the
first second of a speaker's stream) the mean is over the first min(cmn_min_window, N)
frames of the stream instead (Kaldi's cold start; the only look-ahead, and only at a
stream's start). Variance is not normalised here; the global CMVN does that.

Low frame rate: frames are stacked `stack` at a time with step `subsample` (3 and 3): row r
holds frames 3r, 3r+1, 3r+2 (so a T-frame utterance has floor(T/3) rows, 192-d @ 33 Hz).
Only offset 0 is stored; records.shift_offset derives offsets 1 and 2.
Labels: `frame_labels` are the 100 Hz phone ids (tasks.alignments.frame_labels); `labels`
the id of each row's centre frame (3r + 1). With features.labels=align the 100 Hz labels
are `amflow align`'s network-tree leaves instead (runs/<R>/align/, core.senones), the
classes are those leaves (phones.json: "<phone>/<leaf>"), context.json holds the tree.

Hierarchical shuffle: the shard order is a seeded permutation (features.seed), recorded in
`shards.json` and used to dispatch shards; within a shard the rows are written in a
permutation seeded by (features.seed, shard id). Features are computed in stream order
before that, so the shuffle never disturbs the normalisation.
"""
from __future__ import annotations

import collections
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from core import records
from core.config import FeaturesConfig, StorageConfig
from core.reject_hints import nothing_left
from core.outcomes import Reject, StepError, rejects_table
from core.senones import fit_frames
from core.storage import Storage, join
from tasks import alignments as al
from tasks.audio import decode_audio, read_audio_bytes
from tasks.fbank import FbankComputer, fbank

log = logging.getLogger(__name__)

LABELED_SPLITS = ("labeled", "dev", "test")  # splits whose utterances carry alignments
TRAIN_SPLITS = ("labeled", "unlabeled")      # splits the global CMVN is estimated on


# --------------------------------------------------------------------------- pure core
class StreamCMN:
    """Causal sliding-window mean normalisation over one speaker's stream (see module doc)."""

    def __init__(self, dim: int, window: int, min_window: int):
        self.window = int(window)
        self.min_window = int(min(min_window, window))
        self.hist = np.zeros((0, dim), dtype=np.float32)
        self.seen = 0
        self._cold_mean: np.ndarray | None = None

    def apply(self, x: np.ndarray, final: bool = True) -> np.ndarray:
        """Normalise the next `x` [n, dim] frames of the stream.

        `final` says no more frames follow; it only matters while the stream is shorter
        than `min_window` (then the cold-start mean covers all frames seen so far).
        """
        n = x.shape[0]
        if n == 0:
            return x.astype(np.float32, copy=True)
        h = self.hist.shape[0]
        ext = np.concatenate([self.hist, x]) if h else np.asarray(x, dtype=np.float32)
        m, d = ext.shape
        W = self.window
        # Prefix sums along time, in a [dim, time] layout (numpy's cumsum is ~5x faster
        # along the contiguous axis), of (ext - ref): centred, so float32 stays exact enough.
        ref = ext[: min(m, 100)].mean(axis=0, dtype=np.float64).astype(np.float32)
        cs = np.empty((d, m + 1), dtype=np.float32)
        cs[:, 0] = 0.0
        np.subtract(ext.T, ref[:, None], out=cs[:, 1:])
        np.cumsum(cs[:, 1:], axis=1, out=cs[:, 1:])
        # New frame j (global t = seen + j) averages ext[s_j : h + j + 1] with
        # s_j = max(0, j - g), g = W - 1 - h: the last W frames, fewer at a stream's start.
        g = W - 1 - h
        win = cs[:, h + 1:h + n + 1].copy()
        if n > g + 1:
            win[:, g + 1:] -= cs[:, 1:n - g]
        j = np.arange(n)
        cnt = np.where(j <= g, h + 1 + j, W).astype(np.float32)
        win /= cnt
        cold = max(0, min(n, self.min_window - 1 - self.seen))  # frames t + 1 < min_window
        if cold:
            if self._cold_mean is None:
                k = min(self.min_window, m)
                if k >= self.min_window or final:
                    self._cold_mean = cs[:, k] / np.float32(k) + ref
            if self._cold_mean is not None:
                win[:, :cold] = (self._cold_mean - ref)[:, None]
        out = x - ref
        out -= win.T
        keep = self.window - 1
        self.hist = ext[-keep:].astype(np.float32, copy=True) if keep else ext[:0]
        self.seen += n
        return out


def stack_frames(x: np.ndarray, stack: int, subsample: int) -> np.ndarray:
    """[T, d] -> [rows, stack * d]; row r holds frames r*subsample .. r*subsample+stack-1."""
    t, d = x.shape
    rows = 0 if t < stack else (t - stack) // subsample + 1
    if rows == 0:
        return np.zeros((0, stack * d), dtype=np.float32)
    if stack == subsample:
        return np.ascontiguousarray(x[: rows * stack]).reshape(rows, stack * d)
    x = np.ascontiguousarray(x)
    view = np.lib.stride_tricks.as_strided(
        x, shape=(rows, stack * d), strides=(subsample * x.strides[0], x.strides[1]),
        writeable=False)
    return np.array(view)


def encode_rows(x: np.ndarray, dtype: str, stack: int) -> dict[str, Any]:
    """LFR rows -> the feature columns of a feature row: records.encode_feats, uint8 with
    one range per mel bin shared by its `stack` columns."""
    return records.encode_feats(x, dtype, stack)


def featurize_stream(waves: list[np.ndarray], fcfg: FeaturesConfig,
                     computer: FbankComputer | None = None, gate: Any = None
                     ) -> list[np.ndarray]:
    """One speaker's utterances (time order) -> LFR rows per utterance, before global CMVN.
    `gate` (tasks.speech_activity.GateSettings): only the frames of speech and the padding
    around it, before the mean normalisation, as `amflow serve` gates a stream."""
    feats = fbank(waves, fcfg, computer)
    if gate is not None:
        from tasks.speech_activity import gate_frames

        feats = gate_frames(feats, gate, fcfg)
    cmn = StreamCMN(fcfg.num_mel_bins, fcfg.cmn_window, fcfg.cmn_min_window)
    lengths = [f.shape[0] for f in feats]
    normed = cmn.apply(np.concatenate(feats) if feats else
                       np.zeros((0, fcfg.num_mel_bins), np.float32))
    out, o = [], 0
    for n in lengths:
        out.append(stack_frames(normed[o:o + n], fcfg.stack, fcfg.subsample))
        o += n
    return out


def featurize_records(storage: Any, corpus: str, records: Any, fcfg: FeaturesConfig,
                      computer: FbankComputer, rejects: list,
                      accept: Any = None, on_speaker: Any = None, gate: Any = None
                      ) -> Iterator[tuple[Any, np.ndarray, np.ndarray]]:
    """Corpus records featurised as this step streams them, for scoring a model on them
    (evaluate, decode): per speaker in time order, the speaker's audio as one stream (the
    causal CMN carries across its utterances). Yields (record, samples, LFR rows before
    global CMVN). A record whose audio cannot be read, or too short for one frame, becomes
    a Reject in `rejects`; `accept(record)` may refuse one before its audio is read (and
    append its own reject). `on_speaker(n)` after each speaker's n records (progress).
    `gate`: featurize_stream's; a record long enough for rows of which the gate kept none
    (no speech) is yielded with no rows (its words: none), not rejected."""
    from tasks.audio import AudioResult, resolve_uri

    by_speaker: dict[str, list] = collections.defaultdict(list)
    for r in sorted(records, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id)):
        by_speaker[r.speaker_id].append(r)
    for recs in by_speaker.values():
        stream = []
        # the speaker's audio read io_threads at a time (on S3 each read is a round trip);
        # records are still accepted, refused and decoded in order
        fetched = _prefetch(storage, [resolve_uri(corpus, r.audio_uri) for r in recs],
                            fcfg.io_threads)
        for r, (data, reason, detail) in zip(recs, fetched):
            if accept is not None and not accept(r):
                continue
            res = (AudioResult(None, reason, detail) if data is None
                   else decode_audio(data, fcfg, r.duration))
            if res.samples is None:
                rejects.append(Reject(r.utt_id, res.reason or "unreadable_audio", res.detail))
                continue
            stream.append((r, res.samples))
        feats = featurize_stream([w for _, w in stream], fcfg, computer, gate) if stream else []
        for (r, wave), x in zip(stream, feats):
            if x.shape[0] == 0 and (gate is None or computer.num_frames(len(wave)) < fcfg.stack):
                rejects.append(Reject(r.utt_id, "too_short", f"{len(wave)} samples"))
                continue
            yield r, wave, x
        if on_speaker is not None:
            on_speaker(len(recs))


# --------------------------------------------------------------------------- shard task
def _prefetch(storage, uris: list[str], threads: int) -> Iterator[tuple[bytes | None, str | None,
                                                                         str]]:
    """read_audio_bytes for each uri in order, `threads` reads in flight ahead."""
    if threads <= 1:
        for u in uris:
            yield read_audio_bytes(storage, u)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        window: collections.deque = collections.deque()
        it = iter(uris)
        for u in it:
            window.append(pool.submit(read_audio_bytes, storage, u))
            if len(window) >= 2 * threads:
                break
        while window:
            fut = window.popleft()
            nxt = next(it, None)
            if nxt is not None:
                window.append(pool.submit(read_audio_bytes, storage, nxt))
            yield fut.result()


def shard_rng(seed: int, shard_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(shard_id.encode())])


class ShardFeaturizer:
    """Featurise one shard's manifest rows, in stream order, into feature rows.

    Decodes utterances in batches of up to `batch_seconds` of audio. A speaker's stream may
    span batches (its CMN state carries over); a batch is closed only once the current
    speaker has at least cmn_min_window frames in it, so the cold-start mean never needs
    frames of a later batch. The CMVN sums of what is emitted accumulate as fields.
    """

    def __init__(self, fcfg: FeaturesConfig, shard_id: str, align: dict[str, tuple],
                 ctm_errors: dict[str, str], frame_align: dict[str, np.ndarray] | None = None):
        self.fcfg = fcfg
        self.shard_id = shard_id
        self.align = align
        self.ctm_errors = ctm_errors
        self.frame_align = frame_align  # features.labels=align: per-frame classes per utt
        self.computer = FbankComputer(fcfg)  # also counts frames for the kaldi backend
        dim = fcfg.num_mel_bins * fcfg.stack
        self.rejects: list[Reject] = []
        self.rows: list[dict[str, Any]] = []
        self.acc_n = 0
        self.acc_s = np.zeros(dim, np.float64)
        self.acc_ss = np.zeros(dim, np.float64)
        self.audio_s = 0.0
        self.frames_total = 0
        self.batch: list[tuple[dict, np.ndarray]] = []
        self.batch_samples = 0
        self.cmn_state: dict[str, StreamCMN] = {}
        self.spk_frames: dict[str, int] = {}  # frames of each speaker's stream decoded so far
        self.limit = int(fcfg.batch_seconds * fcfg.sample_rate)

    def reject(self, rec: dict, reason: str, detail: str) -> None:
        self.rejects.append(Reject(rec["utt_id"], reason, detail, self.shard_id))

    def add(self, rec: dict, samples: np.ndarray) -> None:
        """One decoded utterance, in stream order; flushes the batch when it is full."""
        spk = rec["speaker_id"]
        self.batch.append((rec, samples))
        self.batch_samples += len(samples)
        nf = self.computer.num_frames(len(samples))
        self.spk_frames[spk] = self.spk_frames.get(spk, 0) + nf
        if self.batch_samples >= self.limit and self.spk_frames[spk] >= self.fcfg.cmn_min_window:
            self.flush()

    def flush(self) -> None:
        batch, self.batch, self.batch_samples = self.batch, [], 0
        if not batch:
            return
        feats = fbank([w for _, w in batch], self.fcfg, self.computer)
        # Non-finite fbank frames (absurd sample values) are rejected before they can
        # poison the speaker's CMN window; the rest of the stream goes on without them.
        keep = []
        for (rec, wave), f in zip(batch, feats):
            bad = int(f.size - np.count_nonzero(np.isfinite(f)))
            if bad:
                self.reject(rec, "nonfinite_features", f"{bad} non-finite fbank values")
            else:
                keep.append(((rec, wave), f))
        if keep:
            self._normalise([b for b, _ in keep], [f for _, f in keep])

    def _normalise(self, batch: list[tuple[dict, np.ndarray]], feats: list[np.ndarray]) -> None:
        """One CMN call per run of consecutive utterances of one speaker, then emit."""
        fcfg = self.fcfg
        i = 0
        while i < len(batch):
            spk = batch[i][0]["speaker_id"]
            j = i
            while j < len(batch) and batch[j][0]["speaker_id"] == spk:
                j += 1
            cmn = self.cmn_state.setdefault(spk, StreamCMN(fcfg.num_mel_bins, fcfg.cmn_window,
                                                           fcfg.cmn_min_window))
            normed = cmn.apply(np.concatenate(feats[i:j]))
            o = 0
            for (rec, wave), f in zip(batch[i:j], feats[i:j]):
                n = f.shape[0]
                self._emit(rec, wave, normed[o:o + n])
                o += n
            i = j
        # only the batch's last speaker can continue in the next batch
        last = batch[-1][0]["speaker_id"]
        for spk in [s for s in self.cmn_state if s != last]:
            del self.cmn_state[spk]

    def _labels(self, rec: dict, n_frames: int, n_rows: int
                ) -> tuple[bool, np.ndarray | None, np.ndarray | None]:
        """(ok, LFR labels, frame labels) of an utterance; rejects it when not ok."""
        fcfg = self.fcfg
        if self.frame_align is not None:
            return self._align_labels(rec, n_frames, n_rows)
        a = self.align.get(rec["utt_id"])
        if rec["split"] in LABELED_SPLITS and a is not None:
            fl, reason, detail = al.frame_labels_ids(a[0], a[1], a[2], n_frames, fcfg)
            if fl is None:
                self.reject(rec, reason, detail)
                return False, None, None
            return True, al.lfr_labels(fl, n_rows, fcfg.stack, fcfg.subsample), fl
        if rec["split"] == "labeled":
            msg = self.ctm_errors.get(rec["utt_id"],
                                      "no lines for this utterance in alignments.ctm")
            self.reject(rec, "missing_alignment", msg)
            return False, None, None
        return True, None, None

    def _align_labels(self, rec: dict, n_frames: int, n_rows: int
                      ) -> tuple[bool, np.ndarray | None, np.ndarray | None]:
        """_labels with features.labels=align: `amflow align`'s per-frame classes, fitted
        to the fbank frame count (features.label_frame_tolerance)."""
        fcfg = self.fcfg
        lab = self.frame_align.get(rec["utt_id"])
        if rec["split"] in LABELED_SPLITS and lab is not None:
            fl, detail = fit_frames(lab, n_frames, fcfg.label_frame_tolerance)
            if fl is None:
                self.reject(rec, "alignment_mismatch", detail)
                return False, None, None
            return True, al.lfr_labels(fl, n_rows, fcfg.stack, fcfg.subsample), fl
        if rec["split"] == "labeled":
            self.reject(rec, "missing_alignment", "amflow align has no alignment for it "
                        "(see the align step's rejects/align.parquet)")
            return False, None, None
        return True, None, None

    def _emit(self, rec: dict, wave: np.ndarray, normed: np.ndarray) -> None:
        fcfg = self.fcfg
        x = stack_frames(normed, fcfg.stack, fcfg.subsample)
        if x.shape[0] == 0:
            self.reject(rec, "too_short", f"{len(wave)} samples give {normed.shape[0]} frames, "
                        f"need {fcfg.stack}")
            return
        if not np.isfinite(x).all():
            self.reject(rec, "nonfinite_features", f"{int((~np.isfinite(x)).sum())} values")
            return
        ok, labels, flabels = self._labels(rec, normed.shape[0], x.shape[0])
        if not ok:
            return
        enc = encode_rows(x, fcfg.storage_dtype, fcfg.stack)
        dec = records.decode_feats(enc)
        self.acc_n += dec.shape[0]
        self.acc_s += dec.sum(axis=0, dtype=np.float64)
        self.acc_ss += np.einsum("ij,ij->j", dec, dec, dtype=np.float64)
        self.audio_s += len(wave) / fcfg.sample_rate
        self.frames_total += normed.shape[0]
        self.rows.append({
            "utt_id": rec["utt_id"], "speaker_id": rec["speaker_id"], "split": rec["split"],
            "condition": rec.get("condition") or "", "shard": self.shard_id, **enc,
            "labels": records.encode_int16(labels), "frame_labels": records.encode_int16(flabels),
        })

    def shuffled_rows(self) -> list[dict[str, Any]]:
        """Hierarchical shuffle, level 2: utterance order within the shard."""
        perm = shard_rng(self.fcfg.seed, self.shard_id).permutation(len(self.rows))
        return [self.rows[i] for i in perm]


@dataclass(frozen=True)
class FeaturesJob:
    """What every shard's task needs (Ray ships it to each): where the shards and their
    rejects go (`out_uri`: shards/, rejects/), the storage and the feature settings."""
    storage: StorageConfig
    features: FeaturesConfig
    out_uri: str


def process_shard(job: FeaturesJob, shard_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Featurise one shard (`payload`: its manifest URI, split and labels): returns its
    stats (also written as the shard's done-marker)."""
    t0, c0 = time.perf_counter(), time.process_time()
    st = Storage(job.storage)
    fcfg = job.features
    man = st.read_parquet(payload["manifest"]).to_pylist()
    man.sort(key=lambda r: (r["speaker_id"], r["created_ts"], r["utt_id"]))
    fz = ShardFeaturizer(fcfg, shard_id, payload.get("align") or {},
                         payload.get("ctm_errors") or {}, payload.get("frame_align"))
    uris = [r["audio_uri"] for r in man]
    for rec, (data, reason, detail) in zip(man, _prefetch(st, uris, fcfg.io_threads)):
        if data is None:
            fz.reject(rec, reason, detail)
            continue
        res = decode_audio(data, fcfg, rec["duration"])
        if res.samples is None:
            fz.reject(rec, res.reason, res.detail)
            continue
        fz.add(rec, res.samples)
    fz.flush()
    rows = fz.shuffled_rows()
    out_table = records.to_table(rows, records.feature_schema(fcfg.storage_dtype))
    nbytes = st.write_parquet(join(job.out_uri, "shards", f"{shard_id}.parquet"), out_table)
    st.write_parquet(join(job.out_uri, "rejects", f"{shard_id}.parquet"),
                     rejects_table(fz.rejects))
    reasons = dict(collections.Counter(r.reason for r in fz.rejects))
    return {
        "split": payload["split"], "in": len(man), "out": len(rows),
        "rejected": len(fz.rejects), "reasons": reasons, "audio_s": round(fz.audio_s, 4),
        "frames": fz.frames_total, "rows": fz.acc_n, "bytes": nbytes, "count": fz.acc_n,
        "sum": fz.acc_s.tolist(), "sumsq": fz.acc_ss.tolist(),
        "wall_s": round(time.perf_counter() - t0, 4),
        "cpu_s": round(time.process_time() - c0, 4),
    }


# --------------------------------------------------------------------------- driver
def alignment_payloads(st: Storage, corpus: str, out_uri: str, manifests: dict[str, str],
                       index: list[dict], force: bool = False
                       ) -> tuple[dict, dict, list[str]]:
    """features.labels=ctm: (per-shard alignment slices, per-shard ctm errors, phone
    inventory) from the corpus's alignments.ctm; the inventory is kept in
    `out_uri`/phones.json (read back unless `force`). `manifests`: shard id -> its
    manifest URI."""
    corpus = corpus.rstrip("/")
    ctm_uri = join(corpus, "alignments.ctm")
    alignments: dict[str, al.Alignment] = {}
    errors: list[tuple[int, str, str]] = []
    if st.exists(ctm_uri):
        alignments, errors = al.read_ctm(st.read_text(ctm_uri))
    phones_uri = join(out_uri, "phones.json")
    if st.exists(phones_uri) and not force:
        inventory = st.read_json(phones_uri)
    else:
        inventory = al.load_inventory(st, corpus, alignments)
        st.write_json(phones_uri, inventory)
    ids = {p: i for i, p in enumerate(inventory)}
    err_by_utt = {u: m for _, u, m in errors}
    per_shard: dict[str, dict] = {}
    per_shard_err: dict[str, dict] = {}
    for e in index:
        if e["split"] not in LABELED_SPLITS:
            continue
        utts = st.read_parquet(manifests[e["shard"]],
                               columns=["utt_id"]).column("utt_id").to_pylist()
        per_shard[e["shard"]] = {u: (alignments[u].starts, alignments[u].ends,
                                     alignments[u].phone_ids(ids))
                                 for u in utts if u in alignments}
        per_shard_err[e["shard"]] = {u: err_by_utt[u] for u in utts if u in err_by_utt}
    return per_shard, per_shard_err, inventory


def align_label_payloads(st: Storage, align_uri: str, out_uri: str, manifests: dict[str, str],
                         index: list[dict]) -> tuple[dict, list[str]]:
    """features.labels=align: (per-shard {utt_id: per-frame classes}, class names) from the
    alignments at `align_uri`; writes `out_uri`/phones.json (the classes) and context.json
    (the network tree, for the model card)."""
    try:
        tree, labels = al.read_align_labels(st, align_uri)
    except (al.AlignOutputsError, ValueError) as exc:
        raise StepError(f"features.labels=align: {exc}") from exc
    inventory = tree.class_names
    st.write_json(join(out_uri, "phones.json"), inventory)
    st.write_json(join(out_uri, "context.json"), tree.to_dict())
    per_shard: dict[str, dict] = {}
    for e in index:
        if e["split"] not in LABELED_SPLITS:
            per_shard[e["shard"]] = {}
            continue
        utts = st.read_parquet(manifests[e["shard"]],
                               columns=["utt_id"]).column("utt_id").to_pylist()
        per_shard[e["shard"]] = {u: labels[u] for u in utts if u in labels}
    return per_shard, inventory


def publish(st: Storage, out_uri: str, fcfg: FeaturesConfig, stats: list[dict],
            inventory: list[str], order: list[str], wall: float
            ) -> tuple[dict[str, Any], dict[str, int], int]:
    """Write `out_uri`/cmvn.json (from the training splits' shards) and shards.json; return
    the step's (metrics, counts, bytes written). Every utterance rejected is an error that
    says which reasons rejected how many."""
    dim = fcfg.num_mel_bins * fcfg.stack
    train = [s for s in stats if s["split"] in TRAIN_SPLITS] or stats
    cmvn = {"count": int(sum(s["count"] for s in train)),
            "sum": np.sum([s["sum"] for s in train], axis=0).tolist() if train else [0.0] * dim,
            "sumsq": np.sum([s["sumsq"] for s in train], axis=0).tolist() if train else
            [0.0] * dim,
            "dim": dim, "splits": sorted({s["split"] for s in train})}
    if cmvn["count"] == 0:  # which reasons rejected how many, and what to change
        reasons = [r for s in train for r, n in s.get("reasons", {}).items() for _ in range(n)]
        raise StepError(nothing_left(f"features (splits {cmvn['splits']})",
                                     sum(s.get("in", 0) for s in train), reasons,
                                     join(out_uri, "rejects")))
    st.write_json(join(out_uri, "cmvn.json"), cmvn)
    st.write_json(join(out_uri, "shards.json"), {"order": order, "shards": [
        {k: s[k] for k in ("shard", "split", "in", "out", "rejected", "rows", "frames",
                           "audio_s", "bytes")} for s in stats]})
    audio_s = sum(s["audio_s"] for s in stats)
    nbytes = sum(s["bytes"] for s in stats)
    task_s = sum(s["wall_s"] for s in stats)
    reasons: dict[str, int] = {}
    for s in stats:
        for k, v in s["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    hours = audio_s / 3600.0
    metrics = {
        "audio_hours": round(hours, 6), "frames": sum(s["frames"] for s in stats),
        "rows": sum(s["rows"] for s in stats), "shards": len(stats),
        "mb_per_audio_hour": round(nbytes / 1e6 / hours, 3) if hours else None,
        "xrt": round(audio_s / wall, 2) if wall else None,
        "xrt_per_task": round(audio_s / task_s, 2) if task_s else None,
        "storage_dtype": fcfg.storage_dtype, "backend": fcfg.backend,
        "feat_dim": dim, "phones": len(inventory), "reject_reasons": reasons,
    }
    counts = {"in": sum(s["in"] for s in stats), "out": sum(s["out"] for s in stats),
              "rejected": sum(s["rejected"] for s in stats)}
    return metrics, counts, nbytes
