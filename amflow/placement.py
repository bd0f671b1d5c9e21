"""What a config asks of a Ray cluster, and whether a cluster's node types provide it.

Every Ray resource request a step makes on a cluster, computed from the config the way the
step's code computes it:

- the job driver: `ray.step_resources[step]` as the Ray job's `entrypoint_resources`
  (amflow.jobs), for every step the DAGs place on a cluster (the registry's `placed`
  steps: amflow.steps.registry);
- shard tasks (the registry's `shard_tasks` steps: select, features, repartition, corpus;
  core.raycluster.map_shards): 1 CPU + the step's pool sliver;
- teacher actors (targets): `targets.threads_per_actor` CPUs, GPUs per
  `gpus_per_actor` below (1 per actor when the cluster has GPUs and
  `targets.device` allows), + the pool sliver;
- training workers (train, Ray Train): 1 CPU, 1 GPU when `train.use_gpu`, + the pool sliver;
  example servers (`train.augment.enabled`): `cpus_per_server` + `augment.resources`;
- decoding actors (decode): 1 CPU + the pool sliver.

`unplaceable(cfg, node_types)` lists the requests that no node type satisfies, so a
misnamed pool or a GPU count no node has fails a check at once instead of waiting forever
on a cluster. `node_types` is `available_node_types` of a Ray cluster launcher template
(`infra/ray/cluster-aws.yaml`), or any {name: {"resources": {...}}}.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from amflow.steps.registry import names
from core.config import Config


def dag_steps() -> tuple[str, ...]:
    """The steps the DAGs run as Ray jobs (dags/*.py), each placed by ray.step_resources."""
    return names(placed=True)


@dataclass(frozen=True)
class Request:
    step: str
    what: str  # "driver", "shard task", "teacher actor", ...
    resources: dict[str, float]

    def __str__(self) -> str:
        return f"{self.step} {self.what} {self.resources}"


def _with(base: dict[str, float], **extra: float) -> dict[str, float]:
    out = {k: float(v) for k, v in extra.items() if v}
    out.update({k: float(v) for k, v in base.items()})
    return out


def cluster_has_gpus(node_types: dict[str, Any]) -> bool:
    return any(float((nt.get("resources") or {}).get("GPU", 0)) > 0 for nt in node_types.values())


def gpus_per_actor(cfg: Config, cluster_gpus: float) -> float:
    """-1 (default): one GPU per actor when the device may be a GPU and the cluster has GPUs.
    Lives here (plumbing) so placement and the targets step share it without an upward import."""
    tc = cfg.targets
    if tc.num_gpus_per_actor >= 0:
        return tc.num_gpus_per_actor
    return 1.0 if tc.device in ("auto", "cuda") and cluster_gpus > 0 else 0.0


def requests(cfg: Config, gpus_in_cluster: bool = True) -> list[Request]:
    """Every resource request the config makes of a cluster (see the module doc)."""
    sr = cfg.ray.step_resources
    out = [Request(step, "driver", _with(sr.get(step, {}))) for step in dag_steps()]
    for step in names(shard_tasks=True):
        out.append(Request(step, "shard task", _with(sr.get(step, {}), CPU=1)))
    gpus = gpus_per_actor(cfg, 1.0 if gpus_in_cluster else 0.0)
    out.append(Request("targets", "teacher actor",
                       _with(sr.get("targets", {}), CPU=cfg.targets.threads_per_actor,
                             GPU=gpus)))
    out.append(Request("train", "Ray Train worker",
                       _with(sr.get("train", {}), CPU=1, GPU=1 if cfg.train.use_gpu else 0)))
    aug = cfg.train.augment
    if aug.enabled and aug.servers > 0:
        out.append(Request("train", "example server",
                           _with(aug.resources, CPU=aug.cpus_per_server)))
    out.append(Request("decode", "decoding actor", _with(sr.get("decode", {}), CPU=1)))
    return out


def satisfies(resources: dict[str, Any], request: dict[str, float]) -> bool:
    return all(float(resources.get(k, 0)) >= v for k, v in request.items())


def fitting_nodes(node_types: dict[str, Any], request: dict[str, float]) -> list[str]:
    return [name for name, nt in node_types.items()
            if satisfies(nt.get("resources") or {}, request)]


def unplaceable(cfg: Config, node_types: dict[str, Any]) -> list[str]:
    """Requests no node type can hold, as readable lines (empty: all placeable)."""
    bad = []
    gpus = cluster_has_gpus(node_types)
    provided = {k for nt in node_types.values() for k in (nt.get("resources") or {})}
    for req in requests(cfg, gpus_in_cluster=gpus):
        if fitting_nodes(node_types, req.resources):
            continue
        missing = sorted(k for k in req.resources if k not in provided)
        why = (f"no node type provides {', '.join(missing)}" if missing
               else "no single node type has all of it")
        bad.append(f"{req}: {why} (node types: {', '.join(sorted(node_types))})")
    return bad


def pools_of(cfg: Config) -> dict[str, set[str]]:
    """{step: the custom (pool) resources its config names}: where its work must run."""
    return {step: {k for k in res if k not in ("CPU", "GPU", "memory")}
            for step, res in cfg.ray.step_resources.items()}


def load_node_types(cluster_yaml: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(cluster_yaml).read_text())["available_node_types"]
