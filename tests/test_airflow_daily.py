"""daily_data on a real `airflow standalone`, with the real steps on the tiny corpus,
driven through /api/v2 as docs/how-to/daily-data.md tells it:

  a backfill of two days -> one partition per day (select, features, targets under
  runs/daily-YYYY-MM-DD/), the report's numbers in XCom, the log and an asset event;
  a new teacher (an amflow_teacher_model event) and a backfill with reprocess_behavior
  completed -> every day re-scored, features kept;
  the same backfill again -> every step handed back (nothing re-run), in seconds.

The steps join one Ray head (`ray.address`): a local Ray per step costs ~10-20 s here.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.airflow_env import ROOT, Standalone, _q, shared_standalone
from tests.conftest import start_ray_head
from tests.test_intervals import _teacher

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.waits, pytest.mark.backfill]
DAG = "daily_data"
STEPS = ("select", "features", "targets")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    return shared_standalone(tmp_path_factory.mktemp("standalone"))


def _unlabeled_days(corpus) -> list[str]:
    """The days whose metadata partition holds unlabeled audio, in order."""
    return sorted(p.name.split("=", 1)[1] for p in (corpus / "metadata").iterdir()
                  if any('"unlabeled"' in f.read_text() for f in p.rglob("*.jsonl")))


def _two_days(corpus) -> list[str]:
    """Two consecutive days that both hold unlabeled audio."""
    days = set(_unlabeled_days(corpus))
    for d in sorted(days):
        nxt = (dt.date.fromisoformat(d) + dt.timedelta(days=1)).isoformat()
        if nxt in days:
            return [d, nxt]
    raise AssertionError(f"no two consecutive days with unlabeled audio in {sorted(days)}")


def _config(tmp_path, corpus, address: str, auth: dict) -> str:
    cfg = {
        "storage": {"root": str(tmp_path / "store")},
        "data": {"corpus": str(corpus)},
        "ray": {"address": address},
        "targets": {"actors": 1, "fidelity_sample_frames": 100},
        # this checkout's amflow, whatever the venv's editable install points at
        "runner": {"mode": "local", "poll_s": 1, "state_dir": str(tmp_path / "jobs"),
                   "command": [sys.executable, "-c",
                               "import sys; from amflow.cli import main; sys.exit(main())"],
                   "env": {**auth, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}},
    }
    path = tmp_path / "daily.yaml"
    path.write_text(json.dumps(cfg))
    return str(path)


def _paused(airflow: Standalone, paused: bool) -> None:
    airflow.request("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": paused})


@contextlib.contextmanager
def _switched(airflow: Standalone):
    """ssl_student off: teacher events schedule it, and this test's are for daily_data only.
    daily_data (it starts paused) is switched on by each backfill once created."""
    airflow.request("PATCH", "/api/v2/dags/ssl_student", {"is_paused": True})
    try:
        yield
    finally:
        _paused(airflow, True)
        airflow.request("DELETE", "/api/v2/dags/ssl_student/assets/queuedEvents",
                        ok=(200, 204, 404))
        airflow.request("PATCH", "/api/v2/dags/ssl_student", {"is_paused": False})


def _new_teacher(airflow: Standalone, uri: str) -> None:
    """What the teacher DAG's train task publishes: an amflow_teacher_model event."""
    (asset,) = [a for a in airflow.get("/api/v2/assets?name_pattern=amflow_teacher_model")
                ["assets"] if a["name"] == "amflow_teacher_model"]
    airflow.request("POST", "/api/v2/assets/events", {"asset_id": asset["id"],
                                                      "extra": {"uri": uri}})


