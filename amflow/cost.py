"""What N hours of audio cost end to end on the EC2 pools, from measured throughputs.

Reads each step's `_SUCCESS.json` of a finished run (wall time and audio hours, measured
on the machine that ran it with `ray.num_cpus` cores of the run's config), turns it into
audio hours per core-second, and projects it onto the pool the target config places the
step on (`ray.step_resources` -> pool_p3 | pool_x1 | pool_c4, node sizes from
infra/ray/cluster-aws.yaml, on-demand prices from `cost.*`):

    node_hours(step) = hours / (rate_per_core_s * node_vcpus * speedup) / 3600 * epochs_ratio
    cost(step)       = node_hours * price(pool)

`speedup` is `cost.gpu_speedup` for steps on the GPU pool when the measurement had no GPU
(1.0 = none assumed: an upper bound on cost), else 1. Train time also scales with
train.epochs (target over measured). Wall clock assumes the pool's max_workers nodes.

    python -m amflow.cost --runs data/runs/<run_id> --config configs/aws.yaml --hours 1000
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from amflow.config import Config, load_config
from amflow.storage import Storage, join

STEPS = ["select", "features", "targets", "repartition", "train", "evaluate"]
POOL_PRICE = {"pool_p3": "p3_16xlarge", "pool_x1": "x1_32xlarge", "pool_c4": "c4_4xlarge"}
CLUSTER_YAML = Path(__file__).resolve().parents[1] / "infra" / "ray" / "cluster-aws.yaml"


@dataclass
class StepCost:
    step: str
    pool: str
    measured_hours: float
    measured_wall_s: float
    rate: float  # audio hours per core-second, as measured
    node_hours: float
    usd: float
    wall_h: float


def pools_from_cluster(path: Path = CLUSTER_YAML) -> dict[str, dict[str, Any]]:
    """pool resource name -> {node_type, vcpus, gpus, max_workers} from the cluster file."""
    cluster = yaml.safe_load(path.read_text())
    out = {}
    for name, nt in cluster["available_node_types"].items():
        res = nt.get("resources", {})
        for key in res:
            if key.startswith("pool_"):
                out[key] = {"node_type": name, "instance": nt["node_config"]["InstanceType"],
                            "vcpus": int(res.get("CPU", 0)), "gpus": int(res.get("GPU", 0)),
                            "max_workers": int(nt.get("max_workers", 1))}
    return out


def _step_summary(storage: Storage, run: str, step: str) -> dict[str, Any] | None:
    for name in (step, f"{step}-teacher"):
        uri = join(run, name, "_SUCCESS.json")
        if storage.exists(uri):
            return storage.read_json(uri)
    return None


def estimate(run_uri: str, measured: Config, target: Config, hours: float,
             pools: dict[str, dict[str, Any]] | None = None) -> list[StepCost]:
    pools = pools or pools_from_cluster()
    storage = Storage(measured.storage)
    select = _step_summary(storage, run_uri, "select") or {}
    run_hours = float((select.get("metrics") or {}).get("audio_hours") or 0.0)
    cores = max(1, measured.ray.num_cpus)
    out = []
    for step in STEPS:
        s = _step_summary(storage, run_uri, step)
        if s is None:
            continue
        req = target.ray.step_resources.get(step, {})
        pool = next((k for k in req if k in pools), None)
        if pool is None:
            continue
        m_hours = float((s.get("metrics") or {}).get("audio_hours") or run_hours)
        wall = float(s.get("wall_s") or 0.0)
        if m_hours <= 0 or wall <= 0:
            continue
        rate = m_hours / (wall * cores)
        info = pools[pool]
        speedup = 1.0
        if info["gpus"] and measured.ray.num_gpus == 0:
            speedup = target.cost.gpu_speedup
        epochs = target.train.epochs / max(1, measured.train.epochs) if step == "train" else 1.0
        node_h = hours / (rate * info["vcpus"] * speedup) / 3600.0 * epochs
        price = getattr(target.cost, POOL_PRICE[pool])
        out.append(StepCost(step, pool, m_hours, wall, rate, node_h, node_h * price,
                            node_h / max(1, info["max_workers"])))
    return out


def table(rows: list[StepCost], hours: float, pools: dict[str, dict[str, Any]]) -> str:
    lines = [f"Cost of {hours:g} audio hours end to end (on-demand, from measured throughput)",
             "", "| step | pool | measured h | measured s | h/core-s | node-hours | USD | wall h |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.step} | {pools[r.pool]['instance']} | {r.measured_hours:.4g} | "
                     f"{r.measured_wall_s:.4g} | {r.rate:.3g} | {r.node_hours:.4g} | "
                     f"{r.usd:,.2f} | {r.wall_h:.3g} |")
    lines.append(f"| **total** | | | | | {sum(r.node_hours for r in rows):.4g} | "
                 f"**{sum(r.usd for r in rows):,.2f}** | {sum(r.wall_h for r in rows):.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m amflow.cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="a finished run's URI (<root>/runs/<id>)")
    p.add_argument("--measured-config", default="configs/local.yaml",
                   help="config the run was measured with (cores, epochs, storage)")
    p.add_argument("--config", default="configs/aws.yaml", help="target config (pools, prices)")
    p.add_argument("--hours", type=float, default=1000.0)
    p.add_argument("--cluster", default=str(CLUSTER_YAML))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    measured, target = load_config(a.measured_config), load_config(a.config)
    pools = pools_from_cluster(Path(a.cluster))
    rows = estimate(a.runs, measured, target, a.hours, pools)
    if not rows:
        print(f"no measured steps under {a.runs}")
        return 1
    if a.json:
        print(json.dumps([r.__dict__ for r in rows], indent=1))
    else:
        print(table(rows, a.hours, pools))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
