"""`gtc`: synchronous SGD with gradient threshold compression (Strom 2015).

Per minibatch and worker, on one flat fp32 vector over all trainable parameters:

    v = r + g                         (r: residual, kept locally)
    sent = {i: |v_i| >= tau}          each sent element is quantised to sign(v_i) * tau
    r = v - sign(v) * tau on sent     (unsent elements stay in r whole)

so that, summed over steps, (everything sent) + r == (every gradient): nothing is lost,
only delayed. A sent element is one int32: bit 31 is the sign (1 = -tau), bits 0..30 the
flat index (so models up to 2^31 - 1 parameters). Workers exchange their variable-length
code buffers by all-gather: first the lengths (one int64 each), then every buffer padded
to the longest. The update each worker applies is the average of all decoded buffers,

    g_hat = (1/N) * sum_workers sum_codes sign * tau      (index_add_, vectorised)

handed to the local optimizer as the gradient, so every replica applies the same update
and the models stay identical.

Threshold. `train.gtc_tau > 0` is used as is, for every element (in units of this
loss's gradient, a per-frame mean). The paper's tau = 8 is in its toolkit's gradient
scale (summed over the frames of a minibatch, with its own learning-rate convention) and
does not transfer. With `gtc_tau == 0` one tau per parameter tensor is derived once, on
the first minibatch:

    tau_j = gtc_tau_scale * mean_{i in tensor j} |g_1,i|

(averaged over the workers with one small all-reduce, so every worker uses the same
taus), then held fixed like the paper's constant (they are in `state_dict`). Both ends
know the tensor layout, so a code is still sign + flat index; the decoder looks the tau
of an index up by its tensor. Why this statistic: every code takes exactly tau_j off an
element's |residual| and a minibatch adds at most |g_i| to it, so in the long run a worker
sends at most ||g_j||_1 / tau_j = n_j mean|g_j| / tau_j elements of tensor j per
minibatch: the sent fraction is bounded by 1 / gtc_tau_scale (as long as a tensor's
gradient L1 norm does not grow past its first value), whatever the distribution, and
gradient noise that cancels in the residual lowers it further. Per tensor, because
layers' gradient scales differ by orders of magnitude: one global tau starves the layers
with small gradients (they would wait hundreds of minibatches to send anything) and
saturates those with large ones (an element sends at most one quantum per minibatch; its
residual carries the rest). The default scale 100 sends at most ~1 % of the elements:
>= 100x fewer bytes than dense fp32 (a code is 4 bytes, as a float is).

At >= 100x an element is updated on average at most once per 100 minibatches, so GTC from a
random initialisation needs many minibatches (the papers start it from a pre-trained
model). `train.gtc_warmup` > 0 ramps tau geometrically from tau / gtc_tau_scale up to tau
over that many minibatches (denser updates while the gradients are large).

Bytes counted per minibatch: what this worker puts on the wire, i.e. the 8-byte length
plus its code buffer padded to the longest one in the group (`payload_bytes` counts the
unpadded codes, which is what an all-gather-v would send).

Momentum correction (`train.gtc_momentum_correction`, after Lin et al.'s deep gradient
compression). With momentum SGD the plain scheme compresses the gradient and lets the
optimizer's momentum act on the sparse average: an element's update arrives in a burst
whenever its residual crosses tau and momentum then smears the burst forward in time. With
the correction the momentum moves to the sender: each worker keeps its own velocity

    u = mu * u + g,   v = r + u,   (encode v as above),   u[sent] = 0

and the optimizer applies the decoded average with its momentum turned off (its
`momentum` is set to 0 and mu kept here). Zeroing the velocity of sent elements
(momentum factor masking) stops a sent element from being pushed again by stale momentum.
The velocity is ~1/(1 - mu) times the gradient, so derived taus are scaled by that to
keep the sent-fraction bound.

With a single process, or a group of one (HTM with group_size 1), there is nobody to
send to: the step is the plain local optimizer step, uncompressed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from core.config import TrainConfig
from training.algorithms.base import (Algorithm, FlatBuckets, broadcast_model_, comm_device,
                                      model_device, resolve_group, trainable)

SIGN_BIT = -(1 << 31)  # int32 with only bit 31 set
INDEX_MASK = (1 << 31) - 1
MAX_INDEX = INDEX_MASK


# ---------------------------------------------------------------------------------------
# The codec: pure tensor functions, usable and testable without a process group.
# ---------------------------------------------------------------------------------------

def pack(index: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """Indices in [0, 2^31 - 1] and their signs -> int32 codes (bit 31 = negative)."""
    codes = index.to(torch.int32)
    return torch.where(negative, codes | SIGN_BIT, codes)


def unpack(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 codes -> (int64 indices, bool negative)."""
    return codes.to(torch.int64) & INDEX_MASK, codes < 0


