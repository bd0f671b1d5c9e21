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

    SpeechActivity(threshold_db, floor_frames, smooth_frames, audible_db, steady_frames,
                   steady_db).accept(logmel [n, bins]) -> bool [n]
        a frame is speech when its energy (all mel bins, before any normalisation; the
        mean power of the last smooth_frames) is more than threshold_db above the stream's
        floor: the lowest energy of the last floor_frames frames (minimum statistics; a
        stationary input is its own floor, so it never is speech, whatever its level), or,
        where the energy held within steady_db for steady_frames, that steady level (a
        hum that starts after speech is not speech for floor_frames). Carried across
        chunks and utterances.
        .audible: the frames at or above audible_db (GateSettings.min_dbfs as the energy
        of white noise at that level): below it, digital silence or a constant signal,
        there is no sound, not even to pad speech with (log(FLT_EPSILON) in every bin,
        ~30 below a room's noise, drags the speaker's mean down)
    SpeechGate(lead, trail).accept(frames, flags) -> the frames to recognise
        keeps the speech frames, the `trail` frames after each and the `lead` frames
        before each (held back until speech comes, so speech is never delayed); the rest
        of a non-speech run is dropped. .end_utterance() drops what is still held.
        serving.features.StreamFeatures gates the fbank frames before the speaker's mean
        normalisation, which the dropped frames then do not weigh on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.config import FeaturesConfig, ServeConfig

DB_PER_NEPER = 10.0 / np.log(10.0)  # natural-log power -> dB
EDGE = 2  # frames after one of no sound whose 25 ms window still holds some of it


def frame_energy_db(logmel: np.ndarray) -> np.ndarray:
    """Each frame's total mel energy in dB (the log-mel values are natural-log powers)."""
    x = np.asarray(logmel, np.float64)
    if not len(x):
        return np.zeros(0)
    top = x.max(axis=1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(x - top).sum(axis=1))) * DB_PER_NEPER


def _sliding(x: np.ndarray, w: int, fill: float, how, last: int | None = None) -> np.ndarray:
    """how(x[j - w + 1 .. j]) for the last `last` j of x (every j when None), `fill`
    before x's start. A served chunk wants its few new frames' values over a history of
    a floor window (300 frames): only their windows are computed, not the history's."""
    n = len(x) if last is None else min(int(last), len(x))
    need = n + w - 1
    tail = x[len(x) - need:] if len(x) >= need else np.concatenate(
        [np.full(need - len(x), fill), x])
    return how(np.lib.stride_tricks.sliding_window_view(tail, w), axis=1)


class SpeechActivity:
    def __init__(self, threshold_db: float, floor_frames: int, smooth_frames: int = 1,
                 audible_db: float = -np.inf, steady_frames: int = 0, steady_db: float = 3.0):
        """`audible_db`: frames below this energy are no audio at all (digital silence,
        a constant signal after the DC removal): `audible` says which are not."""
        if floor_frames < 1 or smooth_frames < 1:
            raise ValueError("floor_frames and smooth_frames must be >= 1")
        self.audible_db = float(audible_db)
        self.audible = np.zeros(0, bool)  # of the frames of the last accept()
        self.threshold_db = float(threshold_db)
        self.floor_frames, self.smooth = int(floor_frames), int(smooth_frames)
        self.steady_frames, self.steady_db = int(steady_frames), float(steady_db)
        self.power = np.zeros(0)  # the last smooth_frames - 1 frame powers (dB)
        self.edge = 0  # frames still to skip after silence
        self.hist = np.zeros(0)  # the last floor_frames - 1 smoothed energies

    def accept(self, logmel: np.ndarray) -> np.ndarray:
        raw = frame_energy_db(logmel)
        self.audible = self._audible(raw)
        speech = np.zeros(len(raw), bool)
        if self.audible.any():  # frames of no sound are no floor either: left out
            speech[self.audible] = self._speech(self._smoothed(raw[self.audible]))
        return speech

    def _audible(self, raw: np.ndarray) -> np.ndarray:
        """Frames with sound. After a frame of none, the floor starts afresh (what came
        before the silence says nothing of what follows it) and the next EDGE frames are
        not counted either: their window is partly silence, their energy no level."""
        heard = raw >= self.audible_db
        if heard.all() and not self.edge:
            return heard  # the usual chunk: all sound, no silence just before
        for j in range(len(raw)):
            if not heard[j]:
                self.hist, self.power, self.edge = self.hist[:0], self.power[:0], EDGE
            elif self.edge:
                heard[j], self.edge = False, self.edge - 1
        return heard

    def _speech(self, e: np.ndarray) -> np.ndarray:
        ext = np.concatenate([self.hist, e])
        w = max(self.floor_frames, self.steady_frames)
        # the floor of frame j: the least energy among it and floor_frames - 1 frames before
        floor = _sliding(ext, self.floor_frames, np.inf, np.min, len(e))
        if self.steady_frames > 1:
            # where the energy held within steady_db for steady_frames, that level is the
            # floor: a steady sound is no speech (syllables swing 10 dB and more, several
            # times a second), however far above a quieter past it is (hum after speech)
            s = self.steady_frames
            low = _sliding(ext, s, np.inf, np.min, len(e))
            high = _sliding(ext, s, -np.inf, np.max, len(e))
            floor = np.where(high - low < self.steady_db, np.maximum(floor, low), floor)
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
        mean = _sliding(np.exp((ext - top) / DB_PER_NEPER), k, np.nan, np.nanmean, len(db))
        self.power = ext[-(k - 1):]
        return top + DB_PER_NEPER * np.log(mean)


