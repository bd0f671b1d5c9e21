"""A real `airflow standalone` (free port, temp AIRFLOW_HOME), driven over /api/v2.

Trigger ssl_student with conf, wait for success, read a task's log and XCom; a step that
runs several times longer than the execution-API token lifetime (set to 20 s here)
finishes through short tries; clearing one task re-runs that step alone, same run id;
marking a running task failed stops its job.
"""
from __future__ import annotations

import json
import time

import pytest

from tests.airflow_env import TOKEN_LIFETIME_S, Standalone, calls, fake_config, shared_standalone

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    return shared_standalone(tmp_path_factory.mktemp("standalone"))


def _trigger(airflow: Standalone, conf: dict) -> str:
    run = airflow.request("POST", "/api/v2/dags/ssl_student/dagRuns",
                          {"logical_date": None, "conf": conf})
    return run["dag_run_id"]


def _xcom(airflow: Standalone, run_id: str, task_id: str, key: str = "return_value"):
    from tests.airflow_env import _q

    entry = airflow.get(f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}/taskInstances/"
                        f"{task_id}/xcomEntries/{key}")
    value = entry["value"]
    return json.loads(value) if isinstance(value, str) else value


def _log(airflow: Standalone, run_id: str, task_id: str, try_number: int) -> str:
    from tests.airflow_env import _q

    data = airflow.get(f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}/taskInstances/"
                       f"{task_id}/logs/{try_number}?full_content=true")
    content = data.get("content", data)
    if isinstance(content, list):
        return "\n".join(c.get("event", "") if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def test_trigger_log_xcom_long_step_and_clear_one_task(airflow, tmp_path):
    work = tmp_path / "work"
    long_s = 3.5 * TOKEN_LIFETIME_S
    cfg = fake_config(work, plan={"train": {"seconds": long_s, "lines": 35}}, poll_s=1,
                      max_wait_per_try_s=600, reschedule_s=12)
    t0 = time.time()
    run_id = _trigger(airflow, {"config": str(cfg), "hours": 0.25, "workers": 2,
                                "teacher": "/models/teacher.pt"})
    assert airflow.wait_run("ssl_student", run_id, timeout=300) == "success"
    elapsed = time.time() - t0
    tis = airflow.task_instances("ssl_student", run_id)
    assert {k: v["state"] for k, v in tis.items()} == {t: "success" for t in (
        "select", "features", "targets", "repartition", "train", "evaluate")}

    # XCom: the step's summary; the amflow run id is derived from the Airflow run.
    feats = _xcom(airflow, run_id, "features")
    assert feats["step"] == "features" and feats["metrics"]["hours"] == 0.25
    amflow_run = feats["run_id"]
    assert amflow_run.startswith("ssl_student__")
    assert _xcom(airflow, run_id, "train")["metrics"]["workers"] == 2
    assert _xcom(airflow, run_id, "targets")["metrics"]["teacher"] == "/models/teacher.pt"

    # The log carries the step's progress lines and a final metrics line.
    log = _log(airflow, run_id, "features", 1)
    assert "[features] 3/3 shards (100%)" in log
    assert "[amflow features] done in" in log

    # The long step outlived the token lifetime several times over, in short tries
    # (each at most half the token lifetime), one job throughout.
    train = _xcom(airflow, run_id, "train")
    assert train["wall_s"] >= 3 * TOKEN_LIFETIME_S
    runner = _xcom(airflow, run_id, "train", key="runner")
    assert runner["pokes"] >= 3, runner
    assert tis["train"]["try_number"] == 1
    assert [c["step"] for c in calls(work / "store", amflow_run)].count("train") == 1
    print(f"ssl_student with a {long_s:.0f} s train step: {elapsed:.0f} s, "
          f"{runner['pokes']} pokes")

    # Clear one task of the finished run: that step alone runs again, same run id, redone.
    from tests.airflow_env import _q

    airflow.request("POST", "/api/v2/dags/ssl_student/clearTaskInstances",
                    {"dag_run_id": run_id, "task_ids": ["repartition"], "dry_run": False,
                     "only_failed": False, "include_downstream": False,
                     "reset_dag_runs": True})
    assert airflow.wait_run("ssl_student", run_id, timeout=180) == "success"
    # The run is "success" again only once the cleared task finished.
    airflow.wait(lambda: airflow.task_instances("ssl_student", run_id)["repartition"]
                 ["try_number"] == 2, 60, "repartition try 2")
    steps = [c["step"] for c in calls(work / "store", amflow_run)]
    assert steps.count("repartition") == 2 and steps.count("train") == 1
    assert steps.count("select") == 1 and steps.count("evaluate") == 1
    last = [c for c in calls(work / "store", amflow_run) if c["step"] == "repartition"][-1]
    assert last["force"] is True and amflow_run in last["argv"]
    assert _xcom(airflow, run_id, "repartition")["metrics"]["forced"] is True
    assert "[amflow repartition] done in" in _log(airflow, run_id, "repartition", 2)
    airflow.get(f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}")


def test_marking_a_running_task_failed_stops_its_job(airflow, tmp_path):
    from tests.airflow_env import _q

    work = tmp_path / "work"
    cfg = fake_config(work, plan={"select": {"seconds": 300, "lines": 300}}, poll_s=1,
                      max_wait_per_try_s=600)
    run_id = _trigger(airflow, {"config": str(cfg), "teacher": "/models/teacher.pt"})

    def select_running():
        ti = airflow.task_instances("ssl_student", run_id).get("select", {})
        runs = [p for p in (work / "store" / "runs").glob("*/_calls.jsonl")] \
            if (work / "store" / "runs").exists() else []
        return ti.get("state") == "running" and runs
    airflow.wait(select_running, 120, "select running", every=0.5)
    (calls_file,) = (work / "store" / "runs").glob("*/_calls.jsonl")
    pid = json.loads(calls_file.read_text().splitlines()[0])["pid"]
    airflow.request("PATCH", f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}/taskInstances/"
                             f"select", {"new_state": "failed"})

    def gone():
        try:
            import os

            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    airflow.wait(gone, 60, "the select job to stop", every=0.5)
    jobs = list((work / "jobs").glob("*/rc.json"))
    assert jobs and json.loads(jobs[0].read_text())["stopped"] is True
