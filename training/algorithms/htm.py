"""`htm`: the hybrid two-tier method (Ladkat et al.): GTC inside groups, BMUF across them.

The N workers are cut into M = N / group_size groups of consecutive ranks (consecutive
ranks share a host under Ray Train's packing, so the per-minibatch GTC traffic stays on
the fast intra-host links). Every minibatch each group runs one synchronous GTC step
over its own process group. Every `block_size` minibatches one leader per group (its
lowest rank) joins the upper tier: a BMUF-NBM step over the M leaders' models (eta
derived with N = M), then each leader broadcasts the look-ahead model to its group.
`finalize()` leaves every worker with the global model W_g.

All process groups are made with `torch.distributed.new_group`, every group in the same
order on every rank (a collective requirement). HTM therefore needs the default (WORLD)
group. group_size = 1 is BMUF (GTC over a group of one is the plain local step);
group_size = N is GTC (the upper tier has one member and, with zeta = 1 and the derived
eta = 0, its filter is the identity and is skipped). The lower tier derives its taus like
`gtc` but with `train.htm_tau_scale` (default 25: the paper runs HTM's groups at tau 2
against 8 for plain GTC, denser where the links are fast).

Bytes counted: the GTC traffic every minibatch plus, on leaders, the model all-reduce
per block and the broadcast of the look-ahead model to the group.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from core.config import TrainConfig
from training.algorithms.base import (Algorithm, FlatBuckets, broadcast_model_, comm_device,
                                      model_device, reset_local_momentum, resolve_group,
                                      trainable)
from training.algorithms.bmuf import BlockFilter, derive_eta
from training.algorithms.gtc import GTC


def make_tiers(world: int, group_size: int) -> tuple[list[list[int]], list[int]]:
    """Lower-tier groups (consecutive ranks) and the upper tier (one leader per group)."""
    if world % group_size:
        raise ValueError(f"htm: train.group_size={group_size} must divide the number of "
                         f"workers ({world})")
    groups = [list(range(g, g + group_size)) for g in range(0, world, group_size)]
    return groups, [g[0] for g in groups]


class HTM(Algorithm):
    name = "htm"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None,
                 world_size: int | None = None, group_size: int = 8, block_size: int = 50,
                 zeta: float = 1.0, eta: float = -1.0, c: float = 1.0, tau: float = 0.0,
                 tau_scale: float = 100.0, reset_momentum: bool = True, warmup: int = 0,
                 momentum_correction: bool = False):
        group, rank, world = resolve_group(group, world_size)
        self.reset_momentum = bool(reset_momentum)
        super().__init__(model, optimizer, group)
        self.rank, self.world = rank, world
        self.block_size = int(block_size)
        self.params = trainable(model)
        self.blocks = 0
        self.block_bytes = 0
        self.block_seconds = 0.0
        self.filter: BlockFilter | None = None
        self.skip_blocks = True
        self._eta = 0.0
        self.finalized = False
        self.group_size = min(int(group_size), world)
        lower = up = None
        self.leader = True
        self.num_groups = 1
        if world > 1:
            if group is not dist.group.WORLD:
                raise ValueError("htm builds its tiers with new_group and needs the default "
                                 "(WORLD) process group")
            self.setup_bytes = broadcast_model_(self.params, group)
            groups, leaders = make_tiers(world, self.group_size)
            self.num_groups = len(groups)
            for ranks in groups:  # same order on every rank
                pg = dist.new_group(ranks) if len(ranks) > 1 else None
                if rank in ranks:
                    lower, self.group_ranks = pg, ranks
            up = dist.new_group(leaders) if len(leaders) > 1 else None
            self.leader = rank == self.group_ranks[0]
            self.leader_rank = self.group_ranks[0]
        self.lower, self.upper = lower, up
        # lower tier: GTC (a group of one is the plain local step)
        self.gtc = GTC(model, optimizer, lower, None if lower is not None else 1,
                       tau=tau, tau_scale=tau_scale, sync_init=False, warmup=warmup,
                       momentum_correction=momentum_correction)
        if world > 1:
            dev = comm_device(group, model_device(model))
            self.flat = FlatBuckets(self.params, dev)
            self._eta = derive_eta(zeta, self.num_groups, c) if eta < 0 else float(eta)
            # the global model and block momentum live on the leaders only
            self.filter = BlockFilter(self.flat.flat_weights(), zeta, self._eta) \
                if self.leader else None
            # one group and an identity filter: nothing to do at block ends (pure GTC)
            self.skip_blocks = self.num_groups == 1 and zeta == 1.0 and self._eta == 0.0

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model, optimizer, group=None, world_size=None):
        a = train_cfg.algo
        return cls(model, optimizer, group, world_size, group_size=a.group_size,
                   block_size=a.block_size, zeta=a.block_lr, eta=a.block_momentum, c=a.bmuf_c,
                   tau=a.gtc_tau, tau_scale=a.htm_tau_scale, reset_momentum=a.block_reset_momentum,
                   warmup=a.gtc_warmup, momentum_correction=a.gtc_momentum_correction)

    @property
    def eta(self) -> float:
        return self._eta if self.world > 1 else 0.0

    def _block(self, final: bool = False) -> None:
        with self._timed():
            if self.leader:
                bufs = self.flat.weights()
                w = torch.cat(bufs) if len(bufs) > 1 else bufs[0]
                if self.upper is not None:
                    dist.all_reduce(w, op=dist.ReduceOp.SUM, group=self.upper)
                    w.div_(self.num_groups)
                    self.block_bytes += w.numel() * w.element_size()
                look = self.filter.update(w)
                out = (self.filter.w_g if final else look).clone()
            else:
                out = torch.empty(self.flat.total, dtype=torch.float32, device=self.flat.device)
            if self.lower is not None:
                dist.broadcast(out, src=self.leader_rank, group=self.lower)
                if self.leader:
                    self.block_bytes += out.numel() * out.element_size()
            self.flat.set_flat_weights(out)
        if self.reset_momentum:
            reset_local_momentum(self.optimizer)
            self.gtc.reset_velocity()
        self.blocks += 1

    def _sync_counters(self) -> None:
        self.bytes_sent = self.gtc.bytes_sent + self.block_bytes
        self.comm_seconds = self.gtc.comm_seconds + self.block_seconds

    def _add_comm_seconds(self, seconds: float) -> None:
        # time in the upper tier goes to block_seconds; comm_seconds is the total
        self.block_seconds += seconds
        self._sync_counters()

    def step(self, num_frames: int = 0) -> None:
        self.gtc.step(num_frames)
        self.steps += 1
        self.frames += num_frames
        if self.world > 1 and not self.skip_blocks and self.steps % self.block_size == 0:
            self._block()
        self._sync_counters()

    def finalize(self) -> None:
        if self.world <= 1 or self.finalized or self.skip_blocks:
            return
        if self.steps % self.block_size:
            self._block(final=True)
        else:
            # every worker holds the look-ahead; the leaders know W_g
            with self._timed():
                out = (self.filter.w_g.clone() if self.leader else
                       torch.empty(self.flat.total, dtype=torch.float32, device=self.flat.device))
                if self.lower is not None:
                    dist.broadcast(out, src=self.leader_rank, group=self.lower)
                    if self.leader:
                        self.block_bytes += out.numel() * out.element_size()
                self.flat.set_flat_weights(out)
        self.finalized = True

    def stats(self) -> dict[str, float]:
        out = super().stats()
        g = self.gtc.stats()
        out.update(block_bytes=self.block_bytes, gtc_bytes=self.gtc.bytes_sent, tau=g["tau"],
                   sent_fraction=g["sent_fraction"], blocks=self.blocks, eta=self.eta,
                   groups=self.num_groups, group_size=self.group_size)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(blocks=self.blocks, block_bytes=self.block_bytes,
                     block_seconds=self.block_seconds, gtc=self.gtc.state_dict(),
                     filter=self.filter.state_dict() if self.filter is not None else None)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.blocks = state["blocks"]
        self.block_bytes = state["block_bytes"]
        self.block_seconds = state["block_seconds"]
        self.gtc.load_state_dict(state["gtc"])
        if self.filter is not None and state.get("filter") is not None:
            self.filter.load_state_dict(state["filter"])
