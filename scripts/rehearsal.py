#!/usr/bin/env python
"""Rehearse the cluster on one machine (issue #22): both DAGs the cluster way.

Reads top to bottom like a Kaldi run.sh:

  0. configs      configs/aws.yaml <- configs/rehearsal.yaml <- this run's ports, and the
                  same pipeline on local disk with a local Ray (the reference)
  1. S3           a moto server over HTTP, with a fault injector in front of its app
                  (503 SlowDown / 500 InternalError on a seeded share of requests)
  2. corpus       `amflow corpus` onto s3://amflow-data/corpus; a copy on local disk
  3. local        DAGs teacher and ssl_student with `airflow dags test`, runner.mode local,
                  local disk, a local Ray per step: the reference outputs and step times
  4. cluster      `ray start` head (CPU 0) + worker nodes, each with one pool's resource
                  (pool_x1 for select/repartition/lm, pool_c4 for features/decode, pool_p3
                  for targets/train/evaluate), a dedicated --temp-dir and ports
  5. cluster DAGs teacher and ssl_student with `airflow dags test`, runner.mode ray_job,
                  storage on S3; a c4 node is killed in the middle of ssl_student's
                  `features` (a replacement joins, as the autoscaler would)
  6. S3 faults    3 % of S3 requests fail (503 SlowDown / 500): ssl_student's select,
                  align, features, targets again as Ray jobs (`python -m amflow.jobs run`)
  7. retry+loss   a multi-worker `train` run by the Airflow task glue (AirflowStep): its
                  task process is killed while the Ray job runs, a p3 node is killed in the
                  middle of training, and try 2 re-attaches to the same job (faults on)
  8. checks       placement (Ray state API), Ray jobs + logs, outputs vs local, node loss,
                  re-attach, S3 faults; per-step wall times, cluster vs local
  9. teardown     every process group this script started, by process id

    python scripts/rehearsal.py [--work DIR] [--report FILE] [--keep]

Exit status 0 when every check passed. `make rehearsal` runs it; tests/test_rehearsal.py
(marker `cluster`) runs it and asserts on its JSON report.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import random
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if TYPE_CHECKING:
    from core.config import Config
BIN = Path(sys.executable).parent  # the virtualenv's bin: amflow, ray, airflow

BUCKET = "amflow-data"
TEACHER_RUN, SSL_RUN, FAULT_RUN = "rh-teacher", "rh-ssl", "rh-faults"

# The rehearsal's nodes: one head with no CPU (as on AWS) and two nodes per pool, each
# presenting its pool's resource with a small CPU count. Two per pool: a lost node's work
# has somewhere to go; a replacement joins after each kill (the autoscaler's job on AWS).
NODES = [
    {"name": "head", "cpus": 0, "resources": {}},
    {"name": "x1-a", "cpus": 2, "resources": {"pool_x1": 1}},
    {"name": "c4-a", "cpus": 1, "resources": {"pool_c4": 1}},
    {"name": "c4-b", "cpus": 1, "resources": {"pool_c4": 1}},
    {"name": "p3-a", "cpus": 1, "resources": {"pool_p3": 1}},
    {"name": "p3-b", "cpus": 1, "resources": {"pool_p3": 1}},
]

# configs/rehearsal.yaml may override these keys of configs/aws.yaml and nothing else.
ALLOWED_OVERRIDES = (
    # endpoints
    "storage.s3",
    # addresses
    "ray.address", "runner.ray_dashboard", "runner.workdir",
    # sizes (and the GPU counts: no GPU on this machine)
    "ray.num_cpus", "ray.num_gpus", "train.use_gpu", "corpus", "select.hours",
    "select.shard_hours", "repartition.partition_hours", "targets.actors",
    "targets.batch_frames", "model.num_classes", "model.student", "model.teacher",
    "train.workers", "train.epochs",
    "train.finetune_epochs", "train.sub_epochs", "train.minibatch_frames", "train.block_size",
    "train.group_size", "train.checkpoint_every", "lm.sentences", "decode.workers",
    "decode.acwt",
    # polling period (seconds-long steps here, hours-long on AWS)
    "runner.poll_s",
)

FAULT_SHARE = float(os.environ.get("AMFLOW_REHEARSAL_FAULTS", "0.03"))
T0 = time.time()


def say(msg: str) -> None:
    print(f"[rehearsal {time.time() - T0:6.0f}s] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deep_update(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict) and not k.endswith("resources"):
            _deep_update(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


def rehearsal_config_data(s3: str = "", head: str = "", dashboard: str = "") -> dict:
    """configs/aws.yaml <- configs/rehearsal.yaml <- the run's endpoint and addresses."""
    data = yaml.safe_load((ROOT / "configs" / "aws.yaml").read_text())
    _deep_update(data, yaml.safe_load((ROOT / "configs" / "rehearsal.yaml").read_text()))
    data["runner"]["workdir"] = str(ROOT)
    if s3:
        data["storage"]["s3"]["endpoint_url"] = s3
    if head:
        data["ray"]["address"] = head
    if dashboard:
        data["runner"]["ray_dashboard"] = dashboard
    return data


def local_config_data(cluster: dict, store: Path) -> dict:
    """The same pipeline on local disk with a local Ray: the reference."""
    data = copy.deepcopy(cluster)
    data["storage"] = {"root": str(store)}
    data["data"] = {"corpus": str(store / "corpus")}
    data["ray"]["address"] = ""
    data["ray"]["step_resources"] = {}
    data["runner"] = {"mode": "local", "poll_s": 1.0}
    return data


# ----------------------------------------------------------------------------- 1. S3

class FaultInjector:
    """WSGI middleware in front of moto's app: answers a seeded share of requests with
    503 SlowDown or 500 InternalError (the body read first, nothing reaches moto)."""

    def __init__(self, app, share: float, seed: int = 22):
        self.app, self.share, self.rng = app, share, random.Random(seed)
        self.enabled = False
        self.lock = threading.Lock()
        self.requests = 0
        self.injected = {"503": 0, "500": 0}

    def __call__(self, environ, start_response):
        with self.lock:
            self.requests += 1
            hit = self.enabled and self.rng.random() < self.share
            kind = ("503" if self.rng.random() < 0.7 else "500") if hit else ""
            if hit:
                self.injected[kind] += 1
        if not hit:
            return self.app(environ, start_response)
        try:
            n = int(environ.get("CONTENT_LENGTH") or 0)
            environ["wsgi.input"].read(n) if n else environ["wsgi.input"].read()
        except Exception:  # noqa: BLE001
            pass
        code, status = (("SlowDown", "503 Slow Down") if kind == "503"
                        else ("InternalError", "500 Internal Server Error"))
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected by the rehearsal</Message></Error>").encode()
        start_response(status, [("Content-Type", "application/xml"),
                                ("Content-Length", str(len(body)))])
        return [body]


