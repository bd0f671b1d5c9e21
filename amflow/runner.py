"""Run one amflow step for an orchestrator: as a local subprocess or as a Ray job.

The command is the same everywhere: `amflow <step> --config FILE --run-id ID [--set k=v]`.
Only where it runs changes, chosen by `runner.mode`:

- `local`: a detached process on this machine (its own session), supervised by
  `python -m amflow.runner _supervise`, which keeps its exit code and output in a job
  directory under `runner.state_dir`. The job outlives the process that started it.
- `ray_job`: a Ray job submitted through `ray.job_submission.JobSubmissionClient` to
  `runner.ray_dashboard`; the driver is placed on the step's pool by
  `ray.step_resources[step]` (as `entrypoint_resources`).

Jobs are named by a stable id (dag, run, task, try), so a caller that dies and comes back
re-attaches to its job instead of starting a second one; `submit` of an id that exists
is a no-op. `follow` streams new output lines and returns after a time budget, so a
caller can poll in short tries (an Airflow task reschedules itself between pokes, which
keeps every try well inside the execution-API token lifetime; the pause between tries,
`runner.reschedule_s`, must exceed the executor's event latency). `stop` ends a job.

The last stdout line of a step is `AMFLOW_SUMMARY <json>`; `parse_summary` reads it.

`AirflowStep` is the glue an Airflow operator calls (imported only at task run time);
the command line (`python -m amflow.runner run|stop|status`) runs a step in the foreground
with the same machinery, and stops its job on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SUMMARY_PREFIX = "AMFLOW_SUMMARY "
PROJECT_ROOT = Path(__file__).resolve().parents[1]

PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED = "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"
TERMINAL = (SUCCEEDED, FAILED, STOPPED)

Emit = Callable[[str], None]


class RunnerError(RuntimeError):
    """A job could not be submitted, followed or stopped."""


# ----------------------------------------------------------------------------- naming

def _slug(text: str, limit: int) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:limit].rstrip("-.") or "x"


def amflow_run_id(dag_id: str, airflow_run_id: str) -> str:
    """The amflow `--run-id` of an Airflow DAG run: stable across retries and clears.

    Readable (dag id + the Airflow run id, made path-safe) and unique (a short hash of
    both, so two Airflow run ids that slug alike never share outputs).
    """
    digest = hashlib.sha1(f"{dag_id}\0{airflow_run_id}".encode()).hexdigest()[:8]
    return f"{_slug(dag_id, 40)}__{_slug(airflow_run_id, 60)}__{digest}"


def job_prefix(dag_id: str, airflow_run_id: str, task_id: str) -> str:
    """What the job ids of every try of one task of one DAG run start with."""
    digest = hashlib.sha1(f"{dag_id}\0{airflow_run_id}\0{task_id}".encode()).hexdigest()[:10]
    return f"amflow-{_slug(dag_id, 24)}-{_slug(task_id, 24)}-{digest}-try"


def job_id(dag_id: str, airflow_run_id: str, task_id: str, try_number: int) -> str:
    """The submission id of one try of one task: a retry gets a new id, a re-poke the same."""
    return f"{job_prefix(dag_id, airflow_run_id, task_id)}{int(try_number)}"


def step_command(command: list[str], step: str, *, config: str | None, run_id: str | None,
                 overrides: list[str] = (), extra_args: list[str] = (),
                 force: bool = False) -> list[str]:
    argv = [*command, step]
    if config:
        argv += ["--config", str(config)]
    if run_id:
        argv += ["--run-id", run_id]
    for item in overrides:
        argv += ["--set", item]
    if force:
        argv.append("--force")
    return argv + list(extra_args)


def parse_summary(text: str) -> dict[str, Any] | None:
    """The JSON of the last `AMFLOW_SUMMARY ` line in a step's output, if any."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(SUMMARY_PREFIX):
            try:
                return json.loads(line[len(SUMMARY_PREFIX):])
            except json.JSONDecodeError:
                return None
    return None


def default_state_dir() -> Path:
    if env := os.environ.get("AMFLOW_RUNNER_STATE"):
        return Path(env)
    if home := os.environ.get("AIRFLOW_HOME"):
        return Path(home) / "amflow_jobs"
    return Path.home() / ".cache" / "amflow" / "jobs"


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


# ----------------------------------------------------------------------------- backends

