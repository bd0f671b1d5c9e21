"""Beam search over the decoding graph with kaldi-decoder.

    acoustic_scores(log_posteriors, log_priors, acwt) -> float32 [T, C]
        acwt x (log posterior - log prior): the hybrid model's scaled log-likelihoods
        (Bayes: p(x|c) is proportional to p(c|x) / p(c)).
    Searcher(graph, beam, max_active).best_words(scores) -> (word ids, graph cost)
        FasterDecoder over DecodableCtc (which reads column i-1 for graph label i, the
        labelling decoding.graph uses) and the 1-best path's output labels; a fresh
        decoder per utterance, so an utterance's words never depend on what was decoded
        before it.
    Searcher.best_path(scores) -> BestPath   the same search, with the path's costs apart
        (graph: LM + pronunciation + silence; acoustic: the scaled scores) and its class
        per frame (pseudo-label confidences and scores: decoding/pseudolabel.py)
    log_priors(counts) -> float32 [C]   smoothed class log-priors from counts
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PRIOR_FLOOR = 1e-5  # classes never seen in training still get a finite prior


def log_priors(counts: np.ndarray) -> np.ndarray:
    p = np.asarray(counts, dtype=np.float64)
    if p.sum() <= 0:
        raise ValueError("class counts sum to zero: no priors")
    p = p / p.sum()
    p = np.maximum(p, PRIOR_FLOOR)
    return np.log(p / p.sum()).astype(np.float32)


def acoustic_scores(log_post: np.ndarray, log_prior: np.ndarray, acwt: float) -> np.ndarray:
    return np.ascontiguousarray(acwt * (log_post - log_prior), dtype=np.float32)


class Searcher:
    def __init__(self, graph, beam: float = 13.0, max_active: int = 7000,
                 min_active: int = 20):
        import kaldi_decoder

        self.opts = kaldi_decoder.FasterDecoderOptions()
        self.opts.beam = float(beam)
        self.opts.max_active = int(max_active)
        self.opts.min_active = int(min_active)
        self.graph = graph
        kaldi_decoder.FasterDecoder(graph.fst, self.opts)  # bad options fail here, not later

    def best_words(self, scores: np.ndarray) -> tuple[list[str], float, bool]:
        """(words, cost of the best path, reached a final state)."""
        p = self.best_path(scores)
        return p.words, p.cost, p.final

    def best_path(self, scores: np.ndarray) -> "BestPath":
        """The 1-best path: its words, its two costs, its class per frame."""
        import kaldi_decoder
        import kaldifst

        # A decoder reused across utterances keeps its token hash at the largest size any
        # earlier utterance needed; the hash's size orders the tokens, the order the float
        # sums and so which tokens max_active keeps: the same posteriors then decoded to
        # other words after other utterances (the demo's SSL student, spk013-00089: two
        # hypotheses, 16.59 against 16.56 % test WER for bitwise the same model, by which
        # utterances each decode actor searched first). A decoder costs microseconds.
        decoder = kaldi_decoder.FasterDecoder(self.graph.fst, self.opts)
        decoder.decode(kaldi_decoder.DecodableCtc(np.ascontiguousarray(scores, np.float32)))
        final = bool(decoder.reached_final())
        ok, lattice = decoder.get_best_path()
        if not ok:
            return BestPath([], float("inf"), float("inf"), final, ok=False)
        ok, ilabels, olabels, weight = kaldifst.get_linear_symbol_sequence(lattice)
        words = [self.graph.words[o] for o in olabels if o]
        graph_cost, am_cost = ((float(weight.value1), float(weight.value2))
                               if hasattr(weight, "value1") else (0.0, 0.0))
        # graph label i is class i - 1 (DecodableCtc's column i - 1); one label per frame
        classes = np.asarray(ilabels, np.int64) - 1
        return BestPath(words, graph_cost, am_cost, final, classes=classes)


@dataclass
class BestPath:
    words: list[str]
    graph_cost: float  # -log of the graph's weights on the path (LM, lexicon, silence)
    am_cost: float  # -sum of the acoustic scores on the path (acwt-scaled, as searched)
    final: bool  # the search reached a final state of the graph
    ok: bool = True  # False: the search kept no path at all
    classes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def cost(self) -> float:
        return self.graph_cost + self.am_cost


def oracle_log_posteriors(labels: np.ndarray, num_classes: int, mass: float = 0.9) -> np.ndarray:
    """Log posteriors that put `mass` on the reference class of each row (the rest spread
    evenly): a perfect acoustic model's output, to check lexicon, LM and graph alone."""
    lp = np.full((len(labels), num_classes), np.log((1 - mass) / (num_classes - 1)), np.float32)
    lp[np.arange(len(labels)), np.asarray(labels, np.int64)] = np.log(mass)
    return lp
