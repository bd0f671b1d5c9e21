"""`amflow export` of the CTC student (amflow/services/ctc_export.py, serving/ctc_onnx.py):
its graphs give torch's log-probabilities (1e-4) and greedy words on real utterances, and
sherpa-onnx's recognizer, fed the audio, gives amflow's greedy words."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from core.config import FeaturesConfig


def _ctc_model(tokens: int, bidirectional: bool = False, seed: int = 0,
               attention_weight: float = 0.0):
    """A small random CTC student with peaky outputs (varied tokens, so words come out)
    and BatchNorm statistics away from the identity (the export folds them)."""
    import torch

    from training.ctc.model import CtcModel

    torch.manual_seed(seed)
    model = CtcModel(192, tokens, 3, channels=(8, 8), hidden=32, layers=2, lookahead=2,
                     bidirectional=bidirectional, attention_weight=attention_weight)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.uniform_(-0.3, 0.3)
                mod.running_var.uniform_(0.5, 2.0)
        model.output.weight.mul_(6.0)
    return model.eval()


@pytest.fixture(scope="module")
def ctc_run(tiny_corpus, tmp_path_factory):
    from core.config import load_config
    from tasks.select import records_of_split
    from core.storage import Storage
    from training.checkpoint import model_payload, to_bytes
    from training.ctc.tokens import train_tokenizer

    recs, _ = records_of_split(Storage(), str(tiny_corpus), "labeled")
    tok = train_tokenizer([r.text for r in recs if r.text], "char")
    model = _ctc_model(tok.num_classes)
    cmvn = {"count": 10, "sum": [20.0] * 64, "sumsq": [90.0] * 64}
    payload = model_payload(model, cmvn=cmvn, phones=tok.symbols,
                            features=dataclasses.asdict(FeaturesConfig()),
                            info={"tokenizer": tok.to_dict()})
    root = tmp_path_factory.mktemp("export_ctc")
    run = root / "runs" / "r"
    (run / "train-ctc").mkdir(parents=True)
    (run / "train-ctc" / "model.pt").write_bytes(to_bytes(payload))
    # the run's LM (as `amflow lm` writes it): the export ships sherpa-onnx its T o L o G
    from decoding.lexicon import words_of
    from decoding.lm import estimate

    (run / "lm").mkdir()
    texts = [words_of(r.text) for r in recs if r.text]
    (run / "lm" / "lm.arpa").write_text(estimate(texts * 3, order=2).to_arpa())
    cfg = load_config(None, [f"storage.root={root}", f"data.corpus={tiny_corpus}",
                             "export.check_utterances=4", "decode.blank_penalties=[0.5]"])
    return cfg, run, tok


def test_ctc_export_is_checked_against_torch_and_sherpa_onnx_gives_its_words(ctc_run):
    from amflow.steps import export
    from core.runs import StepContext

    cfg, run, tok = ctc_run
    summary = export.run(StepContext(cfg, "r", "export"), SimpleNamespace(
        model="train-ctc", format="onnx", quantize="int8", data=None))
    # untagged, the folder follows the model (train-ctc -> export-ctc): a hybrid
    # student's export/ beside it is not overwritten
    out = run / "export-ctc"
    assert not (run / "export").exists()
    for name in ("model.onnx", "model.sherpa.onnx", "model.int8.onnx", "model.sherpa.int8.onnx",
                 "model.streaming.onnx", "model.streaming.int8.onnx", "streaming.json",
                 "tokens.txt", "card.json", "features.json", "decoding.json", "_SUCCESS.json"):
        assert (out / name).exists(), name
    checks = json.loads((out / "checks.json").read_text())
    assert checks["passed"] and checks["utterances"] == 4 and checks["blank_penalty"] == 0.5
    # the streaming graph, run as concurrent chunked streams, is torch's whole-utterance
    # forward; its int8 variant is measured, not held
    assert checks["graphs"]["model.streaming.int8.onnx"]["checked"] is False
    streaming = json.loads((out / "streaming.json").read_text())
    assert [s["name"] for s in streaming["state"]][:2] == ["rows_seen", "conv0"]
    assert streaming["state"][0]["shape"] == ["B"] and streaming["lookahead_rows"] == 4
    for name in ("model.onnx", "model.sherpa.onnx", "model.streaming.onnx"):
        g = checks["graphs"][name]
        assert g["checked"] and g["max_abs_diff"] <= 1e-4 and g["same_words"] == 4, (name, g)
    assert checks["torch_hyp_words"] >= 4  # words came out: a vacuous check would have none
    # sherpa-onnx, fed the audio, computes the fbank itself: the same words as amflow's
    # greedy decode of each utterance
    assert checks["sherpa_onnx_runtime"] == "sherpa-onnx 2.0.1"
    runtime = checks["graphs"]["sherpa-onnx:model.sherpa.onnx"]
    assert runtime["same_words"] == 4, runtime
    assert "delta_ci95" in checks["graphs"]["sherpa-onnx:model.sherpa.int8.onnx"]["wer_vs_torch"]
    # the graph search: sherpa-onnx with the export's TLG.fst gives amflow decode's T o L o
    # G words (each utterance alone: sherpa-onnx restarts the mean normalisation)
    for name in ("TLG.fst", "words.txt", "sherpa.json"):
        assert (out / name).exists(), name
    tlg = checks["tlg"]
    assert tlg["blank_penalty"] == 0.5 and "decode.blank_penalties[0]" in tlg["tuned"]
    assert tlg["amflow_hyp_words"] >= 4 and tlg["hlg_in_amflow_same_words"] == 4, tlg
    assert checks["graphs"]["sherpa-onnx+TLG.fst:model.sherpa.onnx"]["same_words"] == 4
    sj = json.loads((out / "sherpa.json").read_text())
    assert sj["ctc_graph"] == "TLG.fst" and sj["beam"] == {"sherpa_onnx": 16.0,
                                                           "amflow_units": 10.0}
    assert sj["scale"] == round(1.6 * sj["acwt"], 6) and sj["graph_scale"] == 1.6
    lines = (out / "tokens.txt").read_text().splitlines()
    assert lines[0] == "<blk> 0" and len(lines) == tok.num_classes
    sherpa = json.loads((out / "features.json").read_text())["sherpa_onnx"]
    assert sherpa["snip_edges"] is True and sherpa["normalize_samples"] is False
    assert summary["metrics"]["model.sherpa.onnx.same_words"] == 4


def test_sherpa_onnx_decodes_with_the_files_alone(ctc_run, tiny_corpus):
    """What a deployment runs: the directory's files, sherpa-onnx, audio; no amflow."""
    from core.storage import Storage
    from decoding.ctc_decode import greedy_words
    from decoding.decode import featurize
    from serving import sherpa_decode
    from serving.ctc_onnx import sherpa_features  # noqa: F401 (features.json holds them)
    from tasks.audio import decode_audio, resolve_uri
    from tasks.select import records_of_split
    from training.checkpoint import load_model_card
    from decoding.ctc_decode import ctc_log_probs

    cfg, run, tok = ctc_run
    out = run / "export-ctc"
    if not (out / "_SUCCESS.json").exists():
        test_ctc_export_is_checked_against_torch_and_sherpa_onnx_gives_its_words(ctc_run)
    feats = json.loads((out / "features.json").read_text())["sherpa_onnx"]
    rec = sherpa_decode.recognizer(str(out / "model.sherpa.onnx"), str(out / "tokens.txt"), feats)
    st = Storage()
    recs = sorted(records_of_split(st, str(tiny_corpus), "dev")[0], key=lambda r: r.utt_id)[:3]
    model, card = load_model_card(st, str(run / "train-ctc" / "model.pt"))
    fcfg = FeaturesConfig()
    waves = [decode_audio(st.read_bytes(resolve_uri(str(tiny_corpus), r.audio_uri)), fcfg,
                          r.duration).samples for r in recs]
    got = sherpa_decode.words(rec, waves, 16000)
    alone = [featurize(st, str(tiny_corpus), [dataclasses.replace(r, speaker_id=r.utt_id)],
                       card)[0][0][1] for r in recs]
    want = [greedy_words(lp, tok, 0.5) for lp in ctc_log_probs(model, alone)]
    assert got == want and any(got)