class LocalBackend:
    """Detached supervised processes; state in `<state_dir>/<job_id>/`.

    job.json (argv, cwd, pid, submitted_at), output.log (stdout+stderr), rc.json (exit
    code, written last by the supervisor; its presence means the job is over).
    """

    mode = "local"

    def __init__(self, state_dir: Path, cwd: str | None = None,
                 env: dict[str, str] | None = None):
        self.state_dir = Path(state_dir)
        self.cwd = cwd or str(PROJECT_ROOT)
        self.env = env or {}
        self._procs: dict[str, subprocess.Popen] = {}

    def _dir(self, jid: str) -> Path:
        return self.state_dir / jid

    def exists(self, jid: str) -> bool:
        return (self._dir(jid) / "job.json").exists()

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        d = self._dir(jid)
        d.mkdir(parents=True, exist_ok=True)
        try:  # the lock file makes submission of one id happen once, even under races
            fd = os.open(d / "submit.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        out = open(d / "output.log", "ab")
        sup = [sys.executable, "-m", "amflow.runner", "_supervise", "--job-dir", str(d), "--",
               *argv]
        proc = subprocess.Popen(sup, cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self._procs[jid] = proc
        _write_json(d / "job.json", {"argv": argv, "cwd": self.cwd, "pid": proc.pid,
                                     "pgid": proc.pid, "submitted_at": time.time()})
        return True

    def _alive(self, jid: str, pid: int) -> bool:
        proc = self._procs.get(jid)
        if proc is not None:
            return proc.poll() is None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, IndexError, PermissionError):
            try:
                os.kill(pid, 0)
                return True
            except OSError:
                return False

    def status(self, jid: str) -> str:
        d = self._dir(jid)
        rc = _read_json(d / "rc.json")
        if rc is not None:
            if rc.get("stopped"):
                return STOPPED
            return SUCCEEDED if rc.get("rc") == 0 else FAILED
        job = _read_json(d / "job.json")
        if job is None:
            if (d / "submit.lock").exists():
                return PENDING
            raise RunnerError(f"no local job {jid} under {self.state_dir}")
        if self._alive(jid, job["pid"]):
            return RUNNING
        # The supervisor died without writing its exit code (SIGKILL, reboot).
        rc = _read_json(d / "rc.json")
        if rc is not None:
            return self.status(jid)
        return FAILED

    def logs(self, jid: str, offset: int = 0, whole_lines: bool = True) -> tuple[str, int]:
        """Output from `offset` on, and the next offset. While the job runs only whole
        lines are handed out (a partial last line waits for the next read)."""
        try:
            with open(self._dir(jid) / "output.log", "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return "", offset
        end = data.rfind(b"\n") + 1 if whole_lines else len(data)
        return data[:end].decode("utf-8", "replace"), offset + end

    def final_logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        return self.logs(jid, offset, whole_lines=False)

    def stop(self, jid: str, grace_s: float = 10.0) -> bool:
        job = _read_json(self._dir(jid) / "job.json")
        if job is None or self.status(jid) in TERMINAL:
            return False
        pgid = job.get("pgid", job["pid"])
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.status(jid) not in TERMINAL:
            time.sleep(0.1)
        if self.status(jid) not in TERMINAL:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _write_json(self._dir(jid) / "rc.json", {"rc": -9, "stopped": True,
                                                    "finished_at": time.time()})
        return True

    def submitted_at(self, jid: str) -> float | None:
        job = _read_json(self._dir(jid) / "job.json")
        return job.get("submitted_at") if job else None

    def live_jobs(self, prefix: str) -> list[str]:
        """Ids starting with `prefix` whose job has not ended."""
        if not self.state_dir.is_dir():
            return []
        ids = sorted(d.name for d in self.state_dir.iterdir()
                     if d.name.startswith(prefix) and (d / "job.json").exists())
        return [jid for jid in ids if self.status(jid) not in TERMINAL]


class RayJobBackend:
    """Ray jobs through the dashboard's job-submission API."""

    mode = "ray_job"

    def __init__(self, address: str, cwd: str | None = None, env: dict[str, str] | None = None):
        from ray.job_submission import JobSubmissionClient

        self.address = address
        self.cwd = cwd
        self.env = env or {}
        self.client = JobSubmissionClient(address)

    def exists(self, jid: str) -> bool:
        try:
            self.client.get_job_info(jid)
            return True
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc) or "not found" in str(exc).lower():
                return False
            raise

    def entrypoint(self, argv: list[str]) -> str:
        cmd = shlex.join(argv)
        return f"cd {shlex.quote(self.cwd)} && {cmd}" if self.cwd else cmd

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        if self.exists(jid):
            return False
        env = {"PYTHONUNBUFFERED": "1", **self.env}
        try:
            self.client.submit_job(entrypoint=self.entrypoint(argv), submission_id=jid,
                                   runtime_env={"env_vars": env},
                                   entrypoint_resources=resources or None,
                                   metadata={"amflow_job": jid})
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return False
            raise
        return True

    def status(self, jid: str) -> str:
        return str(self.client.get_job_status(jid))

    def logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        text = self.client.get_job_logs(jid)
        new = text[offset:]
        end = new.rfind("\n") + 1
        return new[:end], offset + end

    def final_logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        text = self.client.get_job_logs(jid)
        return text[offset:], len(text)

    def stop(self, jid: str, grace_s: float = 30.0) -> bool:
        try:
            if self.status(jid) in TERMINAL:
                return False
            stopped = self.client.stop_job(jid)
        except RuntimeError:
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.status(jid) not in TERMINAL:
            time.sleep(0.5)
        return stopped

    def submitted_at(self, jid: str) -> float | None:
        info = self.client.get_job_info(jid)
        return info.start_time / 1000.0 if info.start_time else None

    def live_jobs(self, prefix: str) -> list[str]:
        """Ids starting with `prefix` whose job has not ended."""
        return sorted(j.submission_id for j in self.client.list_jobs()
                      if (j.submission_id or "").startswith(prefix)
                      and str(j.status) not in TERMINAL)


def make_backend(cfg, state_dir: Path | None = None):
    r = cfg.runner
    if r.mode == "ray_job":
        return RayJobBackend(r.ray_dashboard, cwd=r.workdir or None, env=dict(r.env))
    return LocalBackend(state_dir or Path(r.state_dir or default_state_dir()),
                        cwd=r.workdir or str(PROJECT_ROOT), env=dict(r.env))


# ----------------------------------------------------------------------------- following

@dataclass
class Outcome:
    job_id: str
    status: str  # RUNNING while the budget ran out first, else terminal
    submitted: bool  # this call started the job (False: re-attached)
    summary: dict[str, Any] | None = None
    tail: list[str] = field(default_factory=list)  # last output lines, for error messages
    pokes: int = 1

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED and self.summary is not None


FIRST_POLL_S = 0.2
POLL_SHARE = 0.1


def next_poll_s(elapsed_s: float, poll_s: float) -> float:
    """The pause before the next status check of a job followed for `elapsed_s`.

    A tenth of the time followed so far, at least FIRST_POLL_S and at most `poll_s`: a job
    that ends is seen within 10 % of its run time (0.2 s for a 1-s step, where a fixed 5-s
    poll would double it), while a long one is polled every `poll_s` as before (about 7
    extra status checks per doubling of the time until then).
    """
    return min(poll_s, max(FIRST_POLL_S, POLL_SHARE * elapsed_s))


class StepRunner:
    """Submit-or-attach, stream output, poll until done or out of budget."""

    def __init__(self, backend, state_dir: Path, poll_s: float = 5.0, emit: Emit | None = None):
        self.backend = backend
        self.state_dir = Path(state_dir)
        self.poll_s = poll_s
        self.emit = emit or (lambda line: print(line, flush=True))

    def _cursor_path(self, jid: str) -> Path:
        d = self.state_dir / jid
        d.mkdir(parents=True, exist_ok=True)
        return d / "cursor.json"

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        started = self.backend.submit(jid, argv, resources)
        where = getattr(self.backend, "address", None) or "this machine"
        if started:
            self.emit(f"[amflow-runner] started {self.backend.mode} job {jid} on {where}: "
                      f"{shlex.join(argv)}")
        else:
            self.emit(f"[amflow-runner] re-attached to {self.backend.mode} job {jid} "
                      f"(status {self.backend.status(jid)})")
        return started

    def follow(self, jid: str, budget_s: float, prefix: str = "") -> Outcome:
        """Stream new output lines until the job ends or `budget_s` runs out."""
        cpath = self._cursor_path(jid)
        state = _read_json(cpath, {"offset": 0, "pokes": 0, "tail": []})
        state["pokes"] += 1
        tail: list[str] = state.get("tail", [])
        t0 = time.monotonic()
        deadline = t0 + budget_s

        def pump(final: bool) -> None:
            read = self.backend.final_logs if final else self.backend.logs
            text, state["offset"] = read(jid, state["offset"])
            for line in text.splitlines():
                self.emit(prefix + line)
                tail.append(line)
            del tail[:-200]
            state["tail"] = tail
            _write_json(cpath, state)

        pumped = float("-inf")
        while True:
            status = self.backend.status(jid)
            if status in TERMINAL:
                pump(final=True)
                break
            now = time.monotonic()
            # output every poll_s as before: the extra checks of a short start are a status
            # read each (a Ray job's log is one more request to the head and the node)
            if now - pumped >= self.poll_s or now >= deadline:
                pump(final=False)
                pumped = now
            if now >= deadline:
                break
            time.sleep(min(next_poll_s(now - t0, self.poll_s), max(0.05, deadline - now)))
        summary = parse_summary("\n".join(tail)) if status == SUCCEEDED else None
        if status == SUCCEEDED and summary is None:
            # The summary line may have scrolled out of the tail: read the whole log once.
            full, _ = self.backend.final_logs(jid, 0)
            summary = parse_summary(full)
        return Outcome(jid, status, submitted=False, summary=summary, tail=tail[-40:],
                       pokes=state["pokes"])

    def run(self, jid: str, argv: list[str], budget_s: float,
            resources: dict[str, float] | None = None, prefix: str = "") -> Outcome:
        started = self.submit(jid, argv, resources)
        out = self.follow(jid, budget_s, prefix=prefix)
        out.submitted = started
        return out

    def stop(self, jid: str) -> bool:
        stopped = self.backend.stop(jid)
        self.emit(f"[amflow-runner] {'stopped' if stopped else 'nothing to stop for'} job {jid}")
        return stopped


# ----------------------------------------------------------------------------- Airflow glue

def _token_lifetime_s() -> float | None:
    """The execution-API JWT lifetime ([execution_api] jwt_expiration_time), if known."""
    try:
        from airflow.sdk.configuration import conf  # task SDK (worker side)
    except ImportError:  # pragma: no cover - older layouts
        try:
            from airflow.configuration import conf
        except ImportError:
            return None
    try:
        return float(conf.getint("execution_api", "jwt_expiration_time"))
    except Exception:  # noqa: BLE001 - an unreadable setting just means "no cap"
        return None


def try_budget_s(max_wait_per_try_s: float, poll_s: float) -> float:
    """How long one Airflow try follows its job: at most half the token lifetime."""
    budget = max_wait_per_try_s
    lifetime = _token_lifetime_s()
    if lifetime:
        budget = min(budget, lifetime / 2.0)
    return max(budget, poll_s)


def model_uri(summary: dict[str, Any]) -> str:
    """Where a train step put its model, from its summary."""
    for key in ("model_uri", "model"):
        if isinstance(summary.get(key), str) and summary[key]:
            return summary[key]
    for key in ("outputs", "metrics"):
        sub = summary.get(key) or {}
        if isinstance(sub, dict) and isinstance(sub.get("model"), str):
            return sub["model"]
    base = summary.get("uri", "")
    return f"{base.rstrip('/')}/model.pt" if base else ""


def _resolve_config(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else PROJECT_ROOT / p


def metrics_line(step: str, summary: dict[str, Any]) -> str:
    counts = summary.get("counts", {})
    metrics = summary.get("metrics", {})
    flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool))}
    return (f"[amflow {step}] done in {summary.get('wall_s', '?')} s: counts "
            f"{json.dumps(counts, sort_keys=True)} metrics {json.dumps(flat, sort_keys=True)}")


