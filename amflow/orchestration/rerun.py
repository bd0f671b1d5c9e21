"""What an Airflow task does with a step that has finished before: redo it or keep it.

A step has finished when `<storage.root>/runs/<run_id>/<step>/_SUCCESS.json` exists. A task
that finds one decides, from what Airflow tells it about this try:

  - nothing finished: run the step. A retry after a failure keeps the shards an earlier
    try finished (the step skips them), so it resumes rather than starts over.
  - an earlier try of this task, since it was last cleared, finished the step (the task
    failed after its job had succeeded): keep it; re-running would give the same thing.
  - the task was cleared, or its DAG run is a backfill: redo the step (`--force`).
    Steps keyed by their inputs (daily_data's interval partitions) are not forced in a
    backfill's run: they redo what changed themselves (rerun=redo forces them).
    Clearing or backfilling is the user's request to run it again, so the run's `rerun`
    param, which a cleared run keeps from its trigger, does not turn it into a no-op.
  - otherwise the step was finished by an earlier DAG run that names the same amflow run
    id (the `run_id` param, e.g. `make demo` twice): the run's `rerun` param decides;
    `redo` (default) runs it again from scratch, `resume` keeps it.

Airflow 3 facts used (the task's context): a cleared task instance gets the next
try_number and max_tries = try_number + retries at the clear, so its first try since the
clear is `max_tries - retries + 1` (what Airflow itself computes for reschedules); a clear
also counts up the DAG run's `clear_number`; a backfill's runs (new or reprocessed ones)
have run_type `backfill`.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

REDO, RESUME = "redo", "resume"
RERUN_CHOICES = (REDO, RESUME)
BACKFILL_RUN_TYPE = "backfill"
# A step's summary times are whole seconds, and a Ray job's submit time is the head's
# clock: a summary that started this long before its job was submitted is an old one.
REUSED_SLACK_S = 2.0


@dataclass(frozen=True)
class Attempt:
    """Where this try stands among the task's tries and its DAG run's history."""

    try_number: int = 1
    first_try: int = 1  # this task's first try since it was last cleared (1: never cleared)
    run_cleared: bool = False  # tasks of this DAG run were cleared (its clear_number > 0)
    backfill: bool = False  # the DAG run is a backfill's (run_type backfill)

    @property
    def retry(self) -> bool:
        """A retry after a failed try (not the first try since the task was cleared)."""
        return self.try_number > self.first_try

    @property
    def cleared(self) -> bool:
        # run_cleared also covers a task that never ran before the clear (it was
        # upstream_failed), whose try numbers then start at 1 again
        return self.first_try > 1 or self.run_cleared

    def earlier_tries(self) -> range:
        """The tries of this task since it was last cleared, before this one."""
        return range(self.first_try, self.try_number)


def attempt_from_context(context: dict[str, Any]) -> Attempt:
    """The Attempt of the running task instance, from its Airflow context."""
    ti, task, run = context["ti"], context["task"], context["dag_run"]
    try_number = max(int(getattr(ti, "try_number", 1) or 1), 1)
    max_tries = getattr(ti, "max_tries", None)
    first = 1
    if max_tries is not None:
        first = int(max_tries) - int(getattr(task, "retries", 0) or 0) + 1
    first = min(max(first, 1), try_number)
    run_type = getattr(run, "run_type", "")
    run_type = str(getattr(run_type, "value", run_type))
    return Attempt(try_number=try_number, first_try=first,
                   run_cleared=int(getattr(run, "clear_number", 0) or 0) > 0,
                   backfill=run_type == BACKFILL_RUN_TYPE)


@dataclass(frozen=True)
class Decision:
    force: bool  # pass --force: the step starts over
    reason: str  # one line for the task log

    @property
    def keeps(self) -> bool:
        """Whether a finished step is kept (the step returns its earlier summary)."""
        return not self.force


def decide(rerun: str, attempt: Attempt, finished: bool,
           finished_this_attempt: bool = False, keyed: bool = False) -> Decision:
    """Redo (`--force`) or keep a step, per the rules in this module's docstring.
    `finished`: its _SUCCESS.json exists; `finished_this_attempt`: a job of an earlier try
    since the task was last cleared succeeded. `keyed`: the step keeps its output only
    for the same inputs (an interval partition of daily_data): a backfill's run, new or
    reprocessed, runs it without --force unless the run's rerun param is redo, so that
    what changed (a new teacher) is redone and the rest handed back."""
    if rerun not in RERUN_CHOICES:
        raise ValueError(f"rerun must be one of {', '.join(RERUN_CHOICES)}, got {rerun!r}")
    if not finished:
        if attempt.retry:
            return Decision(False, f"try {attempt.try_number} retries the step: shards "
                                   f"finished by earlier tries are kept")
        return Decision(False, "the step has not finished before: it runs")
    if finished_this_attempt:
        return Decision(False, "an earlier try of this task finished the step: kept, "
                               "not re-run")
    if attempt.backfill and keyed:
        if rerun == REDO:
            return Decision(True, "a backfill's run with rerun=redo, and the step finished "
                                  "before: redoing it (--force)")
        return Decision(False, "a backfill's run of a step keyed by its inputs: it is "
                               "handed back when they are the same, redone where they "
                               "changed (rerun=redo in the backfill's conf forces it)")
    if attempt.backfill:
        return Decision(True, "a backfill's run, and the step finished before: redoing it "
                              "(--force)")
    if attempt.cleared:
        return Decision(True, "the task was cleared, and the step finished before: redoing "
                              "it (--force), whatever the run's rerun param says (it decides "
                              "for new DAG runs only)")
    if rerun == REDO:
        return Decision(True, "an earlier DAG run of this amflow run id, and the step "
                              "finished before: redoing it (--force), as rerun=redo asks")
    return Decision(False, "an earlier DAG run of this amflow run id finished the step: "
                           "rerun=resume: kept, not re-run")


def _epoch(iso: Any) -> float | None:
    try:
        return dt.datetime.fromisoformat(str(iso)).timestamp()
    except (TypeError, ValueError):
        return None


def reused_summary(summary: dict[str, Any], submitted_at: float | None) -> bool:
    """Whether a step's summary is the one of an earlier execution (the step kept its
    finished output) rather than this job's: it started before the job was submitted."""
    if summary.get("skipped") is True:  # the corpus step says so itself
        return True
    started = _epoch(summary.get("started_at"))
    if started is None or submitted_at is None:
        return False
    return started < float(submitted_at) - REUSED_SLACK_S