class S3Server:
    def __init__(self, share: float):
        from moto.moto_server.werkzeug_app import (DomainDispatcherApplication,
                                                   MotoRequestHandler, create_backend_app)
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log_request(self, *a, **k):  # noqa: ANN002 - one line per request otherwise
                pass

        self.port = free_port()
        self.faults = FaultInjector(DomainDispatcherApplication(create_backend_app), share)
        self.server = make_server("127.0.0.1", self.port, self.faults, threaded=True,
                                  request_handler=Quiet)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()


# ----------------------------------------------------------------------------- processes

class Procs:
    """Every process group this script starts, recorded by pid; stopped by pid only."""

    def __init__(self):
        self.groups: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict, log: Path, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **kw)
        self.groups[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL, grace_s: float = 0.0) -> None:
        proc = self.groups.pop(name, None)
        if proc is None:
            return
        for s in ([signal.SIGTERM, sig] if grace_s else [sig]):
            try:
                os.killpg(proc.pid, s)
            except ProcessLookupError:
                break
            if grace_s and s == signal.SIGTERM:
                try:
                    proc.wait(timeout=grace_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        for name in reversed(list(self.groups)):  # workers before the head
            self.kill(name, grace_s=5.0)


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(k, None)
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONPATH": str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                           if env.get("PYTHONPATH") else ""),
                "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"})
    return env


def run(argv: list[str], env: dict, log: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    with open(log, "ab") as f:
        out = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             timeout=timeout)
    if out.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({out.returncode}); {log}:\n{tail}")
    return out


# ----------------------------------------------------------------------------- 4. Ray

class Cluster:
    def __init__(self, procs: Procs, work: Path, env: dict):
        self.procs, self.work = procs, work
        self.temp = Path(tempfile.mkdtemp(prefix="amflow-rh-", dir="/tmp"))
        self.port, self.dash = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dash}"
        # Ray >= 2.59 wants token auth on clusters: one token for nodes and clients.
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
        # Seven Ray nodes share this machine's cores: no metrics collection (on AWS each
        # node has its own cores; here the agents' polling would be measured as overhead).
        self.env = dict(env, RAY_enable_metrics_collection="0", **self.auth)
        self.node_ids: dict[str, str] = {}  # our name -> Ray node id
        self.killed: list[dict] = []

    def start_node(self, spec: dict) -> str:
        name = spec["name"]
        argv = [str(BIN / "ray"), "start", "--block", f"--num-cpus={spec['cpus']}",
                "--num-gpus=0", f"--resources={json.dumps(spec['resources'])}",
                "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
                f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
                "--object-store-memory=200000000"]
        if name == "head":
            argv += ["--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
                     f"--dashboard-port={self.dash}", "--include-dashboard=true",
                     f"--temp-dir={self.temp}", f"--ray-client-server-port={free_port()}"]
        else:
            argv += [f"--address={self.address}"]
        before = set(self.alive_nodes())
        self.procs.start(f"ray-{name}", argv, self.env, self.work / f"ray-{name}.log")
        deadline = time.time() + 180
        while time.time() < deadline:
            new = set(self.alive_nodes()) - before - set(self.node_ids.values())
            if new:
                self.node_ids[name] = new.pop()
                return self.node_ids[name]
            proc = self.procs.groups[f"ray-{name}"]
            if proc.poll() is not None:
                break
            time.sleep(1)
        raise RuntimeError(f"ray node {name} did not join; see {self.work}/ray-{name}.log")

    def alive_nodes(self) -> list[str]:
        try:
            from ray.util.state import list_nodes

            return [n.node_id for n in list_nodes(address=self.dashboard, limit=1000,
                                                  raise_on_missing_output=False)
                    if n.state == "ALIVE"]
        except Exception:  # noqa: BLE001 - the head is not up yet
            return []

    def start(self) -> None:
        os.environ.update(self.auth)  # our own JobSubmissionClient / state API calls
        for spec in NODES:
            self.start_node(spec)
            say(f"ray node {spec['name']} up: {spec['cpus']} CPU, {spec['resources'] or 'no pool'}"
                f" (node {self.node_ids[spec['name']][:8]})")

    def name_of(self, node_id: str) -> str:
        return next((n for n, i in self.node_ids.items() if i == node_id), node_id[:8])

    def kill_node(self, name: str, why: str) -> None:
        """A node lost as an instance is: its raylet and everything under it, SIGKILL."""
        self.procs.kill(f"ray-{name}", signal.SIGKILL)
        self.killed.append({"node": name, "node_id": self.node_ids[name], "why": why,
                            "at_s": round(time.time() - T0, 1)})
        say(f"KILLED ray node {name} ({why})")

    def replace(self, name: str, pool_node: str) -> None:
        spec = dict(next(n for n in NODES if n["name"] == pool_node), name=name)
        self.start_node(spec)
        say(f"replacement node {name} joined ({spec['resources']})")

    def pools(self) -> dict[str, str]:
        """{node id: pool resource name or 'head'} of every node ever seen."""
        from ray.util.state import list_nodes

        out = {}
        for n in list_nodes(address=self.dashboard, limit=1000, detail=True,
                            raise_on_missing_output=False):
            pools = [k for k in (n.resources_total or {}) if k.startswith("pool_")]
            out[n.node_id] = pools[0] if pools else "head"
        return out


# ----------------------------------------------------------------------------- Airflow

def airflow_setup(home: Path, env: dict) -> dict:
    from tests.airflow_env import airflow_env

    aenv = airflow_env(home, AMFLOW_RETRY_DELAY_S="2")
    aenv.update({k: env[k] for k in ("PYTHONPATH", "PATH") if k in env})
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS"):
        aenv.pop(k, None)
        if k in env:
            aenv[k] = env[k]
    run([str(BIN / "airflow"), "db", "migrate"], aenv, home / "migrate.log", timeout=600)
    return aenv


def dags_test(aenv: dict, dag: str, conf: dict, log: Path) -> None:
    say(f"airflow dags test {dag}  (log {log})")
    run([str(BIN / "airflow"), "dags", "test", dag, "-c", json.dumps(conf)], aenv, log,
        timeout=1800)
    text = log.read_text(errors="replace")
    if "state=success" not in text and "DagRunState.SUCCESS" not in text:
        raise RuntimeError(f"dags test {dag} did not succeed; see {log}")


