"""Launching the training worker function on many processes.

`run_distributed(train_worker_fn, plan, cfg, launch)` runs `train_worker_fn(plan)` on a
Ray Train `TorchTrainer` with `train.workers` workers (gloo on the CPU; NCCL when `train.use_gpu`
and the cluster has enough GPUs), and returns what rank 0 returned. Ray Train creates the
torch.distributed process group before the function starts; the function reads rank and
world size from `torch.distributed` and builds its algorithm with
`training.algorithms.build_algorithm` (group None = WORLD).

Checkpoints carry the algorithm state, per rank. A worker function calls

    state = load_checkpoint()            # None on a fresh start, else this rank's dict
    ...
    save_checkpoint({"model": ..., "algorithm": algo.state_dict(), ...}, metrics)

`save_checkpoint` must be called by every rank at the same point (it is a barrier):
each rank writes `rank-<r>.pt` into a temporary directory and reports it with
`ray.train.report`; Ray Train merges them into one checkpoint directory on
persistent storage. `FailureConfig(max_failures=...)` restarts a failed worker group,
and the restarted function finds the last checkpoint through `ray.train.get_checkpoint()`.
(BMUF workers' local models, MA's drifting replicas and GTC residuals differ per rank,
hence one file per rank rather than rank 0's copy.)

The plan (a `training.plan.WorkerPlan` for the train step) reaches the workers as it is,
inside Ray Train's `train_loop_config`; how to launch them is the `training.plan.LaunchSpec`
(where Ray Train persists checkpoints, the experiment name, max_failures, checkpoints
kept, CPUs per worker).

`spawn_local(fn, world_size, *args)` runs `fn(rank, world_size, *args)` in `world_size`
fresh processes joined by a gloo process group, without Ray: the multi-process tests and
the trainer benchmark use it.
"""
from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from core.config import Config, TrainConfig
from core.outcomes import StepError
from core.raycluster import init_ray, step_resources
from core.storage import Storage, is_s3
from training.algorithms import build_algorithm
from training.plan import LaunchSpec

# Ray is imported inside the functions that use it: every training imports this module,
# and a one-worker training (or a spawn_local test) should not pay Ray's import time.

log = logging.getLogger(__name__)

CKPT_PREFIX = "rank-"


# ---------------------------------------------------------------------------------------
# Inside a worker: checkpoints.
# ---------------------------------------------------------------------------------------

def in_ray_train() -> bool:
    try:
        import ray.train

        ray.train.get_context().get_world_rank()
        return True
    except Exception:
        return False


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_checkpoint(state: dict[str, Any], metrics: dict[str, Any] | None = None) -> None:
    """Report this rank's `state` (torch.save-able) as part of one checkpoint. Every rank
    must call it at the same point. Outside Ray Train it does nothing."""
    if not in_ray_train():
        return
    import ray.train

    with tempfile.TemporaryDirectory(prefix="amflow-ckpt-") as tmp:
        torch.save(state, os.path.join(tmp, f"{CKPT_PREFIX}{_rank()}.pt"))
        ray.train.report(dict(metrics or {}),
                         checkpoint=ray.train.Checkpoint.from_directory(tmp))


def load_checkpoint(map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """This rank's state from the latest reported checkpoint, or None (fresh start).
    A checkpoint written by a different number of workers gives rank 0's state to
    every rank that has no file of its own."""
    if not in_ray_train():
        return None
    import ray.train

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        path = Path(d) / f"{CKPT_PREFIX}{_rank()}.pt"
        if not path.exists():
            path = Path(d) / f"{CKPT_PREFIX}0.pt"
        if not path.exists():
            return None
        return torch.load(path, map_location=map_location, weights_only=False)


# ---------------------------------------------------------------------------------------
# The launcher.
# ---------------------------------------------------------------------------------------

def _gpus_available(workers: int) -> bool:
    """One GPU per worker must be in the Ray cluster (else Ray Train would wait forever)."""
    import ray

    return ray.cluster_resources().get("GPU", 0) >= workers


def _storage_path(launch: LaunchSpec, cfg: Config) -> tuple[str, Any]:
    """(storage_path, pyarrow filesystem or None) for Ray Train's persistent storage."""
    uri = launch.storage_path
    if not uri:  # where checkpoints go is the caller's to say (training.launch: <train_dir>/ray)
        raise StepError("LaunchSpec.storage_path is empty: name the folder where Ray Train "
                        "keeps the training's checkpoints (e.g. <train_dir>/ray)")
    if is_s3(uri):
        storage = Storage(cfg.storage)
        fs, path = storage.resolve(uri)
        return path, fs
    path = uri[len("file://"):] if uri.startswith("file://") else uri
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    return path, None


def _worker_entry(config: dict[str, Any]) -> Any:
    """What every Ray Train worker runs: pin threads, then the user's function."""
    threads = int(config.get("threads", 1))
    torch.set_num_threads(threads)
    # Ray Train starts workers in a session artifacts dir: relative local paths in the
    # plan (storage.root: ./data) mean the driver's working dir, where it exists.
    if config.get("cwd") and os.path.isdir(config["cwd"]):
        os.chdir(config["cwd"])
    fn = config["fn"]
    return fn(config["plan"])


def worker_resources(cfg: Config, cpus_per_worker: float, use_gpu: bool) -> dict[str, float]:
    """One Ray Train worker's resources: CPU, a GPU when training on GPUs, and the train
    step's pool sliver (`ray.step_resources.train`), so the workers run on the pool the
    config names (the P3 nodes on the cluster), not wherever a CPU is free."""
    return {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {}),
            **step_resources(cfg, "train")}


