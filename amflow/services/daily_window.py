"""The daily_data partitions of a training window, found through the run layout: each
day's partition is the run `<storage.root>/runs/<daily.dataset>-YYYY-MM-DD/`
(tasks/intervals.py), complete when its targets finished. `window_partitions` finds them
and says which days of the window have none (no audio that day, or not processed yet);
tasks.interval_window holds what a partition is and how a window's statistics merge."""
from __future__ import annotations

import logging

from core.config import RepartitionConfig
from core.runs import Run, StepError, runs_uri
from core.storage import Storage
from tasks.interval_window import Partition, day_partition
from tasks.intervals import IntervalError, day_runs, window_dates

log = logging.getLogger(__name__)


def window_partitions(st: Storage, root: str, dataset: str, rcfg: RepartitionConfig
                      ) -> tuple[list[Partition], list[str]]:
    """(the finished partitions of the window's days, oldest first; the days of the
    window without one). A StepError when a window is asked for and none is there."""
    all_runs = runs_uri(root)
    runs = day_runs([u.rsplit("/", 1)[-1] for u in st.subdirs(all_runs)], dataset)
    done = {d: r for d, r in runs.items()
            if st.exists(Run(root, r).success("targets"))}
    try:
        dates = window_dates(rcfg.days, rcfg.from_date, rcfg.to_date, max(done, default=None))
    except IntervalError as exc:
        raise StepError(str(exc)) from exc
    found = [_partition(st, Run(root, done[d]), d) for d in dates if d in done]
    missing = [d for d in dates if d not in done]
    if not found:
        raise StepError(
            f"repartition.days={rcfg.days} / from_date={rcfg.from_date!r} / to_date="
            f"{rcfg.to_date!r}: no finished daily_data partition ({all_runs}/{dataset}-"
            f"YYYY-MM-DD/targets/_SUCCESS.json) for the days {dates[:1]}..{dates[-1:]} "
            f"(partitions with targets: {sorted(done)[:5] or 'none'}); run daily_data for "
            f"them (airflow backfill create --dag-id daily_data ...) or change the keys")
    if missing:
        log.warning("repartition: %d of the window's %d days have no finished daily_data "
                    "partition (no audio, or not processed yet): %s", len(missing), len(dates),
                    ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    return found, missing


def _partition(st: Storage, run: Run, date: str) -> Partition:
    return day_partition(st, date, run.run_id, run.step("features"), run.step("targets"),
                         features=st.read_json(run.success("features")),
                         targets=st.read_json(run.success("targets")))
