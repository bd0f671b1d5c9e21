"""Data that arrives every day: the `daily_data` DAG's `daily.*`."""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field

from core.config.errors import check

_DATASET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*$")


@dataclass
class DailyConfig:
    """Interval partitions: per data interval, select -> features -> targets into the run
    `<storage.root>/runs/<dataset>-YYYY-MM-DD/` (tasks/intervals.py)."""

    dataset: str = "daily"  # run-id prefix of the interval partitions: runs/<dataset>-YYYY-MM-DD/ (letters, digits, _ and .; no '-')
    schedule: str = "@daily"  # daily_data's timetable: a cron expression or preset (@daily, @hourly), read when Airflow parses the DAGs
    start_date: str = "2026-03-01"  # daily_data's first data interval (YYYY-MM-DD, UTC); the embedded corpus starts at corpus.start_date
    catchup: bool = False  # whether the scheduler runs every interval since start_date by itself (else: backfill them)
    max_active_runs: int = 2  # daily_data runs (intervals) in flight at once
    splits: list[str] = field(default_factory=lambda: ["unlabeled"])  # splits selected per interval (select.splits for daily_data)
    hours: float = 10000.0  # audio hours selected per interval at most (select.hours for daily_data): all of a day by default
    inline_hours: float = 1.0  # an interval with less audio than this is processed in its steps' own processes, without Ray workers or a teacher actor (ray.inline_hours for daily_data)

    def validate(self, key: str) -> None:
        check(bool(_DATASET.match(self.dataset)), f"{key}.dataset",
              f"must be letters, digits, '_' or '.' (no '-' or '/'), got {self.dataset!r}")
        check(bool(self.schedule.strip()), f"{key}.schedule",
              "must be a cron expression or a preset such as @daily")
        try:
            _dt.date.fromisoformat(self.start_date)
        except ValueError:
            check(False, f"{key}.start_date", f"must be a date YYYY-MM-DD, got {self.start_date!r}")
        check(self.max_active_runs >= 1, f"{key}.max_active_runs", "must be >= 1")
        check(self.hours > 0, f"{key}.hours", "must be > 0")
        check(self.inline_hours >= 0, f"{key}.inline_hours", "must be >= 0 hours")
        bad = [s for s in self.splits if s not in ("labeled", "unlabeled", "dev", "test")]
        check(bool(self.splits) and not bad, f"{key}.splits",
              f"must name splits among labeled, unlabeled, dev, test; got {self.splits}")
