"""What the training loader does with the CTC student's transcripts (training/data.py
calls these for SplitIndex target "tokens"; training/ctc/data.py makes the transcripts).

    token_reasons(...)  why a row cannot be trained on: no_transcript, or
                        too_short_for_tokens (fewer model outputs than CTC needs)
    pad_tokens(...)     whole utterances -> padded features and token targets
"""
from __future__ import annotations

import numpy as np
import torch

from core.outcomes import StepError
from training.ctc.tokens import ctc_min_frames


def token_reasons(reason: np.ndarray, utts: list[str], frames: np.ndarray,
                  transcripts: dict[str, np.ndarray], out_per_row: float) -> np.ndarray:
    """`reason` (per row, "" = usable so far) with the rows that have no transcript or
    too few model outputs for theirs marked. One row is kept in hand for frame offsets."""
    reason = reason.copy()
    for i, u in enumerate(utts):
        if reason[i]:
            continue
        ids = transcripts.get(u)
        if ids is None or len(ids) == 0:
            reason[i] = "no_transcript"
        elif int((frames[i] - 1) * out_per_row) < ctc_min_frames(ids.tolist()):
            reason[i] = "too_short_for_tokens"
    return reason


def pad_tokens(cache: dict[int, tuple], pieces: np.ndarray, feat_dim: int) -> tuple:
    """Whole utterances (full-sequence pieces) -> zero-padded (x [B, T, D], lengths [B],
    mask [B, T], tokens [B, L], token lengths [B]) tensors."""
    if bool((pieces[:, 1] != 0).any()) or bool((pieces[:, 3] != 0).any()):
        raise StepError("train.model ctc trains on whole utterances: a chunked pass reached "
                        "it (training/schedules.py plans full passes for ctc)")
    b = len(pieces)
    lens = (pieces[:, 2] - pieces[:, 1]).astype(np.int64)
    x = np.zeros((b, int(lens.max()), feat_dim), np.float32)
    mask = np.zeros(x.shape[:2], bool)
    toks = [cache[int(u)][1] for u in pieces[:, 0]]
    y = np.zeros((b, max(len(t) for t in toks)), np.int64)
    for i, (u, s0, e0, _, _) in enumerate(pieces):
        x[i, :e0 - s0] = cache[int(u)][0][s0:e0]
        mask[i, :e0 - s0] = True
        y[i, :len(toks[i])] = toks[i]
    tl = torch.tensor([len(t) for t in toks], dtype=torch.long)
    return (torch.from_numpy(x), torch.from_numpy(lens), torch.from_numpy(mask),
            torch.from_numpy(y), tl)
