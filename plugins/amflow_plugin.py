"""Airflow plugin: an "amflow" tab on every DAG run's page with that run's results, an
"Compare" page in the navigation (runs side by side, deltas with significance),
and a refused trigger explained in plain words (amflow.trigger_refusal) where the user
looks (amflow.refusal_in_view).

A FastAPI app (mounted at /amflow by the API server) renders the run's report from its
files (`amflow.airflow_view`); an external view puts it in the DAG run page. FastAPI
plugin routes are public unless they ask for a user: the route depends on Airflow's own
DAG-run read permission, so an anonymous request gets 401 and the UI's session cookie
(sent with the tab's iframe) is what lets a logged-in user in.
"""
from __future__ import annotations

import os
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from amflow.form_checks import register as register_override_format
from amflow.refusal_in_view import RefusalInView
from amflow.trigger_refusal import PlainTriggerRefusal

# The API server checks trigger params here: the override format must be known to it.
register_override_format()

PROJECT_ROOT = Path(__file__).resolve().parents[1]
app = FastAPI(title="amflow", description="amflow run reports inside Airflow")


def _dag_run_conf(dag_id: str, run_id: str) -> dict:
    """The run's conf; for daily_data also its data interval (`_interval`: its partition
    is the run of that interval, not one derived from the DAG run)."""
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id,
                                                  DagRun.run_id == run_id))
        if run is None:
            raise HTTPException(404, f"no run {run_id!r} of DAG {dag_id!r}")
        conf = dict(run.conf or {})
        if not conf.get("config"):  # started by a teacher's model event: that teacher's file
            configs = [(e.extra or {}).get("config") for e in run.consumed_asset_events]
            conf["config"] = next((c for c in reversed(configs) if c), None)
        if dag_id == "daily_data" and run.data_interval_start and run.data_interval_end:
            conf["_interval"] = (run.data_interval_start, run.data_interval_end)
        return conf


def _storage_root(conf: dict) -> tuple[object, str]:
    """The run's storage (as its tasks saw it: its config file and overrides)."""
    from amflow.jobs.base import step_workdir
    from core.config import load_config
    from core.storage import Storage

    path = Path(str(conf.get("config") or "configs/local.yaml"))
    path = path if path.is_absolute() else PROJECT_ROOT / path
    cfg = load_config(path, [str(o) for o in conf.get("overrides") or []])
    # relative paths (the root, the URIs in the steps' summaries) are where local steps ran
    workdir = cfg.runner.workdir or step_workdir(str(path))
    storage = Storage(cfg.storage, base=workdir)
    root = cfg.storage.root
    if "://" not in root and not os.path.isabs(root):
        root = os.path.join(workdir, root)
    return storage, root


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def run_report(dag_id: str, run_id: str) -> HTMLResponse:
    from amflow.airflow_view import render_run
    from core.config import ConfigError
    from amflow.jobs import amflow_run_id

    conf = _dag_run_conf(dag_id, run_id)
    try:
        storage, root = _storage_root(conf)
    except ConfigError as exc:
        import html

        return HTMLResponse(f"<p>This run's config cannot be read: {html.escape(str(exc))}</p>")
    amflow_run = str(conf.get("run_id") or amflow_run_id(dag_id, run_id))
    if conf.get("_interval"):  # daily_data: the interval's partition
        from amflow.orchestration.intervals import interval_overrides
        from tasks.intervals import Interval

        path = str(conf.get("config") or "configs/local.yaml")
        amflow_run = interval_overrides(path, [str(o) for o in conf.get("overrides") or []],
                                        Interval(*conf["_interval"]))[0]
    return HTMLResponse(render_run(storage, root, amflow_run,
                                   title=f"DAG {dag_id}, run {run_id}."))


def _run_ids(storage, root: str) -> list[str]:
    runs_uri = f"{root.rstrip('/')}/runs"
    if not storage.exists(runs_uri):
        return []
    names = {u[len(runs_uri) + 1:].split("/")[0]
             for u in storage.list(runs_uri, suffix="_SUCCESS.json", recursive=True)}
    return sorted(n for n in names if n)


@app.get("/compare", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def compare_page(runs: list[str] = Query(default=[]), base: str = "",
                 config: str = "configs/local.yaml") -> HTMLResponse:
    """Runs side by side (decoding/compare.py), under the storage of `config`; each
    other run is tested against `base` (default: the first run ticked)."""
    from amflow.airflow_view import PICK_RUNS, order_runs, render_compare
    from core.config import ConfigError
    from amflow.services.compared_runs import load_run
    from decoding.compare import compare

    try:
        storage, root = _storage_root({"config": config})
    except ConfigError as exc:
        return HTMLResponse(render_compare(None, [], runs, config, f"config: {exc}"))
    available = _run_ids(storage, root)
    if not runs:
        return HTMLResponse(render_compare(None, available, runs, config, PICK_RUNS))
    runs = order_runs(runs, base if base in available else "")
    try:
        cmp = compare([load_run(storage, root, r) for r in runs])
    except FileNotFoundError as exc:
        return HTMLResponse(render_compare(None, available, runs, config, str(exc)))
    return HTMLResponse(render_compare(cmp, available, runs, config))


class AmflowPlugin(AirflowPlugin):
    name = "amflow"
    fastapi_apps = [{"app": app, "url_prefix": "/amflow", "name": "amflow run reports"}]
    external_views = [{"name": "amflow", "href": "amflow/runs/{DAG_ID}/{RUN_ID}",
                       "destination": "dag_run", "url_route": "amflow"},
                      # the sidebar shows ~8 characters under the icon: "amflow compare"
                      # read "amflow co..."
                      {"name": "Compare", "href": "amflow/compare",
                       "destination": "nav", "url_route": "amflow-compare"}]
    # a refused trigger explained in plain words, every bad param and override line, and
    # that explanation scrolled into view with its first line in Airflow's toast
    fastapi_root_middlewares = [{"middleware": PlainTriggerRefusal, "args": [], "kwargs": {},
                                 "name": "amflow plain trigger refusal"},
                                {"middleware": RefusalInView, "args": [], "kwargs": {},
                                 "name": "amflow trigger refusal in view"}]
