"""Helpers for the Airflow tests: an isolated AIRFLOW_HOME, a fake-step config, a
standalone server on a free port, and a small /api/v2 client."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
FAKE = ROOT / "tests" / "fake_amflow.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def airflow_env(home: Path, port: int | None = None, **extra: str) -> dict[str, str]:
    """Environment for airflow commands on a temp AIRFLOW_HOME with our dags folder."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AMFLOW_RUNNER_STATE": str(home / "amflow_jobs"),
        "OMP_NUM_THREADS": "1",
        # this checkout's amflow in the tasks, whatever checkout the venv's editable
        # install points at (a git worktree shares the main checkout's venv)
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    })
    if port is not None:
        env.update({
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://localhost:{port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
        })
    env.update(extra)
    return env


def sqlite_settings(home: Path) -> dict[str, str]:
    """The metadata database of a test Airflow (SQLite) and its clients, made to hold up
    on a loaded machine.

    - No connection pool: every session opens its own connection and closes it. A pooled
      connection that went back to the pool with a statement not read to its end (e.g.
      one held by the traceback of a 'database is locked' error) keeps its read
      transaction, and in WAL mode every later request on it reads the database as it was
      then: a backfill or DAG run the API has just created answers 404, and writes through
      it fail ('database is locked' -> 500 "Database error"). That is how make test failed
      on 2026-11-29 (GET /api/v2/backfills/3 -> 404 right after its POST answered 3, then
      the next tests' new runs 404 and their PATCHes 500).
    - Workers wait 30 s, not 5, for the execution API: a task whose start call times out
      is killed (SIGKILL) and fails its try. SQLite's own busy timeout stays at 5 s (a run
      with 30 s, at load 25, saw a POST /api/v2/backfills take over 60 s and a task's
      start call time out: waits chain up behind the lock instead of failing fast).
    """
    return {"AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_ENABLED": "False",
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30"}


def fake_config(dir: Path, plan: dict | None = None, **runner) -> Path:
    """A config whose steps are tests/fake_amflow.py, storage under `dir`."""
    dir.mkdir(parents=True, exist_ok=True)
    plan_path = dir / "plan.json"
    plan_path.write_text(json.dumps(plan or {}))
    cfg = {
        "storage": {"root": str(dir / "store")},
        "data": {"corpus": str(dir / "store" / "corpus")},
        "runner": {"mode": "local", "command": [sys.executable, str(FAKE)], "poll_s": 1,
                   "max_wait_per_try_s": 30, "state_dir": str(dir / "jobs"),
                   "env": {"AMFLOW_FAKE_PLAN": str(plan_path)}, **runner},
    }
    path = dir / "cfg.yaml"
    path.write_text(json.dumps(cfg))
    return path


def calls(store: Path, run_id: str) -> list[dict]:
    path = store / "runs" / run_id / "_calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class Standalone:
    """`airflow standalone` in its own process group, answering on a free port."""

    def __init__(self, home: Path, **extra_env: str):
        self.home = home
        self.password = secrets.token_urlsafe(12)
        self.pw_file = home / "passwords.json"
        home.mkdir(parents=True, exist_ok=True)
        self.pw_file.write_text(json.dumps({"admin": self.password}))
        self.extra_env = extra_env
        self._use_port(free_port())
        self.log = home / "standalone.log"
        self.proc: subprocess.Popen | None = None
        self._token: str | None = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.base = f"http://localhost:{port}"
        self.env = airflow_env(self.home, port, **{
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.pw_file),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # the task log servers too: another Airflow on this machine (an engineer's
            # `make airflow`) holds 8793 / 8794, and the triggerer cannot bind
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            **sqlite_settings(self.home),
            **self.extra_env})

    def start(self, timeout: float = 180, tries: int = 3) -> "Standalone":
        """Start and wait until the API answers and the DAGs are parsed. The API server
        binds its port ~20 s after start: a port another process took meanwhile (make
        test runs a second pytest beside this one) means a new port and a new start."""
        for _ in range(tries):
            if self._start(timeout):
                return self
            self.stop()
            self._use_port(free_port())
        raise RuntimeError(f"airflow standalone found its port taken {tries} times:\n"
                           + self.log.read_text()[-4000:])

    def _start(self, timeout: float) -> bool:
        """True once up; False when the API server could not bind its port."""
        self.proc = subprocess.Popen(["airflow", "standalone"], env=self.env, cwd=ROOT,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("airflow standalone exited:\n" + self.log.read_text()[-4000:])
            if "error while attempting to bind" in self.log.read_text():
                return False
            try:
                urllib.request.urlopen(f"{self.base}/api/v2/version", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        else:
            self.stop()
            raise RuntimeError("airflow standalone did not answer:\n"
                               + self.log.read_text()[-4000:])
        # The DAGs are parsed by the dag-processor shortly after start.
        self.wait(lambda: self.get("/api/v2/dags/ssl_student", ok=(200, 404)).get("dag_id"),
                  timeout=timeout, what="ssl_student parsed")
        return True

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None

    # -- REST
    def token(self) -> str:
        if self._token is None:
            req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                         data=json.dumps({"username": "admin",
                                                          "password": self.password}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                self._token = json.load(r)["access_token"]
        return self._token

    def request(self, method: str, path: str, body=None, ok=(200,), raw: bool = False,
                timeout: float = 120):
        """One /api/v2 call; answers Airflow gives when SQLite was locked (a 503 "Database
        is locked", a 500 "Database error": the request's transaction was rolled back)
        are asked again for LOCKED_RETRY_S, unless the caller takes them (`ok`)."""
        deadline = time.time() + LOCKED_RETRY_S
        while True:
            status, data = self._send(method, path, body, timeout)
            if status in ok or not _locked(status, data) or time.time() > deadline:
                break
            time.sleep(2)
        if status not in ok:
            raise AssertionError(f"{method} {path} -> {status}: {data[:2000]!r}")
        if raw:
            return data.decode()
        return json.loads(data) if data else {}

    def _send(self, method: str, path: str, body, timeout: float) -> tuple[int, bytes]:
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.token()}",
                                              "Content-Type": "application/json",
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def wait(self, fn, timeout: float, what: str, every: float = 2.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = fn()
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out waiting for {what}; scheduler log tail:\n"
                             + self.scheduler_tail())

    def scheduler_tail(self, chars: int = 4000) -> str:
        """The log's last scheduler lines: the API server's access lines and the DAG
        processor's re-parsing otherwise fill any tail."""
        lines = [ln for ln in self.log.read_text().splitlines()
                 if not ln.startswith(("api-server", "dag-processor"))]
        return "\n".join(lines)[-chars:]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.get(f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 240) -> str:
        def finished():
            state = self.run_state(dag_id, run_id)
            return state if state in ("success", "failed") else None
        return self.wait(finished, timeout, f"{dag_id} {run_id} to finish")

    def settle(self, dag_id: str, run_id: str, quiet_s: float = 8.0,
               timeout: float = 240) -> str:
        """The run's final state, once it has been final for `quiet_s`. A task's state
        turns success (execution API) a few seconds before its worker exits and the
        scheduler takes the executor event; Airflow 3.3 can lose a clear issued in that
        window or while the scheduler is marking the run finished: the run stays
        "success" and nothing re-runs (two CI failures, 2026-11-25 and 2026-11-26: the
        scheduler logged the run successful 40 ms before the clear request and the last
        task's executor event 4 s after it)."""
        state = self.wait_run(dag_id, run_id, timeout)
        time.sleep(quiet_s)
        return state

    def clear_taken(self, issue, dag_id: str, run_id: str, task: str,
                    within: float = 45.0) -> None:
        """Run `issue()` (a clear of `task`) and wait until the task moves (a new try, or
        no longer success); a clear that shows no effect after `within` seconds (the race
        `settle` avoids) is issued once more, as a user would who sees nothing happen."""
        before = self.task_instances(dag_id, run_id)[task]["try_number"]

        def moved() -> bool:
            ti = self.task_instances(dag_id, run_id)[task]
            return ti["try_number"] > before or ti["state"] != "success"
        issue()
        try:
            self.wait(moved, within, f"the clear of {task} to take effect")
        except AssertionError:
            issue()

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """A try's whole log as text: the "event" of each structured record (a record
        without one as its JSON), one a line."""
        data = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/"
                        f"{task_id}/logs/{try_number}?full_content=true")
        content = data.get("content", data)
        if not isinstance(content, list):
            return str(content)
        return "\n".join((c["event"] if "event" in c else json.dumps(c))
                         if isinstance(c, dict) else str(c) for c in content)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        data = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances")
        return {t["task_id"]: t for t in data["task_instances"]}


LOCKED_RETRY_S = 90


def _locked(status: int, data: bytes) -> bool:
    """An answer of Airflow's API to a request that met SQLite's lock."""
    text = data.lower()
    return (status == 503 and b"database is locked" in text) or \
        (status == 500 and b"database error" in text)


def _q(run_id: str) -> str:
    from urllib.parse import quote

    return quote(run_id, safe="")


_SHARED: Standalone | None = None
TOKEN_LIFETIME_S = 20


def shared_standalone(tmp_root: Path) -> Standalone:
    """One standalone per pytest process, shared by the Airflow test modules (it costs
    ~30 s to start on 2 cores). The execution-API token lifetime is short on purpose."""
    global _SHARED
    if _SHARED is None or _SHARED.proc is None or _SHARED.proc.poll() is not None:
        import atexit

        server = Standalone(tmp_root / "airflow_home",
                            AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME=str(TOKEN_LIFETIME_S))
        server.start()
        atexit.register(server.stop)
        _SHARED = server
    return _SHARED
