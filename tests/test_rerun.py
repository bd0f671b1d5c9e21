"""What a task does with a step that finished before (issue 31): a cleared task and a
backfill re-run it, whatever `rerun` the run was triggered with; a retry resumes; only a
new DAG run naming an old amflow run id asks the `rerun` param; a step that kept its
result says so instead of logging the old wall time as its own."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from amflow.orchestration import airflow_step as A
from amflow.orchestration import operator as O
from amflow.orchestration.rerun import (Attempt, attempt_from_context, decide,
                                        reused_summary)

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_amflow.py"

FIRST = Attempt(try_number=1, first_try=1)
RETRY = Attempt(try_number=2, first_try=1)
CLEARED = Attempt(try_number=2, first_try=2, run_cleared=True)
RETRY_AFTER_CLEAR = Attempt(try_number=3, first_try=2, run_cleared=True)
BACKFILL = Attempt(try_number=1, first_try=1, backfill=True)  # a new backfill run
REPROCESSED = Attempt(try_number=2, first_try=2, run_cleared=True, backfill=True)


@pytest.mark.parametrize("rerun", ["redo", "resume"])
def test_a_step_that_never_finished_runs_and_a_retry_resumes_it(rerun):
    for attempt in (FIRST, RETRY, CLEARED, RETRY_AFTER_CLEAR, BACKFILL):
        d = decide(rerun, attempt, finished=False)
        assert not d.force, attempt  # finished shards of a failed try are kept
    assert "retries" in decide(rerun, RETRY, finished=False).reason


@pytest.mark.parametrize("rerun", ["redo", "resume"])
def test_cleared_tasks_and_backfills_redo_a_finished_step_whatever_rerun_says(rerun):
    for attempt in (CLEARED, BACKFILL, REPROCESSED):
        d = decide(rerun, attempt, finished=True)
        assert d.force and not d.keeps, (attempt, d)
    assert "cleared" in decide(rerun, CLEARED, finished=True).reason
    assert "backfill" in decide(rerun, BACKFILL, finished=True).reason
    for attempt in (CLEARED, BACKFILL):  # what the log says (the browser test looks for it)
        assert "finished before: redoing it (--force)" in decide(rerun, attempt, True).reason
    # a cleared task whose forced try failed before its job ran: the retry still redoes
    assert decide(rerun, RETRY_AFTER_CLEAR, finished=True).force
    # a task that never ran before its run was cleared (it was upstream_failed) counts as
    # cleared: its try numbers start at 1 again
    assert decide(rerun, Attempt(1, 1, run_cleared=True), finished=True).force


def test_a_retry_keeps_a_step_its_own_earlier_try_finished():
    for rerun in ("redo", "resume"):
        for attempt in (RETRY, RETRY_AFTER_CLEAR):
            d = decide(rerun, attempt, finished=True, finished_this_attempt=True)
            assert d.keeps and "earlier try" in d.reason


def test_a_new_run_of_an_old_run_id_asks_the_rerun_param():
    assert decide("redo", FIRST, finished=True).force
    kept = decide("resume", FIRST, finished=True)
    assert kept.keeps and "rerun=resume" in kept.reason
    # a retry of that run whose first try never got to run the step decides alike
    assert decide("redo", RETRY, finished=True).force
    assert decide("resume", RETRY, finished=True).keeps
    with pytest.raises(ValueError, match="rerun"):
        decide("force", FIRST, finished=True)


def _context(try_number, max_tries, retries=2, clear_number=0, run_type="manual"):
    kind = SimpleNamespace(value=run_type)  # Airflow passes a DagRunType (a str enum)
    return {"ti": SimpleNamespace(try_number=try_number, max_tries=max_tries),
            "task": SimpleNamespace(retries=retries),
            "dag_run": SimpleNamespace(run_type=kind, clear_number=clear_number)}


def test_attempt_from_the_airflow_context():
    """Airflow 3: a new task instance has max_tries = retries; a clear sets max_tries =
    try_number + retries and the next try is try_number + 1, counting up the run's
    clear_number; a backfill's runs have run_type backfill."""
    first = attempt_from_context(_context(1, 2))
    assert first == Attempt(1, 1) and not first.retry and not first.cleared
    retry = attempt_from_context(_context(3, 2))
    assert retry.retry and not retry.cleared and list(retry.earlier_tries()) == [1, 2]
    cleared = attempt_from_context(_context(2, 1 + 2, clear_number=1))
    assert cleared == Attempt(2, 2, run_cleared=True) and not cleared.retry
    again = attempt_from_context(_context(3, 3, clear_number=1))
    assert again.retry and again.cleared and list(again.earlier_tries()) == [2]
    backfill = attempt_from_context(_context(1, 2, run_type="backfill"))
    assert backfill.backfill and not backfill.cleared
    plain = attempt_from_context({"ti": SimpleNamespace(try_number=2),
                                  "task": SimpleNamespace(retries=2),
                                  "dag_run": SimpleNamespace(run_type="scheduled")})
    assert plain == Attempt(2, 1)  # max_tries unknown: a retry of a never-cleared task


