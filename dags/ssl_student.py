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
       the end-to-end CTC student (train.model=ctc, its preset train.ctc_preset) on the
       labeled split alone (the CTC baseline) and on labeled + kept pseudo-labels (the CTC
       SSL student), both from this run's features, decoded with T o L o G (tuned on dev)

With features.labels=align, `align` labels the labeled split with the teacher's network
tree (its model card), so the student's classes are the teacher's, taking the teacher
run's alignments when they cover it (align.reuse); it is skipped with features.labels=ctm. Runs on a new teacher (the `teacher` DAG's model asset) or from the trigger form. Each
task runs `amflow <step> --config FILE --run-id <derived from this DAG run>` locally or
as a Ray job (config `runner.mode`) and returns the step's summary as its XCom.

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

from amflow_common import (DEFAULT_ARGS, PARAM_SETS, RUN_END_CALLBACKS, STUDENT_EVAL,
                           STUDENT_FEATURES, STUDENT_MODEL, STUDENT_SEQ_EVAL, STUDENT_SEQ_WER,
                           STUDENT_TARGETS, STUDENT_WER, TEACHER_MODEL, WINDOW_SETS,
                           AmflowStepOperator, window_params,
                           align_task, branch_gates, common_params, local_defaults, sequence_chain)

_cfg = local_defaults()
# `amflow sequence` on the student's model writes sequence/; evaluate / decode it alike.
SEQ_SETS = ["train.model=student", "evaluate.tag=sequence", "decode.tag=sequence"]
# The end-to-end CTC students: size and recipe are the config's (model.ctc, and
# train.ctc_preset over train.*; the SSL student's epochs: train.pseudolabel_epochs); the
# CTC student trains one recipe, labeled, on the labeled transcripts and (train_ctc) the
# pseudolabel task's kept labels.
CTC_BASELINE_SETS = ["train.model=ctc", "train.regime=labeled", "train.tag=ctc-baseline",
                     "decode.tag=ctc-baseline"]
CTC_SETS = ["train.model=ctc", "train.regime=labeled", "train.tag=ctc", "decode.tag=ctc"]


