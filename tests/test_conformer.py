"""The streaming Conformer family (training/families/conformer*.py): config and spec, chunked
attention that is causal beyond its chunk, a streaming state whose chunk-by-chunk output is
the whole-utterance pass's (to 1e-5), U2's dynamic chunks in training, its cost, and a
training through `amflow train` (the SSL regime: the teacher's soft targets) served by the
recognizer with the offline decode's words."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.config import ConfigError, ModelConfig, load_config
from training.families import family_of, get_family
from training.families.conformer import ConformerStream, attention_flops_per_frame
from training.families.conformer_model import ConformerModel, chunk_mask

torch.set_num_threads(1)
SMALL = dict(dim=32, heads=2, layers=2, ff_mult=2, conv_kernel=5, frontend_kernel=3,
             dropout=0.0)


def _model(seed: int = 0, **kw) -> ConformerModel:
    torch.manual_seed(seed)
    return ConformerModel(24, 11, **{**SMALL, **kw}).eval()


def _whole(model: ConformerModel, feats: list[np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        return [torch.log_softmax(model(torch.from_numpy(f)[None]), -1)[0].numpy()
                for f in feats]


def test_the_family_builds_from_config_and_rebuilds_from_its_spec():
    from training.models import build_model, model_from_spec, model_spec

    mc = ModelConfig()
    mc = dataclasses.replace(mc, conformer=dataclasses.replace(mc.conformer, **SMALL, chunk=4))
    model = build_model("conformer", 24, 11, mc)
    fam = family_of(model)
    assert fam is get_family("conformer") and fam.decoder == "hybrid" and fam.streams
    assert fam.subsampling(model) == 1 and fam.lookahead(model) == 3  # chunk - 1
    spec = json.loads(json.dumps(model_spec(model)))
    assert spec["kind"] == "conformer" and spec["chunk"] == 4 and spec["dim"] == 32
    again = model_from_spec(spec)
    again.load_state_dict(model.state_dict())
    x = torch.randn(2, 13, 24)
    assert torch.equal(model.eval()(x), again.eval()(x))
    assert load_config(None, ["train.model=conformer"]).train.model == "conformer"
    # train.grow's phone stage hands its model on with a new output layer
    from training.grow import grow_output

    grown = grow_output(model, [0, 0, 3, 10, 5], [0.0, -0.7, 0.0, 0.0, 0.0])
    again = model_from_spec(json.loads(json.dumps(model_spec(grown))))
    again.load_state_dict(grown.state_dict())
    assert again.num_classes == 5 and torch.equal(grown.eval()(x), again.eval()(x))


@pytest.mark.parametrize("override, key", [
    (["model.conformer.dim=30", "model.conformer.heads=4"], "model.conformer.dim"),
    (["model.conformer.chunk=0"], "model.conformer.chunk"),
    (["model.conformer.left_chunks=-2"], "model.conformer.left_chunks"),
    (["model.conformer.full_context_share=1.5"], "model.conformer.full_context_share")])
def test_bad_sizes_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, override)


def test_the_chunk_mask_sees_its_chunk_and_the_left_chunks_only():
    m = chunk_mask(8, 2, 1)[0, 0]
    # frame 5 (chunk 2) sees chunks 1 and 2: frames 2..5
    assert m[5].nonzero().flatten().tolist() == [2, 3, 4, 5]
    assert chunk_mask(8, 2, -1)[0, 0, 5].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
    padded = chunk_mask(6, 3, -1, torch.tensor([6, 2]))[1, 0]
    assert padded[1].nonzero().flatten().tolist() == [0, 1]
    assert padded[4].nonzero().flatten().tolist() == [0, 1, 4]  # padding sees itself


def test_an_output_never_depends_on_rows_past_its_chunk():
    model = _model(chunk=4, left_chunks=1)
    x = torch.randn(1, 16, 24)
    later = x.clone()
    later[0, 8:] += 5.0  # chunks 2 and 3 change
    with torch.no_grad():
        a, b = model(x), model(later)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)
    assert not torch.allclose(a[0, 8:12], b[0, 8:12], atol=1e-3)
    inside = x.clone()
    inside[0, 7] += 5.0  # the last row of chunk 1 reaches its first row (look-ahead)
    with torch.no_grad():
        assert not torch.allclose(model(inside)[0, 4], a[0, 4], atol=1e-4)


def test_a_padded_batch_gives_each_utterance_its_own_outputs():
    model = _model(chunk=3, left_chunks=2)
    xs = [torch.randn(n, 24) for n in (17, 9, 4)]
    batch = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
    with torch.no_grad():
        y = model(batch, torch.tensor([17, 9, 4]))
        for i, x in enumerate(xs):
            assert torch.allclose(y[i, :len(x)], model(x[None])[0], atol=1e-5)


@pytest.mark.parametrize("chunk, left", [(4, 2), (3, -1), (5, 0), (1, 3)])
def test_streamed_outputs_equal_the_whole_utterance_pass(chunk, left):
    """Streams fed a few rows at a time (never whole chunks), a batch of them together,
    give the eval pass's log-posteriors (the same chunking) to 1e-5."""
    from serving.export_checks import compare, streamed_log_posteriors

    model = _model(chunk=chunk, left_chunks=left)
    rng = np.random.default_rng(chunk)
    feats = [rng.standard_normal((n, 24)).astype(np.float32) for n in (1, 7, 23, 40, 61)]
    stream = ConformerStream(model)
    for rows in (2, 3, 7):
        streamed = streamed_log_posteriors(stream, feats, chunk_rows=rows, streams=3)
        assert compare(streamed, _whole(model, feats)) <= 1e-5
    # the caches are bounded by the left context (or hold everything with -1)
    state = stream.zero_state()
    _, [state] = stream.forward([feats[-1][:40]], [state])
    held = 40 // chunk * chunk
    assert state[0].shape[1] == 40 - held  # rows short of a chunk wait
    cached = held if left < 0 else min(held, left * chunk)
    assert all(state[4 + 3 * i].shape[2] == cached for i in range(2))


