"""Shared wiring for the amflow DAGs: assets, trigger-form params, the step operator.

Parse-time cost is kept to `airflow.sdk`, the standard provider's ShortCircuitOperator
(the branch gates), `core.config` (PyYAML), the step registry (`amflow.steps.registry`:
a task's step must be registered; its resources class sets the task's pool slots) and the
recipe definitions (`amflow.recipes.definition`: the DAGs `teacher` and `ssl_student` are the
recipe `ssl`'s runs, `recipe_tasks`). Everything that
runs a step (subprocess, Ray job client, storage) lives in `amflow.jobs` and `amflow.orchestration` and is
imported only when a task runs.
"""
from __future__ import annotations

import functools
import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import Asset, BaseOperator, Param

if TYPE_CHECKING:  # the config is loaded inside tasks: no import at parse time
    from core.config import Config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The config file the trigger forms and the scheduled runs (daily_data's, which no form
# starts) default to, and that daily_data's timetable comes from: AMFLOW_CONFIG in
# Airflow's environment (e.g. configs/aws.yaml on the cluster's Airflow), read when the
# DAGs are parsed; else the embedded default.
DEFAULT_CONFIG = os.environ.get("AMFLOW_CONFIG") or "configs/local.yaml"
ALGORITHMS = ["sgd", "gtc", "bmuf", "htm", "ma"]

# Asset URIs use a private scheme: what changes per run (the storage URI of a run's
# output) travels in each event's `extra`, next to the step's counts and metrics.
CORPUS = Asset(name="amflow_corpus", uri="x-amflow://corpus", group="amflow")
TEACHER_FEATURES = Asset(name="amflow_teacher_features", uri="x-amflow://teacher/features",
                         group="amflow")
TEACHER_MODEL = Asset(name="amflow_teacher_model", uri="x-amflow://teacher/model", group="amflow")
STUDENT_FEATURES = Asset(name="amflow_student_features", uri="x-amflow://ssl_student/features",
                         group="amflow")
STUDENT_TARGETS = Asset(name="amflow_student_targets", uri="x-amflow://ssl_student/targets",
                        group="amflow")
# One event per data interval of daily_data: its partition (run id, URI), hours in and kept,
# rejects by reason, the teacher that scored it.
DAILY_DATA = Asset(name="amflow_daily_data", uri="x-amflow://daily/data", group="amflow")
STUDENT_MODEL = Asset(name="amflow_student_model", uri="x-amflow://ssl_student/model",
                      group="amflow")
# Evaluation results: each event's extra holds the per-condition results, flat.
TEACHER_EVAL = Asset(name="amflow_teacher_eval", uri="x-amflow://teacher/eval", group="amflow")
BASELINE_EVAL = Asset(name="amflow_baseline_eval", uri="x-amflow://teacher/eval-baseline",
                      group="amflow")
STUDENT_EVAL = Asset(name="amflow_student_eval", uri="x-amflow://ssl_student/eval",
                     group="amflow")
TEACHER_WER = Asset(name="amflow_teacher_wer", uri="x-amflow://teacher/wer", group="amflow")
BASELINE_WER = Asset(name="amflow_baseline_wer", uri="x-amflow://teacher/wer-baseline",
                     group="amflow")
STUDENT_WER = Asset(name="amflow_student_wer", uri="x-amflow://ssl_student/wer", group="amflow")
# The same after sequence training (sMBR / MMI) of each model.
TEACHER_SEQ_EVAL = Asset(name="amflow_teacher_sequence_eval",
                         uri="x-amflow://teacher/eval-sequence", group="amflow")
BASELINE_SEQ_EVAL = Asset(name="amflow_baseline_sequence_eval",
                          uri="x-amflow://teacher/eval-sequence-baseline", group="amflow")
STUDENT_SEQ_EVAL = Asset(name="amflow_student_sequence_eval",
                         uri="x-amflow://ssl_student/eval-sequence", group="amflow")
TEACHER_SEQ_WER = Asset(name="amflow_teacher_sequence_wer", uri="x-amflow://teacher/wer-sequence",
                        group="amflow")
BASELINE_SEQ_WER = Asset(name="amflow_baseline_sequence_wer",
                         uri="x-amflow://teacher/wer-sequence-baseline", group="amflow")
STUDENT_SEQ_WER = Asset(name="amflow_student_sequence_wer",
                        uri="x-amflow://ssl_student/wer-sequence", group="amflow")


def local_defaults():
    """The default config (DEFAULT_CONFIG), for the trigger forms' defaults and
    daily_data's timetable."""
    from core.config import Config, load_config

    path = PROJECT_ROOT / DEFAULT_CONFIG
    return load_config(path) if path.exists() else Config()


@functools.lru_cache(maxsize=None)
def default_pool_slots(step: str, sets: tuple[str, ...]) -> int:
    """A task's pool slots from the embedded default config (parse time: a trigger form's
    overrides cannot change them)."""
    from amflow.orchestration.pools import pool_slots

    path = PROJECT_ROOT / DEFAULT_CONFIG
    return pool_slots(step, path, list(sets)) if path.exists() else 1


HOURS_LIMIT = 10_000_000
WORKERS_LIMIT = 1024
EPOCHS_LIMIT = 100
EMPTY_CHOICE = "(empty: the config file's)"


def override_keys() -> list[tuple[str, bool]]:
    """Every config key an override may set, dotted (`train.lr`), and whether it holds a
    mapping (`runner.env`: any sub-key, `runner.env.X`, may be set)."""
    from core.config import user_keys

    return user_keys()


def overrides_param() -> Param:
    """key=value items, each with a known key: checked when a run is triggered (form or
    REST), before any task runs."""
    from amflow.form_checks import OVERRIDE_FORMAT, register

    # the format's checker (core.config.check_override) names the bad key in the refusal
    register()
    return Param(None, type=["null", "array"],
                 items={"type": "string", "format": OVERRIDE_FORMAT},
                 title="Config overrides",
                 description="More key=value config overrides for every step, e.g. "
                             "train.lr=0.002 (they win over the fields above). Each must be "
                             "key=value with a key of the config schema.")


# What a task does when its step has finished before (amflow.orchestration.rerun has the
# rules; docs/how-to/airflow.md tells them to users).
RERUN_DOC = ("What a task does when its step had already finished in an earlier DAG run of "
             "the same amflow run id (the run_id field): redo: run it again from scratch "
             "(--force); resume: keep it (a second `make demo`). A cleared task or a backfill "
             "always redoes a finished step; a retry after a failure keeps the shards the "
             "failed try finished.")


def rerun_param(default: str) -> Param:
    return Param(default, type="string", enum=["redo", "resume"],
                 title="When the step finished in an earlier DAG run", description=RERUN_DOC)


def common_params(cfg: Config) -> dict[str, Param]:
    """Params every pipeline DAG shows in its trigger form."""
    return {
        "config": Param(DEFAULT_CONFIG, type="string", minLength=1, title="Config file",
                        description="YAML config, relative to the project root or absolute "
                                    "(configs/local.yaml: this machine; configs/aws.yaml: the EC2 "
                                    "Ray cluster on S3)."),
        # exclusive bounds: the form's number box clamps to minimum/maximum (0 or "abc"
        # became 0.01); without them a bad value is refused with a message instead.
        # Empty too: a default copied from local.yaml (1 h) silently capped a user's own
        # config's select.hours when the form was sent with only the config field changed.
        "hours": Param(None, type=["null", "number"], exclusiveMinimum=0,
                       exclusiveMaximum=HOURS_LIMIT, title="Hours of audio",
                       description=f"select.hours: audio to select (more than 0, less than "
                                   f"{HOURS_LIMIT:,}); more than the corpus holds selects it "
                                   f"all; empty: the config's (configs/local.yaml: "
                                   f"{cfg.select.hours:g})."),
        # Empty = the value in the chosen config file (the form cannot know which file
        # will be picked, and a default copied from local.yaml would override aws.yaml).
        "algorithm": Param(None, type=["null", "string"], enum=[None, *ALGORITHMS],
                           values_display={"null": EMPTY_CHOICE},
                           title="Training algorithm",
                           description=f"train.algorithm; empty: the config's "
                                       f"(configs/local.yaml: {cfg.train.algorithm})."),
        # exclusive bounds here too: with minimum/maximum the number box clamps
        # silently (workers 0 -> 1, epochs 1000 -> 100); these are refused, limit named
        "workers": Param(None, type=["null", "integer"], exclusiveMinimum=0,
                         exclusiveMaximum=WORKERS_LIMIT + 1, title="Training workers",
                         description=f"train.workers, 1 to {WORKERS_LIMIT:,} (the repartition "
                                     f"step makes the partition count a multiple of it); "
                                     f"empty: the config's (configs/local.yaml: "
                                     f"{cfg.train.workers})."),
        "epochs": Param(None, type=["null", "integer"], exclusiveMinimum=0,
                        exclusiveMaximum=EPOCHS_LIMIT + 1, title="Epochs",
                        description=f"train.epochs, 1 to {EPOCHS_LIMIT}; empty: the config's "
                                    "(the teacher's from train.teacher_preset when it sets "
                                    "epochs)."),
        "overrides": overrides_param(),
        "rerun": rerun_param("redo"),
        "run_id": Param(None, type=["null", "string"], title="amflow run id",
                        description="Empty: derived from this DAG run (stable across retries "
                                    "and clears). Set it to reuse another run's outputs."),
    }


PARAM_SETS = {"hours": "select.hours", "algorithm": "train.algorithm",
              "workers": "train.workers", "epochs": "train.epochs",
              "teacher": "targets.teacher"}

# ssl_student's training window: daily_data's interval partitions added by repartition.
WINDOW_SETS = {"window_days": "repartition.days", "window_from": "repartition.from_date",
               "window_to": "repartition.to_date"}
DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"


def window_params() -> dict[str, Param]:
    """The trigger form's training window: the last N days, or a date range."""
    return {
        # exclusive bounds: the form's number box clamps to minimum/maximum silently
        "window_days": Param(None, type=["null", "integer"], exclusiveMinimum=0,
                             exclusiveMaximum=3661,
                             title="Train on the last N days of daily data",
                             description="repartition.days, a whole number from 1 to 3,660: "
                                         "also train on the daily_data DAG's partitions of "
                                         "the last N days (ending at window_to, or the "
                                         "newest); empty: none."),
        "window_from": Param(None, type=["null", "string"], pattern=DATE_PATTERN,
                             title="Daily data from (YYYY-MM-DD)",
                             description="repartition.from_date: first day of a date range "
                                         "of daily_data partitions instead of the last N days."),
        "window_to": Param(None, type=["null", "string"], pattern=DATE_PATTERN,
                           title="Daily data to (YYYY-MM-DD, inclusive)",
                           description="repartition.to_date: last day; empty: the newest "
                                       "partition."),
    }


# A failed step is retried (and resumes: finished shards are kept) after this delay,
# doubling each time; AMFLOW_RETRY_DELAY_S (read when the DAGs are parsed) changes it.
DEFAULT_ARGS = {
    "owner": "amflow",
    "retries": 2,
    "retry_delay": timedelta(seconds=float(os.environ.get("AMFLOW_RETRY_DELAY_S", "15"))),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=10),
}