def task_times(home: Path) -> dict[str, dict[str, float]]:
    """{dag: {task: duration s}} of the last try of every task (Airflow's own record)."""
    out: dict[str, dict[str, float]] = {}
    with sqlite3.connect(home / "airflow.db") as c:
        for dag, task, dur, state in c.execute(
                "select dag_id, task_id, duration, state from task_instance"):
            if dur is not None and state == "success":
                out.setdefault(dag, {})[task] = round(float(dur), 2)
    return out


def xcoms(home: Path, dag: str, key: str = "return_value") -> dict[str, Any]:
    out = {}
    with sqlite3.connect(home / "airflow.db") as c:
        rows = c.execute("select task_id, value from xcom where dag_id=? and key=? "
                         "order by timestamp", (dag, key)).fetchall()
    for task, value in rows:
        v = json.loads(value) if isinstance(value, (str, bytes)) else value
        out[task] = json.loads(v) if isinstance(v, str) else v
    return out


def dag_confs(cfg_path: Path, root: str) -> tuple[dict, dict]:
    common = {"config": str(cfg_path), "rerun": "resume", "hours": 1000000, "workers": 2,
              "epochs": 1}
    # the teacher alone (no baseline, no sequence training): the steps both DAGs share
    teacher = dict(common, run_id=TEACHER_RUN, baseline=False, sequence=False,
                   sequence_teacher=False)
    ssl = dict(common, run_id=SSL_RUN,
               teacher=f"{root}/runs/{TEACHER_RUN}/train-teacher/model.pt")
    return teacher, ssl


# ----------------------------------------------------------------------------- node loss

class FeatureKiller(threading.Thread):
    """Waits for ssl_student's features job to have shard tasks running on a c4 node that
    does not hold the job's driver, with shards still to do; kills that node."""

    def __init__(self, cluster: Cluster):
        super().__init__(daemon=True)
        self.cluster, self.done, self.result = cluster, threading.Event(), {}

    def run(self) -> None:
        from ray.job_submission import JobSubmissionClient
        from ray.util.state import list_tasks

        client = JobSubmissionClient(self.cluster.dashboard)
        while not self.done.is_set():
            try:
                jobs = [j for j in client.list_jobs()
                        if "-ssl_student-features-" in (j.submission_id or "")
                        and str(j.status) == "RUNNING"]
                for j in jobs:
                    if not j.job_id:
                        continue
                    tasks = list_tasks(address=self.cluster.dashboard,
                                       filters=[("job_id", "=", j.job_id)], limit=10000,
                                       detail=True, raise_on_missing_output=False)
                    shard = [t for t in tasks if t.func_or_class_name.endswith("_run_shard")]
                    running = {t.node_id for t in shard if t.state == "RUNNING"}
                    finished = [t for t in shard if t.state == "FINISHED"]
                    waiting = [t for t in shard if t.state not in ("FINISHED", "FAILED")]
                    victims = [self.cluster.name_of(n) for n in running
                               if n and n != j.driver_node_id]
                    victims = [v for v in victims if v.startswith("c4")]
                    # a shard in flight on a node that does not hold the driver, and more
                    # to do after it: its loss must be redone elsewhere
                    if victims and len(waiting) >= 2:
                        self.result = {"job": j.submission_id, "node": victims[0],
                                       "shards_finished_before": len(finished),
                                       "shards_left_before": len(waiting)}
                        self.cluster.kill_node(victims[0], "in the middle of ssl_student features")
                        self.cluster.replace("c4-c", "c4-a")
                        return
            except Exception as exc:  # noqa: BLE001 - keep watching
                self.result.setdefault("errors", []).append(repr(exc))
            time.sleep(0.2)


