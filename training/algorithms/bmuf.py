"""`bmuf`: blockwise model-update filtering with Nesterov block momentum (Chen & Huo 2016).

Each worker runs its local optimizer for `block_size` minibatches (no communication),
then, at the end of block t:

    W_bar(t) = (1/N) sum_i W_i(t)                 all-reduce average of the local models
    G(t)     = W_bar(t) - W_0(t)                   block-level "gradient": what the block's
                                                   data moved the model, from where the
                                                   workers started the block
    Delta(t) = eta * Delta(t-1) + zeta * G(t)      block momentum, block learning rate
    W_g(t)   = W_g(t-1) + Delta(t)                 the global model
    W_0(t+1) = W_g(t) + eta * Delta(t)             Nesterov look-ahead: where every worker
                                                   starts block t+1 (W_0(1) = W_g(0))

W_g and the look-ahead W_0 are kept apart, and `finalize()` leaves every worker with W_g
(after a last, possibly partial, block), not the look-ahead.

On G: the papers write G(t) = W_bar(t) - W_g(t-1). With Nesterov momentum the workers
start from W_g(t-1) + eta Delta(t-1), so W_bar - W_g(t-1) = eta Delta(t-1) + (the block's
own progress) and the recursion becomes Delta(t) = eta (1 + zeta) Delta(t-1) + ...: it
counts the look-ahead twice and diverges for eta > 1/2, i.e. for the prescribed
eta = 1 - 1/N at N >= 3 (measured: loss grows without bound at N = 4). Chen & Huo's
block gradient is the model update the block produced, taken from the block's initial
model, which is what G(t) = W_bar(t) - W_0(t) above computes; the HTM paper's own eq. (4)
treats its W_g as the workers' starting point in the same way. Without momentum
(eta = 0) both are the same, and eta = 0, zeta = 1 is plain model averaging.

eta < 0 in the config means: derive it from zeta / (N (1 - eta)) = C, i.e.
eta = 1 - zeta / (N C) (clamped to [0, 1)); zeta = 1, C = 1 are the papers' settings.

Bytes counted: the fp32 model put into the all-reduce once per block (so
4 * params / block_size per minibatch on average).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.config import TrainConfig
from training.algorithms.base import Algorithm, reset_local_momentum, resolve_group, trainable


def derive_eta(zeta: float, n: int, c: float) -> float:
    """Block momentum from zeta / (N (1 - eta)) = C."""
    return min(max(1.0 - zeta / (n * c), 0.0), 0.999)


class BlockFilter:
    """The global model W_g and block momentum Delta, as flat fp32 vectors."""

    def __init__(self, w0: torch.Tensor, zeta: float, eta: float):
        self.zeta = float(zeta)
        self.eta = float(eta)
        self.w_g = w0.clone()
        self.delta = torch.zeros_like(w0)

    @property
    def identity(self) -> bool:
        """A filter over a single model that returns the model unchanged."""
        return self.zeta == 1.0 and self.eta == 0.0

    def update(self, w_bar: torch.Tensor) -> torch.Tensor:
        """One BMUF step from the averaged model; returns the look-ahead model (new)."""
        # G = W_bar - W_0, with W_0 = W_g + eta * Delta the point the block started from
        g = w_bar.sub(self.w_g).sub_(self.delta, alpha=self.eta)
        self.delta.mul_(self.eta).add_(g, alpha=self.zeta)
        self.w_g.add_(self.delta)
        return self.w_g.add(self.delta, alpha=self.eta)

    def state_dict(self) -> dict[str, Any]:
        return {"zeta": self.zeta, "eta": self.eta, "w_g": self.w_g.detach().cpu().clone(),
                "delta": self.delta.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.zeta, self.eta = state["zeta"], state["eta"]
        self.w_g.copy_(state["w_g"].to(self.w_g.device))
        self.delta.copy_(state["delta"].to(self.delta.device))


class BMUF(Algorithm):
    name = "bmuf"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None,
                 world_size: int | None = None, block_size: int = 50, zeta: float = 1.0,
                 eta: float = -1.0, c: float = 1.0, reset_momentum: bool = True):
        group, self.rank, self.world = resolve_group(group, world_size)
        self.reset_momentum = bool(reset_momentum)
        super().__init__(model, optimizer, group)
        self.block_size = int(block_size)
        self.params = trainable(model)
        self.blocks = 0
        self.finalized = False
        if self.world > 1:
            self._setup_flat(group)
            eta = derive_eta(zeta, self.world, c) if eta < 0 else eta
            self.filter = BlockFilter(self.flat.flat_weights(), zeta, eta)

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model, optimizer, group=None, world_size=None):
        a = train_cfg.algo
        return cls(model, optimizer, group, world_size, block_size=a.block_size,
                   zeta=a.block_lr, eta=a.block_momentum, c=a.bmuf_c,
                   reset_momentum=a.block_reset_momentum)

    @property
    def eta(self) -> float:
        return self.filter.eta if self.world > 1 else 0.0

    def _block(self, final: bool = False) -> None:
        with self._timed():
            bufs = self._average_flat_weights()
            look = self.filter.update(torch.cat(bufs) if len(bufs) > 1 else bufs[0])
            self.flat.set_flat_weights(self.filter.w_g if final else look)
        if self.reset_momentum:
            reset_local_momentum(self.optimizer)
        self.blocks += 1

    def step(self, num_frames: int = 0) -> None:
        self.optimizer.step()
        self.steps += 1
        self.frames += num_frames
        if self.world > 1 and self.steps % self.block_size == 0:
            self._block()

    def finalize(self) -> None:
        if self.world <= 1 or self.finalized:
            return
        if self.steps % self.block_size:
            self._block(final=True)
        else:
            self.flat.set_flat_weights(self.filter.w_g)
        self.finalized = True

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out.update(blocks=self.blocks, eta=self.eta, block_size=self.block_size)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(blocks=self.blocks,
                     filter=self.filter.state_dict() if self.world > 1 else None)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.blocks = state["blocks"]
        if self.world > 1 and state.get("filter") is not None:
            self.filter.load_state_dict(state["filter"])
