"""Serving the CTC student (training/ctc/streaming.py, serving/ctc_stream.py): the
streaming step equals the whole-utterance forward chunk by chunk, and a CTC model served
through the recognizer (Batch Dispatch, the Ray Serve app's WebSocket) gives the words
`amflow decode`'s CTC search gives (decoding.ctc_decode.CtcDecodeWorker)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from core.config import FeaturesConfig
from training.ctc.model import CtcModel
from training.ctc.streaming import CtcStreamingStep, NotStreamable

torch.set_num_threads(1)

TOL = 1e-5  # log-probabilities: float32 sums in another order (measured: <= 5e-7)


def _stream(step: CtcStreamingStep, utts: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """All utterances as one ragged batch of streams, utterance i in chunks of `chunk` +
    (i + call) % 2 rows (so a batch mixes row counts), each ended by `final` on its last
    rows; the outputs each stream got, concatenated."""
    st = step.zero_state(len(utts))
    outs: list[list[torch.Tensor]] = [[] for _ in utts]
    pos, call = [0] * len(utts), 0
    while any(p < len(u) for p, u in zip(pos, utts)) or call == 0:
        lens = [min(len(u) - p, chunk + (i + call) % 2) for i, (u, p) in enumerate(zip(utts, pos))]
        x = torch.zeros(len(utts), max(lens + [1]), utts[0].shape[1])
        for i, (u, p, n) in enumerate(zip(utts, pos, lens)):
            x[i, :n] = u[p:p + n]
        final = torch.tensor([p < len(u) and p + n == len(u) for u, p, n in zip(utts, pos, lens)])
        lp, n_out, *st = step(x, torch.tensor(lens), final, *st)
        for i in range(len(utts)):
            outs[i].append(lp[i, :n_out[i]])
            pos[i] += lens[i]
        call += 1
    return [torch.cat(o) for o in outs]


def _trained_bn(model: CtcModel, dim: int) -> CtcModel:
    """BatchNorm running statistics that are not the identity (one training pass)."""
    model.train()
    with torch.no_grad():
        model(torch.randn(3, 30, dim) * 2 + 0.5, torch.tensor([30, 22, 17]))
    return model.eval()


SHAPES = [  # (rnn, lookahead, channels, time strides, time kernels)
    ("gru", 3, (4, 4), (3, 1), (7, 3)),  # the default shape
    ("lstm", 2, (4, 4), (3, 1), (7, 3)),
    ("gru", 0, (4,), (3,), (3,)),  # no row convolution, one convolution
    ("gru", 1, (3, 4), (1, 3), (5, 3)),  # the subsampling in the second convolution
]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}-la{s[1]}-strides{s[3]}" for s in SHAPES])
def test_streaming_step_equals_the_whole_utterance_forward(shape):
    """Chunks of 1, 2, 3, 5 and 16 rows (+0/1 per call), streams of 1 to 40 rows in one
    ragged batch: every stream's outputs equal CtcModel.forward + log_softmax (eval)."""
    rnn, la, channels, strides, kernels = shape
    torch.manual_seed(0)
    model = _trained_bn(CtcModel(48, 9, stack=3, channels=channels, time_strides=strides,
                                 freq_strides=(2,) * len(strides), time_kernels=kernels,
                                 hidden=16, layers=2, lookahead=la,
                                 rnn=rnn), 48)
    step = CtcStreamingStep(model)
    utts = [torch.randn(n, 48) for n in (1, 2, 7, 25, 40)]
    with torch.no_grad():
        whole = [torch.log_softmax(model(u[None]), -1)[0] for u in utts]
        for chunk in (1, 2, 3, 5, 16):
            for got, want in zip(_stream(step, utts, chunk), whole):
                assert got.shape == want.shape
                assert float((got - want).abs().max()) <= TOL
        # the branch-free step (for tracing/export) gives the same outputs
        for got, want in zip(_stream(CtcStreamingStep(model, branch_free=True), utts, 2), whole):
            assert got.shape == want.shape and float((got - want).abs().max()) <= TOL
    # the look-ahead: the first convolutions' 2 frames and the row convolution's `la`
    assert step.lookahead_rows == 2 + la if strides == (3, 1) else step.lookahead_rows >= la