def train_with_task_kill_and_node_loss(cluster: Cluster, cfg_path: Path, env: dict,
                                       work: Path) -> dict:
    """Step 6: Airflow's task glue runs a 2-worker train; its task process dies while the
    Ray job runs (a lost Airflow worker); a p3 node dies mid-training; try 2 re-attaches."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    from core.config import load_config
    from amflow.orchestration.airflow_step import AirflowStep
    from core.storage import Storage, join

    sets = ["train.model=student", "train.regime=ssl", "train.tag=nodeloss", "train.workers=2",
            "train.epochs=2"]
    args = dict(step="train", dag_id="ssl_student", airflow_run_id="rehearsal",
                task_id="train_nodeloss", config=str(cfg_path), overrides=sets, run_id=SSL_RUN)
    code = ("import sys, json; from amflow.orchestration.airflow_step import AirflowStep; "
            f"s = AirflowStep(try_number=1, emit=print, **json.loads(sys.argv[1])); "
            "o = s.poke(); print('TRY1 ENDED', o.status)")
    log = work / "train_nodeloss_try1.log"
    cluster.procs.start("airflow-try1", [sys.executable, "-c", code, json.dumps(args)], env, log,
                        cwd=ROOT)
    cfg = load_config(cfg_path, sets)
    storage = Storage(cfg.storage)
    train_dir = join(cfg.storage.root, "runs", SSL_RUN, "train-nodeloss")
    client = JobSubmissionClient(cluster.dashboard)
    prefix = "amflow-ssl_student-train_nodeloss-"
    out: dict[str, Any] = {}
    deadline = time.time() + 600
    job = None
    while time.time() < deadline:  # the job runs and has checkpointed once
        jobs = [j for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)]
        if jobs and str(jobs[0].status) == "RUNNING" and \
                storage.exists(join(train_dir, "checkpoints", "latest.json")):
            job = jobs[0]
            break
        time.sleep(0.5)
    if job is None:
        raise RuntimeError(f"train_nodeloss never checkpointed; see {log}")
    cluster.procs.kill("airflow-try1", signal.SIGKILL)  # the Airflow worker dies
    say(f"killed the Airflow task process of try 1 (job {job.submission_id} keeps running)")
    actors = list_actors(address=cluster.dashboard, filters=[("job_id", "=", job.job_id)],
                         limit=1000, detail=True, raise_on_missing_output=False)
    workers = {a.node_id for a in actors if "TrainWorker" in a.class_name and a.state == "ALIVE"}
    victims = [cluster.name_of(n) for n in workers if n != job.driver_node_id]
    victims = [v for v in victims if v.startswith("p3")]
    out["train_worker_nodes_before"] = sorted(cluster.name_of(n) for n in workers)
    out["driver_node"] = cluster.name_of(job.driver_node_id or "")
    if victims:
        cluster.kill_node(victims[0], "in the middle of multi-worker train")
        cluster.replace("p3-c", "p3-a")
    out["killed_node"] = victims[0] if victims else None
    lines: list[str] = []
    step2 = AirflowStep(try_number=2, emit=lines.append, **args)
    deadline = time.time() + 900
    while True:
        outcome = step2.poke()
        if outcome.done:
            break
        if time.time() > deadline:  # a hung training fails the check, not the machine
            step2.kill()
            break
    (work / "train_nodeloss_try2.log").write_text("\n".join(lines))
    jobs = [j for j in client.list_jobs() if (j.submission_id or "").startswith(prefix)]
    actors = list_actors(address=cluster.dashboard, filters=[("job_id", "=", job.job_id)],
                         limit=1000, detail=True, raise_on_missing_output=False)
    out.update({
        "status": outcome.status, "summary": outcome.summary,
        "jobs": [j.submission_id for j in jobs],
        "try2_adopted": any("of an earlier try is still running" in x for x in lines),
        "train_worker_actors": sum("TrainWorker" in a.class_name for a in actors),
        "train_worker_actors_dead_on_killed_node": sum(
            "TrainWorker" in a.class_name and cluster.name_of(a.node_id) == out["killed_node"]
            for a in actors),
        "model_objects": [u for u in storage.list(train_dir) if u.endswith("model.pt")],
    })
    return out


# ----------------------------------------------------------------------------- 7. checks

def placement_check(cluster: Cluster, cfg: Config) -> dict:
    """Every amflow job's driver, tasks and actors ran on nodes of the pool its step's
    config names (ray.step_resources), from Ray's state API."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_tasks

    from amflow.placement import pools_of

    pools = cluster.pools()
    wanted = pools_of(cfg)
    client = JobSubmissionClient(cluster.dashboard)
    rows, bad = [], []
    for j in client.list_jobs():
        sid = j.submission_id or ""
        if not sid.startswith("amflow-"):
            continue
        words = j.entrypoint.split()
        step = words[words.index("amflow") + 1] if "amflow" in words else "?"
        want = wanted.get(step, set())
        tasks, actors = [], []
        # A driver that never joins the cluster (select, lm, evaluate: no Ray tasks, no
        # ray.init) has no Ray job id and nothing but itself to place: its node is checked.
        if j.job_id:
            tasks = list_tasks(address=cluster.dashboard, filters=[("job_id", "=", j.job_id)],
                               limit=10000, detail=True, raise_on_missing_output=False)
            actors = list_actors(address=cluster.dashboard,
                                 filters=[("job_id", "=", j.job_id)], limit=10000,
                                 detail=True, raise_on_missing_output=False)
        seen: dict[str, dict[str, int]] = {}
        control: dict[str, dict[str, int]] = {}
        # Work is what asks for resources (CPU, GPU, a pool): it must run on the step's
        # pool. What asks for nothing (Ray Train's controller and its helpers) is control
        # plane; it may run anywhere, and lands on the CPU-less head.
        where = [("driver", j.driver_node_id, {"entrypoint": 1})]
        where += [(t.func_or_class_name, t.node_id, t.required_resources or {}) for t in tasks
                  if t.type in ("NORMAL_TASK", "ACTOR_CREATION_TASK") and t.node_id]
        where += [(a.class_name, a.node_id, a.required_resources or {}) for a in actors
                  if a.node_id]
        for what, node, req in where:
            pool = pools.get(node, "?")
            # node:<ip> / node:__internal_head__ pin a control actor to a node; not work
            is_work = any(float(v) > 0 for k, v in req.items() if not k.startswith("node:"))
            bucket = seen if is_work else control
            bucket.setdefault(what, {}).setdefault(pool, 0)
            bucket[what][pool] += 1
            if is_work and want and pool not in want:
                bad.append(f"{sid}: {what} {req} on {cluster.name_of(node)} ({pool}), "
                           f"config names {sorted(want)}")
        rows.append({"job": sid, "step": step, "status": str(j.status), "pools": sorted(want),
                     "placed": seen, "control_plane": control})
    return {"jobs": rows, "violations": bad}


def ray_job_logs_check(cluster: Cluster, home: Path, dag_logs: dict[str, Path]) -> dict:
    """Each cluster task ran as a Ray job (JobSubmissionClient, runner xcom mode ray_job)
    and the job's log is in the task's log: `airflow dags test` prints the task logs, and
    the job's progress lines and its AMFLOW_SUMMARY line must be there."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard)
    out, bad = {}, []
    for dag, log in dag_logs.items():
        text = log.read_text(errors="replace")
        for task, x in sorted(xcoms(home, dag, "runner").items()):
            jid = x["job_id"]
            info = client.get_job_info(jid)
            job_log = client.get_job_logs(jid).splitlines()
            summary = [ln for ln in job_log if ln.startswith("AMFLOW_SUMMARY ")]
            progress = [ln for ln in job_log if ln.startswith("[") and "%)" in ln]
            ok = (x["mode"] == "ray_job" and str(info.status) == "SUCCEEDED"
                  and f"started ray_job job {jid}" in text and bool(summary)
                  and summary[-1][:120] in text and all(ln in text for ln in progress))
            out[f"{dag}.{task}"] = {"job_id": jid, "status": str(info.status),
                                    "entrypoint": info.entrypoint.split(" --config")[0],
                                    "job_log_lines": len(job_log),
                                    "progress_lines": len(progress), "in_task_log": ok}
            if not ok:
                bad.append(f"{dag}.{task}")
    return {"tasks": out, "not_ok": bad}


def _listing(storage, uri: str) -> dict[str, bytes]:
    return {u[len(uri):]: storage.read_bytes(u) for u in storage.list(uri, recursive=True)}


VOLATILE = ("_SUCCESS.json", "_fault_injected")
TIMING_KEYS = ("cpu_s", "wall_s", "seconds", "host")


def _stable(name: str, data: bytes | None):
    """A file's content for comparison: JSON markers without their timings, and without
    the digests of the models they read (targets' teacher_digest): each pipeline trained
    its own teacher, whose model.pt also holds its training's timings."""
    if data is None or not name.endswith(".json"):
        return data

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items()
                    if k not in TIMING_KEYS and not k.endswith(("_at", "_digest"))}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    return strip(json.loads(data))


