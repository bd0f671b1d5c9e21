"""Size Airflow's `default_pool` to this machine's cores (amflow.orchestration.pools.pool_size), with
deferred tasks counted: the DAGs' steps run while their tasks are deferred, and each task
takes the pool slots of the cores its step uses (amflow.orchestration.pools.pool_slots).

    python scripts/airflow_pool.py --base http://localhost:PORT --passwords FILE --cores N

Used by scripts/airflow.sh and scripts/demo.sh once the standalone answers. --cores 0
leaves the pool as it is (an Airflow whose steps run on a cluster, not on this machine).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from amflow.orchestration.pools import pool_size  # noqa: E402
from demo_dags import Api  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--passwords", required=True)
    ap.add_argument("--cores", type=int, required=True)
    a = ap.parse_args(argv)
    if a.cores <= 0:
        return 0
    api = Api(a.base, json.loads(Path(a.passwords).read_text())["admin"])
    slots = pool_size(a.cores)
    body = {"slots": slots, "include_deferred": True}  # all default_pool lets one change
    try:
        # default_pool takes only an update mask naming these two fields
        api.call("PATCH", "/api/v2/pools/default_pool?update_mask=slots"
                          "&update_mask=include_deferred", body)
    except SystemExit as exc:  # a database without the pool yet: create it
        if "-> 404" not in str(exc):
            raise
        api.call("POST", "/api/v2/pools", {"name": "default_pool", **body,
                                           "description": "Default pool"})
    print(f"default_pool: {slots} slots for {a.cores} cores, deferred tasks included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
