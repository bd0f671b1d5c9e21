"""Speech / non-speech from log-mel frames, and a gate that keeps non-speech out of a
recognizer (what lets digital silence, mains hum or fan noise through as words).

Why a recognizer needs it: the features are mean-normalised per speaker stream
(tasks.features.StreamCMN), so a stream of nothing but silence, a constant signal, hum or
steady noise normalises to rows near the training data's average, which the acoustic model
reads as some phones; with no speech anywhere in the stream, nothing tells the search
that these rows are silence (in training, silence only ever appeared next to speech,
whose level set the mean). The level itself is the cue the normalisation throws away:
speech rises well above the stream's noise floor, syllable by syllable; silence, a hum
and steady noise stay at it.

    SpeechActivity(threshold_db, floor_frames).accept(logmel [n, bins]) -> bool [n]
        a frame is speech when its energy (all mel bins, before any normalisation) is
        more than threshold_db above the stream's floor: the lowest frame energy of the
        last floor_frames frames (minimum statistics; a stationary input is its own floor,
        so it never is speech, whatever its level). Carried across chunks and utterances.
    row_flags(frame_flags, stack, subsample) -> bool [rows]
        a low-frame-rate row is speech when any of its frames is
    SpeechGate(lead_rows, trail_rows).accept(rows, flags) -> the rows to recognise
        keeps the speech rows, the trail_rows rows after each and the lead_rows rows
        before each (held back until speech comes, so speech is never delayed); the rest
        of a non-speech run is dropped. .end_utterance() drops what is still held.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DB_PER_NEPER = 10.0 / np.log(10.0)  # natural-log power -> dB


def frame_energy_db(logmel: np.ndarray) -> np.ndarray:
    """Each frame's total mel energy in dB (the log-mel values are natural-log powers)."""
    x = np.asarray(logmel, np.float64)
    if not len(x):
        return np.zeros(0)
    top = x.max(axis=1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(x - top).sum(axis=1))) * DB_PER_NEPER


def _sliding(x: np.ndarray, w: int, fill: float, how) -> np.ndarray:
    """how(x[j - w + 1 .. j]) for every j, `fill` before x's start."""
    pad = np.concatenate([np.full(w - 1, fill), x])
    return how(np.lib.stride_tricks.sliding_window_view(pad, w), axis=1)


class SpeechActivity:
    def __init__(self, threshold_db: float, floor_frames: int, smooth_frames: int = 1):
        if floor_frames < 1 or smooth_frames < 1:
            raise ValueError("floor_frames and smooth_frames must be >= 1")
        self.threshold_db = float(threshold_db)
        self.floor_frames, self.smooth = int(floor_frames), int(smooth_frames)
        self.power = np.zeros(0)  # the last smooth_frames - 1 frame powers (dB)
        self.hist = np.zeros(0)  # the last floor_frames - 1 smoothed energies

    def accept(self, logmel: np.ndarray) -> np.ndarray:
        raw = frame_energy_db(logmel)
        if not len(raw):
            return np.zeros(0, bool)
        e = self._smoothed(raw)
        ext = np.concatenate([self.hist, e])
        w = self.floor_frames
        # the floor of frame j: the least energy among it and up to w - 1 frames before
        floor = _sliding(ext, w, np.inf, np.min)[-len(e):]
        self.hist = ext[-(w - 1):] if w > 1 else ext[:0]
        return e > floor + self.threshold_db

    def _smoothed(self, db: np.ndarray) -> np.ndarray:
        """The mean power of each frame and the smooth_frames - 1 before it, in dB: a
        steady noise's frame-to-frame flutter (a few dB where few FFT bins carry it) is not
        a syllable's rise."""
        k = self.smooth
        if k == 1:
            return db
        ext = np.concatenate([self.power, db])
        top = ext.max()
        mean = _sliding(np.exp((ext - top) / DB_PER_NEPER), k, np.nan, np.nanmean)[-len(db):]
        self.power = ext[-(k - 1):]
        return top + DB_PER_NEPER * np.log(mean)


def row_flags(frame_flags: np.ndarray, stack: int, subsample: int) -> np.ndarray:
    """Row r (frames r*subsample .. r*subsample + stack - 1) is speech if any frame is."""
    f = np.asarray(frame_flags, bool)
    n = 0 if len(f) < stack else (len(f) - stack) // subsample + 1
    if n == 0:
        return np.zeros(0, bool)
    idx = np.arange(n)[:, None] * subsample + np.arange(stack)[None, :]
    return f[idx].any(axis=1)


class SpeechGate:
    def __init__(self, lead_rows: int, trail_rows: int):
        self.lead, self.trail = int(lead_rows), int(trail_rows)
        self.kept = self.dropped = 0
        self.new_utterance()

    def new_utterance(self) -> None:
        self.since_speech = None  # rows since the last speech row; None: none yet
        self.held: list[np.ndarray] = []  # non-speech rows that may lead into speech

    def accept(self, rows: np.ndarray, flags: np.ndarray) -> np.ndarray:
        out = []
        for row, speech in zip(rows, flags):
            if speech:
                out += self.held
                self.held = []
                out.append(row)
                self.since_speech = 0
            elif self.since_speech is not None and self.since_speech < self.trail:
                self.since_speech += 1
                out.append(row)
            else:
                self.held.append(row)
                if len(self.held) > self.lead:
                    self.held.pop(0)
                    self.dropped += 1
        self.kept += len(out)
        if not out:
            return rows[:0]
        return np.stack(out)

    def end_utterance(self) -> None:
        """No speech followed the held rows: they are dropped."""
        self.dropped += len(self.held)
        self.new_utterance()


@dataclass(frozen=True)
class GateSettings:
    """The gate in seconds and dB (serve.speech_*), made into frame and row counts for
    one feature configuration by `activity` and `row_gate`."""

    threshold_db: float = 6.0
    floor_s: float = 3.0
    smooth_ms: float = 90.0
    pad_s: float = 0.45

    def activity(self, fcfg) -> SpeechActivity:
        shift = fcfg.frame_shift_ms / 1000.0
        return SpeechActivity(self.threshold_db, max(1, round(self.floor_s / shift)),
                              max(1, round(self.smooth_ms / 1000.0 / shift)))

    def row_gate(self, fcfg) -> SpeechGate:
        rows = round(self.pad_s / (fcfg.frame_shift_ms / 1000.0 * fcfg.subsample))
        return SpeechGate(rows, rows)