def test_training_draws_a_chunking_per_minibatch():
    model = _model(chunk=4, left_chunks=2, max_train_chunk=6, full_context_share=0.3).train()
    draws = [model.chunking() for _ in range(300)]
    full = sum(d == (0, -1) for d in draws)
    assert 50 < full < 140  # about 30 % full context
    chunked = [d for d in draws if d != (0, -1)]
    assert {c for c, _ in chunked} == set(range(1, 7)) and {lc for _, lc in chunked} == {0, 1, 2}
    assert model.eval().chunking() == (4, 2)  # eval: the streaming chunking
    fixed = _model(chunk=4, left_chunks=2, dynamic_chunks=False).train()
    assert {fixed.chunking() for _ in range(20)} == {(4, 2)}
    # a full-context draw is the whole-utterance encoder
    x = torch.randn(1, 20, 24)
    with torch.no_grad():
        full_ctx = model.encode_chunked(x, None, 0, -1)
        assert torch.allclose(full_ctx, model.encode_chunked(x, None, 20, 0), atol=1e-6)


def test_the_family_counts_parameters_and_flops_per_frame():
    model = _model(chunk=4, left_chunks=2)
    fam = family_of(model)
    n = fam.num_parameters(model)
    assert n == sum(p.numel() for p in model.parameters()) > 0
    weights = sum(p.numel() for k, p in model.named_parameters() if not k.endswith("bias"))
    attention = 2 * 2 * 2 * 32 * (2 * 4 + 2.5)  # layers x (scores + mix) x 2 x dim x keys
    assert attention_flops_per_frame(model) == attention
    assert fam.flops_per_frame(model) == 2 * weights + attention
    wider = _model(chunk=4, left_chunks=4)  # more left context: more attention, same weights
    assert fam.flops_per_frame(wider) - fam.flops_per_frame(model) == 2 * 2 * 2 * 32 * 8


