"""The streaming recognizer (serving/): streaming features and words equal the offline
ones, Batch Dispatch batches what is ready, the protocol refuses bad input, and the
Ray Serve app serves streams (bad clients refused or dropped, the others unaffected)
and its page (headless Chromium, a corpus WAV as the fake microphone)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from core.config import FeaturesConfig
from core.model_card import ModelCard
from serving import protocol as P

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "test-artifacts" / "serving"


def _speaker_waves(corpus: Path, split: str = "unlabeled", limit: int = 3):
    """(records, float32 waves) of one speaker's first `limit` utterances, time order
    (the speaker with the most utterances in `split`)."""
    import soundfile as sf

    from core.config import load_config
    from core.runs import StepContext
    from decoding.decode import split_records

    ctx = StepContext(load_config(None, [f"storage.root={corpus.parent / 'store'}"]), "r", "x")
    recs, _ = split_records(ctx.storage, str(corpus), split)
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.speaker_id] = counts.get(r.speaker_id, 0) + 1
    spk = max(sorted(counts), key=lambda k: counts[k])
    recs = sorted([r for r in recs if r.speaker_id == spk],
                  key=lambda r: (r.created_ts, r.utt_id))[:limit]
    return recs, [sf.read(str(corpus / r.audio_uri), dtype="float32")[0] for r in recs]


def _stream_rows(feats, waves, rng) -> list[np.ndarray]:
    out = []
    for w in waves:
        rows, i = [], 0
        while i < len(w):
            n = int(rng.integers(1, 4000))  # chunks of any size, down to one sample
            rows.append(feats.accept(w[i:i + n]))
            i += n
        rows.append(feats.end_utterance())
        feats.new_utterance()
        out.append(np.concatenate(rows))
    return out


# ----------------------------------------------------------------- features
@pytest.mark.parametrize("opts", [{}, {"backend": "kaldi"}, {"cmn_window": 120, "cmn_min_window": 50}])
def test_streaming_features_equal_the_offline_features_step(tiny_corpus, opts):
    """Same speaker stream, random chunk sizes: the rows before the global CMVN (what the
    features step stores before quantisation) agree to 1e-4 with tasks.features."""
    from serving.features import StreamFeatures
    from tasks.features import featurize_stream

    fcfg = FeaturesConfig(**opts)
    _, waves = _speaker_waves(tiny_corpus)
    offline = featurize_stream(waves, fcfg)
    streamed = _stream_rows(StreamFeatures(fcfg, None, 192), waves, np.random.default_rng(0))
    assert len(waves) == 3 and sum(len(x) for x in offline) > fcfg.cmn_window // 3
    for s, o in zip(streamed, offline):
        assert s.shape == o.shape
        assert float(np.abs(s - o).max()) <= 1e-4


def test_online_kaldi_fbank_against_the_numpy_one_is_documented(tiny_corpus):
    """Why the numpy backend streams its own FbankComputer: OnlineFbank matches it only
    to ~1e-3 (tests/test_fbank.py), not to the 1e-4 the streamed rows must hold."""
    from serving.features import KaldiOnlineFbank, NumpyOnlineFbank
    from tasks.fbank import FbankComputer

    _, waves = _speaker_waves(tiny_corpus, limit=1)
    fcfg = FeaturesConfig()
    ref = FbankComputer(fcfg).compute(waves)[0]
    for fb in (KaldiOnlineFbank(fcfg), NumpyOnlineFbank(fcfg)):
        got = np.concatenate([fb.accept(waves[0][:1234]), fb.accept(waves[0][1234:]), fb.finish()])
        assert got.shape == ref.shape and float(np.abs(got - ref).max()) <= 1e-3


def test_batched_fbank_across_streams_equals_each_stream_alone(tiny_corpus):
    """accept_many (one FbankComputer call for every stream's new frames, as the
    dispatcher does before each forward) gives each stream the rows its own accept()
    gives, chunk by chunk, with chunks too short for a frame among them: to float32
    rounding (the FFT and mel matmul over other row counts may take other kernels; log-mel
    values reach ~25, where one float32 step is 1.9e-6: at most two steps)."""
    from serving.features import StreamFeatures, accept_many
    from tasks.fbank import FbankComputer

    _, waves = _speaker_waves(tiny_corpus)
    fcfg = FeaturesConfig()
    alone = [StreamFeatures(fcfg, None, 192) for _ in waves]
    shared = FbankComputer(fcfg, chunk_frames=512)
    together = [StreamFeatures(fcfg, None, 192, computer=shared) for _ in waves]
    rng = np.random.default_rng(1)
    pos, rows_seen = [0] * len(waves), [0] * len(waves)
    while any(p < len(w) for p, w in zip(pos, waves)):
        chunks = []
        for i, w in enumerate(waves):
            n = int(rng.choice([0, 100, 1600, 3000]))
            chunks.append(w[pos[i]:pos[i] + n])
            pos[i] += n
        got = accept_many(together, chunks)
        for i, (f, c, g) in enumerate(zip(alone, chunks, got)):
            want = f.accept(c)
            assert g.shape == want.shape
            if len(want):
                assert float(np.abs(g - want).max()) <= 4e-6
            rows_seen[i] += len(want)
    cold_rows = fcfg.cmn_min_window // fcfg.subsample
    assert min(rows_seen) > 1.5 * cold_rows  # every stream went past the CMN cold start


# ----------------------------------------------------------------- a tiny model and graph
@pytest.fixture(scope="module")
def tiny_system(tiny_corpus, tmp_path_factory):
    """A small random student, a graph from the tiny corpus's lexicon and a generator LM,
    and the offline decode (decoding.decode's featurize, log_posteriors, Searcher) of the
    first test speaker's utterances."""
    import torch

    from core.config import StorageConfig
    from core.storage import Storage
    from decoding import graph as G
    from decoding import lexicon as L
    from decoding import lm
    from decoding.decode import featurize, log_posteriors
    from decoding.search import Searcher, acoustic_scores, log_priors
    from training.checkpoint import model_from_bytes, model_payload, to_bytes
    from training.models import StudentLSTM

    classes = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    arpa = lm.estimate(lm.generator_sentences(500, 5), 2, vocabulary=lex.prons).to_arpa()
    graph = G.build_graph(lex, arpa, classes)
    gdir = tmp_path_factory.mktemp("graph")
    graph.write(str(gdir))
    torch.manual_seed(0)
    model = StudentLSTM(192, 32, 2, len(classes), lookahead=3)
    with torch.no_grad():
        model.output.weight.mul_(8.0)  # peaky posteriors: the search finds varied words
    data = to_bytes(model_payload(model, cmvn=None, phones=classes,
                                  features=dataclasses.asdict(FeaturesConfig())))
    model, meta = model_from_bytes(data)
    recs, waves = _speaker_waves(tiny_corpus)
    assert len(recs) == 3
    st = Storage(StorageConfig(root=str(tiny_corpus.parent)))
    feats, _, _ = featurize(st, str(tiny_corpus), recs, ModelCard.from_meta(meta))
    prior = log_priors(np.ones(len(classes)))
    search = Searcher(read := G.read_graph(str(gdir)), beam=10.0, max_active=2000)
    words = [search.best_words(acoustic_scores(lp, prior, 1.0))[0]
             for lp in log_posteriors(model, [x for _, x in feats])]
    assert [r.utt_id for r, _ in feats] == [r.utt_id for r in recs]
    assert sum(len(w) for w in words) > 0, "the offline words are all empty: a vacuous test"
    assets = {"model": data, "graph": {n: (gdir / n).read_bytes() for n in
                                       ("HLG.fst", "words.txt", "graph.json")},
              "log_prior": prior, "acwt": 1.0, "beam": 10.0, "max_active": 2000}
    return {"assets": assets, "graph_dir": str(gdir), "recs": recs, "waves": waves,
            "words": [" ".join(w) for w in words], "graph": read}


def _recognizer(sysm):
    from serving.recognizer import Recognizer

    a = sysm["assets"]
    return Recognizer(a["model"], sysm["graph_dir"], a["log_prior"], a["acwt"], a["beam"],
                      a["max_active"])


def test_a_replica_keeps_no_graph_files_once_its_recognizer_is_built(tiny_system, tmp_path,
                                                                      monkeypatch):
    """make_recognizer writes the shipped graph to disk only to read it (each replica start
    used to leave an amflow-serve-graph-* directory in /tmp)."""
    import tempfile

    from core.config import ServeConfig
    from serving.app import make_recognizer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rec = make_recognizer(tiny_system["assets"], ServeConfig(device="cpu", dtype="fp32"))
    assert list(tmp_path.iterdir()) == []
    assert rec.graph.words == tiny_system["graph"].words
    assert rec.graph.fst.num_states == tiny_system["graph"].fst.num_states


class _Slow:
    """The model with a forward as slow as a loaded server's: audio arrives meanwhile."""

    def __init__(self, model):
        self.model = model

    def forward(self, rows, states):
        time.sleep(0.01)
        return self.model.forward(rows, states)


@pytest.mark.parametrize("batched_features,max_wait_s", [(True, 0.03), (False, 0.0)])
def test_streamed_words_equal_the_offline_decode_through_batch_dispatch(tiny_system,
                                                                        batched_features,
                                                                        max_wait_s):
    """Four concurrent streams of the same speaker's utterances, different chunk sizes
    (so batches mix streams with different row counts), through the asyncio dispatcher:
    each final equals the offline decode's words; partials come before finals. Features
    batched across the streams before each forward and partial rows waiting for company
    (as served), or each stream's features alone and eager dispatch."""
    from serving.recognizer import featurize
    from tests.stream_driver import drive_streams

    rec = _recognizer(tiny_system)

    results, batches = drive_streams(
        rec, tiny_system["waves"], [(1600, True), (700, True), (4000, True), (100000, False)],
        model=_Slow(rec.model), prepare=featurize if batched_features else None,
        max_wait_s=max_wait_s)
    for msgs in results:
        assert [m["final"] for m in msgs if "final" in m] == tiny_system["words"]
        assert any("partial" in m for m in msgs)
    assert max(batches) >= 2  # streams shared forwards


def test_an_utterance_ending_during_the_forward_of_the_previous_one_keeps_its_words(tiny_system):
    """A client faster than real time: utterance 2 arrives and ends while the forward
    holding utterance 1's last rows runs; utterance 1 must still end after those rows."""
    from serving.recognizer import Session

    rec = _recognizer(tiny_system)
    msgs: list[dict] = []
    s = Session(rec, msgs.append)
    w1, w2 = tiny_system["waves"][:2]
    s.feed(w1)
    s.end_utterance()
    rows = s.take(10 ** 6)  # all of utterance 1: in the forward now
    s.feed(w2)
    s.end_utterance()  # meanwhile
    outs, states = rec.model.forward([rows], [s.state])
    s.after_forward(outs[0], states[0], 1)
    while s.ready():
        outs, states = rec.model.forward([s.take(16)], [s.state])
        s.after_forward(outs[0], states[0], 1)
    s.run_search()
    assert [m["final"] for m in msgs if "final" in m] == tiny_system["words"][:2]


# ----------------------------------------------------------------- Batch Dispatch (pure)
class _FakeSession:
    def __init__(self, rows: int):
        self.rows, self.state, self.closed, self.seen = rows, np.zeros(1), False, []

    def ready(self):
        return self.rows > 0

    def has_input(self):
        return self.ready()

    def take(self, max_rows):
        n = min(self.rows, max_rows)
        self.rows -= n
        return np.zeros((n, 2), np.float32)

    def after_forward(self, out, state, batch):
        self.seen.append(batch)

    def forward_failed(self):
        self.seen.append("lost")

    def search_due(self):
        return False


class _SlowModel:
    """Records each forward's batch; while the first runs, more streams become ready."""

    def __init__(self, arriving: list):
        self.batches, self.arriving = [], arriving

    def forward(self, rows, states):
        self.batches.append([len(r) for r in rows])
        time.sleep(0.05)
        for s in self.arriving:
            s.rows += 3  # audio that arrived during this forward
        self.arriving = []
        if len(self.batches) == 3:
            raise RuntimeError("a bad batch")
        return [np.zeros((len(r), 1)) for r in rows], states


def test_batch_dispatch_is_eager_and_batches_what_piled_up():
    from serving.dispatch import BatchDispatcher

    first = _FakeSession(2)
    late = [_FakeSession(0) for _ in range(5)]
    model = _SlowModel(late)

    async def main():
        disp = BatchDispatcher(model, max_batch=4, max_rows=2)
        for s in [first, *late]:
            disp.add(s)
        task = asyncio.create_task(disp.run())
        disp.notify()
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len(model.batches) >= 4 and not any(s.ready() for s in [first, *late]):
                break
        task.cancel()
        return disp

    disp = asyncio.run(main())
    # forward 1: the one ready stream, at once (no waiting to fill a batch); then the
    # five that arrived meanwhile, at most max_batch and max_rows each, oldest first;
    # forward 3 raises and its streams' rows are lost, but the scheduler goes on.
    assert model.batches[0] == [2]
    assert model.batches[1] == [2, 2, 2, 2]
    assert len(model.batches) >= 4 and not any(s.ready() for s in [first, *late])
    assert disp.batch_sizes[1] >= 1 and disp.batch_sizes[4] == 1
    assert first.seen == [1] and late[0].seen == [4, "lost"]


class _Waiting(_FakeSession):
    """Rows ready since `since` (perf_counter); `ended`: an utterance end behind them."""

    def __init__(self, rows: int, since: float, ended: bool = False):
        super().__init__(rows)
        self.waiting_since, self.ended = since, ended

    def end_pending(self):
        return self.ended and self.rows > 0


class _Recorder:
    def __init__(self):
        self.calls = []

    def forward(self, rows, states):
        self.calls.append((time.perf_counter(), len(rows)))
        return [np.zeros((len(r), 1)) for r in rows], states


def test_with_max_wait_partial_rows_wait_for_other_streams_but_an_ended_utterance_does_not():
    """batch_due_in and next_batch with serve.max_wait_ms: partial rows wait for company
    up to max_wait; an utterance end goes at once, alone unless others are due too."""
    from serving.dispatch import BatchDispatcher

    now = time.perf_counter()
    disp = BatchDispatcher(None, max_batch=8, max_wait_s=0.2)
    assert disp.batch_due_in() is None  # nothing ready
    disp.add(_Waiting(3, now - 0.05))
    assert 0.1 < disp.batch_due_in() <= 0.15  # the oldest rows may wait 0.2 s in all
    disp.add(_Waiting(3, now))
    assert 0.1 < disp.batch_due_in() <= 0.15
    ended = _Waiting(3, now, ended=True)
    disp.add(ended)
    assert disp.batch_due_in() == 0.0  # a client waits for that final
    assert disp.next_batch() == [ended]  # alone: the others' rows are not due yet
    late = _Waiting(3, now - 0.3)
    disp.add(late)
    assert len(disp.next_batch()) == 4  # with a stream past its wait, all go
    eager = BatchDispatcher(None, max_wait_s=0.0)
    eager.add(_Waiting(3, now))
    assert eager.batch_due_in() == 0.0  # DeepSpeech2's eager dispatch
    full = BatchDispatcher(None, max_batch=2, max_wait_s=0.2)
    full.add(_Waiting(3, now))
    full.add(_Waiting(3, now))
    assert full.batch_due_in() == 0.0  # a full batch goes at once

    async def main(end_after: float | None):
        model = _Recorder()
        disp = BatchDispatcher(model, max_batch=8, max_wait_s=0.3)
        task = asyncio.create_task(disp.run())
        t0 = time.perf_counter()
        first, second = _Waiting(3, t0), _Waiting(0, t0)
        disp.add(first)
        disp.add(second)
        disp.notify()
        if end_after is not None:
            await asyncio.sleep(end_after)
            second.rows, second.ended = 2, True  # an utterance ends in another stream
            disp.notify()
        done = (lambda: first.seen and second.seen) if end_after else (lambda: first.seen)
        while time.perf_counter() - t0 < 2 and not done():
            await asyncio.sleep(0.005)  # until each stream's forward has come back
        task.cancel()
        return [(t - t0, b) for t, b in model.calls], first.seen, second.seen

    calls, first, _ = asyncio.run(main(None))
    assert len(calls) == 1 and 0.25 <= calls[0][0] < 1.0  # the rows waited max_wait for company
    calls, first, second = asyncio.run(main(0.05))
    # the end went at once and alone (a final's forward stays small), the waiting rows at
    # their deadline
    assert calls[0][0] < 0.25 and second == [1] and 0.25 <= calls[1][0] < 1.0 and first == [1]


class _Searchable:
    def __init__(self, name: str, final: bool, order: list):
        self.name, self.final, self.order, self.closed = name, final, order, False

    def final_due(self):
        return self.final

    def search_due(self):
        return False

    def run_search(self):
        self.order.append(self.name)


def test_a_due_final_is_searched_before_partials_queued_earlier():
    """The search threads take the queued stream whose final is due first (its client
    waits for it), then the others in the order they were queued."""
    from serving.dispatch import BatchDispatcher

    order: list = []
    disp = BatchDispatcher(model=None)
    for name, final in [("a", False), ("b", False), ("c", True), ("d", True)]:
        s = _Searchable(name, final, order)
        disp.queued[id(s)] = s
    for _ in range(4):
        disp._search_next()
    assert order == ["c", "d", "a", "b"] and not disp.queued and not disp.searching


# ----------------------------------------------------------------- protocol (pure)
def test_protocol_refuses_bad_headers_and_chunks():
    ok = {"type": "websocket.receive", "text": json.dumps({"sample_rate": 16000, "format": "s16le"})}
    assert P.parse_header(ok, 16000)["sample_rate"] == 16000
    bad = [{"bytes": b"\x00\x01"}, {"text": "hello"}, {"text": "[1]"},
           {"text": json.dumps({"sample_rate": 8000})},
           {"text": json.dumps({"sample_rate": 16000, "format": "f32le"})},
           {"text": json.dumps({"sample_rate": 16000, "channels": 2})},
           *({"text": json.dumps({"sample_rate": 16000, "channels": c})}
             for c in ("abc", "1", 1.5, None, [1], {"n": 1}, True))]
    for msg in bad:
        with pytest.raises(P.ProtocolError) as e:
            P.parse_header(msg, 16000)
        assert e.value.code == P.UNSUPPORTED
    with pytest.raises(P.ProtocolError) as e:
        P.pcm_samples(b"\x00" * 10, 8)
    assert e.value.code == P.TOO_BIG
    with pytest.raises(P.ProtocolError):
        P.pcm_samples(b"\x00" * 3, 8)
    assert P.pcm_samples(np.array([16384, -32768], "<i2").tobytes(), 8).tolist() == [0.5, -1.0]
    assert P.parse_control('{"eof": true}') == "eof"
    assert P.parse_control('{"end_utterance": true}') == "end_utterance"
    with pytest.raises(P.ProtocolError):
        P.parse_control('{"stop": 1}')


def test_a_header_with_channels_that_are_no_number_gets_json_and_1003_from_the_handler():
    """{"channels": "abc"} raised ValueError in the replica (the socket closed 1006 with no
    message); it is refused like every other bad header: a JSON error, then close 1003."""
    from types import SimpleNamespace

    from serving.app import StreamHandler

    class OneHeader:
        def __init__(self):
            self.sent, self.closed = [], None

        async def receive(self):
            return {"type": "websocket.receive", "text": '{"sample_rate": 16000, "channels": "abc"}'}

        async def send_json(self, msg):
            self.sent.append(msg)

        async def close(self, code, reason=""):
            self.closed = code

    async def idle():
        await asyncio.sleep(30)

    handler = SimpleNamespace(task=None, dispatcher=SimpleNamespace(run=idle),
                              rec=SimpleNamespace(fcfg=FeaturesConfig()),
                              scfg=SimpleNamespace(idle_timeout_s=5), token=None)
    ws = OneHeader()

    async def main():
        await StreamHandler.handle(handler, ws)
        handler.task.cancel()

    asyncio.run(main())
    assert ws.closed == P.UNSUPPORTED
    assert ws.sent[-1]["code"] == P.UNSUPPORTED and "'abc'" in ws.sent[-1]["error"]


def test_bench_serve_says_what_the_replica_and_the_clients_cost():
    """Per level: cores of the replica and of the clients over the level's wall time, and
    the replica's core-seconds per audio second per stream (stream i plays speaker i mod S)."""
    from types import SimpleNamespace

    from bench.serve import cpu_row

    spk = [[SimpleNamespace(duration=2.0), SimpleNamespace(duration=3.0)],
           [SimpleNamespace(duration=4.0)]]
    row = cpu_row(3, spk, wall=10.0, client_s=1.0, replica_s=2.8)
    assert row == {"audio_s": 14.0, "client_cores": 0.1, "replica_cores": 0.28,
                   "replica_core_s_per_audio_s": 0.2}
    assert cpu_row(1, spk, 10.0, 1.0, None)["replica_cores"] is None


def test_a_client_silent_for_the_idle_timeout_is_closed_with_going_away():
    """Each receive waits at most serve.idle_timeout_s, also after the stream started."""
    from types import SimpleNamespace

    from serving.app import StreamHandler

    class SilentAfterOne:
        def __init__(self):
            self.sent = [{"type": "websocket.receive", "bytes": b"\x00\x00" * 160}]

        async def receive(self):
            if self.sent:
                return self.sent.pop()
            await asyncio.sleep(30)

    fed = []
    handler = SimpleNamespace(scfg=SimpleNamespace(idle_timeout_s=0.05, max_chunk_bytes=1000),
                              dispatcher=SimpleNamespace(notify=lambda: None))
    session = SimpleNamespace(feed=fed.append)
    t0 = time.perf_counter()
    err = asyncio.run(StreamHandler._receive(handler, SilentAfterOne(), session, {}, None))
    assert err.code == P.GOING_AWAY and len(fed) == 1 and len(fed[0]) == 160
    assert time.perf_counter() - t0 < 5