def outputs_check(cl_storage, cl_root: str, lo_storage, lo_root: str,
                  pairs=((TEACHER_RUN, TEACHER_RUN, "features"), (SSL_RUN, SSL_RUN, "features"),
                         (SSL_RUN, SSL_RUN, "targets")),
                  results=((TEACHER_RUN, "evaluate-teacher"), (SSL_RUN, "evaluate"),
                           (TEACHER_RUN, "decode-teacher"), (SSL_RUN, "decode"))) -> dict:
    """Features and targets byte-identical (JSON markers without their timings);
    evaluation and decoding results identical."""
    res: dict[str, Any] = {"files": {}, "different": [], "metrics": {}}
    for cl_run, lo_run, step in pairs:
        a = _listing(cl_storage, f"{cl_root}/runs/{cl_run}/{step}")
        b = _listing(lo_storage, f"{lo_root}/runs/{lo_run}/{step}")
        keys = sorted(k for k in set(a) | set(b) if not any(v in k for v in VOLATILE))
        diff = [k for k in keys if _stable(k, a.get(k)) != _stable(k, b.get(k))]
        res["files"][f"{cl_run}/{step}"] = {
            "compared": len(keys), "parquet": sum(k.endswith(".parquet") for k in keys),
            "bytes": sum(len(a.get(k, b"")) for k in keys),
            "identical_bytes": sum(a.get(k) == b.get(k) for k in keys)}
        res["different"] += [f"{cl_run}/{step}{k}" for k in diff]
    for run_id, step in results:
        sa = cl_storage.read_json(f"{cl_root}/runs/{run_id}/{step}/_SUCCESS.json")
        sb = lo_storage.read_json(f"{lo_root}/runs/{run_id}/{step}/_SUCCESS.json")
        ma, mb = _results(sa.get("metrics", {})), _results(sb.get("metrics", {}))
        res["metrics"][f"{run_id}/{step}"] = {"cluster": ma, "local": mb, "equal": ma == mb}
    res["ok"] = not res["different"] and all(f["compared"] for f in res["files"].values()) \
        and all(m["equal"] for m in res["metrics"].values())
    return res


def _results(metrics: dict) -> dict:
    """The results of an evaluation: accuracies, error rates, counts (no timings)."""
    timing = ("second", "_s", "per_s", "wall", "time", "xrt", "rtf", "elapsed")
    out = {}
    for k, v in metrics.items():
        if any(t in k for t in timing) or isinstance(v, bool):
            continue
        if isinstance(v, dict):
            v = {c: x for c, x in v.items() if not isinstance(x, dict)}
            out[k] = v
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def accounting_check(storage, root: str, run_id: str, step: str = "features") -> dict:
    """Every selected utterance accounted for exactly once in a step's outputs."""
    import pyarrow as pa

    base = f"{root}/runs/{run_id}"
    succ = storage.read_json(f"{base}/{step}/_SUCCESS.json")
    sel = storage.read_json(f"{base}/select/_SUCCESS.json")
    ids: list[str] = []
    for u in storage.list(f"{base}/{step}", suffix=".parquet", recursive=True):
        if "/rejects" in u:
            continue
        t = storage.read_parquet(u, columns=["utt_id"])
        ids += t.column("utt_id").to_pylist()
    rejected = 0
    for u in storage.list(f"{base}/{step}", suffix=".parquet", recursive=True):
        if "/rejects" in u:
            rejected += storage.read_parquet(u).num_rows
    c = succ["counts"]
    return {"in": c["in"], "out": c["out"], "rejected": c["rejected"],
            "selected": sel["counts"]["selected"], "rows": len(ids), "unique": len(set(ids)),
            "ok": c["in"] == c["out"] + c["rejected"] == sel["counts"]["selected"]
            and len(ids) == len(set(ids)) == c["out"]}


def redone_shards(cluster: Cluster, job_sub_id: str) -> dict:
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_tasks

    info = JobSubmissionClient(cluster.dashboard).get_job_info(job_sub_id)
    tasks = list_tasks(address=cluster.dashboard, filters=[("job_id", "=", info.job_id)],
                       limit=10000, detail=True, raise_on_missing_output=False)
    shard = [t for t in tasks if t.func_or_class_name.endswith("_run_shard")]
    return {"task_attempts": len(shard),
            "retried": sum(1 for t in shard if (t.attempt_number or 0) > 0),
            "failed_attempts": sum(1 for t in shard if t.state == "FAILED")}


# What every short step pays before its own work: an empty job (a Python that prints its
# start time) and one that only joins the cluster, as Ray jobs on a pool (followed by the
# runner as an Airflow task follows its step), and the empty job as a local runner job.
EMPTY = "import time; print('FLOOR_START', time.time())"
RAY_INIT = ("import time; t = time.time(); import ray; ray.init(); "
            "print('FLOOR_INIT', time.time() - t)")
# Which code a job's `amflow` runs (no cwd on sys.path, as for the console script): this
# checkout's, through PYTHONPATH, also from a worktree.
WHICH_CODE = "import amflow.cli as m; print('FLOOR_CODE', m.__file__)"
FLOOR_POOLS = {"pool_x1": ("select", "lm"), "pool_p3": ("evaluate",)}
FLOOR_REPEATS = 3


def _timed_job(runner, jid: str, code: str, resources: dict | None) -> dict:
    """Submit `python -P -c code` through the runner, follow it to its end; its timings."""
    lines: list[str] = []
    runner.emit = lines.append
    t0 = time.time()
    out = runner.run(jid, [sys.executable, "-P", "-c", code], budget_s=600.0,
                     resources=resources)
    row = {"status": out.status, "wall_s": round(time.time() - t0, 3)}
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "FLOOR_START":
            row["driver_start_s"] = round(float(value) - t0, 3)
        elif key == "FLOOR_INIT":
            row["ray_init_s"] = round(float(value), 3)
        elif key == "FLOOR_CODE":
            row["code"] = value
    return row


def _median(rows: list[dict], key: str) -> float | None:
    import statistics

    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def job_floor(ccfg: Config, work: Path, env: dict, init_jobs: int = 2) -> dict:
    """The fixed cost of a Ray job on each short step's pool, next to a local runner job."""
    from amflow.jobs import LocalBackend, StepRunner, make_backend

    t = time.time()
    ray_backend = make_backend(ccfg, work / "floor-jobs")  # a JobSubmissionClient, warm
    out: dict[str, Any] = {"client_s": round(time.time() - t, 3), "pools": {}}
    ray_runner = StepRunner(ray_backend, work / "floor-jobs", poll_s=ccfg.runner.poll_s)
    local = StepRunner(LocalBackend(work / "floor-local"), work / "floor-local",
                       poll_s=ccfg.runner.poll_s)
    tag = secrets.token_hex(3)
    rows = [_timed_job(local, f"floor-local-{tag}-{i}", EMPTY, None) for i in range(FLOOR_REPEATS)]
    out["local_empty_job_s"] = _median(rows, "wall_s")
    for pool, steps in FLOOR_POOLS.items():
        res = {pool: 0.01}
        empty = [_timed_job(ray_runner, f"floor-{pool}-empty-{tag}-{i}", EMPTY, res)
                 for i in range(FLOOR_REPEATS)]
        init = [_timed_job(ray_runner, f"floor-{pool}-init-{tag}-{i}", RAY_INIT, res)
                for i in range(init_jobs)]
        out["pools"][pool] = {"steps": list(steps), "empty_job_s": _median(empty, "wall_s"),
                              "driver_start_s": _median(empty, "driver_start_s"),
                              "ray_init_job_s": _median(init, "wall_s"),
                              "ray_init_s": _median(init, "ray_init_s"),
                              "code": _timed_job(ray_runner, f"floor-{pool}-code-{tag}",
                                                 WHICH_CODE, res).get("code"),
                              "ok": all(r["status"] == "SUCCEEDED" for r in empty + init)}
    # what a fresh task process pays to import the job client (once per `dags test` here)
    py = [sys.executable, "-c"]
    t = time.time()
    subprocess.run([*py, "pass"], env=env, check=True)
    bare = time.time() - t
    t = time.time()
    subprocess.run([*py, "from ray.job_submission import JobSubmissionClient"], env=env,
                   check=True)
    out["client_import_s"] = round(time.time() - t - bare, 3)
    return out


