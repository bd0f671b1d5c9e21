"""runner.mode=container without podman: the engine command a step gets, the config keys,
and the supervised job's life (submit, stream, stop -> container removed) against a fake
engine that runs the command on the host. The real image: tests/test_container_image.py."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from amflow import jobs as J
from core.config import ConfigError, load_config
from amflow.jobs.container import BANNER, ContainerBackend, host_paths

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/amflow:test"

# A stand-in for the podman CLI: `image inspect` knows IMAGE only, `rm` is recorded, `run`
# runs what follows the image on the host (the banner's `sh -c ... "$@"` included).
FAKE_ENGINE = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_ENGINE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["image", "inspect"]:
    print(json.dumps([{{"Config": {{"Labels": {{"amflow.revision": "deadbee"}}}}}}]))
    sys.exit(0 if args[2] == {IMAGE!r} else 1)
if args[0] == "run":
    i = args.index({IMAGE!r})
    os.execvp(args[i + 1], args[i + 1:])
"""


def _cfg(tmp_path: Path, *sets: str):
    return load_config(ROOT / "configs" / "local.yaml",
                       [f"storage.root={tmp_path / 'store'}", f"data.corpus={tmp_path / 'corpus'}",
                        "runner.mode=container",
                        f"runner.state_dir={tmp_path / 'jobs'}", f"runner.image={IMAGE}", *sets])


def test_step_command_runs_in_the_image_with_data_at_the_same_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("AMFLOW_CACHE", str(tmp_path / "cache"))
    backend = J.make_backend(_cfg(tmp_path))
    assert isinstance(backend, ContainerBackend) and backend.mode == "container"
    argv = ["amflow", "select", "--config", "configs/local.yaml", "--run-id", "r"]
    cmd = backend.run_argv("amflow-job-try1", argv)
    i = cmd.index(IMAGE)
    assert cmd[:4] == ["podman", "run", "--rm", "--init"]
    assert cmd[i + 1:] == ["sh", "-c", BANNER, "amflow-step", *argv]
    flags = cmd[:i]
    assert "--name=amflow-job-try1" in flags and "--network=none" in flags
    assert f"--workdir={ROOT}" in flags
    shm = [f for f in flags if f.startswith("--shm-size=")]  # half the memory: Ray's store fits
    assert len(shm) == 1 and int(shm[0][11:-1]) * 2**20 > 0.3 * os.sysconf("SC_PAGE_SIZE") \
        * os.sysconf("SC_PHYS_PAGES")
    mounts = [flags[k + 1] for k, f in enumerate(flags) if f == "-v"]
    assert mounts == [f"{ROOT}:{ROOT}:ro", f"{tmp_path / 'corpus'}:{tmp_path / 'corpus'}:rw",
                      f"{tmp_path / 'store'}:{tmp_path / 'store'}:rw",
                      f"{tmp_path / 'cache'}:{tmp_path / 'cache'}:rw"]  # the host's cache
    assert f"--env=AMFLOW_CACHE={tmp_path / 'cache'}" in flags
    assert "--env=PYTHONUNBUFFERED=1" in flags and f"--env=AMFLOW_IMAGE={IMAGE}" in flags
    assert not any(f.startswith("--env=AWS_") for f in flags)  # local data: no credentials


def test_a_config_outside_the_workdir_is_mounted_read_only(tmp_path):
    backend = J.make_backend(_cfg(tmp_path))
    other = tmp_path / "elsewhere" / "my.yaml"
    cmd = backend.run_argv("j", ["amflow", "select", "--config", str(other)])
    assert f"{other.parent}:{other.parent}:ro" in cmd
    inside = backend.run_argv("j", ["amflow", "select", "--config", "configs/aws.yaml"])
    assert sum(f == "-v" for f in inside) == 4  # workdir, corpus, storage.root, cache


def test_s3_data_goes_over_the_host_network_with_the_callers_aws_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    backend = J.make_backend(_cfg(tmp_path, "storage.root=s3://bucket/amflow",
                                  "data.corpus=s3://bucket/corpus", "runner.env.X=1",
                                  "runner.container_engine=docker",
                                  "runner.container_options=--shm-size=1g,--cpus=2"))
    cmd = backend.run_argv("j", ["amflow", "features"])
    assert [f for f in cmd if f.startswith("--shm-size")] == ["--shm-size=1g"] and "--cpus=2" in cmd
    assert cmd[0] == "docker" and "--network=host" in cmd
    assert "--env=AWS_ACCESS_KEY_ID" in cmd  # by name: the value stays out of argv and logs
    assert "--env=AWS_SESSION_TOKEN" not in cmd
    assert "--env=X" in cmd and backend.env["X"] == "1"  # runner.env by name too
    assert [f for f in cmd if f == "-v"] == ["-v", "-v"]  # the working dir, the cache


def test_nested_and_remote_paths_make_one_mount_each(tmp_path):
    assert host_paths(["./data", "./data/corpus", "s3://b/x", ""], "/w") == ["/w/data"]
    assert host_paths(["/a/b", "/a/bc", "file:///a/b/c"], "/w") == ["/a/b", "/a/bc"]


@pytest.mark.parametrize("key,value,message", [
    ("runner.mode", "docker", "must be local, container or ray_job"),
    ("runner.container_engine", "lxc", "must be podman or docker"),
    ("runner.container_network", "mine", "must be empty (auto), none, host"),
    ("runner.image", "amflow 1", "without spaces"),
])
def test_bad_container_keys_are_named(tmp_path, key, value, message):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "local.yaml", [f"{key}={value}"])
    assert err.value.key == key and message in str(err.value)