# What a step's bare `per_condition` holds: evaluate's is frame accuracy, decode's WER.
PER_CONDITION_NAME = {"evaluate": "frame_accuracy", "decode": "wer"}


def flat_results(metrics: dict[str, Any], step: str = "evaluate") -> dict[str, Any]:
    """An evaluation's (or decoding's) results as flat `name` / `name_<condition>` keys,
    rounded, for an asset event's extra: `frame_accuracy`, `frame_accuracy_DP1`, `per_DP1`,
    `wer_DP1`, ... (`per_condition_<m>` holds metric m per condition)."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            name = (PER_CONDITION_NAME.get(step, "per_condition") if key == "per_condition"
                    else key.removeprefix("per_condition_"))
            for cond, v in sorted(value.items()):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[f"{name}_{cond}"] = round(float(v), 4)
        elif isinstance(value, float):
            out[key] = round(value, 4)
        elif isinstance(value, (int, str, bool)):
            out[key] = value
    return out


# Steps whose output dir takes another step's tag: sequence[-<train.tag>].
TAG_KEY = {"sequence": "train.tag"}


def _step_dir_name(step: str, overrides: list[str]) -> str:
    tag = ""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() == TAG_KEY.get(step, f"{step}.tag"):
            tag = value.strip()
    return f"{step}-{tag}" if tag else step


# Cores in Airflow's pool. On one machine (runner.mode local) the DAGs' steps share its
# cores, and Airflow's `default_pool` (the only pool every Airflow has: a task in a missing
# pool waits forever, silently) counts them in quarters: scripts/airflow_env.sh sizes it
# to pool_size(cores), deferred tasks included (a step runs while its task is deferred).
# A step that computes takes a core per torch thread (train, sequence: threads x
# workers) or one core (features, targets); a light step (I/O, short scoring) a quarter.
# So the teacher's 2-thread training holds both cores alone (the baseline waits, not
# both at half speed), yet a light step fits beside it; on a cluster the pool is large.
POOL_SLOTS_PER_CORE = 4
POOL_LIGHT_SLOTS = 2  # light steps that may run beside steps holding every core
LIGHT_STEPS = frozenset({"select", "lm", "repartition", "evaluate", "decode", "graph",
                         "simulate", "report"})


def pool_size(cores: int) -> int:
    """default_pool's slots for a machine of `cores` cores."""
    return POOL_SLOTS_PER_CORE * max(int(cores), 1) + POOL_LIGHT_SLOTS


