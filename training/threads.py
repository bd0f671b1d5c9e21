"""How many torch threads a training worker runs: what Ray gives it, not a fixed count.

`train.threads` 0 (the default) takes the CPUs this process holds: a Ray worker's grant
(Ray Train workers keep `ray.worker_threads`), else, in the step's own process, the CPUs
Ray has free once the step's actors (the example servers) took theirs, capped by the
process's CPU affinity; without Ray, the affinity. A count above that is kept (a thread
count is part of a result: float sums split differently) but is a WARNING: on a busy
2-core machine a teacher on 2 threads beside its example server ran ~15x slower than on 1
(torch's threads wait for each other's cores).
"""
from __future__ import annotations

import logging
import math
import os

log = logging.getLogger(__name__)


def cpus_given() -> tuple[int, str]:
    """(whole CPUs this process may use, where that number comes from)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    try:
        import ray

        if ray.is_initialized():
            got = ray.get_runtime_context().get_assigned_resources().get("CPU")
            if got:
                return max(1, math.floor(got)), "Ray's grant to this worker"
            free = ray.available_resources().get("CPU")
            if free is not None:
                return max(1, min(affinity, math.floor(free))), "CPUs free in Ray"
    except Exception:  # noqa: BLE001 - Ray absent or not answering: the affinity decides
        pass
    return max(1, affinity), "this process's CPU affinity"


def torch_threads(requested: int) -> tuple[int, str]:
    """(threads to run, why): `requested` when > 0 (a WARNING when it exceeds the CPUs
    given), else the CPUs given."""
    cpus, source = cpus_given()
    if requested <= 0:
        return cpus, f"train.threads=0: {cpus} ({source})"
    if requested > cpus:
        log.warning("train.threads=%d exceeds the %d CPU(s) this worker has (%s): the "
                    "threads wait for each other's cores (on a busy 2-core machine 2 threads "
                    "ran ~15x slower than 1); set train.threads=0 to run on what Ray gives",
                    requested, cpus, source)
    return requested, f"train.threads={requested}"