def test_default_image_is_the_one_make_image_tags():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert J.make_backend(load_config(ROOT / "configs" / "local.yaml",
                                      ["runner.mode=container"])).image == \
        f"localhost/amflow:{version}"


@pytest.fixture()
def fake_engine(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "podman"
    exe.parent.mkdir()
    exe.write_text(FAKE_ENGINE)
    exe.chmod(0o755)
    log = tmp_path / "engine.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_LOG", str(log))
    monkeypatch.setenv("AMFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return lambda: [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_job_streams_its_output_and_stop_removes_the_container(tmp_path, fake_engine):
    backend = J.make_backend(_cfg(tmp_path))
    lines: list[str] = []
    runner = J.StepRunner(backend, tmp_path / "jobs", poll_s=0.1, emit=lines.append)
    code = "import json; print('hello'); print('AMFLOW_SUMMARY ' + json.dumps({'ok': 1}))"
    out = runner.run("c-ok", [sys.executable, "-c", code], budget_s=30)
    assert out.ok and out.summary == {"ok": 1}
    banner = [x for x in lines if x.startswith("[amflow-container] ")]
    # the image (its label) was built from another revision than this checkout's: said first
    assert len(banner) == 2 and "built from revision deadbee, the working dir is at" in banner[0]
    assert lines.index(banner[0]) < lines.index(banner[1]) < lines.index("hello")
    assert not runner.submit("c-ok", [sys.executable, "-c", code])  # submitted once per id
    assert (tmp_path / "store").is_dir()  # created before podman mounts it

    assert runner.submit("c-long", [sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    while "[amflow-container]" not in backend.logs("c-long")[0] and time.monotonic() - t0 < 20:
        time.sleep(0.05)  # the step runs (its banner is out): SIGTERM goes through the engine
    assert runner.stop("c-long") and backend.status("c-long") == J.STOPPED
    assert ["rm", "-f", "-t", "0", "c-long"] in fake_engine()
    assert ["rm", "-f", "-t", "0", "c-ok"] not in fake_engine()
    assert json.loads((tmp_path / "jobs" / "c-long" / "rc.json").read_text())["rc"] == -15

    # a stop before the supervisor recorded anything is still a stop, not a failure
    assert runner.submit("c-early", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert runner.stop("c-early") and backend.status("c-early") == J.STOPPED


def test_missing_image_fails_the_submit_naming_runner_image(tmp_path, fake_engine):
    backend = J.make_backend(_cfg(tmp_path, "runner.image=localhost/amflow:nope"))
    with pytest.raises(J.RunnerError, match=r"runner.image: .*make image"):
        backend.submit("c-x", ["amflow", "select"])
    assert not backend.exists("c-x")


def test_an_airflow_task_runs_its_step_in_a_container(tmp_path, fake_engine, monkeypatch):
    """The Airflow side (AirflowStep: ids, submit-or-attach, rerun) is mode-blind: a task's
    step goes through `podman run` named by the try's job id; a cleared task redoes it."""
    from amflow.orchestration.airflow_step import AirflowStep
    from amflow.orchestration.rerun import Attempt

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    monkeypatch.setenv("AMFLOW_FAKE_PLAN", str(plan))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({
        "storage": {"root": str(tmp_path / "store")}, "data": {"corpus": str(tmp_path / "c")},
        "runner": {"mode": "container", "image": IMAGE, "poll_s": 0.2, "max_wait_per_try_s": 30,
                   "command": [sys.executable, str(ROOT / "tests" / "fake_amflow.py")],
                   "state_dir": str(tmp_path / "jobs")}}))
    lines: list[str] = []

    def task(try_number: int, first_try: int = 1) -> AirflowStep:
        return AirflowStep(step="select", dag_id="dag", airflow_run_id="manual__1",
                           task_id="select", try_number=try_number, config=str(cfg),
                           overrides=[], emit=lines.append,
                           attempt=Attempt(try_number=try_number, first_try=first_try,
                                           run_cleared=first_try > 1))

    first = task(1)
    out = first.poke()
    assert out.ok and out.submitted and not first.redone
    runs = [c for c in fake_engine() if c[0] == "run"]
    assert len(runs) == 1 and f"--name={first.job_id}" in runs[0]
    assert (tmp_path / "store" / "runs" / first.run_id / "select" / "_SUCCESS.json").exists()
    again = task(2, first_try=2)  # cleared: the step finished before, so it is redone (--force)
    assert again.poke().ok and again.redone
    assert "--force" in [c for c in fake_engine() if c[0] == "run"][-1]


def test_image_inputs_are_pinned_and_match_pyproject():
    """The image's inputs are exact: every Debian package `name=version`, every wheel
    `name==version`, and the lock holds each pyproject pin at its pinned version."""
    import re
    import tomllib

    here = ROOT / "infra" / "image"
    debs = [x for x in (here / "debian-packages.txt").read_text().splitlines()
            if x.strip() and not x.startswith("#")]
    assert debs and all(re.fullmatch(r"[a-z0-9.+-]+=[\w.+:~-]+", d) for d in debs), debs
    lock = dict(x.split("==") for x in (here / "requirements.lock").read_text().splitlines()
                if x.strip() and not x.startswith("#"))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name, version = re.sub(r"\[.*\]", "", dep).split("==")
        name = re.sub(r"[-_.]+", "-", name).lower()
        assert lock.get(name, "").split("+")[0] == version, (dep, lock.get(name))