def test_a_summary_older_than_its_job_is_a_kept_one():
    t = time.time()
    iso = lambda x: time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(x))  # noqa: E731
    assert reused_summary({"started_at": iso(t - 3600)}, t)
    assert not reused_summary({"started_at": iso(t + 0.5)}, t)
    assert not reused_summary({"started_at": iso(t - 0.9)}, t)  # whole seconds
    assert reused_summary({"skipped": True}, t)  # the corpus step says so
    assert not reused_summary({}, t) and not reused_summary({"started_at": iso(t)}, None)


# ------------------------------------------------------------------ through the runner


def _try(cfg, attempt: Attempt, airflow_run="manual__a", rerun="redo", run_id="",
         step="features", lines=None):
    return A.AirflowStep(step=step, dag_id="teacher", airflow_run_id=airflow_run,
                         task_id=step, try_number=attempt.try_number, config=str(cfg),
                         overrides=[], rerun=rerun, run_id=run_id, attempt=attempt,
                         emit=(lines.append if lines is not None else lambda line: None))


def _success(tmp: Path, run_id: str, step="features") -> dict:
    return json.loads((tmp / "store" / "runs" / run_id / step / "_SUCCESS.json").read_text())


def test_cleared_and_backfilled_tasks_rerun_with_a_fresh_wall_time(fake_env):
    """The issue's case: runs triggered with rerun=resume (as `make demo` does); clearing
    a task re-runs its step, the log and _SUCCESS.json carry the new execution's times."""
    cfg, set_plan, tmp = fake_env
    set_plan(features={"seconds": 0.3, "keep": True, "fail_times": 1})
    first = _try(cfg, FIRST, rerun="resume")
    assert first.poke().status == "FAILED"  # try 1 fails ...
    lines: list[str] = []
    retry = _try(cfg, RETRY, rerun="resume", lines=lines)
    out = retry.poke()  # ... its retry runs the step (resuming: no --force)
    assert out.ok and out.summary["metrics"]["forced"] is False
    assert any("retries the step" in x for x in lines)
    assert not retry.reused(out.summary)
    run_id, before = retry.run_id, _success(tmp, retry.run_id)

    time.sleep(2.2)  # whole-second timestamps: the redone step's must differ
    lines.clear()
    cleared = _try(cfg, Attempt(3, 3, run_cleared=True), rerun="resume", lines=lines)
    out = cleared.poke()
    assert out.ok and out.summary["metrics"]["forced"] is True and cleared.redone
    assert any("the task was cleared" in x for x in lines)
    after = _success(tmp, run_id)
    assert after["started_at"] > before["finished_at"] and after == out.summary
    assert not cleared.reused(out.summary)
    line = O.metrics_line("features", out.summary, cleared.reused(out.summary))
    assert f"done in {after['wall_s']} s" in line

    # a backfill run of the same amflow run id (conf run_id) redoes it too
    backfill = _try(cfg, BACKFILL, airflow_run="backfill__x", rerun="resume", run_id=run_id)
    out = backfill.poke()
    assert out.ok and out.summary["metrics"]["forced"] is True
    forced = [c["force"] for c in json.loads(
        "[" + ",".join((tmp / "store" / "runs" / run_id / "_calls.jsonl").read_text()
                       .splitlines()) + "]")]
    assert forced == [False, False, True, True]