def pool_slots(step: str, config: Path | str, overrides: list[str]) -> int:
    """The pool slots of `amflow <step>` with these overrides (see POOL_SLOTS_PER_CORE)."""
    if step in LIGHT_STEPS:
        return 1
    cores = 1
    if step in ("train", "sequence"):
        from amflow.config import load_config

        sets = [*overrides, "train.recipe=sequence"] if step == "sequence" else overrides
        tc = load_config(config, sets).train
        cores = max(tc.threads, 1) * max(tc.workers, 1)
    return POOL_SLOTS_PER_CORE * cores


@dataclass
class AirflowStep:
    """What one Airflow task needs to run its step (built by the operator in dags/)."""

    step: str
    dag_id: str
    airflow_run_id: str
    task_id: str
    try_number: int
    config: str
    overrides: list[str]
    extra_args: list[str] = field(default_factory=list)
    rerun: str = "redo"  # redo | resume: what a cleared task does with a finished step
    run_id: str = ""
    emit: Emit | None = None
    redone: bool = False  # this try re-ran a step that had finished (--force)

    def __post_init__(self) -> None:
        from amflow.config import load_config

        self.run_id = self.run_id or amflow_run_id(self.dag_id, self.airflow_run_id)
        self.cfg = load_config(_resolve_config(self.config), self.overrides)
        r = self.cfg.runner
        self.state_dir = Path(r.state_dir or default_state_dir())
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.backend = make_backend(self.cfg, self.state_dir)
        self.runner = StepRunner(self.backend, self.state_dir, poll_s=r.poll_s, emit=self.emit)
        self.job_id = job_id(self.dag_id, self.airflow_run_id, self.task_id, self.try_number)

    def _already_finished(self) -> bool:
        """Whether this run's step published `_SUCCESS.json` before (a cleared task)."""
        from amflow.storage import Storage, join

        root = self.cfg.storage.root
        if "://" not in root and not os.path.isabs(root) and self.backend.mode == "local":
            root = os.path.join(self.backend.cwd, root)  # relative roots resolve where steps run
        uri = join(root, "runs", self.run_id, _step_dir_name(self.step, self.overrides),
                   "_SUCCESS.json")
        try:
            return Storage(self.cfg.storage).exists(uri)
        except Exception:  # noqa: BLE001 - unreadable storage: let the step decide
            return False

    def _adopt_running_previous_try(self) -> str | None:
        """A job of an earlier try of this task that still runs (its task died without
        stopping it): follow that one rather than start a duplicate."""
        for n in range(self.try_number - 1, 0, -1):
            jid = job_id(self.dag_id, self.airflow_run_id, self.task_id, n)
            try:
                if self.backend.exists(jid) and self.backend.status(jid) not in TERMINAL:
                    return jid
            except RunnerError:
                continue
        return None

    def start(self) -> bool:
        """Submit this try's job once, or attach to it (or to a still running job of an
        earlier try). Returns whether this call started it."""
        r = self.cfg.runner
        jid = self.job_id
        exists = self.backend.exists(jid)  # one round trip to the job API per question
        if not exists:
            previous = self._adopt_running_previous_try()
            if previous:
                self.runner.emit(f"[amflow-runner] try {self.try_number}: job {previous} of an "
                                 f"earlier try is still running; following it")
                self.job_id = jid = previous
                exists = True
        if exists:
            self.runner.emit(f"[amflow-runner] following job {jid} "
                             f"(status {self.backend.status(jid)})")
            return False
        self.redone = self.rerun == "redo" and self._already_finished()
        if self.redone:
            self.runner.emit(f"[amflow-runner] step {self.step} of run {self.run_id} finished "
                             f"before: redoing it (--force)")
        argv = step_command(r.command, self.step, config=self.config,
                            run_id=self.run_id if self.step != "corpus" else None,
                            overrides=self.overrides, extra_args=self.extra_args,
                            force=self.redone)
        resources = dict(self.cfg.ray.step_resources.get(self.step, {}))
        return self.runner.submit(jid, argv, resources)

    def poke(self) -> Outcome:
        """Submit (once) and follow for one try's budget."""
        r = self.cfg.runner
        budget = try_budget_s(r.max_wait_per_try_s, r.poll_s)
        started = self.start()
        jid = self.job_id
        outcome = self.runner.follow(jid, budget, prefix="")
        outcome.submitted = started
        if not outcome.done and r.step_timeout_s > 0:
            t0 = self.backend.submitted_at(jid)
            if t0 is not None and time.time() - t0 > r.step_timeout_s:
                self.runner.emit(f"[amflow-runner] step {self.step} exceeded runner.step_timeout_s="
                                 f"{r.step_timeout_s:g}; stopping job {jid}")
                self.runner.stop(jid)
                outcome.status = STOPPED
        return outcome

    def done(self) -> bool:
        return self.backend.status(self.job_id) in TERMINAL

    def drain(self) -> Outcome:
        """The ended job's output not yet in the task log, and its outcome."""
        return self.runner.follow(self.job_id, 0.0, prefix="")

    def trigger_kwargs(self) -> dict[str, Any]:
        """What the triggerer needs to wait for this job (see amflow.airflow_trigger)."""
        r = self.cfg.runner
        return {"job_id": self.job_id, "config": str(_resolve_config(self.config)),
                "overrides": list(self.overrides), "state_dir": str(self.state_dir),
                "poll_s": float(r.poll_s), "step_timeout_s": float(r.step_timeout_s)}

    def kill(self) -> None:
        for n in range(self.try_number, 0, -1):
            jid = job_id(self.dag_id, self.airflow_run_id, self.task_id, n)
            try:
                if self.backend.exists(jid) and self.backend.status(jid) not in TERMINAL:
                    self.runner.stop(jid)
            except RunnerError:
                continue


