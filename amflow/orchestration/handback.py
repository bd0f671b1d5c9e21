"""A keyed step's finished output handed back by its Airflow task, with no job.

A daily_data task whose step finished before on the same inputs (its `_plan.json`: the
interval's metadata files, the selection, the teacher's digest) would start a job only for
the step to say so: two Python processes, a config load and the step's own check, 2-3 s
of task time each (a no-op re-backfill cost 7-11 s per interval). The task asks the step's
own check (its registry entry's `unchanged`, e.g. `amflow.steps.select:unchanged`, which
writes nothing and imports neither torch nor Ray) first and hands the summary back when
it holds.
"""
from __future__ import annotations

from typing import Any

from amflow.steps.registry import STEPS, load_entry
from core.config import Config
from core.runs import StepContext


def unchanged_summary(cfg: Config, run_id: str, step: str) -> dict[str, Any] | None:
    """The step's finished summary when its inputs are unchanged; None when the step has
    no such check, implies config keys of its own, or its check says no or fails (then
    its job decides, as before)."""
    spec = STEPS.get(step)
    if spec is None or spec.sets or not spec.in_a_run:
        return None  # the CLI would run it under another config than `cfg`
    if not spec.unchanged:
        return None
    try:
        return load_entry(spec.unchanged)(StepContext(cfg, run_id, step))
    except Exception:  # noqa: BLE001 - unreadable storage and the like: the job decides
        return None
