"""Decoding to words: lexicon, Kneser-Ney LM, H o L o G graph, search, WER, bad inputs."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from core.model_card import ModelCard
from decoding import graph as G
from decoding import lexicon as L
from decoding import lm
from decoding import wer as W
from decoding.search import Searcher, acoustic_scores, log_priors, oracle_log_posteriors

CLASSES = ["<unk>", "a", "b", "k", "s", "sil", "t"]
LEXICON = """cat k a t
cats k a t s
at a t
tab t a b
tab t a b s
bat b a t
"""


def _sentences():
    return [s.split() for s in ["cat at tab", "bat at cat", "cats at tab", "tab cat",
                                "cat bat", "at tab cat bat"] * 3]


def _frames(phones: list[str], repeat: int = 2) -> np.ndarray:
    return np.array([CLASSES.index(p) for p in phones for _ in range(repeat)])


@pytest.fixture(scope="module")
def tiny_graph():
    model = lm.estimate(_sentences(), 3)
    return G.build_graph(L.read_lexicon(LEXICON), model.to_arpa(), CLASSES)


def _decode(graph, labels, acwt=1.0):
    lp = oracle_log_posteriors(labels, len(CLASSES))
    return Searcher(graph, beam=15).best_words(
        acoustic_scores(lp, log_priors(np.ones(len(CLASSES))), acwt))[0]


# ----------------------------------------------------------------- graph + search
def test_graph_decodes_known_posteriors_to_the_words(tiny_graph):
    seq = ["sil", "k", "a", "t", "sil", "a", "t", "t", "a", "b", "sil"]
    assert _decode(tiny_graph, _frames(seq)) == ["cat", "at", "tab"]
    # no silence between words, a prefix pronunciation (cat < cats) and a one-frame phone
    seq = ["k", "a", "t", "s", "a", "t", "t", "a", "b"]
    assert _decode(tiny_graph, _frames(seq, 1)) == ["cats", "at", "tab"]


def test_each_utterance_is_searched_by_a_decoder_of_its_own(tiny_graph, monkeypatch):
    """A FasterDecoder reused across utterances keeps its token hash at the largest size an
    earlier utterance needed, which changes which tokens max_active keeps: on the demo's
    SSL student one test utterance decoded to other words after the actor had searched
    others (the same posteriors, bitwise; this graph is too small to show it). So each
    utterance gets a fresh decoder, and a Searcher's answers do not depend on its past."""
    import kaldi_decoder

    made = []
    real = kaldi_decoder.FasterDecoder

    def counting(fst, opts):
        made.append(opts.max_active)
        return real(fst, opts)
    monkeypatch.setattr(kaldi_decoder, "FasterDecoder", counting)
    search = Searcher(tiny_graph, beam=15, max_active=50)
    seqs = [["sil", "k", "a", "t", "sil"], ["b", "a", "t", "a", "t"], ["sil", "k", "a", "t", "sil"]]
    words = [search.best_words(acoustic_scores(oracle_log_posteriors(_frames(s), len(CLASSES)),
                                               log_priors(np.ones(len(CLASSES))), 1.0))[0]
             for s in seqs]
    assert words[0] == words[2] == ["cat"] and words[1] == ["bat", "at"]
    assert made == [50] * 4  # the options' check at construction, then one per utterance


def test_graph_labels_are_class_ids_plus_one(tiny_graph, tmp_path):
    info = tiny_graph.info
    assert info["classes"] == len(CLASSES) and info["words"] == 5
    assert info["disambig_symbols"] >= 1  # "t a b" is a prefix of "t a b s"
    tiny_graph.write(str(tmp_path))
    again = G.read_graph(str(tmp_path))
    assert again.words == tiny_graph.words
    seq = ["b", "a", "t", "a", "t"]
    assert _decode(again, _frames(seq)) == ["bat", "at"]


def test_graph_refuses_a_lexicon_with_phones_the_model_lacks():
    lex = L.read_lexicon(LEXICON + "dog d O g\n")
    with pytest.raises(G.GraphError, match=r"\['O', 'd', 'g'\]"):
        G.build_graph(lex, lm.estimate(_sentences(), 2).to_arpa(), CLASSES)