def add_floor(rows: list[dict], floor: dict) -> None:
    """Per short step, two bounds from this run's measurements:
    floor = its pool's empty Ray job + the step's own wall time on S3: a lower bound of
    its cluster time (the task must run a job, the job the step);
    same_task = the local task with the local runner's empty job swapped for the Ray one
    and the step's wall on disk for its wall on S3 (Airflow, imports, the step's work as
    measured locally): what the cluster task takes if nothing else differs."""
    pool_of = {s: p for p, f in floor.get("pools", {}).items() for s in f["steps"]}
    local_empty = floor.get("local_empty_job_s")
    for row in rows:
        pool = pool_of.get(row["step"].split("_")[0])  # evaluate_sequence: evaluate's pool
        empty = floor["pools"][pool]["empty_job_s"] if pool else None
        if empty is None or row.get("cluster_step_s") is None or not row["local_s"]:
            continue
        row["empty_job_s"] = empty
        row["floor_s"] = round(empty + row["cluster_step_s"], 2)
        row["floor_ratio"] = round(row["floor_s"] / row["local_s"], 2)
        if local_empty is not None and row.get("local_step_s") is not None:
            same = (row["local_s"] - local_empty + empty
                    + row["cluster_step_s"] - row["local_step_s"])
            row["same_task_s"] = round(same, 2)
            row["same_task_ratio"] = round(same / row["local_s"], 2)


def _epoch(text: str) -> float:
    """An Airflow DB timestamp (UTC, naive in SQLite) as seconds since the epoch."""
    d = dt.datetime.fromisoformat(text)
    return (d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)).timestamp()


def task_spans(home: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """{dag: {task: (start, end)}} of the last try of every successful task."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    with sqlite3.connect(home / "airflow.db") as c:
        for dag, task, start, end, state in c.execute(
                "select dag_id, task_id, start_date, end_date, state from task_instance"):
            if start and end and state == "success":
                out.setdefault(dag, {})[task] = (_epoch(start), _epoch(end))
    return out


def local_job_span(home: Path, jid: str) -> tuple[float, float] | None:
    """(submitted, ended) of a local runner job, from its state dir."""
    d = home / "amflow_jobs" / jid
    try:
        return (json.loads((d / "job.json").read_text())["submitted_at"],
                json.loads((d / "rc.json").read_text())["finished_at"])
    except (OSError, KeyError, ValueError):
        return None


def phases(task: tuple[float, float] | None, job: tuple[float, float] | None) -> dict:
    """A task's time before its job was submitted, the job, and after the job ended
    (noticing the end, reading the log, XCom and asset events)."""
    if not task or not job:
        return {}
    return {"before_s": round(job[0] - task[0], 2), "job_s": round(job[1] - job[0], 2),
            "after_s": round(task[1] - job[1], 2)}


def overhead_table(lhome: Path, chome: Path, cluster: Cluster) -> list[dict]:
    """Per step: Airflow task duration local vs cluster, and where the cluster's extra
    time goes: the step's own wall time (`wall_s`: on S3 vs local disk), the Ray job
    around it (submit -> driver start -> end), and Airflow's following of the job."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard)
    local, clus = task_times(lhome), task_times(chome)
    lspans, cspans = task_spans(lhome), task_spans(chome)
    rows = []
    for dag in ("teacher", "ssl_student"):
        lx, cx, cr = xcoms(lhome, dag), xcoms(chome, dag), xcoms(chome, dag, "runner")
        lr = xcoms(lhome, dag, "runner")
        for task, lo in local.get(dag, {}).items():
            cl = clus.get(dag, {}).get(task)
            if cl is None:
                continue
            job, cspan = None, None
            if task in cr:
                info = client.get_job_info(cr[task]["job_id"])
                if info.start_time and info.end_time:
                    job = round((info.end_time - info.start_time) / 1000.0, 2)
                    cspan = (info.start_time / 1000.0, info.end_time / 1000.0)
            lspan = local_job_span(lhome, lr[task]["job_id"]) if task in lr else None
            rows.append({"dag": dag, "step": task, "local_s": lo, "cluster_s": cl,
                         "ratio": round(cl / lo, 2) if lo else None,
                         "local_step_s": (lx.get(task) or {}).get("wall_s"),
                         "cluster_step_s": (cx.get(task) or {}).get("wall_s"),
                         "ray_job_s": job,
                         "local_phases": phases(lspans.get(dag, {}).get(task), lspan),
                         "cluster_phases": phases(cspans.get(dag, {}).get(task), cspan)})
    return rows


# ----------------------------------------------------------------------------- main

@dataclass
class Rehearsal:
    """What the stages share: the work dir, the S3 server, the cluster, both configs (the
    cluster's on S3, the reference's on local disk) and what earlier stages left."""

    work: Path
    env: dict
    s3: S3Server
    cluster: Cluster
    cfg_path: Path  # the cluster's config
    lcfg_path: Path  # the reference's: local disk, a local Ray
    ccfg: Any
    lcfg: Any
    store: Path  # the reference's storage root
    report: dict[str, Any]
    lhome: Path | None = None  # the Airflow homes of the two pipelines
    chome: Path | None = None
    killer: FeatureKiller | None = None
    teacher_uri: str = ""  # the cluster ssl_student's targets.teacher

    @property
    def cl_storage(self):
        from core.storage import Storage

        return Storage(self.ccfg.storage)

    @property
    def lo_storage(self):
        from core.storage import Storage

        return Storage(self.lcfg.storage)


def start(work: Path, procs: Procs, env: dict, report: dict) -> Rehearsal:
    """0-1. S3 (moto, faults off for now), the cluster's ports, both configs."""
    s3 = S3Server(FAULT_SHARE)
    try:
        return _configured(work, procs, env, report, s3)
    except BaseException:
        s3.stop()  # main's teardown only knows what start returned
        raise


def _configured(work: Path, procs: Procs, env: dict, report: dict, s3: S3Server) -> Rehearsal:
    import boto3

    boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1").create_bucket(
        Bucket=BUCKET)
    say(f"S3 (moto) on {s3.endpoint}; faults: {FAULT_SHARE:.0%} of requests once enabled")
    cluster = Cluster(procs, work, env)
    cdata = rehearsal_config_data(s3.endpoint, cluster.address, cluster.dashboard)
    cfg_path = work / "rehearsal.yaml"
    cfg_path.write_text("# configs/aws.yaml <- configs/rehearsal.yaml <- this run's ports\n"
                        + yaml.safe_dump(cdata, sort_keys=False))
    store = work / "local"
    lcfg_path = work / "local.yaml"
    lcfg_path.write_text(yaml.safe_dump(local_config_data(cdata, store), sort_keys=False))
    from core.config import load_config

    return Rehearsal(work, env, s3, cluster, cfg_path, lcfg_path, load_config(cfg_path),
                     load_config(lcfg_path), store, report)


