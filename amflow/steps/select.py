"""`amflow select`: sample `select.hours` of the corpus and write it as speaker shards.

Reads the corpus metadata, writes `select/shards/<shard>.parquet`, `shards.json` and
`rejects/select.parquet` under the run; the sampling and sharding live in `tasks.select`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from core.progress import Progress
from core.runs import SUCCESS, StepContext, StepError, rejects_table
from tasks.select import (apply_split_rule, index_entry, log, manifest_table, metadata_files,
                          parse_records, plan_shards, read_metadata, sample_uniform,
                          select_metrics, selection_plan)


def _adopt_files_fingerprint(ctx: StepContext, plan: dict[str, Any]) -> None:
    """A selection of a corpus without _SUCCESS.json, finished when amflow knew such a
    corpus by its URI alone (the plan's corpus_fingerprint None): kept, with a warning, and
    its plan given the corpus's files from now on, so that an upgrade does not redo the
    run's finished work (its metadata may have changed since; --force redoes it)."""
    st, uri = ctx.storage, ctx.path("_plan.json")
    if ctx.force or not st.exists(uri) or not st.exists(ctx.path(SUCCESS)):
        return
    kept = st.read_json(uri)
    if kept.get("corpus_fingerprint") is None and plan["corpus_fingerprint"] and \
            kept == {**plan, "corpus_fingerprint": None}:
        log.warning("select: %s finished when amflow knew a corpus without _SUCCESS.json by "
                    "its URI alone: kept, unchecked (use --force to select again); from now "
                    "on its metadata files are compared", ctx.step_uri)
        st.write_json(uri, plan)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    cfg, st, scfg = ctx.cfg, ctx.storage, ctx.cfg.select
    corpus = cfg.data.corpus.rstrip("/")
    plan = selection_plan(st, corpus, scfg)
    _adopt_files_fingerprint(ctx, plan)
    earlier = ctx.unplanned_summary() or ctx.resume_plan(plan)
    if earlier is not None:
        return earlier
    files = metadata_files(st, corpus)
    if not files:
        raise StepError(f"no metadata under {corpus}: expected metadata/**.jsonl or "
                        f"metadata.jsonl")
    log.info("select: reading %d metadata files under %s", len(files), corpus)
    records, rejects, n_lines = parse_records(files, read_metadata(st, files), corpus)
    apply_split_rule(st, corpus, records)

    wanted = [r for r in records if r.split in scfg.splits]
    durations = np.array([r.duration for r in wanted], dtype=np.float64)
    chosen = sample_uniform(durations, scfg.hours, scfg.oversample, scfg.seed)
    selected = [wanted[i] for i in sorted(chosen.tolist())]
    shards = plan_shards(selected, scfg.shard_hours)

    index = []
    written = 0
    with Progress(len(shards), "select", "shards") as bar:
        for shard_id, split, rows in shards:
            written += st.write_parquet(ctx.path("shards", f"{shard_id}.parquet"),
                                        manifest_table(shard_id, split, rows, corpus))
            index.append(index_entry(shard_id, split, rows))
            bar.update(1)
    keep = {f"{s}.parquet" for s, _, _ in shards}
    for uri in st.list(ctx.path("shards"), suffix=".parquet"):
        if uri.rsplit("/", 1)[-1] not in keep:
            st.delete(uri)
    st.write_parquet(ctx.path("rejects", "select.parquet"), rejects_table(rejects))
    st.write_json(ctx.path("shards.json"), {"shards": index})

    if sum(durations) < scfg.hours * 3600.0:
        log.warning("select: wanted %.3f h but splits %s hold only %.3f h; took all",
                    scfg.hours, scfg.splits, durations.sum() / 3600.0)
    return ctx.finish(
        inputs={"corpus": corpus, "metadata_files": len(files), "splits": scfg.splits,
                "seed": scfg.seed},
        counts={"in": n_lines, "out": len(records), "rejected": len(rejects),
                "selected": len(selected), "not_selected": len(records) - len(selected)},
        metrics=select_metrics(index, selected, durations, rejects, scfg.hours),
        bytes_written=written)
