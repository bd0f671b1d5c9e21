"""Job and run names: stable across retries, path-safe, unique; the step command line;
the `AMFLOW_SUMMARY <json>` line a step prints last."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from amflow.steps.registry import step as registered

SUMMARY_PREFIX = "AMFLOW_SUMMARY "


def slug(text: str, limit: int) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:limit].rstrip("-.") or "x"


def amflow_run_id(dag_id: str, airflow_run_id: str) -> str:
    """The amflow `--run-id` of an Airflow DAG run: stable across retries and clears.

    Readable (dag id + the Airflow run id, made path-safe) and unique (a short hash of
    both, so two Airflow run ids that slug alike never share outputs).
    """
    digest = hashlib.sha1(f"{dag_id}\0{airflow_run_id}".encode()).hexdigest()[:8]
    return f"{slug(dag_id, 40)}__{slug(airflow_run_id, 60)}__{digest}"


def job_prefix(dag_id: str, airflow_run_id: str, task_id: str) -> str:
    """What the job ids of every try of one task of one DAG run start with."""
    digest = hashlib.sha1(f"{dag_id}\0{airflow_run_id}\0{task_id}".encode()).hexdigest()[:10]
    return f"amflow-{slug(dag_id, 24)}-{slug(task_id, 24)}-{digest}-try"


def job_id(dag_id: str, airflow_run_id: str, task_id: str, try_number: int) -> str:
    """The submission id of one try of one task: a retry gets a new id, a re-poke the same."""
    return f"{job_prefix(dag_id, airflow_run_id, task_id)}{int(try_number)}"


def step_command(command: list[str], step: str, *, config: str | None, run_id: str | None,
                 overrides: list[str] = (), extra_args: list[str] = (),
                 force: bool = False) -> list[str]:
    """`<command> <step> --config ... --run-id ... --set ... [--force] <extra>`: the
    command a job runs; `step` must be a registered step (amflow.steps.registry)."""
    registered(step)
    argv = [*command, step]
    if config:
        argv += ["--config", str(config)]
    if run_id:
        argv += ["--run-id", run_id]
    for item in overrides:
        argv += ["--set", item]
    if force:
        argv.append("--force")
    return argv + list(extra_args)


def parse_summary(text: str) -> dict[str, Any] | None:
    """The JSON of the last `AMFLOW_SUMMARY ` line in a step's output, if any."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(SUMMARY_PREFIX):
            try:
                return json.loads(line[len(SUMMARY_PREFIX):])
            except json.JSONDecodeError:
                return None
    return None
