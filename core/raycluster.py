"""Ray plumbing: join or start Ray from config, and fan shards out as Ray tasks.

`map_shards` is the shell every data step shares: one Ray task per shard file, shards
that already have a done-marker are skipped (idempotent re-runs), each finished task
publishes its marker itself, and the driver shows progress as tasks complete. A step
whose input is smaller than `ray.inline_hours` runs the same shard function in its own
process instead (`runs_inline`): for a few minutes of audio, Ray's worker start and
imports cost more than the work.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator, Protocol, Sequence

from core.config import Config
from core.progress import Progress
from core.storage import Storage

log = logging.getLogger(__name__)

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
AUTH_MODE_VAR = "RAY_AUTH_MODE"  # Ray's token-auth switch: token | disabled


def init_ray(cfg: Config) -> None:
    """Connect to `ray.address`, or start a local Ray with `ray.num_cpus` CPUs."""
    import ray

    if ray.is_initialized():
        return
    threads = str(cfg.ray.worker_threads)
    env = {v: threads for v in THREAD_VARS}
    # Workers must reach the same S3 endpoint; credentials travel in the pickled config.
    runtime_env = {"env_vars": env}
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, runtime_env=runtime_env, logging_level=logging.WARNING,
                 log_to_driver=True)
    else:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        _token_auth_explicitly()
        ray.init(num_cpus=cfg.ray.num_cpus, num_gpus=cfg.ray.num_gpus,
                 include_dashboard=False, runtime_env=runtime_env,
                 logging_level=logging.WARNING, log_to_driver=True)


def _token_auth_explicitly() -> None:
    """Ray 2.60 turns token auth on for a new local cluster and, unless RAY_AUTH_MODE
    says so, logs a WARNING saying it did, in every step's log. Token auth is what we
    want (the cluster is this step's own, yet its ports listen on the node's address):
    saying so explicitly keeps the behaviour and drops the warning. A mode the user set
    (e.g. disabled) wins. Ray reads the mode into its config when imported, so the
    config is refreshed after setting it, as Ray does when it turns the mode on itself."""
    if os.environ.get(AUTH_MODE_VAR) is not None:
        return
    from ray._raylet import Config

    os.environ[AUTH_MODE_VAR] = "token"
    Config.initialize("")


def step_resources(cfg: Config, step: str) -> dict[str, float]:
    return dict(cfg.ray.step_resources.get(step, {}))


def runs_inline(cfg: Config, audio_hours: float | None) -> bool:
    """Whether a step with `audio_hours` of input runs in its own process (below
    `ray.inline_hours`; an unknown size runs on Ray)."""
    return audio_hours is not None and audio_hours < cfg.ray.inline_hours


@contextlib.contextmanager
def worker_threads(cfg: Config) -> Iterator[None]:
    """Torch's threads as a Ray task has them (`ray.worker_threads`), for work done in the
    step's process: the same arithmetic, so the same bytes, as on Ray."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(cfg.ray.worker_threads)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ShardedStep(Protocol):
    """What `map_shards` needs of a step (the app's `core.runs.StepContext` has it): its
    config and name, its storage, and its shards' done-markers (where they are, and the
    stats of a finished one; None: not finished, or --force redoes it)."""

    cfg: Config
    step: str
    storage: Storage

    def shard_marker(self, shard_id: str) -> str: ...

    def shard_done(self, shard_id: str) -> dict | None: ...


def _run_shard(fn: Callable[..., dict], ctx: ShardedStep, job: Any, shard_id: str,
               payload: Any) -> dict:
    stats = fn(job, shard_id, payload)
    stats = dict(stats, shard=shard_id)
    ctx.storage.write_json(ctx.shard_marker(shard_id), stats)
    return stats


def map_shards(ctx: ShardedStep, shards: Sequence[tuple[str, Any]],
               fn: Callable[[Any, str, Any], dict], job: Any, *, unit: str = "shards",
               num_cpus: float = 1, num_gpus: float = 0,
               postfix: Callable[[list[dict]], dict] | None = None,
               inline: bool = False) -> list[dict]:
    """Run `fn(job, shard_id, payload) -> stats` on Ray once per shard of step `ctx` not yet
    done (its marker, written here, says so); with `inline`, one after another in this
    process. `job` is the library's typed plan of the step (URIs and settings, shipped
    once to every task): libraries never see the run.

    Returns the stats of every shard (fresh or from its marker), in input order.
    """
    results: dict[str, dict] = {}
    todo = []
    for shard_id, payload in shards:
        done = ctx.shard_done(shard_id)
        if done is not None:
            results[shard_id] = done
        else:
            todo.append((shard_id, payload))
    if len(results):
        log.info("%s: %d of %d shards already done, skipping them", ctx.step, len(results),
                 len(shards))
    if todo:
        finished = (_inline(ctx, fn, job, todo) if inline
                    else _on_ray(ctx, fn, job, todo, num_cpus, num_gpus))
        with Progress(len(todo), ctx.step, unit) as bar:
            fresh: list[dict] = []
            for sid, stats in finished:
                results[sid] = stats
                fresh.append(stats)
                bar.update(1, **(postfix(fresh) if postfix else {}))
    return [results[sid] for sid, _ in shards]


def _inline(ctx: ShardedStep, fn: Callable[..., dict], job: Any,
            todo: list[tuple[str, Any]]) -> Iterator[tuple[str, dict]]:
    """(shard id, stats) of each shard, run one after another in this process."""
    with worker_threads(ctx.cfg):
        for sid, payload in todo:
            yield sid, _run_shard(fn, ctx, job, sid, payload)


def _on_ray(ctx: ShardedStep, fn: Callable[..., dict], job: Any, todo: list[tuple[str, Any]],
            num_cpus: float, num_gpus: float) -> Iterator[tuple[str, dict]]:
    """(shard id, stats) of each shard as its Ray task finishes (a task per shard)."""
    import ray

    init_ray(ctx.cfg)
    remote = ray.remote(_run_shard).options(
        num_cpus=num_cpus, num_gpus=num_gpus, max_retries=3,
        resources=step_resources(ctx.cfg, ctx.step) or None)
    fn_ref, ctx_ref, job_ref = ray.put(fn), ray.put(ctx), ray.put(job)
    pending = {remote.remote(fn_ref, ctx_ref, job_ref, sid, payload): sid
               for sid, payload in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            yield pending.pop(ref), ray.get(ref)