def _backfill(airflow: Standalone, days: list[str], conf: dict, reprocess: str,
              asks: int = 3) -> dict[str, str]:
    """POST /api/v2/backfills over the days, wait until it completes: {day: run id}.
    A reprocessing backfill is asked again (up to `asks` in all) for the days whose steps
    it did not run again (their tries did not move), as a user would who sees nothing
    happen: Airflow 3.3 can lose the clear of a run that the scheduler is still marking
    finished (Standalone.settle), and a reprocess skips a run it holds in flight. CI on
    2026-12-07 saw the same day lost twice in a row; what Airflow recorded for each ask
    (its backfill_dag_run row, the tasks' states) is printed, and is in the failure."""
    if reprocess == "none":  # new runs: nothing to compare with
        return _backfill_once(airflow, days, conf, reprocess)
    before = _tries(airflow, _runs(airflow, days))
    runs = _backfill_once(airflow, days, conf, reprocess)
    after = _tries(airflow, runs)
    seen = []
    for _ in range(asks - 1):
        stale = [d for d in days if not _moved(before[d], after[d])]
        if not stale:
            break
        seen.append(_why_not_run(airflow, runs, stale))
        print(f"backfill ({reprocess}): Airflow did not run {stale} again; asked once more: "
              f"{seen[-1]}")
        for day in stale:
            airflow.settle(DAG, runs[day], quiet_s=15)
        _backfill_once(airflow, stale, conf, reprocess)
        after = _tries(airflow, runs)
    assert all(_moved(before[d], after[d]) for d in days), (before, after, seen)
    return runs


def _why_not_run(airflow: Standalone, runs: dict[str, str], days: list[str]) -> dict:
    """What Airflow holds of the days a backfill did not run again: each task's (state,
    try), and the newest backfills' backfill_dag_run rows (up to 4: the day, its run, the
    reason a backfill gave for not running it, when it gave one), read from the test
    Airflow's SQLite database."""
    out = {}
    for day in days:
        tis = airflow.task_instances(DAG, runs[day])
        out[day] = {"tasks": {s: (tis[s]["state"], tis[s]["try_number"]) for s in STEPS}}
    try:
        with contextlib.closing(sqlite3.connect(airflow.home / "airflow.db", timeout=10)) as db:
            rows = db.execute(
                "SELECT b.id, r.logical_date, r.dag_run_id, r.exception_reason "
                "FROM backfill_dag_run r JOIN backfill b ON b.id = r.backfill_id "
                "WHERE b.dag_id = ? ORDER BY b.id DESC LIMIT 4", (DAG,)).fetchall()
        out["backfill_dag_run"] = [list(r) for r in rows]
    except sqlite3.Error as e:  # a diagnosis, not the test: say why it is missing
        out["backfill_dag_run"] = f"unreadable: {e}"
    return out


def _runs(airflow: Standalone, days: list[str]) -> dict[str, dict]:
    """{day: its daily_data run} over the days' logical dates."""
    runs = airflow.get(f"/api/v2/dags/{DAG}/dagRuns?logical_date_gte={days[0]}T00:00:00Z"
                       f"&logical_date_lte={days[-1]}T00:00:00Z")["dag_runs"]
    return {r["logical_date"][:10]: r for r in runs}


def _tries(airflow: Standalone, runs: dict[str, dict | str]) -> dict[str, dict[str, int]]:
    """{day: {step: try number}} of the runs ({day: run or run id})."""
    out = {}
    for day, run in runs.items():
        tis = airflow.task_instances(DAG, run if isinstance(run, str) else run["dag_run_id"])
        out[day] = {s: tis[s]["try_number"] for s in STEPS}
    return out


def _moved(before: dict[str, int], after: dict[str, int]) -> bool:
    return all(after[s] > before[s] for s in STEPS)