def test_the_utterance_graph_equals_torch_on_padded_batches_of_any_length():
    from serving.onnx_runtime import session, utterance_log_posteriors

    model = _model(chunk=4, left_chunks=1)
    graph = get_family("conformer").export_graphs(model, None)
    assert sorted(graph) == ["model.onnx"] and not model.training
    rng = np.random.default_rng(3)
    feats = [rng.standard_normal((n, 24)).astype(np.float32) for n in (1, 6, 29, 50, 50)]
    onnx_lp = utterance_log_posteriors(session(graph["model.onnx"]), feats)
    from serving.export_checks import compare

    assert compare(onnx_lp, _whole(model, feats)) <= 1e-4
    # the CTC head's whole-utterance graph in the hybrid's convention (x, lengths)
    from training.families.conformer_model import ConformerCtcModel
    from training.families.conformer_onnx import utterance_graph

    torch.manual_seed(1)
    ctc = ConformerCtcModel(24, 9, **SMALL, chunk=3, left_chunks=-1).eval()
    onnx_lp = utterance_log_posteriors(session(utterance_graph(ctc)), feats)
    assert compare(onnx_lp, _whole(ctc, feats)) <= 1e-4


def test_the_ctc_head_exports_as_the_ctc_students_do():
    """conformer_ctc's model.onnx in the CTC convention (x, x_lens -> log_probs,
    log_probs_len) and its sherpa-onnx graph (fbank frames in; the per-utterance mean
    normalisation, stacking and CMVN inside) equal torch, in a padded batch and alone.
    (`amflow export` runs the sherpa-onnx recognizer on them: the demo's results page.)"""
    import onnxruntime as ort

    from core.config import FeaturesConfig
    from decoding.ctc_decode import ctc_log_probs
    from serving.ctc_onnx import SherpaCtc, sherpa_graph
    from training.families.conformer_model import ConformerCtcModel

    torch.manual_seed(2)
    model = ConformerCtcModel(3 * 16, 9, **SMALL, chunk=4, left_chunks=2).eval()
    rng = np.random.default_rng(4)
    feats = dataclasses.asdict(FeaturesConfig())
    feats.update(num_mel_bins=16, stack=3, subsample=3)
    card = SimpleNamespace(features=feats, cmvn={"count": 10, "sum": list(rng.normal(
        size=48) * 10), "sumsq": list(rng.uniform(100, 300, 48) * 10)})
    graphs = get_family("conformer_ctc").export_graphs(model, card)
    assert sorted(graphs) == ["model.onnx"]
    sess = ort.InferenceSession(graphs["model.onnx"], providers=["CPUExecutionProvider"])
    rows = [rng.standard_normal((n, 48)).astype(np.float32) for n in (50, 37, 5, 12)]
    x = np.zeros((4, 50, 48), np.float32)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
    lp, n = sess.run(None, {"x": x, "x_lens": np.array([len(r) for r in rows])})
    assert n.tolist() == [50, 37, 5, 12]
    for i, ref in enumerate(ctc_log_probs(model, rows)):
        assert np.abs(lp[i, :n[i]] - ref).max() < 1e-4
        alone = sess.run(None, {"x": rows[i][None], "x_lens": np.array([len(rows[i])])})[0]
        assert np.abs(alone[0] - ref).max() < 1e-4
    sherpa = ort.InferenceSession(sherpa_graph(model, card, 1.5), providers=[
        "CPUExecutionProvider"])
    lens = np.array([700, 90, 2])
    fb = np.full((3, 700, 16), -23.02585, np.float32)  # sherpa-onnx pads with log(1e-10)
    for i, k in enumerate(lens):
        fb[i, :k] = rng.normal(size=(k, 16)) * 3 + 12
    got, n_out = sherpa.run(None, {"x": fb, "x_lens": lens})
    with torch.no_grad():
        ref, n_ref = SherpaCtc(model, card, 1.5)(torch.from_numpy(fb), torch.from_numpy(lens))
    assert n_out.tolist() == n_ref.tolist() == [233, 30, 0]
    for i, k in enumerate(n_out[:2]):
        assert np.abs(got[i, :k] - ref[i, :k].numpy()).max() < 1e-4
