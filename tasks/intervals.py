"""Data intervals: which metadata partitions hold an interval, and where its outputs live.

Pure and stdlib-only (the daily_data DAG imports it when Airflow parses the DAGs).

An interval is [start, end) in UTC. A corpus partitions its metadata by day
(`metadata/date=YYYY-MM-DD/...`, the input format's layout); an interval reads only the
files of the days it touches (`files_in_interval`), plus any file that is not
partitioned by date (`metadata.jsonl`, `metadata/part-*.jsonl`), whose records are then
filtered by `created_at` like every other record (`in_interval`).

Each interval's outputs are a run of their own: `<storage.root>/runs/<run id>/<step>/`,
the run id `<dataset>-YYYY-MM-DD` for a whole day (`interval_run_id`). So the run
layout `<root>/runs/<run_id>/<step>/_SUCCESS.json` holds for interval partitions as for
any run, and features and targets find their inputs in their own run as they always do.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

DAY = dt.timedelta(days=1)
_DATE_DIR = re.compile(r"(?:^|/)date=(\d{4}-\d{2}-\d{2})(?:/|$)")
_RUN_DATE = re.compile(r"^(?P<dataset>.+)-(?P<date>\d{4}-\d{2}-\d{2})$")


class IntervalError(ValueError):
    """A bad interval; the message names the key or value to change."""


def parse_when(value: str, key: str) -> dt.datetime:
    """ISO 8601 date or date-time -> aware UTC datetime (a naive time is UTC)."""
    try:
        t = dt.datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise IntervalError(f"{key}: not an ISO 8601 date or time: {value!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc)


@dataclass(frozen=True)
class Interval:
    start: dt.datetime  # inclusive, UTC
    end: dt.datetime  # exclusive, UTC

    @classmethod
    def parse(cls, start: str, end: str, key: str = "select.interval") -> "Interval":
        """From `select.interval_start` / `select.interval_end`: both set, start < end."""
        a, b = parse_when(start, f"{key}_start"), parse_when(end, f"{key}_end")
        if not a < b:
            raise IntervalError(f"{key}_end ({end}) must be after {key}_start ({start})")
        return cls(a, b)

    @property
    def is_day(self) -> bool:
        """One whole UTC day, midnight to midnight."""
        return self.end - self.start == DAY and self.start.time() == dt.time(0)

    def dates(self) -> list[str]:
        """The UTC days it touches, YYYY-MM-DD."""
        day = self.start.date()
        out = []
        while dt.datetime.combine(day, dt.time(0), dt.timezone.utc) < self.end:
            out.append(day.isoformat())
            day += DAY
        return out

    def contains(self, ts: float) -> bool:
        return self.start.timestamp() <= ts < self.end.timestamp()

    def label(self) -> str:
        """`2026-03-05` for a day, else `20260305T0600-20260305T1200`."""
        if self.is_day:
            return self.start.date().isoformat()
        return f"{self.start:%Y%m%dT%H%M}-{self.end:%Y%m%dT%H%M}"

    def to_json(self) -> list[str]:
        return [self.start.isoformat(), self.end.isoformat()]


def interval_run_id(dataset: str, interval: Interval) -> str:
    """The run that holds an interval's partition: `<dataset>-<label>`."""
    return f"{dataset}-{interval.label()}"


def file_date(relname: str) -> str | None:
    """The `date=YYYY-MM-DD` partition a metadata file sits in, or None."""
    m = _DATE_DIR.search(relname)
    return m.group(1) if m else None


def files_in_interval(files: list[str], interval: Interval) -> list[str]:
    """The metadata files an interval reads: those of its days, and every file that is
    not partitioned by date (its records are filtered by time instead)."""
    days = set(interval.dates())
    return [f for f in files if (d := file_date(f)) is None or d in days]


def day_runs(run_ids: list[str], dataset: str) -> dict[str, str]:
    """{YYYY-MM-DD: run id} of the whole-day interval runs of `dataset` among run ids."""
    out = {}
    for rid in run_ids:
        m = _RUN_DATE.match(rid)
        if m and m.group("dataset") == dataset:
            out[m.group("date")] = rid
    return out


def window_dates(days: int, from_date: str, to_date: str, latest: str | None) -> list[str]:
    """The days of a training window, oldest first: `from_date`..`to_date` (inclusive),
    or the last `days` days ending at `to_date` (default: `latest`, the newest partition).
    Empty when no window is asked for (days 0 and no from_date)."""
    if not days and not from_date:
        return []
    end_s = to_date or latest
    if not end_s:
        return []
    end = parse_when(end_s, "repartition.to_date").date()
    if from_date:
        start = parse_when(from_date, "repartition.from_date").date()
    else:
        start = end - (days - 1) * DAY
    if start > end:
        raise IntervalError(f"repartition.from_date ({start}) is after the window's end ({end})")
    out, day = [], start
    while day <= end:
        out.append(day.isoformat())
        day += DAY
    return out