def _backfill_once(airflow: Standalone, days: list[str], conf: dict, reprocess: str
                   ) -> dict[str, str]:
    body = {"dag_id": DAG, "from_date": f"{days[0]}T00:00:00Z",
            "to_date": f"{days[-1]}T00:00:00Z", "dag_run_conf": conf,
            "reprocess_behavior": reprocess, "max_active_runs": 2}
    # Created while daily_data is paused (the scheduler leaves a paused DAG's runs alone),
    # then switched on. A creation SQLite refuses deletes the runs it had made; a scheduler
    # scheduling them then died on it (StaleDataError: "UPDATE statement on table 'dag_run'
    # expected to update 2 row(s); 1 were matched", 2026-11-29) and no run moved again.
    _paused(airflow, True)
    bf = airflow.wait(lambda: _create(airflow, body), 240, f"backfill ({reprocess}) created",
                      every=3)
    _paused(airflow, False)
    airflow.wait(lambda: airflow.get(f"/api/v2/backfills/{bf['id']}")["completed_at"], 900,
                 f"backfill {bf['id']} ({reprocess}) to complete", every=3)
    by_day = _runs(airflow, days)
    assert sorted(by_day) == days, by_day
    for day, run in by_day.items():
        assert run["state"] == "success", (day, airflow.task_instances(DAG, run["dag_run_id"]))
    return {day: run["dag_run_id"] for day, run in by_day.items()}


def _create(airflow: Standalone, body: dict) -> dict | None:
    """POST /api/v2/backfills once: the backfill, or None when SQLite refused it. A 503
    ("Database is locked", the request's runs rolled back) is asked again; a 409 after one
    is the refused request's backfill row, committed before its runs: the scheduler marks
    such an orphan complete within 2 minutes, then the POST goes through."""
    # creating one clears or creates each run, each write waiting for SQLite's lock
    bf = airflow.request("POST", "/api/v2/backfills", body, ok=(200, 409, 503), timeout=300)
    return bf if "id" in bf else None


def _xcom(airflow: Standalone, run_id: str, task: str, key: str = "return_value"):
    value = airflow.get(f"/api/v2/dags/{DAG}/dagRuns/{_q(run_id)}/taskInstances/{task}/"
                        f"xcomEntries/{key}")["value"]
    return json.loads(value) if isinstance(value, str) else value


def _runner_lines(airflow: Standalone, run_id: str, task: str, try_number: int) -> list[str]:
    """A task try's amflow lines (its run id, the [amflow-runner] decision, the step's own):
    why it started a job or handed back."""
    log = airflow.task_log(DAG, run_id, task, try_number)
    return [line[-400:] for line in log.splitlines() if "amflow" in line][-12:]


def _partitions(store, days: list[str]) -> dict[str, dict[str, dict]]:
    """{day: {step: its _SUCCESS.json}} of the interval runs."""
    out = {}
    for day in days:
        run = store / "runs" / f"daily-{day}"
        out[day] = {s: json.loads((run / s / "_SUCCESS.json").read_text()) for s in STEPS}
    return out


