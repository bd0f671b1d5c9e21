"""Shared fixtures: configs on a temp storage root, a local S3 (moto server over HTTP)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
if VENV_BIN.exists():
    os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
# Keep torch and BLAS from oversubscribing the 2 CI cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on localhost, reached over HTTP by boto3, pyarrow and Ray workers."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield endpoint
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture()
def s3_bucket(s3_server, request):
    """A fresh bucket; returns (bucket name, overrides that point storage.s3 at moto)."""
    import boto3

    name = "t-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    name = name.rstrip("-")
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    overrides = [f"storage.s3.endpoint_url={s3_server}", "storage.s3.region=us-east-1",
                 "storage.s3.access_key_id=testing", "storage.s3.secret_access_key=testing",
                 "storage.s3.force_path_style=true"]
    return name, overrides


# The embedded default labels frames with `amflow align` (features.labels=align). Tests of
# the features / repartition mechanics on corpora that carry an alignments.ctm label from
# it instead; the transcripts-only chain is tests/test_senones.py and tests/test_align.py.
CTM_LABELS = "features.labels=ctm"


@pytest.fixture()
def local_cfg(tmp_path):
    """The embedded default with storage under a temp dir."""
    from core.config import load_config

    def make(*overrides: str):
        return load_config(ROOT / "configs" / "local.yaml",
                           [f"storage.root={tmp_path / 'store'}", *overrides])

    return make


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (starting Ray costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def start_ray_head(tmp: Path, *, num_cpus: int, resources: dict | None = None,
                   timeout: float = 240):
    """A `ray start` head on free ports (dashboard and job API included), in its own
    process group. Yields (gcs address, dashboard URL, auth env): clients need its token
    (Ray >= 2.59 wants token auth on local clusters). While it runs, this process's
    environment carries the token too, for job clients made here."""
    import secrets
    import urllib.request

    port, dash = _free_port(), _free_port()
    session_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1", **auth)
    # --block keeps `ray start` in the foreground: its process group is ours to end.
    argv = ["ray", "start", "--head", "--block", f"--port={port}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
            "--include-dashboard=true", f"--num-cpus={num_cpus}", "--num-gpus=0",
            # Ray's session sockets need a short path (AF_UNIX: 107 bytes at most)
            f"--temp-dir={session_dir}",
            "--node-ip-address=127.0.0.1", f"--dashboard-agent-listen-port={_free_port()}",
            "--disable-usage-stats"]
    if resources:
        argv.append(f"--resources={json.dumps(resources)}")
    log = open(tmp / "ray.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    dashboard = f"http://127.0.0.1:{dash}"
    probe = urllib.request.Request(f"{dashboard}/api/jobs/", headers={
        "Authorization": f"Bearer {auth['RAY_AUTH_TOKEN']}"})
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    try:
        deadline = time.time() + timeout  # a loaded 2-core machine can be slow
        while True:
            try:
                with urllib.request.urlopen(probe, timeout=10):
                    break  # the job API answers: GCS and dashboard are up
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("ray head did not come up:\n"
                                + (tmp / "ray.log").read_text()[-3000:])
                time.sleep(1)
        yield f"127.0.0.1:{port}", dashboard, auth
    finally:
        _stop_group(proc)
        log.close()
        shutil.rmtree(session_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the head's process group, then SIGKILL what is left of it (raylets, workers)."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def amflow_bin() -> str:
    exe = VENV_BIN / "amflow"
    return str(exe) if exe.exists() else f"{sys.executable} -m amflow.cli"


# --- tiny_corpus (owned by the corpus step) ---
TINY_CORPUS_OVERRIDES = ("corpus.hours=0.05",)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A small embedded corpus (~0.05 h, all splits and DP1..DP5), built once per session.

    Returns the corpus root (a pathlib.Path): metadata/**.jsonl, audio/, alignments.ctm,
    phones.txt, _SUCCESS.json. Built in-process (no Ray) in a few seconds; byte-identical
    to `amflow corpus --config configs/local.yaml --set corpus.hours=0.05`.
    """
    from core.config import load_config
    from tasks.corpus import build_corpus

    root = tmp_path_factory.mktemp("tiny_corpus")
    cfg = load_config(ROOT / "configs" / "local.yaml",
                      [f"storage.root={root / 'store'}", *TINY_CORPUS_OVERRIDES])
    corpus = root / "corpus"
    build_corpus(cfg, str(corpus), use_ray=False)
    return corpus