def permanent_error(step: str, lines: list[str]) -> str:
    """The reason a step failed for good, or "" when a retry may help.

    `amflow <step>` prints `amflow <step>: ...` for what no retry can fix: a config error
    (unknown key, bad value, missing config file; exit code 2) and a StepError (missing
    input, broken invariant). Anything else (a crash, a lost node, S3 throttling) is
    worth a retry, which resumes from the finished shards.
    """
    for line in reversed(lines):
        if line.startswith((f"amflow {step}: ", "amflow: error: ")):
            return line
    return ""


def _airflow_step(op, context) -> AirflowStep:
    from airflow.sdk.exceptions import AirflowFailException

    from amflow.config import ConfigError

    params = context["params"]
    ti = context["ti"]
    try:
        step = AirflowStep(step=op.step, dag_id=ti.dag_id,
                           airflow_run_id=context["dag_run"].run_id, task_id=ti.task_id,
                           try_number=ti.try_number,
                           config=str(params.get("config") or "configs/local.yaml"),
                           overrides=list(op.resolved_overrides(context)),
                           extra_args=list(op.resolved_extra_args(context)),
                           rerun=str(params.get("rerun", "redo")),
                           run_id=str(params.get("run_id") or ""),
                           emit=lambda line: op.log.info("%s", line))
    except ConfigError as exc:  # a retry reads the same config: fail now, with the reason
        op.log.error("amflow %s: %s (not retried: a retry would read the same config)",
                     op.step, exc)
        raise AirflowFailException(f"amflow {op.step}: {exc}") from exc
    op._amflow_step = step
    return step


