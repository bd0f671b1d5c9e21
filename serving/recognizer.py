"""The per-replica recognizer core (no Ray): the model's streaming step, the incremental
search, and one stream's session.

    family.stream_model(model, dtype, device).forward(rows, states) -> (log posteriors, states)
        the model family's streaming step (training/families/): one forward over a batch
        of streams, each with its own state and its own number of new rows (the LSTM
        student's: packed, so a short stream's state stops at its last row)
    StreamSearch(graph, scores, beam, max_active)
        kaldi-decoder's FasterDecoder driven incrementally: init_decoding once, then
        advance_decoding over the frames that arrived (the offline `decode()` is exactly
        init_decoding + advance_decoding over all frames, so the pruning, the best path
        and the words are the offline search's); partial = best path so far. `scores`
        turns log-posteriors into the matrix DecodableCtc reads, as the offline decode of
        the model's kind does: a hybrid's acwt x (log posterior - log prior) over H o L o G
        (decoding.search.acoustic_scores), a CTC model's acwt x log p with the blank
        penalty over T o L o G (decoding.ctc_decode.ctc_scores, acwt = 1 / LM weight)
    Session(recognizer, send)
        one stream: PCM queued -> (featurize(), all streams' fbank at once, before each
        forward) StreamFeatures -> rows pending for the model -> (after the forward)
        the model's look-ahead dropped, posteriors queued for the search -> partial /
        final messages through `send`. Utterance ends keep the speaker's CMN
        state and reset the fbank, LFR, LSTM and search, as the offline decode treats a
        speaker's utterances.
    Recognizer(model_bytes, graph_dir, log_prior, acwt, ...)   what a replica holds once;
        the model card's kind names the family, which gives the streaming step; the
        family's decoder picks the scores: "hybrid" (the LSTM student) or "ctc" (the
        CTC student's step, training/families/ctc_stream.py: the look-ahead inside
        the step; log_prior unused, blank_penalty used)

Look-ahead: the student's logits[t] need rows up to t + lookahead. Offline, the model pads
each utterance with `lookahead` zero rows and drops its first `lookahead` outputs; here the
first `lookahead` outputs of an utterance are dropped and `lookahead` zero rows are fed
at its end, which gives the same outputs row for row. A CTC step holds its look-ahead
back itself (its `lookahead` is 0: nothing dropped, no zero rows) and is told, through
`utterance_end(state)`, which forward carries an utterance's last rows, on which it pads
the end as the whole-utterance forward does.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import numpy as np

STABLE_ROWS = 10  # a word is stable once the best path kept it for 10 rows (300 ms)
PARTIAL_ROWS = 5  # a partial after every 5 new rows (150 ms): the traceback is not free


def torch_dtype(name: str, device: str):
    """serve.dtype -> torch dtype: auto is fp16 on GPUs where it pays (before Ampere), else
    fp32 (on a CPU half precision is slower without AMX, and it moves the transcript off
    the offline one)."""
    import torch

    if name == "auto":
        from core.precision import gpu_fp16_pays

        half = device.startswith("cuda") and gpu_fp16_pays(device)
        return torch.float16 if half else torch.float32
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def StreamModel(model, dtype: str = "auto", device: str = "cpu"):  # noqa: N802 (was a class)
    """The LSTM student's streaming step (its family's: training/families/lstm.py
    LstmStream) with serve.dtype's name for its dtype (the benchmarks' entry)."""
    from training.families.lstm import LstmStream

    return LstmStream(model, torch_dtype(dtype, device), device)


class StreamSearch:
    def __init__(self, graph, scores: Callable[[np.ndarray], np.ndarray], beam: float,
                 max_active: int, min_active: int = 20):
        import kaldi_decoder

        opts = kaldi_decoder.FasterDecoderOptions()
        opts.beam, opts.max_active, opts.min_active = float(beam), int(max_active), int(min_active)
        self.graph = graph
        self.to_scores = scores
        self.decoder = kaldi_decoder.FasterDecoder(graph.fst, opts)
        self.decoder.init_decoding()
        self.scores: np.ndarray | None = None
        self.history: collections.deque = collections.deque()  # (rows, words) of partials
        self.partial_at = 0  # rows when the last partial was made

    @property
    def frames(self) -> int:
        return 0 if self.scores is None else len(self.scores)

    def advance(self, log_post: np.ndarray) -> None:
        import kaldi_decoder

        if not len(log_post):
            return
        new = self.to_scores(log_post)
        self.scores = new if self.scores is None else np.concatenate([self.scores, new])
        # DecodableCtc holds all rows so far; advance_decoding resumes at the first row
        # the decoder has not consumed (num_frames_decoded), so each row is searched once.
        self.decoder.advance_decoding(kaldi_decoder.DecodableCtc(self.scores))

    def words(self, final: bool) -> tuple[list[str], bool]:
        import kaldifst

        if self.frames == 0:
            return [], False
        reached = bool(self.decoder.reached_final()) if final else False
        ok, lattice = self.decoder.get_best_path(use_final_probs=final)
        if not ok:
            return [], reached
        ok, _, olabels, _ = kaldifst.get_linear_symbol_sequence(lattice)
        return [self.graph.words[o] for o in olabels if o], reached

    def partial_due(self) -> bool:
        return self.frames - self.partial_at >= PARTIAL_ROWS

    def partial(self) -> tuple[list[str], list[str]]:
        """(best path words so far, its stable prefix: words every partial of the last
        STABLE_ROWS rows agreed on)."""
        words, _ = self.words(final=False)
        self.partial_at = self.frames
        self.history.append((self.frames, words))
        while len(self.history) > 1 and self.history[1][0] <= self.frames - STABLE_ROWS:
            self.history.popleft()
        stable = words
        if self.history[0][0] > self.frames - STABLE_ROWS:
            stable = []  # not yet STABLE_ROWS rows of history
        for _, w in self.history:
            n = 0
            while n < min(len(stable), len(w)) and stable[n] == w[n]:
                n += 1
            stable = stable[:n]
        return words, stable


class Recognizer:
    """What one replica holds: the model's streaming step, the graph, the scores' scales
    (and a hybrid's priors)."""

    def __init__(self, model_bytes: bytes, graph_dir: str, log_prior: np.ndarray | None,
                 acwt: float, beam: float, max_active: int, dtype: str = "auto",
                 device: str = "cpu", gate=None, onnx: bytes | None = None, threads: int = 1,
                 blank_penalty: float = 0.0):
        """`gate`: tasks.speech_activity.GateSettings (serve.speech_*), or None: every row
        is recognised, silence and noise too (the offline decode's rows). `onnx`: the
        exported streaming graph of this model (amflow export): onnxruntime runs the model
        (serving/onnx_runtime.py: the hybrid's or the CTC student's streaming graph),
        model_bytes still give the card (features, CMVN).
        A CTC model (card kind "ctc"): `graph_dir` holds its T o L o G, `acwt` is 1 / the
        LM weight, `blank_penalty` the decode's, `log_prior` is not used."""
        from core.config import FeaturesConfig
        from decoding.graph import read_graph
        from training.checkpoint import card_from_bytes
        from training.data import Normalizer
        from training.families import get_family
        from training.loop import dataclass_from_dict

        model, self.card = card_from_bytes(model_bytes)
        self.kind = self.card.kind
        self.family = get_family(self.kind)
        if not self.family.streams:
            raise ValueError("only a streaming model (the unidirectional LSTM student, a "
                             f"unidirectional CTC model) can stream; this one is a {self.kind}")
        self.acwt, self.beam, self.max_active = float(acwt), float(beam), int(max_active)
        self.blank_penalty = float(blank_penalty)
        self.log_prior = None if log_prior is None else np.asarray(log_prior, np.float32)
        self.model, self.scores = self._model_and_scores(model, dtype, device, onnx, threads)
        self.fcfg = dataclass_from_dict(FeaturesConfig, self.card.features)
        self.norm = Normalizer.from_stats(self.card.cmvn, self.model.input_dim)
        self.graph = read_graph(graph_dir)
        self.fbank = None  # the streams' shared FbankComputer (numpy backend)
        self.gate = gate

    def _model_and_scores(self, model, dtype: str, device: str, onnx: bytes | None,
                          threads: int):
        """(the streaming step, log-posteriors -> the search's scores): the family's step
        (or its exported graph in onnxruntime), the scores as the offline decode of the
        family's decoder makes them."""
        step = (self.family.stream_model(model, torch_dtype(dtype, device), device)
                if onnx is None else ONNX_STEPS[self.family.decoder](onnx, model, threads))
        return step, SCORES[self.family.decoder](self)

    def _hybrid_scores(self):
        from functools import partial

        from decoding.search import acoustic_scores

        if self.log_prior is None:
            raise ValueError("a hybrid model needs its class log-priors")
        return partial(acoustic_scores, log_prior=self.log_prior, acwt=self.acwt)

    def _ctc_scores(self):
        from functools import partial

        from decoding.ctc_decode import ctc_scores

        return partial(ctc_scores, acwt=self.acwt, blank_penalty=self.blank_penalty)

    def features(self):
        from serving.features import StreamFeatures
        from tasks.fbank import FbankComputer

        if self.fcfg.backend != "kaldi" and self.fbank is None:
            # one for all streams: featurize() runs their fbank in one call (512 frames:
            # 100 ms of 50 streams per FFT)
            self.fbank = FbankComputer(self.fcfg, chunk_frames=512)
        return StreamFeatures(self.fcfg, None, self.model.input_dim, normalizer=self.norm,
                              computer=self.fbank, gate=self.gate)

    def search(self) -> StreamSearch:
        return StreamSearch(self.graph, self.scores, self.beam, self.max_active)


def _onnx_model(graph: bytes, model, threads: int):
    """The exported graph in onnxruntime, refused when it is not this model's shape."""
    from serving.onnx_runtime import OrtStreamModel

    from training.families import family_of

    ort = OrtStreamModel(graph, threads)
    want = family_of(model).streaming_signature(model)
    got = (ort.lookahead, ort.input_dim, ort.state_shape, ort.num_classes)
    if got != want:
        raise ValueError(f"the ONNX graph (lookahead, input, state, classes) {got} is not "
                         f"the model's {want}: export this model (amflow export --model ...)")
    return ort


def _onnx_ctc_model(graph: bytes, model, threads: int):
    """The CTC student's exported streaming graph in onnxruntime, refused when it is not
    this model's shape (its inputs, classes, look-ahead and state tensors)."""
    from serving.onnx_runtime import OrtCtcStreamModel
    from training.families import family_of

    ort = OrtCtcStreamModel(graph, threads)
    want = family_of(model).streaming_signature(model)
    got = (ort.input_dim, ort.num_classes, ort.lookahead_rows, ort.state_names, ort.state_shapes)
    if got != want:
        raise ValueError(f"the ONNX graph (input, classes, look-ahead rows, state names, state "
                         f"shapes) {got} is not the model's {want}: export this model "
                         "(amflow export --model ...)")
    return ort


# by the family's decoder: its exported streaming graph's runner, its scores
ONNX_STEPS = {"hybrid": _onnx_model, "ctc": _onnx_ctc_model}
SCORES = {"hybrid": Recognizer._hybrid_scores, "ctc": Recognizer._ctc_scores}


class Session:
    """One stream. The event loop calls feed / end_utterance; the dispatcher calls take /
    after_forward; a search thread calls run_search. `send(msg)` must be thread-safe."""

    def __init__(self, rec: Recognizer, send: Callable[[dict], None], sid: str = ""):
        self.rec, self.send, self.id = rec, send, sid
        self.feats = rec.features()
        self.audio: collections.deque = collections.deque()  # samples and END, not featurized
        self.pending: collections.deque = collections.deque()  # rows arrays and END markers
        self.waiting_since: float | None = None  # when the oldest input (audio, rows) came
        self.state = rec.model.zero_state()
        self.skip = rec.model.lookahead  # outputs still to drop (the look-ahead)
        # the model is told which forward carries an utterance's last rows (a CTC step
        # pads the end itself), else zero rows pad it (the hybrid LSTM's look-ahead)
        self.ends_with_state = hasattr(rec.model, "utterance_end")
        self.utt = 0
        self.utt_rows = 0  # rows of the current utterance so far
        self.utt_searched = 0  # utterances the search has finished
        self.search = rec.search()
        self.last_partial = ("", "")
        self.to_search: collections.deque = collections.deque()  # posteriors and END markers
        self.search_lock = threading.Lock()
        self.ended_at: dict[int, float] = {}
        self.batch_sizes: collections.Counter = collections.Counter()
        self.closed = False
        self.in_flight = False  # rows of this stream are in the running forward

    # ---------------------------------------------------------------- event loop side
    # Audio waits in `audio` for featurize(), which the dispatcher runs over every stream
    # before each forward, so that one fbank call serves all of them.
    def feed(self, samples: np.ndarray) -> None:
        self._queue_audio(samples)

    def end_utterance(self) -> None:
        """The utterance's audio is complete (its features and look-ahead are flushed by
        the next featurize())."""
        self.ended_at[self.utt] = time.perf_counter()
        self._queue_audio(END)
        self.utt += 1

    def _queue_audio(self, item) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.perf_counter()
        self.audio.append(item)

    def has_input(self) -> bool:
        """Audio not featurized yet, or rows ready for the model (no featurizing here)."""
        return bool(self.audio) or (bool(self.pending) and self.pending[0] is not END)

    def next_audio(self) -> tuple[np.ndarray, bool]:
        """The queued samples up to the next utterance end, and whether it came."""
        parts = []
        while self.audio:
            a = self.audio.popleft()
            if a is END:
                return _concat(parts), True
            parts.append(a)
        return _concat(parts), False

    def add_rows(self, rows: np.ndarray, ended: bool) -> None:
        if len(rows):
            self._queue_rows(rows)
            self.utt_rows += len(rows)
        if ended:
            self._flush_utterance()
        if not self.audio and not any(x is not END for x in self.pending):
            self.waiting_since = None  # the audio made no rows yet: nothing waits

    def _queue_rows(self, rows: np.ndarray) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.perf_counter()
        self.pending.append(rows)

    def _flush_utterance(self) -> None:
        """The rest of the utterance's rows and the look-ahead's zero rows, then END."""
        rows = self.feats.end_utterance()
        la = self.rec.model.lookahead
        if self.utt_rows + len(rows):  # feed the look-ahead's zero rows after the last row
            self._queue_rows(np.concatenate([rows, np.zeros((la, rows.shape[1]), np.float32)]))
        self.utt_rows = 0
        self.pending.append(END)
        self.feats.new_utterance()
        self._pop_ends()

    # ---------------------------------------------------------------- dispatcher side
    def ready(self) -> bool:
        self._featurize_alone()
        return bool(self.pending) and self.pending[0] is not END

    def _featurize_alone(self) -> None:
        if self.audio:  # not featurized with the others (no dispatcher, or none yet)
            featurize([self])

    def take(self, max_rows: int) -> np.ndarray:
        """Rows for the next forward: the pending rows up to the next utterance end."""
        self._featurize_alone()
        parts, n = [], 0
        while self.pending and self.pending[0] is not END and n < max_rows:
            r = self.pending.popleft()
            if n + len(r) > max_rows:
                r, rest = r[:max_rows - n], r[max_rows - n:]
                self.pending.appendleft(rest)
            parts.append(r)
            n += len(r)
        self.in_flight = True
        if self.pending and self.pending[0] is END and self.ends_with_state:
            # the utterance's last rows: a CTC step flushes its look-ahead on them
            self.state = self.rec.model.utterance_end(self.state)
        rest = bool(self.audio) or any(x is not END for x in self.pending)
        self.waiting_since = time.perf_counter() if rest else None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def after_forward(self, log_post: np.ndarray, state, batch: int) -> None:
        self.in_flight = False
        self.state = state
        self.batch_sizes[batch] += 1
        drop = min(self.skip, len(log_post))
        self.skip -= drop
        if len(log_post) > drop:
            self.to_search.append(log_post[drop:])
        self._pop_ends()

    def forward_failed(self) -> None:
        """The forward that held this stream's rows raised: they are lost (the stream's
        words will miss them), the stream goes on."""
        self.in_flight = False
        self._pop_ends()

    def _pop_ends(self) -> None:
        # Not while a forward holds this utterance's last rows: their outputs and state
        # must land before the utterance ends (a client may send the next utterance and
        # its end while that forward runs).
        while not self.in_flight and self.pending and self.pending[0] is END:
            self.pending.popleft()
            self.state = self.rec.model.zero_state()
            self.skip = self.rec.model.lookahead
            self.to_search.append(END)

    def search_due(self) -> bool:
        return bool(self.to_search)

    def end_pending(self) -> bool:
        """An utterance end waits for the features or the model: its client waits."""
        return any(x is END for q in (self.audio, self.pending) for x in tuple(q))

    def final_due(self) -> bool:
        """An utterance end waits in the search queue: someone waits for its final."""
        return any(x is END for x in tuple(self.to_search))

    # ---------------------------------------------------------------- search thread side
    def run_search(self) -> None:
        """Drain the queued posteriors through the search; one thread at a time."""
        with self.search_lock:
            advanced = False
            while self.to_search and not self.closed:
                item = self.to_search.popleft()
                if item is END:
                    self._final()
                    advanced = False
                else:
                    self.search.advance(item)
                    advanced = True
            if advanced and self.search.partial_due():
                words, stable = self.search.partial()
                msg = (" ".join(words), " ".join(stable))
                if msg != self.last_partial:  # only changes go out
                    self.last_partial = msg
                    self.send({"partial": msg[0], "stable": msg[1],
                               "utterance": self.utt_searched})

    def _final(self) -> None:
        words, reached = self.search.words(final=True)
        u = self.utt_searched
        t0 = self.ended_at.pop(u, None)
        self.send({"final": " ".join(words), "utterance": u, "reached_final": reached,
                   "frames": self.search.frames,
                   "server_ms": round(1000 * (time.perf_counter() - t0), 2) if t0 else None})
        self.utt_searched += 1
        self.search = self.rec.search()
        self.last_partial = ("", "")


END = object()  # an utterance boundary in a session's queues


def featurize(sessions: list[Session]) -> None:
    """Every session's queued audio -> model rows (Session.pending), the fbank of all the
    sessions in one call per round (serving.features.accept_many); a round per utterance
    end, as a client faster than real time may queue several."""
    from serving.features import accept_many

    todo = [s for s in sessions if s.audio]
    while todo:
        parts = [s.next_audio() for s in todo]
        rows = accept_many([s.feats for s in todo], [samples for samples, _ in parts])
        for s, r, (_, ended) in zip(todo, rows, parts):
            s.add_rows(r, ended)
        todo = [s for s in todo if s.audio]


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def transcribe(rec: Recognizer, waves: list[np.ndarray], chunk: int = 1600,
               max_rows: int = 10 ** 6) -> list[dict]:
    """One speaker's utterances (float32 [-1, 1]) through a Session in this thread, no
    dispatcher: each fed in `chunk`-sample pieces, ended, run through the model and the
    search. The final messages a client would get, in order (tools and checks: the words
    a recognizer gives, without a server)."""
    msgs: list[dict] = []
    s = Session(rec, msgs.append)
    for w in waves:
        for i in range(0, len(w), chunk):
            s.feed(np.asarray(w[i:i + chunk], np.float32))
        s.end_utterance()
        while s.ready():
            outs, states = rec.model.forward([s.take(max_rows)], [s.state])
            s.after_forward(outs[0], states[0], 1)
        s.run_search()
    return [m for m in msgs if "final" in m]
