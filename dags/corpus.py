"""corpus: synthesise the embedded espeak-ng corpus (`amflow corpus`).

Writes data.corpus (audio, metadata, alignments.ctm) and publishes asset amflow_corpus.
A new run keeps a finished corpus (param rerun=resume); clearing the task redoes it.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from amflow_common import (CORPUS, DEFAULT_ARGS, DEFAULT_CONFIG, RUN_END_CALLBACKS,
                           AmflowStepOperator, local_defaults, overrides_param, rerun_param)

_cfg = local_defaults()


@dag(
    **RUN_END_CALLBACKS,
    dag_id="corpus",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["amflow"],
    doc_md=__doc__,
    default_args={**DEFAULT_ARGS,
                  "param_sets": {"hours": "corpus.hours", "speakers": "corpus.speakers",
                                 "seed": "corpus.seed"}},
    params={
        "config": Param(DEFAULT_CONFIG, type="string", minLength=1, title="Config file"),
        # exclusive bounds: with minimum/maximum the form's number box clamps silently
        "hours": Param(_cfg.corpus.hours, type="number", exclusiveMinimum=0, exclusiveMaximum=10_000,
                       title="Hours of speech",
                       description="corpus.hours: more than 0, less than 10,000."),
        "speakers": Param(_cfg.corpus.speakers, type="integer", exclusiveMinimum=3,
                          exclusiveMaximum=100_001, title="Speakers",
                          description="corpus.speakers: 4 to 100,000."),
        "seed": Param(_cfg.corpus.seed, type="integer", exclusiveMinimum=-1, title="Seed",
                      description="corpus.seed: 0 or more."),
        "overrides": overrides_param(),
        # resume: triggering corpus again keeps a finished corpus of the same plan
        # (clearing the task re-synthesises it)
        "rerun": rerun_param("resume"),
        "run_id": Param(None, type=["null", "string"], title="amflow run id"),
    },
)
def corpus():
    AmflowStepOperator(task_id="corpus", step="corpus", outlets=[CORPUS],
                       doc_md="espeak-ng speech, phone alignments, DP1..DP5 rooms.")


corpus()
