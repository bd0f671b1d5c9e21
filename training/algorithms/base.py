"""The one interface every distributed training algorithm implements.

Like a `torch.optim` optimizer wrapper: built from the model, a local optimizer and a
process group (None = single process), then, once per minibatch, after
`loss.backward()` the training loop calls `step(num_frames)`. The algorithm does its
communication and applies the update through the local optimizer. All state lives in
`state_dict()` so a resumed run continues exactly.

    algo = build_algorithm(cfg.train, model, optimizer, group)
    for batch in loader:
        algo.zero_grad()
        loss = criterion(model(x), y); loss.backward()
        algo.step(num_frames=batch.frames)
    algo.finalize()          # e.g. BMUF hands the workers the global model
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from core.config import TrainConfig


class Algorithm:
    name = "base"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.group = group
        self.steps = 0
        self.frames = 0
        self.bytes_sent = 0
        self.comm_seconds = 0.0
        self.setup_bytes = 0  # one-off traffic (initial model broadcast), not per minibatch

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                    group: Any = None, world_size: int | None = None) -> "Algorithm":
        """Build from `config.train` (subclasses read their knobs from it)."""
        return cls(model, optimizer, group)

    # -- the optimizer-like surface
    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def step(self, num_frames: int = 0) -> None:
        raise NotImplementedError

    def finalize(self) -> None:
        """Called once after the last step; leaves every worker with the final model."""

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "frames": self.frames, "bytes_sent": self.bytes_sent,
                "comm_seconds": self.comm_seconds, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]
        self.frames = state["frames"]
        self.bytes_sent = state["bytes_sent"]
        self.comm_seconds = state["comm_seconds"]
        self.optimizer.load_state_dict(state["optimizer"])

    def stats(self) -> dict[str, float]:
        return {"steps": self.steps, "bytes_sent": self.bytes_sent,
                "comm_seconds": round(self.comm_seconds, 4),
                "bytes_per_step": self.bytes_sent / max(self.steps, 1)}

    # -- helpers for subclasses
    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Times a communication section into the algorithm's counters."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._add_comm_seconds(time.perf_counter() - t0)

    def _add_comm_seconds(self, seconds: float) -> None:
        self.comm_seconds += seconds

    def _average_flat_weights(self) -> list[torch.Tensor]:
        """The workers' mean of the flat weight buckets (all-reduce), bytes counted."""
        bufs = self.flat.weights()
        for b in bufs:
            dist.all_reduce(b, op=dist.ReduceOp.SUM, group=self.group)
            b.div_(self.world)
            self.bytes_sent += b.numel() * b.element_size()
        return bufs

    def _setup_flat(self, group: Any) -> None:
        """Every worker starts from rank 0's weights; the parameters as flat buckets on
        the device the process group communicates on."""
        dev = comm_device(group, model_device(self.model))
        self.setup_bytes = broadcast_model_(self.params, group)
        self.flat = FlatBuckets(self.params, dev)


# ---------------------------------------------------------------------------------------
# Shared helpers: process-group resolution, device placement, flat buckets.
# ---------------------------------------------------------------------------------------


BUCKET_BYTES = 32 << 20  # flatten tensors into buffers of at most this many bytes


def resolve_group(group: Any = None, world_size: int | None = None) -> tuple[Any, int, int]:
    """(group, rank in group, group size) for an algorithm.

    `group=None` means the default (WORLD) group when torch.distributed is initialised with
    more than one rank, else a single process. `world_size=1` forces single-process mode
    (the algorithm is then just the local optimizer step, and no collective is issued).
    """
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    if group is None:
        group = dist.group.WORLD
    n = dist.get_world_size(group)
    if n <= 1:
        return None, 0, 1
    return group, dist.get_rank(group), n


def comm_device(group: Any, model_dev: torch.device) -> torch.device:
    """NCCL communicates tensors where the model lives (GPU); gloo on the CPU."""
    if group is not None and dist.get_backend(group) == "nccl":
        return model_dev
    return torch.device("cpu") if group is not None else model_dev


def model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def broadcast_model_(params: list[torch.Tensor], group: Any, src: int = 0) -> int:
    """Every worker starts from `src`'s weights (as DDP does); returns bytes sent by src."""
    if group is None:
        return 0
    dev = comm_device(group, params[0].device if params else torch.device("cpu"))
    flat = FlatBuckets(params, dev)
    bufs = flat.weights()
    src_global = dist.get_global_rank(group, src) if group is not dist.group.WORLD else src
    for b in bufs:
        dist.broadcast(b, src=src_global, group=group)
    flat.set_weights(bufs)
    return flat.nbytes if dist.get_rank(group) == src else 0