def test_sherpa_onnx_graph_search_from_the_folder_gives_amflows_tlg_words(ctc_run, tiny_corpus):
    """sherpa-onnx's own graph search, configured from the export folder alone
    (sherpa.json, TLG.fst), against `amflow decode`'s T o L o G search (the run's cached
    graph, decode.beam, the folder's acwt and blank penalty) of the same utterances, each
    alone; greedy search (graph=False) against amflow's greedy words."""
    from amflow.services.decoder_setup import ctc_graph
    from core.runs import StepContext
    from core.storage import Storage
    from decoding.ctc_decode import ctc_log_probs, ctc_scores, greedy_words
    from decoding.decode import featurize
    from decoding.graph import read_graph
    from decoding.search import Searcher
    from serving import sherpa_decode
    from tasks.audio import decode_audio, resolve_uri
    from tasks.select import records_of_split
    from training.checkpoint import load_model_card

    cfg, run, tok = ctc_run
    out = run / "export-ctc"
    if not (out / "_SUCCESS.json").exists():
        test_ctc_export_is_checked_against_torch_and_sherpa_onnx_gives_its_words(ctc_run)
    st = Storage()
    recs = [r for split in ("dev", "test", "labeled")
            for r in sorted(records_of_split(st, str(tiny_corpus), split)[0],
                            key=lambda r: r.utt_id)]
    waves = [decode_audio(st.read_bytes(resolve_uri(str(tiny_corpus), r.audio_uri)),
                          FeaturesConfig(), r.duration).samples for r in recs]
    model, card = load_model_card(st, str(run / "train-ctc" / "model.pt"))
    alone = [featurize(st, str(tiny_corpus), [dataclasses.replace(r, speaker_id=r.utt_id)],
                       card)[0][0][1] for r in recs]
    lps = ctc_log_probs(model, alone)
    sj = json.loads((out / "sherpa.json").read_text())
    graph_dir = ctc_graph(StepContext(cfg, "r", "decode"), card, {})[0]
    search = Searcher(read_graph(graph_dir), cfg.decode.beam, cfg.decode.max_active)
    want = [search.best_words(ctc_scores(lp, sj["acwt"], sj["blank_penalty"]))[0] for lp in lps]
    got = sherpa_decode.words(sherpa_decode.from_folder(str(out)), waves, 16000)
    same = sum(a == b for a, b in zip(got, want))
    print(f"sherpa-onnx TLG.fst vs amflow T o L o G: same words {same}/{len(recs)}, "
          f"{sum(map(len, want))} words")
    assert len(recs) >= 15 and sum(map(len, want)) >= len(recs) and same == len(recs)
    greedy = sherpa_decode.words(sherpa_decode.from_folder(str(out), graph=False), waves, 16000)
    assert greedy == [greedy_words(lp, tok, sj["blank_penalty"]) for lp in lps]
    # the how-to's block, as written, on the folder: sherpa-onnx alone, words from the LM
    assert _run_howto(out, waves[0], out.parent / "howto") == want[0] and want[0]