def test_graph_cache_key_changes_with_each_input():
    base = G.graph_key("lex", "arpa", ["a"], 0.5)
    assert len({base, G.graph_key("lex2", "arpa", ["a"], 0.5), G.graph_key("lex", "arpa2", ["a"], 0.5),
                G.graph_key("lex", "arpa", ["b"], 0.5), G.graph_key("lex", "arpa", ["a"], 0.4)}) == 5


# ----------------------------------------------------------------- WER
def test_wer_counts_substitutions_deletions_insertions():
    s = W.score("a b c d".split(), "a x d e".split(), "DP1")
    assert (s.sub, s.dels, s.ins, s.ref_words, s.errors) == (1, 1, 1, 4, 3)
    agg = W.aggregate([s, W.score(["a", "b"], ["a", "b"], "DP2"), W.score(["x"], [], "DP2")])
    assert agg["wer"] == pytest.approx(4 / 7)
    assert agg["per_condition"] == pytest.approx({"DP1": 3 / 4, "DP2": 1 / 3})
    assert agg["ser"] == pytest.approx(2 / 3)
    assert agg["per_condition_detail"]["DP2"]["del"] == pytest.approx(1 / 3)
    assert W.relative_reduction({"DP1": 0.2}, {"DP1": 0.15})["DP1"] == pytest.approx(0.25)


# ----------------------------------------------------------------- LM
@pytest.mark.parametrize("min_count", [1, 2])
def test_kneser_ney_distributions_sum_to_one(min_count):
    model = lm.estimate(_sentences() + [["cat", "cat", "cat"]], 3, vocabulary=["dog"],
                        min_count=min_count)
    vocab = sorted(model.vocabulary() | {lm.EOS})
    assert "dog" in vocab  # a lexicon word never seen in the text still has mass
    for hist in [(), ("<s>",), ("cat",), ("at", "tab"), ("<s>", "cat"), ("dog",), ("tab", "tab")]:
        total = sum(10 ** model.logprob(w, list(hist)) for w in vocab)
        assert total == pytest.approx(1.0, abs=1e-6), hist


def test_arpa_round_trip_and_perplexity():
    model = lm.estimate(_sentences(), 3)
    again = lm.read_arpa(model.to_arpa())
    assert again.num_ngrams() == model.num_ngrams()
    for w, h in [("cat", ["at", "tab"]), ("bat", ["cat"]), ("tab", [])]:
        assert again.logprob(w, h) == pytest.approx(model.logprob(w, h), abs=1e-5)
    ppl = lm.perplexity(model, [["cat", "at", "zebra", "tab"]])
    assert ppl["oov"] == 1 and ppl["oov_rate"] == pytest.approx(0.25)
    assert 1 < ppl["perplexity"] < len(model.vocabulary()) + 1
    with pytest.raises(lm.ArpaError):
        lm.read_arpa("not an arpa file")


def test_generator_sentences_are_deterministic_and_use_the_vocabulary():
    from tasks.speech.text import vocabulary

    a, b = lm.generator_sentences(50, 7), lm.generator_sentences(50, 7)
    assert a == b and a != lm.generator_sentences(50, 8)
    assert {w for s in a for w in s} <= set(vocabulary())


# ----------------------------------------------------------------- lexicon
def test_lexicon_reads_variants_and_rejects_a_word_without_phones():
    lex = L.read_lexicon("# comment\nTab t a b\ntab t a b s\n\ncat k a t\n")
    assert lex.prons["tab"] == [("t", "a", "b"), ("t", "a", "b", "s")]
    assert L.read_lexicon(lex.to_text()).prons == lex.prons
    with pytest.raises(L.LexiconError, match="line 2"):
        L.read_lexicon("cat k a t\ndog\n")


def test_can_produce_and_coverage_count_oov():
    lex = L.read_lexicon(LEXICON)
    assert L.can_produce(lex, ["cats", "at"], ["sil", "k", "a", "t", "s", "a", "t", "sil"])
    assert not L.can_produce(lex, ["cat", "at"], ["k", "a", "t", "s", "a", "t"])
    cov = L.coverage(lex, [(["cat", "dog"], ["k", "a", "t"]), (["at"], ["a", "t"])])
    assert cov["produced"] == 1 and cov["oov_tokens"] == 1 and cov["oov_words"] == {"dog": 1}
    assert L.words_of("Set it at eight o'clock, Anna!") == ["set", "it", "at", "eight",
                                                           "o'clock", "anna"]