def corpus_stage(r: Rehearsal) -> None:
    """2. The corpus onto S3 (a local Ray: the cluster is not up yet), a copy on local disk."""
    import boto3

    say("amflow corpus -> s3://amflow-data/corpus")
    t = time.time()
    run([str(BIN / "amflow"), "corpus", "--config", str(r.cfg_path), "--set", "ray.address="],
        r.env, r.work / "corpus.log")
    r.report["corpus_s"] = round(time.time() - t, 1)
    client = boto3.client("s3", endpoint_url=r.s3.endpoint, region_name="us-east-1")
    n = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                  Prefix="corpus/"):
        for o in page.get("Contents", []):
            dest = r.store / o["Key"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, o["Key"], str(dest))
            n += 1
    say(f"corpus: {n} objects on S3, copied to {r.store / 'corpus'}")


def local_stage(r: Rehearsal) -> None:
    """3. The reference: local disk, a local Ray, runner.mode local."""
    r.lhome = r.work / "airflow-local"
    lenv = airflow_setup(r.lhome, r.env)
    lteacher, lssl = dag_confs(r.lcfg_path, str(r.store))
    t = time.time()
    dags_test(lenv, "teacher", lteacher, r.work / "local-teacher.log")
    dags_test(lenv, "ssl_student", lssl, r.work / "local-ssl_student.log")
    r.report["local_pipeline_s"] = round(time.time() - t, 1)


def cluster_stage(r: Rehearsal) -> dict:
    """4-5b. The cluster; both DAGs the cluster way (timed against the local run: no
    injected S3 faults here, their retries' backoff would be measured), a c4 node lost
    mid-features; the floor of a Ray job. Returns the environment with the cluster's auth."""
    say(f"starting the Ray cluster (temp dir {r.cluster.temp})")
    r.cluster.start()
    env_c = dict(r.env, **r.cluster.auth)
    r.chome = r.work / "airflow-cluster"
    cenv = airflow_setup(r.chome, env_c)
    cteacher, cssl = dag_confs(r.cfg_path, r.ccfg.storage.root)
    r.teacher_uri = cssl["teacher"]
    t = time.time()
    dags_test(cenv, "teacher", cteacher, r.work / "cluster-teacher.log")
    r.killer = FeatureKiller(r.cluster)
    r.killer.start()
    dags_test(cenv, "ssl_student", cssl, r.work / "cluster-ssl_student.log")
    r.killer.done.set()
    r.report["cluster_pipeline_s"] = round(time.time() - t, 1)
    say("the fixed cost of a Ray job: empty jobs on pool_x1 / pool_p3, and locally")
    try:
        r.report["floor"] = job_floor(r.ccfg, r.work, env_c)
    except Exception:  # noqa: BLE001 - a measurement, not a check: report it, go on
        r.report["floor"] = {"error": traceback.format_exc()[-2000:], "pools": {}}
    return env_c


def faults_stage(r: Rehearsal, env_c: dict) -> None:
    """6-7. S3 faults on: ssl_student's select, align, features, targets again as Ray jobs
    (run FAULT_RUN); then a retried Airflow task re-attaches and a p3 node is lost mid-train."""
    r.s3.faults.enabled = True
    sets = ["train.model=student", "train.regime=ssl", "select.hours=1000000",
            "train.workers=2", "train.epochs=1", f"targets.teacher={r.teacher_uri}"]
    t = time.time()
    for step in ("select", "align", "features", "targets"):  # features' labels are align's
        say(f"{step} of run {FAULT_RUN} as a Ray job, S3 faults on")
        run([sys.executable, "-m", "amflow.jobs", "run", step, "--config", str(r.cfg_path),
             "--run-id", FAULT_RUN, *[x for kv in sets for x in ("--set", kv)]], env_c,
            r.work / f"faults-{step}.log")
    r.report["fault_pass_s"] = round(time.time() - t, 1)
    say("train (2 workers) by the Airflow task glue: task process killed, p3 node killed")
    r.report["train_nodeloss"] = train_with_task_kill_and_node_loss(r.cluster, r.cfg_path,
                                                                    env_c, r.work)
    r.s3.faults.enabled = False
    r.report["s3"] = {"requests": r.s3.faults.requests, "injected": dict(r.s3.faults.injected),
                      "share": FAULT_SHARE}


def checks_stage(r: Rehearsal) -> None:
    """8. The checks, and the per-step overhead table."""
    say("checks")
    checks = r.report["checks"]
    cl_storage, root = r.cl_storage, r.ccfg.storage.root
    pl = placement_check(r.cluster, r.ccfg)
    checks["placement"] = {"ok": not pl["violations"], **pl}
    jl = ray_job_logs_check(r.cluster, r.chome, {
        "teacher": r.work / "cluster-teacher.log",
        "ssl_student": r.work / "cluster-ssl_student.log"})
    checks["ray_jobs_and_logs"] = {"ok": not jl["not_ok"], **jl}
    checks["outputs_equal_local"] = outputs_check(cl_storage, root, r.lo_storage,
                                                  r.lcfg.storage.root)
    checks["features_node_loss"] = _features_node_loss(r, cl_storage)
    checks["train_node_loss"], checks["reattach"] = _train_node_loss(r, cl_storage)
    fo = outputs_check(cl_storage, root, r.lo_storage, r.lcfg.storage.root,
                       pairs=((FAULT_RUN, SSL_RUN, "features"), (FAULT_RUN, SSL_RUN, "targets")),
                       results=())
    checks["s3_faults"] = {**r.report["s3"], "outputs_equal_local": fo["files"],
                           "different": fo["different"],
                           "ok": sum(r.report["s3"]["injected"].values()) > 0 and fo["ok"]}
    r.report["overhead"] = overhead_table(r.lhome, r.chome, r.cluster)
    add_floor(r.report["overhead"], r.report["floor"])
    r.report["ok"] = all(c.get("ok") for c in checks.values())