def sequence_decorations(suffix: str, who: str, eval_asset: Asset, wer_asset: Asset
                         ) -> dict[str, dict[str, Any]]:
    """The Airflow side of sequence<suffix> -> evaluate_sequence<suffix> ->
    decode_sequence<suffix> (the recipe's steps): sMBR from a CE model on the labeled data,
    then its frame accuracy and WER, each read from the sequence task's model."""
    seq_id = f"sequence{suffix}"
    return {
        seq_id: dict(model_output=True,
                     doc_md=f"{who}: sMBR on the labeled data from its CE model."),
        f"evaluate_sequence{suffix}": dict(
            model_from=seq_id, outlets=[eval_asset], results=True,
            doc_md=f"Sequence-trained {who.lower()}: frame accuracy per condition."),
        f"decode_sequence{suffix}": dict(
            model_from=seq_id, outlets=[wer_asset], results=True,
            doc_md=f"Sequence-trained {who.lower()}: WER per condition."),
    }


def params_on(names: list[str], params) -> bool:
    """A branch gate's condition: every boolean param it names is on."""
    return all(bool(params.get(name, True)) for name in names)


def unless_align_labels(cfg: Config) -> str:
    """align's skip reason: it labels the frames only with features.labels=align."""
    if cfg.features.labels == "align":
        return ""
    return (f"features.labels={cfg.features.labels}: the corpus's alignments.ctm labels the "
            "frames, nothing to align")