def test_espeak_lexicon_splits_groups_and_learns_linking():
    groups = [(["the"], ["D", "@"]), (["on"], ["O", "n"]), (["on", "the"], ["O", "n", "D", "I", ";"]),
              (["story"], ["s", "t", "o", "r", "i"]), (["story"], ["s", "t", "o", "r", "i", ";"]),
              (["busy"], ["b", "I", "z", "i", ";"]), (["busy"], ["b", "I", "z", "i"]),
              (["lucy"], ["l", "u", "s", "i", ";"]), (["lucy"], ["l", "u", "s", "i"]),
              (["happy"], ["h", "a", "p", "i"]), (["tiny"], ["t", "aI", "n", "i", ";"])]
    lex, unexplained = L.espeak_lexicon(groups)
    assert unexplained == 0
    assert ("D", "I", ";") in lex.prons["the"]  # learnt from the "on the" group
    assert ("i", ";") in L.linking_rules(lex)
    # the rule gives every word ending in "i" both forms
    assert {("h", "a", "p", "i"), ("h", "a", "p", "i", ";")} <= set(lex.prons["happy"])
    assert ("t", "aI", "n", "i") in lex.prons["tiny"]  # and a gap between words drops it


# ----------------------------------------------------------------- the step's inputs
def test_decode_rejects_a_model_whose_classes_miss_lexicon_phones():
    from core.runs import StepError
    from decoding.assets import check_phones

    with pytest.raises(StepError, match=r"no class for: \['k', 's'\]"):
        check_phones(L.read_lexicon(LEXICON), ["a", "b", "t", "sil"], "lex.txt", "m.pt")


def test_score_hyps_counts_oov_reference_words():
    from decoding.decode import score_hyps

    rec = SimpleNamespace(utt_id="u1", text="Cat at zebra.", condition="DP3")
    result, rows, oov = score_hyps([(rec, ["cat", "at", "tab"], True)], L.read_lexicon(LEXICON))
    assert oov == {"tokens": 1, "words": 3, "rate": pytest.approx(1 / 3)}
    assert result["per_condition"] == {"DP3": pytest.approx(1 / 3)}
    assert rows[0]["hyp"] == "cat at tab" and rows[0]["ref"] == "cat at zebra"


def test_priors_from_hard_labels_and_soft_targets(tmp_path):
    import pyarrow as pa

    from core.config import StorageConfig
    from core.storage import Storage
    from training.priors import class_counts

    st = Storage(StorageConfig(root=str(tmp_path)))
    hard = np.array([0, 1, 1, 2], np.int16).tobytes()
    idx = np.array([[1, 2], [2, 0]], np.int16).tobytes()
    logit = np.log(np.array([[0.75, 0.25], [0.5, 0.5]])).astype(np.float16).tobytes()
    st.write_parquet(str(tmp_path / "part-0.parquet"), pa.table(
        {"labels": [hard, None], "k": [None, 2], "topk_idx": [None, idx],
         "topk_logit": [None, logit]}))
    counts = class_counts(st, [str(tmp_path / "part-0.parquet")], 3)
    assert counts == pytest.approx([1.5, 2.75, 1.75], abs=1e-3)
    # pruned (targets.mass < 1): the first frame kept class 1 only, so all its mass
    from core import records
    pruned = records.encode_topk(np.frombuffer(idx, np.int16).reshape(2, 2),
                                 np.frombuffer(logit, np.float16).reshape(2, 2), [1, 2])
    st.write_parquet(str(tmp_path / "part-1.parquet"), pa.table(
        {"labels": [hard, None], **{c: [None, pruned[c]] for c in records.TARGET_COLUMNS}}))
    counts = class_counts(st, [str(tmp_path / "part-1.parquet")], 3)
    assert counts == pytest.approx([1.5, 3.0, 1.5], abs=1e-3)
    assert np.exp(log_priors(counts)).sum() == pytest.approx(1.0, abs=1e-5)