def _features_node_loss(r: Rehearsal, cl_storage) -> dict:
    fk = dict(r.killer.result)
    fjob = fk.get("job")
    out = {**fk, **(redone_shards(r.cluster, fjob) if fjob else {}),
           "accounting": accounting_check(cl_storage, r.ccfg.storage.root, SSL_RUN)}
    out["ok"] = bool(fjob) and out["accounting"]["ok"]
    return out


def _train_node_loss(r: Rehearsal, cl_storage) -> tuple[dict, dict]:
    tn = r.report["train_nodeloss"]
    summ = tn.get("summary") or {}
    counts = summ.get("counts", {})
    rep = cl_storage.read_json(f"{r.ccfg.storage.root}/runs/{SSL_RUN}/train/_SUCCESS.json")
    loss = {
        "killed_node": tn.get("killed_node"), "status": tn.get("status"),
        "resumed_from_step": (summ.get("resumed_from_step") if "resumed_from_step" in summ
                              else (summ.get("extra") or {}).get("resumed_from_step")),
        "train_worker_actors": tn.get("train_worker_actors"),
        "counts": counts, "counts_of_undisturbed_train": rep.get("counts"),
        "ok": tn.get("status") == "SUCCEEDED" and bool(tn.get("killed_node"))
        and counts.get("in") == counts.get("out", 0) + counts.get("rejected", 0)
        and counts == rep.get("counts")}
    reattach = {
        "jobs": tn.get("jobs"), "try2_adopted_try1_job": tn.get("try2_adopted"),
        "models": tn.get("model_objects"),
        "ok": len(tn.get("jobs") or []) == 1 and bool(tn.get("try2_adopted"))
        and len(tn.get("model_objects") or []) == 1}
    return loss, reattach


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", help="work dir (default: a new temp dir)")
    p.add_argument("--report", help="write the JSON report here too")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="amflow-rehearsal-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"work dir {work}")

    def on_term(signum, frame):  # noqa: ARG001 - teardown (finally) on SIGTERM / SIGINT too
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    report: dict[str, Any] = {"work": str(work), "checks": {}}
    env = base_env()
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_DEFAULT_REGION")})
    procs, r = Procs(), None
    try:
        r = start(work, procs, env, report)
        corpus_stage(r)
        local_stage(r)
        env_c = cluster_stage(r)
        faults_stage(r, env_c)
        checks_stage(r)
    except Exception:  # noqa: BLE001
        report["error"] = traceback.format_exc()
        report["ok"] = False
        print(report["error"], file=sys.stderr, flush=True)
    finally:
        teardown(procs, r)
    return finish(report, work, a)


def teardown(procs: Procs, r: Rehearsal | None) -> None:
    """9. Every process group this script started, by process id; S3; the cluster's temp."""
    say("teardown: " + ", ".join(f"{n}={p.pid}" for n, p in procs.groups.items()))
    procs.stop_all()
    if r is not None:
        r.s3.stop()
        shutil.rmtree(r.cluster.temp, ignore_errors=True)


def finish(report: dict, work: Path, a: argparse.Namespace) -> int:
    print_report(report)
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    (work / "report.json").write_text(text)
    if a.report:
        Path(a.report).write_text(text)
    if not a.keep and report["ok"]:
        shutil.rmtree(work / "local", ignore_errors=True)
    say(f"{'PASSED' if report['ok'] else 'FAILED'}; report {work / 'report.json'}")
    return 0 if report["ok"] else 1


def print_report(r: dict) -> None:
    print("\n================ rehearsal report ================")
    for name, c in r.get("checks", {}).items():
        print(f"{'PASS' if c.get('ok') else 'FAIL'}  {name}")
        brief = {k: v for k, v in c.items() if k not in ("jobs", "tasks", "ok", "metrics")}
        print("      " + json.dumps(brief, default=str)[:600])
    if r.get("overhead"):
        print("\nper-step wall time, cluster way (S3 + Ray jobs + pools) vs local "
              "(local disk, local Ray); floor = empty Ray job on the step's pool + step S3:")
        print(f"{'dag':12} {'step':12} {'local s':>8} {'cluster s':>9} {'ratio':>6} "
              f"{'step local':>10} {'step S3':>8} {'ray job':>8} {'empty job':>9} "
              f"{'floor':>6} {'floor/local':>11} {'same task':>9} {'/local':>6}")
        for row in r["overhead"]:
            f = lambda v: f"{v:.1f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
            g = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
            print(f"{row['dag']:12} {row['step']:12} {row['local_s']:8.1f} "
                  f"{row['cluster_s']:9.1f} {row['ratio']:6.2f} {f(row['local_step_s']):>10} "
                  f"{f(row['cluster_step_s']):>8} {f(row['ray_job_s']):>8} "
                  f"{g(row.get('empty_job_s')):>9} {g(row.get('floor_s')):>6} "
                  f"{g(row.get('floor_ratio')):>11} {g(row.get('same_task_s')):>9} "
                  f"{g(row.get('same_task_ratio')):>6}")
    if r.get("overhead"):
        print("\nwhere a task's time goes, local | cluster: before its job was submitted "
              "(Airflow, config, job client), the job, after it ended (seeing the end, log, "
              "XCom, assets):")
        for row in r["overhead"]:
            lp, cp = row.get("local_phases") or {}, row.get("cluster_phases") or {}
            f = lambda p: " ".join(f"{p.get(k, float('nan')):5.1f}"  # noqa: E731
                                   for k in ("before_s", "job_s", "after_s"))
            print(f"{row['dag']:12} {row['step']:12} {f(lp)} | {f(cp)}")
    if r.get("floor"):
        print("\nfixed cost of a job (median of a few, followed by amflow.jobs as a task does):")
        print("      " + json.dumps(r["floor"], default=str))
    for k in ("corpus_s", "local_pipeline_s", "cluster_pipeline_s"):
        if k in r:
            print(f"{k}: {r[k]}")


if __name__ == "__main__":
    sys.exit(main())