def align_decoration(**kwargs: Any) -> dict[str, Any]:
    """`amflow align` between select and features: the transcripts -> frame labels (the
    network tree's leaves). Skipped with features.labels=ctm; features runs either way."""
    return dict(skip_when=unless_align_labels,
                doc_md="Transcripts -> frame labels: GMM-HMM flat start, realignment, decision "
                       "trees (alignment/). Skipped when features.labels=ctm.", **kwargs)


def recipe_params(recipe, run: str) -> dict[str, Param]:
    """The trigger form's boxes for the switches of a recipe run's optional steps (its
    `params:`), each defaulting to the recipe's value for Airflow."""
    return {p.name: Param(p.airflow, type="boolean", title=p.title, description=p.description)
            for p in recipe.run_params(run)}


def recipe_tasks(recipe, run: str, decorations: dict[str, dict[str, Any]]
                 ) -> dict[str, "AmflowStepOperator"]:
    """The tasks of a recipe run's DAG (amflow.recipes.definition: `dag_tasks`): each step
    with its sets, its `when` params (enabled_by) and its upstream tasks, plus what only
    Airflow has (assets, priority, docs, the task whose model it reads), keyed by task id."""
    from amflow.recipes.definition import RecipeError

    defined = recipe.dag_tasks(run)
    stale = sorted(set(decorations) - {t.task_id for t in defined})
    if stale:
        raise RecipeError(f"the DAG of recipe {recipe.name}'s run {run!r} decorates "
                          f"{stale}, which are no tasks of it ({recipe.source})")
    for task_id, kwargs in decorations.items():  # the recipe's to say, once
        mine = sorted(set(kwargs) & {"task_id", "step", "sets", "enabled_by"})
        if mine:
            raise RecipeError(f"the DAG's task {task_id!r} sets {mine}: the recipe "
                              f"{recipe.source} defines them")
    tasks: dict[str, AmflowStepOperator] = {}
    for t in defined:
        task = AmflowStepOperator(task_id=t.task_id, step=t.step.step, sets=list(t.sets),
                                  enabled_by=t.enabled_by, **decorations.get(t.task_id, {}))
        for up in t.upstream:
            tasks[up] >> task
        tasks[t.task_id] = task
    return tasks


