"""The body of the amflow Airflow operator (dags/amflow_common.AmflowStepOperator calls
these): execute (submit, follow, defer or reschedule), complete after the trigger fired,
kill; which failures are not worth a retry; the metrics line and asset-event results;
stopping a finished DAG run's orphaned jobs.

Airflow is imported inside the functions: this module is also imported where only the
pure helpers are wanted (model_uri, flat_results, permanent_error) without an Airflow.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from core.config import ConfigError, load_config
from amflow.jobs import FAILED, SUCCEEDED, Emit, Outcome, StepRunner, default_state_dir, job_prefix, make_backend
from amflow.jobs.base import resolve_config
from amflow.orchestration.airflow_step import AirflowStep, try_budget_s
from amflow.orchestration.rerun import Decision, attempt_from_context
from amflow.steps.registry import STEPS


def model_uri(summary: dict[str, Any]) -> str:
    """Where a train step put its model, from its summary."""
    for key in ("model_uri", "model"):
        if isinstance(summary.get(key), str) and summary[key]:
            return summary[key]
    for key in ("outputs", "metrics"):
        sub = summary.get(key) or {}
        if isinstance(sub, dict) and isinstance(sub.get("model"), str):
            return sub["model"]
    base = summary.get("uri", "")
    return f"{base.rstrip('/')}/model.pt" if base else ""




def metrics_line(step: str, summary: dict[str, Any], reused: bool = False) -> str:
    """The task log's last line: this execution's wall time, or, when the step kept an
    earlier result, when that one finished and what it took (not this try's time)."""
    counts = summary.get("counts", {})
    metrics = summary.get("metrics", {})
    flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))}
    what = (f"kept the result finished at {summary.get('finished_at', '?')} (its wall time "
            f"{summary.get('wall_s', '?')} s), not re-run" if reused
            else f"done in {summary.get('wall_s', '?')} s")
    return (f"[amflow {step}] {what}: counts "
            f"{json.dumps(counts, sort_keys=True)} metrics {json.dumps(flat, sort_keys=True)}")


def per_condition_name(step: str) -> str:
    """What a step's bare `per_condition` holds (the registry's `per_condition`: evaluate's
    is frame accuracy, decode's WER); "per_condition" when it does not say."""
    spec = STEPS.get(step)
    return (spec.per_condition if spec else "") or "per_condition"


def flat_results(metrics: dict[str, Any], step: str = "evaluate") -> dict[str, Any]:
    """An evaluation's (or decoding's) results as flat `name` / `name_<condition>` keys,
    rounded, for an asset event's extra: `frame_accuracy`, `frame_accuracy_DP1`, `per_DP1`,
    `wer_DP1`, ... (`per_condition_<m>` holds metric m per condition)."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            name = (per_condition_name(step) if key == "per_condition"
                    else key.removeprefix("per_condition_"))
            for cond, v in sorted(value.items()):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{name}_{cond}"] = round(float(v), 4)
        elif isinstance(value, float):
            out[key] = round(value, 4)
        elif isinstance(value, (int, str, bool)):
            out[key] = value
    return out




def permanent_error(step: str, lines: list[str]) -> str:
    """The reason a step failed for good, or "" when a retry may help.

    `amflow <step>` prints `amflow <step>: ...` for what no retry can fix: a config error
    (unknown key, bad value, missing config file; exit code 2) and a StepError (missing
    input, broken invariant). Anything else (a crash, a lost node, S3 throttling) is
    worth a retry, which resumes from the finished shards.
    """
    for line in reversed(lines):
        if line.startswith((f"amflow {step}: ", "amflow: error: ")):
            return line
    return ""


def in_airflow_terms(reason: str) -> str:
    """A failure's reason as an Airflow user acts on it: a step that says to re-run it with
    --force (a finished training of another config, a phone stage of another recipe) is
    redone by clearing its task, or by a DAG run with rerun=redo; the CLI flag is not theirs."""
    if "--force" not in reason:
        return reason
    return (f"{reason} [in Airflow, --force is: clear this task (a cleared task redoes its "
            "step), or trigger the DAG again with rerun=redo]")


def _run_id(op, context) -> str:
    """The amflow run id: the operator's own (daily_data: the data interval's partition),
    else the run_id param; empty: derived from the DAG run."""
    own = op.amflow_run_id(context) if hasattr(op, "amflow_run_id") else ""
    return str(own or context["params"].get("run_id") or "")


def _config(op, context) -> str:
    """The operator's config (a teacher's model event may name it), else the form's."""
    if hasattr(op, "resolved_config"):
        return op.resolved_config(context)
    return str(context["params"].get("config") or "configs/local.yaml")


