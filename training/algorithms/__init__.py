"""Distributed training algorithms behind one interface (see `base.Algorithm`).

    algo = build_algorithm(cfg.train, model, optimizer, group=None, world_size=None)

`train_cfg.algorithm` picks one of: sgd | gtc | bmuf | htm | ma. `group=None` means the
default torch.distributed group when it is initialised with >1 ranks, else a single
process; `world_size=1` forces single-process mode (every algorithm then reduces to the
local optimizer step plus its own local bookkeeping).
"""
from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from training.algorithms.base import Algorithm

from core.config import TrainConfig

ALGORITHMS = {
    "sgd": "training.algorithms.sgd:SyncSGD",
    "gtc": "training.algorithms.gtc:GTC",
    "bmuf": "training.algorithms.bmuf:BMUF",
    "htm": "training.algorithms.htm:HTM",
    "ma": "training.algorithms.ma:ModelAveraging",
}


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown training algorithm {name!r} (known: {', '.join(ALGORITHMS)})")
    module, cls = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_algorithm(train_cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                    group: Any = None, world_size: int | None = None) -> Algorithm:
    """The `train_cfg.algorithm` wrapper around `optimizer` for `model`."""
    cls = algorithm_class(train_cfg.algorithm)
    return cls.from_config(train_cfg, model, optimizer, group, world_size)


__all__ = ["Algorithm", "ALGORITHMS", "algorithm_class", "build_algorithm"]