def _run_howto(folder, wave, tmp) -> list[str]:
    """docs/how-to/export.md's sherpa-onnx block, run by this Python on `folder` and `wave`
    (nothing of amflow imported: its own directory is the working directory)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import soundfile as sf

    doc = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "export.md").read_text()
    block = doc.split("### Decode with sherpa-onnx", 1)[1].split("```python\n", 1)[1]
    block = block.split("```", 1)[0]
    assert 'd = "data/runs/demo-ssl/export-ctc"' in block and '"utterance.wav"' in block
    tmp.mkdir(exist_ok=True)
    sf.write(tmp / "utterance.wav", np.asarray(wave, np.float32), 16000, subtype="FLOAT")
    code = block.replace('"data/runs/demo-ssl/export-ctc"', repr(str(folder)))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True,
                         text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    return ast.literal_eval(run.stdout.strip().splitlines()[-1])


def test_the_export_takes_the_scales_decode_tuned_on_dev_for_this_model(ctc_run, tmp_path):
    """The blank penalty (greedy graph and graph search alike) and the LM weight come from
    `amflow decode`'s result.json when it decoded this model (T o L o G first), and say so;
    another model's decode, a hybrid decode or none: the config's first values."""
    from amflow.services.ctc_export import tuned_scales
    from core.runs import StepContext

    cfg, _, _ = ctc_run
    cfg = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, root=str(tmp_path)),
                              decode=dataclasses.replace(cfg.decode, tag="ctc"))
    ctx = StepContext(cfg, "r", "export")
    model = ctx.other("train-ctc", "model.pt")
    res = tmp_path / "runs" / "r" / "decode-ctc" / "result.json"
    fallback = tuned_scales(ctx, model)
    assert (fallback.blank_penalty, fallback.lm_weight) == (0.5, 0.8)
    assert "no decode of it" in fallback.source
    res.parent.mkdir(parents=True)
    tlg = {"model": model, "search": "tlg", "lm_weight": 1.6, "acwt": 0.625,
           "blank_penalty": 3.0, "tune_split": "dev", "tuning": [{"wer": 0.3}]}
    res.write_text(json.dumps(tlg))
    got = tuned_scales(ctx, model)
    assert (got.lm_weight, got.acwt, got.blank_penalty) == (1.6, 0.625, 3.0)
    assert got.source == f"{ctx.other('decode-ctc', 'result.json')} (T o L o G, tuned on dev)"
    res.write_text(json.dumps({**tlg, "search": "greedy", "blank_penalty": 1.5}))
    got = tuned_scales(ctx, model)
    assert (got.blank_penalty, got.lm_weight) == (1.5, 0.8) and "greedy" in got.source
    res.write_text(json.dumps({**tlg, "model": ctx.other("train-other", "model.pt")}))
    assert tuned_scales(ctx, model).blank_penalty == 0.5
    res.write_text(json.dumps({**tlg, "search": None}))
    assert "hybrid" in tuned_scales(ctx, model).source
    res.write_text(json.dumps({**tlg, "tune_split": "test"}))  # never the test split's
    assert tuned_scales(ctx, model).blank_penalty == 0.5


def _fixed_output_graph(scores: list[np.ndarray]) -> bytes:
    """A sherpa-onnx zipformer-CTC graph that ignores its input and gives `scores` (one
    [T_i, C] matrix per stream of one decode_streams call) as its log_probs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    t, c = max(len(x) for x in scores), scores[0].shape[1]
    out = np.full((len(scores), t, c), -30.0, np.float32)
    for i, x in enumerate(scores):
        out[i, :len(x)] = x
    lens = np.array([len(x) for x in scores], np.int64)
    const = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(v, name))
             for name, v in (("log_probs", out), ("log_probs_len", lens))]
    graph = helper.make_graph(
        const, "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 64]),
                         helper.make_tensor_value_info("x_lens", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, list(out.shape)),
         helper.make_tensor_value_info("log_probs_len", TensorProto.INT64, [len(scores)])])
    return helper.make_model(graph, ir_version=8,
                             opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_sherpa_onnx_reads_the_exported_graph_as_amflow_searches_its_own(kind, tmp_path):
    """sherpa-onnx's graph search over known scores (a fixed-output graph) with the graph
    the export ships (amflow's L o G, repeats="blank", weights and scores scaled as
    ctc_export.sherpa_search does) against amflow decode's search with its own T o L o G
    (decode.beam 10): the known paths' words exactly, and the same words on all noisy
    paths but at most one (measured: 43/43 for char and BPE tokens; the graph amflow
    searches itself, shipped as it is, gives 39/43 with char tokens: sherpa-onnx reads a
    token on two frames in a row as one, where amflow's compact T may read two)."""
    from amflow.services.ctc_export import SHERPA_BEAM
    from decoding.ctc_decode import ctc_scores
    from decoding.ctc_graph import build_tlg, scaled
    from decoding.lexicon import words_of
    from decoding.lm import estimate
    from decoding.search import Searcher
    from serving import sherpa_decode
    from serving.ctc_onnx import tokens_txt
    from tests.test_ctc import TEXTS, _known_path
    from training.ctc.tokens import train_tokenizer

    tok = train_tokenizer(TEXTS, kind, vocab_size=40)
    arpa = estimate([words_of(t) for t in TEXTS], order=2).to_arpa()
    acwt, penalty, beam = 0.625, 1.0, 10.0
    k = SHERPA_BEAM / beam
    scaled(build_tlg(tok, arpa, repeats="blank"), k).write(str(tmp_path))
    (tmp_path / "tokens.txt").write_text(tokens_txt(tok))
    rng = np.random.default_rng(0)
    known = ["all the small balls fell", "the cat ran to the dog", "hello bob's small wall"]
    lps = [_known_path(tok, t) for t in known]
    for i in range(40):
        lp = _known_path(tok, TEXTS[i % len(TEXTS)]) + rng.normal(0, 1.5, (1, tok.num_classes))
        lp = lp + rng.normal(0, 2.0, lp.shape)
        lps.append((lp - np.log(np.exp(lp).sum(-1, keepdims=True))).astype(np.float32))
    own = Searcher(build_tlg(tok, arpa), beam, 2000)
    want = [own.best_words(ctc_scores(lp, acwt, penalty))[0] for lp in lps]
    (tmp_path / "model.onnx").write_bytes(
        _fixed_output_graph([ctc_scores(lp, k * acwt, penalty) for lp in lps]))
    rec = sherpa_decode.recognizer(
        str(tmp_path / "model.onnx"), str(tmp_path / "tokens.txt"),
        {"sampling_rate": 16000, "feature_dim": 64}, graph=str(tmp_path / "HLG.fst"),
        max_active=2000)
    got = sherpa_decode.words(rec, [np.zeros(8000, np.float32)] * len(lps), 16000)
    assert got[:3] == [words_of(t) for t in known]
    same = sum(a == b for a, b in zip(got, want))
    print(f"{kind}: sherpa-onnx = amflow on {same}/{len(lps)} paths, "
          f"{sum(map(len, want))} words")
    assert same >= len(lps) - 1 and sum(map(len, want)) > 3 * len(lps)


@pytest.mark.parametrize("bidirectional,attention", [(False, 0.0), (True, 0.0), (False, 0.3)])
def test_the_ctc_graph_equals_torch_alone_and_in_a_padded_batch(bidirectional, attention):
    """Causal and bidirectional layers (the backward one reversed within each length), and
    the joint CTC/attention model's encoder + CTC output."""
    import onnxruntime as ort
    import torch

    from serving.ctc_onnx import utterance_graph

    model = _ctc_model(20, bidirectional, attention_weight=attention)
    assert (model.decoder is not None) == (attention > 0)
    card = SimpleNamespace(features={}, cmvn=None)
    sess = ort.InferenceSession(utterance_graph(model, card), providers=["CPUExecutionProvider"])
    lens = torch.tensor([37, 50, 5, 12])
    x = torch.randn(4, 50, 192)
    with torch.no_grad():
        h, n = model.encode(x, lens)
        ref = torch.log_softmax(model.ctc_output(h, n), -1).numpy()
    lp, ln = sess.run(None, {"x": x.numpy(), "x_lens": lens.numpy()})
    assert ln.tolist() == n.tolist()
    for i, k in enumerate(n.tolist()):
        assert np.abs(ref[i, :k] - lp[i, :k]).max() < 1e-4
    alone, _ = sess.run(None, {"x": x[2:3, :5].numpy(), "x_lens": lens[2:3].numpy()})
    assert np.abs(alone[0, :n[2]] - lp[2, :n[2]]).max() < 1e-5


@pytest.mark.parametrize("window,min_window", [(600, 100), (20, 7)])
def test_the_in_graph_front_end_is_amflows_per_utterance_normalisation(window, min_window):
    """Causal mean normalisation (cold start included), stacking and CMVN as
    tasks.features computes them for an utterance alone, in a batch padded as sherpa-onnx
    pads (log 1e-10), for lengths around the windows and shorter than one row."""
    import torch

    from serving.ctc_onnx import UtteranceFrontEnd
    from tasks.features import StreamCMN, stack_frames
    from training.data import Normalizer

    rng = np.random.default_rng(0)
    fcfg = dataclasses.replace(FeaturesConfig(), cmn_window=window, cmn_min_window=min_window)
    cmvn = {"count": 10, "sum": list(rng.normal(size=64) * 10),
            "sumsq": list(rng.uniform(100, 300, 64) * 10)}
    norm = Normalizer.from_stats(cmvn, 192)
    lens = [700, 50, 3, 2, 1300]
    xs = [rng.normal(size=(n, 64)).astype(np.float32) * 3 + 12 for n in lens]
    x = np.full((5, max(lens), 64), -23.0258, np.float32)
    for i, a in enumerate(xs):
        x[i, :len(a)] = a
    rows, r_lens = UtteranceFrontEnd(fcfg, cmvn, 192)(torch.from_numpy(x), torch.tensor(lens))
    for i, a in enumerate(xs):
        ref = norm(stack_frames(StreamCMN(64, window, min_window).apply(a), 3, 3))
        assert int(r_lens[i]) == len(ref)
        if len(ref):  # 2 frames: no row
            assert np.abs(rows[i, :len(ref)].numpy() - ref).max() < 1e-5


def test_tokens_and_features_sherpa_onnx_cannot_take_are_refused():
    from serving.ctc_onnx import sherpa_features, tokens_txt
    from training.ctc.tokens import Tokenizer

    assert tokens_txt(Tokenizer("char", ["<blk>", "<unk>", "\u2581", "a"])).splitlines() == [
        "<blk> 0", "<unk> 1", "\u2581 2", "a 3"]
    card = SimpleNamespace(features=dataclasses.asdict(
        dataclasses.replace(FeaturesConfig(), window_type="hamming")))
    with pytest.raises(ValueError, match="features.window_type"):
        sherpa_features(card)


def test_the_sherpa_graph_equals_torch_past_the_mean_window_and_padded_as_sherpa_pads():
    """The exported front end + model (traced on a short input) on utterances longer than
    cmn_window (600 frames), shorter than cmn_min_window and than one row, padded with
    sherpa-onnx's log(1e-10): torch's outputs, each utterance's own alone or in the batch."""
    import onnxruntime as ort
    import torch

    from serving.ctc_onnx import SherpaCtc, sherpa_graph

    model = _ctc_model(20)
    rng = np.random.default_rng(1)
    card = SimpleNamespace(features=dataclasses.asdict(FeaturesConfig()),
                           cmvn={"count": 10, "sum": list(rng.normal(size=64) * 10),
                                 "sumsq": list(rng.uniform(100, 300, 64) * 10)})
    sess = ort.InferenceSession(sherpa_graph(model, card, 1.5), providers=["CPUExecutionProvider"])
    lens = np.array([1700, 650, 90, 2])
    x = np.full((4, 1700, 64), -23.02585, np.float32)
    for i, n in enumerate(lens):
        x[i, :n] = rng.normal(size=(n, 64)) * 3 + 12
    lp, n_out = sess.run(None, {"x": x, "x_lens": lens})
    with torch.no_grad():
        ref, n_ref = SherpaCtc(model, card, 1.5)(torch.from_numpy(x), torch.from_numpy(lens))
        plain = SherpaCtc(model, card, 0.0)(torch.from_numpy(x), torch.from_numpy(lens))[0]
    # the blank penalty lowers the blank's log-probability by it, and nothing else
    assert torch.allclose(ref[..., 0] + 1.5, plain[..., 0]) and torch.equal(ref[..., 1:],
                                                                           plain[..., 1:])
    assert n_out.tolist() == n_ref.tolist() == [566, 216, 30, 0]
    for i, k in enumerate(n_out[:3]):
        assert np.abs(lp[i, :k] - ref[i, :k].numpy()).max() < 1e-4
        alone, _ = sess.run(None, {"x": x[i:i + 1, :lens[i]], "x_lens": lens[i:i + 1]})
        assert np.abs(alone[0, :k] - lp[i, :k]).max() < 1e-5


def test_amflow_serve_runs_the_exported_streaming_graph_with_torchs_finals(ctc_run,
                                                                           tiny_corpus):
    """serve.backend=onnxruntime with a CTC model: `amflow serve`'s assets carry the
    export's model.streaming.onnx, and the recognizer on it gives torch's finals."""
    from amflow.steps.serve import load_assets
    from core.runs import StepContext
    from decoding.lexicon import words_of
    from decoding.lm import estimate
    from serving.app import make_recognizer
    from serving.recognizer import transcribe
    from tests.test_serving import _speaker_waves

    cfg, run, _ = ctc_run
    if not (run / "export-ctc" / "_SUCCESS.json").exists():  # run alone: export first
        test_ctc_export_is_checked_against_torch_and_sherpa_onnx_gives_its_words(ctc_run)
    recs, waves = _speaker_waves(tiny_corpus, split="test", limit=3)
    (run / "lm").mkdir(exist_ok=True)
    texts = [words_of(r.text) for r in recs]
    (run / "lm" / "lm.arpa").write_text(estimate(texts * 3, order=2).to_arpa())
    serve = dataclasses.replace(cfg.serve, device="cpu", dtype="fp32", backend="onnxruntime",
                                speech_gate=False)
    ctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
    assets = load_assets(ctx, str(run / "train-ctc" / "model.pt"))
    assert assets["kind"] == "ctc" and assets["onnx_uri"].endswith("export-ctc/model.streaming.onnx")
    words = {}
    for backend in ("torch", "onnxruntime"):
        rec = make_recognizer(assets, dataclasses.replace(serve, backend=backend))
        words[backend] = [m["final"] for m in transcribe(rec, waves, chunk=1000)]
    assert words["torch"] == words["onnxruntime"] and any(words["torch"])
    assert str(rec.model.dtype) == "onnxruntime fp32"
    # the export's gate.json on the same graph: no words from silence, a constant signal
    # or -40 dBFS noise
    from tests.test_export import gated_finals

    finals = gated_finals(assets, serve, run / "export-ctc")
    assert finals[True] == ["", "", ""] and any(finals[False]), finals
