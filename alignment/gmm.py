"""GMM-HMM pieces around kaldi-hmm-gmm: model init, statistics, update, alignment.

Statistics leave a job as plain arrays (`GmmStats`), so shards can be accumulated anywhere
(Ray actors) and summed on the driver before one update, as Kaldi's gmm-acc-stats-ali JOBs
and gmm-sum-accs / gmm-est.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import _kaldi_hmm_gmm as _khg  # mle_diag_gmm_update is not re-exported by the package
import kaldifst
import numpy as np


ACOUSTIC_SCALE = 0.1  # gmm-align-compiled's --acoustic-scale


@dataclass
class GmmStats:
    """Sufficient statistics of one pass: per pdf, per Gaussian (occupancy, x, x^2)."""
    occ: list[np.ndarray] = field(default_factory=list)      # [G_j]
    x: list[np.ndarray] = field(default_factory=list)        # [G_j, D]
    x2: list[np.ndarray] = field(default_factory=list)       # [G_j, D]
    trans: np.ndarray | None = None                          # transition-id counts
    loglike: float = 0.0
    frames: int = 0

    def add(self, other: "GmmStats") -> "GmmStats":
        if not self.occ:  # copies: other's arrays may be read-only (Ray's object store)
            self.occ = [o.copy() for o in other.occ]
            self.x = [x.copy() for x in other.x]
            self.x2 = [x.copy() for x in other.x2]
            self.trans = None if other.trans is None else other.trans.copy()
            self.loglike, self.frames = other.loglike, other.frames
            return self
        for j in range(len(self.occ)):
            self.occ[j] += other.occ[j]
            self.x[j] += other.x[j]
            self.x2[j] += other.x2[j]
        self.trans = self.trans + other.trans
        self.loglike += other.loglike
        self.frames += other.frames
        return self


def init_flat(tm_tree: khg.ContextDependency, topo: khg.HmmTopology, mean: np.ndarray,
              var: np.ndarray) -> tuple[khg.TransitionModel, khg.AmDiagGmm]:
    """gmm-init-mono: every pdf a single Gaussian at the global mean and variance."""
    am = khg.AmDiagGmm()
    for _ in range(tm_tree.num_pdfs):
        am.add_pdf(single_gaussian(mean, var))
    return khg.TransitionModel(ctx_dep=tm_tree, hmm_topo=topo), am


def single_gaussian(mean: np.ndarray, var: np.ndarray) -> khg.DiagGmm:
    g = khg.DiagGmm(nmix=1, dim=len(mean))
    g.set_weights(np.ones(1, np.float32))
    g.set_means(np.asarray(mean, np.float32)[None, :])
    g.set_invvars((1.0 / np.maximum(np.asarray(var, np.float32), 1e-3))[None, :])
    g.compute_gconsts()
    return g


def monophone_tree(topo: khg.HmmTopology) -> khg.ContextDependency:
    return khg.monophone_context_dependency(
        phones=topo.phones, phone2num_pdf_classes=topo.get_phone_to_num_pdf_classes())


def accumulate(tm: khg.TransitionModel, am: khg.AmDiagGmm,
               utts: list[tuple[np.ndarray, list[int]]]) -> GmmStats:
    """gmm-acc-stats-ali over (features, transition ids) pairs."""
    accs = khg.AccumAmDiagGmm()
    accs.init(model=am, flags=khg.GmmUpdateFlags.kGmmAll)
    trans = tm.init_stats()
    loglike, frames = 0.0, 0
    for feats, ali in utts:
        for t, tid in enumerate(ali):
            trans = tm.accumulate(prob=1.0, trans_id=tid, stats=trans)
            loglike += accs.accumulate_for_gmm(model=am, data=feats[t],
                                               gmm_index=tm.transition_id_to_pdf(tid), weight=1.0)
        frames += len(ali)
    st = GmmStats(trans=np.asarray(trans, np.float64), loglike=loglike, frames=frames)
    for j in range(accs.num_accs):
        a = accs.get_acc(j)
        st.occ.append(np.asarray(a.occupancy, np.float64).copy())
        st.x.append(np.asarray(a.mean_accumulator, np.float64).copy())
        st.x2.append(np.asarray(a.variance_accumulator, np.float64).copy())
    return st


def update(tm: khg.TransitionModel, am: khg.AmDiagGmm, st: GmmStats, target_gauss: int,
           min_gauss_occ: float = 10.0, power: float = 0.2) -> None:
    """gmm-est: MLE update of the transitions and the GMMs, then mix-up towards
    `target_gauss` Gaussians in total (allocated to pdfs by occupancy^power)."""
    # Per pdf: AccumAmDiagGmm.get_acc returns a copy, so summed statistics cannot be put
    # back into an AccumAmDiagGmm; mle_diag_gmm_update on each pdf is what gmm-est does.
    flags = khg.GmmUpdateFlags.kGmmAll
    opts = khg.MleDiagGmmOptions()
    opts.min_gaussian_occupancy = min_gauss_occ
    for j in range(len(st.occ)):
        pdf = am.get_pdf(j)  # a reference: updated in place
        acc = khg.AccumDiagGmm(gmm=pdf, flags=flags)
        for g in range(len(st.occ[j])):
            acc.add_stats_for_component(g, float(st.occ[j][g]), st.x[j][g], st.x2[j][g])
        if st.occ[j].sum() > 0:
            _khg.mle_diag_gmm_update(config=opts, diag_gmm_acc=acc, flags=flags, gmm=pdf)
    tm.mle_update(st.trans, khg.MleTransitionUpdateConfig())
    if target_gauss > am.num_gauss:
        occs = np.array([o.sum() for o in st.occ], np.float32)
        mix_up(am, occs, target_gauss, power, seed=am.num_gauss)


def mix_up(am: khg.AmDiagGmm, occs: np.ndarray, target_gauss: int, power: float,
           seed: int, perturb: float = 0.01, min_count: float = 20.0) -> None:
    """gmm-mixup, reproducibly. kaldi-hmm-gmm's split perturbs the new means with a random
    source that srand does not reach (the same model and statistics mixed up twice give
    different models), so splits are taken unperturbed and perturbed here from a seeded
    generator: each new Gaussian moves +perturb x N(0, var) from its parent, the parent as
    much the other way, as Kaldi's DiagGmm::Split does."""
    plan = khg.AmDiagGmm()  # Kaldi's allocation (occupancy^power, min_count), on a copy
    plan.copy_from_am_diag_gmm(am)
    plan.split_by_count(state_occs=occs, target_components=target_gauss, perturb_factor=0.0,
                        power=power, min_count=min_count)
    rng = np.random.default_rng(seed)
    for j in range(am.num_pdfs):
        pdf = am.get_pdf(j)  # a reference: split in place
        first_new = pdf.num_gauss
        if plan.num_gauss_in_pdf(j) <= first_new:
            continue
        parents = pdf.split(plan.num_gauss_in_pdf(j), 0.0)  # new Gaussian i copies parents[i]
        means, sd = np.array(pdf.means, np.float64), np.sqrt(np.array(pdf.vars, np.float64))
        for i, parent in enumerate(parents):
            step = perturb * rng.standard_normal(means.shape[1]) * sd[parent]
            means[first_new + i] += step
            means[parent] -= step
        pdf.set_means(means.astype(np.float32))
        pdf.compute_gconsts()