@pytest.fixture()
def fake_env(tmp_path, monkeypatch):
    """A config whose runner runs tests/fake_amflow.py locally, and `set_plan(step={...})`
    to say what each fake step does (seconds, lines, failures; fake_amflow.py)."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    monkeypatch.setenv("AMFLOW_FAKE_PLAN", str(plan))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({
        "storage": {"root": str(tmp_path / "store")},
        "data": {"corpus": str(tmp_path / "store" / "corpus")},
        "runner": {"mode": "local",
                   "command": [sys.executable, str(ROOT / "tests" / "fake_amflow.py")],
                   "poll_s": 0.2, "max_wait_per_try_s": 30, "state_dir": str(tmp_path / "jobs")},
    }))

    def set_plan(**steps):
        plan.write_text(json.dumps(steps))

    return cfg, set_plan, tmp_path


# The quickstart's recipe (docs/tutorial/quickstart.md), run once per session under `make
# demo`'s run names: tests/test_quickstart.py checks the run, tests/test_doc_pages.py runs
# the guides' commands that name the demo's runs on it, as written.
QUICKSTART_RUN = "demo"


def script_module(name: str):
    """scripts/<name>.py as a module, loaded once (scripts/ is no package)."""
    if name not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def docs_check_module():
    """scripts/docs_check.py: the page blocks, their markers, the runner."""
    return script_module("docs_check")


@dataclasses.dataclass
class QuickstartCheckout:
    root: Path  # laid out like a checkout: configs/, .venv, data/runs/demo-teacher, demo-ssl
    command: str  # what ran: the tutorial's command and the run's name
    run: subprocess.CompletedProcess

    @property
    def store(self) -> Path:
        return self.root / "data"


def quickstart_configs(root: Path) -> None:
    """configs/tiny.yaml with its storage at ./data (configs/local.yaml's place), as
    configs/tiny.yaml and configs/local.yaml: a command that reads the embedded demo's
    config reads the tiny one. The presets and recipes are the checkout's."""
    text = (ROOT / "configs" / "tiny.yaml").read_text()
    for old, new in [("root: ./data/quickstart\n", "root: ./data\n"),
                     ("corpus: ./data/quickstart/corpus\n", "corpus: ./data/corpus\n")]:
        assert text.count(old) == 1, f"configs/tiny.yaml no longer has {old!r}"
        text = text.replace(old, new)
    (root / "configs").mkdir(parents=True)
    for name in ("tiny.yaml", "local.yaml"):
        (root / "configs" / name).write_text(text)
    for folder in ("presets", "recipes"):
        (root / "configs" / folder).symlink_to(ROOT / "configs" / folder)
    (root / ".venv").symlink_to(ROOT / ".venv")


@pytest.fixture(scope="session")
def quickstart_checkout(tmp_path_factory) -> QuickstartCheckout:
    """The tutorial's command (the block tests/test_quickstart.py runs), as written, with
    `--run-id demo --logs logs`, in a folder laid out like a checkout (quickstart_configs)."""
    docs_check = docs_check_module()
    (block,) = [b for b in docs_check.page_blocks(ROOT / "docs" / "tutorial" / "quickstart.md")
                if b.marker and b.marker.runner == "tests/test_quickstart.py"]
    (command,) = docs_check.commands(block)
    root = tmp_path_factory.mktemp("quickstart") / "checkout"
    quickstart_configs(root)
    command += f" --run-id {QUICKSTART_RUN} --logs logs"
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=root,
                         env=docs_check.environment(root), capture_output=True, text=True,
                         timeout=3600)
    return QuickstartCheckout(root, command, run)
