"""Streaming features: the offline features step, one chunk of audio at a time.

    StreamFeatures(fcfg, cmvn, input_dim).accept(samples) -> float32 [rows, D]
        16 kHz float32 [-1, 1] samples in (any chunk size) -> the model's input rows that
        became ready: log-mel fbank (kaldi-native-fbank OnlineFbank with the training
        options, tasks.fbank.kaldi_options), causal mean normalisation (tasks.features.
        StreamCMN, state carried), low-frame-rate stacking and the global CMVN.
    .end_utterance() -> rows      the rest of the utterance; the CMN state carries on
    .new_utterance()               fresh fbank and stacking state for the next utterance
    StreamFeatures(..., gate=GateSettings(...))   only the fbank frames of speech and the
        padding around it go on to the mean normalisation and the rows (tasks.speech_
        activity: a stream of silence, hum or steady noise gives no rows, so no words);
        without a gate every frame does, as offline
    accept_many(feats, chunks)     accept() of many streams, their numpy fbank in one call

What the offline step does, and so what this must reproduce (tasks/features.py):
fbank per utterance -> one CMN pass over the speaker's concatenated frames (the mean of
the last cmn_window frames, carried across utterances; the first cmn_min_window frames
of the stream use the mean of the first cmn_min_window frames: the only look-ahead) ->
LFR stacking per utterance -> global CMVN. Online, frames are held back only until the
stream has cmn_min_window frames (the first second); after that every fbank frame is
normalised as it arrives. An utterance that ends before the stream has cmn_min_window
frames is normalised with the mean of what there is (offline would also look into the
speaker's next utterance: the one place streaming and offline can differ).

Fbank backend: the one the model was trained with (features.backend in model.pt).
"kaldi": kaldi-native-fbank's OnlineFbank with the training options (tasks.fbank.
kaldi_options). "numpy" (the features step's default): the offline FbankComputer itself,
run on each complete 25 ms frame as its samples arrive (with snip_edges every frame
depends on its own samples only, so this is the offline computation, chunk by chunk).
Why not OnlineFbank for a numpy-trained model: the two fbanks agree only to ~1.3e-4 in
log-mel on corpus speech (tests/test_fbank.py allows 1e-3), ~2e-4 after the CMN, which
is above the 1e-4 parity the streaming rows must hold; with the matching backend they
agree to float32 rounding (tests/test_serving.py measures both).
"""
from __future__ import annotations

import numpy as np

from core.config import FeaturesConfig
from tasks.fbank import INT16_SCALE, FbankComputer, kaldi_options
from tasks.features import StreamCMN
from tasks.speech_activity import GateSettings


class KaldiOnlineFbank:
    """kaldi-native-fbank's OnlineFbank: samples in, the frames that became ready out."""

    def __init__(self, fcfg: FeaturesConfig):
        import kaldi_native_fbank as knf

        self.rate = float(fcfg.sample_rate)
        self.bins = fcfg.num_mel_bins
        self.fb = knf.OnlineFbank(kaldi_options(fcfg))
        self.next_frame = 0

    def accept(self, samples: np.ndarray) -> np.ndarray:
        if len(samples):
            self.fb.accept_waveform(self.rate, np.asarray(samples, np.float32) * np.float32(INT16_SCALE))
        return self._ready()

    def finish(self) -> np.ndarray:
        self.fb.input_finished()
        return self._ready()

    def _ready(self) -> np.ndarray:
        ready = self.fb.num_frames_ready
        if ready == self.next_frame:
            return np.zeros((0, self.bins), np.float32)
        # get_frame is a view into the extractor's buffer: copy before pop() frees it.
        out = np.stack([np.array(self.fb.get_frame(i), np.float32)
                        for i in range(self.next_frame, ready)])
        self.fb.pop(ready - self.next_frame)
        self.next_frame = ready
        return out