def boost_silence(am: khg.AmDiagGmm, pdfs: list[int], boost: float) -> khg.AmDiagGmm:
    """gmm-boost-silence: a copy whose `pdfs` (silence's) have every Gaussian weight times
    `boost` (not renormalised: their log-likelihoods rise by log(boost)), for aligning
    only; statistics are still accumulated with the model itself."""
    out = khg.AmDiagGmm()
    out.copy_from_am_diag_gmm(am)
    for j in pdfs:
        pdf = out.get_pdf(j)  # a reference
        pdf.set_weights(np.asarray(pdf.weights, np.float32) * np.float32(boost))
        pdf.compute_gconsts()
    return out


def equal_align(graph: kaldifst.StdVectorFst, num_frames: int, seed: int = 3,
                retries: int = 10, edges: SilenceEdges | None = None) -> list[int] | None:
    """align-equal-compiled: a random path of the graph with its frames spread equally over
    the self-loops of the states it visits (Kaldi's fst::EqualAlign, which this follows
    step for step), or None when no path up to `retries` fits in `num_frames`. With
    `edges`, the path starts (ends) in silence exactly when edges.lead (edges.trail) > 0,
    and its leading and trailing silence get those many frames, the rest of the path the
    rest (a path that fits after `retries` x 20 draws, else the plain equal alignment).

    Written here because kaldifst.equal_align draws from the C library's process-wide
    rand(): srand(seed) does not make it reproducible in a process with other native
    threads that call rand(), as every Ray actor has (measured: two quiet actors calling
    it on one graph for a minute got another path 17 times), and one other path at the
    flat start moves the whole recipe's result. Here the draws come from `seed` alone."""
    arcs, loops = _arcs_and_self_loops(graph)
    rng = np.random.default_rng(seed)
    if edges is not None:
        for _ in range(retries * 20):
            path = _random_path(graph, arcs, rng, num_frames)
            parts = edges.split(path) if path is not None else None
            ali = parts and _spread_parts(parts, loops, edges, num_frames)
            if ali:
                return ali
    for _ in range(retries):
        path = _random_path(graph, arcs, rng, num_frames)
        if path is not None:
            return _spread(path, loops, num_frames)
    return None


