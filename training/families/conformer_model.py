"""The streaming Conformer-style encoder (model.conformer), written with torch.nn only.

    rows [B, T, D] (33 Hz)
      -> front end: a causal Conv1d over the rows (kernel model.conformer.frontend_kernel), SiLU
      -> layers x Macaron block:  x + 1/2 FF(x) -> + MHSA(x) -> + Conv(x) -> + 1/2 FF(x) -> LN
      -> output Linear to the classes (senones for the hybrid head, tokens for CTC)

No subsampling: the features are already at 33 Hz, and one output per row keeps the hybrid
head's frame classes aligned with the rows.

Streaming by construction (WeNet U2): self-attention is restricted to chunks of `chunk`
frames, each seeing itself and `left_chunks` earlier chunks (-1: all of them); positions
are rotary (RoPE: the score of two frames depends only on their distance), and both
convolutions are causal. So a stream that runs whole chunks with a cache of the last
`left_chunks x chunk` keys and values per layer and the last kernel - 1 inputs of each
convolution computes exactly what the whole-utterance pass with the same chunking computes
(`stream_chunk` below; training/families/conformer.py's streaming step runs it).

Training draws a chunk size per minibatch (`dynamic_chunks`): full context with
probability `full_context_share`, else 1..max_train_chunk, so one model serves streaming
with any chunk and whole utterances. In eval mode the model uses its configured chunk, the
streaming one, so the offline decode equals the served one.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def chunk_mask(steps: int, chunk: int, left_chunks: int, lengths: torch.Tensor | None = None,
               device: Any = None) -> torch.Tensor:
    """Which keys each query may attend to, [B or 1, 1, T, T] bool: keys of the query's
    chunk and `left_chunks` chunks before (-1: all before), not past a sequence's length.
    Every query sees itself, so a padded frame's row is never empty (no NaN in padding)."""
    t = torch.arange(steps, device=device)
    c = t // chunk
    allowed = c[None, :] <= c[:, None]
    if left_chunks >= 0:
        allowed = allowed & (c[None, :] >= c[:, None] - left_chunks)
    allowed = allowed[None]
    if lengths is not None:
        allowed = allowed & (t[None, None, :] < lengths.to(t.device)[:, None, None])
    return (allowed | (t[:, None] == t[None, :]))[:, None]  # (not eye: ONNX has no bool EyeLike)