@pytest.fixture(scope="module")
def conformer_run(tiny_corpus, tmp_path_factory):
    """`amflow train` of a small Conformer student in the SSL regime (the teacher's top-k
    soft targets on the unlabeled split, labels on the labeled one) on synthetic rows with
    the tiny corpus's classes, and a word bigram LM: what serve reads."""
    from amflow.services.synthetic_run import make_synthetic_run
    from amflow.steps import train as train_step
    from core.runs import StepContext
    from core.storage import Storage, join
    from decoding import lexicon as L
    from decoding import lm

    root = tmp_path_factory.mktemp("conformer_store")
    phones = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    run = join(str(root), "runs", "r")
    make_synthetic_run(Storage(), run, num_classes=len(phones), base_dim=64, noise=1.5,
                       splits={"labeled": {"utts": 30, "parts": 2}, "dev": {"utts": 8},
                               "unlabeled": {"utts": 30, "parts": 2, "soft_k": 3}})
    Storage().write_json(join(run, "features", "phones.json"), phones)
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    Storage().write_text(join(run, "lm", "lm.arpa"), lm.estimate(
        lm.generator_sentences(300, 5), 2, vocabulary=lex.prons).to_arpa())
    sizes = [f"model.conformer.{k}={v}" for k, v in SMALL.items()]
    cfg = load_config(None, [
        f"storage.root={root}", f"data.corpus={tiny_corpus}", "train.model=conformer",
        "train.regime=ssl", "train.sub_epochs=2", "train.finetune_epochs=1", "train.threads=1",
        "train.minibatch_frames=512", "train.chunk_frames=16", "train.chunk_left_context=8",
        "train.optimizer=adam", "train.lr=0.003", "train.final_lr=0.001", "train.grow=false",
        "train.augment.enabled=false", "decode.acwt=[1.0]", "export.check_utterances=4",
        "model.conformer.chunk=4",
        "model.conformer.left_chunks=2", *sizes])
    summary = train_step.run(StepContext(cfg, "r", "train"), None)
    return cfg, root / "runs" / "r", summary


def test_the_conformer_trains_through_amflow_train_and_serves_the_offline_words(
        conformer_run, tiny_corpus):
    from amflow.steps import export
    from amflow.steps.serve import load_assets
    from core.model_card import ModelCard
    from core.runs import StepContext
    from core.storage import Storage
    from decoding.decode import featurize, log_posteriors
    from decoding.search import Searcher, acoustic_scores
    from serving.app import make_recognizer
    from serving.recognizer import transcribe
    from tests.test_serving import _speaker_waves
    from core.storage import digest_of
    from training.checkpoint import load_model, with_chunking

    cfg, run, summary = conformer_run
    model, meta = load_model(Storage(), str(run / "train" / "model.pt"))
    assert isinstance(model, ConformerModel) and meta["spec"]["kind"] == "conformer"
    m = summary["metrics"]
    assert m["steps"] > 0 and m["dev_frame_acc"] > 0.3  # learnt (chance: 1 / classes)

    done = export.run(StepContext(cfg, "r", "export"),
                      SimpleNamespace(model="train", format="onnx", quantize=None, data=None))
    checks = json.loads((run / "export" / "checks.json").read_text())
    g = checks["graphs"]["model.onnx"]
    assert done["metrics"]["passed"] and g["checked"] and g["max_abs_diff"] <= 1e-4
    # at another decode.chunking: its own folder, its graph stamped with the rechunked
    # bytes' digest (the one serve checks), the model's own export left as it was
    rechunked = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, chunking="2x1"))
    export.run(StepContext(rechunked, "r", "export"),
               SimpleNamespace(model="train", format="onnx", quantize=None, data=None))
    other = json.loads((run / "export-2x1" / "checks.json").read_text())
    model_bytes = (run / "train" / "model.pt").read_bytes()
    assert other["model_digest"] == digest_of(with_chunking(model_bytes, (2, 1)))
    assert json.loads((run / "export" / "checks.json").read_text()) == checks

    serve = dataclasses.replace(cfg.serve, device="cpu", dtype="fp32", backend="torch",
                                speech_gate=False)
    assets = load_assets(StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve"),
                         str(run / "train" / "model.pt"))
    assert assets["kind"] == "conformer"
    recs, waves = _speaker_waves(tiny_corpus, split="test", limit=3)
    rec = make_recognizer(assets, serve)
    assert isinstance(rec.model, ConformerStream)
    served = [msg["final"] for msg in transcribe(rec, waves)]
    feats, _, _ = featurize(Storage(), str(tiny_corpus), recs, ModelCard.from_meta(meta))
    search = Searcher(rec.graph, assets["beam"], assets["max_active"])
    offline = [" ".join(search.best_words(acoustic_scores(lp, assets["log_prior"],
                                                          assets["acwt"]))[0])
               for lp in log_posteriors(model.eval(), [x for _, x in feats])]
    assert served == offline and any(served)