def full_scale_noise_db(fcfg: FeaturesConfig) -> float:
    """The frame energy (frame_energy_db) of white noise at 0 dBFS RMS through this fbank:
    X dBFS of white noise is this + X (energy scales with power)."""
    from tasks.fbank import FbankComputer

    noise = np.random.default_rng(0).standard_normal(int(fcfg.sample_rate)).astype(np.float32)
    return float(np.median(frame_energy_db(FbankComputer(fcfg).compute([noise])[0])))


class SpeechGate:
    def __init__(self, lead: int, trail: int):
        self.lead, self.trail = int(lead), int(trail)
        self.kept = self.dropped = 0
        self.new_utterance()

    def new_utterance(self) -> None:
        self.since_speech = None  # items since the last speech item; None: none yet
        self.held: list[np.ndarray] = []  # non-speech items that may lead into speech

    def accept(self, rows: np.ndarray, flags: np.ndarray,
               audible: np.ndarray | None = None) -> np.ndarray:
        """`rows`: frames (or rows), one flag each; the ones kept, in order. An item that
        is not `audible` is dropped, padding or not (it carries no sound)."""
        out = []
        audible = np.ones(len(flags), bool) if audible is None else audible
        for row, speech, heard in zip(rows, flags, audible):
            if not heard:
                self.dropped += 1
            elif speech:
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
    """The gate in seconds and dB (serve.speech_*), made into frame counts for one
    feature configuration by `activity` and `frame_gate`."""

    threshold_db: float = 6.0
    floor_s: float = 3.0
    smooth_ms: float = 90.0
    pad_s: float = 0.15
    min_dbfs: float = -80.0
    steady_s: float = 0.5
    steady_db: float = 3.0

    def activity(self, fcfg: FeaturesConfig) -> SpeechActivity:
        shift = fcfg.frame_shift_ms / 1000.0
        return SpeechActivity(self.threshold_db, max(1, round(self.floor_s / shift)),
                              max(1, round(self.smooth_ms / 1000.0 / shift)),
                              full_scale_noise_db(fcfg) + self.min_dbfs,
                              round(self.steady_s / shift), self.steady_db)

    def frame_gate(self, fcfg: FeaturesConfig) -> SpeechGate:
        frames = round(self.pad_s / (fcfg.frame_shift_ms / 1000.0))
        return SpeechGate(frames, frames)


def settings_of(scfg: ServeConfig) -> GateSettings:
    """serve.speech_* (core.config.ServeConfig) as GateSettings: the one gate `amflow
    serve` (serve.speech_gate), `amflow decode` (decode.speech_gate) and the export's
    gate.json apply."""
    return GateSettings(scfg.speech_threshold_db, scfg.speech_floor_s, scfg.speech_smooth_ms,
                        scfg.speech_pad_s, scfg.speech_min_dbfs, scfg.speech_steady_s,
                        scfg.speech_steady_db)


def gate_frames(feats: list[np.ndarray], gate: GateSettings, fcfg: FeaturesConfig
                ) -> list[np.ndarray]:
    """One speaker's fbank frames per utterance (time order) -> the frames the gate keeps,
    as serving.features.StreamFeatures gates a stream (the gate is causal, frame by frame:
    chunking does not change it): the activity carried across utterances, the frames still
    held at an utterance's end dropped. An utterance without speech keeps none."""
    activity, keep = gate.activity(fcfg), gate.frame_gate(fcfg)
    out = []
    for f in feats:
        flags = activity.accept(f)
        kept = keep.accept(f, flags, activity.audible)
        keep.end_utterance()
        out.append(kept if len(kept) else f[:0])
    return out
