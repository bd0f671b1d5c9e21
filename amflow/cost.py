"""What N hours of audio cost end to end on the EC2 pools, from measured throughputs.

Reads each step's `_SUCCESS.json` of a finished run (audio hours, and the step's own
compute throughput -- features xrt_per_task, targets frames_per_s, train train_seconds --
or else its wall time, measured on the machine that ran it with `ray.num_cpus` cores of
the run's config), turns it into audio hours per core-second, and projects it onto the pool the target config places the
step on (`ray.step_resources` -> pool_p3 | pool_x1 | pool_c4, node sizes from
infra/ray/cluster-aws.yaml, on-demand prices from `cost.*`):

    node_hours(step) = hours / (rate_per_core_s * node_vcpus * speedup) / 3600 * epochs_ratio
    cost(step)       = node_hours * price(pool)

`speedup` is `cost.gpu_speedup` for steps on the GPU pool when the measurement had no GPU
(1.0 = none assumed: an upper bound on cost), else 1. The steps priced, and how each
scales, are the registry's (amflow.steps.registry, a step's `cost`): model steps scale with
the model's size (LSTM compute per frame ~ parameters: target config's model over the
measured one, read from the train summary and the teacher's), and train also with
train.epochs (target over measured). Wall clock assumes the pool's max_workers nodes.

    python -m amflow.cost --runs data/runs/<run_id> --config configs/aws.yaml --hours 1000

(Its old home, core/cost.py, is gone: the base never imports the app.)
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from amflow.steps.registry import AUDIO, STEPS, STUDENT, STUDENT_EPOCHS, TEACHER
from core.config import Config, load_config
from core.storage import Storage, join

POOL_PRICE = {"pool_p3": "p3_16xlarge", "pool_x1": "x1_32xlarge", "pool_c4": "c4_4xlarge"}
CLUSTER_YAML = Path(__file__).resolve().parents[1] / "infra" / "ray" / "cluster-aws.yaml"


# the LSTM families the cost model scales by (config.model.<kind>): their directions
LSTM_DIRECTIONS = {"student": 1, "teacher": 2}


def lstm_params(cfg: Config, kind: str, num_classes: int) -> int:
    """Parameters of the `kind` (student | teacher) model of a config (no torch needed)."""
    m, dirs = getattr(cfg.model, kind), LSTM_DIRECTIONS[kind]
    total, in_dim = 0, cfg.features.num_mel_bins * cfg.features.stack
    for layer in range(m.layers):
        d = in_dim if layer == 0 else m.hidden * dirs
        total += dirs * 4 * m.hidden * (d + m.hidden + 2)
    return total + m.hidden * dirs * num_classes + num_classes


def _classes_from_params(cfg: Config, kind: str, params: int) -> int:
    body = lstm_params(cfg, kind, 0)
    width = LSTM_DIRECTIONS[kind] * getattr(cfg.model, kind).hidden + 1
    return max(1, round((params - body) / width))


@dataclass
class StepCost:
    step: str
    pool: str
    measured_hours: float
    measured_wall_s: float
    rate: float  # audio hours per core-second (per GPU-second if measured on GPUs)
    scale: float  # model size x epochs, target over measured
    node_hours: float
    usd: float
    wall_h: float
    basis: str = "wall"  # what the rate was measured from


def _rate(step: str, s: dict[str, Any], measured: Config, hours: float, wall: float,
          cores: int) -> tuple[float, int, str]:
    """(audio hours per second, CPU cores that rate used, basis): from the step's own
    compute throughput when it reports one (startup and scheduling excluded, which
    dominate a small run), else from wall time over all of `ray.num_cpus`."""
    m = s.get("metrics") or {}
    frame_s = measured.features.frame_shift_ms / 1000.0 * measured.features.subsample
    if step == "features" and m.get("xrt_per_task"):
        return float(m["xrt_per_task"]) / 3600.0, 1, "xrt_per_task"
    if step == "targets" and m.get("frames_per_s"):
        slots = max(1, measured.targets.actors * measured.targets.threads_per_actor)
        return float(m["frames_per_s"]) * frame_s / 3600.0, slots, "frames_per_s"
    if step == "train" and m.get("train_seconds"):
        return hours / float(m["train_seconds"]), cores, "train_seconds"
    return hours / wall, cores, "wall"


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
    scale = _model_scales(storage, run_uri, measured, target)
    out = []
    for step in priced_steps():
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
        total, cpu_slots, basis = _rate(step, s, measured, m_hours, wall, cores)
        info = pools[pool]
        if info["gpus"] and measured.ray.num_gpus > 0:  # measured on GPUs: per-GPU rates
            rate, node_slots = total / measured.ray.num_gpus, info["gpus"]
        else:
            rate, node_slots = total / cpu_slots, info["vcpus"]
            if info["gpus"]:
                node_slots *= target.cost.gpu_speedup
        k = scale.get(step, 1.0)
        node_h = hours / (rate * node_slots) / 3600.0 * k
        price = getattr(target.cost, POOL_PRICE[pool])
        out.append(StepCost(step, pool, m_hours, wall, rate, k, node_h, node_h * price,
                            node_h / max(1, info["max_workers"]), basis))
    return out


def priced_steps() -> list[str]:
    """The steps the cost model prices (the registry's steps with a `cost`), in order."""
    return [name for name, s in STEPS.items() if s.cost]


def planned_classes(cfg: Config) -> int:
    """The class count a config will train (0: unknown before its run): the network tree's
    leaves with features.labels=align, at most align.nn_senones (align.num_senones when 0);
    else model.num_classes (0: the run's phone inventory)."""
    if cfg.features.labels == "align" and not cfg.model.num_classes:
        return cfg.align.nn_senones or cfg.align.num_senones
    return cfg.model.num_classes


def _model_scales(storage: Storage, run_uri: str, measured: Config,
                  target: Config) -> dict[str, float]:
    """Per priced step: target compute per audio hour over the measured run's (its
    registry `cost` says which model's size, and whether epochs, scale it)."""
    train = _step_summary(storage, run_uri, "train") or {}
    student_params = (train.get("metrics") or {}).get("parameters")
    classes = (_classes_from_params(measured, "student", int(student_params))
               if student_params else max(1, planned_classes(target)))
    t_classes = planned_classes(target) or classes
    student = lstm_params(target, "student", t_classes) / (
        student_params or lstm_params(measured, "student", classes))
    teacher_params = None
    targets = _step_summary(storage, run_uri, "targets") or {}
    teacher_uri = (targets.get("inputs") or {}).get("teacher")
    if isinstance(teacher_uri, str) and teacher_uri:
        from core.storage import parent

        summary_uri = join(parent(teacher_uri), "_SUCCESS.json")
        if storage.exists(summary_uri):
            teacher_params = (storage.read_json(summary_uri).get("metrics") or {}).get(
                "parameters")
    teacher = lstm_params(target, "teacher", t_classes) / (
        teacher_params or lstm_params(measured, "teacher", classes))
    epochs = target.train.passes.epochs / max(1, measured.train.passes.epochs)
    by_cost = {AUDIO: 1.0, STUDENT: student, TEACHER: teacher, STUDENT_EPOCHS: student * epochs}
    return {step: by_cost[STEPS[step].cost] for step in priced_steps()}


def table(rows: list[StepCost], hours: float, pools: dict[str, dict[str, Any]]) -> str:
    lines = [f"Cost of {hours:g} audio hours end to end (on-demand, from measured throughput)",
             "", "| step | pool | measured h | measured s | rate from | h/core-s | scale | "
                 "node-hours | USD | wall h |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.step} | {pools[r.pool]['instance']} | {r.measured_hours:.4g} | "
                     f"{r.measured_wall_s:.4g} | {r.basis} | {r.rate:.3g} | {r.scale:.3g} | "
                     f"{r.node_hours:.4g} | "
                     f"{r.usd:,.2f} | {r.wall_h:.3g} |")
    lines.append(f"| **total** | | | | | | | {sum(r.node_hours for r in rows):.4g} | "
                 f"**{sum(r.usd for r in rows):,.2f}** | {sum(r.wall_h for r in rows):.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m amflow.cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="a finished run's URI (<root>/runs/<id>)")
    p.add_argument("--measured-config", default="configs/local.yaml",
                   help="config the run was measured with (cores, epochs, storage)")
    p.add_argument("--measured-set", action="append", default=[], metavar="KEY=VALUE",
                   help="overrides the measured run used (e.g. train.epochs=1)")
    p.add_argument("--config", default="configs/aws.yaml", help="target config (pools, prices)")
    p.add_argument("--hours", type=float, default=1000.0)
    p.add_argument("--cluster", default=str(CLUSTER_YAML))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    measured = load_config(a.measured_config, a.measured_set)
    target = load_config(a.config)
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