def test_the_ctc_head_learns_characters_through_amflow_train(tmp_path, local_cfg):
    """train.model=conformer_ctc: the same encoder with a CTC output over the transcripts'
    characters, trained by the CTC student's loop (whole utterances, the labeled
    transcripts and the kept pseudo-labels of train.pseudolabels); its loss
    falls, its card names the tokenizer, and it streams its whole-utterance outputs."""
    from amflow.steps import train as train_step
    from core.runs import StepContext
    from core.storage import Storage
    from serving.export_checks import compare, streamed_log_posteriors
    from tests.test_ctc import _ctc_run, _losses, _spelled
    from training.checkpoint import load_model_card
    from training.ctc.tokens import Tokenizer
    from training.families.conformer_model import ConformerCtcModel

    import pyarrow as pa

    root = tmp_path / "store"
    corpus = _ctc_run(str(root), unlabeled=12)
    # the pseudolabel step's labels of the unlabeled split: 8 kept, 4 dropped
    spelled = [x for u in sorted((root / "runs" / "r" / "repartition" / "unlabeled").glob(
        "part-*")) for x in _spelled(str(u))]
    kept = [i % 3 != 0 for i in range(len(spelled))]
    step = root / "runs" / "teach" / "pseudolabel"
    Storage().write_parquet(str(step / "labels" / "part-00000.parquet"), pa.table({
        "utt_id": [u for u, _ in spelled], "text": [t for _, t in spelled],
        "confidence": [0.9] * 12, "am_score": [-1.0] * 12, "lm_score": [-2.0] * 12,
        "kept": kept, "reason": ["" if k else "low_confidence" for k in kept]}))
    (step / "_SUCCESS.json").write_text("{}")
    sizes = [f"model.conformer.{k}={v}" for k, v in SMALL.items()]
    cfg = local_cfg(f"data.corpus={corpus}", "train.model=conformer_ctc", "train.threads=1",
                    "train.pseudolabels=teach",
                    "train.minibatch_frames=600", "train.lr=0.003", "train.final_lr=0.001",
                    "train.log_every=2", "train.epochs=3", "train.finetune_epochs=3",
                    "train.freq_masks=0", "train.time_masks=0", "model.conformer.chunk=4",
                    *sizes)
    fam = get_family("conformer_ctc")
    assert fam.decoder == "ctc" and fam.whole_utterances and not fam.grows
    assert fam.config(cfg.model) is cfg.model.conformer  # the encoder's section
    res = train_step.run(StepContext(cfg, "r", "train"), None)
    assert res["metrics"]["transcripts"] == {"labeled": 32, "dev": 8, "pseudo": 8}
    losses = _losses(root / "runs" / "r" / "train" / "metrics.jsonl")
    assert losses[-1] < 0.8 * losses[0]
    model, card = load_model_card(Storage(), res["metrics"]["model_uri"])
    assert isinstance(model, ConformerCtcModel) and card.kind == "conformer_ctc"
    tok = Tokenizer.from_dict(card.tokenizer)
    assert model.num_classes == len(tok.symbols) and card.priors is None
    rng = np.random.default_rng(5)
    feats = [rng.standard_normal((n, model.input_dim)).astype(np.float32) for n in (5, 33)]
    model.eval()
    assert compare(streamed_log_posteriors(fam.stream_model(model, torch.float32, "cpu"),
                                           feats, chunk_rows=3), _whole(model, feats)) <= 1e-5


