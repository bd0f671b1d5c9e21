"""Baum-Welch statistics: forward-backward over an utterance's training graph.

Viterbi training (Kaldi's gmm-acc-stats-ali) gives every frame to one state, so from a
flat start the equal alignment's boundaries decide what the first models learn. HTK
trains its flat start with Baum-Welch instead (HERest): every frame is shared among the
states by its posterior. kaldi-hmm-gmm aligns but gives no forward-backward from Python,
so it is written here on the graph's arcs in NumPy, one vectorised step per frame
(`align.baum_welch_passes`; what it does to the flat start: alignment/README.md).
training/sequence.py's torch forward-backward gives the same occupancies (a test checks
it) but took 2.7x these recursions' time at its best batch size, so both stay.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import kaldifst
import numpy as np

from alignment import gmm


@dataclass
class ArcGraph:
    """An epsilon-free training graph as arrays: arc a goes src[a] -> dst[a], consumes
    transition id tid[a] at cost[a] (-log probability); final[s] is state s's final cost."""
    start: int
    src: np.ndarray
    dst: np.ndarray
    tid: np.ndarray
    cost: np.ndarray
    final: np.ndarray

    @classmethod
    def of(cls, graph: kaldifst.StdVectorFst) -> "ArcGraph":
        """The compiled graph (no transition probabilities: lexicon_graphs), its output
        labels dropped and its epsilons removed; `with_probs` adds a model's."""
        fst = _input_side(graph)
        kaldifst.rmepsilon(fst)
        src, dst, tid, cost = [], [], [], []
        final = np.full(fst.num_states, np.inf)
        for s in range(fst.num_states):
            final[s] = fst.final(s).value
            for a in kaldifst.ArcIterator(fst, s):
                src.append(s), dst.append(a.nextstate), tid.append(a.ilabel)
                cost.append(a.weight.value)
        return cls(fst.start, np.array(src, np.int64), np.array(dst, np.int64),
                   np.array(tid, np.int64), np.array(cost, np.float64), final)

    def with_probs(self, tm: khg.TransitionModel) -> "ArcGraph":
        """Each arc's cost plus its transition's -log probability, unscaled (the HMM's own
        probabilities, as Baum-Welch needs; what add_transition_probs adds at scales 1):
        epsilon arcs carry none, so this commutes with removing them."""
        log_probs = np.asarray(tm.log_probs, np.float64)
        return dataclasses.replace(self, cost=self.cost - log_probs[self.tid])


def _input_side(graph: kaldifst.StdVectorFst) -> kaldifst.StdVectorFst:
    """The graph with its output labels (words) dropped, so that rmepsilon removes every
    arc that consumes no frame (kaldifst has no project)."""
    out = kaldifst.StdVectorFst()
    for _ in range(graph.num_states):
        out.add_state()
    out.start = graph.start
    for s in range(graph.num_states):
        out.set_final(state=s, weight=graph.final(s))
        for a in kaldifst.ArcIterator(graph, s):
            out.add_arc(state=s, arc=kaldifst.StdArc(ilabel=a.ilabel, olabel=0,
                                                     weight=a.weight, nextstate=a.nextstate))
    return out


def arc_posteriors(g: ArcGraph, arc_loglikes: np.ndarray) -> tuple[np.ndarray, float]:
    """Posterior of every arc at every frame [T, A] and the total log-likelihood, given
    each arc's (scaled) acoustic log-likelihood per frame [T, A]. Scaled probabilities
    (Rabiner's), each frame's terms shifted by its best arc; where that underflows (a
    frame whose reachable arcs all lie ~460 nats below its best), log-domain recursions."""
    step = arc_loglikes - g.cost  # [T, A]
    shift = step.max(1, keepdims=True) if len(step) else np.zeros((0, 1))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        scaled = _scaled_posteriors(g, np.exp(step - shift))
    if scaled is not None:
        return scaled[0], scaled[1] + float(shift.sum())
    return _log_posteriors(g, step)


def _scaled_posteriors(g: ArcGraph, e: np.ndarray) -> tuple[np.ndarray, float] | None:
    num_frames, num_states = len(e), len(g.final)
    alpha = np.zeros((num_frames + 1, num_states))
    alpha[0, g.start] = 1.0
    norm = np.ones(num_frames)
    for t in range(num_frames):
        a = np.bincount(g.dst, alpha[t, g.src] * e[t], minlength=num_states)
        norm[t] = a.sum()
        if not norm[t] > 1e-200:  # underflow, or every path ended: the log domain tells
            return None
        alpha[t + 1] = a / norm[t]
    final = np.exp(-g.final)
    z = alpha[num_frames] @ final
    if not z > 1e-200:  # underflow, or no path: the log domain tells which
        return None
    beta = np.zeros((num_frames + 1, num_states))
    beta[num_frames] = final / z
    for t in range(num_frames - 1, -1, -1):
        beta[t] = np.bincount(g.src, beta[t + 1, g.dst] * e[t], minlength=num_states) / norm[t]
    post = alpha[:-1, g.src] * e * beta[1:, g.dst] / norm[:, None]
    if not np.allclose(post.sum(1), 1.0, atol=1e-6):  # overflow in beta: not trusted
        return None
    return post, float(np.log(norm).sum() + np.log(z))