def airflow_execute(op, context) -> dict[str, Any]:
    """The body of the amflow Airflow operator.

    `runner.wait: defer` (default): submit the job, follow it for `runner.defer_after_s`,
    then defer to AmflowJobTrigger until it ends; `airflow_complete` then finishes in the
    same try, so Airflow's duration is the step's. `runner.wait: reschedule`: one poke; raises AirflowRescheduleException to come
    back in `runner.reschedule_s` while the job still runs.
    Returns the step summary (the task's XCom) when the job succeeded.
    """
    from airflow.sdk.exceptions import AirflowRescheduleException

    step = _airflow_step(op, context)
    op.log.info("amflow run id %s, job %s, mode %s, wait %s", step.run_id, step.job_id,
                step.cfg.runner.mode, step.cfg.runner.wait)
    r = step.cfg.runner
    if r.wait == "defer":
        step.start()
        outcome = step.runner.follow(step.job_id, try_budget_s(r.defer_after_s, r.poll_s))
        _push_runner_xcom(context, step, outcome.status if outcome.done else "DEFERRED", 1)
        if not outcome.done:
            from amflow.airflow_trigger import AmflowJobTrigger

            op.defer(trigger=AmflowJobTrigger(**step.trigger_kwargs()),
                     method_name="execute_complete",
                     kwargs={"redone": step.redone})
        return _finish(op, context, step, outcome)
    outcome = step.poke()
    _push_runner_xcom(context, step, outcome.status, outcome.pokes)
    if not outcome.done:
        when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(
            seconds=step.cfg.runner.reschedule_s)
        op.log.info("[amflow-runner] job %s still %s after poke %d; next poke at %s",
                    outcome.job_id, outcome.status, outcome.pokes, when.isoformat())
        raise AirflowRescheduleException(when)
    return _finish(op, context, step, outcome)