def test_decode_and_evaluate_follow_the_split_rule(tmp_path, local_cfg):
    """A corpus without `split`: aligned records are labeled, others unlabeled."""
    from core.runs import StepContext, StepError
    from decoding.decode import split_records
    from tests.test_select import make_corpus

    make_corpus(tmp_path / "corpus", speakers=4, utts=2, labeled=2, with_split=False)
    ctx = StepContext(local_cfg(), "r", "decode")
    labeled, rejects = split_records(ctx.storage, str(tmp_path / "corpus"), "labeled")
    unlabeled, _ = split_records(ctx.storage, str(tmp_path / "corpus"), "unlabeled")
    assert len(labeled) == 4 and len(unlabeled) == 4 and not rejects
    with pytest.raises(StepError, match="splits found: labeled, unlabeled"):
        split_records(ctx.storage, str(tmp_path / "corpus"), "test")


def test_a_finished_decode_is_handed_back_only_for_the_same_model_lm_and_search(
        tmp_path, local_cfg):
    """A rerun reuses a finished decode when the model, LM, lexicon and corpus are the same
    (by their bytes) and the search keys match (workers only place it); a model trained
    again at the same URI, a corpus made again, or another beam decodes again."""
    from core.runs import SUCCESS, StepContext
    from amflow.steps import decode as decode_step

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "lexicon.txt").write_text("a AH\n")
    cfg = local_cfg(f"data.corpus={corpus}")
    ctx = decode_step._context(StepContext(cfg, "r", "decode"))
    model = ctx.other("train", "model.pt")
    ctx.storage.write_bytes(model, b"model one")
    ctx.storage.write_text(ctx.other("lm", "lm.arpa"), "\\data\\\n")
    out = ctx.path("result.json")
    ctx.storage.write_json(out, {"wer": 0.1})

    def finished(*sets):
        c = decode_step._context(StepContext(local_cfg(f"data.corpus={corpus}", *sets), "r",
                                             "decode"))
        return c.finished_on(decode_step.decode_inputs(c, model, str(corpus), "test"), out)

    ctx.finish(inputs=decode_step.decode_inputs(ctx, model, str(corpus), "test"),
               counts={"in": 1, "out": 1}, metrics={}, extra={"out": out})
    assert finished() is not None and finished("decode.workers=1") is not None
    assert finished("decode.beam=12") is None
    (corpus / "_SUCCESS.json").write_text("{}")  # the corpus made again by amflow
    assert finished() is None
    (corpus / "_SUCCESS.json").unlink()
    assert finished() is not None
    ctx.storage.write_bytes(model, b"model two")  # trained again, the same URI
    assert finished() is None
    assert ctx.storage.read_json(ctx.path(SUCCESS))["inputs"]["model_digest"] != \
        ctx.storage.digest(model)