def _airflow_step(op, context) -> AirflowStep:
    from airflow.sdk.exceptions import AirflowFailException

    params = context["params"]
    ti = context["ti"]
    try:
        step = AirflowStep(step=op.step, dag_id=ti.dag_id,
                           airflow_run_id=context["dag_run"].run_id, task_id=ti.task_id,
                           try_number=ti.try_number,
                           config=_config(op, context),
                           overrides=list(op.resolved_overrides(context)),
                           extra_args=list(op.resolved_extra_args(context)),
                           rerun=str(params.get("rerun") or "redo"),
                           run_id=_run_id(op, context),
                           attempt=attempt_from_context(context),
                           keyed=bool(getattr(op, "keyed", False)),
                           emit=lambda line: op.log.info("%s", line))
    except ConfigError as exc:  # a retry reads the same config: fail now, with the reason
        op.log.error("amflow %s: %s (not retried: a retry would read the same config)",
                     op.step, exc)
        raise AirflowFailException(f"amflow {op.step}: {exc}") from exc
    op._amflow_step = step
    return step


def airflow_execute(op, context) -> dict[str, Any]:
    """The body of the amflow Airflow operator.

    `runner.wait: defer` (default): submit the job, follow it for `runner.defer_after_s`,
    then defer to AmflowJobTrigger until it ends; `airflow_complete` then finishes in the
    same try, so Airflow's duration is the step's. `runner.wait: reschedule`: one poke; raises AirflowRescheduleException to come
    back in `runner.reschedule_s` while the job still runs.
    Returns the step summary (the task's XCom) when the job succeeded.
    """
    from airflow.sdk.exceptions import AirflowRescheduleException

    step = _airflow_step(op, context)
    skip = op.skip_reason(step.cfg) if hasattr(op, "skip_reason") else ""
    if skip:  # e.g. align when the corpus's CTM labels the frames (features.labels=ctm)
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(skip)
    op.log.info("amflow run id %s, job %s, mode %s, wait %s", step.run_id, step.job_id,
                step.cfg.runner.mode, step.cfg.runner.wait)
    kept = step.hand_back()  # a keyed step on unchanged inputs: no job at all
    if kept is not None:
        return _finish(op, context, step, kept, pokes=0)
    r = step.cfg.runner
    if r.wait == "defer":
        step.start()
        outcome = step.runner.follow(step.job_id, try_budget_s(r.defer_after_s, r.poll_s))
        if not outcome.done:
            _push_runner_xcom(context, step, "DEFERRED", 1)
            from amflow.orchestration.trigger import AmflowJobTrigger  # airflow: task side only

            op.defer(trigger=AmflowJobTrigger(**step.trigger_kwargs()),
                     method_name="execute_complete",
                     kwargs={"redone": step.redone,
                             "decision": step.decision.reason if step.decision else ""})
        return _finish(op, context, step, outcome, pokes=1)
    outcome = step.poke()
    if not outcome.done:
        _push_runner_xcom(context, step, outcome.status, outcome.pokes)
        when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(
            seconds=step.cfg.runner.reschedule_s)
        op.log.info("[amflow-runner] job %s still %s after poke %d; next poke at %s",
                    outcome.job_id, outcome.status, outcome.pokes, when.isoformat())
        raise AirflowRescheduleException(when)
    return _finish(op, context, step, outcome, pokes=outcome.pokes)


