"""Airflow's side of running a step: what a DAG task calls (dags/ stay wiring only).

    airflow_step.py  AirflowStep: one task try's job (run id, job id, its rerun decision,
                     submit-or-attach, budget per try)
    operator.py      the operator's body: execute / defer / complete / kill, errors that
                     are not worth a retry, metrics lines, asset-event results, orphan stop
    rerun.py         redo or keep a finished step: first run, retry, cleared task,
                     backfill, the `rerun` param (pure; from the task's Airflow context)
    trigger.py       AmflowJobTrigger: the triggerer waits for the job (deferral)
    pools.py         pool slots: how many quarter-cores a step holds in default_pool

Imported only inside Airflow processes (task runner, triggerer, DAG parser for pools);
nothing here imports airflow at module top but the trigger (it subclasses BaseTrigger).
"""
