"""Context-dependent network classes: the network tree as plain data, the triphone context
transducer C, the H o C o L o G graph, labels from `amflow align` in features."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import kaldi_hmm_gmm  # noqa: F401  first: OpenFST import-order trap (alignment/__init__.py)
import kaldifst

from core.config import ConfigError, load_config
from core.senones import ContextTree, fit_frames
from decoding import lexicon as L
from decoding import lm
from decoding.context import build_cd_graph, context_fst_text
from decoding.search import Searcher, acoustic_scores, log_priors, oracle_log_posteriors

PHONES = ["<eps>", "sil", "a", "b", "k"]
LEXICON = "ab a b\nba b a\nk k\n"   # a 3-word toy lexicon


def _full_tree() -> ContextTree:
    """Every (left, phone, right) of a, b, k its own leaf; silence one leaf: a tree that
    tells every context apart, so C's contexts can be read off the leaves."""
    ctx = [1, 2, 3, 4]
    count = [1]

    def leaf() -> int:
        count[0] += 1
        return count[0] - 1

    def rights(rs: list[int]) -> object:
        return leaf() if len(rs) == 1 else [2, [rs[0]], leaf(), rights(rs[1:])]

    def lefts(ls: list[int]) -> object:
        return rights(ctx) if len(ls) == 1 else [0, [ls[0]], rights(ctx), lefts(ls[1:])]

    roots: dict[int, object] = {1: 0}
    for p in (2, 3, 4):
        roots[p] = lefts(ctx)
    return ContextTree(PHONES, roots, count[0])


def _decode_leaves(tree: ContextTree, phones: list[str], seq: list[str]) -> list[int]:
    """C composed with the phone string `seq`: the class sequence it emits."""
    C = kaldifst.compile(context_fst_text(tree, phones))
    pid = {p: i + 1 for i, p in enumerate(phones)}
    lines = [f"{i} {i + 1} {pid[p]} {pid[p]}" for i, p in enumerate(seq)] + [f"{len(seq)}"]
    A = kaldifst.compile("\n".join(lines) + "\n")
    kaldifst.arcsort(C, sort_type="olabel")
    out = kaldifst.compose(C, A)
    kaldifst.connect(out)
    assert out.num_states > 0
    ok, ilabels, _, _ = kaldifst.get_linear_symbol_sequence(out)
    assert ok
    return [i - 1 for i in ilabels if i]


def test_the_full_tree_tells_every_triphone_apart():
    t = _full_tree()
    leaves = {t.leaf(a, p, r) for p in ("a", "b", "k") for a in PHONES[1:] for r in PHONES[1:]}
    assert len(leaves) == 48 and t.num_leaves == 49 and t.leaf("a", "sil", "b") == 0
    assert ContextTree.from_dict(t.to_dict()) == t
    assert t.leaf_phone[0] == "sil" and t.leaf_phone[t.leaf("k", "a", "b")] == "a"
    assert [t.center_phones[i] for i in t.leaf_center] == t.leaf_phone


def test_context_transducer_path_contexts_right_and_boundaries_silence():
    t = _full_tree()
    phones = t.center_phones
    assert phones == ["sil", "a", "b", "k"]
    # "ab k" without silence between the words: the context crosses the word boundary
    got = _decode_leaves(t, phones, ["a", "b", "k"])
    assert got == [t.leaf("sil", "a", "b"), t.leaf("a", "b", "k"), t.leaf("b", "k", "sil")]
    got = _decode_leaves(t, phones, ["sil", "b", "a", "sil"])
    assert got == [0, t.leaf("sil", "b", "a"), t.leaf("b", "a", "sil"), 0]


def test_context_transducer_refuses_phones_without_classes():
    with pytest.raises(ValueError, match="no classes"):
        context_fst_text(_full_tree(), ["sil", "a", "z"])


