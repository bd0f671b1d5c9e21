"""How many slots of Airflow's default_pool a step's task takes (dags/ ask here)."""
from __future__ import annotations

from pathlib import Path

from core.config import load_config


# Cores in Airflow's pool. On one machine (runner.mode local) the DAGs' steps share its
# cores, and Airflow's `default_pool` (the only pool every Airflow has: a task in a missing
# pool waits forever, silently) counts them in quarters: scripts/airflow_env.sh sizes it
# to pool_size(cores), deferred tasks included (a step runs while its task is deferred).
# A step that computes takes a core per torch thread (train, sequence: threads x
# workers) or one core (features, targets); a light step (I/O, short scoring) a quarter.
# So the teacher's 2-thread training holds both cores alone (the baseline waits, not
# both at half speed), yet a light step fits beside it; on a cluster the pool is large.
POOL_SLOTS_PER_CORE = 4
POOL_LIGHT_SLOTS = 2  # light steps that may run beside steps holding every core
LIGHT_STEPS = frozenset({"select", "lm", "repartition", "evaluate", "decode", "graph",
                         "simulate", "report"})


def pool_size(cores: int) -> int:
    """default_pool's slots for a machine of `cores` cores."""
    return POOL_SLOTS_PER_CORE * max(int(cores), 1) + POOL_LIGHT_SLOTS


def pool_slots(step: str, config: Path | str, overrides: list[str]) -> int:
    """The pool slots of `amflow <step>` with these overrides (see POOL_SLOTS_PER_CORE)."""
    if step in LIGHT_STEPS:
        return 1
    cores = 1
    if step in ("train", "sequence"):
        sets = [*overrides, "train.regime=sequence"] if step == "sequence" else overrides
        tc = load_config(config, sets).train
        cores = max(tc.threads, 1) * max(tc.workers, 1)
    return POOL_SLOTS_PER_CORE * cores


# A task waiting for pool slots sits "scheduled" with an empty log: Airflow runs nothing of
# it until the slots are free, and a smaller task may take them first (the scheduler skips
# a task that does not fit and queues the next). Whoever watches the runs (scripts/
# demo_dags.py) says why, in its output and as the task's note in the UI.
WAITING_STATES = ("scheduled", "queued")
HOLDING_STATES = ("running", "deferred", "queued")


def waiting_note(waiter: dict, pool: dict, tasks: list[dict]) -> str:
    """Why `waiter` (a task instance of Airflow's REST API) has not started, when it is
    short of pool slots: which pool, its open slots, and which tasks hold them; "" when
    the pool has room for it. `pool`: the pool as the REST API gives it; `tasks`: task
    instances of any DAG (those in `pool` holding slots count)."""
    need = int(waiter.get("pool_slots") or 1)
    name = pool.get("name", waiter.get("pool", "default_pool"))
    holders = [t for t in tasks if t.get("pool") == name and t.get("state") in HOLDING_STATES
               and t.get("task_id") != waiter.get("task_id")]
    if not pool.get("include_deferred", False):
        holders = [t for t in holders if t.get("state") != "deferred"]
    taken = sum(int(t.get("pool_slots") or 1) for t in holders)
    total = int(pool.get("slots") or 0)
    if need > total:  # Airflow never starts it, and says so only in the scheduler's log
        return (f"needs {need} slots but pool {name} has {total} in all: it cannot start "
                f"until the pool is made larger (scripts/airflow_pool.py --cores N)")
    open_slots = total - taken
    if open_slots >= need:
        return ""
    held = ", ".join(f"{t['dag_id']}.{t['task_id']} ({int(t.get('pool_slots') or 1)}, "
                     f"{t['state']})" for t in sorted(holders, key=lambda t: -int(
                         t.get("pool_slots") or 1)))
    return (f"waiting for {need} slots of pool {name}: {max(open_slots, 0)} of {total} open; "
            f"held by {held or 'no task'}")
