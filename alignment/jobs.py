"""One shard of utterances as an alignment job (Kaldi's JOB), and the map/reduce over them.

A `ShardJob` keeps its shard's features, transcripts, training graphs and current
alignments in memory between passes; the driver sends it the current model and gets back
summed statistics (GmmStats, TreeStats) and counts, never per-frame data, until the
final `results`. `run_jobs` calls a method on every job and returns the answers in order:
on Ray actors when the jobs are actors (one per shard), in-process otherwise (tests).
"""
from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import numpy as np

from alignment import fmllr, forward_backward, gmm, guide
from alignment import lexicon_graphs as lg
from alignment.ctm import fold_closures
from alignment.features import FeatureOptions, mfcc, speaker_cmvn
from alignment.lda_mllt import ClassStats, splice
from alignment.tree import TreeStats, phone_contexts


@dataclass
class Utterance:
    utt_id: str
    speaker_id: str
    words: list[str]
    samples: np.ndarray | None = None   # float32 mono at FeatureOptions.sample_rate


@dataclass
class JobReport:
    """What a pass over one shard returns besides statistics."""
    aligned: int = 0
    failed: dict[str, str] = field(default_factory=dict)   # utt_id -> reason
    loglike: float = 0.0
    frames: int = 0
    quiet_edges: int = 0     # equal_align: utterances whose edge silences energy placed


