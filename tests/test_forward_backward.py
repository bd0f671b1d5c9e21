"""Baum-Welch statistics (alignment/forward_backward.py) against brute force and Viterbi."""
from __future__ import annotations

import itertools

import kaldi_hmm_gmm  # noqa: F401  first: the OpenFST import-order trap (alignment/__init__.py)
import numpy as np
import pytest

from alignment import forward_backward as fb
from alignment import gmm
from alignment import lexicon_graphs as lg


def _enumerated_posteriors(g: fb.ArcGraph, loglikes: np.ndarray) -> tuple[np.ndarray, float]:
    """Every arc sequence of len(loglikes) from the start to a final state, summed."""
    num_frames, num_arcs = loglikes.shape
    post, paths = np.zeros((num_frames, num_arcs)), []
    for seq in itertools.product(range(num_arcs), repeat=num_frames):
        s, score = g.start, 0.0
        for t, a in enumerate(seq):
            if g.src[a] != s:
                break
            score += loglikes[t, a] - g.cost[a]
            s = g.dst[a]
        else:
            if np.isfinite(g.final[s]):
                paths.append((seq, score - g.final[s]))
    total = np.logaddexp.reduce([p[1] for p in paths])
    for seq, score in paths:
        post[np.arange(num_frames), seq] += np.exp(score - total)
    return post, float(total)


def test_arc_posteriors_are_the_sum_over_every_path():
    # a 3-state graph with self-loops, a skip and two final states
    g = fb.ArcGraph(start=0, src=np.array([0, 0, 1, 1, 2, 0]), dst=np.array([0, 1, 1, 2, 2, 2]),
                    tid=np.array([1, 2, 3, 4, 5, 6]),
                    cost=-np.log([0.5, 0.3, 0.6, 0.4, 0.9, 0.2]),
                    final=np.array([np.inf, 1.5, 0.1]))
    loglikes = np.random.default_rng(0).normal(size=(5, 6)) * 3
    post, total = fb.arc_posteriors(g, loglikes)
    want, want_total = _enumerated_posteriors(g, loglikes)
    assert total == pytest.approx(want_total, abs=1e-9)
    np.testing.assert_allclose(post, want, atol=1e-9)
    np.testing.assert_allclose(post.sum(1), 1.0)
    with pytest.raises(ValueError, match="no path"):
        fb.arc_posteriors(g, loglikes[:0])  # no final state is the start
    # a range no scaled probability holds: the log-domain recursions, the same sums
    wide = loglikes * 400
    post, total = fb.arc_posteriors(g, wide)
    want, want_total = _enumerated_posteriors(g, wide)
    assert total == pytest.approx(want_total, rel=1e-9)
    np.testing.assert_allclose(post, want, atol=1e-9)


def test_soft_statistics_count_each_frame_once_and_are_viterbis_on_a_sharp_model():
    prons = {"a": [("ah", "b")], "cat": [("k", "ah", "t")], "the": [("dh", "ah"), ("dh", "iy")]}
    lang = lg.make_lang(prons)
    topo = lg.topology(lang)
    tree = gmm.monophone_tree(topo)
    tm = gmm.khg.TransitionModel(ctx_dep=tree, hmm_topo=topo)
    gc = lg.graph_compiler(lang, tm, tree, lg.lexicon_fst(lang))
    graph = gc.compile_graph_from_text(lg.word_ids(lang, ["the", "cat", "a"])[0])
    ali = gmm.equal_align(graph, 90)
    rng = np.random.default_rng(1)
    means = rng.normal(size=(tm.num_pdfs, 6)) * 4   # every pdf far from the others
    am = gmm.khg.AmDiagGmm()
    for m in means:
        am.add_pdf(gmm.single_gaussian(m, np.ones(6)))
    pdf_of = gmm.pdf_of_transitions(tm)
    feats = (means[pdf_of[ali]] + 0.05 * rng.normal(size=(90, 6))).astype(np.float32)

    # the transition probabilities added to the arrays are add_transition_probs' at scale 1
    arcs = fb.ArcGraph.of(graph)
    with_fst = graph.copy()
    gmm.khg.add_transition_probs(trans_model=tm, transition_scale=1.0, self_loop_scale=1.0,
                                 fst=with_fst)
    want = fb.ArcGraph.of(with_fst)
    np.testing.assert_allclose(arcs.with_probs(tm).cost, want.cost, atol=1e-5)
    np.testing.assert_array_equal(arcs.tid, want.tid)

    soft, failed = fb.accumulate(tm, am, [(feats, arcs)])
    hard = gmm.accumulate(tm, am, [(feats, ali)])
    assert failed == [] and soft.frames == 90
    assert sum(o.sum() for o in soft.occ) == pytest.approx(90)
    assert soft.trans.sum() == pytest.approx(90)
    for j in range(tm.num_pdfs):  # the posterior is the drawn path's: a sharp model
        np.testing.assert_allclose(soft.occ[j], hard.occ[j], atol=1e-3)
        np.testing.assert_allclose(soft.x[j], hard.x[j], atol=1e-2)
    np.testing.assert_allclose(soft.trans, hard.trans, atol=1e-3)
    # too few frames for any path: reported, not raised
    _, failed = fb.accumulate(tm, am, [(feats[:5], arcs), (feats, arcs)])
    assert failed == [0]


def test_the_sequence_criterions_forward_backward_gives_the_same_occupancies():
    """training/sequence.py's torch recursions (sMBR / MMI) and these NumPy ones are two
    pieces for one computation (kept apart for speed: alignment/README.md); they agree,
    batched with padding too."""
    import torch

    from training import sequence

    g = fb.ArcGraph(start=0, src=np.array([0, 0, 1, 1, 2, 0]), dst=np.array([0, 1, 1, 2, 2, 2]),
                    tid=np.array([1, 2, 3, 4, 5, 6]),
                    cost=-np.log([0.5, 0.3, 0.6, 0.4, 0.9, 0.2]),
                    final=np.array([np.inf, 1.5, 0.1]))
    rng = np.random.default_rng(2)
    lengths = [7, 4]
    x = torch.zeros(2, 7, 7, dtype=torch.float64)  # per frame, a log-likelihood per tid
    for b, n in enumerate(lengths):
        x[b, :n, 1:] = torch.from_numpy(rng.normal(size=(n, 6)) * 3)
    x.requires_grad_(True)
    one = sequence.Graph(3, *(torch.from_numpy(a)[None] for a in (g.src, g.dst, g.tid)),
                         torch.from_numpy(-g.cost)[None],
                         torch.tensor([[0.0, -np.inf, -np.inf]], dtype=torch.float64),
                         torch.from_numpy(-g.final)[None])
    logz = sequence.log_partition(x, torch.tensor(lengths), one, method="arcs")
    logz.sum().backward()
    for b, n in enumerate(lengths):
        post, total = fb.arc_posteriors(g, x[b, :n].detach().numpy()[:, g.tid])
        per_tid = np.zeros((n, 7))
        np.add.at(per_tid, (slice(None), g.tid), post)
        assert float(logz[b].detach()) == pytest.approx(total, abs=1e-9)
        np.testing.assert_allclose(x.grad[b, :n].numpy(), per_tid, atol=1e-9)
        assert float(x.grad[b, n:].abs().sum()) == 0.0  # the padding takes no mass
