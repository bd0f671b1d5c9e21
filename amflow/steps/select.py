"""`amflow select`: sample `select.hours` of the corpus and write it as speaker shards.

Reads the corpus metadata, writes `select/shards/<shard>.parquet`, `shards.json` and
`rejects/select.parquet` under the run; the sampling and sharding live in `tasks.select`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from core.config import SelectConfig
from core.progress import Progress
from core.runs import SUCCESS, StepContext, StepError, rejects_table
from tasks.intervals import Interval, IntervalError
from tasks.select import (apply_split_rule, index_entry, interval_metadata, log,
                          manifest_table, metadata_files, parse_records, plan_shards,
                          read_metadata, sample_uniform, select_metrics, selection_plan)


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


def _inputs(ctx: StepContext, corpus: str, scfg: SelectConfig
            ) -> tuple[list[str], dict[str, Any], Interval | None]:
    """(the metadata files to read, the selection plan, the data interval or None)."""
    st = ctx.storage
    if not scfg.interval_start:
        plan = selection_plan(st, corpus, scfg)
        _adopt_files_fingerprint(ctx, plan)
        return metadata_files(st, corpus), plan, None
    try:
        interval = Interval.parse(scfg.interval_start, scfg.interval_end)
    except IntervalError as exc:
        raise StepError(str(exc)) from exc
    versions = interval_metadata(st, corpus, interval)
    if not versions and not metadata_files(st, corpus):
        raise StepError(f"no metadata under {corpus}: expected metadata/**.jsonl or "
                        f"metadata.jsonl")
    return list(versions), selection_plan(st, corpus, scfg, versions), interval


def _splits_beside_window(ctx: StepContext) -> Any:
    """select.* as this selection applies it: a student trained on a window of daily_data
    partitions (repartition.days / from_date) takes its unlabeled data from them, so its
    own selection leaves the unlabeled split out (it would select the same utterances
    twice)."""
    scfg, rcfg = ctx.cfg.select, ctx.cfg.repartition
    if not (rcfg.days or rcfg.from_date) or "unlabeled" not in scfg.splits:
        return scfg
    rest = [s for s in scfg.splits if s != "unlabeled"]
    if not rest:
        raise StepError("select.splits is only unlabeled, and with repartition.days / "
                        "from_date the unlabeled data comes from daily_data's partitions: "
                        "select labeled (and dev) here")
    log.info("select: the unlabeled split comes from daily_data's partitions "
             "(repartition.days=%s, from_date=%r): selecting %s", rcfg.days, rcfg.from_date,
             ", ".join(rest))
    return dataclasses.replace(scfg, splits=rest)


def _applied(ctx: StepContext) -> Any:
    """select.* as this run applies it (an interval's, or beside a training window)."""
    return ctx.cfg.select if ctx.cfg.select.interval_start else _splits_beside_window(ctx)


def unchanged(ctx: StepContext) -> dict[str, Any] | None:
    """The finished selection of a data interval whose plan (its metadata files, select.*)
    is unchanged: what `run` would hand back, found without writing anything. None
    otherwise (no interval, another plan, --force): `run` decides."""
    scfg = ctx.cfg.select
    if not scfg.interval_start:
        return None
    corpus = ctx.cfg.data.corpus.rstrip("/")
    try:
        _, plan, _ = _inputs(ctx, corpus, scfg)
    except StepError:
        return None
    return ctx.planned_summary(plan)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    cfg, st = ctx.cfg, ctx.storage
    scfg = _applied(ctx)
    corpus = cfg.data.corpus.rstrip("/")
    files, plan, interval = _inputs(ctx, corpus, scfg)
    earlier = ctx.unplanned_summary() or ctx.resume_plan(plan)
    if earlier is not None:
        return earlier
    if not files and interval is None:
        raise StepError(f"no metadata under {corpus}: expected metadata/**.jsonl or "
                        f"metadata.jsonl")
    log.info("select: reading %d metadata files under %s%s", len(files), corpus,
             f" for the interval {interval.label()}" if interval else "")
    records, rejects, n_lines = parse_records(files, read_metadata(st, files), corpus)
    apply_split_rule(st, corpus, records)
    inside = records if interval is None else \
        [r for r in records if interval.contains(r.created_ts)]

    wanted = [r for r in inside if r.split in scfg.splits]
    durations = np.array([r.duration for r in wanted], dtype=np.float64)
    chosen = sample_uniform(durations, scfg.hours, scfg.oversample, scfg.seed)
    selected = [wanted[i] for i in sorted(chosen.tolist())]
    shards = plan_shards(selected, scfg.shard_hours)
    written, index = _write_shards(ctx, shards, corpus)
    st.write_parquet(ctx.path("rejects", "select.parquet"), rejects_table(rejects))
    st.write_json(ctx.path("shards.json"), {"shards": index})

    if sum(durations) < scfg.hours * 3600.0 and interval is None:
        log.warning("select: wanted %.3f h but splits %s hold only %.3f h; took all",
                    scfg.hours, scfg.splits, durations.sum() / 3600.0)
    metrics = select_metrics(index, selected, durations, rejects, scfg.hours)
    inputs = {"corpus": corpus, "metadata_files": len(files), "splits": scfg.splits,
              "seed": scfg.seed}
    counts = {"in": n_lines, "out": len(records), "rejected": len(rejects),
              "selected": len(selected), "not_selected": len(records) - len(selected)}
    if interval is not None:
        inputs["interval"] = interval.to_json()
        counts["outside_interval"] = len(records) - len(inside)
        metrics.update(interval_metrics(interval, inside, wanted, selected))
    return ctx.finish(inputs=inputs, counts=counts, metrics=metrics, bytes_written=written)


def _write_shards(ctx: StepContext, shards: list, corpus: str) -> tuple[int, list[dict]]:
    """Write each shard's manifest (and drop manifests of an earlier plan): (bytes, index)."""
    st = ctx.storage
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
    return written, index


def interval_metrics(interval: Interval, inside: list, wanted: list, selected: list
                     ) -> dict[str, Any]:
    """What came in during the interval and what was kept: hours of every record created
    in it (all splits), of the wanted splits, and selected."""
    hours = lambda recs: round(sum(r.duration for r in recs) / 3600.0, 6)  # noqa: E731
    return {"interval": interval.to_json(), "interval_label": interval.label(),
            "hours_in": hours(inside), "hours_wanted": hours(wanted),
            "utts_in": len(inside)}
