"""`amflow select`: choose `select.hours` of audio uniformly and shard it by speaker.

Reads  `data.corpus`: `metadata/**.jsonl` (or `metadata.jsonl`), and `alignments.ctm` only
       when a record has no `split` (then: aligned -> labeled, else unlabeled).
Writes `runs/<R>/select/shards/<shard_id>.parquet`   one manifest per shard (MANIFEST_SCHEMA)
       `runs/<R>/select/shards.json`                  the shard index (split, utts, seconds)
       `runs/<R>/select/rejects/select.parquet`       malformed metadata lines with reasons
       `runs/<R>/select/_SUCCESS.json`

Pure core, no storage and no Ray: `parse_metadata_line`, `sample_uniform`, `shard_speakers`.

Selection (the paper's IV-B1): records of the wanted `select.splits` are Bernoulli-sampled
with p = oversample x (hours / mean utterance length) / N (seeded), shuffled, then trimmed
to the first utterances whose durations reach `select.hours` (topped up from the rest in
random order in the unlikely case the sample falls short). Everything is kept when the
corpus holds less than `select.hours`.

Sharding: per split, a speaker's utterances always share one shard. Shard count per split
is round(split hours / shard_hours) (at least 1, at most the number of speakers); speakers
are placed longest first onto the currently shortest shard (LPT), which keeps shards
within one speaker's duration of each other. Rows of a manifest are ordered by speaker and
`created_at`, i.e. each speaker's stream in time order, as the features step reads it.

Counts: in = metadata lines, out = valid records, rejected = malformed lines; of `out`,
`selected` went into manifests and `not_selected` were filtered by split or sampling.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import heapq
import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from core.config import SelectConfig
from core.progress import Progress
from core.outcomes import SUCCESS, Reject, StepError
from core.storage import Storage, iter_jsonl, join
from tasks.audio import resolve_uri
from tasks.intervals import Interval, file_date, files_in_interval

log = logging.getLogger(__name__)

SPLITS = ("labeled", "unlabeled", "dev", "test")
MANIFEST_SCHEMA = pa.schema([
    ("shard", pa.string()), ("split", pa.string()), ("utt_id", pa.string()),
    ("speaker_id", pa.string()), ("duration", pa.float64()), ("created_at", pa.string()),
    ("created_ts", pa.float64()), ("locale", pa.string()), ("condition", pa.string()),
    ("text", pa.string()), ("audio_uri", pa.string()),
])


class MetadataError(ValueError):
    def __init__(self, reason: str, detail: str, utt_id: str = ""):
        super().__init__(detail)
        self.reason, self.detail, self.utt_id = reason, detail, utt_id


@dataclass
class Record:
    utt_id: str
    speaker_id: str
    duration: float
    created_at: str
    created_ts: float
    locale: str
    audio_uri: str
    text: str = ""
    condition: str = ""
    split: str = ""


def parse_time(value: str) -> float:
    """ISO 8601 -> POSIX seconds; a naive time is taken as UTC."""
    t = dt.datetime.fromisoformat(value.strip())
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def _str(rec: dict, key: str, utt: str, required: bool = True) -> str:
    v = rec.get(key)
    if v is None:
        if required:
            raise MetadataError("malformed_metadata", f"missing field '{key}'", utt)
        return ""
    if not isinstance(v, str) or (required and not v.strip()):
        raise MetadataError("malformed_metadata", f"field '{key}' must be a non-empty string, "
                            f"got {v!r:.60}", utt)
    return v.strip()


def parse_metadata_line(line: str) -> Record:
    """One JSONL line -> Record, or MetadataError(reason, detail, utt_id)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise MetadataError("malformed_metadata", f"not JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(rec, dict):
        raise MetadataError("malformed_metadata", f"not a JSON object: {type(rec).__name__}")
    utt = rec.get("utt_id") if isinstance(rec.get("utt_id"), str) else ""
    utt = _str(rec, "utt_id", utt)
    speaker = _str(rec, "speaker_id", utt)
    dur = rec.get("duration")
    if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not math.isfinite(dur) \
            or dur <= 0:
        raise MetadataError("malformed_metadata", f"duration must be a positive number, "
                            f"got {dur!r:.60}", utt)
    created = _str(rec, "created_at", utt)
    try:
        ts = parse_time(created)
    except ValueError:
        raise MetadataError("malformed_metadata", f"created_at is not ISO 8601: {created!r:.60}",
                            utt)
    locale = _str(rec, "locale", utt)
    audio = _str(rec, "audio_uri", utt)
    text = _str(rec, "text", utt, required=False)
    condition = _str(rec, "condition", utt, required=False)
    split = _str(rec, "split", utt, required=False)
    if split and split not in SPLITS:
        raise MetadataError("bad_split", f"split must be one of {', '.join(SPLITS)}, got "
                            f"{split!r:.40}", utt)
    return Record(utt, speaker, float(dur), created, ts, locale, audio, text, condition, split)


def sample_uniform(durations: np.ndarray, hours: float, oversample: float,
                   seed: int) -> np.ndarray:
    """Indices of a uniform random selection whose durations first reach `hours`."""
    n = len(durations)
    target = hours * 3600.0
    rng = np.random.default_rng(seed)
    if n == 0:
        return np.zeros(0, np.int64)
    if durations.sum() <= target:
        return rng.permutation(n)
    mean = float(durations.mean())
    p = min(1.0, oversample * target / (mean * n))
    picked = np.nonzero(rng.random(n) < p)[0]
    order = picked[rng.permutation(len(picked))]
    cum = np.cumsum(durations[order])
    if len(cum) and cum[-1] >= target:
        return order[: int(np.searchsorted(cum, target)) + 1]
    rest = np.setdiff1d(np.arange(n), picked)
    rest = rest[rng.permutation(len(rest))]
    order = np.concatenate([order, rest])
    cum = np.cumsum(durations[order])
    return order[: int(np.searchsorted(cum, target)) + 1]


def shard_speakers(speaker_seconds: dict[str, float], shard_seconds: float) -> list[list[str]]:
    """Speakers -> nearly-equal-duration groups (LPT); deterministic for equal inputs."""
    total = sum(speaker_seconds.values())
    k = max(1, min(len(speaker_seconds), int(round(total / shard_seconds))))
    heap = [(0.0, i) for i in range(k)]
    groups: list[list[str]] = [[] for _ in range(k)]
    for spk, sec in sorted(speaker_seconds.items(), key=lambda kv: (-kv[1], kv[0])):
        load, i = heapq.heappop(heap)
        groups[i].append(spk)
        heapq.heappush(heap, (load + sec, i))
    return [g for g in groups if g]


def apply_split_rule(storage: Storage, corpus: str, records: list[Record],
                     aligned: set[str] | None = None) -> None:
    """The input format's rule for a record without `split`: labeled when alignments.ctm
    has it, else unlabeled (in place). `aligned`: the CTM's utterance ids, if read."""
    if all(r.split for r in records):
        return
    if aligned is None:
        ctm = join(corpus, "alignments.ctm")
        aligned = set()
        if storage.exists(ctm):
            from tasks.alignments import ctm_utt_ids

            aligned = ctm_utt_ids(storage.read_text(ctm))
    for r in records:
        if not r.split:
            r.split = "labeled" if r.utt_id in aligned else "unlabeled"


def read_records(storage: Storage, corpus: str) -> tuple[list[Record], list[Any], int]:
    """Every metadata record of a corpus with the split rule applied: (records, rejects
    of malformed lines, lines read)."""

    records: list[Record] = []
    rejects: list[Reject] = []
    n = 0
    files = metadata_files(storage, corpus)
    with ThreadPoolExecutor(max_workers=8) as pool:  # on S3: the round trips overlap
        texts = list(pool.map(storage.read_text, files))
    for uri, text in zip(files, texts):
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            n += 1
            try:
                records.append(parse_metadata_line(line))
            except MetadataError as exc:
                rejects.append(Reject(exc.utt_id or f"{uri}:{lineno}", exc.reason, exc.detail))
    apply_split_rule(storage, corpus, records)
    return records, rejects, n


def records_of_split(storage: Storage, corpus: str, split: str) -> tuple[list[Record], list[Any]]:
    """The records of one split (by the split rule) and the rejects of malformed lines;
    a StepError naming the splits there are when `split` has none."""
    if not metadata_files(storage, corpus):
        raise StepError(f"no metadata/**.jsonl or metadata.jsonl under {corpus}")
    records, rejects, _ = read_records(storage, corpus)
    recs = [r for r in records if r.split == split]
    if not recs:
        found = sorted({r.split for r in records})
        raise StepError(f"corpus {corpus} has no records with split '{split}' "
                        f"(splits found: {', '.join(found) or 'none'})")
    return recs, rejects


def corpus_fingerprint(storage: Storage, corpus: str) -> str | None:
    """A corpus's identity: the fingerprint `amflow corpus` (`plan_fingerprint`: its plan
    and espeak-ng) or `amflow import` (`fingerprint`: its sources' texts, config, lexicon)
    keeps in the corpus's _SUCCESS.json: what the corpus was made from, so another corpus
    at the same URI has another, and the same corpus made twice the same one (its timings
    aside); else the digest of a _SUCCESS.json without one. A corpus written by other
    tools (no _SUCCESS.json) is known by its metadata files and CTM, each by size and
    modification time (`Storage.version`: no read of gigabytes of metadata): records
    added or edited there give another fingerprint. None: no metadata at all."""
    success = join(corpus, SUCCESS)
    if not storage.exists(success):
        return files_fingerprint(storage, corpus)
    summary = storage.read_json(success)
    fp = summary.get("plan_fingerprint") or summary.get("fingerprint")
    return str(fp) if fp else storage.digest(success)


def files_fingerprint(storage: Storage, corpus: str) -> str | None:
    """`files-<sha256[:16]>` of the corpus's metadata files and alignments.ctm, each named
    relative to the corpus with its version; None when it has no metadata."""
    versions = storage.versions(join(corpus, "metadata"), suffix=".jsonl", recursive=True)
    for name in ("metadata.jsonl", "alignments.ctm"):
        with contextlib.suppress(FileNotFoundError):  # one stat each, not exists + stat
            versions[join(corpus, name)] = storage.version(join(corpus, name))
    if not any(uri.endswith(".jsonl") for uri in versions):
        return None
    listing = json.dumps(sorted((_relname(u, corpus), v) for u, v in versions.items()))
    return "files-" + hashlib.sha256(listing.encode()).hexdigest()[:16]


def selection_plan(storage: Storage, corpus: str, scfg: SelectConfig,
                   interval_files: dict[str, str] | None = None) -> dict[str, Any]:
    """What a selection depends on: the corpus (its URI and `corpus_fingerprint`) and every
    select key (`select.hours`, splits, seed, shard size). A finished selection is handed
    back only under the same plan (the step's resume_plan).

    With a data interval (select.interval_start/_end) the corpus is known instead by the
    metadata files of that interval (`interval_files`: {uri: version}) and alignments.ctm:
    a day added to the corpus, or another day edited, leaves the interval's selection as
    it is. Without one the plan is what it was before intervals existed (the interval
    keys are left out), so selections finished before stay finished."""
    sel = asdict(scfg)
    if not scfg.interval_start:
        sel.pop("interval_start", None)
        sel.pop("interval_end", None)
        fp = corpus_fingerprint(storage, corpus)
    else:
        fp = interval_fingerprint(storage, corpus, interval_files or {})
    return json.loads(json.dumps({"corpus": corpus, "corpus_fingerprint": fp, "select": sel}))


def interval_metadata(storage: Storage, corpus: str, interval: Interval) -> dict[str, str]:
    """{uri: version} of the metadata files an interval reads: those under
    `metadata/date=D/` for the interval's days D (the other days' folders are not even
    listed) and every file not partitioned by date (metadata.jsonl, metadata/*.jsonl,
    folders of another layout), whose records select filters by created_at."""
    root, days = join(corpus, "metadata"), set(interval.dates())
    found = storage.versions(root, suffix=".jsonl")
    for sub in storage.subdirs(root):
        day = file_date(sub.rsplit("/", 1)[-1])
        if day is None or day in days:
            found.update(storage.versions(sub, suffix=".jsonl", recursive=True))
    with contextlib.suppress(FileNotFoundError):  # one stat, not exists + stat
        found[join(corpus, "metadata.jsonl")] = storage.version(join(corpus, "metadata.jsonl"))
    keep = files_in_interval([_relname(u, corpus) for u in found], interval)
    return {join(corpus, rel): found[join(corpus, rel)] for rel in sorted(keep)}


def interval_fingerprint(storage: Storage, corpus: str, versions: dict[str, str]) -> str:
    """`interval-<sha256[:16]>` of an interval's metadata files and the corpus's
    alignments.ctm (the split rule reads it), each named relative to the corpus with its
    version (size and modification time, or ETag: no read of the records)."""
    versions = dict(versions)
    with contextlib.suppress(FileNotFoundError):
        versions[join(corpus, "alignments.ctm")] = storage.version(join(corpus, "alignments.ctm"))
    listing = json.dumps(sorted((_relname(u, corpus), v) for u, v in versions.items()))
    return "interval-" + hashlib.sha256(listing.encode()).hexdigest()[:16]


def metadata_files(storage: Storage, corpus: str) -> list[str]:
    files = storage.list(join(corpus, "metadata"), suffix=".jsonl", recursive=True)
    single = join(corpus, "metadata.jsonl")
    if storage.exists(single):
        files.append(single)
    return files


def _relname(uri: str, corpus: str) -> str:
    return uri[len(corpus.rstrip("/")) + 1:] if uri.startswith(corpus.rstrip("/")) else uri


# --------------------------------------------------------------------------- library core
def read_metadata(st: Storage, files: list[str]) -> list[str]:
    """The text of each metadata file, read 8 at a time (each read is a round trip on S3)."""
    with ThreadPoolExecutor(max_workers=8) as pool, \
            Progress(len(files), "select", "metadata files") as bar:
        texts = []
        for text in pool.map(st.read_text, files):
            texts.append(text)
            bar.update(1)
    return texts


def parse_records(files: list[str], texts: list[str], corpus: str
                  ) -> tuple[list[Record], list[Reject], int]:
    """(records, rejects, lines read): bad lines and repeated utt_ids become rejects."""
    rejects: list[Reject] = []
    records: list[Record] = []
    seen: set[str] = set()
    n_lines = 0
    for uri, text in zip(files, texts):
        name = _relname(uri, corpus)
        for lineno, line in iter_jsonl(text):
            n_lines += 1
            where = f"{name}:{lineno}"
            try:
                rec = parse_metadata_line(line)
            except MetadataError as exc:
                rejects.append(Reject(exc.utt_id or where, exc.reason, f"{where}: {exc.detail}",
                                      "select"))
                continue
            if rec.utt_id in seen:
                rejects.append(Reject(rec.utt_id, "duplicate_utt_id",
                                      f"{where}: utt_id seen earlier in the metadata", "select"))
                continue
            seen.add(rec.utt_id)
            records.append(rec)
    return records, rejects, n_lines


def plan_shards(selected: list[Record], shard_hours: float
                ) -> list[tuple[str, str, list[Record]]]:
    """(shard id, split, records in stream order) per shard: whole speakers per shard."""
    shards: list[tuple[str, str, list[Record]]] = []
    for split in SPLITS:
        recs = [r for r in selected if r.split == split]
        if not recs:
            continue
        per_spk: dict[str, list[Record]] = {}
        for r in recs:
            per_spk.setdefault(r.speaker_id, []).append(r)
        secs = {s: sum(r.duration for r in rs) for s, rs in per_spk.items()}
        for i, group in enumerate(shard_speakers(secs, shard_hours * 3600.0)):
            rows = [r for s in sorted(group) for r in
                    sorted(per_spk[s], key=lambda r: (r.created_ts, r.utt_id))]
            shards.append((f"{split}-{i:05d}", split, rows))
    return shards


def manifest_table(shard_id: str, split: str, rows: list[Record], corpus: str) -> pa.Table:
    return pa.table({
        "shard": [shard_id] * len(rows), "split": [split] * len(rows),
        "utt_id": [r.utt_id for r in rows], "speaker_id": [r.speaker_id for r in rows],
        "duration": [r.duration for r in rows],
        "created_at": [r.created_at for r in rows],
        "created_ts": [r.created_ts for r in rows],
        "locale": [r.locale for r in rows], "condition": [r.condition for r in rows],
        "text": [r.text for r in rows],
        "audio_uri": [resolve_uri(corpus, r.audio_uri) for r in rows],
    }, schema=MANIFEST_SCHEMA)


def index_entry(shard_id: str, split: str, rows: list[Record]) -> dict[str, Any]:
    return {"shard": shard_id, "split": split, "utts": len(rows),
            "speakers": len({r.speaker_id for r in rows}),
            "seconds": round(sum(r.duration for r in rows), 3)}


def select_metrics(index: list[dict], selected: list[Record], durations: np.ndarray,
                   rejects: list[Reject], hours: float) -> dict[str, Any]:
    per_split: dict[str, dict] = {}
    for e in index:
        d = per_split.setdefault(e["split"], {"shards": 0, "utts": 0, "hours": 0.0})
        d["shards"] += 1
        d["utts"] += e["utts"]
        d["hours"] = round(d["hours"] + e["seconds"] / 3600.0, 6)
    seconds = [e["seconds"] for e in index]
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {
        "audio_hours": round(sum(r.duration for r in selected) / 3600.0, 6),
        "requested_hours": hours,
        "available_hours": round(float(durations.sum()) / 3600.0, 6),
        "shards": len(index),
        "speakers": len({r.speaker_id for r in selected}),
        "per_split": per_split,
        "shard_seconds_min": min(seconds) if seconds else 0.0,
        "shard_seconds_max": max(seconds) if seconds else 0.0,
        "reject_reasons": reasons,
    }