def _log_posteriors(g: ArcGraph, step: np.ndarray) -> tuple[np.ndarray, float]:
    num_frames, num_states = len(step), len(g.final)
    alpha = np.full((num_frames + 1, num_states), -np.inf)
    alpha[0, g.start] = 0.0
    for t in range(num_frames):
        alpha[t + 1] = _logsum_into(alpha[t, g.src] + step[t], g.dst, num_states)
    beta = np.full((num_frames + 1, num_states), -np.inf)
    beta[num_frames] = -g.final
    for t in range(num_frames - 1, -1, -1):
        beta[t] = _logsum_into(beta[t + 1, g.dst] + step[t], g.src, num_states)
    total = _logsumexp(alpha[num_frames] - g.final)
    if not np.isfinite(total):
        raise ValueError("no path of the graph has this many frames")
    post = np.exp(alpha[:-1, g.src] + step + beta[1:, g.dst] - total)
    return post, float(total)


def _logsum_into(terms: np.ndarray, into: np.ndarray, size: int) -> np.ndarray:
    """log of the sum of exp(terms) per target state, each target's terms shifted by
    their own maximum (a state far below the frame's best keeps its mass)."""
    top = np.full(size, -np.inf)
    np.maximum.at(top, into, terms)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.bincount(into, np.exp(terms - shift[into]), minlength=size)) + shift


def _logsumexp(x: np.ndarray) -> float:
    top = x.max()
    return float(top + np.log(np.exp(x - top).sum())) if np.isfinite(top) else -np.inf


class _Sums:
    """Baum-Welch sums over the model's stacked Gaussians (gmm.PdfScorer's order)."""

    def __init__(self, scorer: gmm.PdfScorer, num_tids: int):
        num_gauss, dim = scorer.means_invvars.shape
        self.scorer = scorer
        self.occ, self.x = np.zeros(num_gauss), np.zeros((num_gauss, dim))
        self.x2 = np.zeros((num_gauss, dim))
        self.trans = np.zeros(num_tids + 1)
        self.loglike, self.frames = 0.0, 0

    def add(self, feats: np.ndarray, g: ArcGraph, pdf_of: np.ndarray, scale: float) -> bool:
        """One utterance's posteriors into the sums; False when no path fits its frames."""
        # only the pdfs the graph can visit: a monophone graph reaches a fraction of them
        pdfs, arc_pdf = np.unique(pdf_of[g.tid], return_inverse=True)
        sub, gauss = self.scorer.restricted(pdfs)
        comp, pdf_ll = sub.components(feats)
        try:
            post, total = arc_posteriors(g, scale * pdf_ll[:, arc_pdf])
        except ValueError:
            return False
        order = np.argsort(arc_pdf, kind="stable")
        cuts = np.searchsorted(arc_pdf[order], np.arange(len(pdfs)))
        state = np.add.reduceat(post[:, order], cuts, axis=1)  # [T, pdfs] occupancy
        pdf_of_gauss = np.repeat(np.arange(len(pdfs)), sub.sizes)
        w = np.exp(comp - pdf_ll[:, pdf_of_gauss]) * state[:, pdf_of_gauss]  # [T, G]
        x = np.asarray(feats, np.float64)
        self.occ[gauss] += w.sum(0)
        self.x[gauss] += w.T @ x
        self.x2[gauss] += w.T @ (x * x)
        self.trans += np.bincount(g.tid, post.sum(0), minlength=len(self.trans))
        self.loglike += total
        self.frames += len(feats)
        return True

    def stats(self) -> gmm.GmmStats:
        cuts = self.scorer.first[1:]
        return gmm.GmmStats(np.split(self.occ, cuts), np.split(self.x, cuts),
                            np.split(self.x2, cuts), self.trans, self.loglike, self.frames)


def accumulate(tm: khg.TransitionModel, am: khg.AmDiagGmm,
               utts: list[tuple[np.ndarray, ArcGraph]],
               acoustic_scale: float = 1.0) -> tuple[gmm.GmmStats, list[int]]:
    """Baum-Welch statistics over (features, ArcGraph.of(training graph)) pairs, in
    gmm.accumulate's layout: each pdf's Gaussians get every frame weighted by the pdf's
    state posterior times the Gaussian's share of the pdf, each transition id its
    expected count; loglike is the graphs' total log-likelihood at `acoustic_scale`.
    Also returns the indices of the utterances no path fits."""
    sums = _Sums(gmm.PdfScorer.of(am), tm.num_transition_ids)
    pdf_of = gmm.pdf_of_transitions(tm)
    failed = [i for i, (feats, graph) in enumerate(utts)
              if not sums.add(feats, graph.with_probs(tm), pdf_of, acoustic_scale)]
    return sums.stats(), failed
