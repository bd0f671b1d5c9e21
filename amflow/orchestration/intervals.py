"""daily_data's task side: a DAG run's data interval -> its partition (run id) and the
select keys that read it; the per-interval report (hours in, hours kept, rejects by
reason) that goes to the task log, XCom and the interval's asset event.

An interval's partition is the run `<storage.root>/runs/<daily.dataset>-YYYY-MM-DD/`
(tasks/intervals.py says why a run, not a second layout): its select, features and
targets are the steps' usual outputs, so the run layout, `_SUCCESS.json`, resume and
the amflow tab hold for it unchanged.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from amflow.jobs.base import resolve_config
from amflow.steps.registry import names
from core.config import load_config
from tasks.intervals import Interval, interval_run_id

# The steps daily_data runs per data interval, whose summaries its report reads.
REPORTED_STEPS = names(per_interval=True)


class NoIntervalError(ValueError):
    pass


def _utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def interval_of(context: dict[str, Any]) -> Interval:
    """The DAG run's data interval; a run without one (triggered with no logical date)
    is refused with what to do instead."""
    start = _utc(context.get("data_interval_start"))
    end = _utc(context.get("data_interval_end"))
    if start is None or end is None or not start < end:
        raise NoIntervalError(
            "daily_data processes one data interval per run, and this run has none "
            f"(data interval {start} - {end}): trigger it with a logical date, or use "
            "`airflow backfill create --dag-id daily_data --from-date A --to-date B`")
    return Interval(start, end)


def interval_overrides(config: str, overrides: list[str], interval: Interval
                       ) -> tuple[str, list[str]]:
    """(the interval's run id, the overrides that make select read it): the splits and
    hours of `daily.*` in the run's config, the size below which its steps skip Ray, and
    the interval itself (last: an override cannot move a partition to another interval)."""
    cfg = load_config(resolve_config(config), overrides)
    d = cfg.daily
    start, end = interval.to_json()
    return interval_run_id(d.dataset, interval), [
        f"select.splits={','.join(d.splits)}", f"select.hours={d.hours}",
        f"ray.inline_hours={d.inline_hours}",
        f"select.interval_start={start}", f"select.interval_end={end}"]


def _merge(into: dict[str, int], reasons: dict[str, Any] | None, step: str) -> None:
    for reason, n in (reasons or {}).items():
        key = f"{step}:{reason}"
        into[key] = into.get(key, 0) + int(n)


def interval_report(run_id: str, interval: Interval,
                    summaries: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """What came in during the interval and what became of it, from the steps' summaries:
    hours in (every record created in it), hours selected, hours kept (feature rows with
    targets), items rejected by step and reason, and whether each step was redone."""
    sel = summaries.get("select") or {}
    feats = summaries.get("features") or {}
    tgt = summaries.get("targets") or {}
    sm, fm, tm = (s.get("metrics") or {} for s in (sel, feats, tgt))
    rejected: dict[str, int] = {}
    _merge(rejected, sm.get("reject_reasons"), "select")
    _merge(rejected, fm.get("reject_reasons"), "features")
    if (tgt.get("counts") or {}).get("rejected"):
        rejected["targets:rejected"] = int(tgt["counts"]["rejected"])
    frames = int(tm.get("frames") or 0)
    return {
        "interval": interval.label(), "interval_start": interval.to_json()[0],
        "interval_end": interval.to_json()[1], "run_id": run_id,
        "uri": (tgt or feats or sel).get("uri", ""),
        "hours_in": sm.get("hours_in", 0.0), "utts_in": sm.get("utts_in", 0),
        "hours_selected": sm.get("audio_hours", 0.0),
        "hours_kept": round(frames * 0.03 / 3600.0, 6) if frames else
        (0.0 if tgt else fm.get("audio_hours", 0.0)),
        "utts_kept": (tgt.get("counts") or {}).get("out", 0),
        "rejected": sum(rejected.values()), "rejected_by_reason": rejected,
        "teacher": (tgt.get("inputs") or {}).get("teacher", ""),
        "teacher_digest": (tgt.get("inputs") or {}).get("teacher_digest", ""),
        "finished_at": {s: (summaries.get(s) or {}).get("finished_at") for s in REPORTED_STEPS},
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report for the task log: one plain line, then the rejects by reason."""
    lines = [f"[amflow daily] interval {report['interval']} (run {report['run_id']}): "
             f"{report['hours_in']:.4f} h in ({report['utts_in']} utterances), "
             f"{report['hours_selected']:.4f} h selected, {report['hours_kept']:.4f} h kept "
             f"({report['utts_kept']} utterances with targets), {report['rejected']} rejected; "
             f"teacher {report['teacher'] or '?'} ({report['teacher_digest'] or '?'})"]
    for reason, n in sorted(report["rejected_by_reason"].items()):
        lines.append(f"[amflow daily]   rejected {n}: {reason}")
    return lines