def gate_name(names: tuple[str, ...]) -> str:
    return "if_" + "_and_".join(names)


def branch_gates(dag) -> list[BaseOperator]:
    """One gate per switch of the DAG's `enabled_by` steps: a short-circuit task (one pool
    slot, no job) upstream of the first steps of that switch. A gate whose params are off
    skips every task after it before any of them asks the pool for slots; a step that
    checked its switch itself would first wait for its slots (8 for sequence_teacher, all
    of a 2-core machine) only to skip."""
    switches: dict[tuple[str, ...], list[BaseOperator]] = {}
    for task in dag.tasks:
        if isinstance(task, AmflowStepOperator) and task.enabled_by:
            switches.setdefault(task.enabled_by, []).append(task)
    gates = []
    for names, tasks in sorted(switches.items()):
        gate = ShortCircuitOperator(
            task_id=gate_name(names), python_callable=params_on,
            op_kwargs={"names": list(names)}, pool_slots=1, do_xcom_push=False,
            doc_md=f"Skips the steps after it unless param(s) {', '.join(names)} are on.")
        ids = {t.task_id for t in tasks}
        for task in tasks:  # the first steps of the switch; the others follow them
            if not ids & task.upstream_task_ids:
                gate >> task
        gates.append(gate)
    return gates