@dag(
    **RUN_END_CALLBACKS,
    dag_id="ssl_student",
    schedule=[TEACHER_MODEL],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    tags=["amflow", "student"],
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS, "param_sets": {**PARAM_SETS, **WINDOW_SETS},
                  "sets": ["train.model=student", "train.regime=ssl"]},
    params={
        **common_params(_cfg),
        "teacher": Param(_cfg.targets.teacher or None, type=["null", "string"],
                         title="Teacher model URI",
                         description="targets.teacher. Empty: the model of the latest "
                                     "`teacher` DAG run (asset amflow_teacher_model)."),
        **window_params(),
        "sequence": Param(True, type="boolean", title="Sequence-train the student",
                          description="sMBR on the labeled data from the student's model "
                                      "(sequence/), then its WER."),
        "pseudolabels": Param(False, type="boolean", title="Pseudo-label the unlabeled audio",
                              description="The teacher decodes the unlabeled selection; a "
                                          "confidence threshold chosen on dev keeps the "
                                          "confident words (pseudolabel/labels/*.parquet: "
                                          "the end-to-end students' transcripts)."),
        "ctc": Param(False, type="boolean", title="Train the end-to-end CTC students",
                     description="The CTC baseline (labeled transcripts alone) and, with "
                                 "pseudolabels on, the CTC SSL student (labeled + kept "
                                 "pseudo-labels), each decoded with T o L o G."),
    },
)
def ssl_student():
    select = AmflowStepOperator(task_id="select", step="select",
                                doc_md="Sample `hours` of labeled + unlabeled audio, shard by speaker.")
    align = align_task(inlets=[TEACHER_MODEL], teacher_asset=TEACHER_MODEL)
    features = AmflowStepOperator(task_id="features", step="features", outlets=[STUDENT_FEATURES],
                                  trigger_rule="none_failed",  # align may be skipped
                                  doc_md="Log-mel fbank, causal CMN, global CMVN, LFR.")
    targets = AmflowStepOperator(task_id="targets", step="targets", outlets=[STUDENT_TARGETS],
                                 inlets=[TEACHER_MODEL], teacher_asset=TEACHER_MODEL,
                                 doc_md="Teacher inference, top-k soft targets.")
    repartition = AmflowStepOperator(task_id="repartition", step="repartition",
                                     doc_md="Equal training partitions (a multiple of workers).")
    train = AmflowStepOperator(task_id="train", step="train", outlets=[STUDENT_MODEL],
                               model_output=True,
                               doc_md="Student LSTM, scheduled learning over soft targets.")
    evaluate = AmflowStepOperator(task_id="evaluate", step="evaluate", model_from="train",
                                  outlets=[STUDENT_EVAL], results=True,
                                  doc_md="Frame accuracy per condition DP1..DP5.")
    lm = AmflowStepOperator(task_id="lm", step="lm",
                            doc_md="Word 3-gram LM (Kneser-Ney) for decoding, ARPA.")
    decode = AmflowStepOperator(task_id="decode", step="decode", model_from="train",
                                outlets=[STUDENT_WER], results=True,
                                doc_md="WER per condition DP1..DP5 (H o L o G, tuned on dev).")
    sequence, _, decode_sequence = sequence_chain("", "Student", SEQ_SETS, "sequence",
                                                  STUDENT_SEQ_EVAL, STUDENT_SEQ_WER)
    select >> align >> features >> targets >> repartition >> train >> evaluate >> decode
    train >> sequence
    pseudolabel = AmflowStepOperator(task_id="pseudolabel", step="pseudolabel",
                                     inlets=[TEACHER_MODEL], teacher_asset=TEACHER_MODEL,
                                     enabled_by="pseudolabels",
                                     doc_md="The teacher's words for the unlabeled selection, "
                                            "each with a confidence; those over a threshold "
                                            "chosen on dev are kept (WER kept vs dropped).")
    select >> lm >> [decode, decode_sequence, pseudolabel]
    lm >> sequence  # sequence chooses its epoch by dev WER: the LM's graph
    ctc_students(repartition, pseudolabel, lm)
    branch_gates(select.dag)


def ctc_students(repartition, pseudolabel, lm) -> None:
    """train_ctc_baseline -> decode_ctc_baseline, train_ctc -> decode_ctc (see the doc)."""
    train_base = AmflowStepOperator(task_id="train_ctc_baseline", step="train",
                                    sets=CTC_BASELINE_SETS, model_output=True, enabled_by="ctc",
                                    doc_md="CTC baseline: the end-to-end student on the "
                                           "labeled transcripts alone.")
    decode_base = AmflowStepOperator(task_id="decode_ctc_baseline", step="decode",
                                     sets=CTC_BASELINE_SETS, model_from="train_ctc_baseline",
                                     enabled_by="ctc", results=True,
                                     doc_md="CTC baseline WER per condition (T o L o G, "
                                            "LM weight and blank penalty tuned on dev).")
    # The CTC SSL student is the run's longest step (labeled + pseudo-labelled audio, one
    # core): it takes the first core free after the teacher's baseline, ahead of the
    # shorter trainings (hybrid student, CTC baseline), so that it is not the run's tail.
    # 20 under Airflow's downstream rule lifts its upstream steps too, still below the
    # teacher's baseline (tests/test_dags.py checks both orders).
    train = AmflowStepOperator(task_id="train_ctc", step="train", sets=CTC_SETS,
                               model_output=True, enabled_by=("ctc", "pseudolabels"),
                               priority_weight=20,
                               pseudolabels_from="pseudolabel",
                               doc_md="CTC SSL student: labeled + the teacher's kept "
                                      "pseudo-labels (train.pseudolabels).")
    decode = AmflowStepOperator(task_id="decode_ctc", step="decode", sets=CTC_SETS,
                                model_from="train_ctc", enabled_by=("ctc", "pseudolabels"),
                                results=True,
                                doc_md="CTC SSL student WER per condition (T o L o G).")
    repartition >> train_base >> decode_base
    [repartition, pseudolabel] >> train >> decode
    lm >> [decode_base, decode]


ssl_student()
