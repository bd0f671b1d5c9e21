"""A run's decodes and dev curves for `decoding.compare`, found through the run layout:
`amflow compare`, the report's Airflow compare page and tests share it."""
from __future__ import annotations

from core.runs import Run
from core.storage import Storage
from decoding import compare


def load_run(st: Storage, root: str, run_id: str) -> dict:
    """`decoding.compare.load_run` of run `run_id` under storage root `root`."""
    run = Run(root, run_id)
    return compare.load_run(st, run_id, run.uri, run.finished_steps(st))