def airflow_complete(op, context, event: dict[str, Any], redone: bool = False,
                     decision: str = "") -> dict[str, Any]:
    """After the trigger saw the job end: its output into the task log, then finish."""
    step = _airflow_step(op, context)
    step.job_id = str(event.get("job_id") or step.job_id)
    step.redone = redone
    step.decision = Decision(redone, decision) if decision else None
    outcome = step.drain()
    if event.get("reason"):
        op.log.info("[amflow-runner] %s", event["reason"])
        outcome.status = str(event.get("status") or outcome.status)
    return _finish(op, context, step, outcome, pokes=outcome.pokes)


def _push_runner_xcom(context, step: AirflowStep, status: str, pokes: int,
                      reused: bool | None = None) -> None:
    value = {"job_id": step.job_id, "mode": step.cfg.runner.mode, "wait": step.cfg.runner.wait,
             "run_id": step.run_id, "pokes": pokes, "status": status, "redone": step.redone}
    if step.decision is not None:
        value["decision"] = step.decision.reason
    if reused is not None:  # known once the job has ended
        value["reused"] = reused
    context["ti"].xcom_push(key="runner", value=value)


def _finish(op, context, step: AirflowStep, outcome: Outcome, pokes: int) -> dict[str, Any]:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    if not outcome.ok:
        _push_runner_xcom(context, step, outcome.status, pokes)
        last = "\n".join(outcome.tail[-15:])
        reason = permanent_error(op.step, outcome.tail) if outcome.status == FAILED else ""
        what = (f"amflow {op.step} job {outcome.job_id} ended {outcome.status}"
                f"{' without an AMFLOW_SUMMARY line' if outcome.status == SUCCEEDED else ''}")
        if reason:  # a retry would fail the same way
            reason = in_airflow_terms(reason)
            op.log.error("%s (not retried: a retry would fail the same way)", reason)
            raise AirflowFailException(f"{what}, not retried: {reason}\nlast output:\n{last}")
        raise AirflowException(f"{what}; last output:\n{last}")
    summary = outcome.summary
    reused = step.reused(summary)
    op.log.info("%s", metrics_line(op.step, summary, reused))
    _push_runner_xcom(context, step, outcome.status, pokes, reused)
    if step.redone:
        later = sorted(context["task"].downstream_task_ids)
        if later:
            op.log.warning("[amflow-runner] step %s was redone: %s still show results of the "
                           "previous %s unless they were cleared with it (Clear -> Downstream)",
                           op.step, ", ".join(later), op.step)
    op.emit_asset_events(context, summary, step.run_id, reused)
    return summary


def airflow_kill(op) -> None:
    step: AirflowStep | None = getattr(op, "_amflow_step", None)
    if step is not None:
        step.kill()




def stop_run_jobs(config: str, overrides: list[str], dag_id: str, airflow_run_id: str,
                  task_ids: list[str], emit: Emit | None = None) -> list[str]:
    """Stop the jobs of an ended DAG run that are still running; returns their ids.

    Once a run has ended every task is in a final state, so no task follows such a job:
    it is an orphan. One is left when a deferred task is marked failed (or success)
    before the triggerer has loaded its trigger: Airflow deletes that trigger unrun, so
    neither the trigger's nor the task's on_kill runs. The DAGs call this at run end.
    """
    cfg = load_config(resolve_config(config), overrides)
    state_dir = Path(cfg.runner.state_dir or default_state_dir())
    runner = StepRunner(make_backend(cfg, state_dir), state_dir, emit=emit)
    stopped = []
    for task_id in task_ids:
        for jid in runner.backend.live_jobs(job_prefix(dag_id, airflow_run_id, task_id)):
            runner.emit(f"[amflow-runner] run {airflow_run_id} of {dag_id} has ended but job "
                        f"{jid} (task {task_id}) still runs: stopping it")
            runner.stop(jid)
            stopped.append(jid)
    return stopped