class Thresholds:
    """One tau per contiguous segment of the flat vector (one segment per parameter
    tensor). Both ends know the layout, so codes stay sign + index."""

    def __init__(self, sizes: list[int], taus: list[float] | torch.Tensor):
        self.sizes = [int(n) for n in sizes]
        self.taus = torch.as_tensor(taus, dtype=torch.float32).reshape(-1).clone()
        if len(self.sizes) != self.taus.numel():
            raise ValueError("one tau per segment")
        ends = np.cumsum(self.sizes)
        self.ends = torch.as_tensor(ends, dtype=torch.int64)
        self.starts = [int(e - n) for e, n in zip(ends, self.sizes)]
        self._dev: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def uniform(cls, n: int, tau: float) -> "Thresholds":
        return cls([n], [tau])

    def segments(self):
        for start, size, tau in zip(self.starts, self.sizes, self.taus.tolist()):
            yield start, start + size, tau

    def of(self, index: torch.Tensor) -> torch.Tensor:
        """tau of every flat index."""
        dev = index.device
        if dev not in self._dev:
            self._dev[dev] = (self.ends.to(dev), self.taus.to(dev))
        ends, taus = self._dev[dev]
        if taus.numel() == 1:
            return taus.expand(index.shape)
        return taus[torch.bucketize(index, ends, right=True)]

    def state(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "taus": self.taus.clone()}


def _as_thresholds(tau: "float | Thresholds", n: int) -> Thresholds:
    return tau if isinstance(tau, Thresholds) else Thresholds.uniform(n, float(tau))


def threshold_mask(values: torch.Tensor, tau: "float | Thresholds", mask: torch.Tensor,
                   scratch: torch.Tensor) -> None:
    """mask[:n] = |values| >= tau (per segment), written into preallocated bool buffers.

    On the CPU numpy's SIMD comparisons are several times faster than torch's
    float->bool kernels (zero-copy views of the same memory); elsewhere torch is used."""
    th = _as_thresholds(tau, values.numel())
    for a, b, t in th.segments():
        if values.device.type == "cpu":
            v = values[a:b].numpy()
            mb = mask[a:b].numpy()
            sb = scratch[a:b].numpy()
            np.greater_equal(v, t, out=mb)
            np.less_equal(v, -t, out=sb)
            np.logical_or(mb, sb, out=mb)
        else:
            torch.ge(values[a:b].abs(), t, out=mask[a:b])


