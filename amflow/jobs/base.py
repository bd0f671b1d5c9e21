"""What every job backend shares: job statuses, the error, the state directory.

A job is one `amflow <step>` command run somewhere (amflow.jobs.local, amflow.jobs.ray_job):
PENDING -> RUNNING -> SUCCEEDED | FAILED | STOPPED.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

PROJECT_ROOT = Path(__file__).resolve().parents[2]

PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED = "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"
TERMINAL = (SUCCEEDED, FAILED, STOPPED)

Emit = Callable[[str], None]


class RunnerError(RuntimeError):
    """A job could not be submitted, followed or stopped."""


def default_state_dir() -> Path:
    if env := os.environ.get("AMFLOW_RUNNER_STATE"):
        return Path(env)
    if home := os.environ.get("AIRFLOW_HOME"):
        return Path(home) / "amflow_jobs"
    return Path.home() / ".cache" / "amflow" / "jobs"


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def resolve_config(path: str) -> Path:
    """A config path as the steps see it: relative paths are relative to the project."""
    p = Path(path)
    return p if p.is_absolute() else PROJECT_ROOT / p


def step_workdir(config: str | None) -> str:
    """Where a step started on this machine runs when runner.workdir is empty: the project
    for the configs inside it (configs/local.yaml's ./data is the checkout's), else the
    config file's folder, so that a user's YAML (storage.root: ./mine) means in Airflow
    what it means to `amflow` run beside it, as docs/how-to/own-corpus.md does."""
    if not config:
        return str(PROJECT_ROOT)
    path = resolve_config(config).resolve()
    return str(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else str(path.parent)
