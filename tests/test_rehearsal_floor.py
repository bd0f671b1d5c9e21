"""The rehearsal's floor measurement (scripts/rehearsal.py): an empty job timed through the
runner, and the per-step floor = the pool's empty Ray job + the step's own wall on S3."""
from __future__ import annotations

from amflow.jobs import LocalBackend, StepRunner
from scripts.rehearsal import EMPTY, _timed_job, add_floor


def test_an_empty_local_job_is_timed_from_submission_to_its_end(tmp_path):
    runner = StepRunner(LocalBackend(tmp_path), tmp_path, poll_s=1.0)
    row = _timed_job(runner, "floor-local-test", EMPTY, None)
    assert row["status"] == "SUCCEEDED"
    assert 0 < row["driver_start_s"] < row["wall_s"] < 5


def test_floor_is_the_pools_empty_job_plus_the_steps_own_time():
    floor = {"pools": {"pool_x1": {"steps": ["select", "lm"], "empty_job_s": 1.5},
                       "pool_p3": {"steps": ["evaluate"], "empty_job_s": 2.0}},
             "local_empty_job_s": 0.25}
    rows = [{"step": "lm", "local_s": 1.0, "cluster_step_s": 0.5},
            {"step": "evaluate_sequence", "local_s": 4.0, "cluster_step_s": 1.0,
             "local_step_s": 0.75},
            {"step": "train", "local_s": 30.0, "cluster_step_s": 25.0},
            {"step": "select", "local_s": 5.0, "cluster_step_s": None}]
    add_floor(rows, floor)
    assert rows[0] == {"step": "lm", "local_s": 1.0, "cluster_step_s": 0.5,
                       "empty_job_s": 1.5, "floor_s": 2.0, "floor_ratio": 2.0}
    assert rows[1]["floor_s"] == 3.0 and rows[1]["floor_ratio"] == 0.75
    # 4.0 - 0.25 (local runner) + 2.0 (Ray job) + 1.0 - 0.75 (the step on S3, not disk)
    assert rows[1]["same_task_s"] == 6.0 and rows[1]["same_task_ratio"] == 1.5
    assert "floor_s" not in rows[2] and "floor_s" not in rows[3]
    add_floor(rows, {"error": "no cluster", "pools": {}})  # a failed measurement: no floor


def test_job_floor_runs_through_the_runner_of_the_config(tmp_path, local_cfg):
    """The whole measurement, with a local runner standing in for the Ray job API (no
    ray.init jobs: without a cluster each would start a Ray of its own)."""
    import os

    from scripts.rehearsal import job_floor

    cfg = local_cfg("runner.poll_s=1")
    floor = job_floor(cfg, tmp_path, dict(os.environ), init_jobs=0)
    assert floor["local_empty_job_s"] > 0 and floor["client_import_s"] > 0
    for pool in ("pool_x1", "pool_p3"):
        p = floor["pools"][pool]
        assert p["ok"] and 0 < p["driver_start_s"] < p["empty_job_s"]
        assert p["code"].endswith("amflow/cli.py")


def test_a_tasks_time_splits_into_before_job_and_after(tmp_path):
    """From Airflow's DB (naive UTC timestamps) and a local runner job's state dir."""
    import json
    import sqlite3

    from scripts.rehearsal import local_job_span, phases, task_spans

    with sqlite3.connect(tmp_path / "airflow.db") as c:
        c.execute("create table task_instance (dag_id, task_id, start_date, end_date, state)")
        c.execute("insert into task_instance values ('teacher', 'lm', "
                  "'2026-01-01 00:00:10.000000', '2026-01-01 00:00:13.500000', 'success')")
        c.execute("insert into task_instance values ('teacher', 'x', "
                  "'2026-01-01 00:00:10', NULL, 'running')")
    start = 1767225600.0 + 10  # 2026-01-01T00:00:10Z
    job = tmp_path / "amflow_jobs" / "j1"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"submitted_at": start + 0.5}))
    (job / "rc.json").write_text(json.dumps({"finished_at": start + 2.5}))
    spans = task_spans(tmp_path)
    assert spans == {"teacher": {"lm": (start, start + 3.5)}}
    assert phases(spans["teacher"]["lm"], local_job_span(tmp_path, "j1")) == {
        "before_s": 0.5, "job_s": 2.0, "after_s": 1.0}
    assert local_job_span(tmp_path, "missing") is None and phases(None, (0, 1)) == {}


def test_placement_checks_the_driver_of_a_job_that_never_joined_the_cluster(monkeypatch):
    """select, lm and evaluate run no Ray tasks: their jobs have no Ray job id, and the
    node of their driver alone must be in the step's pool."""
    from types import SimpleNamespace as NS

    import ray.job_submission
    import ray.util.state

    from core.config import load_config
    from scripts.rehearsal import ROOT, placement_check

    jobs = [NS(submission_id="amflow-teacher-select-1-try1", job_id=None, status="SUCCEEDED",
               entrypoint="cd /x && amflow select --config c.yaml", driver_node_id="n-x1"),
            NS(submission_id="amflow-teacher-lm-2-try1", job_id=None, status="SUCCEEDED",
               entrypoint="cd /x && amflow lm --config c.yaml", driver_node_id="n-head"),
            NS(submission_id="floor-pool_x1-empty", job_id=None, status="SUCCEEDED",
               entrypoint="python -c pass", driver_node_id="n-head")]
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient",
                        lambda address: NS(list_jobs=lambda: jobs))
    asked: list = []
    monkeypatch.setattr(ray.util.state, "list_tasks", lambda **kw: asked.append(kw) or [])
    monkeypatch.setattr(ray.util.state, "list_actors", lambda **kw: asked.append(kw) or [])
    cluster = NS(dashboard="http://x", pools=lambda: {"n-x1": "pool_x1", "n-head": "head"},
                 name_of=lambda node: node)
    out = placement_check(cluster, load_config(ROOT / "configs" / "aws.yaml"))
    assert [r["step"] for r in out["jobs"]] == ["select", "lm"]
    assert out["jobs"][0]["placed"] == {"driver": {"pool_x1": 1}}
    assert out["violations"] == ["amflow-teacher-lm-2-try1: driver {'entrypoint': 1} on n-head "
                                 "(head), config names ['pool_x1']"]
    assert asked == []  # no Ray job id: no tasks or actors to ask for
