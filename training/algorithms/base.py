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

import time
from typing import Any

import torch
from torch import nn


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
    def _timed(self):
        algo = self

        class _T:
            def __enter__(self_inner):
                self_inner.t0 = time.perf_counter()

            def __exit__(self_inner, *exc):
                algo.comm_seconds += time.perf_counter() - self_inner.t0

        return _T()
