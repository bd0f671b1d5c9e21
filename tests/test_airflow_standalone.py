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

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.waits]


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
    return airflow.task_log("ssl_student", run_id, task_id, try_number)


def test_trigger_log_xcom_long_step_and_clear_one_task(airflow, tmp_path):
    work = tmp_path / "work"
    long_s = 3.5 * TOKEN_LIFETIME_S
    # runner.wait reschedule: the short-tries mode (an Airflow without a triggerer)
    cfg = fake_config(work, plan={"train": {"seconds": long_s, "lines": 35}}, poll_s=1,
                      max_wait_per_try_s=600, reschedule_s=12, wait="reschedule")
    t0 = time.time()
    run_id = _trigger(airflow, {"config": str(cfg), "hours": 0.25, "workers": 2,
                                "teacher": "/models/teacher.pt"})
    assert airflow.wait_run("ssl_student", run_id, timeout=300) == "success"
    elapsed = time.time() - t0
    tis = airflow.task_instances("ssl_student", run_id)
    # align labels frames only with features.labels=align (this config: ctm): skipped,
    # and features runs anyway; pseudolabel runs only when the trigger asks (param pseudolabels),
    # the CTC students only when it asks for them (param ctc)
    assert {k: v["state"] for k, v in tis.items()} == {
        "align": "skipped", "pseudolabel": "skipped", **{
            t: "skipped" for t in ("train_ctc_baseline", "decode_ctc_baseline", "train_ctc",
                                   "decode_ctc")},
        **{t: "success" for t in ("if_ctc", "if_ctc_and_pseudolabels")}, **{
            t: "success" for t in ("select", "features", "targets", "repartition", "train",
                                   "evaluate", "lm", "decode", "sequence", "evaluate_sequence",
                                   "decode_sequence", "if_sequence", "if_pseudolabels")}}

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

    airflow.settle("ssl_student", run_id)
    responses = []

    def clear():
        responses.append(airflow.request(
            "POST", "/api/v2/dags/ssl_student/clearTaskInstances",
            {"dag_run_id": run_id, "task_ids": ["repartition"], "dry_run": False,
             "only_failed": False, "include_downstream": False, "reset_dag_runs": True}))

    airflow.clear_taken(clear, "ssl_student", run_id, "repartition")
    cleared = responses[0]
    assert [t["task_id"] for t in cleared["task_instances"]] == ["repartition"], cleared

    # Wait on the task's second try first: a run-state poll right after the clear can
    # still read the old "success". On a timeout, say where the run and the task stood.
    def repartition_redone():
        ti = airflow.task_instances("ssl_student", run_id)["repartition"]
        return ti["try_number"] == 2 and ti["state"] == "success"

    try:
        airflow.wait(repartition_redone, 180, "repartition try 2")
    except AssertionError as e:
        tis = airflow.task_instances("ssl_student", run_id)
        raise AssertionError(f"run {airflow.run_state('ssl_student', run_id)}, repartition "
                             f"{ {k: tis['repartition'][k] for k in ('state', 'try_number')} }"
                             f"\n{e}") from None
    assert airflow.wait_run("ssl_student", run_id, timeout=180) == "success"
    steps = [c["step"] for c in calls(work / "store", amflow_run)]
    assert steps.count("repartition") == 2 and steps.count("train") == 1
    assert steps.count("select") == 1 and steps.count("evaluate") == 2  # CE and sequence
    last = [c for c in calls(work / "store", amflow_run) if c["step"] == "repartition"][-1]
    assert last["force"] is True and amflow_run in last["argv"]
    assert _xcom(airflow, run_id, "repartition")["metrics"]["forced"] is True
    assert "[amflow repartition] done in" in _log(airflow, run_id, "repartition", 2)
    airflow.get(f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}")


@pytest.mark.parametrize("wait, waiting_state", [("reschedule", "running"),
                                                  ("defer", "deferred")])
def test_marking_a_running_task_failed_stops_its_job(airflow, tmp_path, wait, waiting_state):
    from tests.airflow_env import _q

    work = tmp_path / "work"
    cfg = fake_config(work, plan={"select": {"seconds": 300, "lines": 300}}, poll_s=1,
                      max_wait_per_try_s=600, wait=wait)
    run_id = _trigger(airflow, {"config": str(cfg), "teacher": "/models/teacher.pt"})

    def select_running():
        ti = airflow.task_instances("ssl_student", run_id).get("select", {})
        runs = [p for p in (work / "store" / "runs").glob("*/_calls.jsonl")] \
            if (work / "store" / "runs").exists() else []
        return ti.get("state") == waiting_state and runs
    airflow.wait(select_running, 120, f"select {waiting_state}", every=0.5)
    (calls_file,) = (work / "store" / "runs").glob("*/_calls.jsonl")
    pid = json.loads(calls_file.read_text().splitlines()[0])["pid"]
    # Deferred: marked failed at once, most likely before the triggerer has loaded the
    # trigger, which Airflow then deletes unrun (no on_kill): the run's end stops the job
    # (the DAGs' stop_orphaned_jobs callback). Later, the trigger's on_kill would.
    airflow.request("PATCH", f"/api/v2/dags/ssl_student/dagRuns/{_q(run_id)}/taskInstances/"
                             f"select", {"new_state": "failed"})

    def gone():
        try:
            import os

            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
    # the trigger's on_kill, or the run-end callback: seconds on a quiet machine, longer
    # on a loaded one
    airflow.wait(gone, 60 if wait == "reschedule" else 150, "the select job to stop", every=0.5)
    jobs = list((work / "jobs").glob("*/rc.json"))
    assert jobs and json.loads(jobs[0].read_text())["stopped"] is True