def rotary(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x [B, H, T, dh] at frame `positions` ([T], or [B, T]
    for streams at different frames): each pair of dimensions (i, i + dh/2) rotated by
    position x 10000^(-2i/dh)."""
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = positions.to(torch.float32)[..., None] * inv  # [T, half] or [B, T, half]
    if angle.dim() == 3:
        angle = angle[:, None]  # over the heads
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * mult), nn.SiLU(),
                                 nn.Dropout(dropout), nn.Linear(dim * mult, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SelfAttention(nn.Module):
    """Multi-head self-attention with rotary positions (from nn.Linear: the cached keys and
    values of the streaming step are its own tensors, and it exports to plain ONNX ops)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """(q, k, v) [B, H, T, dh] of x [B, T, dim], q and k rotated to `positions`."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        return rotary(q, positions), rotary(k, positions), v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        y = self.drop(torch.softmax(scores, -1)) @ v  # [B, H, Tq, dh]
        b, h, t, dh = y.shape
        return self.drop(self.out(y.transpose(1, 2).reshape(b, t, h * dh)))


class ConvModule(nn.Module):
    """Pointwise conv + GLU, causal depthwise conv (left-padded by kernel - 1: no future
    frame), LayerNorm (not BatchNorm: per frame, as a stream sees it), SiLU, pointwise."""

    def __init__(self, dim: int, kernel: int, dropout: float):
        super().__init__()
        self.kernel = kernel
        self.norm = nn.LayerNorm(dim)
        self.pointwise_in = nn.Linear(dim, 2 * dim)
        self.depthwise = nn.Conv1d(dim, dim, kernel, groups=dim)
        self.conv_norm = nn.LayerNorm(dim)
        self.pointwise_out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def glu(self, x: torch.Tensor) -> torch.Tensor:
        return F.glu(self.pointwise_in(self.norm(x)), -1)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The rest after the depthwise conv's input `h` [B, kernel - 1 + T, dim] (its
        history first)."""
        y = self.depthwise(h.transpose(1, 2)).transpose(1, 2)
        return self.drop(self.pointwise_out(F.silu(self.conv_norm(y))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(F.pad(self.glu(x), (0, 0, self.kernel - 1, 0)))


class ConformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ff_mult: int, kernel: int, dropout: float):
        super().__init__()
        self.ff1 = FeedForward(dim, ff_mult, dropout)
        self.attn = SelfAttention(dim, heads, dropout)
        self.conv = ConvModule(dim, kernel, dropout)
        self.ff2 = FeedForward(dim, ff_mult, dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn.attend(*self.attn.project(x, positions), mask)
        x = x + self.conv(x)
        return self.norm(x + 0.5 * self.ff2(x))

    def stream(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, conv_hist: torch.Tensor, key_mask: torch.Tensor | None):
        """One chunk x [B, n, dim] of B streams after their cached keys/values [B, H, L, dh]
        (left-padded to one length: `key_mask` [B, 1, 1, L + n] says which are real, None:
        all) and the conv's last kernel - 1 inputs [B, kernel - 1, dim]: (y, all keys, all
        values, conv input). Every real cached key is in the chunk's left context."""
        x = x + 0.5 * self.ff1(x)
        q, k, v = self.attn.project(x, positions)
        keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
        x = x + self.attn.attend(q, keys, values, key_mask)
        h = torch.cat([conv_hist, self.conv.glu(x)], 1)
        x = x + self.conv.finish(h)
        return self.norm(x + 0.5 * self.ff2(x)), keys, values, h


class ConformerModel(nn.Module):
    """rows [B, T, D] -> logits [B, T, C]; `lengths` [B] for padded batches."""

    kind = "conformer"

    def __init__(self, input_dim: int, num_classes: int, dim: int = 96, heads: int = 4,
                 layers: int = 4, ff_mult: int = 4, conv_kernel: int = 15,
                 frontend_kernel: int = 3, chunk: int = 8, left_chunks: int = 4,
                 dynamic_chunks: bool = True, max_train_chunk: int = 16,
                 full_context_share: float = 0.5, dropout: float = 0.1):
        super().__init__()
        if min(input_dim, num_classes, dim, heads, layers, chunk) < 1 or dim % (2 * heads):
            raise ValueError(f"bad conformer size: input_dim={input_dim} classes={num_classes} "
                             f"dim={dim} heads={heads} layers={layers} chunk={chunk} (dim must "
                             "be a multiple of 2 x heads)")
        self.config = dict(input_dim=input_dim, num_classes=num_classes, dim=dim, heads=heads,
                           layers=layers, ff_mult=ff_mult, conv_kernel=conv_kernel,
                           frontend_kernel=frontend_kernel, chunk=chunk, left_chunks=left_chunks,
                           dynamic_chunks=bool(dynamic_chunks), max_train_chunk=max_train_chunk,
                           full_context_share=float(full_context_share), dropout=float(dropout))
        self.chunk, self.left_chunks = int(chunk), int(left_chunks)
        self.frontend = nn.Conv1d(input_dim, dim, frontend_kernel)
        self.blocks = nn.ModuleList(ConformerBlock(dim, heads, ff_mult, conv_kernel, dropout)
                                    for _ in range(layers))
        self.drop = nn.Dropout(dropout)
        self.output = nn.Linear(dim, num_classes)

    @property
    def input_dim(self) -> int:
        return self.frontend.in_channels

    @property
    def num_classes(self) -> int:
        return self.output.out_features

    @property
    def lookahead(self) -> int:
        """Frames a chunk's first frame waits for (the streaming step holds them itself)."""
        return self.chunk - 1

    def chunking(self) -> tuple[int, int]:
        """(chunk, left_chunks) of this forward: the configured ones in eval mode; in
        training with dynamic_chunks, U2's draw (0 as chunk: full context)."""
        c = self.config
        if not (self.training and c["dynamic_chunks"]):
            return self.chunk, self.left_chunks
        if float(torch.rand(())) < c["full_context_share"]:
            return 0, -1
        chunk = int(torch.randint(1, c["max_train_chunk"] + 1, ()))
        left = -1 if self.left_chunks < 0 else int(torch.randint(0, self.left_chunks + 1, ()))
        return chunk, left

    def encode_chunked(self, x: torch.Tensor, lengths: torch.Tensor | None, chunk: int,
                       left_chunks: int) -> torch.Tensor:
        """The encoder's output [B, T, dim] with this chunking (chunk 0: full context)."""
        steps = x.shape[1]
        k = self.frontend.kernel_size[0]
        h = self.frontend(F.pad(x.transpose(1, 2), (k - 1, 0))).transpose(1, 2)
        h = self.drop(F.silu(h))
        if lengths is not None and bool((lengths == steps).all()):
            lengths = None
        mask = chunk_mask(steps, chunk or max(steps, 1), left_chunks, lengths, x.device)
        positions = torch.arange(steps, device=x.device)
        for block in self.blocks:
            h = block(h, positions, mask)
        return h

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.drop(self.encode_chunked(x, lengths, *self.chunking())))


class ConformerCtcModel(ConformerModel):
    """The same encoder with a CTC output over tokens (the blank is class 0): the CTC
    student's interface (training/ctc/loss.py, decoding/ctc_decode.py): `encode(x, lengths)
    -> (h, output lengths)` and `ctc_output(h, n)`; one output per row (no subsampling), no
    attention decoder."""

    kind = "conformer_ctc"
    decoder = None  # (the GRU CTC student's optional attention decoder)
    attention_weight = 0.0

    def encode(self, x: torch.Tensor, lengths: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if lengths is None:
            lengths = torch.full((x.shape[0],), x.shape[1], dtype=torch.long)
        lengths = lengths.to(x.device)
        return self.encode_chunked(x, lengths, *self.chunking()), lengths

    def ctc_output(self, h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return self.output(self.drop(h))


def stream_state_names(model: ConformerModel) -> list[str]:
    """A stream's state tensors, in order: the front end's last kernel - 1 rows, the frame
    count so far, then per block its cached keys and values and its conv history."""
    names = ["frontend", "offset"]
    for i in range(len(model.blocks)):
        names += [f"keys{i}", f"values{i}", f"conv{i}"]
    return names


def zero_stream_state(model: ConformerModel) -> list[torch.Tensor]:
    """A fresh utterance's state (one stream, batch 1): zero histories (as the whole pass's
    left padding), no cached keys or values."""
    dim, heads = model.config["dim"], model.config["heads"]
    p = next(model.parameters())
    z = [torch.zeros(1, model.frontend.kernel_size[0] - 1, model.input_dim, dtype=p.dtype),
         torch.zeros((), dtype=p.dtype)]
    for block in model.blocks:
        kv = torch.zeros(1, heads, 0, dim // heads, dtype=p.dtype)
        z += [kv, kv.clone(), torch.zeros(1, block.conv.kernel - 1, dim, dtype=p.dtype)]
    return [t.to(p.device) for t in z]


def stream_chunk(model: ConformerModel, x: torch.Tensor, state: list[torch.Tensor]
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One chunk x [1, n, D] (n <= chunk; fewer only at an utterance's end) after `state`
    (zero_stream_state's layout): (logits [1, n, C], the next state)."""
    y, (new,) = stream_chunks(model, x, [state])
    return y, new


def _left_padded(caches: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-stream caches [1, H, L_b, dh] as one [B, H, max L, dh], zeros on the left, and
    which positions are real ([B, max L] bool; None when every L_b is the same)."""
    longest = max(c.shape[2] for c in caches)
    if all(c.shape[2] == longest for c in caches):
        return torch.cat(caches), None
    padded = torch.cat([F.pad(c, (0, 0, longest - c.shape[2], 0)) for c in caches])
    lens = torch.tensor([c.shape[2] for c in caches], device=padded.device)
    return padded, torch.arange(longest, device=padded.device)[None] >= longest - lens[:, None]


def stream_chunks(model: ConformerModel, x: torch.Tensor, states: list[list[torch.Tensor]]
                  ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """One chunk of each of B streams, x [B, n, D] (n <= chunk), after each stream's state
    (zero_stream_state's layout; their caches may differ in length: a stream that began
    later holds fewer keys): (logits [B, n, C], each stream's next state). The caches keep
    the last left_chunks x chunk frames, exactly the whole pass's left context."""
    n, kf = x.shape[1], model.frontend.kernel_size[0]
    inp = torch.cat([torch.cat([s[0] for s in states]), x], 1)
    h = F.silu(model.frontend(inp.transpose(1, 2)).transpose(1, 2))
    offsets = torch.stack([s[1] for s in states])
    positions = offsets.long()[:, None] + torch.arange(n, device=x.device)
    keep = None if model.left_chunks < 0 else model.left_chunks * model.chunk
    new = [[inp[b:b + 1, inp.shape[1] - (kf - 1):], offsets[b] + n] for b in range(len(states))]
    for i, block in enumerate(model.blocks):
        cached = [s[2 + 3 * i] for s in states]
        keys, real = _left_padded(cached)
        values, _ = _left_padded([s[3 + 3 * i] for s in states])
        mask = None if real is None else F.pad(real, (0, n), value=True)[:, None, None]
        h, keys, values, conv_in = block.stream(h, positions, keys, values,
                                                torch.cat([s[4 + 3 * i] for s in states]), mask)
        for b, c in enumerate(cached):
            kept = c.shape[2] + n if keep is None else min(keep, c.shape[2] + n)
            new[b] += [keys[b:b + 1, :, keys.shape[2] - kept:],
                       values[b:b + 1, :, values.shape[2] - kept:],
                       conv_in[b:b + 1, conv_in.shape[1] - (block.conv.kernel - 1):]]
    return model.output(h), new