def run_distributed(train_worker_fn: Callable[[Any], dict], plan: Any, cfg: Config,
                    launch: LaunchSpec) -> dict:
    """Run `train_worker_fn(plan)` on `cfg.train.workers` Ray Train workers, launched as
    `launch` says; returns rank 0's return value (a dict), with `ray_result_path` and
    `ray_checkpoint` added. `plan` is passed to the workers as it is (pickled by Ray)."""
    # Deferred: Ray and Ray Train load only when a training is distributed (seconds).
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    init_ray(cfg)
    train = cfg.train
    workers = int(train.workers)
    use_gpu = bool(train.use_gpu) and _gpus_available(workers)
    if train.use_gpu and not use_gpu:
        log.warning("train.use_gpu is set but the cluster has fewer than %d GPUs: "
                    "training on CPU with gloo", workers)
    backend = "nccl" if use_gpu else "gloo"
    cpus = float(ray.cluster_resources().get("CPU", 1))
    cpus_per_worker = float(launch.cpus_per_worker or min(1.0, cpus / workers))
    storage_path, fs = _storage_path(launch, cfg)
    log.info("run_distributed: %d workers, backend %s, %.2f CPU each, checkpoints under %s",
             workers, backend, cpus_per_worker, storage_path)
    name = launch.name or f"adhoc-{train.algorithm}"
    trainer = TorchTrainer(
        _worker_entry,
        train_loop_config={"fn": train_worker_fn, "plan": plan, "cwd": os.getcwd(),
                           "threads": max(int(cfg.ray.worker_threads), 1)},
        torch_config=TorchConfig(backend=backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers, use_gpu=use_gpu,
            resources_per_worker=worker_resources(cfg, cpus_per_worker, use_gpu)),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage_path, storage_filesystem=fs,
            failure_config=ray.train.FailureConfig(max_failures=launch.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=launch.num_to_keep)),
    )
    t0 = time.time()
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    out = dict(result.return_value or {})
    out["ray_result_path"] = result.path
    out["ray_checkpoint"] = result.checkpoint.path if result.checkpoint else None
    out.setdefault("wall_seconds", round(time.time() - t0, 3))
    out.setdefault("backend", backend)
    return out


# ---------------------------------------------------------------------------------------
# Without Ray: N local processes on one gloo group (tests, benchmarks).
# ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_entry(rank: int, world: int, port: int, out_dir: str, threads: int,
                 fn: Callable[..., Any], args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_local(fn: Callable[..., Any], world_size: int, *args: Any,
                threads: int = 1, timeout: float = 600.0) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` spawned processes sharing a gloo
    process group (TCP on localhost); returns every rank's return value, by rank.
    `fn` must be importable (a module-level function)."""

    with tempfile.TemporaryDirectory(prefix="amflow-spawn-") as out:
        ctx = mp.spawn(_spawn_entry, args=(world_size, free_port(), out, threads, fn, args),
                       nprocs=world_size, join=False)
        deadline = time.time() + timeout
        while not ctx.join(timeout=1.0):
            if time.time() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                raise TimeoutError(f"spawn_local: {fn.__name__} did not finish in {timeout} s")
        return [torch.load(os.path.join(out, f"{r}.pt"), weights_only=False)
                for r in range(world_size)]


# ---------------------------------------------------------------------------------------
# A self-contained worker function: the launcher's smoke test and fault-injection target.
# ---------------------------------------------------------------------------------------

def toy_worker(plan: dict) -> dict:
    """Train a tiny LSTM on deterministic synthetic data with `plan["train"]` (TrainConfig
    overrides), checkpointing every `plan["checkpoint_every"]` steps. With
    `plan["crash_at"]` and `plan["crash_marker"]` the worker of rank `plan["crash_rank"]`
    kills its own process once (the marker file records that it did), to exercise
    FailureConfig recovery. Returns rank 0's final weights and counters."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    train = TrainConfig.from_flat(**(plan.get("train") or {}))
    torch.manual_seed(0)
    model = nn.Sequential()
    model.lstm = nn.LSTM(5, 8, batch_first=True)
    model.out = nn.Linear(8, 3)

    def forward(x):
        return model.out(model.lstm(x)[0])

    opt = torch.optim.Adam(model.parameters(), lr=train.optim.lr)
    algo = build_algorithm(train, model, opt)
    start = 0
    state = load_checkpoint()
    if state is not None:
        model.load_state_dict(state["model"])
        algo.load_state_dict(state["algorithm"])
        start = state["step"]
    steps = int(plan.get("steps", 10))
    every = int(plan.get("checkpoint_every", 2))
    for step in range(start, steps):
        if (plan.get("crash_at") == step and rank == plan.get("crash_rank", 1)
                and not os.path.exists(plan["crash_marker"])):
            Path(plan["crash_marker"]).write_text(f"killed rank {rank} at step {step}\n")
            # let the reports already sent reach the controller: on a loaded machine the
            # group once died before even step 2's was registered, and restarted from 0
            time.sleep(2.0)
            os._exit(1)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(4, 6, 5, generator=g)
        y = torch.randint(0, 3, (4, 6), generator=g)
        algo.zero_grad()
        loss = nn.functional.cross_entropy(forward(x).reshape(-1, 3), y.reshape(-1))
        loss.backward()
        algo.step(num_frames=24)
        if (step + 1) % every == 0 and step + 1 < steps:
            save_checkpoint({"model": model.state_dict(), "algorithm": algo.state_dict(),
                             "step": step + 1}, {"step": step + 1, "loss": float(loss.detach())})
    algo.finalize()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"rank": rank, "resumed_from": start, "weights": weights.tolist(),
            "stats": algo.stats()}


def toy_spawn(rank: int, world: int, plan: dict) -> dict:
    """`toy_worker` under `spawn_local` (no Ray): the uninterrupted reference."""
    return toy_worker(plan)