def airflow_complete(op, context, event: dict[str, Any], redone: bool = False) -> dict[str, Any]:
    """After the trigger saw the job end: its output into the task log, then finish."""
    step = _airflow_step(op, context)
    step.job_id = str(event.get("job_id") or step.job_id)
    step.redone = redone
    outcome = step.drain()
    if event.get("reason"):
        op.log.info("[amflow-runner] %s", event["reason"])
        outcome.status = str(event.get("status") or outcome.status)
    _push_runner_xcom(context, step, outcome.status, outcome.pokes)
    return _finish(op, context, step, outcome)


def _push_runner_xcom(context, step: AirflowStep, status: str, pokes: int) -> None:
    context["ti"].xcom_push(key="runner", value={
        "job_id": step.job_id, "mode": step.cfg.runner.mode, "wait": step.cfg.runner.wait,
        "run_id": step.run_id, "pokes": pokes, "status": status})


def _finish(op, context, step: AirflowStep, outcome: Outcome) -> dict[str, Any]:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    if not outcome.ok:
        last = "\n".join(outcome.tail[-15:])
        reason = permanent_error(op.step, outcome.tail) if outcome.status == FAILED else ""
        what = (f"amflow {op.step} job {outcome.job_id} ended {outcome.status}"
                f"{' without an AMFLOW_SUMMARY line' if outcome.status == SUCCEEDED else ''}")
        if reason:  # a retry would fail the same way
            op.log.error("%s (not retried: a retry would fail the same way)", reason)
            raise AirflowFailException(f"{what}, not retried: {reason}\nlast output:\n{last}")
        raise AirflowException(f"{what}; last output:\n{last}")
    summary = outcome.summary
    op.log.info("%s", metrics_line(op.step, summary))
    if step.redone:
        later = sorted(context["task"].downstream_task_ids)
        if later:
            op.log.warning("[amflow-runner] step %s was redone: %s still show results of the "
                           "previous %s unless they were cleared with it (Clear -> Downstream)",
                           op.step, ", ".join(later), op.step)
    op.emit_asset_events(context, summary, step.run_id)
    return summary