def stop_orphaned_jobs(context) -> None:
    """DAG callback at the end of a run (success or failure): stop any job of the run that
    is still running. No task follows one any more: a deferred task marked failed before
    the triggerer loaded its trigger leaves such a job (`amflow.orchestration.operator.stop_run_jobs`)."""
    from amflow.orchestration.operator import stop_run_jobs

    dag, run = context["dag"], context.get("dag_run")
    conf = dict(getattr(run, "conf", None) or {})
    params = {**dict(context.get("params") or {}), **conf}
    overrides = [str(o) for o in (params.get("overrides") or [])]
    stop_run_jobs(str(params.get("config") or DEFAULT_CONFIG), overrides, dag.dag_id,
                  str(context["run_id"]), list(dag.task_ids),
                  emit=lambda line: print(line, flush=True))


# Both DAG-level callbacks: whatever way a run ends, its jobs end with it.
RUN_END_CALLBACKS = {"on_success_callback": stop_orphaned_jobs,
                     "on_failure_callback": stop_orphaned_jobs}


def _triggering_events(context, asset: Asset | None = None) -> list:
    """The asset events that started this DAG run (every task of it sees them), oldest
    first: those of `asset` only when one is named."""
    try:
        by_asset = context["triggering_asset_events"]
        assets = [asset] if asset is not None else list(by_asset)
        events = [e for a in assets for e in by_asset[a]]
    except (KeyError, TypeError):
        return []
    return sorted(events, key=lambda e: str(getattr(e, "timestamp", "") or ""))


