"""amflow.jobs and amflow.orchestration: local detached jobs, Ray jobs, stable ids, re-attach, stop on kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from amflow import jobs as J
from amflow.jobs import ray_job
from amflow.orchestration import airflow_step as A
from amflow.orchestration import operator as O
from amflow.orchestration import pools as P
from amflow.orchestration.rerun import Attempt
from amflow.steps.registry import LIGHT, names
from tests.conftest import start_ray_head

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_amflow.py"
PY = sys.executable


def _calls(tmp_path: Path, run_id: str) -> list[dict]:
    path = tmp_path / "store" / "runs" / run_id / "_calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _local_runner(tmp_path: Path, lines: list[str]):
    backend = J.LocalBackend(tmp_path / "jobs")
    return J.StepRunner(backend, tmp_path / "jobs", poll_s=0.1, emit=lines.append)


def test_ids_are_stable_and_path_safe():
    a = J.amflow_run_id("ssl_student", "manual__2026-01-01T00:00:00+00:00")
    assert a == J.amflow_run_id("ssl_student", "manual__2026-01-01T00:00:00+00:00")
    assert "/" not in a and ":" not in a and "+" not in a
    assert a != J.amflow_run_id("ssl_student", "manual__2026-01-01T00:00:00-00:00")
    j1 = J.job_id("ssl_student", "manual__x", "train", 1)
    assert j1 == J.job_id("ssl_student", "manual__x", "train", 1)
    assert j1 != J.job_id("ssl_student", "manual__x", "train", 2)
    assert j1 != J.job_id("ssl_student", "manual__y", "train", 1)
    assert len(J.job_id("d" * 300, "r" * 300, "t" * 300, 12)) < 100


def test_a_users_config_outside_the_checkout_runs_its_steps_in_its_folder(tmp_path):
    """The own-corpus how-to's YAML (storage.root: ./mine), given to a DAG by its absolute
    path: local steps run beside it, as `amflow` does when run from that folder; the
    shipped configs keep running in the checkout (configs/local.yaml's ./data)."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("storage: {root: ./mine}\n")
    assert J.step_workdir(str(mine)) == str(tmp_path)
    assert J.step_workdir("configs/local.yaml") == str(ROOT)
    assert J.step_workdir(None) == str(ROOT)
    from core.config import load_config

    cfg = load_config(str(mine), ["runner.mode=local", f"runner.state_dir={tmp_path / 'jobs'}"])
    assert J.make_backend(cfg, tmp_path / "jobs", str(mine)).cwd == str(tmp_path)
    pinned = load_config(str(mine), [f"runner.workdir={ROOT}"])
    assert J.make_backend(pinned, tmp_path / "jobs", str(mine)).cwd == str(ROOT)


def test_step_command_and_summary_parsing():
    argv = J.step_command(["amflow"], "train", config="configs/local.yaml", run_id="r1",
                          overrides=["train.workers=2"], extra_args=["--model", "m.pt"],
                          force=True)
    assert argv == ["amflow", "train", "--config", "configs/local.yaml", "--run-id", "r1",
                    "--set", "train.workers=2", "--force", "--model", "m.pt"]
    text = 'x\nAMFLOW_SUMMARY {"a": 1}\nnoise\nAMFLOW_SUMMARY {"a": 2}\ntrailing\n'
    assert J.parse_summary(text) == {"a": 2}
    assert J.parse_summary("no summary here") is None
    assert O.model_uri({"uri": "s3://b/runs/r/train"}) == "s3://b/runs/r/train/model.pt"
    assert O.model_uri({"model_uri": "s3://m.pt", "uri": "x"}) == "s3://m.pt"


def test_pool_slots_are_the_cores_a_step_computes_on(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {threads: 1, teacher_preset: {threads: 3}}\n")
    per_core = P.POOL_SLOTS_PER_CORE
    assert P.pool_slots("train", cfg, ["train.model=student"]) == per_core
    assert P.pool_slots("train", cfg, ["train.model=teacher"]) == 3 * per_core
    assert P.pool_slots("train", cfg, ["train.model=student", "train.workers=2",
                                       "train.threads=2"]) == 4 * per_core
    assert P.pool_slots("sequence", cfg, ["train.model=teacher"]) == 3 * per_core
    assert P.pool_slots("features", cfg, []) == P.pool_slots("targets", cfg, []) == per_core
    assert all(P.pool_slots(s, cfg, []) == 1 for s in names(resources=LIGHT))
    assert P.pool_size(2) == 2 * per_core + P.POOL_LIGHT_SLOTS


def test_a_task_short_of_pool_slots_is_told_why():
    """Which pool, how many open, held by whom (deferred tasks count where the pool says)."""
    pool = {"name": "default_pool", "slots": 10, "include_deferred": True}
    waiter = {"dag_id": "teacher", "task_id": "train_baseline", "pool": "default_pool",
              "pool_slots": 8, "state": "scheduled"}
    tis = [{"dag_id": "teacher", "task_id": "evaluate", "pool": "default_pool",
            "pool_slots": 1, "state": "running"},
           {"dag_id": "ssl_student", "task_id": "features", "pool": "default_pool",
            "pool_slots": 4, "state": "deferred"},
           {"dag_id": "x", "task_id": "other_pool", "pool": "p2", "pool_slots": 9,
            "state": "running"},
           {"dag_id": "x", "task_id": "done", "pool": "default_pool", "pool_slots": 9,
            "state": "success"}, waiter]
    assert P.waiting_note(waiter, pool, tis) == (
        "waiting for 8 slots of pool default_pool: 5 of 10 open; held by "
        "ssl_student.features (4, deferred), teacher.evaluate (1, running)")
    # deferred tasks not counted by the pool: room for it, nothing to say
    assert P.waiting_note(waiter, {**pool, "include_deferred": False}, tis) == ""
    assert P.waiting_note({**waiter, "pool_slots": 5}, pool, tis) == ""
    assert P.waiting_note(waiter, {**pool, "slots": 6}, []) == (
        "needs 8 slots but pool default_pool has 6 in all: it cannot start until the pool "
        "is made larger (scripts/airflow_pool.py --cores N)")


def test_try_budget_is_capped_by_the_token_lifetime(monkeypatch):
    monkeypatch.setenv("AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME", "60")
    assert A.try_budget_s(600, 5) == 30
    assert A.try_budget_s(10, 5) == 10
    assert A.try_budget_s(1, 5) == 5


def test_local_job_follow_in_short_tries_reattaches_without_duplicates(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(features={"seconds": 3, "lines": 6})
    argv = J.step_command([PY, str(FAKE)], "features", config=str(cfg), run_id="r1")
    lines: list[str] = []
    first = _local_runner(tmp, lines)
    out = first.run("job-a", argv, budget_s=0.8)
    assert out.submitted and out.status == J.RUNNING and not out.done
    # A second caller (a later poke, another process) re-attaches to the same job.
    pokes = 1
    while not out.done:
        again = _local_runner(tmp, lines)
        out = again.run("job-a", argv, budget_s=0.8)
        assert not out.submitted
        pokes += 1
    assert pokes >= 3 and out.pokes == pokes
    assert out.ok and out.summary["step"] == "features" and out.summary["run_id"] == "r1"
    progress = [x for x in lines if "shards (" in x]
    assert progress == [f"[features] {i}/6 shards ({100 * i // 6}%)" for i in range(1, 7)]
    assert len(_calls(tmp, "r1")) == 1  # one job, however many pokes
    assert (tmp / "store" / "runs" / "r1" / "features" / "_SUCCESS.json").exists()


def test_local_job_failure_reports_its_last_lines(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(select={"seconds": 0.2, "fail_times": 1})
    argv = J.step_command([PY, str(FAKE)], "select", config=str(cfg), run_id="r2")
    out = _local_runner(tmp, []).run("job-f", argv, budget_s=20)
    assert out.status == J.FAILED and not out.ok
    assert any("injected failure" in x for x in out.tail)


def test_local_job_outlives_its_submitter_and_stop_ends_it(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(train={"seconds": 60, "lines": 60})
    argv = J.step_command([PY, str(FAKE)], "train", config=str(cfg), run_id="r3")
    code = ("import sys; from pathlib import Path; from amflow import jobs as J; "
            f"b = J.LocalBackend(Path({str(tmp / 'jobs')!r})); "
            f"print(b.submit('job-s', {argv!r}))")
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr
    backend = J.LocalBackend(tmp / "jobs")
    deadline = time.time() + 20
    while not _calls(tmp, "r3") and time.time() < deadline:
        time.sleep(0.1)
    assert backend.status("job-s") == J.RUNNING  # the submitter is gone, the job is not
    pid = _calls(tmp, "r3")[0]["pid"]
    assert backend.submit("job-s", argv) is False  # the same id never starts twice
    assert backend.stop("job-s") is True
    assert backend.status("job-s") == J.STOPPED
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    text, _ = backend.final_logs("job-s")
    assert "terminated by signal 15" in text


def _airflow_step(cfg: Path, try_number: int, **kw) -> A.AirflowStep:
    return A.AirflowStep(step="repartition", dag_id="ssl_student", airflow_run_id="manual__t",
                         task_id="repartition", try_number=try_number, config=str(cfg),
                         overrides=[], emit=lambda line: None, **kw)


def test_cleared_finished_step_is_redone_and_retry_adopts_a_running_job(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(repartition={"seconds": 0.3})
    s1 = _airflow_step(cfg, 1)
    out = s1.poke()
    assert out.ok and out.summary["metrics"]["forced"] is False
    # Clearing the task (new try, the first since the clear) after it finished: the step
    # is redone with --force, also when the run asked to resume (issue 31) ...
    cleared = Attempt(try_number=2, first_try=2, run_cleared=True)
    out = _airflow_step(cfg, 2, rerun="resume", attempt=cleared).poke()
    assert out.ok and out.summary["metrics"]["forced"] is True
    # ... while a new DAG run naming the same amflow run id with rerun=resume keeps it.
    out = A.AirflowStep(step="repartition", dag_id="ssl_student", airflow_run_id="manual__t2",
                        task_id="repartition", try_number=1, config=str(cfg), overrides=[],
                        emit=lambda line: None, rerun="resume", run_id=s1.run_id).poke()
    assert out.ok and out.summary["metrics"]["forced"] is False
    calls = _calls(tmp, s1.run_id)
    assert [c["force"] for c in calls] == [False, True, False]

    # A try whose job is still running (its task died without stopping it): the next try
    # follows that job instead of starting a second one.
    set_plan(repartition={"seconds": 4, "lines": 4})
    s4 = _airflow_step(cfg, 4)
    s4.cfg.runner.max_wait_per_try_s = 0.5
    s4.cfg.runner.poll_s = 0.1
    assert not s4.poke().done
    s5 = _airflow_step(cfg, 5)
    s5.cfg.runner.max_wait_per_try_s = 30
    out = s5.poke()
    assert out.ok and out.job_id == s4.job_id
    assert len(_calls(tmp, s1.run_id)) == 4


def _wait_status(backend, jid: str, want: tuple[str, ...], timeout: float = 20) -> str:
    deadline = time.time() + timeout
    while (status := backend.status(jid)) not in want and time.time() < deadline:
        time.sleep(0.1)
    return status


def test_an_ended_runs_orphaned_job_is_stopped_by_the_dag_callback(fake_env):
    """A deferred task marked failed before the triggerer loaded its trigger leaves a job
    that nothing follows; the DAG's run-end callback stops it, and only it."""
    sys.path.insert(0, str(ROOT / "dags"))
    from types import SimpleNamespace

    from amflow_common import stop_orphaned_jobs

    cfg, set_plan, tmp = fake_env
    set_plan(train={"seconds": 60, "lines": 60}, select={"seconds": 0.1})
    backend = J.LocalBackend(tmp / "jobs")
    orphan = J.job_id("ssl_student", "manual__a", "train", 2)
    other_run = J.job_id("ssl_student", "manual__b", "train", 1)
    ended = J.job_id("ssl_student", "manual__a", "select", 1)
    for jid, step, run in ((orphan, "train", "ra"), (other_run, "train", "rb"),
                           (ended, "select", "ra")):
        assert backend.submit(jid, J.step_command([PY, str(FAKE)], step, config=str(cfg),
                                                  run_id=run))
    assert _wait_status(backend, ended, J.TERMINAL) == J.SUCCEEDED
    assert _wait_status(backend, orphan, (J.RUNNING,)) == J.RUNNING
    assert backend.live_jobs(J.job_prefix("ssl_student", "manual__a", "train")) == [orphan]

    dag = SimpleNamespace(dag_id="ssl_student", task_ids=["select", "train", "evaluate"])
    run = SimpleNamespace(conf={"config": str(cfg)})
    stop_orphaned_jobs({"dag": dag, "dag_run": run, "run_id": "manual__a", "params": {}})
    assert backend.status(orphan) == J.STOPPED
    assert backend.status(ended) == J.SUCCEEDED  # an ended job is left as it is
    assert backend.status(other_run) == J.RUNNING  # another run's job is not this run's
    assert O.stop_run_jobs(str(cfg), [], "ssl_student", "manual__b", ["train"],
                           emit=lambda line: None) == [other_run]
    assert backend.status(other_run) == J.STOPPED


def test_runner_cli_runs_a_step_and_sigterm_stops_its_job(fake_env):
    cfg, set_plan, tmp = fake_env
    set_plan(select={"seconds": 0.3}, train={"seconds": 60, "lines": 120})
    done = subprocess.run([PY, "-m", "amflow.jobs", "run", "select", "--config", str(cfg),
                           "--run-id", "cli"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert J.parse_summary(done.stdout)["step"] == "select"
    proc = subprocess.Popen([PY, "-m", "amflow.jobs", "run", "train", "--config", str(cfg),
                             "--run-id", "cli", "--job-id", "cli-train"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "shards" in line:
            break
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert J.LocalBackend(tmp / "jobs").status("cli-train") == J.STOPPED


# ----------------------------------------------------------------------------- Ray jobs

@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A local Ray head with the dashboard (job API) on a free port, and pool_c4 = 1."""
    with start_ray_head(tmp_path_factory.mktemp("ray"), num_cpus=1,
                        resources={"pool_c4": 1}) as (_, dashboard, _auth):
        yield dashboard


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.isolated
def test_ray_job_runs_a_step_streams_its_log_and_sigterm_stops_it(fake_env, ray_head):
    cfg, set_plan, tmp = fake_env
    set_plan(features={"seconds": 2, "lines": 4}, train={"seconds": 120, "lines": 240})
    sets = ["--set", "runner.mode=ray_job", "--set", f"runner.ray_dashboard={ray_head}",
            "--set", "ray.step_resources={features: {pool_c4: 0.5}, train: {pool_c4: 0.5}}",
            # The job's environment is the cluster's: hand the fake its plan explicitly.
            "--set", f"runner.env={{AMFLOW_FAKE_PLAN: {os.environ['AMFLOW_FAKE_PLAN']}}}"]
    from core.config import load_config
    from ray.job_submission import JobSubmissionClient

    conf = load_config(cfg, [s for s in sets if s != "--set"])
    backend = J.make_backend(conf)
    assert isinstance(backend, ray_job.RayJobBackend)
    lines: list[str] = []
    runner = J.StepRunner(backend, tmp / "jobs", poll_s=0.5, emit=lines.append)
    jid = "amflow-test-features-try1"
    argv = J.step_command(conf.runner.command, "features", config=str(cfg), run_id="ray1")
    out = runner.run(jid, argv, budget_s=1.0, resources={"pool_c4": 0.5})
    assert out.submitted
    while not out.done:  # short tries, as an Airflow task polls
        out = runner.run(jid, argv, budget_s=2.0, resources={"pool_c4": 0.5})
        assert not out.submitted  # a re-poke re-attaches; never a second job
    assert out.ok, out.tail
    assert [x for x in lines if "shards (" in x] == [
        f"[features] {i}/4 shards ({100 * i // 4}%)" for i in range(1, 5)]
    assert out.summary["step"] == "features"
    client = JobSubmissionClient(ray_head)
    # The driver is placed by the step's pool resource: a pool this head lacks never runs it.
    assert backend.submit("amflow-test-nopool", argv, {"pool_p3": 0.01})
    time.sleep(3)
    assert str(client.get_job_status("amflow-test-nopool")) == "PENDING"
    assert backend.live_jobs("amflow-test-no") == ["amflow-test-nopool"]
    # (a job pending on a missing pool takes Ray longer than stop's grace to mark STOPPED)
    assert backend.stop("amflow-test-nopool")

    # The runner CLI (as a killed Airflow task would) stops its Ray job on SIGTERM.
    proc = subprocess.Popen([PY, "-m", "amflow.jobs", "run", "train", "--config", str(cfg),
                             "--run-id", "ray1", "--job-id", "amflow-test-train", *sets],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "shards (" in line:
            break
    assert client.get_job_status("amflow-test-train") == "RUNNING"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert str(client.get_job_status("amflow-test-train")) == "STOPPED"
    assert len([c for c in _calls(tmp, "ray1") if c["step"] == "train"]) == 1


# ----------------------------------------------------------------------------- deferral

def _run_trigger(trigger, timeout: float = 60):
    import asyncio

    async def first_event():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(first_event(), timeout))


def test_trigger_waits_for_the_job_and_fires_once_it_ended(fake_env):
    from amflow.orchestration.trigger import AmflowJobTrigger

    cfg, set_plan, tmp = fake_env
    set_plan(train={"seconds": 1.5, "lines": 3})
    lines: list[str] = []
    runner = _local_runner(tmp, lines)
    argv = J.step_command([PY, str(FAKE)], "train", config=str(cfg), run_id="r1")
    assert runner.submit("job-t", argv)
    trigger = AmflowJobTrigger(job_id="job-t", config=str(cfg), overrides=[],
                               state_dir=str(tmp / "jobs"), poll_s=0.2)
    # what the triggerer stores and rebuilds it from
    path, kwargs = trigger.serialize()
    assert path == "amflow.orchestration.trigger.AmflowJobTrigger"
    t0 = time.time()
    event = _run_trigger(AmflowJobTrigger(**kwargs))
    assert event == {"job_id": "job-t", "status": J.SUCCEEDED} and time.time() - t0 >= 1.0
    # the task, back from deferral, gets the whole output and the summary
    out = runner.follow("job-t", 0.0)
    assert out.ok and out.summary["step"] == "train"
    assert [x for x in lines if "shards (" in x][-1] == "[train] 3/3 shards (100%)"


def test_trigger_stops_a_job_past_its_timeout_and_on_kill(fake_env):
    import asyncio

    from amflow.orchestration.trigger import AmflowJobTrigger

    cfg, set_plan, tmp = fake_env
    set_plan(train={"seconds": 60, "lines": 60}, select={"seconds": 60, "lines": 60})
    runner = _local_runner(tmp, [])
    for jid, step in (("job-slow", "train"), ("job-killed", "select")):
        runner.submit(jid, J.step_command([PY, str(FAKE)], step, config=str(cfg), run_id="r1"))
    slow = AmflowJobTrigger(job_id="job-slow", config=str(cfg), overrides=[],
                            state_dir=str(tmp / "jobs"), poll_s=0.2, step_timeout_s=1)
    event = _run_trigger(slow)
    assert event["status"] == J.STOPPED and "step_timeout_s=1" in event["reason"]
    assert runner.backend.status("job-slow") == J.STOPPED
    killed = AmflowJobTrigger(job_id="job-killed", config=str(cfg), overrides=[],
                              state_dir=str(tmp / "jobs"), poll_s=0.2)
    asyncio.run(killed.on_kill())
    assert runner.backend.status("job-killed") == J.STOPPED


def test_permanent_errors_are_told_from_transient_ones():
    assert O.permanent_error("select", ["[select] 1/3 shards", "amflow select: error: no corpus at /x"]) \
        == "amflow select: error: no corpus at /x"
    assert O.permanent_error("train", ["amflow train: train.lr: must be > 0"])
    assert O.permanent_error("train", ["amflow: error: unrecognized arguments: --x"])
    # a crash, a lost node, an injected failure: worth a retry
    assert O.permanent_error("train", ["Traceback (most recent call last):",
                                       "ConnectionError: reset by peer"]) == ""
    assert O.permanent_error("features", ["[features] error: injected failure 1"]) == ""
    assert O.permanent_error("train", ["amflow select: error: other step"]) == ""


def test_a_refusal_that_names_force_says_what_force_is_in_airflow():
    """A finished training of another config is refused until --force; an Airflow user
    gets there by clearing the task or by rerun=redo, which the failure now says."""
    refusal = ("amflow train: runs/r/train-teacher finished with another config (differs "
               "in: train.epochs); re-run with --force to train again, or use another "
               "train.tag")
    said = O.in_airflow_terms(O.permanent_error("train", ["[train] ...", refusal]))
    assert said.startswith(refusal) and "clear this task" in said and "rerun=redo" in said
    plain = "amflow select: error: no corpus at /x"
    assert O.in_airflow_terms(plain) == plain


def test_flat_results_for_asset_events():
    metrics = {"frame_accuracy": 0.74567, "per": 0.31, "num_utterances": 40,
               "per_condition": {"DP1": 0.81234, "DP2": 0.7},
               "per_condition_per": {"DP1": 0.2}, "per_condition_wer": {"DP1": 0.5},
               "wer": 0.55, "rel_frame_error_reduction": {"DP1": 0.143, "all": 0.15}}
    flat = O.flat_results(metrics)
    assert flat == {"frame_accuracy": 0.7457, "per": 0.31, "num_utterances": 40, "wer": 0.55,
                    "frame_accuracy_DP1": 0.8123, "frame_accuracy_DP2": 0.7, "per_DP1": 0.2,
                    "wer_DP1": 0.5, "rel_frame_error_reduction_DP1": 0.143,
                    "rel_frame_error_reduction_all": 0.15}
    assert all(not isinstance(v, (dict, list)) for v in flat.values())
    # decode's summary: its bare per_condition is WER, as per_condition_wer is
    decoded = O.flat_results({"wer": 0.3, "per_condition_wer": {"DP1": 0.25},
                              "per_condition": {"DP1": 0.25}}, step="decode")
    assert decoded == {"wer": 0.3, "wer_DP1": 0.25}
