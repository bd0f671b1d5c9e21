"""Running one amflow step as a job, wherever `runner.mode` says.

The command is the same everywhere: `amflow <step> --config FILE --run-id ID [--set k=v]`.
Only where it runs changes:

    base.py      job statuses, RunnerError, the state directory
    naming.py    stable job / run ids, the step command line, the AMFLOW_SUMMARY line
    local.py     `local`: a detached process on this machine, run by supervise.py
    container.py `container`: a local job that runs the step in the amflow image (podman)
    ray_job.py   `ray_job`: a Ray job through the dashboard's job-submission API
    follow.py    StepRunner: submit-or-attach, stream output, poll (Outcome)
    __main__.py  `python -m amflow.jobs run|stop|status`: a step in the foreground

Jobs are named by a stable id (dag, run, task, try), so a caller that dies and comes back
re-attaches to its job instead of starting a second one; `submit` of an id that exists is
a no-op. Every backend has the same methods: exists, submit, status, logs, final_logs,
stop, submitted_at, live_jobs. Adding one is a class and a line in BACKENDS.
"""
from __future__ import annotations

from pathlib import Path

from core.config import Config
from amflow.jobs.base import (FAILED, PENDING, RUNNING, STOPPED, SUCCEEDED, TERMINAL, Emit,
                              RunnerError, default_state_dir, step_workdir)
from amflow.jobs.container import AWS_ENV, ContainerBackend, default_image, host_paths, is_remote
from amflow.jobs.follow import FIRST_POLL_S, Outcome, StepRunner, next_poll_s
from amflow.jobs.local import LocalBackend
from amflow.jobs.naming import (SUMMARY_PREFIX, amflow_run_id, job_id, job_prefix,
                                parse_summary, step_command)


def _local(cfg: Config, state_dir: Path | None, config: str | None):
    r = cfg.runner
    return LocalBackend(state_dir or Path(r.state_dir or default_state_dir()),
                        cwd=r.workdir or step_workdir(config), env=dict(r.env))


def _ray_job(cfg: Config, state_dir: Path | None, config: str | None):  # noqa: ARG001 - Ray keeps the state
    from amflow.jobs.ray_job import RayJobBackend  # imports ray: only when chosen

    r = cfg.runner
    return RayJobBackend(r.ray_dashboard, cwd=r.workdir or None, env=dict(r.env))


def _container(cfg: Config, state_dir: Path | None, config: str | None):
    r = cfg.runner
    cwd = r.workdir or step_workdir(config)
    # inputs elsewhere (a model URI, a lexicon) must lie under these, the working dir or S3
    uris = [cfg.storage.root, cfg.data.corpus]
    network = r.container_network or ("host" if any(map(is_remote, uris)) else "none")
    return ContainerBackend(state_dir or Path(r.state_dir or default_state_dir()),
                            r.image or default_image(), engine=r.container_engine,
                            network=network, options=r.container_options,
                            data_paths=host_paths(uris, cwd), cwd=cwd, env=dict(r.env),
                            pass_env=AWS_ENV if network == "host" else ())


BACKENDS = {"local": _local, "container": _container, "ray_job": _ray_job}


def make_backend(cfg: Config, state_dir: Path | None = None, config: str | None = None):
    """The job backend of `runner.mode`; `config`: the file the steps get (a local step runs
    in its folder when it lies outside the project: amflow.jobs.base.step_workdir)."""
    return BACKENDS[cfg.runner.mode](cfg, state_dir, config)


__all__ = ["BACKENDS", "FIRST_POLL_S", "FAILED", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "SUMMARY_PREFIX",
           "TERMINAL", "Emit", "LocalBackend", "Outcome", "RunnerError", "StepRunner",
           "amflow_run_id", "default_state_dir", "job_id", "job_prefix", "make_backend",
           "next_poll_s", "parse_summary", "step_command", "step_workdir"]
