"""daily_data: audio that arrives every day, one data interval per DAG run.

select -> features -> targets -> report, for the run's data interval [start, end):

- select reads only the corpus's `metadata/date=*` partitions of the interval's days and
  keeps the records created in it (the splits and hours of `daily.*`);
- features and targets (the teacher the `amflow_teacher_model` asset names, or the
  `teacher` param) write the interval's partition: the run
  `<storage.root>/runs/<daily.dataset>-YYYY-MM-DD/{select,features,targets}/`;
- report puts what came in and what became of it (hours in, hours kept, rejected by
  reason, the teacher) in the task log, its XCom and an `amflow_daily_data` asset event.

Each step is keyed by its inputs: select by the interval and its metadata files, features
by the selection, targets by the features and the teacher's digest. A run of an interval
whose inputs did not change hands every step back in seconds; after a new teacher only
targets are redone (features kept). Backfill (`airflow backfill create --dag-id
daily_data --from-date A --to-date B`, or the UI's Backfill dialog) runs the missing
intervals; `--reprocess-behavior completed` runs finished ones again, which re-scores the
ones a different teacher scored and hands back the rest (conf {"rerun": "redo"} forces
them all). The timetable (`daily.schedule`), first interval (`daily.start_date`), catchup
and max_active_runs come from configs/local.yaml's `daily.*`. It starts paused: switch it
on once its config points at a corpus that receives data (a backfill needs it on too).
docs/how-to/daily-data.md has the commands.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import CronDataIntervalTimetable, Param, dag, task

from amflow_common import (DAILY_DATA, DEFAULT_ARGS, DEFAULT_CONFIG, RUN_END_CALLBACKS,
                           TEACHER_MODEL, IntervalStepOperator, local_defaults,
                           overrides_param, rerun_param)

_cfg = local_defaults()
_daily = _cfg.daily


@task(task_id="report", outlets=[DAILY_DATA], pool_slots=1)
def report(**context) -> dict:
    """The interval's numbers: task log, XCom (returned) and the asset event."""
    from amflow.orchestration.intervals import (REPORTED_STEPS, interval_of, interval_report,
                                                report_lines)

    ti = context["ti"]
    summaries = {s: ti.xcom_pull(task_ids=s) for s in REPORTED_STEPS}
    run_id = (summaries.get("select") or {}).get("run_id", "")
    out = interval_report(run_id, interval_of(context), summaries)
    for line in report_lines(out):
        print(line, flush=True)
    context["outlet_events"][DAILY_DATA].extra.update(out)
    return out


@dag(
    **RUN_END_CALLBACKS,
    dag_id="daily_data",
    # data intervals [start, end): a plain cron string would be a CronTriggerTimetable in
    # Airflow 3, whose runs have no interval (start = end)
    schedule=CronDataIntervalTimetable(_daily.schedule, timezone="UTC"),
    start_date=pendulum.parse(_daily.start_date, tz="UTC"),
    catchup=_daily.catchup,
    # a data DAG is switched on by its user (its first run would process yesterday with the
    # default config); backfills need it switched on too
    is_paused_upon_creation=True,
    max_active_runs=_daily.max_active_runs,
    tags=["amflow", "daily"],
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS, "param_sets": {"teacher": "targets.teacher"}},
    params={
        "config": Param(DEFAULT_CONFIG, type="string", title="Config file",
                        description="YAML config, relative to the project root or absolute."),
        "teacher": Param(_cfg.targets.teacher or None, type=["null", "string"],
                         title="Teacher model URI",
                         description="targets.teacher. Empty: the model of the latest "
                                     "`teacher` DAG run (asset amflow_teacher_model)."),
        "overrides": overrides_param(),
        # resume: a new run of a finished interval hands back what is unchanged
        "rerun": rerun_param("resume"),
    },
)
def daily_data():
    select = IntervalStepOperator(task_id="select", step="select",
                                  doc_md="The interval's records (its metadata/date=* "
                                         "partitions), sharded by speaker.")
    features = IntervalStepOperator(task_id="features", step="features",
                                    doc_md="Log-mel fbank, causal CMN, LFR of the interval.")
    targets = IntervalStepOperator(task_id="targets", step="targets", inlets=[TEACHER_MODEL],
                                   teacher_asset=TEACHER_MODEL,
                                   doc_md="Teacher inference on the interval, top-k targets.")
    select >> features >> targets >> report()


daily_data()