@dataclass
class SilenceEdges:
    """An utterance's leading and trailing silence in frames (0: none), as the flat start's
    equal alignment is to place them, and which transition ids are silence's."""
    lead: int
    trail: int
    is_sil: np.ndarray   # [num transition ids + 1] bool

    def split(self, path: list[tuple[int, int]]) -> list[list[tuple[int, int]]] | None:
        """The path as [leading silence, the rest, trailing silence] (entries cut after
        the last silence label of the lead / before the first of the trail), or None when
        its silences at the edges are not the ones wanted."""
        labels = [k for k, (_, il) in enumerate(path) if il > 0]
        if not labels:
            return None
        sil = [bool(self.is_sil[path[k][1]]) for k in labels]
        if sil[0] != (self.lead > 0) or sil[-1] != (self.trail > 0) or all(sil):
            return None
        a = labels[sil.index(False) - 1] + 1 if self.lead else 0
        b = labels[len(sil) - sil[::-1].index(False)] if self.trail else len(path)
        return [path[:a], path[a:b], path[b:]]


def _spread_parts(parts: list[list[tuple[int, int]]], loops: list[int], edges: SilenceEdges,
                  num_frames: int) -> list[int] | None:
    out = []
    for part, frames in zip(parts, (edges.lead, num_frames - edges.lead - edges.trail,
                                    edges.trail)):
        ali = _spread(part, loops, frames) if part else []
        if ali is None or len(ali) != frames:
            return None
        out += ali
    return out


def quiet_edges(log_energy: np.ndarray, db: float, min_frames: int = 3
                ) -> tuple[int, int] | None:
    """(leading, trailing) frames of an utterance more than `db` dB below its loudest
    frame (log_energy: natural log of frame energy, MFCC's C0), each 0 when under
    `min_frames` (silence's HMM needs 3); None when no frame is that quiet (noise or
    reverberation fills the recording: nothing to tell)."""
    if len(log_energy) == 0:
        return None
    loud = log_energy >= log_energy.max() - db / (10.0 * np.log10(np.e))
    if loud.all():
        return None
    lead, trail = int(np.argmax(loud)), int(np.argmax(loud[::-1]))
    return (lead if lead >= min_frames else 0, trail if trail >= min_frames else 0)


def _arcs_and_self_loops(graph: kaldifst.StdVectorFst
                         ) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """Per state: its arcs as (input label, next state), and its first self-loop's input
    label (0: none)."""
    arcs, loops = [], []
    for s in range(graph.num_states):
        out = [(a.ilabel, a.nextstate) for a in kaldifst.ArcIterator(graph, s)]
        arcs.append(out)
        loops.append(next((il for il, nxt in out if nxt == s and il != 0), 0))
    return arcs, loops