def test_an_utterance_flushed_by_a_final_call_without_rows_and_a_later_stream_state():
    """All rows sent without `final`, then a call with no rows and `final`: the same
    outputs; the rows emitted before the flush are those the look-ahead allows."""
    torch.manual_seed(1)
    model = _trained_bn(CtcModel(48, 9, stack=3, channels=(4, 4), hidden=16, layers=2,
                                 lookahead=3), 48)
    step = CtcStreamingStep(model)
    u = torch.randn(20, 48)
    with torch.no_grad():
        want = torch.log_softmax(model(u[None]), -1)[0]
        st = step.zero_state(1)
        lp, n, *st = step(u[None], torch.tensor([20]), torch.tensor([False]), *st)
        assert int(n[0]) == 20 - step.lookahead_rows  # frame t waits for row t + 5
        lp2, n2, *st = step(torch.zeros(1, 1, 48), torch.tensor([0]), torch.tensor([True]), *st)
        got = torch.cat([lp[0, :n[0]], lp2[0, :n2[0]]])
    assert got.shape == want.shape and float((got - want).abs().max()) <= TOL


def test_the_branch_free_step_exports_to_onnx_and_runs_the_same_in_onnxruntime():
    """What an export (another module's job) starts from: torch.onnx (TorchScript
    exporter) traces the branch-free step once, and onnxruntime runs that graph on other
    batch sizes, row counts, ragged lengths and final flags as the eager step does."""
    import io
    import warnings

    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = _trained_bn(CtcModel(48, 9, stack=3, channels=(4, 4), hidden=16, layers=2,
                                 lookahead=2), 48)
    step, ref = CtcStreamingStep(model, branch_free=True), CtcStreamingStep(model)
    names = ["x", "lengths", "final", *step.state_names]
    axes = {n: {1 if n.startswith("rnn_") else 0: "B"} for n in names}
    axes["x"] = {0: "B", 1: "T"}
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(step, (torch.randn(2, 4, 48), torch.tensor([4, 3]),
                                 torch.tensor([False, False]), *step.zero_state(2)),
                          buf, dynamo=False, opset_version=17, input_names=names,
                          dynamic_axes=axes)
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    got_state, want_state = [t.numpy() for t in ref.zero_state(3)], ref.zero_state(3)
    with torch.no_grad():
        for t, lens, final in [(5, [5, 2, 0], [False] * 3), (3, [3, 3, 1], [False, True, False]),
                               (7, [7, 0, 2], [True, False, True])]:
            x = torch.randn(3, t, 48)
            got, n_got, *got_state = sess.run(None, dict(zip(names, [
                x.numpy(), np.array(lens), np.array(final), *got_state])))
            want, n_want, *want_state = ref(x, torch.tensor(lens), torch.tensor(final),
                                            *want_state)
            assert n_got.tolist() == n_want.tolist()
            for i, k in enumerate(n_want.tolist()):
                assert np.abs(got[i, :k] - want[i, :k].numpy()).max(initial=0.0) <= TOL


def test_a_bidirectional_model_is_refused():
    with pytest.raises(NotStreamable, match="bidirectional"):
        CtcStreamingStep(CtcModel(48, 9, stack=3, bidirectional=True).eval())
    with pytest.raises(NotStreamable, match="time_strides"):
        CtcStreamingStep(CtcModel(48, 9, stack=3, time_strides=(2, 1)).eval())