def test_a_config_names_the_built_in_families_before_they_are_imported():
    """The CLI loads the config before anything imports training/families: the schema's
    lists of built-in names (core/config/train.py) must be the registry's."""
    import subprocess
    import sys

    from training.families import family_names

    code = ("import sys; from core.config import load_config; "
            "from core.config.train import MODEL_FAMILIES, TOKEN_FAMILIES; "
            "load_config(None, ['train.model=conformer_ctc', 'train.pseudolabels=R']); "
            "assert 'training.families' not in sys.modules; "
            "print(sorted(MODEL_FAMILIES), sorted(TOKEN_FAMILIES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    names, tokens = (json.loads(s.replace("'", '"')) for s in
                     out.stdout.strip().replace("] [", "]\n[").splitlines())
    built_in = [n for n in family_names()  # (not a test's own family: the toy's)
                if type(get_family(n)).__module__.startswith("training.families.")]
    assert names == built_in
    assert tokens == sorted(n for n in names if get_family(n).token_targets)


def test_the_ctc_head_streams_the_offline_decode_words_through_batch_dispatch(tiny_corpus,
                                                                             tmp_path):
    """A random conformer_ctc model (peaky outputs: the search finds words) with the tiny
    corpus's T o L o G: three concurrent streams in different chunk sizes through the
    dispatcher (several streams in one forward) finalise the offline CTC decode's words
    (CtcDecodeWorker, what `amflow decode` runs)."""
    from core.config import FeaturesConfig, ServeConfig, StorageConfig, features_dict
    from core.storage import Storage
    from decoding.ctc_decode import CtcDecodeWorker
    from decoding.ctc_graph import build_tlg
    from decoding.lexicon import words_of
    from decoding.lm import estimate
    from serving.app import make_recognizer
    from serving.recognizer import featurize, transcribe
    from tasks.select import read_records
    from tests.stream_driver import drive_streams
    from tests.test_serving import _speaker_waves
    from training.checkpoint import model_payload, to_bytes
    from training.ctc.tokens import train_tokenizer
    from training.families.conformer_model import ConformerCtcModel

    st = Storage(StorageConfig(root=str(tiny_corpus.parent)))
    recs, _, _ = read_records(st, str(tiny_corpus))
    tok = train_tokenizer([r.text for r in recs], "char")
    build_tlg(tok, estimate([words_of(r.text) for r in recs], order=2).to_arpa()).write(
        str(tmp_path))
    fcfg = FeaturesConfig()
    dim = fcfg.num_mel_bins * fcfg.stack
    torch.manual_seed(0)
    model = ConformerCtcModel(dim, tok.num_classes, **SMALL, chunk=4, left_chunks=2).eval()
    with torch.no_grad():
        model.output.weight.mul_(6.0)
    data = to_bytes(model_payload(
        model, cmvn={"count": 1, "sum": [0.0] * dim, "sumsq": [1.0] * dim},
        phones=tok.symbols, features=features_dict(fcfg), info={"tokenizer": tok.to_dict()}))
    spk_recs, waves = _speaker_waves(tiny_corpus)
    worker = CtcDecodeWorker(data, str(tmp_path), str(tiny_corpus), st.cfg, 13.0, 2000)
    hyps = worker.search(worker.score(spk_recs)["utts"],
                         {"acwt": 1.0, "lm_weight": 1.0, "blank_penalty": 1.0})["hyps"]
    words = [" ".join(w) for _, w, _ in hyps]
    assert sum(len(w) for w in words) > 0, "the offline words are all empty: a vacuous test"
    assets = {"model": data, "kind": "conformer_ctc", "log_prior": None, "acwt": 1.0,
              "blank_penalty": 1.0, "beam": 13.0, "max_active": 2000,
              "graph": {n: (tmp_path / n).read_bytes()
                        for n in ("HLG.fst", "words.txt", "graph.json")}}
    rec = make_recognizer(assets, ServeConfig(device="cpu", dtype="fp32", speech_gate=False,
                                              backend="torch"))
    assert isinstance(rec.model, ConformerStream) and rec.model.lookahead == 0
    assert [m["final"] for m in transcribe(rec, waves)] == words
    results, batches = drive_streams(rec, waves, [(1600, True), (700, True), (4000, True)],
                                     prepare=featurize, pause_s=0.001)
    for msgs in results:
        assert [m["final"] for m in msgs if "final" in m] == words
    assert max(batches) >= 2  # streams shared forwards