def mask_indices(mask: torch.Tensor) -> torch.Tensor:
    """Ascending int64 positions of the True entries of a bool vector whose length is a
    multiple of 8. On the CPU numpy's flatnonzero (counts with SIMD, then fills) is ~2x
    faster than the word search below, and ~10x faster than torch's nonzero(); elsewhere
    the mask is searched in 8-byte words first and only the non-zero ones are opened."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    words = mask.view(torch.int64)
    hit = words.nonzero().view(-1)
    if hit.numel() == 0:
        return hit
    rows, cols = mask.view(-1, 8).index_select(0, hit).nonzero().unbind(1)
    return hit.index_select(0, rows) * 8 + cols


def padded_bool(n: int, device: torch.device) -> torch.Tensor:
    return torch.zeros((n + 7) // 8 * 8, dtype=torch.bool, device=device)


def encode_(residual: torch.Tensor, grad: torch.Tensor, tau: "float | Thresholds",
            mask: torch.Tensor | None = None,
            scratch: torch.Tensor | None = None) -> torch.Tensor:
    """residual += grad; emit the codes of elements with |residual| >= tau and take
    sign * tau off them. Returns the int32 code buffer (indices ascending). `tau` is one
    float or a `Thresholds` (one tau per segment).

    `mask` and `scratch` are optional preallocated bool buffers of `padded_bool(n)` size
    (zero past n)."""
    n = residual.numel()
    if n > MAX_INDEX + 1:
        raise ValueError(f"GTC packs 31-bit indices: {n} elements is too many")
    residual.add_(grad)
    if mask is None:
        mask = padded_bool(n, residual.device)
    if scratch is None:
        scratch = padded_bool(n, residual.device)
    th = _as_thresholds(tau, n)
    threshold_mask(residual, th, mask, scratch)
    index = mask_indices(mask)
    values = residual.index_select(0, index)
    negative = values < 0
    q = th.of(index)
    residual.index_copy_(0, index, values - torch.where(negative, -q, q))
    return pack(index, negative)


def decode_add_(out: torch.Tensor, codes: torch.Tensor, tau: "float | Thresholds",
                scale: float = 1.0) -> torch.Tensor:
    """out[index] += +-tau * scale for every code (duplicates accumulate)."""
    index, negative = unpack(codes)
    if isinstance(tau, Thresholds) and tau.taus.numel() > 1:
        q = tau.of(index).to(out.dtype) * scale
        signed = torch.where(negative, -q, q)
    else:
        v = float(tau.taus[0] if isinstance(tau, Thresholds) else tau) * scale
        signed = torch.where(negative, -v, v).to(out.dtype)
    out.index_add_(0, index, signed)
    return out


def allgather_varlen(codes: torch.Tensor, group: Any, world: int) -> tuple[list[torch.Tensor], int]:
    """All-gather variable-length int32 buffers: lengths first, then padded buffers.
    Returns (every worker's unpadded buffer, bytes this worker sent)."""
    dev = codes.device
    n = torch.tensor([codes.numel()], dtype=torch.int64, device=dev)
    lengths = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(lengths, n, group=group)
    lens = [int(x.item()) for x in lengths]
    longest = max(lens)
    padded = codes
    if codes.numel() < longest:
        padded = torch.zeros(longest, dtype=torch.int32, device=dev)
        padded[:codes.numel()] = codes
    if longest == 0:
        return [codes[:0] for _ in range(world)], 8
    out = [torch.empty(longest, dtype=torch.int32, device=dev) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [b[:m] for b, m in zip(out, lens)], 8 + 4 * longest


class GTC(Algorithm):
    name = "gtc"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, group: Any = None,
                 world_size: int | None = None, tau: float = 0.0, tau_scale: float = 100.0,
                 sync_init: bool = True, warmup: int = 0, momentum_correction: bool = False):
        group, self.rank, self.world = resolve_group(group, world_size)
        super().__init__(model, optimizer, group)
        self.tau = float(tau)
        self.tau_scale = float(tau_scale)
        self.params = trainable(model)
        self.thresholds: Thresholds | None = None
        self.warmup = int(warmup)
        self.payload_bytes = 0
        self.elements_sent = 0
        if self.world > 1:
            dev = comm_device(group, model_device(model))
            # one bucket: the 31-bit index addresses the whole model
            self.flat = FlatBuckets(self.params, dev, bucket_bytes=1 << 62)
            self.flat.bind_grads()
            self.residual = torch.zeros(self.flat.total, dtype=torch.float32, device=dev)
            self._mask = padded_bool(self.flat.total, dev)
            self._scratch = padded_bool(self.flat.total, dev)
            if sync_init:
                self.setup_bytes = broadcast_model_(self.params, group)
            if self.tau > 0:
                self.thresholds = Thresholds(self.flat.numels, [self.tau] * len(self.params))
        self.mu = 0.0
        self.velocity: torch.Tensor | None = None
        if momentum_correction and self.world > 1:
            self.mu = take_over_momentum(optimizer)
            self.velocity = torch.zeros_like(self.residual)

    @classmethod
    def from_config(cls, train_cfg: TrainConfig, model, optimizer, group=None, world_size=None):
        return cls(model, optimizer, group, world_size, tau=train_cfg.algo.gtc_tau,
                   tau_scale=train_cfg.algo.gtc_tau_scale, warmup=train_cfg.algo.gtc_warmup,
                   momentum_correction=train_cfg.algo.gtc_momentum_correction)

    def _current(self) -> "Thresholds":
        """The thresholds of this minibatch: during the warm-up, tau grows geometrically
        from tau / gtc_tau_scale (a threshold at the mean |g|: dense-ish updates) to tau."""
        th = self.thresholds
        if self.warmup <= 0 or self.steps >= self.warmup or self.tau_scale <= 1:
            return th
        factor = self.tau_scale ** (self.steps / self.warmup - 1.0)
        return Thresholds(th.sizes, th.taus * factor)

    def reset_velocity(self) -> None:
        """Zero the momentum-correction velocity (HTM's block reset; a no-op without it)."""
        if self.velocity is not None:
            self.velocity.zero_()

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def _derive_tau(self, grad: torch.Tensor) -> None:
        """Per-tensor taus from the first gradient (see the module doc)."""
        sums = torch.stack([part.abs().double().sum()
                            for part in grad.split(self.flat.numels)]).to(grad.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)
        self.bytes_sent += 8 * sums.numel()
        sums = sums.cpu() / self.world
        sizes = torch.tensor(self.flat.numels, dtype=torch.float64)
        means = sums / sizes
        overall = float(sums.sum() / sizes.sum())
        means[means <= 0] = overall if overall > 0 else 1e-12
        scale = self.tau_scale / (1.0 - self.mu)  # the velocity's scale (module doc)
        self.thresholds = Thresholds(self.flat.numels, (scale * means).float())

    def exchange(self) -> None:
        """Encode this worker's gradient, all-gather, decode the average into `.grad`."""
        (grad,) = self.flat.grads()
        with self._timed():
            if self.thresholds is None:
                self._derive_tau(grad)
            th = self._current()
            source = grad
            if self.velocity is not None:
                source = self.velocity.mul_(self.mu).add_(grad)
            codes = encode_(self.residual, source, th, self._mask, self._scratch)
            if self.velocity is not None:
                self.velocity.index_fill_(0, unpack(codes)[0], 0.0)
            buffers, sent = allgather_varlen(codes, self.group, self.world)
            grad.zero_()
            for b in buffers:
                decode_add_(grad, b, th, 1.0 / self.world)
        self.flat.set_grads([grad])
        self.bytes_sent += sent
        self.payload_bytes += 8 + 4 * codes.numel()
        self.elements_sent += codes.numel()

    def step(self, num_frames: int = 0) -> None:
        if self.world > 1:
            self.exchange()
        self.optimizer.step()
        self.steps += 1
        self.frames += num_frames

    def stats(self) -> dict[str, float]:
        out = super().stats()
        n = max(self.steps, 1)
        taus = self.thresholds.taus if self.thresholds is not None else torch.tensor([self.tau])
        out.update(tau=float(taus.median()), tau_min=float(taus.min()),
                   tau_max=float(taus.max()), payload_bytes_per_step=self.payload_bytes / n,
                   sent_fraction=self.elements_sent / n / max(self.numel, 1),
                   compression=(4 * self.numel * n / self.payload_bytes)
                   if self.payload_bytes else float("inf") if self.world > 1 else 1.0)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(tau=self.tau, payload_bytes=self.payload_bytes,
                     thresholds=self.thresholds.state() if self.thresholds is not None else None,
                     elements_sent=self.elements_sent, mu=self.mu,
                     residual=self.residual.detach().cpu().clone() if self.world > 1 else None,
                     velocity=self.velocity.cpu().clone() if self.velocity is not None else None)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.tau = state["tau"]
        th = state.get("thresholds")
        self.thresholds = Thresholds(th["sizes"], th["taus"]) if th is not None else None
        self.payload_bytes = state["payload_bytes"]
        self.elements_sent = state["elements_sent"]
        if self.world > 1 and state.get("residual") is not None:
            self.residual.copy_(state["residual"].to(self.residual.device))
        if (state.get("velocity") is not None) != (self.velocity is not None):
            raise ValueError("checkpoint and config disagree on train.gtc_momentum_correction")
        if self.velocity is not None:
            self.mu = float(state["mu"])
            self.velocity.copy_(state["velocity"].to(self.velocity.device))


def take_over_momentum(optimizer: Any) -> float:
    """Turn the local optimizer's momentum off and return it (momentum correction keeps
    the velocity in GTC, before compression). Needs SGD-style `momentum` param groups."""
    groups = optimizer.param_groups
    if any("momentum" not in g for g in groups):
        raise ValueError("train.gtc_momentum_correction needs train.optimizer sgd "
                         "(an optimizer with a momentum setting)")
    mus = {float(g["momentum"]) for g in groups}
    if len(mus) != 1:
        raise ValueError(f"train.gtc_momentum_correction: param groups disagree on momentum {mus}")
    for g in groups:
        g["momentum"] = 0.0
        g["nesterov"] = False
    return mus.pop()
