"""`sgd`: synchronous data-parallel SGD.

Every minibatch the gradients are flattened into a few large fp32 buckets and
all-reduced. The average is weighted by each worker's frames in the minibatch: each
worker contributes `g_i * f_i` plus `f_i` (one extra element at the end of the last
bucket), so that with a per-frame mean loss the result is exactly the gradient of the
mean loss over the union of all workers' minibatches, even when their frame counts
differ. With `num_frames == 0` every worker weighs 1 (plain average).

Bytes counted per minibatch: the payload the worker puts into the all-reduce (4 bytes
per parameter + 4). The wire traffic of a ring all-reduce is 2(N-1)/N of that; the
simulator applies that cost model.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core.config import TrainConfig
from training.algorithms.base import (Algorithm, FlatBuckets, broadcast_model_, comm_device,
                                      model_device, resolve_group, trainable)


class SyncSGD(Algorithm):
    name = "sgd"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None,
                 world_size: int | None = None):
        group, self.rank, self.world = resolve_group(group, world_size)
        super().__init__(model, optimizer, group)
        self.params = trainable(model)
        if self.world > 1:
            dev = comm_device(group, model_device(model))
            self.buckets = FlatBuckets(self.params, dev)
            self.buckets.bind_grads()
            self.setup_bytes = broadcast_model_(self.params, group)
            # one trailing element carries the frame weight
            self.weight = torch.zeros(1, dtype=torch.float32, device=dev)

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model, optimizer, group=None, world_size=None):
        return cls(model, optimizer, group, world_size)

    def step(self, num_frames: int = 0) -> None:
        if self.world > 1:
            w = float(num_frames) if num_frames > 0 else 1.0
            bufs = self.buckets.grads()
            with self._timed():
                for b in bufs:
                    b.mul_(w)
                self.weight.fill_(w)
                for b in bufs:
                    dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.group)
                    self.bytes_sent += b.numel() * b.element_size()
                dist.all_reduce(self.weight, op=dist.ReduceOp.SUM, group=self.group)
                self.bytes_sent += 4
                total = self.weight.item()
                for b in bufs:
                    b.div_(total)
            self.buckets.set_grads(bufs)
        self.optimizer.step()
        self.steps += 1
        self.frames += num_frames