class FlatBuckets:
    """Tensors laid out in a few large contiguous fp32 buffers (one collective per bucket).

    `gather(tensors)` copies tensors into the buffers; `scatter(buffers, tensors)` copies
    back. The element order follows parameter order, so a flat index means the same
    element on every worker (GTC uses it as the 31-bit index).

    `bind_grads()` makes each `param.grad` a view into the buffers (as DDP's
    gradient-as-bucket-view): backward then accumulates straight into the flat buffers and
    `grads()` costs no copy. If anything replaces a `.grad` tensor later (set_to_none,
    an optimizer that reassigns it), `grads()` notices and falls back to copying.
    """

    def __init__(self, params: list[torch.Tensor], device: torch.device,
                 bucket_bytes: int = BUCKET_BYTES, dtype: torch.dtype = torch.float32):
        self.params = params
        self.device = device
        self.dtype = dtype
        self.numels = [p.numel() for p in params]
        self.total = sum(self.numels)
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        per = max(bucket_bytes // self.itemsize, 1)
        self.buckets: list[list[int]] = []  # bucket -> parameter indices
        cur: list[int] = []
        size = 0
        for i, n in enumerate(self.numels):
            if cur and size + n > per:
                self.buckets.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += n
        if cur:
            self.buckets.append(cur)
        self.sizes = [sum(self.numels[i] for i in b) for b in self.buckets]
        self.buffers = [torch.zeros(s, dtype=dtype, device=device) for s in self.sizes]
        self._views: list[torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        return self.total * self.itemsize

    def _param_views(self, buffers: list[torch.Tensor]) -> list[torch.Tensor]:
        views: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        for buf, idx in zip(buffers, self.buckets):
            for i, v in zip(idx, buf.split([self.numels[i] for i in idx])):
                views[i] = v.view_as(self.params[i])
        return views

    def bind_grads(self) -> bool:
        """Point every `.grad` into the buffers when dtype and device allow it."""
        ok = all(p.dtype == self.dtype and p.device == self.device for p in self.params)
        if not ok:
            return False
        views = self._param_views(self.buffers)
        with torch.no_grad():
            for p, v in zip(self.params, views):
                if p.grad is not None:
                    v.copy_(p.grad)
                else:
                    v.zero_()
                p.grad = v
        self._views = views
        return True

    def _bound(self) -> bool:
        return self._views is not None and all(
            p.grad is not None and p.grad.data_ptr() == v.data_ptr()
            for p, v in zip(self.params, self._views))

    def gather(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor]:
        for buf, idx in zip(self.buffers, self.buckets):
            parts = []
            for i in idx:
                t = tensors[i]
                if t is None:
                    t = torch.zeros(self.numels[i], dtype=self.dtype, device=buf.device)
                parts.append(t.detach().reshape(-1).to(device=buf.device, dtype=self.dtype))
            if len(parts) == 1:
                buf.copy_(parts[0])
            else:
                torch.cat(parts, out=buf)
        return self.buffers

    def scatter(self, buffers: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for buf, idx in zip(buffers, self.buckets):
                views = buf.split([self.numels[i] for i in idx])
                for i, v in zip(idx, views):
                    if tensors[i].data_ptr() != v.data_ptr():
                        tensors[i].copy_(v.view_as(tensors[i]))

    def grads(self) -> list[torch.Tensor]:
        """The current gradients as flat buffers (no copy when bound)."""
        if self._views is not None:
            if self._bound():
                return self.buffers
            self._views = None
        return self.gather([p.grad for p in self.params])

    def set_grads(self, buffers: list[torch.Tensor]) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.scatter(buffers, [p.grad for p in self.params])

    def weights(self) -> list[torch.Tensor]:
        return self.gather([p.data for p in self.params])

    def set_weights(self, buffers: list[torch.Tensor]) -> None:
        self.scatter(buffers, [p.data for p in self.params])

    def flat_weights(self) -> torch.Tensor:
        """All weights as one new flat fp32 vector on this layout's device."""
        return torch.cat([b.clone() for b in self.weights()])

    def set_flat_weights(self, flat: torch.Tensor) -> None:
        self.set_weights(list(flat.split(self.sizes)))


def reset_local_momentum(optimizer: Any) -> None:
    """Zero the local SGD momentum buffers after a block update (BMUF, HTM).

    The block momentum has already carried the block's direction into the look-ahead
    model the workers restart from; a local momentum buffer that survives the jump
    pushes that direction a second time (CNTK's block-momentum SGD resets it too,
    `resetSGDMomentum`). Adam's moments are left alone."""
    for state in optimizer.state.values():
        buf = state.get("momentum_buffer")
        if buf is not None:
            buf.zero_()