# ----------------------------------------------------------------- served
@pytest.fixture(scope="module")
def ctc_system(tiny_corpus, tmp_path_factory):
    """A small random CTC model (peaky outputs: the search finds words), its T o L o G
    from the tiny corpus's transcripts, and the offline CTC decode (CtcDecodeWorker, what
    `amflow decode` runs) of one speaker's utterances."""
    from core.config import StorageConfig, features_dict
    from decoding.ctc_decode import CtcDecodeWorker
    from decoding.ctc_graph import build_tlg
    from decoding.lexicon import words_of
    from decoding.lm import estimate
    from tasks.select import read_records
    from tests.test_serving import _speaker_waves
    from training.checkpoint import model_payload, to_bytes
    from training.ctc.tokens import train_tokenizer

    from core.storage import Storage

    st = Storage(StorageConfig(root=str(tiny_corpus.parent)))
    recs, _, _ = read_records(st, str(tiny_corpus))
    tok = train_tokenizer([r.text for r in recs], "char")
    arpa = estimate([words_of(r.text) for r in recs], order=2).to_arpa()
    graph = build_tlg(tok, arpa)
    gdir = tmp_path_factory.mktemp("tlg")
    graph.write(str(gdir))
    fcfg = FeaturesConfig()
    dim = fcfg.num_mel_bins * fcfg.stack
    torch.manual_seed(0)
    model = _trained_bn(CtcModel(dim, tok.num_classes, fcfg.stack, channels=(4, 4), hidden=32,
                                 layers=2, lookahead=2), dim)
    with torch.no_grad():
        model.output.weight.mul_(6.0)
    data = to_bytes(model_payload(
        model, cmvn={"count": 1, "sum": [0.0] * dim, "sumsq": [1.0] * dim},
        phones=tok.symbols, features=features_dict(fcfg), info={"tokenizer": tok.to_dict()}))
    spk_recs, waves = _speaker_waves(tiny_corpus)
    setting = {"acwt": 1.0, "lm_weight": 1.0, "blank_penalty": 1.0}
    worker = CtcDecodeWorker(data, str(gdir), str(tiny_corpus), st.cfg, 13.0, 2000)
    hyps = worker.search(worker.score(spk_recs)["utts"], setting)["hyps"]
    words = [" ".join(w) for _, w, _ in hyps]
    assert [r.utt_id for r, _, _ in hyps] == [r.utt_id for r in spk_recs]
    assert sum(len(w) for w in words) > 0, "the offline words are all empty: a vacuous test"
    assets = {"model": data, "kind": "ctc", "log_prior": None, "acwt": 1.0,
              "blank_penalty": 1.0, "beam": 13.0, "max_active": 2000,
              "graph": {n: (gdir / n).read_bytes() for n in ("HLG.fst", "words.txt", "graph.json")}}
    return {"assets": assets, "graph_dir": str(gdir), "waves": waves, "words": words}


def _with_streaming_graph(assets: dict) -> dict:
    """The assets with the model's exported streaming graph (amflow export's
    model.streaming.onnx), as `amflow serve` ships it for serve.backend=onnxruntime."""
    from serving.ctc_onnx import streaming_graph
    from training.checkpoint import card_from_bytes

    model, card = card_from_bytes(assets["model"])
    return {**assets, "onnx": streaming_graph(model, card)}


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_ctc_model_streams_the_offline_decode_words_through_batch_dispatch(ctc_system,
                                                                            backend):
    """Three concurrent streams of the speaker's utterances in different chunk sizes
    through the dispatcher (features batched, rows of several streams in one forward):
    every final equals the offline CTC decode's words; partials come first. With
    serve.backend=onnxruntime the exported streaming graph runs the model: the same
    finals."""
    from core.config import ServeConfig
    from serving.app import make_recognizer
    from serving.recognizer import featurize, transcribe
    from tests.stream_driver import drive_streams

    assets = ctc_system["assets"]
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        assets = _with_streaming_graph(assets)
    rec = make_recognizer(assets, ServeConfig(device="cpu", dtype="fp32", speech_gate=False,
                                              backend=backend))
    assert rec.kind == "ctc" and rec.model.lookahead == 0
    assert str(rec.model.dtype).startswith("onnxruntime") == (backend == "onnxruntime")
    assert [m["final"] for m in transcribe(rec, ctc_system["waves"])] == ctc_system["words"]

    # a real-time client's pause after each chunk lets forwards run between its chunks, so
    # partials come before the final (as the test's own client did before the shared driver)
    results, batches = drive_streams(rec, ctc_system["waves"],
                                     [(1600, True), (700, True), (4000, True)],
                                     prepare=featurize, pause_s=0.001)
    for msgs in results:
        assert [m["final"] for m in msgs if "final" in m] == ctc_system["words"]
        assert any("partial" in m for m in msgs)
    assert max(batches) >= 2  # streams shared forwards