def _events(airflow: Standalone, run_id: str) -> dict[str, dict]:
    from tests.airflow_env import _q

    data = airflow.get(f"/api/v2/assets/events?source_dag_id=ssl_student"
                       f"&source_run_id={_q(run_id)}")
    return {e["uri"]: e["extra"] for e in data["asset_events"]}


def test_deferred_step_duration_is_its_wall_time_and_results_reach_the_ui(airflow, tmp_path):
    """runner.wait defer (default): one try from submit to end, holding no token."""
    from tests.airflow_env import _q

    work = tmp_path / "work"
    long_s = 2.5 * TOKEN_LIFETIME_S
    cfg = fake_config(work, plan={"train": {"seconds": long_s, "lines": 10}}, poll_s=1)
    run_id = _trigger(airflow, {"config": str(cfg), "teacher": "/models/teacher.pt"})
    assert airflow.wait_run("ssl_student", run_id, timeout=300) == "success"
    train = airflow.task_instances("ssl_student", run_id)["train"]
    wall = _xcom(airflow, run_id, "train")["wall_s"]
    assert train["try_number"] == 1 and wall >= long_s
    # Airflow's duration is the step's (a rescheduled task shows only its last poke)
    assert wall <= train["duration"] <= wall + 8, (train["duration"], wall)
    assert _xcom(airflow, run_id, "train", key="runner")["wait"] == "defer"
    log = _log(airflow, run_id, "train", 1)
    assert "[train] 10/10 shards (100%)" in log and "[amflow train] done in" in log
    assert "DEFERRED" in log  # it waited in the triggerer, not in a worker

    # evaluate's asset event: the per-condition results as flat keys
    extra = _events(airflow, run_id)["x-amflow://ssl_student/eval"]
    assert extra["frame_accuracy_DP1"] == 0.75 and extra["per_DP2"] == 0.3
    assert extra["step"] == "evaluate" and extra["uri"].endswith("/evaluate")

    # the amflow tab's page: refused without a login, the run's results with one
    page = f"/amflow/runs/ssl_student/{_q(run_id)}"
    import urllib.error
    import urllib.request

    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(airflow.base + page, headers=headers),
                                   timeout=30)
        assert refused.value.code in (401, 403)
    html = airflow.get(page, raw=True)
    assert "<th>DP1</th><td class=n>75.0</td>" in html  # SSL student's FA %, DP1
    assert "data:image/png;base64," in html and "train/curves.png" in html
    assert "<td>train</td>" in html and "(stale)" not in html


def test_errors_no_retry_fixes_fail_at_once_bad_input_is_refused_at_trigger(airflow, tmp_path):
    from tests.airflow_env import _q

    # refused by the trigger, with a message: nothing runs
    for conf, words in (({"hours": 0}, "hours"), ({"hours": "abc"}, "hours"),
                        ({"overrides": ["not-a-pair"]}, "not-a-pair"),
                        ({"overrides": ["train.nope=1"]}, "line 1: unknown key train.nope")):
        with pytest.raises(AssertionError) as refused:
            _trigger(airflow, conf)
        assert " -> 400" in str(refused.value) and words in str(refused.value), refused.value

    work = tmp_path / "work"
    cfg = fake_config(work, plan={"select": {"error": "corpus /nowhere has no metadata"}})
    runs = {"missing input": _trigger(airflow, {"config": str(cfg)}),
            "missing config": _trigger(airflow, {"config": str(tmp_path / "nope.yaml")})}
    for what, run_id in runs.items():
        assert airflow.wait_run("ssl_student", run_id, timeout=120) == "failed", what
        select = airflow.task_instances("ssl_student", run_id)["select"]
        assert select["state"] == "failed" and select["try_number"] == 1, (what, select)
        log = _log(airflow, run_id, "select", 1)
        reason = "corpus /nowhere has no metadata" if what == "missing input" else "nope.yaml"
        assert reason in log, (what, log[-2000:])
    assert airflow.get(f"/api/v2/dags/ssl_student/dagRuns/{_q(runs['missing input'])}")