class NumpyOnlineFbank:
    """The offline FbankComputer on each complete frame (snip_edges: a frame needs only its
    own samples); keeps the samples of the frames not yet complete."""

    def __init__(self, fcfg: FeaturesConfig, computer: FbankComputer | None = None):
        if not fcfg.snip_edges:
            raise ValueError("streaming the numpy fbank needs features.snip_edges=true")
        self.comp = computer or FbankComputer(fcfg, chunk_frames=64)
        self.buf = np.zeros(0, np.float32)  # starts at the next frame's first sample

    def accept(self, samples: np.ndarray) -> np.ndarray:
        wave = self.take(samples)
        if not len(wave):
            return np.zeros((0, self.comp.bins), np.float32)
        return self.comp.compute([wave])[0]

    def take(self, samples: np.ndarray) -> np.ndarray:
        """Keep `samples`; return the samples of the frames now complete (their fbank is
        comp.compute([them])[0]: accept_many computes many streams' in one call)."""
        self.buf = np.concatenate([self.buf, np.asarray(samples, np.float32)])
        n = self.comp.num_frames(len(self.buf))
        if n == 0:
            return self.buf[:0]
        wave = self.buf[:(n - 1) * self.comp.shift + self.comp.length]
        self.buf = self.buf[n * self.comp.shift:]
        return wave

    def finish(self) -> np.ndarray:
        return np.zeros((0, self.comp.bins), np.float32)  # snip_edges: no partial frames


def online_fbank(fcfg: FeaturesConfig, computer: FbankComputer | None = None):
    return KaldiOnlineFbank(fcfg) if fcfg.backend == "kaldi" else NumpyOnlineFbank(fcfg, computer)


def accept_many(feats: list[StreamFeatures], chunks: list[np.ndarray]) -> list[np.ndarray]:
    """[f.accept(c) for f, c in zip(feats, chunks)], with the numpy fbank of every stream in
    one FbankComputer call: one FFT and one mel matmul over all the streams' new frames
    instead of one per stream per chunk (where most of a 100 ms chunk's fbank time went:
    per-call overhead on ~10 frames). The streams must share the fbank options (one
    replica's streams do); the kaldi backend stays per stream."""
    waves, comp = {}, None
    for i, (f, c) in enumerate(zip(feats, chunks)):
        if isinstance(f.fbank, NumpyOnlineFbank):
            wave = f.fbank.take(c)
            comp = comp or f.fbank.comp
            if len(wave):
                waves[i] = wave
    frames = dict(zip(waves, comp.compute(list(waves.values())))) if waves else {}
    out = []
    for i, (f, c) in enumerate(zip(feats, chunks)):
        if isinstance(f.fbank, NumpyOnlineFbank):
            out.append(f.from_fbank(frames.get(i, np.zeros((0, f.bins), np.float32))))
        else:
            out.append(f.accept(c))
    return out