def test_a_streaming_graph_of_another_model_is_refused(ctc_system):
    """serve.onnx_model pointing at another CTC model's graph (other classes) or at the
    whole-utterance graph: refused at start, naming what differs."""
    from core.config import ServeConfig
    from serving.app import make_recognizer
    from serving.ctc_onnx import streaming_graph, utterance_graph
    from training.checkpoint import card_from_bytes

    pytest.importorskip("onnxruntime")
    model, card = card_from_bytes(ctc_system["assets"]["model"])
    other = CtcModel(model.input_dim, model.num_classes + 1, model.stack, channels=(4, 4),
                     hidden=32, layers=2, lookahead=2).eval()
    scfg = ServeConfig(device="cpu", dtype="fp32", speech_gate=False, backend="onnxruntime")
    with pytest.raises(ValueError, match="is not the model's"):
        make_recognizer({**ctc_system["assets"], "onnx": streaming_graph(other, card)}, scfg)
    with pytest.raises(ValueError, match="not the CTC student's streaming graph"):
        make_recognizer({**ctc_system["assets"], "onnx": utterance_graph(model, card)}, scfg)
    # and the hybrid wrapper refuses the CTC graph (a hybrid model served with it)
    from serving.onnx_runtime import OrtStreamModel

    with pytest.raises(ValueError, match="not the hybrid student's streaming graph"):
        OrtStreamModel(streaming_graph(model, card))


@pytest.mark.integration
def test_a_ctc_model_served_over_the_websocket_gives_the_decode_words(ray_local, ctc_system,
                                                                      tmp_path_factory):
    """The Ray Serve app (the WebSocket protocol, Batch Dispatch) with the CTC model: the
    finals are the offline decode's words, the replica's /stats names the model kind."""
    import urllib.request

    from ray import serve

    from core.config import load_config
    from serving.app import start
    from tests.conftest import _free_port
    from tests.test_serving_app import _client, _pcm

    port = _free_port()
    cfg = load_config(None, [f"storage.root={tmp_path_factory.mktemp('store')}",
                             f"serve.port={port}", "serve.ingress=proxy",
                             "serve.speech_gate=false", "serve.app_name=amflow-serve-ctc-test"])
    url = start(cfg, ctc_system["assets"])
    try:
        chunks: list = []
        for w in ctc_system["waves"]:
            pcm = _pcm(w)
            chunks += [pcm[i:i + 3200] for i in range(0, len(pcm), 3200)] + ["END"]
        chunks.pop()  # the last utterance ends with eof
        got = asyncio.run(asyncio.wait_for(
            _client(url, {"sample_rate": 16000, "format": "s16le"}, chunks), 120))
        stats = json.loads(urllib.request.urlopen(url + "stats", timeout=10).read())
    finally:
        serve.shutdown()
    assert [m["final"] for m in got["msgs"] if "final" in m] == ctc_system["words"]
    assert got["msgs"][-1].get("eof") and stats["model_kind"] == "ctc"


def test_serve_finds_the_ctc_decode_record_of_the_model_without_its_tag(tmp_path, local_cfg):
    """The LM weight and blank penalty come from the decode that tuned this model (a
    decode dir of another tag), not from a hybrid's or a greedy decode's record."""
    from amflow.steps.serve import tuned_scales
    from core.runs import StepContext

    ctx = StepContext(local_cfg(), "r", "serve")
    model = str(tmp_path / "store" / "runs" / "r" / "train-ctc" / "model.pt")
    st = ctx.storage
    st.write_json(ctx.other("decode", "result.json"), {"acwt": 0.1, "model": "x"})
    st.write_json(ctx.other("decode-ctcg", "result.json"),
                  {"acwt": 1.0, "lm_weight": 1.0, "blank_penalty": 2.0, "model": model,
                   "model_kind": "ctc", "search": "greedy"})
    assert tuned_scales(ctx, model, "ctc")["from"].startswith("decode.ctc_lm_weights")
    st.write_json(ctx.other("decode-ctc", "result.json"),
                  {"acwt": 0.625, "lm_weight": 1.6, "blank_penalty": 3.0, "model": model,
                   "model_kind": "ctc", "search": "tlg"})
    got = tuned_scales(ctx, model, "ctc")
    assert (got["acwt"], got["blank_penalty"]) == (0.625, 3.0)
    assert got["from"].endswith("decode-ctc/result.json")
    assert tuned_scales(ctx, model, "student")["acwt"] == 0.1  # the hybrid's own record