def _doc_commands(lang: str = "bash") -> list[str]:
    """The code blocks of docs/how-to/airflow.md's Backfill section, one string per block."""
    from tests.airflow_env import ROOT

    text = (ROOT / "docs" / "how-to" / "airflow.md").read_text()
    section = text[text.index("## Backfill: re-run one step"):]
    end = section.find("\n## ", 1)  # up to the next section, if any
    section = section if end < 0 else section[:end]
    return [b.split("\n", 1)[1] for b in section.split("```")[1::2] if b.startswith(lang)]


def _downstream(airflow: Standalone, task_id: str) -> set[str]:
    """Every task after `task_id` in ssl_student, as the live Airflow sees the DAG."""
    tasks = {t["task_id"]: t["downstream_task_ids"]
             for t in airflow.get("/api/v2/dags/ssl_student/tasks")["tasks"]}
    found, todo = set(), list(tasks[task_id])
    while todo:
        t = todo.pop()
        if t not in found:
            found.add(t)
            todo += tasks[t]
    return found


def test_documented_backfill_commands_do_what_the_text_says(airflow, tmp_path):
    """docs/how-to/airflow.md's Backfill commands (CLI and REST), run as written on a live Airflow."""
    import datetime as dt
    import subprocess

    from tests.airflow_env import ROOT

    work = tmp_path / "work"
    cfg = fake_config(work, poll_s=0.5)
    when = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(days=1)
    run_id = f"manual__{when.isoformat()}"
    airflow.request("POST", "/api/v2/dags/ssl_student/dagRuns",
                    {"dag_run_id": run_id, "logical_date": when.isoformat(),
                     "conf": {"config": str(cfg), "teacher": "/models/teacher.pt",
                              "rerun": "resume"}})  # as `make demo` triggers its runs
    assert airflow.wait_run("ssl_student", run_id) == "success"
    cli, rest = _doc_commands()
    assert "2026-01-01T10:00:00+00:00" in cli and "localhost:8080" in rest

    def run_doc(block: str) -> str:
        text = (block.replace("manual__2026-01-01T10:00:00+00:00", run_id)
                .replace("2026-01-01T10:00:00+00:00", when.isoformat())
                .replace("http://localhost:8080", airflow.base)
                .replace('"password": "..."', f'"password": "{airflow.password}"'))
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", text], env=airflow.env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    def tries_become(expected: dict[str, int]):
        def reached():
            tis = airflow.task_instances("ssl_student", run_id)
            tries = {t: tis[t]["try_number"] for t in expected}
            done = all(tis[t]["state"] in ("success", "skipped") for t in tis)  # align: ctm
            return done and tries == expected
        # train -> sequence -> evaluate_sequence -> decode_sequence: four tasks in a row,
        # each a fresh task process, on a machine where the other tests take every core
        try:
            airflow.wait(reached, 480, f"tries {expected}")
        except AssertionError as e:
            now = {t: (ti["state"], ti["try_number"]) for t, ti in
                   airflow.task_instances("ssl_student", run_id).items()}
            raise AssertionError(f"(state, try) now: {now}\n{e}") from None
        airflow.settle("ssl_student", run_id)  # before the next clear (see settle)
        others = {t: ti["try_number"] for t, ti in
                  airflow.task_instances("ssl_student", run_id).items() if t not in expected}
        # nothing else re-ran (a task its branch skipped was never tried: 0)
        assert not {t for t, n in others.items() if n > 1}, others

    def run_clear(block: str, task: str) -> None:
        airflow.clear_taken(lambda: run_doc(block), "ssl_student", run_id, task)

    after_train = _downstream(airflow, "train")
    assert "evaluate" in after_train
    lines = [x for x in cli.splitlines() if x.strip() and not x.startswith("#")]
    listed, clear_train, clear_evaluate = lines
    assert run_id in run_doc(listed)
    airflow.settle("ssl_student", run_id)
    run_clear(clear_train, "train")  # train and what follows it (evaluate)
    tries_become({"train": 2, **{t: 2 for t in after_train}})
    run_clear(clear_evaluate, "evaluate")  # evaluate and evaluate_sequence (-t: a substring)
    evals = {t for t in after_train if "evaluate" in t}
    assert evals == {"evaluate", "evaluate_sequence"}
    tries_become({"train": 2, **{t: 2 for t in after_train}, **{t: 3 for t in evals}})
    run_clear(rest, "train")  # REST: train with what follows it
    tries_become({"train": 3, **{t: 3 for t in after_train}, **{t: 4 for t in evals}})
    store_run = _xcom(airflow, run_id, "train")["run_id"]
    steps = [c["step"] for c in calls(work / "store", store_run)]
    ce_evals = [c for c in calls(work / "store", store_run)
                if c["step"] == "evaluate" and "evaluate.tag=sequence" not in c["argv"]]
    assert steps.count("train") == 3 and len(ce_evals) == 4
    # each clear re-ran the finished steps from scratch although the run says resume
    # (issue 31: the clears reused the outputs and logged the old wall time)
    assert [c["force"] for c in calls(work / "store", store_run)
            if c["step"] == "train"] == [False, True, True]
    assert [c["force"] for c in ce_evals] == [False, True, True, True]
    assert steps.count("select") == 1
