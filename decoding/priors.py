"""Class priors for hybrid decoding, read from the model's card.

    model_counts(storage, card, model_uri, num_classes) -> (counts, source)
        the model's stored counts (training/priors.py wrote them); for a model trained
        before priors were stored, the same count over its run's training partitions
        (runs/<R>/repartition)
"""
from __future__ import annotations

import numpy as np

from core.model_card import ModelCard
from training.data import partition_uris
from training.priors import class_counts

TRAIN_SPLITS = ("labeled", "unlabeled")


def run_partitions(storage, model_uri: str) -> list[str]:
    """Training partitions of the run a model file lives in (…/runs/<R>/<train>/model.pt)."""
    run = model_uri.rsplit("/", 2)[0]
    uris: list[str] = []
    for split in TRAIN_SPLITS:
        uris += partition_uris(storage, f"{run}/repartition/{split}")
    return uris


def model_counts(storage, card: ModelCard, model_uri: str, num_classes: int
                 ) -> tuple[np.ndarray, str]:
    stored = card.priors or {}
    if stored.get("counts"):
        return np.asarray(stored["counts"], np.float64), stored.get("source", "model")
    uris = run_partitions(storage, model_uri)
    if not uris:
        raise ValueError(f"{model_uri} stores no class priors and its run has no training "
                         "partitions (repartition/labeled, unlabeled) to count them from")
    return class_counts(storage, uris, num_classes), "run partitions"
