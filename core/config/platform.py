"""Where amflow runs: `storage.*`, `data.*`, `ray.*`, `runner.*`, `cost.*`."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.errors import check

@dataclass
class S3Config:
    # Empty values mean "use the standard AWS chain" (env, profile, instance role).
    endpoint_url: str = ""  # a non-AWS endpoint, e.g. http://minio:9000
    region: str = ""  # AWS region, e.g. eu-west-1
    access_key_id: str = ""  # static credentials (prefer a profile or an instance role)
    secret_access_key: str = ""  # with access_key_id
    session_token: str = ""  # with temporary credentials
    # Path-style addressing is required by most non-AWS endpoints (moto, MinIO).
    force_path_style: bool = False


@dataclass
class StorageConfig:
    root: str = "./data"  # where runs live (runs/<run_id>/<step>/): a path, file:// or s3:// URI
    s3: S3Config = field(default_factory=S3Config)
    retries: int = 5  # retries of a transient storage error (throttling, 5xx, timeouts)
    retry_backoff_s: float = 0.5  # first retry delay; doubles per retry, with jitter

    def validate(self, key: str) -> None:
        check(bool(self.root.strip()), f"{key}.root", "must be a non-empty URI")
        check(self.retries >= 0, f"{key}.retries", "must be >= 0")


@dataclass
class DataConfig:
    corpus: str = "./data/corpus"  # the input corpus (path or URI) in the input format
    # Pronunciation lexicon (Kaldi lexicon.txt) for decoding; empty = <corpus>/lexicon.txt,
    # which `amflow corpus` writes for the embedded corpus.
    lexicon: str = ""

    def lexicon_uri(self, corpus: str | None = None) -> str:
        """The lexicon to read: `lexicon`, else <corpus>/lexicon.txt (default: `corpus`)."""
        return self.lexicon or (corpus or self.corpus).rstrip("/") + "/lexicon.txt"

    def validate(self, key: str) -> None:
        check(bool(self.corpus.strip()), f"{key}.corpus", "must be a non-empty URI")


@dataclass
class RayConfig:
    # Empty address: start (or join) a local Ray on this machine.
    address: str = ""
    num_cpus: int = 2  # CPUs of the local Ray a step starts (ignored when joining ray.address)
    num_gpus: int = 0  # GPUs of the local Ray a step starts
    # Torch/BLAS threads inside each Ray task, so tasks do not oversubscribe the cores.
    worker_threads: int = 1
    # Custom resources each step requests, so it lands on its pool on a cluster
    # (e.g. {"features": {"pool_c4": 0.01}}). Empty on a laptop.
    step_resources: dict[str, dict[str, float]] = field(default_factory=dict)
    # A step (features, targets, repartition, decode, pseudolabel) whose input holds less
    # audio than this (hours) runs its shards in its own process, not on Ray: starting Ray's
    # workers (a teacher actor, decode actors) costs a few minutes of audio more than its
    # work. 0: always Ray.
    inline_hours: float = 0.0

    def validate(self, key: str) -> None:
        check(self.num_cpus >= 1, f"{key}.num_cpus", "must be >= 1")
        check(self.num_gpus >= 0, f"{key}.num_gpus", "must be >= 0")
        check(self.inline_hours >= 0, f"{key}.inline_hours", "must be >= 0 hours")


@dataclass
class RunnerConfig:
    """Where Airflow runs a step: a local subprocess, a container or a Ray job on a cluster."""

    mode: str = "local"  # local | container | ray_job
    # Mode=ray_job: the Ray job API (the head's dashboard address).
    ray_dashboard: str = "http://127.0.0.1:8265"
    # How an Airflow task waits for its job. defer: hand the wait to Airflow's triggerer
    # (one try from submit to end, so the task's duration is the step's; no worker slot
    # or execution-API token held while waiting). reschedule: poke in short tries (for
    # an Airflow without a triggerer); the UI then shows only the last poke's duration.
    wait: str = "defer"
    # With wait=defer, follow the job this long in the task itself first: a step that ends
    # by then finishes without a deferral round trip (a second worker start and DAG parse).
    defer_after_s: float = 20.0
    poll_s: float = 5.0  # longest pause between two status checks of a running job
    # One Airflow try waits at most this long (and at most half the execution-API token
    # lifetime) before handing over to the next poke (UP_FOR_RESCHEDULE, same try number).
    max_wait_per_try_s: float = 600.0
    # Pause between two tries of a step that still runs. Keep it above the executor's
    # event latency (a few scheduler loops): a poke that starts before the scheduler saw
    # the previous one end is taken for a stray success and failed by Airflow.
    reschedule_s: float = 30.0
    # The command that runs a step; the step name and its arguments are appended.
    command: list[str] = field(default_factory=lambda: ["amflow"])
    # Directory the step runs in. Empty: the project root for local steps; for Ray jobs the
    # job's own working directory (set it to the image's project dir, e.g. /app).
    workdir: str = ""
    # Where the runner keeps job state (pid, exit code, log, log cursor) on the Airflow side.
    # Empty: $AMFLOW_RUNNER_STATE, else $AIRFLOW_HOME/amflow_jobs, else ~/.cache/amflow/jobs.
    state_dir: str = ""
    # Give up (stop the job, fail the try) after this many seconds; 0 = no limit.
    step_timeout_s: float = 0.0
    # Extra environment variables for the step (a Ray job's runtime_env env_vars).
    env: dict[str, str] = field(default_factory=dict)
    # mode=container (amflow.jobs.container): the image a step runs in (empty: the CPU image
    # `make image` builds, localhost/amflow:<project version>), the engine's CLI (podman, or
    # docker: the same `run` flags), the container's network (empty: none when storage and
    # corpus are local paths, host when one is on S3) and extra `run` options. Without a
    # --shm-size among them /dev/shm gets half the host's memory (podman's default is 64 MB;
    # Ray puts its object store, 30 % of memory, there, else on the slower disk).
    image: str = ""
    container_engine: str = "podman"  # podman | docker
    container_network: str = ""  # empty (auto) | none | host | bridge | slirp4netns
    # Extra `run` options, e.g. --shm-size=8g.
    container_options: list[str] = field(default_factory=list)

    def validate(self, key: str) -> None:
        check(self.mode in ("local", "container", "ray_job"), f"{key}.mode",
               "must be local, container or ray_job")
        check(self.container_engine in ("podman", "docker"), f"{key}.container_engine",
               "must be podman or docker")
        check(self.container_network in ("", "none", "host", "bridge", "slirp4netns"),
               f"{key}.container_network",
               "must be empty (auto), none, host, bridge or slirp4netns")
        check(not self.image or " " not in self.image, f"{key}.image",
               f"must be an image reference without spaces, got {self.image!r}")
        check(self.wait in ("defer", "reschedule"), f"{key}.wait", "must be defer or reschedule")
        check(self.defer_after_s >= 0, f"{key}.defer_after_s", "must be >= 0")
        check(self.poll_s > 0, f"{key}.poll_s", "must be > 0")
        check(self.max_wait_per_try_s >= self.poll_s, f"{key}.max_wait_per_try_s",
               "must be >= runner.poll_s")
        check(self.reschedule_s > 0, f"{key}.reschedule_s", "must be > 0")
        check(bool(self.command), f"{key}.command", "must name an executable")
        check(self.step_timeout_s >= 0, f"{key}.step_timeout_s", "must be >= 0")


@dataclass
class CostConfig:
    """On-demand USD/hour, for the infra cost estimate (python -m amflow.cost)."""

    p3_16xlarge: float = 24.48  # USD/hour of a GPU-pool node (8 x V100)
    x1_32xlarge: float = 13.338  # USD/hour of a memory-pool node
    c4_4xlarge: float = 0.796  # USD/hour of a CPU-pool node
    # How many measured CPU cores one GPU-pool vCPU is worth for GPU steps measured
    # without a GPU; 1.0 assumes no GPU speedup (an upper bound on cost).
    gpu_speedup: float = 1.0

    def validate(self, key: str) -> None:
        for name in ("p3_16xlarge", "x1_32xlarge", "c4_4xlarge"):
            check(getattr(self, name) >= 0, f"{key}.{name}", "must be >= 0")
        check(self.gpu_speedup > 0, f"{key}.gpu_speedup", "must be > 0")