def _random_path(graph: kaldifst.StdVectorFst, arcs: list[list[tuple[int, int]]],
                 rng: np.random.Generator, num_frames: int
                 ) -> list[tuple[int, int]] | None:
    """[(state, input label of the arc that leaves it; -1 for the final state)]: at each
    state one of its arcs or its final weight, uniformly, a drawn self-loop drawn again;
    None once the path has more labelled arcs than frames."""
    s, path, labelled = graph.start, [], 0
    while True:
        n = len(arcs[s]) + (1 if graph.final(s).value != float("inf") else 0)
        k = int(rng.integers(n))
        if k == len(arcs[s]):
            path.append((s, -1))
            return path
        ilabel, nxt = arcs[s][k]
        if nxt == s:
            continue
        path.append((s, ilabel))
        labelled += ilabel != 0
        if labelled > num_frames:
            return None
        s = nxt


def _spread(path: list[tuple[int, int]], loops: list[int], num_frames: int
            ) -> list[int] | None:
    """The path's input labels with its states' self-loops repeated to `num_frames`: each
    state with a self-loop repeats it equally often, the first ones once more."""
    labelled = sum(il > 0 for _, il in path)
    with_loop = [s for s, _ in path if loops[s]]
    extra = num_frames - labelled
    if extra and not with_loop:
        return None
    each, more = divmod(extra, len(with_loop)) if with_loop else (0, 0)
    out, nth = [], 0
    for s, ilabel in path:
        if loops[s]:
            out += [loops[s]] * (each + (nth < more))
            nth += 1
        if ilabel > 0:
            out.append(ilabel)
    return out


def align(tm: khg.TransitionModel, am: khg.AmDiagGmm, graph: kaldifst.StdVectorFst,
          feats: np.ndarray, beam: float, retry_beam: float,
          acoustic_scale: float = ACOUSTIC_SCALE) -> tuple[list[int] | None, float]:
    """gmm-align-compiled: Viterbi transition ids (None when no path survives the retry
    beam) and the alignment's acoustic log-likelihood."""
    dec = khg.DecodableAmDiagGmmScaled(am=am, tm=tm, feats=feats, scale=acoustic_scale)
    return _viterbi(tm, graph, dec, len(feats), beam, retry_beam, acoustic_scale)


def align_loglikes(tm: khg.TransitionModel, graph: kaldifst.StdVectorFst,
                   scaled: np.ndarray, beam: float, retry_beam: float,
                   acoustic_scale: float = ACOUSTIC_SCALE) -> tuple[list[int] | None, float]:
    """The same search on given scaled log-likelihoods [T, num transition ids] (column
    i - 1 for transition id i, e.g. alignment/nnet.py's): DecodableCtc reads them as is."""
    dec = khg.DecodableCtc(np.ascontiguousarray(scaled, np.float32))
    return _viterbi(tm, graph, dec, len(scaled), beam, retry_beam, acoustic_scale)


def _viterbi(tm: khg.TransitionModel, graph: kaldifst.StdVectorFst, dec, num_frames: int,
             beam: float, retry_beam: float, acoustic_scale: float
             ) -> tuple[list[int] | None, float]:
    fst = graph.copy()
    khg.add_transition_probs(trans_model=tm, transition_scale=1.0, self_loop_scale=0.1,
                             fst=fst)
    cfg = khg.AlignConfig(beam=beam, retry_beam=retry_beam, careful=False)
    _, err, _, like, _, ali, _ = khg.align_utterance_wrapper(
        config=cfg, utt="u", acoustic_scale=acoustic_scale, fst=fst, decodable=dec,
        num_done=0, num_error=0, num_retried=0, tot_like=0.0, frame_count=0)
    if err or len(ali) != num_frames:
        return None, 0.0
    return list(ali), float(like)


