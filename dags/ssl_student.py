"""ssl_student: the semi-supervised student pipeline.

select -> align -> features -> targets -> repartition -> train (student, recipe ssl) -> evaluate
       -> decode;  select -> lm (word 3-gram for decoding) -> decode

Training on a window of daily data (params window_days, or window_from / window_to):
repartition adds the `daily_data` DAG's interval partitions of those days as the unlabeled
data (select then takes only the labeled split); the model card lists the intervals it
learned from with their digests (docs/how-to/daily-data.md).
train -> sequence (sMBR on the labeled split, param) -> evaluate_sequence -> decode_sequence
select -> lm -> pseudolabel (param `pseudolabels`: the teacher's confident words for the
       unlabeled selection, the end-to-end students' transcripts; pseudolabel/labels/)
repartition -> train_ctc_baseline -> decode_ctc_baseline       (param `ctc`)
[repartition, pseudolabel] -> train_ctc -> decode_ctc     (params `ctc` and `pseudolabels`)
       the end-to-end CTC student (train.model=ctc, its recipe train.ctc_recipe) on the
       labeled split alone (the CTC baseline) and on labeled + kept pseudo-labels (the CTC
       SSL student), both from this run's features, decoded with T o L o G (tuned on dev)

With features.labels=align, `align` labels the labeled split with the teacher's network
tree (its model card), so the student's classes are the teacher's, taking the teacher
run's alignments when they cover it (align.reuse); it is skipped with features.labels=ctm. Runs on a new teacher (the `teacher` DAG's model asset) or from the trigger form. Each
task runs `amflow <step> --config FILE --run-id <derived from this DAG run>` locally or
as a Ray job (config `runner.mode`) and returns the step's summary as its XCom.

The tasks, their order and each one's --set are the run `ssl` of the recipe `ssl`
(configs/recipes/ssl.yaml, the recipe `amflow run ssl` runs); this file adds what only
Airflow has, by task id: assets, priority weights, docs, the task whose model a step reads,
the teacher (the asset or the form's `teacher`) and the pseudo-labels (the pseudolabel
task's step dir) that `amflow run` names by its runs' ids.

Re-running (docs/how-to/airflow.md, "Re-running steps"): a retry after a failure resumes its step (finished
shards kept); a cleared task, or a backfill's, redoes a step that had finished (--force),
whatever the run's `rerun` param says; `rerun` decides only for a new DAG run that names
the amflow run id of an earlier one (`run_id`): redo (default) or resume (keep it). Each
try's log says which applied. With param `sequence` off, its gate task (`if_sequence`, one
pool slot, no job) skips the sequence branch before its steps ask the pool for slots.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from amflow.recipes.definition import load_recipe
from amflow_common import (DEFAULT_ARGS, PARAM_SETS, RUN_END_CALLBACKS, STUDENT_EVAL,
                           STUDENT_FEATURES, STUDENT_MODEL, STUDENT_SEQ_EVAL, STUDENT_SEQ_WER,
                           STUDENT_TARGETS, STUDENT_WER, TEACHER_MODEL, WINDOW_SETS,
                           align_decoration, branch_gates, common_params, local_defaults,
                           recipe_params, recipe_tasks, sequence_decorations, window_params)

_cfg = local_defaults()
RECIPE, RUN = load_recipe("ssl"), "ssl"
# The steps that read the teacher: the form's `teacher`, else the teacher DAG's model asset.
READS_TEACHER = dict(inlets=[TEACHER_MODEL], teacher_asset=TEACHER_MODEL)

# What only Airflow has, by task id (the steps, their order and sets: the recipe's run).
# The CTC students' size and recipe are the config's (model.ctc, and train.ctc_recipe over
# train.*; the SSL student's epochs: train.pseudolabel_epochs).
DECORATIONS = {
    "select": dict(doc_md="Sample `hours` of labeled + unlabeled audio, shard by speaker."),
    "align": align_decoration(**READS_TEACHER),
    "features": dict(outlets=[STUDENT_FEATURES],
                     trigger_rule="none_failed",  # align may be skipped
                     doc_md="Log-mel fbank, causal CMN, global CMVN, LFR."),
    "targets": dict(outlets=[STUDENT_TARGETS], **READS_TEACHER,
                    doc_md="Teacher inference, top-k soft targets."),
    "repartition": dict(doc_md="Equal training partitions (a multiple of workers)."),
    "train": dict(outlets=[STUDENT_MODEL], model_output=True,
                  doc_md="Student LSTM, scheduled learning over soft targets."),
    "evaluate": dict(model_from="train", outlets=[STUDENT_EVAL], results=True,
                     doc_md="Frame accuracy per condition DP1..DP5."),
    "lm": dict(doc_md="Word 3-gram LM (Kneser-Ney) for decoding, ARPA."),
    "decode": dict(model_from="train", outlets=[STUDENT_WER], results=True,
                   doc_md="WER per condition DP1..DP5 (H o L o G, tuned on dev)."),
    **sequence_decorations("", "Student", STUDENT_SEQ_EVAL, STUDENT_SEQ_WER),
    "pseudolabel": dict(**READS_TEACHER,
                        doc_md="The teacher's words for the unlabeled selection, each with a "
                               "confidence; those over a threshold chosen on dev are kept "
                               "(WER kept vs dropped)."),
    "train_ctc_baseline": dict(model_output=True,
                               doc_md="CTC baseline: the end-to-end student on the labeled "
                                      "transcripts alone."),
    "decode_ctc_baseline": dict(model_from="train_ctc_baseline", results=True,
                                doc_md="CTC baseline WER per condition (T o L o G, LM weight "
                                       "and blank penalty tuned on dev)."),
    # The CTC SSL student is the run's longest step (labeled + pseudo-labelled audio, one
    # core): it takes the first core free after the teacher's baseline, ahead of the
    # shorter trainings (hybrid student, CTC baseline), so that it is not the run's tail.
    # 20 under Airflow's downstream rule lifts its upstream steps too, still below the
    # teacher's baseline (tests/test_dags.py checks both orders). train.pseudolabels: this
    # DAG run's pseudolabel step dir (the recipe's {run_id:ssl}).
    "train_ctc": dict(model_output=True, priority_weight=20, pseudolabels_from="pseudolabel",
                      doc_md="CTC SSL student: labeled + the teacher's kept pseudo-labels "
                             "(train.pseudolabels)."),
    "decode_ctc": dict(model_from="train_ctc", results=True,
                       doc_md="CTC SSL student WER per condition (T o L o G)."),
}


@dag(
    **RUN_END_CALLBACKS,
    dag_id="ssl_student",
    schedule=[TEACHER_MODEL],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    tags=["amflow", "student"],
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS, "param_sets": {**PARAM_SETS, **WINDOW_SETS}},
    params={
        **common_params(_cfg),
        "teacher": Param(_cfg.targets.teacher or None, type=["null", "string"],
                         title="Teacher model URI",
                         description="targets.teacher. Empty: the model of the latest "
                                     "`teacher` DAG run (asset amflow_teacher_model)."),
        **window_params(),
        **recipe_params(RECIPE, RUN),
    },
)
def ssl_student():
    tasks = recipe_tasks(RECIPE, RUN, DECORATIONS)
    branch_gates(tasks["select"].dag)


ssl_student()