@pytest.mark.slow
def test_oracle_posteriors_decode_the_tiny_corpus(tiny_corpus, tmp_path):
    """One-hot posteriors from the reference alignment decode to the transcripts:
    lexicon, LM (generator text, never the test transcripts) and graph are right."""
    from core.config import FeaturesConfig
    from decoding.decode import split_records
    from tasks import alignments as al
    from tasks.corpus import LEXICON_REPORT
    from tasks.fbank import FbankComputer

    report = json.loads((tiny_corpus / LEXICON_REPORT).read_text())
    assert report["labeled"]["share"] >= 0.9
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    classes = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    model = lm.estimate(lm.generator_sentences(3000, 5), 3, vocabulary=lex.prons)
    graph = G.build_graph(lex, model.to_arpa(), classes)
    aligns, _ = al.read_ctm((tiny_corpus / "alignments.ctm").read_text())
    from core.config import load_config
    from core.runs import StepContext

    ctx = StepContext(load_config(None, [f"storage.root={tmp_path}"]), "r", "decode")
    recs, _ = split_records(ctx.storage, str(tiny_corpus), "test")
    fcfg = FeaturesConfig()
    ids = {p: i for i, p in enumerate(classes)}
    search = Searcher(graph, beam=12)
    scores = []
    for r in recs:
        a = aligns[r.utt_id]
        n100 = FbankComputer(fcfg).num_frames(int(round(r.duration * 16000)))
        fl, _, _ = al.frame_labels_ids(a.starts, a.ends, np.array([ids[p] for p in a.phones]),
                                       n100, fcfg)
        rows = al.lfr_labels(fl, n100 // 3, 3, 3)
        lp = oracle_log_posteriors(rows, len(classes))
        words, _, _ = search.best_words(acoustic_scores(lp, log_priors(np.ones(len(classes))), 1.0))
        scores.append(W.score(L.words_of(r.text), words, r.condition))
    assert W.aggregate(scores)["wer"] <= 0.05


def test_featurize_rejects_an_utterance_without_audio(tmp_path):
    from core.config import StorageConfig
    from core.storage import Storage
    from decoding.decode import featurize
    from tasks.select import read_records
    from tests.test_select import make_corpus

    make_corpus(tmp_path / "corpus", speakers=2, utts=2, labeled=1)
    missing = tmp_path / "corpus" / "audio" / "spk0_00" / "spk0_00_u01.wav"
    missing.unlink()
    st = Storage(StorageConfig(root=str(tmp_path)))
    records, _, _ = read_records(st, str(tmp_path / "corpus"))
    card = ModelCard(spec={"input_dim": 192}, features={}, cmvn=None)
    feats, rejects, audio_s = featurize(st, str(tmp_path / "corpus"), records, card)
    assert [r.utt_id for r in rejects] == ["spk0_00_u01"] and rejects[0].reason
    assert len(feats) == 3 and all(x.shape[1] == 192 for _, x in feats) and audio_s > 0


@pytest.mark.parametrize("order", [("kaldilm", "kaldifst", "kaldi_decoder", "kaldialign", "torch"),
                                   ("torch", "kaldi_decoder", "kaldifst", "kaldialign", "kaldilm")])
def test_the_decoding_wheels_import_in_any_order(order):
    """Some k2-fsa wheel sets hang or refuse each other's FSTs depending on import order:
    the pinned set imports both ways and decodes a graph built by kaldifst."""
    import subprocess
    import sys

    code = "; ".join(f"import {m}" for m in order) + (
        "; f = kaldifst.compile('0 1 1 1 0\\n1 1 1 0 0\\n1 0'); import numpy as np"
        "; d = kaldi_decoder.FasterDecoder(f, kaldi_decoder.FasterDecoderOptions())"
        "; d.decode(kaldi_decoder.DecodableCtc(np.zeros((3, 1), np.float32)))"
        "; ok, lat = d.get_best_path(); print(ok, kaldifst.get_linear_symbol_sequence(lat)[2])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "[1]"]


def test_model_card_round_trips_the_model_file_metadata_key_for_key():
    """The card is the model file's metadata: to_meta gives back the payload's keys in
    the file's order (so model.pt bytes do not change), and load_model_card agrees."""
    import dataclasses
    import tempfile

    import torch

    from core.config import FeaturesConfig, StorageConfig
    from core.storage import Storage
    from training.checkpoint import from_bytes, load_model_card, model_payload, save_model
    from training.models import StudentLSTM
    from training.priors import attach_priors

    torch.manual_seed(0)
    model = StudentLSTM(8, 4, 1, 3, lookahead=1)
    kw = dict(cmvn={"count": 2, "sum": [1.0] * 8, "sumsq": [3.0] * 8}, phones=["a", "b", "sil"],
              features=dataclasses.asdict(FeaturesConfig()), info={"run_id": "r"})
    payload = model_payload(model, **kw)
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    assert list(payload) == ["format", "spec", "state_dict", "cmvn", "phones", "features", "info"]
    assert ModelCard.from_meta(meta).to_meta() == meta
    assert list(ModelCard.from_meta(meta).to_meta()) == list(meta)
    with tempfile.TemporaryDirectory() as d:
        st, uri = Storage(StorageConfig(root=d)), f"{d}/model.pt"
        save_model(st, uri, model, **kw)
        attach_priors(st, uri, np.array([1.0, 2.0, 3.0]), "training targets")
        _, card = load_model_card(st, uri)
        on_disk = {k: v for k, v in from_bytes(st.read_bytes(uri), weights_only=True).items()
                   if k != "state_dict"}
    assert card.to_meta() == on_disk and list(card.to_meta()) == list(on_disk)
    assert card.kind == "student" and card.priors["counts"] == [1.0, 2.0, 3.0]


def test_decode_workers_are_capped_at_the_clusters_cpus():
    # ActorPool gives every actor a shard at once: an actor Ray cannot place would hang it
    from core.runs import StepError
    from decoding.decode import _workers_that_fit

    assert _workers_that_fit(4, {"CPU": 1.0}) == 1
    assert _workers_that_fit(2, {"CPU": 8.0}) == 2
    with pytest.raises(StepError, match="no CPU"):
        _workers_that_fit(2, {"GPU": 1.0})


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_built_graph_is_kept_once_and_leaves_no_temp_dir(where, tmp_path, monkeypatch, request):
    """The graph cache: one copy under graph_root (and, for S3, one in this machine's
    cache, where the next decode finds it); the build's temp dir is gone either way."""
    import os
    import tempfile

    from core.config import load_config
    from core.storage import Storage
    from decoding.assets import GRAPH_FILES, ensure_graph

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    if where == "s3":
        bucket, overrides = request.getfixturevalue("s3_bucket")
        storage, root = Storage(load_config(None, overrides).storage), f"s3://{bucket}/graphs"
    else:
        storage, root = Storage(), str(tmp_path / "graphs")
    arpa = lm.estimate(_sentences(), 3).to_arpa()
    args = (storage, root, L.read_lexicon(LEXICON), LEXICON, arpa, CLASSES, 0.5)
    local, _ = ensure_graph(*args)
    assert set(os.listdir(local)) == set(GRAPH_FILES)
    cache = root if where == "local" else str(tmp_path / "tmp" / "amflow-graph")
    assert local.startswith(cache)
    assert [d for d in os.listdir(tmp_path / "tmp") if d.startswith("amflow-graph-")] == []
    assert ensure_graph(*args)[0] == local


def test_acwt_at_the_grid_edge_is_a_warning(caplog):
    from decoding.decode import warn_grid_edge

    rows = [{"acwt": a, "wer": w} for a, w in ((0.2, 0.30), (0.3, 0.25), (0.5, 0.28))]
    with caplog.at_level("WARNING", logger="decoding.decode"):
        assert warn_grid_edge(rows, 0.3, "dev") == ""
        assert warn_grid_edge([dict(r, wer=0.1) for r in rows], 0.2, "dev") == ""  # all tie
        assert not caplog.records
        assert warn_grid_edge(rows[::-1], 0.5, "dev") == "highest"
        assert warn_grid_edge(rows, 0.2, "dev") == "lowest"
    assert "acwt 0.5 (WER 28.00 % on dev) is the highest of decode.acwt [0.2, 0.3, 0.5]" \
        in caplog.text and "add e.g. 0.75" in caplog.text and "add e.g. 0.133" in caplog.text


def test_a_decode_below_ray_inline_hours_runs_in_the_step_and_gives_the_same_words(
        tiny_corpus, tmp_path, monkeypatch):
    """ray.inline_hours above the test and dev splits' audio: the decode's workers run in
    the step's own process (no actor started), with the same words and WER as on Ray."""
    from amflow.steps import decode as step
    from core.config import load_config
    from core.runs import StepContext
    from decoding import decode as D
    from tests.test_export import write_student_run

    run = write_student_run(tmp_path, tiny_corpus)
    words, where = {}, {}
    for tag, hours in (("ray", 0.0), ("inline", 100.0)):
        cfg = load_config(None, [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}",
                                 "decode.acwt=[0.5,1.0]", f"decode.tag={tag}",
                                 f"ray.inline_hours={hours}", "ray.num_cpus=2"])
        ctx = StepContext(cfg, "r", "decode")
        pools = []

        def spy(*args, _real=D.Pool, **kw):
            pools.append(_real(*args, **kw))
            return pools[-1]

        with monkeypatch.context() as m:
            m.setattr(D, "Pool", spy)
            step.run(ctx, SimpleNamespace(split="test", model=str(run / "train" / "model.pt"),
                                          data=None, out=None))
        where[tag] = pools[0].local is not None
        result = json.loads((run / f"decode-{tag}" / "result.json").read_text())
        hyps = [json.loads(line) for line in
                (run / f"decode-{tag}" / "hyps.jsonl").read_text().splitlines()]
        words[tag] = (result["wer"], result["acwt"],
                      sorted((h["utt_id"], h["hyp"]) for h in hyps))
    assert where == {"ray": False, "inline": True}
    assert words["inline"] == words["ray"] and any(h for _, h in words["ray"][2])