def test_backfill_reprocess_after_a_new_teacher_and_a_noop_rebackfill(airflow, tiny_corpus,
                                                                       tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    days = _two_days(corpus)
    store = tmp_path / "store"
    teacher_a, teacher_b = _teacher(tmp_path / "a.pt", 0), _teacher(tmp_path / "b.pt", 1)
    (tmp_path / "ray").mkdir()
    with start_ray_head(tmp_path / "ray", num_cpus=2) as (address, _, auth), \
            _switched(airflow):
        conf = {"config": _config(tmp_path, corpus, address, auth)}
        _new_teacher(airflow, teacher_a)
        runs = _backfill(airflow, days, conf, "none")
        first = _partitions(store, days)
        for day, run_id in runs.items():
            sel, feats, tgt = (first[day][s] for s in STEPS)
            assert sel["inputs"]["interval"][0].startswith(day)
            assert tgt["inputs"]["teacher"] == teacher_a
            assert tgt["counts"]["out"] == feats["counts"]["out"] == sel["counts"]["selected"] > 0
            report = _xcom(airflow, run_id, "report")
            assert report["interval"] == day and report["run_id"] == f"daily-{day}"
            assert report["hours_in"] >= report["hours_selected"] > 0
            assert report["utts_kept"] == tgt["counts"]["out"]
            log = airflow.task_log(DAG, run_id, "report", 1)
            assert f"[amflow daily] interval {day}" in log, log[-2000:]
            events = airflow.get(f"/api/v2/assets/events?source_dag_id={DAG}"
                                 f"&source_run_id={_q(run_id)}")["asset_events"]
            assert [e["extra"]["interval"] for e in events] == [day]
            # the run's amflow tab shows its partition
            page = airflow.get(f"/amflow/runs/{DAG}/{_q(run_id)}", raw=True)
            assert f"daily-{day}" in page and "<td>targets</td>" in page, page[-1500:]
        # a new teacher: the completed intervals are re-scored, their features kept
        for run_id in runs.values():
            airflow.settle(DAG, run_id)
        _new_teacher(airflow, teacher_b)
        _backfill(airflow, days, conf, "completed")
        second = _partitions(store, days)
        for day in days:
            assert second[day]["features"]["finished_at"] == first[day]["features"]["finished_at"]
            assert second[day]["select"]["finished_at"] == first[day]["select"]["finished_at"]
            assert second[day]["targets"]["inputs"]["teacher"] == teacher_b
            assert second[day]["targets"]["inputs"]["teacher_digest"] != \
                first[day]["targets"]["inputs"]["teacher_digest"]
        # the same backfill again: nothing changed, every step handed back
        for run_id in runs.values():
            airflow.settle(DAG, run_id)
        t0 = time.time()
        _backfill(airflow, days, conf, "completed")
        took = time.time() - t0
        assert _partitions(store, days) == second
        for day, run_id in runs.items():
            tis = airflow.task_instances(DAG, run_id)
            task_s = sum(tis[s]["duration"] for s in STEPS)
            for s in STEPS:
                runner = _xcom(airflow, run_id, s, key="runner")
                assert runner.get("reused") is True, (day, s, runner, _runner_lines(
                    airflow, run_id, s, tis[s]["try_number"]))
            each = ", ".join(f"{s} {tis[s]['duration']:.1f} s" for s in STEPS)
            print(f"no-op re-backfill, {day}: {task_s:.1f} s of task time ({each})")
        print(f"no-op re-backfill of {len(days)} intervals: {took:.0f} s wall")


def _all_days(corpus) -> list[str]:
    """Every day from the first to the last with unlabeled audio (a backfill runs the days
    between too)."""
    with_data = _unlabeled_days(corpus)
    first, last = (dt.date.fromisoformat(d) for d in (with_data[0], with_data[-1]))
    return [(first + dt.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]


def _run_times(airflow: Standalone, run_ids: list[str]) -> dict[str, float]:
    """Wall (first start to last end) and task time (the task instances' durations) over
    the runs."""
    starts, ends, task_s = [], [], 0.0
    for run_id in run_ids:
        run = airflow.get(f"/api/v2/dags/{DAG}/dagRuns/{_q(run_id)}")
        starts.append(dt.datetime.fromisoformat(run["start_date"]))
        ends.append(dt.datetime.fromisoformat(run["end_date"]))
        task_s += sum(ti["duration"] or 0.0 for ti in airflow.task_instances(DAG, run_id).values())
    return {"wall_s": round((max(ends) - min(starts)).total_seconds(), 1),
            "task_s": round(task_s, 1)}


def _steps_s(store, run_ids: list[str]) -> float:
    """The steps' own time over the runs: their _SUCCESS.json's started to finished."""
    total = 0.0
    for run_id in run_ids:
        for s in STEPS:
            done = json.loads((store / "runs" / run_id / s / "_SUCCESS.json").read_text())
            total += (dt.datetime.fromisoformat(done["finished_at"])
                      - dt.datetime.fromisoformat(done["started_at"])).total_seconds()
    return round(total, 1)


def _bench_conf(tmp_path, corpus, address: str, auth: dict) -> dict:
    """daily_data's conf for the benchmark: with AMFLOW_BENCH_TEACHER (a model.pt of the
    corpus's features, e.g. make demo's teacher) configs/local.yaml as it is, else this
    module's config (steps on the shared Ray head) and a random 10-class teacher."""
    import os

    teacher = os.environ.get("AMFLOW_BENCH_TEACHER")
    if not teacher:
        return {"config": _config(tmp_path, corpus, address, auth),
                "teacher": _teacher(tmp_path / "a.pt", 0)}
    return {"config": str(ROOT / "configs" / "local.yaml"), "teacher": str(Path(teacher).resolve()),
            "overrides": [f"storage.root={tmp_path / 'store'}", f"data.corpus={corpus}",
                          f"runner.state_dir={tmp_path / 'jobs'}", "runner.poll_s=1"]}


@pytest.mark.benchmark
def test_backfill_cost_against_one_snapshot_run(airflow, tiny_corpus, tmp_path):
    """Every day of a corpus backfilled (2 runs at a time) against one daily_data run whose
    data interval spans them all (a snapshot), both through this Airflow with the real
    steps: wall time, task time and the steps' own time, side by side, and the same
    utterances kept; then the backfill again with nothing changed (every step handed
    back): what Airflow itself costs per interval. The corpus: AMFLOW_BENCH_CORPUS (e.g.
    data/corpus after `make demo`), else the tiny one. `make bench-daily`; prints JSON, asserts no timing."""
    import os

    corpus = Path(os.environ.get("AMFLOW_BENCH_CORPUS") or tiny_corpus).resolve()
    days = _all_days(corpus)
    store = tmp_path / "store"
    (tmp_path / "ray").mkdir()
    with start_ray_head(tmp_path / "ray", num_cpus=2) as (address, _, auth), \
            _switched(airflow):
        conf = _bench_conf(tmp_path, corpus, address, auth)
        # the snapshot: one run, its data interval all the days (daily.dataset's run of
        # it); its logical date the day after them, which the backfill leaves free
        end = f"{dt.date.fromisoformat(days[-1]) + dt.timedelta(days=1)}T00:00:00Z"
        _paused(airflow, False)
        snap = airflow.request("POST", f"/api/v2/dags/{DAG}/dagRuns", {
            "dag_run_id": "bench-snapshot", "logical_date": end,
            "data_interval_start": f"{days[0]}T00:00:00Z", "data_interval_end": end,
            "conf": conf})
        assert airflow.settle(DAG, snap["dag_run_id"], timeout=900) == "success"
        runs = _backfill_once(airflow, days, conf, "none")
        snap_report = _xcom(airflow, snap["dag_run_id"], "report")
        kept = sum(_xcom(airflow, r, "report")["utts_kept"] for r in runs.values())
        assert kept == snap_report["utts_kept"] > 0
        snapshot = {**_run_times(airflow, [snap["dag_run_id"]]),
                    "steps_s": _steps_s(store, [snap_report["run_id"]])}
        backfill = {**_run_times(airflow, list(runs.values())),
                    "steps_s": _steps_s(store, [f"daily-{d}" for d in days])}
        # Airflow's own floor: the same backfill again, every step handed back (no work)
        for run_id in runs.values():
            airflow.settle(DAG, run_id)
        noop = _run_times(airflow, list(_backfill(airflow, days, conf, "completed").values()))
    report = {"corpus": str(corpus), "days": len(days),
              "hours_selected": snap_report["hours_selected"], "utterances": kept,
              "snapshot": snapshot, "backfill": backfill, "noop_rebackfill": noop,
              "ratio": {k: round(backfill[k] / snapshot[k], 2) for k in snapshot},
              "noop_ratio": {k: round(noop[k] / snapshot[k], 2) for k in noop}}
    print("AMFLOW_BENCH " + json.dumps(report))
