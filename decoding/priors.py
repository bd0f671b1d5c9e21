"""Class priors for hybrid decoding, from the training targets, stored with the model.

    class_counts, attach_priors   the counting and the writing (training/priors.py, where
        the train step calls them), re-exported here
    model_counts(storage, meta, model_uri) -> (counts, source)
        the model's stored counts; for a model trained before priors were stored, the
        same count over its run's training partitions (runs/<R>/repartition)
"""
from __future__ import annotations

import numpy as np

# The counting and the writing live with the training that produces the targets; decoding
# reads them back (and counts for models trained before priors were stored).
from training.priors import attach_priors, class_counts  # noqa: F401 (re-exported)

TRAIN_SPLITS = ("labeled", "unlabeled")


def run_partitions(storage, model_uri: str) -> list[str]:
    """Training partitions of the run a model file lives in (…/runs/<R>/<train>/model.pt)."""
    from training.data import partition_uris

    run = model_uri.rsplit("/", 2)[0]
    uris: list[str] = []
    for split in TRAIN_SPLITS:
        uris += partition_uris(storage, f"{run}/repartition/{split}")
    return uris


def model_counts(storage, meta: dict, model_uri: str, num_classes: int) -> tuple[np.ndarray, str]:
    stored = meta.get("priors") or {}
    if stored.get("counts"):
        return np.asarray(stored["counts"], np.float64), stored.get("source", "model")
    uris = run_partitions(storage, model_uri)
    if not uris:
        raise ValueError(f"{model_uri} stores no class priors and its run has no training "
                         "partitions (repartition/labeled, unlabeled) to count them from")
    return class_counts(storage, uris, num_classes), "run partitions"
