"""A tiny synthetic run for tests and benchmarks: `training.data.make_synthetic_data`
written into a run's features and repartition folders, each closed by its success
marker as if those steps had finished."""
from __future__ import annotations

from typing import Any

from core.runs import SUCCESS
from core.storage import Storage, join
from training.data import make_synthetic_data


def make_synthetic_run(storage: Storage, run_uri: str, **kwargs: Any) -> dict[str, Any]:
    """Write a tiny run under `run_uri` (a run's folder: <root>/runs/<id>):
    features/{cmvn,phones}.json and repartition/<split>/part-*.parquet, with both steps'
    _SUCCESS.json. `kwargs`: make_synthetic_data's (num_classes, splits, seed, ...).
    Returns {"phones", "feat_dim", "splits": {name: [uris]}}."""
    features, repartition = join(run_uri, "features"), join(run_uri, "repartition")
    out = make_synthetic_data(storage, features, repartition, **kwargs)
    storage.write_json(join(features, SUCCESS), {"step": "features"})
    storage.write_json(join(repartition, SUCCESS), {"step": "repartition", "synthetic": True})
    return out
