"""`runner.mode: container`: the step runs in the amflow image, through the podman (or
docker) CLI, supervised like a local job.

The supervised process (amflow.jobs.supervise) is `podman run --rm --name <job id> ... <image>
amflow <step> ...`: the job's output, exit code, log streaming, re-attach by id, deferral
and retries are the local backend's, unchanged. What the container adds:

- paths: the step's working directory (read-only), `storage.root` and `data.corpus`
  (read-write) are bind-mounted at the same paths, so the step reads the same config and
  writes the same files it would locally; an S3 root is reached over the host's network
  with the AWS_* variables of the caller's environment passed through;
- the host's amflow cache ($AMFLOW_CACHE, default ~/.cache/amflow: e.g. the corpus
  step's espeak-ng lexicon, 0.2 s from it, 7-16 s without) is mounted and shared, as a
  local step would find it (its entries are keyed by the espeak-ng version: the image
  reuses only what the same espeak-ng made);
- a first output line naming the OS, Python and image the step runs in, and before it a
  note when the image was built from another revision of the checkout than the one in the
  working dir (the step runs the image's code: `make image` brings it up to date);
- stop: SIGTERM reaches the step through podman's signal proxy (and --init, so the step is
  not PID 1, which ignores SIGTERM); after the grace period the container is removed
  (`rm -f`), also when the podman client itself was killed and left it running.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from importlib import metadata
from pathlib import Path

from amflow.jobs.base import FAILED, PROJECT_ROOT, RunnerError, read_json, write_json
from amflow.jobs.local import LocalBackend

# podman's settings for a machine where only runc works (infra/image/containers.conf);
# CONTAINERS_CONF in the caller's environment wins.
CONTAINERS_CONF = PROJECT_ROOT / "infra" / "image" / "containers.conf"
# What reaches S3 from inside: the caller's AWS settings, by name (values stay out of argv).
# No AWS_PROFILE: ~/.aws is not mounted; keys in the environment or an instance role work.
AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
           "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
# The first line of the job's output: where the step really runs.
BANNER = ('echo "[amflow-container] $(. /etc/os-release && echo "$PRETTY_NAME"), '
          '$(python3 -V 2>&1), image $AMFLOW_IMAGE"; exec "$@"')


def amflow_cache() -> str:
    """The cache a local step uses (tasks.corpus: $AMFLOW_CACHE or ~/.cache/amflow)."""
    return os.environ.get("AMFLOW_CACHE") or os.path.expanduser("~/.cache/amflow")


def checkout_revision(path: str) -> str | None:
    """`git describe --always --dirty` of the checkout at `path` (None: not a checkout)."""
    try:
        done = subprocess.run(["git", "-C", path, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def default_image() -> str:
    """The CPU image `make image` builds: localhost/amflow:<project version>."""
    try:
        version = metadata.version("amflow")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "latest"
    return f"localhost/amflow:{version}"


def shm_option(options: list[str]) -> list[str]:
    """--shm-size of half the host's memory, unless `options` set one: Ray keeps its object
    store (30 % of memory) in /dev/shm when it fits, else in /tmp (disk: slower)."""
    if any(o.startswith("--shm-size") for o in options):
        return []
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return [f"--shm-size={mem_mb // 2}m"]


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def host_paths(uris: list[str], cwd: str) -> list[str]:
    """The local ones of `uris` as absolute paths (relative ones are relative to `cwd`, as
    the step sees them), without those inside another (one mount covers both)."""
    paths = sorted({os.path.normpath(os.path.join(cwd, u.removeprefix("file://")))
                    for u in uris if u and not is_remote(u)})
    return [p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/")
                                        for q in paths)]


class ContainerBackend(LocalBackend):
    """Steps in containers: `<engine> run` supervised as a local job (see module doc)."""

    mode = "container"

    def __init__(self, state_dir: Path, image: str, *, engine: str = "podman",
                 network: str = "none", options: list[str] = (), data_paths: list[str] = (),
                 cwd: str | None = None, env: dict[str, str] | None = None,
                 pass_env: tuple[str, ...] = ()):
        conf = os.environ.get("CONTAINERS_CONF") or (
            str(CONTAINERS_CONF) if CONTAINERS_CONF.exists() else "")
        # The engine client's environment: CONTAINERS_CONF, and runner.env, which goes on
        # into the container by name (--env NAME), so its values (tokens) stay out of the
        # command line, job.json and `ps`.
        client_env = {**({"CONTAINERS_CONF": conf} if conf else {}), **(env or {})}
        super().__init__(state_dir, cwd=cwd, env=client_env)
        self.image = image
        self.engine = engine
        self.network = network
        self.options = list(options)
        self.data_paths = list(data_paths)
        self.step_env = dict(env or {})
        self.pass_env = tuple(pass_env)
        self._stopping: set[str] = set()

    def _mounts(self, argv: list[str]) -> list[str]:
        """-v flags: the working dir read-only, the data paths read-write, and the dir of a
        --config outside the working dir read-only."""
        flags = ["-v", f"{self.cwd}:{self.cwd}:ro"]
        for path in [*self.data_paths, amflow_cache()]:
            flags += ["-v", f"{path}:{path}:rw"]
        if "--config" in argv[:-1]:
            config = os.path.join(self.cwd, argv[argv.index("--config") + 1])
            folder = os.path.dirname(os.path.normpath(config))
            inside = [self.cwd, *self.data_paths]
            if not any(folder == p or folder.startswith(p.rstrip("/") + "/") for p in inside):
                flags += ["-v", f"{folder}:{folder}:ro"]
        return flags

    def run_argv(self, jid: str, argv: list[str]) -> list[str]:
        """The engine command that runs `argv` in the image as container `jid`."""
        env = {"PYTHONUNBUFFERED": "1", "AMFLOW_IMAGE": self.image,
               "AMFLOW_CACHE": amflow_cache()}
        flags = [f"--env={k}={v}" for k, v in env.items()]
        flags += [f"--env={name}" for name in self.step_env]  # values: the client's env
        flags += [f"--env={name}" for name in self.pass_env
                  if name in os.environ and name not in self.step_env]
        return [self.engine, "run", "--rm", "--init", f"--name={jid}",
                f"--network={self.network}", f"--workdir={self.cwd}", *self._mounts(argv),
                *flags, *shm_option(self.options), *self.options, self.image,
                "sh", "-c", BANNER, "amflow-step", *argv]

    def _engine(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, **self.env)
        try:
            return subprocess.run([self.engine, *args], env=env, capture_output=True, text=True,
                                  timeout=120)
        except FileNotFoundError as exc:
            raise RunnerError(f"runner.container_engine: {self.engine} not found on this "
                              f"machine (runner.mode=container)") from exc

    def check_image(self) -> dict[str, str]:
        """The image's labels; RunnerError naming runner.image when there is no such image."""
        done = self._engine("image", "inspect", self.image)
        if done.returncode != 0:
            raise RunnerError(f"runner.image: {self.engine} has no image {self.image!r} "
                              f"(build the CPU one with `make image`, or pull it)")
        try:
            info = json.loads(done.stdout)[0]
        except (ValueError, IndexError, KeyError):
            return {}
        return (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}

    def revision_note(self, labels: dict[str, str]) -> str:
        built, here = labels.get("amflow.revision"), checkout_revision(self.cwd)
        if not built or not here or built == here:
            return ""
        return (f"[amflow-container] note: {self.image} was built from revision {built}, the "
                f"working dir is at {here}: the step runs the image's code (`make image`)\n")

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        if self.exists(jid):
            return False
        note = self.revision_note(self.check_image())
        if note:  # into the job's output, ahead of the step's
            self._dir(jid).mkdir(parents=True, exist_ok=True)
            with open(self._dir(jid) / "output.log", "a") as f:
                f.write(note)
        for path in [*self.data_paths, amflow_cache()]:  # a bind mount needs its source
            os.makedirs(path, exist_ok=True)
        return super().submit(jid, self.run_argv(jid, argv), resources)

    def remove(self, jid: str) -> None:
        """The container gone, whatever state it is in (nothing to remove is fine)."""
        grace = ["-t", "0"] if self.engine == "podman" else []  # already past any grace
        self._engine("rm", "-f", *grace, jid)

    def status(self, jid: str) -> str:
        status = super().status(jid)
        if status == FAILED and jid not in self._stopping \
                and read_json(self._dir(jid) / "rc.json") is None:
            # the podman client died without its supervisor's exit record (SIGKILL, OOM):
            # its container may still run, writing outputs nobody follows; once removed, the
            # exit record says so (and the next status check does not remove it again)
            self.remove(jid)
            self._record(jid, {"rc": None, "lost": True})
        return status

    def _record(self, jid: str, rc: dict) -> None:
        write_json(self._dir(jid) / "rc.json", {**rc, "finished_at": time.time()})

    def stop(self, jid: str, grace_s: float = 10.0) -> bool:
        self._stopping.add(jid)
        try:
            stopped = super().stop(jid, grace_s)
        finally:
            self._stopping.discard(jid)
        if stopped:
            self.remove(jid)
            if read_json(self._dir(jid) / "rc.json") is None:
                # SIGTERM came before the supervisor could record anything (a stop right
                # after the submit): the job was still stopped, not failed
                self._record(jid, {"rc": -15, "stopped": True})
        return stopped