def test_cd_graph_decodes_toy_posteriors_to_the_words():
    t = _full_tree()
    sents = [s.split() for s in ["ab k", "ba ab", "k ba", "ab ba k"] * 3]
    graph = build_cd_graph(L.read_lexicon(LEXICON), lm.estimate(sents, 2).to_arpa(), t)
    assert graph.info["classes"] == t.num_leaves and graph.info["context"] == "triphone"
    seq = [("sil", "sil", "b"), ("sil", "b", "a"), ("b", "a", "a"), ("a", "a", "b"),
           ("a", "b", "k"), ("b", "k", "sil"), ("k", "sil", "sil")]
    labels = np.repeat([t.leaf(*c) for c in seq], 2)
    lp = oracle_log_posteriors(labels, t.num_leaves)
    words = Searcher(graph, beam=15).best_words(
        acoustic_scores(lp, log_priors(np.ones(t.num_leaves)), 1.0))[0]
    assert words == ["ba", "ab", "k"]


def test_a_tree_without_questions_decodes_on_the_phone_graph():
    """One leaf per phone (the demo's tree): no C, H o L o G over the leaves' phones, and
    the leaves' posteriors decode to the words."""
    from decoding.assets import _build

    t = ContextTree(PHONES, {1: 0, 2: 2, 3: 1, 4: 3}, 4)     # leaf ids need not follow phones
    assert t.context_free and not _full_tree().context_free
    sents = [s.split() for s in ["ab k", "ba ab", "k ba", "ab ba k"] * 3]
    graph = _build(L.read_lexicon(LEXICON), lm.estimate(sents, 2).to_arpa(), t.class_names,
                   0.5, t.to_dict())
    assert graph.info["classes"] == 4 and graph.info.get("context") != "triphone"
    labels = np.repeat([t.leaf_ids(0, p, 0) for p in (1, 3, 2, 2, 3, 4, 1)], 2)
    lp = oracle_log_posteriors(labels, 4)
    words = Searcher(graph, beam=15).best_words(acoustic_scores(lp, log_priors(np.ones(4)),
                                                                1.0))[0]
    assert words == ["ba", "ab", "k"]


def test_fit_frames_pads_trims_within_tolerance_and_refuses_beyond():
    lab = np.array([3, 3, 5, 5, 7], np.int16)
    assert fit_frames(lab, 6, 2)[0].tolist() == [3, 3, 5, 5, 7, 7]
    assert fit_frames(lab, 4, 2)[0].tolist() == [3, 3, 5, 5]
    got, why = fit_frames(lab, 9, 2)
    assert got is None and "5 frames" in why and "9" in why


def test_labels_key_is_validated_by_name():
    with pytest.raises(ConfigError, match="features.labels"):
        load_config(None, ["features.labels=senones"])
    with pytest.raises(ConfigError, match="align.nn_senones"):
        load_config(None, ["align.nn_senones=-1"])


