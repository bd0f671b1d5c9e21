"""Grow a phone-class model into context-dependent leaves (`train.init_model`).

    class_phones(phones, context)           the phone each of a model's classes stands for
    output_sources(init_phones, leaf_phones) for each leaf: the init model's class of its phone
    leaf_log_shares(counts, sources)        log(count(leaf) / count of its phone's leaves)
    grow_output(model, sources, shifts)     the output layer with one row per leaf

Why: with few labeled frames per leaf, a network trained on context-dependent leaves from
scratch loses to one class per phone (alignment/README.md: 27 labeled minutes, three
seeds). Senior et al. (2014, "GMM-free DNN acoustic model training") train the
context-independent network first and start the context-dependent one from it. Here each
leaf starts as a copy of its phone's output row, its bias shifted by the log of the
leaf's share of the phone's labeled frames. Then p(leaf | x) = p(phone | x) x
share(leaf), so the scaled likelihood p(leaf | x) / p(leaf) the decoder reads equals the
phone model's p(phone | x) / p(phone): the grown model starts out decoding as the phone
model did, and training on the leaves' labels only has to learn what context adds.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from core.senones import ContextTree


class GrowError(ValueError):
    """The init model's classes cannot seed this run's classes."""


def class_phones(phones: Sequence[str], context: dict[str, Any] | None) -> list[str]:
    """The phone each class stands for: a tree's leaves' central phones, else the class
    names themselves (phone classes)."""
    if context:
        return ContextTree.from_dict(context).leaf_phone
    return list(phones)


def output_sources(init_phones: Sequence[str], leaf_phones: Sequence[str]) -> list[int]:
    """For each new class (leaf), the init model's class of the same phone. The init model
    must have one class per phone; every leaf's phone must be among them."""
    index: dict[str, int] = {}
    for i, p in enumerate(init_phones):
        if p in index:
            raise GrowError(f"the init model has several classes of phone {p!r}: only a "
                            "model with one class per phone can be grown into leaves")
        index[p] = i
    missing = sorted({p for p in leaf_phones if p not in index})
    if missing:
        raise GrowError(f"the init model has no class for phones {missing[:10]} "
                        f"({len(missing)} in all) that this run's classes need")
    return [index[p] for p in leaf_phones]


def leaf_log_shares(counts: np.ndarray, sources: Sequence[int]) -> list[float]:
    """log(count(leaf) / the summed counts of the leaves that share its source class),
    add-one smoothed so that a leaf unseen in the training labels keeps a finite bias."""
    c = np.asarray(counts, np.float64) + 1.0
    src = np.asarray(sources, np.int64)
    per_source = np.bincount(src, weights=c)
    return [float(v) for v in np.log(c / per_source[src])]


def grow_output(model: nn.Module, sources: Sequence[int], shifts: Sequence[float]) -> nn.Module:
    """`model` with its output layer replaced: row i is the old row sources[i], its bias
    the old bias plus shifts[i]. The hidden layers are kept as they are."""
    old = model.output
    if len(sources) != len(shifts):
        raise GrowError(f"{len(sources)} sources, {len(shifts)} bias shifts")
    if max(sources) >= old.out_features or min(sources) < 0:
        raise GrowError(f"a source class is outside the init model's {old.out_features}")
    new = nn.Linear(old.in_features, len(sources), bias=True,
                    device=old.weight.device, dtype=old.weight.dtype)
    idx = torch.as_tensor(list(sources), dtype=torch.long, device=old.weight.device)
    with torch.no_grad():
        new.weight.copy_(old.weight[idx])
        new.bias.copy_(old.bias[idx] + torch.as_tensor(list(shifts), dtype=old.bias.dtype,
                                                       device=old.bias.device))
    model.output = new
    return model
