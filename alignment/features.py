"""Alignment features: MFCC 13 (+ deltas, delta-deltas = 39), CMVN per speaker.

Frames are 25 ms windows every 10 ms with snip_edges off, so frame t is centred at
t * 10 ms + 5 ms and covers [t * 10 ms, (t + 1) * 10 ms): a boundary between frames t-1
and t is at exactly t * 10 ms, which is how alignments become CTM times (ctm.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import kaldi_native_fbank as knf
import numpy as np

FRAME_SHIFT_S = 0.01


@dataclass
class FeatureOptions:
    sample_rate: int = 16000
    num_ceps: int = 13
    delta_order: int = 2
    dither: float = 0.0  # deterministic features: the same audio aligns the same way


def mfcc(samples: np.ndarray, opts: FeatureOptions) -> np.ndarray:
    """float32 [-1, 1] mono samples -> float32 [T, num_ceps * (delta_order + 1)]."""
    o = knf.MfccOptions()
    o.frame_opts.samp_freq = opts.sample_rate
    o.frame_opts.frame_shift_ms = 10.0
    o.frame_opts.frame_length_ms = 25.0
    o.frame_opts.snip_edges = False
    o.frame_opts.dither = opts.dither
    o.num_ceps = opts.num_ceps
    o.mel_opts.num_bins = 23
    m = knf.OnlineMfcc(o)
    # knf expects the 16-bit integer range, as Kaldi's compute-mfcc-feats reads WAV
    m.accept_waveform(opts.sample_rate, (np.asarray(samples, np.float32) * 32768.0).tolist())
    m.input_finished()
    n = m.num_frames_ready
    if n == 0:
        return np.zeros((0, opts.num_ceps * (opts.delta_order + 1)), np.float32)
    x = np.stack([m.get_frame(i) for i in range(n)]).astype(np.float32)
    d = knf.DeltaOptions()
    d.order = opts.delta_order
    return np.asarray(knf.compute_deltas(d, x), np.float32)


def speaker_cmvn(feats: list[np.ndarray]) -> list[np.ndarray]:
    """Mean and variance normalisation over all of one speaker's frames."""
    if not feats:
        return []
    allf = np.concatenate(feats).astype(np.float64)
    mean = allf.mean(axis=0)
    std = np.sqrt(np.maximum(allf.var(axis=0), 1e-8))
    return [((f - mean) / std).astype(np.float32) for f in feats]