def test_a_new_run_with_resume_keeps_the_step_and_says_so(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(features={"seconds": 0.2, "keep": True})
    done = _try(cfg, FIRST).poke()
    assert done.ok
    run_id = done.summary["run_id"]
    time.sleep(2.2)
    lines: list[str] = []
    again = _try(cfg, FIRST, airflow_run="manual__b", rerun="resume", run_id=run_id,
                 lines=lines)
    out = again.poke()
    assert out.ok and out.summary == done.summary  # the step kept its result
    assert any("rerun=resume: kept" in x for x in lines)
    assert again.reused(out.summary)
    line = O.metrics_line("features", out.summary, True)
    assert "kept the result finished at" in line and "done in" not in line
    # the same with rerun=redo runs it again, with a new wall time
    redo = _try(cfg, FIRST, airflow_run="manual__c", rerun="redo", run_id=run_id)
    out = redo.poke()
    assert out.ok and out.summary["metrics"]["forced"] is True
    assert out.summary["started_at"] > done.summary["finished_at"]
    assert not redo.reused(out.summary)


def test_a_retry_after_the_step_succeeded_keeps_it(fake_env):
    """The job succeeded but the task failed after it (e.g. publishing its asset event):
    the retry keeps the step's result instead of redoing it."""
    cfg, set_plan, tmp = fake_env
    set_plan(features={"seconds": 0.2, "keep": True})
    assert _try(cfg, FIRST).poke().ok
    lines: list[str] = []
    retry = _try(cfg, RETRY, lines=lines)
    out = retry.poke()
    assert out.ok and out.summary["metrics"]["forced"] is False and not retry.redone
    assert any("an earlier try of this task finished the step" in x for x in lines)


def test_the_corpus_step_is_judged_by_the_corpus_marker(fake_env):
    """`amflow corpus` has no run: its _SUCCESS.json is data.corpus's; a cleared corpus
    task redoes it (--force) instead of keeping the corpus silently."""
    cfg, set_plan, tmp = fake_env
    set_plan(corpus={"seconds": 0.1})
    first = _try(cfg, FIRST, step="corpus", rerun="resume")
    assert first.success_uri() == str(tmp / "store" / "corpus" / "_SUCCESS.json")
    assert first.poke().ok and not first.redone
    cleared = _try(cfg, CLEARED, step="corpus", rerun="resume")
    out = cleared.poke()
    assert out.ok and cleared.redone and out.summary["metrics"]["forced"] is True


def test_the_asset_event_of_a_kept_step_says_its_wall_time_is_an_earlier_one():
    if str(ROOT / "dags") not in sys.path:
        sys.path.insert(0, str(ROOT / "dags"))
    from amflow_common import TEACHER_EVAL, AmflowStepOperator

    op = AmflowStepOperator(task_id="evaluate", step="evaluate", outlets=[TEACHER_EVAL],
                            results=True)
    summary = {"uri": "/s/runs/r/evaluate-teacher", "wall_s": 12.5,
               "metrics": {"frame_accuracy": 0.7}}
    for reused in (True, False):
        events = {TEACHER_EVAL: SimpleNamespace(extra={})}
        op.emit_asset_events({"outlet_events": events,
                              "dag_run": SimpleNamespace(run_id="manual__x")},
                             summary, "r", reused=reused)
        extra = events[TEACHER_EVAL].extra
        assert extra["reused"] is reused and extra["wall_s"] == 12.5
        assert extra["frame_accuracy"] == 0.7


def test_a_student_run_a_teacher_event_started_reads_the_teachers_config(tmp_path):
    """Trigger `teacher` on your own YAML: its model event names that file, and the
    ssl_student run the event starts (nobody fills its form) reads it, not the default."""
    if str(ROOT / "dags") not in sys.path:
        sys.path.insert(0, str(ROOT / "dags"))
    from amflow_common import DEFAULT_CONFIG, TEACHER_MODEL, AmflowStepOperator

    mine = str(tmp_path / "mine.yaml")
    train = AmflowStepOperator(task_id="train", step="train", outlets=[TEACHER_MODEL],
                               model_output=True)
    train._amflow_step = SimpleNamespace(config=mine)
    events = {TEACHER_MODEL: SimpleNamespace(extra={})}
    train.emit_asset_events({"outlet_events": events,
                             "dag_run": SimpleNamespace(run_id="manual__t")},
                            {"uri": "/s/runs/t/train-teacher"}, "t")
    event = events[TEACHER_MODEL]
    assert event.extra["config"] == mine
    targets = AmflowStepOperator(task_id="targets", step="targets", teacher_asset=TEACHER_MODEL)
    started = {"params": {"config": DEFAULT_CONFIG, "teacher": None},
               "triggering_asset_events": {TEACHER_MODEL: [event]}}
    assert targets.resolved_config(started) == mine
    # every task of that run, not only the one that reads the teacher's model
    select = AmflowStepOperator(task_id="select", step="select")
    assert select.resolved_config(started) == mine
    assert "targets.teacher=/s/runs/t/train-teacher/model.pt" in targets.resolved_overrides(started)
    # a run triggered from the form reads the form's config
    form = {"params": {"config": "configs/aws.yaml", "teacher": None},
            "triggering_asset_events": {}}
    assert targets.resolved_config(form) == "configs/aws.yaml"
