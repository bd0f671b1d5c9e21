"""Length-sorted, zero-padded batches for a whole-utterance forward: one batcher for the
torch models (decoding/decode.py, decoding/ctc_decode.py) and the exported ONNX graphs
(serving/onnx_runtime.py, training/families/ctc_onnx.py).

    length_batches(lengths, batch_frames) -> [[index]]
        indices sorted by length, cut so a batch's padded size (its longest length times
        its count) stays within batch_frames (a longer utterance is a batch of its own)
    batched(feats, forward, batch_frames) -> one output per utterance, in feats' order
        forward(x, lengths): x float32 [B, T, D] (zero rows past each utterance's end),
        lengths int64 [B] -> B outputs (each utterance's, already cut to its length)
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


def length_batches(lengths: Sequence[int], batch_frames: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = [[]]
    for i in order:
        if batches[-1] and lengths[i] * (len(batches[-1]) + 1) > batch_frames:
            batches.append([])
        batches[-1].append(i)
    return [b for b in batches if b]


def batched(feats: Sequence[np.ndarray], forward: Callable[[np.ndarray, np.ndarray], Sequence[Any]],
            batch_frames: int = 20000) -> list[Any]:
    out: list[Any] = [None] * len(feats)
    for batch in length_batches([len(f) for f in feats], batch_frames):
        lens = np.array([len(feats[i]) for i in batch], np.int64)
        x = np.zeros((len(batch), int(lens.max()), feats[batch[0]].shape[1]), np.float32)
        for j, i in enumerate(batch):
            x[j, :lens[j]] = feats[i]
        for i, y in zip(batch, forward(x, lens)):
            out[i] = y
    return out