# ----------------------------------------------------------------- downstream on the classes
def test_features_take_align_labels_and_reject_gross_mismatches():
    from core.config import FeaturesConfig
    from tasks.features import ShardFeaturizer

    lab = (np.arange(30) // 4).astype(np.int16)
    fz = ShardFeaturizer(FeaturesConfig(labels="align"), "s0", {}, {},
                         frame_align={"u1": lab, "u2": lab[:20]})
    ok, rows, frames = fz._labels({"utt_id": "u1", "split": "labeled"}, 31, 10)
    assert ok and len(frames) == 31 and frames[-1] == lab[-1]      # padded by one frame
    assert rows.tolist() == frames[[1, 4, 7, 10, 13, 16, 19, 22, 25, 28]].tolist()
    ok, rows, frames = fz._labels({"utt_id": "u1", "split": "dev"}, 29, 9)
    assert ok and len(frames) == 29                                 # trimmed by one
    assert fz._labels({"utt_id": "u2", "split": "labeled"}, 31, 10)[0] is False
    assert fz._labels({"utt_id": "u3", "split": "labeled"}, 31, 10)[0] is False
    assert fz._labels({"utt_id": "u3", "split": "dev"}, 31, 10) == (True, None, None)
    assert [(r.utt_id, r.reason) for r in fz.rejects] == [("u2", "alignment_mismatch"),
                                                          ("u3", "missing_alignment")]
    assert "20 frames" in fz.rejects[0].detail and "31" in fz.rejects[0].detail


def test_phone_error_rate_of_context_dependent_classes_is_over_phones():
    from training.evaluate import score_utterance

    to_phone = np.array([0, 1, 1, 2])         # classes 1 and 2 are one phone in two contexts
    ref = np.array([0, 1, 1, 3, 3])
    pred = np.array([0, 2, 2, 3, 3])
    s = score_utterance(pred, ref, "c", silence=0, to_phone=to_phone)
    assert s.correct == 3 and s.edits == 0 and s.ref_phones == 3
    assert score_utterance(pred, ref, "c", silence=0).edits == 1


def test_leaf_classes_score_against_ctm_phones_through_the_leaf_map():
    """evaluate_model(phone_refs=True): references are phone ids (the corpus CTM's), each
    predicted leaf is read as its phone, so a leaf model and a phone model share a scale."""
    import torch

    from training.evaluate import EvalUtt, evaluate_model

    class Fixed(torch.nn.Module):  # scores class `target[t]` highest at row t
        input_dim = 1

        def forward(self, x, lengths=None):
            return torch.nn.functional.one_hot(x[..., 0].long(), 4).float()

    to_phone = np.array([0, 1, 1, 2])          # leaves 1 and 2: one phone, two contexts
    leaves = np.array([0, 2, 1, 3, 3])
    utt = EvalUtt("u", "DP1", leaves[:, None].astype(np.float32), np.array([0, 1, 1, 2, 2]))
    res = evaluate_model(Fixed(), [utt], silence=0, to_phone=to_phone, phone_refs=True)
    assert res["frame_accuracy"] == 1.0 and res["per"] == 0.0
    res = evaluate_model(Fixed(), [utt], silence=0)          # the leaves read as phone ids
    assert res["frame_accuracy"] < 1.0


def test_smbr_counts_a_class_right_by_its_phone():
    import torch

    from training.sequence import SequenceCriterion, graph_from_arcs, smbr_loss

    labels = torch.tensor([[1, 1, 0, 2, 2, 2]])
    logits = torch.randn(1, 6, 3, generator=torch.Generator().manual_seed(5),
                         dtype=torch.float64)
    # a one-path denominator through class 2 where the reference has class 1
    path = [1, 1, 0, 2, 2, 2]
    path[0] = path[1] = 2
    chain = graph_from_arcs(7, [(t, t + 1, c, 0.0) for t, c in enumerate(path)],
                            {0: 0.0}, {6: 0.0})
    assert abs(smbr_loss(logits, labels, chain, leaky=0.0, ce_weight=0.0).objective
               - 4 / 6) < 1e-9
    crit = SequenceCriterion.from_labels([np.array(path)], 3, load_config(None).train.sequence,
                                         class_phone=np.array([0, 1, 1]))
    out = smbr_loss(logits, labels, chain, leaky=0.0, ce_weight=0.0,
                    same_phone=crit.same_phone.double())
    assert abs(out.objective - 1.0) < 1e-9   # classes 1 and 2 share a phone: all right


# ----------------------------------------------------------------- transcripts only, end to end
TINY_CHAIN = [
    "select.hours=0.004", "select.splits=labeled,dev,test", "align.splits=labeled,dev",
    "align.use_ray=false", "align.mono_iters=4", "align.tri_iters=2", "align.num_senones=250",
    "align.tri_gauss=400", "align.mono_gauss=300", "align.nn_senones=80",
    "align.min_leaf_count=20", "features.labels=align", "ray.num_cpus=2",
    "train.model=teacher", "train.regime=labeled", "train.tag=teacher", "decode.tag=teacher",
    "evaluate.tag=teacher",
    "train.epochs=1", "train.finetune_epochs=0", "train.threads=1",
    "train.phone_weight=0.5",  # the phone-level criterion beside the senones' (CD classes)
    "train.grow_preset.epochs=1",  # the embedded default grows (train.grow): one epoch
    "train.minibatch_frames=256", "train.chunk_frames=16", "train.teacher_preset={}",
    "model.teacher.layers=1", "model.teacher.hidden=16", "lm.sentences=300",
    "decode.acwt=[0.5]", "decode.tune_split=", "decode.workers=1"]


@pytest.mark.slow  # 170 s measured on the 2 shared cores under load (~14 s of its own CPU)
def test_a_corpus_without_alignments_goes_from_transcripts_to_words(tiny_corpus, tmp_path,
                                                                  ray_local, monkeypatch):
    """alignments.ctm removed: select -> align -> features (labels=align) -> repartition ->
    teacher -> evaluate -> lm -> decode (the teacher DAG's chain), with no error and a
    result.json (the CLI, in this process, on the session's Ray)."""
    import json
    import shutil

    from amflow.cli import main
    from tests.conftest import ROOT

    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus)
    (corpus / "alignments.ctm").unlink()
    sets = [f"storage.root={tmp_path / 'store'}", f"data.corpus={corpus}", *TINY_CHAIN]
    reads = _count_reads(monkeypatch)
    for step in ("select", "align", "features", "repartition", "train", "evaluate", "lm",
                 "decode"):
        argv = [step, "--config", str(ROOT / "configs" / "local.yaml"), "--run-id", "r"]
        argv += (["--split", "test"] if step == "decode" else [])
        for s in sets:
            argv += ["--set", s]
        reads.clear()
        assert main(argv) == 0, step
    run = tmp_path / "store" / "runs" / "r"
    # decode read its model, LM and lexicon once each: the digests it keeps are of the
    # bytes it decoded with
    assert {u.rsplit("/", 1)[-1]: n for u, n in reads.items()
            if u.endswith(("model.pt", "lm.arpa", "lexicon.txt"))} == \
        {"model.pt": 1, "lm.arpa": 1, "lexicon.txt": 1}
    tree = ContextTree.from_dict(json.loads((run / "features" / "context.json").read_text()))
    assert json.loads((run / "features" / "phones.json").read_text()) == tree.class_names
    # the embedded default's train.grow: a phone stage first where the tree asks questions
    trained = json.loads((run / "train-teacher" / "_SUCCESS.json").read_text())["metrics"]
    assert trained["grown"] == (not tree.context_free)
    res = json.loads((run / "decode-teacher" / "result.json").read_text())
    assert res["utterances"] >= 1 and 0 <= res["wer"] <= 1.5
    # the test split has no frame reference (no CTM, not aligned): PER by its transcripts
    ev = json.loads((run / "evaluate-teacher" / "result.json").read_text())
    assert ev["reference"] == "transcript" and ev["frame_accuracy"] is None
    # (a one-epoch model with 16 cells inserts phones freely: PER can pass 100 %)
    assert ev["num_utterances"] >= 1 and ev["ref_phones"] > 0 and np.isfinite(ev["per"])
    # a student's run (targets.teacher) takes its teacher run's alignments: no GMM trains
    student = [f"targets.teacher={run / 'train-teacher' / 'model.pt'}"]
    for step in ("select", "align"):
        argv = [step, "--config", str(ROOT / "configs" / "local.yaml"), "--run-id", "s"]
        for s in [*sets, *student]:
            argv += ["--set", s]
        assert main(argv) == 0, step
    took = json.loads((run.parent / "s" / "align" / "_SUCCESS.json").read_text())
    assert took["metrics"]["alignments_from"] == str(run / "align")
    assert took["counts"] == json.loads((run / "align" / "_SUCCESS.json").read_text())["counts"]


def _count_reads(monkeypatch) -> Counter:
    """Every Storage.read_bytes from now on, counted by URI."""
    from core.storage import Storage

    reads: Counter = Counter()
    plain = Storage.read_bytes

    def counted(self, uri):
        reads[str(uri)] += 1
        return plain(self, uri)

    monkeypatch.setattr(Storage, "read_bytes", counted)
    return reads


def test_model_card_carries_the_tree_only_for_context_dependent_classes():
    from core.model_card import ModelCard, context_info

    t = _full_tree()
    card = ModelCard.from_meta({"spec": {"kind": "teacher", "num_classes": t.num_leaves},
                                "phones": t.class_names, "info": context_info(t.to_dict())})
    assert card.context == t.to_dict() and card.base_phones == ["sil", "a", "b", "k"]
    plain = ModelCard.from_meta({"spec": {"kind": "teacher"}, "phones": ["a", "sil"],
                                 "info": context_info(None)})
    assert plain.context is None and plain.base_phones == ["a", "sil"] and plain.info == {}