def test_decode_chunking_rechunks_a_conformer_and_is_refused_for_other_families():
    """decode.chunking: "CxL" or "full" gives the model file another eval-mode chunking (the
    same weights; U2's dynamic chunks made one model decode with any); "" leaves the bytes
    as they are; a bad value names the key; a model without attention chunks refuses."""
    from core.config.decode import chunking_of
    from training.checkpoint import card_from_bytes, model_payload, to_bytes, with_chunking

    for good, want in (("", None), ("4x8", (4, 8)), ("16x-1", (16, -1)), ("1x0", (1, 0))):
        assert chunking_of(load_config(None, [f"decode.chunking={good}"]).decode.chunking) == want
    assert chunking_of("full")[1] == -1
    for bad in ("0x4", "4x", "x4", "4x-2", "whole", "4*8"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"decode.chunking={bad}"])
        assert err.value.key == "decode.chunking"
    model = _model(chunk=8, left_chunks=4)
    data = to_bytes(model_payload(model, cmvn=None, phones=None, features={}))
    assert with_chunking(data, None) is data
    small, _ = card_from_bytes(with_chunking(data, (4, 8)))
    assert (small.chunk, small.left_chunks, small.lookahead) == (4, 8, 3)
    assert all(torch.equal(a, b) for a, b in zip(small.state_dict().values(),
                                                 model.state_dict().values()))
    rows = np.random.default_rng(5).standard_normal((37, 24)).astype(np.float32)
    whole, _ = card_from_bytes(with_chunking(data, chunking_of("full")))
    full = _model(chunk=8, left_chunks=4)
    with torch.no_grad():  # "full" is the whole-utterance pass (chunk 0: full context)
        ref = full.output(full.encode_chunked(torch.from_numpy(rows)[None], None, 0, -1))
    assert np.abs(_whole(whole, [rows])[0] - torch.log_softmax(ref, -1)[0].numpy()).max() < 1e-5
    from training.families.lstm import StudentLSTM

    lstm = to_bytes(model_payload(StudentLSTM(24, 16, 1, 11), cmvn=None,
                                  phones=None, features={}))
    with pytest.raises(ValueError, match="no attention chunks"):
        with_chunking(lstm, (4, 8))


def test_serve_takes_a_train_step_of_the_run_as_decode_does(tmp_path):
    """`amflow serve --run-id R --model train-conformer` serves R's train-conformer/model.pt
    (the how-to's chunking commands name the model so); a URI is taken as it is."""
    from amflow.steps.serve import serve_context
    from core.runs import StepContext

    cfg = load_config(None, [f"storage.root={tmp_path}"])
    ctx = StepContext(cfg, "r", "serve")
    assert serve_context(ctx, "train-conformer")[1] == ctx.other("train-conformer", "model.pt")
    assert serve_context(ctx, "x/model.pt")[1] == "x/model.pt"
    assert serve_context(ctx, None)[1] == ctx.other("train", "model.pt")
