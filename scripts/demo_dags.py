"""Run DAGs for `make demo` on the Airflow that scripts/demo.sh started, like a user
would: trigger over the REST API with a conf, wait, print each task's duration.

The runs are ordinary scheduled runs (LocalExecutor + triggerer): their task logs land in
$AIRFLOW_HOME/logs and their durations are the steps' wall times, as for any run that
`make airflow` shows later.

    python scripts/demo_dags.py --base http://localhost:PORT --passwords FILE \
        DAG RUN_ID_PREFIX CONF_JSON [--pause OTHER_DAG] [--unpause DAG ...] \
        [--then DAG2 PREFIX2 CONF2 --after TASK]

`--then` triggers a second DAG as soon as TASK of the first has succeeded (the teacher's
`train`: what the student needs), so the first DAG's remaining tasks (the teacher's
evaluation and decoding) run beside the second's first steps instead of before them.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # amflow, for the pool's words


class Api:
    def __init__(self, base: str, password: str):
        self.base = base.rstrip("/")
        body = json.dumps({"username": "admin", "password": password}).encode()
        req = urllib.request.Request(f"{self.base}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            self.token = json.load(r)["access_token"]

    def call(self, method: str, path: str, body=None):
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raise SystemExit(f"{method} {path} -> {e.code}: {e.read()[:1000]!r}") from e


def wait_parsed(api: Api, dag_ids: list[str], timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    for dag_id in dag_ids:
        while True:
            try:
                api.call("GET", f"/api/v2/dags/{dag_id}")
                break
            except SystemExit:
                if time.time() > deadline:
                    raise
                time.sleep(2)


def set_paused(api: Api, dag_id: str, paused: bool) -> None:
    api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})


def trigger(api: Api, dag_id: str, prefix: str, conf: dict) -> str:
    # A logical date lets `airflow tasks clear -s/-e` (docs/how-to/airflow.md, Backfill) find the run.
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    run_id = f"{prefix}__{now:%Y%m%dT%H%M%S}"
    api.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
             {"dag_run_id": run_id, "logical_date": now.isoformat(), "conf": conf})
    return run_id


def tasks(api: Api, dag_id: str, run_id: str) -> list[dict]:
    data = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
                           f"/taskInstances")
    return data["task_instances"]


ENDED = ("success", "failed", "upstream_failed", "skipped", "removed")


def report_ended(api: Api, dag_id: str, run_id: str, seen: dict[str, str]) -> dict[str, str]:
    """Print each task of the run that ended since the last call; every task's state."""
    states = {}
    for ti in tasks(api, dag_id, run_id):
        states[ti["task_id"]] = ti["state"]
        if seen.get(ti["task_id"]) != ti["state"] and ti["state"] in ENDED:
            dur = ti.get("duration")
            print(f"  {dag_id}.{ti['task_id']:<26} {ti['state']:<8} "
                  f"{'' if dur is None else f'{dur:8.1f} s'}", flush=True)
        seen[ti["task_id"]] = ti["state"]
    return states


WAITS_EVERY_S = 30.0  # how often the pool is looked at for tasks short of slots
_SAID: dict[str, dict[str, str]] = {}  # run id -> task -> the wait last said


def explain_waits(api: Api, dag_id: str, run_id: str, said: dict[str, str]) -> None:
    """Each task of the run that waits "scheduled" for pool slots, with an empty log: say
    which pool, how many slots are open and which tasks hold them, here and as the task's
    note in the UI (amflow.orchestration.pools.waiting_note); said once per change."""
    from amflow.orchestration.pools import waiting_note

    waiting = [t for t in tasks(api, dag_id, run_id) if t["state"] == "scheduled"]
    if not waiting:
        return
    holding = api.call("GET", "/api/v2/dags/~/dagRuns/~/taskInstances?state=running"
                              "&state=deferred&state=queued&limit=1000")["task_instances"]
    pools: dict[str, dict] = {}
    for ti in waiting:
        name = ti.get("pool") or "default_pool"
        pool = pools.setdefault(name, api.call("GET", f"/api/v2/pools/{quote(name)}"))
        note = waiting_note(ti, pool, holding)
        if note and said.get(ti["task_id"]) != note:
            print(f"  {dag_id}.{ti['task_id']:<26} {note}", flush=True)
            api.call("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
                              f"/taskInstances/{ti['task_id']}?update_mask=note",
                     {"note": note[:1000]})
        said[ti["task_id"]] = note


