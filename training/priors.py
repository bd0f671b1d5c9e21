"""Class priors counted over training targets and stored in the model file.

    class_counts(storage, partition_uris, num_classes) -> float64 [C]
        hard labels counted; soft top-k targets added as their softmax mass
    attach_priors(storage, model_uri, counts, source)   writes `priors` into model.pt

Training-side (training/launch.py stores them after a train step); decoding/priors.py
only reads them back (it may import this module, never the other way round).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from core import records
from training.checkpoint import from_bytes, to_bytes


def class_counts(storage, uris: Sequence[str], num_classes: int) -> np.ndarray:
    counts = np.zeros(num_classes, np.float64)
    for uri in uris:
        table = records.read_table(storage, uri, ["labels", *records.TARGET_COLUMNS])
        for row in records.iter_rows(table):  # not the features
            if row.get("labels") is not None and len(row["labels"]):
                lab = records.decode_int16(row["labels"])
                counts += np.bincount(lab, minlength=num_classes)[:num_classes]
            elif row.get("topk_idx") is not None and len(row["topk_idx"]) and row.get("k"):
                i, v = records.decode_topk(row)
                p = np.exp(v - v.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                np.add.at(counts, i.ravel(), p.ravel())
    return counts


def attach_priors(storage, model_uri: str, counts: np.ndarray, source: str) -> None:
    payload = from_bytes(storage.read_bytes(model_uri), weights_only=True)
    payload["priors"] = {"counts": [float(c) for c in counts], "source": source}
    storage.write_bytes(model_uri, to_bytes(payload))
