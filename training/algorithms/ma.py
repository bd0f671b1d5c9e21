"""`ma`: Kaldi nnet2-style periodic parameter averaging (Povey, Zhang & Khudanpur 2014).

Each of the N workers runs its local optimizer on its own data and the models drift
apart; after every K training samples (frames: `train.ma_samples`) per worker the
parameters are averaged (all-reduce) and every worker continues from the average.
Because averaging dilutes each worker's change N-fold, the local learning rate is
multiplied by N (the "effective learning rate" is the per-job rate divided by N);
the scaling is applied around each optimizer step, so an external schedule that sets
`param_group["lr"]` keeps working. To keep the updates stable with the larger rate, the
change of each parameter tensor in one minibatch is capped at `max_change` in Frobenius
norm (Kaldi's max-change-per-minibatch, here applied per tensor to the exact change the
optimizer made, instead of Kaldi's bound from the minibatch's row norms).

K is converted to a period in minibatches, ceil(K / train.minibatch_frames), so that every
worker averages after the same number of minibatches and the collectives stay in step
(frame counts differ slightly per worker with variable-length chunks).

With `natural_gradient` (config `train.natural_gradient`), each local step first
replaces the gradients of every LSTM layer and linear layer by Kaldi's online
natural-gradient ones (training/natural_gradient.py); the Fisher factors are part of the
state and, like the local optimizer state, stay per worker (Kaldi does not average them).

Bytes counted: the fp32 model put into the all-reduce once per period.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from core.config import TrainConfig
from training.algorithms.base import Algorithm, resolve_group, trainable
from training.natural_gradient import NaturalGradient

# Kaldi nnet3's default per-component max-change per minibatch.
DEFAULT_MAX_CHANGE = 2.0


class ModelAveraging(Algorithm):
    name = "ma"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None,
                 world_size: int | None = None, period: int = 10,
                 max_change: float = DEFAULT_MAX_CHANGE, lr_scale: float | None = None,
                 natural_gradient: dict[str, Any] | None = None):
        group, self.rank, self.world = resolve_group(group, world_size)
        super().__init__(model, optimizer, group)
        self.period = max(int(period), 1)
        self.max_change = float(max_change)
        self.lr_scale = float(self.world if lr_scale is None else lr_scale)
        self.params = trainable(model)
        self.averages = 0
        self.clipped = 0
        self.finalized = False
        if self.world > 1:
            self._setup_flat(group)
        self._before = [torch.empty_like(p) for p in self.params] if self.max_change > 0 else []
        # NaturalGradient keyword arguments (rank_in, alpha, ...); None = plain gradients
        self.ng = None if natural_gradient is None else NaturalGradient(model, **natural_gradient)

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model, optimizer, group=None, world_size=None):
        a, optim = train_cfg.algo, train_cfg.optim
        period = math.ceil(a.ma_samples / max(train_cfg.batches.minibatch_frames, 1))
        max_change = optim.max_change if optim.max_change > 0 else DEFAULT_MAX_CHANGE
        ng = {"alpha": a.ng_alpha} if a.natural_gradient else None
        return cls(model, optimizer, group, world_size, period=period, max_change=max_change,
                   natural_gradient=ng)

    def _local_step(self) -> None:
        if self.ng is not None:
            self.ng.precondition()
        if self.max_change > 0:
            torch._foreach_copy_(self._before, [p.detach() for p in self.params])
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = g["lr"] * self.lr_scale
        try:
            self.optimizer.step()
        finally:
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr
        if self.max_change > 0:
            with torch.no_grad():
                current = [p.detach() for p in self.params]
                change = torch._foreach_sub(current, self._before)
                norms = torch.stack(torch._foreach_norm(change))
                scale = (self.max_change / norms.clamp_min(1e-30)).clamp_max(1.0)
                over = scale < 1.0
                if bool(over.any()):
                    self.clipped += int(over.sum())
                    for i in over.nonzero().view(-1).tolist():
                        # W = W_before + alpha * change
                        current[i].copy_(self._before[i]).add_(change[i], alpha=float(scale[i]))

    def _average(self) -> None:
        with self._timed():
            self.flat.set_weights(self._average_flat_weights())
        self.averages += 1

    def step(self, num_frames: int = 0) -> None:
        self._local_step()
        self.steps += 1
        self.frames += num_frames
        if self.world > 1 and self.steps % self.period == 0:
            self._average()

    def finalize(self) -> None:
        if self.world > 1 and not self.finalized and self.steps % self.period:
            self._average()
        self.finalized = True

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out.update(averages=self.averages, period=self.period, clipped=self.clipped,
                   lr_scale=self.lr_scale, max_change=self.max_change,
                   natural_gradient=self.ng is not None)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(averages=self.averages, clipped=self.clipped)
        if self.ng is not None:
            state["natural_gradient"] = self.ng.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.averages = state["averages"]
        self.clipped = state["clipped"]
        if self.ng is not None and "natural_gradient" in state:
            self.ng.load_state_dict(state["natural_gradient"])
