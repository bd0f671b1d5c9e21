"""Run one DAG for `make demo` on the Airflow that scripts/demo.sh started, like a user
would: trigger it over the REST API with a conf, wait for it, print each task's duration.

The run is an ordinary scheduled run (LocalExecutor + triggerer): its task logs land in
$AIRFLOW_HOME/logs and its durations are the steps' wall times, as for any run that
`make airflow` shows later.

    python scripts/demo_dags.py --base http://localhost:PORT --passwords FILE \
        DAG RUN_ID_PREFIX CONF_JSON [--pause OTHER_DAG] [--unpause DAG ...]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote


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
    # A logical date lets `airflow tasks clear -s/-e` (infra/README.md §4) find the run.
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    run_id = f"{prefix}__{now:%Y%m%dT%H%M%S}"
    api.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
             {"dag_run_id": run_id, "logical_date": now.isoformat(), "conf": conf})
    return run_id


def tasks(api: Api, dag_id: str, run_id: str) -> list[dict]:
    data = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
                           f"/taskInstances")
    return data["task_instances"]


def wait(api: Api, dag_id: str, run_id: str, every_s: float = 10) -> str:
    seen: dict[str, str] = {}
    while True:
        state = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")["state"]
        for ti in tasks(api, dag_id, run_id):
            if seen.get(ti["task_id"]) != ti["state"] and ti["state"] in ("success", "failed",
                                                                          "skipped"):
                dur = ti.get("duration")
                print(f"  {ti['task_id']:<18} {ti['state']:<8} "
                      f"{'' if dur is None else f'{dur:8.1f} s'}", flush=True)
            seen[ti["task_id"]] = ti["state"]
        if state in ("success", "failed"):
            return state
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
    p.add_argument("dag_id")
    p.add_argument("prefix", help="Airflow run id prefix (a timestamp is appended)")
    p.add_argument("conf", help="the run's conf, JSON")
    a = p.parse_args()
    api = Api(a.base, json.load(open(a.passwords))["admin"])
    wait_parsed(api, [a.dag_id, *a.pause, *a.unpause])
    for dag_id in a.pause:
        set_paused(api, dag_id, True)
    try:
        set_paused(api, a.dag_id, False)
        run_id = trigger(api, a.dag_id, a.prefix, json.loads(a.conf))
        print(f"{a.dag_id}: run {run_id} triggered; task durations as Airflow shows them:",
              flush=True)
        state = wait(api, a.dag_id, run_id)
    finally:
        # asset events of this run found those DAGs paused and queued nothing: unpausing
        # them now starts no run, and leaves every DAG active for `make airflow`
        for dag_id in [*a.pause, *a.unpause]:
            set_paused(api, dag_id, False)
    if state != "success":
        failed_logs(api, a.dag_id, run_id)
        print(f"{a.dag_id} run {run_id} {state}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
