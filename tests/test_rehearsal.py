"""The cluster rehearsal (issue #22): both DAGs on a multi-node Ray cluster on this
machine, storage on a local S3 with injected faults, Ray jobs, nodes lost mid-step.

Long (~15-20 min on 2 cores): marked `cluster`, outside `make test`; `make rehearsal`
runs the same script. Asserts on the script's JSON report, one check at a time.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.slow,
              pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    work = tmp_path_factory.mktemp("rehearsal")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "rehearsal.py"),
                          "--work", str(work / "w"), "--report", str(work / "report.json")],
                         cwd=ROOT, timeout=2300, capture_output=True, text=True)
    print(out.stdout[-6000:])
    path = work / "report.json"
    assert path.exists(), out.stdout[-4000:] + out.stderr[-4000:]
    r = json.loads(path.read_text())
    assert "error" not in r, r["error"]
    return r


def test_every_step_ran_on_its_pool(report):
    c = report["checks"]["placement"]
    assert c["violations"] == [] and c["ok"]
    steps = {j["step"] for j in c["jobs"]}
    assert {"select", "features", "targets", "repartition", "train", "evaluate", "lm",
            "decode"} <= steps


def test_every_task_ran_as_a_ray_job_with_its_log_in_the_task_log(report):
    c = report["checks"]["ray_jobs_and_logs"]
    assert c["not_ok"] == [] and len(c["tasks"]) >= 15


def test_outputs_equal_the_local_pipelines(report):
    c = report["checks"]["outputs_equal_local"]
    assert c["different"] == []
    assert all(f["compared"] > 0 for f in c["files"].values()), c["files"]
    for name, m in c["metrics"].items():
        assert m["equal"], (name, m)


def test_a_node_lost_mid_features_loses_no_utterance(report):
    c = report["checks"]["features_node_loss"]
    assert c["node"].startswith("c4") and c["shards_left_before"] >= 2
    assert c["accounting"]["ok"], c["accounting"]
    assert c["ok"]


def test_a_node_lost_mid_train_resumes_from_the_last_checkpoint(report):
    c = report["checks"]["train_node_loss"]
    assert c["status"] == "SUCCEEDED" and c["killed_node"].startswith("p3")
    assert c["resumed_from_step"] is not None and c["resumed_from_step"] > 0
    assert c["ok"], c


def test_a_retried_task_reattaches_to_its_running_job(report):
    c = report["checks"]["reattach"]
    assert len(c["jobs"]) == 1 and c["try2_adopted_try1_job"] and len(c["models"]) == 1


def test_s3_faults_are_retried_and_change_nothing(report):
    c = report["checks"]["s3_faults"]
    assert sum(c["injected"].values()) > 0 and c["ok"]


def test_overhead_is_reported_with_the_floor_of_each_short_step(report):
    """Each step's time both ways, and for the short steps (select, lm, evaluate) the floor:
    an empty Ray job on the step's pool (measured in the same run) + the step's own time."""
    floor = report["floor"]
    assert "error" not in floor, floor.get("error")
    assert all(p["ok"] and p["empty_job_s"] > 0 for p in floor["pools"].values()), floor
    # the jobs ran this checkout's code (a worktree too, through PYTHONPATH)
    assert all(p["code"] == str(ROOT / "amflow" / "cli.py") for p in floor["pools"].values())
    assert floor["local_empty_job_s"] > 0
    rows = report["overhead"]
    assert {r["step"] for r in rows} >= {"select", "features", "train", "evaluate", "lm"}
    for r in rows:
        assert r["local_s"] > 0 and r["cluster_s"] > 0 and r["ratio"] > 0
        if r["step"] in ("select", "lm", "evaluate"):
            assert r["floor_s"] == round(r["empty_job_s"] + r["cluster_step_s"], 2), r
            assert r["same_task_s"] >= r["floor_s"] - r["cluster_step_s"], r