@dataclass
class PdfScorer:
    """Every pdf's log-likelihood of every frame at once (what DecodableAmDiagGmm gives one
    (frame, pdf) at a time): the model's Gaussians stacked, one matrix product per
    utterance, a log-sum-exp over each pdf's Gaussians."""
    gconsts: np.ndarray        # [G] log weight + normaliser (Kaldi's gconsts)
    means_invvars: np.ndarray  # [G, D]
    inv_vars: np.ndarray       # [G, D]
    first: np.ndarray          # [P] index of each pdf's first Gaussian

    @classmethod
    def of(cls, am: khg.AmDiagGmm) -> "PdfScorer":
        pdfs = [am.get_pdf(j) for j in range(am.num_pdfs)]
        sizes = [p.num_gauss for p in pdfs]
        return cls(np.concatenate([np.asarray(p.gconsts, np.float64) for p in pdfs]),
                   np.concatenate([np.asarray(p.means_invvars, np.float64) for p in pdfs]),
                   np.concatenate([np.asarray(p.inv_vars, np.float64) for p in pdfs]),
                   _starts(sizes))

    @property
    def sizes(self) -> np.ndarray:
        """[P] Gaussians of each pdf."""
        return np.diff(np.append(self.first, len(self.gconsts)))

    def restricted(self, pdfs: np.ndarray) -> tuple["PdfScorer", np.ndarray]:
        """A scorer of only `pdfs` (its pdf i is pdfs[i]) and the indices of its Gaussians
        among this one's."""
        sizes = self.sizes[pdfs]
        first = _starts(sizes)
        idx = np.arange(sizes.sum()) + np.repeat(self.first[pdfs] - first, sizes)
        return PdfScorer(self.gconsts[idx], self.means_invvars[idx], self.inv_vars[idx],
                         first), idx

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        """[T, P] log-likelihoods of feats [T, D]."""
        return self.components(feats)[1]

    def components(self, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every Gaussian's weighted log-likelihood [T, G] and every pdf's [T, P]."""
        x = np.asarray(feats, np.float64)
        comp = self.gconsts + x @ self.means_invvars.T - 0.5 * (x * x) @ self.inv_vars.T
        top = np.maximum.reduceat(comp, self.first, axis=1)
        spread = np.repeat(top, self.sizes, axis=1)
        return comp, top + np.log(np.add.reduceat(np.exp(comp - spread), self.first, axis=1))


def _starts(sizes) -> np.ndarray:
    """Index of each block's first element, for blocks of `sizes` laid end to end."""
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def pdf_of_transitions(tm: khg.TransitionModel) -> np.ndarray:
    """pdf of every transition id (index 0 unused)."""
    return _per_transition(tm, tm.transition_id_to_pdf)


def phone_of_transitions(tm: khg.TransitionModel) -> np.ndarray:
    """phone id of every transition id (index 0 unused)."""
    return _per_transition(tm, tm.transition_id_to_phone)


def _per_transition(tm: khg.TransitionModel, of: Callable[[int], int]) -> np.ndarray:
    return np.array([0] + [of(t) for t in range(1, tm.num_transition_ids + 1)], np.int64)


def phones_and_pdfs(tm: khg.TransitionModel, ali: list[int]) -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """Per frame: phone id, pdf id (senone), and whether the frame starts a phone: the
    first frame, or the one after a transition into its HMM's final state (a repeated
    phone is two phones; a self-loop of state 0 is not a start)."""
    phones = np.array([tm.transition_id_to_phone(t) for t in ali], np.int32)
    pdfs = np.array([tm.transition_id_to_pdf(t) for t in ali], np.int32)
    start = np.zeros(len(ali), bool)
    if len(ali):
        start[0] = True
        start[1:] = [tm.is_final(t) for t in ali[:-1]]
    return phones, pdfs, start


def hmm_states(tm: khg.TransitionModel) -> np.ndarray:
    """HMM state (= pdf class in these topologies) of every transition id (index 0 unused)."""
    tuples = [t.__getstate__() for t in tm.tuples]  # (phone, hmm_state, fwd pdf, loop pdf)
    return np.array([0] + [tuples[s - 1][1] for s in tm.id2state[1:]], np.int32)