def wait(api: Api, dag_id: str, run_id: str, seen: dict[str, str], every_s: float = 2,
         task_id: str | None = None) -> str:
    """Wait for the run (or, with task_id, that task of it) to end; return its state.
    A task short of pool slots is said to be (explain_waits)."""
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
    said = _SAID.setdefault(run_id, {})
    looked = 0.0
    while True:
        if time.time() - looked >= WAITS_EVERY_S:
            looked = time.time()
            try:
                explain_waits(api, dag_id, run_id, said)
            except SystemExit as exc:  # a look at the pool failed: the run goes on
                print(f"  (could not tell which tasks wait for pool slots: {exc})", flush=True)
        states = report_ended(api, dag_id, run_id, seen)
        run_state = api.call("GET", path)["state"]
        if task_id is not None and states.get(task_id) in ENDED:
            return states[task_id]
        if run_state in ("success", "failed"):
            report_ended(api, dag_id, run_id, seen)
            return states.get(task_id, "failed") if task_id else run_state
        time.sleep(every_s)


def failed_logs(api: Api, dag_id: str, run_id: str) -> None:
    for ti in tasks(api, dag_id, run_id):
        if ti["state"] != "failed":
            continue
        path = (f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                f"{ti['task_id']}/logs/{max(1, ti['try_number'])}?full_content=true")
        content = api.call("GET", path).get("content", [])
        lines = [c.get("event", "") if isinstance(c, dict) else str(c) for c in content]
        print(f"--- {ti['task_id']} (last lines of its log)", file=sys.stderr)
        print("\n".join(lines[-40:]), file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True)
    p.add_argument("--passwords", required=True, help="simple auth manager passwords file")
    p.add_argument("--pause", action="append", default=[],
                   help="DAGs to keep paused while this one runs (unpaused after)")
    p.add_argument("--unpause", action="append", default=[], help="DAGs to unpause at the end")
    p.add_argument("--then", nargs=3, metavar=("DAG", "PREFIX", "CONF"),
                   help="a second DAG to trigger once --after's task of the first succeeded")
    p.add_argument("--after", default="train", help="the first DAG's task --then waits for")
    p.add_argument("dag_id")
    p.add_argument("prefix", help="Airflow run id prefix (a timestamp is appended)")
    p.add_argument("conf", help="the run's conf, JSON")
    a = p.parse_args()
    api = Api(a.base, json.load(open(a.passwords))["admin"])
    wait_parsed(api, [a.dag_id, *a.pause, *a.unpause, *([a.then[0]] if a.then else [])])
    for dag_id in a.pause:
        set_paused(api, dag_id, True)
    runs: list[tuple[str, str, dict[str, str]]] = []
    try:
        runs.append(start(api, a.dag_id, a.prefix, a.conf))
        if a.then:
            dag_id, run_id, seen = runs[0]
            if wait(api, dag_id, run_id, seen, task_id=a.after) != "success":
                return finish(api, runs)
            # the first DAG's asset events found it paused and queued nothing: unpausing it
            # (start) now starts only the run triggered here
            runs.append(start(api, *a.then))
        return finish(api, runs)
    finally:
        # asset events of these runs found those DAGs paused and queued nothing: unpausing
        # them now starts no run, and leaves every DAG active for `make airflow`
        for dag_id in [*a.pause, *a.unpause]:
            set_paused(api, dag_id, False)


def start(api: Api, dag_id: str, prefix: str, conf: str) -> tuple[str, str, dict[str, str]]:
    set_paused(api, dag_id, False)
    run_id = trigger(api, dag_id, prefix, json.loads(conf))
    print(f"{dag_id}: run {run_id} triggered; task durations as Airflow shows them:", flush=True)
    return dag_id, run_id, {}


def finish(api: Api, runs: list[tuple[str, str, dict[str, str]]]) -> int:
    """Wait for every run; the failed ones' last log lines. 0 when all succeeded."""
    states = {run: wait(api, dag_id, run, seen) for dag_id, run, seen in runs}
    for dag_id, run, _ in runs:
        if states[run] != "success":
            failed_logs(api, dag_id, run)
            print(f"{dag_id} run {run} {states[run]}", file=sys.stderr)
    return 0 if all(s == "success" for s in states.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