def airflow_kill(op) -> None:
    step: AirflowStep | None = getattr(op, "_amflow_step", None)
    if step is not None:
        step.kill()


def stop_run_jobs(config: str, overrides: list[str], dag_id: str, airflow_run_id: str,
                  task_ids: list[str], emit: Emit | None = None) -> list[str]:
    """Stop the jobs of an ended DAG run that are still running; returns their ids.

    Once a run has ended every task is in a final state, so no task follows such a job:
    it is an orphan. One is left when a deferred task is marked failed (or success)
    before the triggerer has loaded its trigger: Airflow deletes that trigger unrun, so
    neither the trigger's nor the task's on_kill runs. The DAGs call this at run end.
    """
    from amflow.config import load_config

    cfg = load_config(_resolve_config(config), overrides)
    state_dir = Path(cfg.runner.state_dir or default_state_dir())
    runner = StepRunner(make_backend(cfg, state_dir), state_dir, emit=emit)
    stopped = []
    for task_id in task_ids:
        for jid in runner.backend.live_jobs(job_prefix(dag_id, airflow_run_id, task_id)):
            runner.emit(f"[amflow-runner] run {airflow_run_id} of {dag_id} has ended but job "
                        f"{jid} (task {task_id}) still runs: stopping it")
            runner.stop(jid)
            stopped.append(jid)
    return stopped


# ----------------------------------------------------------------------------- CLI

def _supervise(job_dir: Path, argv: list[str]) -> int:
    """Run argv, keep its exit code in rc.json; SIGTERM stops it and records 'stopped'."""
    stopping = {"flag": False}
    child = subprocess.Popen(argv)

    def on_term(signum, frame):  # noqa: ARG001
        stopping["flag"] = True
        try:
            child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    rc = child.wait()
    _write_json(job_dir / "rc.json", {"rc": rc, "stopped": stopping["flag"],
                                      "finished_at": time.time()})
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_supervise"]:
        p = argparse.ArgumentParser(prog="amflow.runner _supervise")
        p.add_argument("--job-dir", required=True)
        p.add_argument("cmd", nargs=argparse.REMAINDER)
        a = p.parse_args(argv[1:])
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        return _supervise(Path(a.job_dir), cmd)

    from amflow.config import load_config

    parser = argparse.ArgumentParser(
        prog="python -m amflow.runner",
        description="Run an amflow step where runner.mode says (local subprocess or Ray job), "
                    "streaming its output; SIGTERM/SIGINT stops the job.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a step to completion (submit or re-attach, follow)")
    run.add_argument("step")
    run.add_argument("--config", default="configs/local.yaml")
    run.add_argument("--run-id", required=True)
    run.add_argument("--job-id", help="submission id (default: amflow-cli-<step>-<run-id>)")
    run.add_argument("--set", dest="overrides", action="append", default=[])
    run.add_argument("--force", action="store_true")
    for name in ("stop", "status"):
        sp = sub.add_parser(name, help=f"{name} a job by id")
        sp.add_argument("job_id")
        sp.add_argument("--config", default="configs/local.yaml")
        sp.add_argument("--set", dest="overrides", action="append", default=[])
    a, extra = parser.parse_known_args(argv)
    cfg = load_config(_resolve_config(a.config), a.overrides)
    state_dir = Path(cfg.runner.state_dir or default_state_dir())
    state_dir.mkdir(parents=True, exist_ok=True)
    runner = StepRunner(make_backend(cfg, state_dir), state_dir, poll_s=cfg.runner.poll_s)
    if a.cmd == "stop":
        runner.stop(a.job_id)
        return 0
    if a.cmd == "status":
        print(runner.backend.status(a.job_id))
        return 0
    jid = a.job_id or f"amflow-cli-{_slug(a.step, 24)}-{_slug(a.run_id, 60)}"
    cmd = step_command(cfg.runner.command, a.step, config=a.config, run_id=a.run_id,
                       overrides=a.overrides, extra_args=extra, force=a.force)

    def on_term(signum, frame):  # noqa: ARG001
        runner.stop(jid)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    out = runner.run(jid, cmd, budget_s=float("inf"),
                     resources=dict(cfg.ray.step_resources.get(a.step, {})))
    if out.summary is not None:
        print(SUMMARY_PREFIX + json.dumps(out.summary, sort_keys=True), flush=True)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
