"""`amflow select`: the step's `run`, resolving inputs through the run layout and calling `tasks.select`."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any
import numpy as np
import pyarrow as pa
from amflow.progress import Progress
from amflow.runs import SUCCESS, Reject, StepContext, StepError, rejects_table
from amflow.storage import iter_jsonl
from tasks.audio import resolve_uri
from tasks.select import MANIFEST_SCHEMA, MetadataError, Record, SPLITS, _relname, apply_split_rule, log, metadata_files, parse_metadata_line, sample_uniform, shard_speakers


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    cfg, st, scfg = ctx.cfg, ctx.storage, ctx.cfg.select
    if not ctx.force and st.exists(ctx.path(SUCCESS)):
        log.info("select: %s exists, nothing to do (use --force to redo)", ctx.path(SUCCESS))
        return st.read_json(ctx.path(SUCCESS))
    corpus = cfg.data.corpus.rstrip("/")
    files = metadata_files(st, corpus)
    if not files:
        raise StepError(f"no metadata under {corpus}: expected metadata/**.jsonl or "
                        f"metadata.jsonl")
    log.info("select: reading %d metadata files under %s", len(files), corpus)
    with ThreadPoolExecutor(max_workers=8) as pool, \
            Progress(len(files), "select", "metadata files") as bar:
        texts = []
        for text in pool.map(st.read_text, files):
            texts.append(text)
            bar.update(1)

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

    apply_split_rule(st, corpus, records)

    wanted = [r for r in records if r.split in scfg.splits]
    durations = np.array([r.duration for r in wanted], dtype=np.float64)
    chosen = sample_uniform(durations, scfg.hours, scfg.oversample, scfg.seed)
    selected = [wanted[i] for i in sorted(chosen.tolist())]

    shards: list[tuple[str, str, list[Record]]] = []
    for split in SPLITS:
        recs = [r for r in selected if r.split == split]
        if not recs:
            continue
        per_spk: dict[str, list[Record]] = {}
        for r in recs:
            per_spk.setdefault(r.speaker_id, []).append(r)
        secs = {s: sum(r.duration for r in rs) for s, rs in per_spk.items()}
        for i, group in enumerate(shard_speakers(secs, scfg.shard_hours * 3600.0)):
            rows = [r for s in sorted(group) for r in
                    sorted(per_spk[s], key=lambda r: (r.created_ts, r.utt_id))]
            shards.append((f"{split}-{i:05d}", split, rows))

    index = []
    written = 0
    with Progress(len(shards), "select", "shards") as bar:
        for shard_id, split, rows in shards:
            table = pa.table({
                "shard": [shard_id] * len(rows), "split": [split] * len(rows),
                "utt_id": [r.utt_id for r in rows], "speaker_id": [r.speaker_id for r in rows],
                "duration": [r.duration for r in rows],
                "created_at": [r.created_at for r in rows],
                "created_ts": [r.created_ts for r in rows],
                "locale": [r.locale for r in rows], "condition": [r.condition for r in rows],
                "text": [r.text for r in rows],
                "audio_uri": [resolve_uri(corpus, r.audio_uri) for r in rows],
            }, schema=MANIFEST_SCHEMA)
            written += st.write_parquet(ctx.path("shards", f"{shard_id}.parquet"), table)
            index.append({"shard": shard_id, "split": split, "utts": len(rows),
                          "speakers": len({r.speaker_id for r in rows}),
                          "seconds": round(sum(r.duration for r in rows), 3)})
            bar.update(1)
    keep = {f"{s}.parquet" for s, _, _ in shards}
    for uri in st.list(ctx.path("shards"), suffix=".parquet"):
        if uri.rsplit("/", 1)[-1] not in keep:
            st.delete(uri)
    st.write_parquet(ctx.path("rejects", "select.parquet"), rejects_table(rejects))
    st.write_json(ctx.path("shards.json"), {"shards": index})

    sel_seconds = sum(r.duration for r in selected)
    per_split = {}
    for e in index:
        d = per_split.setdefault(e["split"], {"shards": 0, "utts": 0, "hours": 0.0})
        d["shards"] += 1
        d["utts"] += e["utts"]
        d["hours"] = round(d["hours"] + e["seconds"] / 3600.0, 6)
    seconds = [e["seconds"] for e in index]
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    if sum(durations) < scfg.hours * 3600.0:
        log.warning("select: wanted %.3f h but splits %s hold only %.3f h; took all",
                    scfg.hours, scfg.splits, durations.sum() / 3600.0)
    metrics = {
        "audio_hours": round(sel_seconds / 3600.0, 6),
        "requested_hours": scfg.hours,
        "available_hours": round(float(durations.sum()) / 3600.0, 6),
        "shards": len(index),
        "speakers": len({r.speaker_id for r in selected}),
        "per_split": per_split,
        "shard_seconds_min": min(seconds) if seconds else 0.0,
        "shard_seconds_max": max(seconds) if seconds else 0.0,
        "reject_reasons": reasons,
    }
    return ctx.finish(
        inputs={"corpus": corpus, "metadata_files": len(files), "splits": scfg.splits,
                "seed": scfg.seed},
        counts={"in": n_lines, "out": len(records), "rejected": len(rejects),
                "selected": len(selected), "not_selected": len(records) - len(selected)},
        metrics=metrics, bytes_written=written)