class ShardJob:
    """Loads its utterances with `load()` (runs where the job runs: on a Ray actor, the
    audio is read there), computes features with per-speaker CMVN."""

    def __init__(self, shard_id: str, load: Callable[[], tuple[list[Utterance], list]],
                 lang: lg.Lang, fopts: FeatureOptions):
        self.shard_id = shard_id
        self.lang = lang
        utts, self.rejects = load()
        self.utts: dict[str, Utterance] = {}
        self.feats: dict[str, np.ndarray] = {}
        self.log_energy: dict[str, np.ndarray] = {}  # per frame, before CMVN (MFCC C0)
        self.word_ids: dict[str, list[int]] = {}
        self.failed: dict[str, str] = {}
        self._features(utts, fopts)
        self.graphs: dict[str, Any] = {}
        self.arc_graphs: dict[str, forward_backward.ArcGraph] = {}  # accumulate_soft's
        self.ali: dict[str, list[int]] = {}
        self.static: dict[str, np.ndarray] | None = None  # kept by the first set_transform
        self.unadapted: dict[str, np.ndarray] | None = None  # kept by the first fmllr_stats
        self.allowed: dict[str, np.ndarray] = {}  # guide.allowed_phones (set_guide)
        self.subset: set[str] | None = None  # use_subset: the utterances a stage trains on

    def _features(self, utts: list[Utterance], fopts: FeatureOptions) -> None:
        by_spk: dict[str, list[Utterance]] = {}
        for u in utts:
            ids, oov = lg.word_ids(self.lang, u.words)
            if not u.words:
                self.failed[u.utt_id] = "no_transcript: the utterance has no words"
            elif ids is None:
                self.failed[u.utt_id] = f"oov_word: not in the lexicon: {' '.join(oov[:10])}"
            else:
                self.word_ids[u.utt_id] = ids
                by_spk.setdefault(u.speaker_id, []).append(u)
        for spk, us in by_spk.items():
            raw = [mfcc(u.samples, fopts) for u in us]
            for u, r, f in zip(us, raw, speaker_cmvn(raw)):
                self.utts[u.utt_id] = Utterance(u.utt_id, spk, u.words)
                self.feats[u.utt_id] = f
                self.log_energy[u.utt_id] = r[:, 0].copy()
        self.num_static = fopts.num_ceps  # the first columns: normalised static MFCCs

    def ids(self) -> list[str]:
        return [u for u in self.feats if u not in self.failed
                and (self.subset is None or u in self.subset)]

    def lengths(self) -> dict[str, int]:
        """Frames of every utterance that can still be aligned, whatever the subset."""
        return {u: len(f) for u, f in self.feats.items() if u not in self.failed}

    def use_subset(self, keep: list[str] | None) -> JobReport:
        """Every pass from now on works on the utterances of `keep` that this shard holds
        (None: all of them again; their graphs then need `compile`)."""
        self.subset = None if keep is None else set(keep) & set(self.feats)
        return self._report()

    def feature_stats(self) -> tuple[int, np.ndarray, np.ndarray]:
        x = [self.feats[u] for u in self.ids()]
        allf = np.concatenate(x).astype(np.float64) if x else np.zeros((0, 1))
        return len(allf), allf.sum(0), (allf ** 2).sum(0)

    def compile(self, tm: khg.TransitionModel, tree: khg.ContextDependency) -> JobReport:
        """Training graphs for the current tree (monophone, then the triphone tree)."""
        gc = lg.graph_compiler(self.lang, tm, tree, lg.lexicon_fst(self.lang))
        self.graphs, self.arc_graphs = {}, {}
        for u in self.ids():
            try:
                self.graphs[u] = gc.compile_graph_from_text(self.word_ids[u])
            except Exception as exc:  # the binding asserts; say which utterance failed
                self.failed[u] = f"graph_failed: {exc}"[:300]
        return self._report()

    def equal_align(self, tm: khg.TransitionModel | None = None, silence_db: float = 0.0
                    ) -> JobReport:
        """The flat start's alignments (gmm.equal_align). With `silence_db` > 0 (and `tm`,
        for which transition ids are silence's), an utterance's leading and trailing frames
        more than silence_db below its loudest go to silence, the rest is spread equally."""
        is_sil = gmm.phone_of_transitions(tm) == lg.SIL_ID if silence_db > 0 else None
        placed = 0
        for u in self.ids():
            edges = None
            if is_sil is not None and (q := gmm.quiet_edges(self.log_energy[u], silence_db)):
                edges = gmm.SilenceEdges(*q, is_sil)
                placed += 1
            # each utterance its own draws. With one seed for all (Kaldi's srand(3) per
            # call) every path makes the same first choice: with seed 3 no utterance's
            # leading silence went to silence, and the demo's aligner fell to 86.5 % of
            # frames / 83.7 % of boundaries within 20 ms (a seed per utterance: 87.0 / 86.6)
            ali = gmm.equal_align(self.graphs[u], len(self.feats[u]),
                                  seed=zlib.crc32(u.encode()), edges=edges)
            if ali is None:
                self.failed[u] = (f"too_short: {len(self.feats[u])} frames cannot hold the "
                                  f"transcript's HMM states")
            else:
                self.ali[u] = ali
        return dataclasses.replace(self._report(), quiet_edges=placed)

    def align(self, tm: khg.TransitionModel, am: khg.AmDiagGmm, beam: float,
              retry_beam: float) -> JobReport:
        return self._realign(
            lambda u: gmm.align(tm, am, self.graphs[u], self.feats[u], beam, retry_beam),
            f"no path within retry beam {retry_beam}")

    def set_guide(self, refs: dict[str, list[tuple[str, float, float]]]) -> JobReport:
        """The reference CTM segments (phone, start s, end s) that align_guided keeps each
        utterance to; an utterance the reference lacks fails (nothing to keep to)."""
        for u in self.ids():
            if u in refs:
                self.allowed[u] = guide.allowed_phones(refs[u], len(self.feats[u]), self.lang)
            else:
                self.failed[u] = "no_reference: the reference CTM has no line for it"
        return self._report()

    def align_guided(self, tm: khg.TransitionModel, am: khg.AmDiagGmm, beam: float,
                     retry_beam: float) -> JobReport:
        """Viterbi alignment kept to the reference's phones (alignment/guide.py)."""
        scorer = gmm.PdfScorer.of(am)
        pdf_of, phone_of = gmm.pdf_of_transitions(tm), gmm.phone_of_transitions(tm)

        def search(u: str) -> tuple[list[int] | None, float]:
            scaled = guide.guided_loglikes(scorer(self.feats[u]), pdf_of, phone_of,
                                           self.allowed[u], gmm.ACOUSTIC_SCALE)
            return gmm.align_loglikes(tm, self.graphs[u], scaled, beam, retry_beam)
        return self._realign(search, f"no path within retry beam {retry_beam} (guided)")

    def _realign(self, search: Callable[[str], tuple[list[int] | None, float]],
                 why: str) -> JobReport:
        """Every utterance's alignment := search(utt); one that finds no path fails."""
        rep = JobReport()
        for u in self.ids():
            ali, like = search(u)
            if ali is None:
                self.failed[u] = f"align_failed: {why}"
                self.ali.pop(u, None)
                continue
            self.ali[u] = ali
            rep.loglike += like
            rep.frames += len(ali)
        rep.aligned, rep.failed = len(self.ali), dict(self.failed)
        return rep

    def nnet_examples(self, tm: khg.TransitionModel, folds: int
                      ) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
        """(features, pdf per frame, fold) of every aligned utterance: the alignment
        network's training data."""
        from alignment import nnet

        ids = [u for u in self.ids() if u in self.ali]
        return ([self.feats[u] for u in ids],
                [gmm.phones_and_pdfs(tm, self.ali[u])[1] for u in ids],
                [nnet.fold_of(u, folds) for u in ids])

    def align_nnet(self, tm: khg.TransitionModel, nets: list, log_priors: list[np.ndarray],
                   scale: float, beam: float, retry_beam: float) -> JobReport:
        """Realign with the alignment networks' scaled likelihoods (alignment/nnet.py),
        each utterance with the network that did not train on it (its fold's)."""
        import torch

        from alignment import nnet

        torch.set_num_threads(1)  # one actor per core
        pdf_of = gmm.pdf_of_transitions(tm)

        def search(u: str) -> tuple[list[int] | None, float]:
            k = nnet.fold_of(u, len(nets))
            scaled = nnet.scaled_loglikes(nets[k], self.feats[u], log_priors[k], pdf_of, scale)
            return gmm.align_loglikes(tm, self.graphs[u], scaled, beam, retry_beam, scale)
        return self._realign(search, f"no path within retry beam {retry_beam} (network)")

    def accumulate(self, tm: khg.TransitionModel, am: khg.AmDiagGmm) -> gmm.GmmStats:
        return gmm.accumulate(tm, am, [(self.feats[u], self.ali[u]) for u in self.ids()])

    def accumulate_soft(self, tm: khg.TransitionModel, am: khg.AmDiagGmm,
                        acoustic_scale: float) -> gmm.GmmStats:
        """Baum-Welch statistics over the training graphs (forward_backward.py)."""
        ids = self.ids()
        for u in ids:  # the same graphs every pass: their arrays once
            if u not in self.arc_graphs:
                self.arc_graphs[u] = forward_backward.ArcGraph.of(self.graphs[u])
        stats, failed = forward_backward.accumulate(
            tm, am, [(self.feats[u], self.arc_graphs[u]) for u in ids], acoustic_scale)
        for i in failed:
            self.failed[ids[i]] = "no_path: no path of the training graph fits its frames"
        return stats

    def class_stats(self, tm: khg.TransitionModel, per_class: bool) -> ClassStats:
        """LDA / MLLT statistics of the current features, classes = the alignment's pdfs,
        silence frames left out (Kaldi: weight-silence-post 0)."""
        feats, classes = [], []
        for u in self.ids():
            phones, pdfs, _ = gmm.phones_and_pdfs(tm, self.ali[u])
            speech = phones != self.lang.sil_id
            feats.append(self.feats[u][speech])
            classes.append(pdfs[speech])
        dim = next(iter(self.feats.values())).shape[1] if self.feats else 0
        x = np.concatenate(feats) if feats else np.zeros((0, dim), np.float32)
        c = np.concatenate(classes) if classes else np.zeros(0, np.int64)
        return ClassStats.of(x, c, tm.num_pdfs, per_class)

    def set_transform(self, matrix: np.ndarray | None, context: int) -> JobReport:
        """Features := the static MFCCs spliced over +-context frames, times `matrix`
        ([out, in]; None: spliced only). The delta features are not kept."""
        if self.static is None:
            self.static = {u: f[:, :self.num_static].copy() for u, f in self.feats.items()}
        self.unadapted = None  # speaker transforms live in the space this replaces
        project = None if matrix is None else np.asarray(matrix, np.float32).T
        for u, x in self.static.items():
            spliced = splice(x, context)
            self.feats[u] = spliced if project is None else (spliced @ project).astype(np.float32)
        return self._report()

    def fmllr_stats(self, tm: khg.TransitionModel, am: khg.AmDiagGmm
                    ) -> dict[str, fmllr.FmllrStats]:
        """Per speaker: fMLLR statistics of its aligned speech frames (silence left out, as
        train_sat.sh's silence weight 0) over the features before any speaker transform,
        with posteriors of the model on the features it sees now."""
        if self.unadapted is None:
            self.unadapted = dict(self.feats)
        by_spk: dict[str, list[str]] = {}
        for u in self.ids():
            if u in self.ali:
                by_spk.setdefault(self.utts[u].speaker_id, []).append(u)
        gaussians = [fmllr.PdfGaussians.of(am.get_pdf(j)) for j in range(am.num_pdfs)]
        out = {}
        for spk, utts in by_spk.items():
            raw, seen, pdfs = [], [], []
            for u in utts:
                phones, pdf, _ = gmm.phones_and_pdfs(tm, self.ali[u])
                speech = phones != self.lang.sil_id
                raw.append(self.unadapted[u][speech])
                seen.append(self.feats[u][speech])
                pdfs.append(pdf[speech])
            out[spk] = fmllr.accumulate(np.concatenate(raw), np.concatenate(seen),
                                        np.concatenate(pdfs), gaussians)
        return out

    def set_fmllr(self, transforms: dict[str, np.ndarray]) -> JobReport:
        """Features := each speaker's transform of its unadapted features (a speaker with
        no transform keeps them)."""
        for u, x in (self.unadapted or {}).items():
            w = transforms.get(self.utts[u].speaker_id)
            self.feats[u] = x if w is None else fmllr.apply(w, x)
        return self._report()

    def tree_stats(self, tm: khg.TransitionModel) -> TreeStats:
        """acc-tree-stats on the current alignments (monophone, or the triphone model's
        before LDA + MLLT)."""
        dim = next(iter(self.feats.values())).shape[1] if self.feats else 0
        st = TreeStats(dim)
        state_of = gmm.hmm_states(tm)
        for u in self.ids():
            ali = self.ali[u]
            phones, _, start = gmm.phones_and_pdfs(tm, ali)
            seg = np.cumsum(start) - 1
            seq = phones[start]
            left = np.concatenate([[0], seq[:-1]])[seg]
            right = np.concatenate([seq[1:], [0]])[seg]
            cls = state_of[np.asarray(ali)]
            st.add_frames(np.stack([left, phones, right, cls], 1), self.feats[u])
        return st

    def context_stats(self, tm: khg.TransitionModel) -> TreeStats:
        """Statistics for the network's tree: per (left, phone, right) of the current
        alignments' phones (closures folded, as in the outputs), one pdf class per phone,
        silence as the context at the utterance's ends."""
        dim = next(iter(self.feats.values())).shape[1] if self.feats else 0
        st = TreeStats(dim)
        sil = self.lang.sil_id
        for u in self.ids():
            phones, _, start = gmm.phones_and_pdfs(tm, self.ali[u])
            phones, start = fold_closures(phones, start, self.lang.closure_ids, sil)
            left, right = phone_contexts(phones, start, sil)
            st.add_frames(np.stack([left, phones, right, np.zeros_like(phones)], 1),
                          self.feats[u])
        return st

    def results(self, tm: khg.TransitionModel) -> list[dict]:
        out = []
        for u in self.ids():
            phones, pdfs, start = gmm.phones_and_pdfs(tm, self.ali[u])
            phones, start = fold_closures(phones, start, self.lang.closure_ids, self.lang.sil_id)
            out.append({"utt_id": u, "speaker_id": self.utts[u].speaker_id,
                        "phones": phones, "senones": pdfs, "starts": start})
        return out

    def load_rejects(self) -> list:
        return list(self.rejects)

    def report(self) -> JobReport:
        return self._report()

    def _report(self) -> JobReport:
        return JobReport(aligned=len(self.ids()), failed=dict(self.failed))


def run_jobs(jobs: list[Any], method: str, *args: Any) -> list[Any]:
    """Call `method(*args)` on every job, Ray actors in parallel, and return the answers."""
    if jobs and hasattr(getattr(jobs[0], method), "remote"):
        import ray  # deferred: the in-process path (tests) never starts Ray

        refs = [ray.put(a) for a in args]  # one copy of the model in the object store
        return ray.get([getattr(j, method).remote(*refs) for j in jobs])
    return [getattr(j, method)(*args) for j in jobs]
