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

from training.checkpoint import from_bytes, to_bytes
from training.data import _schema_names


def class_counts(storage, uris: Sequence[str], num_classes: int) -> np.ndarray:
    counts = np.zeros(num_classes, np.float64)
    for uri in uris:
        wanted = [c for c in ("labels", "k", "topk_idx", "topk_logit")
                  if c in _schema_names(storage, uri)]
        table = storage.read_parquet(uri, columns=wanted)  # not the features
        names = set(table.column_names)
        labels = table.column("labels").to_pylist() if "labels" in names else [None] * table.num_rows
        k = table.column("k").to_pylist() if "k" in names else [None] * table.num_rows
        ti = table.column("topk_idx").to_pylist() if "topk_idx" in names else [None] * table.num_rows
        tv = table.column("topk_logit").to_pylist() if "topk_logit" in names else [None] * table.num_rows
        for lab, kk, idx, val in zip(labels, k, ti, tv):
            if lab:
                counts += np.bincount(np.frombuffer(lab, np.int16), minlength=num_classes)[:num_classes]
            elif idx and kk:
                i = np.frombuffer(idx, np.int16).reshape(-1, kk).astype(np.int64)
                v = np.frombuffer(val, np.float16).reshape(-1, kk).astype(np.float64)
                p = np.exp(v - v.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                np.add.at(counts, i.ravel(), p.ravel())
    return counts


def attach_priors(storage, model_uri: str, counts: np.ndarray, source: str) -> None:
    payload = from_bytes(storage.read_bytes(model_uri), weights_only=True)
    payload["priors"] = {"counts": [float(c) for c in counts], "source": source}
    storage.write_bytes(model_uri, to_bytes(payload))
