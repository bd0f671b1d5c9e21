"""The daily_data DAG's wiring (fast): its graph and timetable from config, the interval's
run id and select keys, the rerun rule for keyed steps in a backfill, the per-interval
report; ssl_student's training-window params."""
from __future__ import annotations

import datetime as dt
import sys

import pytest

from core.config import load_config
from amflow.orchestration.intervals import (NoIntervalError, interval_of, interval_report,
                                            report_lines)
from amflow.orchestration.rerun import Attempt, decide
from tests.airflow_env import ROOT

DAGS = ROOT / "dags"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    import os

    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow_home")))
    if str(DAGS) not in sys.path:
        sys.path.insert(0, str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_graph_timetable_and_assets_come_from_config(dagbag):
    assert dagbag.import_errors == {}
    dag = dagbag.dags["daily_data"]
    daily = load_config(ROOT / "configs" / "local.yaml").daily
    edges = {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}
    assert edges == {("select", "features"), ("features", "targets"), ("targets", "report")}
    assert dag.catchup is daily.catchup is False
    assert dag.is_paused_upon_creation is True  # switched on by its user
    assert dag.max_active_runs == daily.max_active_runs
    # a data-interval timetable (a cron string alone has no intervals in Airflow 3)
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"
    assert daily.schedule == "@daily" and dag.timetable.expression == "0 0 * * *"
    assert dag.start_date.date().isoformat() == daily.start_date
    from amflow_common import DAILY_DATA, TEACHER_MODEL, IntervalStepOperator

    steps = [t for t in dag.tasks if isinstance(t, IntervalStepOperator)]
    assert [t.task_id for t in steps] == ["select", "features", "targets"]
    assert all(t.keyed for t in steps)
    assert dag.get_task("targets").teacher_asset == TEACHER_MODEL
    assert [a.name for a in dag.get_task("report").outlets] == [DAILY_DATA.name]
    assert dag.params["rerun"] == "resume"


def _context(start, end, **params):
    return {"params": {"config": "configs/local.yaml", "overrides": [], **params},
            "data_interval_start": start, "data_interval_end": end}


def test_the_deployment_names_the_default_config_of_forms_and_scheduled_runs(tmp_path):
    """AMFLOW_CONFIG in Airflow's environment (e.g. configs/aws.yaml on the cluster's
    Airflow): daily_data's scheduled runs (no form starts them) use it, and its timetable
    comes from it. Parsed in a fresh process: the DAG modules read it when imported."""
    import json
    import os
    import subprocess

    cfg = tmp_path / "deployed.yaml"
    cfg.write_text(json.dumps({"storage": {"root": str(tmp_path / "store")},
                               "daily": {"schedule": "0 6 * * *", "start_date": "2026-05-01"}}))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]);"
            "from airflow.dag_processing.dagbag import DagBag;"
            "b = DagBag(dag_folder=sys.argv[1]); d = b.dags['daily_data'];"
            "print(json.dumps([b.import_errors == {}, d.params['config'],"
            " b.dags['ssl_student'].params['config'], d.timetable.expression,"
            " d.start_date.date().isoformat()]))")
    env = {**os.environ, "AMFLOW_CONFIG": str(cfg), "AIRFLOW_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, str(DAGS)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ok, daily_config, student_config, cron, start = json.loads(out.stdout.splitlines()[-1])
    assert ok and daily_config == student_config == str(cfg)
    assert (cron, start) == ("0 6 * * *", "2026-05-01")


def test_an_interval_task_reads_its_interval_into_its_own_run(dagbag):
    task = dagbag.dags["daily_data"].get_task("select")
    ctx = _context(dt.datetime(2026, 3, 8, tzinfo=UTC), dt.datetime(2026, 3, 9, tzinfo=UTC),
                   overrides=["select.interval_start=2020-01-01",
                              "select.interval_end=2020-01-02", "daily.hours=2",
                              "daily.inline_hours=0.25"])
    assert task.amflow_run_id(ctx) == "daily-2026-03-08"
    sets = task.resolved_overrides(ctx)
    # the interval comes last: an override cannot move the partition to another interval
    assert sets[-5:] == ["select.splits=unlabeled", "select.hours=2.0",
                         "ray.inline_hours=0.25",
                         "select.interval_start=2026-03-08T00:00:00+00:00",
                         "select.interval_end=2026-03-09T00:00:00+00:00"]
    cfg = load_config(ROOT / "configs" / "local.yaml", sets)
    assert cfg.select.interval_start.startswith("2026-03-08") and cfg.select.hours == 2.0
    assert cfg.ray.inline_hours == 0.25  # a day below it runs without Ray workers
    other = _context(dt.datetime(2026, 3, 8, tzinfo=UTC), dt.datetime(2026, 3, 9, tzinfo=UTC),
                     overrides=["daily.dataset=calls"])
    assert task.amflow_run_id(other) == "calls-2026-03-08"
    with pytest.raises(NoIntervalError, match="backfill create --dag-id daily_data"):
        interval_of(_context(None, None))


def test_a_backfill_hands_keyed_steps_back_unless_rerun_redo():
    backfill = Attempt(try_number=2, first_try=2, run_cleared=True, backfill=True)
    keep = decide("resume", backfill, finished=True, keyed=True)
    assert not keep.force and "keyed by its inputs" in keep.reason
    assert decide("redo", backfill, finished=True, keyed=True).force
    assert decide("resume", backfill, finished=True).force  # the other DAGs: redone
    cleared = Attempt(try_number=2, first_try=2, run_cleared=True)
    assert decide("resume", cleared, finished=True, keyed=True).force  # a clear redoes


def test_the_interval_report_counts_hours_and_rejects_by_reason():
    from tasks.intervals import Interval

    iv = Interval.parse("2026-03-08", "2026-03-09")
    summaries = {
        "select": {"run_id": "daily-2026-03-08", "metrics": {
            "hours_in": 0.5, "utts_in": 300, "audio_hours": 0.4,
            "reject_reasons": {"malformed_metadata": 2}}},
        "features": {"metrics": {"audio_hours": 0.39, "reject_reasons": {"missing_audio": 3}},
                     "counts": {"in": 250, "out": 247, "rejected": 3}},
        "targets": {"uri": "/s/runs/daily-2026-03-08/targets",
                    "counts": {"in": 247, "out": 247, "rejected": 0},
                    "metrics": {"frames": 46_800},
                    "inputs": {"teacher": "/m/t.pt", "teacher_digest": "abc"}},
    }
    rep = interval_report("daily-2026-03-08", iv, summaries)
    assert rep["hours_in"] == 0.5 and rep["hours_selected"] == 0.4
    assert rep["hours_kept"] == 0.39 and rep["utts_kept"] == 247  # 46,800 frames x 30 ms
    assert rep["rejected_by_reason"] == {"select:malformed_metadata": 2,
                                         "features:missing_audio": 3}
    assert rep["rejected"] == 5 and rep["teacher_digest"] == "abc"
    lines = report_lines(rep)
    assert "interval 2026-03-08" in lines[0] and "0.5000 h in" in lines[0]
    assert lines[1:] == ["[amflow daily]   rejected 3: features:missing_audio",
                         "[amflow daily]   rejected 2: select:malformed_metadata"]


def test_the_student_form_names_a_training_window(dagbag):
    dag = dagbag.dags["ssl_student"]
    assert dag.params["window_days"] is None and dag.params["window_from"] is None
    sets = dag.get_task("repartition").param_sets
    assert sets["window_days"] == "repartition.days"
    assert sets["window_from"] == "repartition.from_date"
    assert sets["window_to"] == "repartition.to_date"
    task = dag.get_task("repartition")
    ctx = {"params": {"window_days": 7, "window_to": "2026-03-21", "overrides": []}}
    got = task.resolved_overrides(ctx)
    assert "repartition.days=7" in got and "repartition.to_date=2026-03-21" in got
