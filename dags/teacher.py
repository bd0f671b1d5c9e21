r"""teacher: train the teacher on labeled data and publish it.

select (labeled + dev) -> align -> features -> repartition -> train (teacher) -> evaluate -> decode
                                                 \-> train_baseline -> evaluate_baseline
                                                                     -> decode_baseline
train_baseline -> sequence_baseline -> evaluate_sequence_baseline -> decode_sequence_baseline
train -> sequence_teacher -> evaluate_sequence_teacher -> decode_sequence_teacher (param)
select -> lm (word 3-gram for decoding; runs beside training)

Sequence training (`amflow sequence`: sMBR on the labeled split, from the CE model) is the
petabyte recipe's last stage; the CE rows stay beside the sequence-trained ones.

The supervised baseline is the student architecture trained on the same labeled data
only (param `baseline`): the model the SSL student has to beat, per condition.

The frame labels come from the transcripts (`align`, features.labels=align: the network
tree's leaves), or from the corpus's alignments.ctm with features.labels=ctm (`align` is
then skipped). Hard labels stand in for soft targets. The trained model is published as the
asset `amflow_teacher_model` (its URI in the event's extra), which schedules `ssl_student`.

The tasks, their order and each one's --set are the run `teacher` of the recipe `ssl`
(configs/recipes/ssl.yaml, the recipe `amflow run ssl` runs); this file adds what only
Airflow has, by task id: assets, priority weights, docs, the task whose model a step reads.

Re-running (docs/how-to/airflow.md, "Re-running steps"): a retry after a failure resumes its step (finished
shards kept); a cleared task, or a backfill's, redoes a step that had finished (--force),
whatever the run's `rerun` param says; `rerun` decides only for a new DAG run that names
the amflow run id of an earlier one (`run_id`): redo (default) or resume (keep it). Each
try's log says which applied. A switched-off branch (params `baseline`, `sequence`,
`sequence_teacher`) is skipped by its gate task (`if_<param>`, one pool slot, no job) before
its steps ask the pool for slots.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import dag

from amflow.recipes.definition import load_recipe
from amflow_common import (BASELINE_EVAL, BASELINE_SEQ_EVAL, BASELINE_SEQ_WER, BASELINE_WER,
                           DEFAULT_ARGS, PARAM_SETS, RUN_END_CALLBACKS, TEACHER_EVAL,
                           TEACHER_FEATURES, TEACHER_MODEL, TEACHER_SEQ_EVAL, TEACHER_SEQ_WER,
                           TEACHER_WER, align_decoration, branch_gates, common_params,
                           local_defaults, recipe_params, recipe_tasks, sequence_decorations)

_cfg = local_defaults()
RECIPE, RUN = load_recipe("ssl"), "teacher"

# What only Airflow has, by task id (the steps, their order and sets: the recipe's run).
DECORATIONS = {
    "select": dict(doc_md="Sample `hours` of labeled audio (and dev), by speaker."),
    "align": align_decoration(),
    "features": dict(outlets=[TEACHER_FEATURES],
                     trigger_rule="none_failed",  # align may be skipped
                     doc_md="Features; frame labels from align (or the CTM)."),
    "repartition": dict(doc_md="Equal training partitions."),
    # The teacher first: it is the longest step and the student waits for it. On one
    # machine it holds every core (pool slots), so the baseline runs after it, beside the
    # student's steps.
    "train": dict(outlets=[TEACHER_MODEL], model_output=True, priority_weight=100,
                  doc_md="Teacher BLSTM, cross-entropy on labels."),
    "evaluate": dict(model_from="train", outlets=[TEACHER_EVAL], results=True,
                     doc_md="Teacher frame accuracy per condition."),
    # The baseline next, before any ssl_student step: Airflow's scheduler skips a task
    # its pool has too few slots for and queues smaller ones, so the student's steps
    # (triggered once the teacher is trained) took the slots as they freed and the
    # baseline waited "scheduled" for the student's whole run. With the higher priority
    # it takes the first moment its slots are free.
    "train_baseline": dict(model_output=True, priority_weight=50,
                           doc_md="Supervised baseline: student LSTM on labels only."),
    "evaluate_baseline": dict(model_from="train_baseline", outlets=[BASELINE_EVAL],
                              results=True, doc_md="Baseline frame accuracy per condition."),
    "lm": dict(doc_md="Word 3-gram LM (Kneser-Ney) for decoding, ARPA."),
    "decode": dict(model_from="train", outlets=[TEACHER_WER], results=True,
                   doc_md="Teacher WER per condition (H o L o G, tuned on dev)."),
    "decode_baseline": dict(model_from="train_baseline", outlets=[BASELINE_WER], results=True,
                            doc_md="Baseline WER per condition."),
    **sequence_decorations("_baseline", "Baseline", BASELINE_SEQ_EVAL, BASELINE_SEQ_WER),
    **sequence_decorations("_teacher", "Teacher", TEACHER_SEQ_EVAL, TEACHER_SEQ_WER),
}


@dag(
    **RUN_END_CALLBACKS,
    dag_id="teacher",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["amflow", "teacher"],
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS, "param_sets": PARAM_SETS},
    params={**common_params(_cfg), **recipe_params(RECIPE, RUN)},
)
def teacher():
    tasks = recipe_tasks(RECIPE, RUN, DECORATIONS)
    branch_gates(tasks["select"].dag)


teacher()