class AmflowStepOperator(BaseOperator):
    """Run `amflow <step>` where `runner.mode` says; return its summary (XCom).

    The task submits its job and defers to a trigger that waits for it (`runner.wait:
    defer`), or follows it in short tries that reschedule (`runner.wait: reschedule`).
    Killing the task (or its timeout) stops the job. `results=True` (evaluate, decode)
    puts the step's per-condition results, flat, in its asset events.
    """

    ui_color = "#dbeafe"

    def __init__(self, *, step: str, sets: list[str] | None = None,
                 param_sets: dict[str, str] | None = None, model_from: str | None = None,
                 teacher_asset: Asset | None = None, model_output: bool = False,
                 enabled_by: str | tuple[str, ...] | None = None, results: bool = False,
                 skip_when: Callable[[Any], str] | None = None,
                 pseudolabels_from: str | None = None, **kwargs: Any) -> None:
        from amflow.steps.registry import step as registered

        registered(step)  # an unknown step fails the DAG's parse, naming the known ones
        if "pool_slots" not in kwargs:  # the cores its step uses (amflow.orchestration.pools.pool_slots)
            kwargs["pool_slots"] = default_pool_slots(step, tuple(sets or ()))
        super().__init__(**kwargs)
        self.step = step
        self.sets = list(sets or [])
        self.param_sets = dict(param_sets or {})
        self.model_from = model_from
        # the task whose pseudolabel step dir (its summary's uri) is train.pseudolabels
        self.pseudolabels_from = pseudolabels_from
        self.teacher_asset = teacher_asset
        self.model_output = model_output
        # boolean params that must all be true, else the task skips
        self.enabled_by = (enabled_by,) if isinstance(enabled_by, str) else tuple(enabled_by or ())
        self.results = results  # put the step's per-condition results in its asset events
        # the run's resolved Config -> a reason to skip the step ("" : run it)
        self.skip_when = skip_when

    def skip_reason(self, cfg: Config) -> str:
        return self.skip_when(cfg) if self.skip_when else ""

    # -- what the runner asks of the wiring
    def resolved_overrides(self, context) -> list[str]:
        params = context["params"]
        out = list(self.sets)
        for name, key in self.param_sets.items():
            value = params.get(name)
            if value is not None and value != "":
                out.append(f"{key}={value}")
        if self.teacher_asset is not None and not params.get("teacher"):
            uri = self._latest_teacher(context)
            if uri:
                self.log.info("teacher model from asset %s: %s", self.teacher_asset.name, uri)
                out.append(f"targets.teacher={uri}")
        if self.pseudolabels_from:
            out.append(f"train.pseudolabels={self._pseudolabels_uri(context)}")
        out += [str(o) for o in (params.get("overrides") or [])]
        return out

    def _pseudolabels_uri(self, context) -> str:
        """The pseudolabel step dir of this DAG run (the `pseudolabels_from` task's summary):
        the run id is derived at run time, so it cannot be a fixed --set."""
        summary = context["ti"].xcom_pull(task_ids=self.pseudolabels_from)
        uri = summary.get("uri") if isinstance(summary, dict) else None
        if not uri:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(
                f"task {self.pseudolabels_from!r} left no pseudolabel step dir (its summary's "
                f"uri) for train.pseudolabels: clear it to run `amflow pseudolabel` again")
        return str(uri)

    def resolved_extra_args(self, context) -> list[str]:
        if not self.model_from:
            return []
        from amflow.orchestration.operator import model_uri

        summary = context["ti"].xcom_pull(task_ids=self.model_from)
        uri = model_uri(summary) if isinstance(summary, dict) else ""
        return ["--model", uri] if uri else []

    def resolved_config(self, context) -> str:
        """The config file: the form's; in a run a teacher's model event started (nobody
        sent a form), the one that teacher ran with, so that a teacher trained on a user's
        own YAML is followed by a student on that YAML, not on the form's default."""
        for event in reversed(_triggering_events(context)):
            config = (event.extra or {}).get("config")
            if config:
                return str(config)
        return str(context["params"].get("config") or DEFAULT_CONFIG)

    def _latest_teacher(self, context) -> str:
        asset = self.teacher_asset
        if asset is None:
            return ""
        events = _triggering_events(context, asset)
        if not events:
            try:
                events = list(context["inlet_events"][asset])
            except (KeyError, TypeError, IndexError):
                events = []
        for event in reversed(events):
            uri = (event.extra or {}).get("uri")
            if uri:
                return str(uri)
        return ""

    def emit_asset_events(self, context, summary: dict, run_id: str,
                          reused: bool = False) -> None:
        if not self.outlets:
            return
        from amflow.jobs.base import resolve_config
        from amflow.orchestration.operator import flat_results, model_uri

        uri = model_uri(summary) if self.model_output else summary.get("uri", "")
        metrics = summary.get("metrics") or {}
        step = getattr(self, "_amflow_step", None)
        extra = {"uri": uri, "run_id": run_id, "step": self.step,
                 # the file the step ran with: a run this event starts reads it too
                 "config": str(resolve_config(step.config)) if step else "",
                 "airflow_run_id": context["dag_run"].run_id,
                 "counts": summary.get("counts", {}), "bytes": summary.get("bytes", 0),
                 "wall_s": summary.get("wall_s"),
                 # the step kept an earlier result: wall_s is that execution's, not this run's
                 "reused": bool(reused),
                 "metrics": {k: v for k, v in metrics.items()
                             if isinstance(v, (int, float, str, bool))}}
        if self.results:  # per-condition results as top-level keys: readable in the UI
            extra.update(flat_results(metrics, self.step))
        for asset in self.outlets:
            context["outlet_events"][asset].extra.update(extra)

    def execute(self, context):
        off = [p for p in self.enabled_by if not context["params"].get(p, True)]
        if off:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"param {off[0]!r} is off")
        from amflow.orchestration.operator import airflow_execute

        return airflow_execute(self, context)

    def execute_complete(self, context, event: dict, redone: bool = False, decision: str = ""):
        """Back from the trigger (runner.wait: defer): the job has ended."""
        from amflow.orchestration.operator import airflow_complete

        return airflow_complete(self, context, event, redone=redone, decision=decision)

    def on_kill(self) -> None:
        from amflow.orchestration.operator import airflow_kill

        airflow_kill(self)


class IntervalStepOperator(AmflowStepOperator):
    """A step of one data interval (daily_data): its run id is the interval's partition
    (`<daily.dataset>-YYYY-MM-DD`), select reads that interval, and the step is keyed by
    its inputs, so a backfill hands back what is unchanged and redoes what changed
    (amflow.orchestration.rerun: keyed)."""

    keyed = True

    def _interval(self, context) -> tuple[str, list[str]]:
        from amflow.orchestration.intervals import interval_of, interval_overrides

        params = context["params"]
        return interval_overrides(str(params.get("config") or DEFAULT_CONFIG),
                                  [str(o) for o in (params.get("overrides") or [])],
                                  interval_of(context))

    def amflow_run_id(self, context) -> str:
        return self._interval(context)[0]

    def resolved_overrides(self, context) -> list[str]:
        return [*super().resolved_overrides(context), *self._interval(context)[1]]