class StreamFeatures:
    def __init__(self, fcfg: FeaturesConfig, cmvn: dict | None, input_dim: int, normalizer=None,
                 computer: FbankComputer | None = None, gate: GateSettings | None = None):
        """`computer`: a numpy FbankComputer to share (a replica's streams share one).
        `gate`: keep non-speech out (tasks.speech_activity): only the rows of speech and
        their padding come out; None: every row."""
        from training.data import Normalizer

        self.fcfg = fcfg
        self.norm = normalizer or Normalizer.from_stats(cmvn, input_dim)
        self.cmn = StreamCMN(fcfg.num_mel_bins, fcfg.cmn_window, fcfg.cmn_min_window)
        self.bins = fcfg.num_mel_bins
        self.held = np.zeros((0, self.bins), np.float32)  # frames waiting for the CMN cold start
        self.frames_seen = 0  # fbank frames of the whole stream
        self.tail: np.ndarray | None = None  # after the cold start: the CMN window's history
        if fcfg.backend != "kaldi" and computer is None:
            computer = FbankComputer(fcfg, chunk_frames=64)
        self._computer = computer
        # the speaker's floor carries across utterances (as the CMN does); the padding not
        self.activity = gate.activity(fcfg) if gate else None
        self.gate = gate.frame_gate(fcfg) if gate else None
        self.new_utterance()

    def new_utterance(self) -> None:
        self.fbank = online_fbank(self.fcfg, self._computer)
        self.lfr = np.zeros((0, self.bins), np.float32)  # normalised frames not yet stacked
        if self.gate is not None:
            self.gate.new_utterance()

    def accept(self, samples: np.ndarray) -> np.ndarray:
        return self.from_fbank(self.fbank.accept(samples))

    def from_fbank(self, frames: np.ndarray) -> np.ndarray:
        """This stream's next fbank frames -> the model rows that became ready."""
        return self._rows(self._normalise(self._gated(frames), final=False))

    def end_utterance(self) -> np.ndarray:
        frames = self._gated(self.fbank.finish())
        if self.gate is not None:
            self.gate.end_utterance()  # non-speech that no speech followed: dropped
        return self._rows(self._normalise(frames, final=True))

    def _gated(self, frames: np.ndarray) -> np.ndarray:
        """The frames of speech and the padding around it (all of them without a gate).
        Before the mean normalisation: frames of silence or noise left out of the
        recognizer must not weigh on the speaker's mean either (3 s of digital silence,
        log(FLT_EPSILON) in every bin, pulled it ~10 below the speech that followed, and
        the words were lost; the level is also the speech decision's cue)."""
        if self.gate is None or not len(frames):
            return frames
        speech = self.activity.accept(frames)
        return self.gate.accept(frames, speech, self.activity.audible)

    def _normalise(self, frames: np.ndarray, final: bool) -> np.ndarray:
        self.frames_seen += len(frames)
        if self.tail is not None:
            return self._running_cmn(frames)
        if self.frames_seen < self.cmn.min_window and not final:
            self.held = np.concatenate([self.held, frames])  # cold start: wait for 1 s
            return np.zeros((0, self.bins), np.float32)
        if len(self.held):
            frames, self.held = np.concatenate([self.held, frames]), self.held[:0]
        out = self.cmn.apply(frames, final=final)  # the cold start, exactly as offline
        if self.cmn.seen >= self.cmn.min_window:
            self.tail = self.cmn.hist.astype(np.float64)  # the last cmn_window - 1 frames
        return out

    def _running_cmn(self, x: np.ndarray) -> np.ndarray:
        """StreamCMN past its cold start, in O(chunk) per call: frame t minus the mean of
        the last cmn_window frames (StreamCMN re-sums its whole 6 s history per call,
        ~10x the work for a 100 ms chunk). Sums in float64, so it stays within float32
        rounding of the offline pass."""
        n = len(x)
        if n == 0:
            return x.astype(np.float32)
        W, tail = self.cmn.window, self.tail
        h = len(tail)
        xs = x.astype(np.float64)
        cum_x = np.cumsum(xs, axis=0)
        j = np.arange(n)
        count = np.minimum(W, h + j + 1)
        k = h + j + 1 - count  # frames of tail + x that left the window by frame j
        seq = np.concatenate([tail, xs[:max(0, int(k[-1]) - h)]])
        cum_out = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(seq[:int(k[-1])], axis=0)])
        win = tail.sum(axis=0) + cum_x - cum_out[k]
        out = (xs - win / count[:, None]).astype(np.float32)
        self.tail = np.concatenate([tail, xs])[-(W - 1):] if W > 1 else tail[:0]
        return out

    def _rows(self, frames: np.ndarray) -> np.ndarray:
        """Low-frame-rate rows (row r = frames r*subsample .. +stack-1), then global CMVN."""
        stack, sub = self.fcfg.stack, self.fcfg.subsample
        buf = np.concatenate([self.lfr, frames]) if len(self.lfr) else frames
        n = 0 if len(buf) < stack else (len(buf) - stack) // sub + 1
        rows = [buf[r * sub:r * sub + stack].reshape(-1) for r in range(n)]
        self.lfr = buf[n * sub:]
        if not rows:
            return np.zeros((0, stack * self.bins), np.float32)
        return self.norm(np.stack(rows)).astype(np.float32)
