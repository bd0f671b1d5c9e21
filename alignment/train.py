"""The alignment recipe (Kaldi's train_mono.sh, train_deltas.sh and, with `lda_mllt`,
train_lda_mllt.sh, with `sat` train_sat.sh; one process, JOBs as
`ShardJob`s): flat start from equal alignments, monophone rounds of accumulate / update /
mix-up with realignment every `realign_every` iterations, tree statistics on the final
monophone alignments, a decision tree to `num_senones` leaves, a context-dependent model
initialised from the tree's leaf statistics, and its own rounds of realignment.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import kaldi_hmm_gmm as khg  # first: see alignment/__init__.py
import numpy as np

from alignment import fmllr, gmm, nnet
from alignment import lexicon_graphs as lg
from alignment.jobs import run_jobs
from alignment.lda_mllt import ClassStats, lda, mllt
from alignment.nnet import NnetOptions
from alignment.tree import Tree, TreeStats, build_tree, phone_contexts
from core.senones import ContextTree

log = logging.getLogger(__name__)


class NothingToAlign(RuntimeError):
    """Every utterance was rejected (on load) or failed (compile, align): the step's
    rejects say why."""


@dataclass
class RecipeOptions:
    num_senones: int = 500
    mono_iters: int = 25
    tri_iters: int = 15
    realign_every: int = 2
    mono_gauss: int = 1000
    tri_gauss: int = 4000
    beam: float = 10.0
    retry_beam: float = 40.0
    min_leaf_count: float = 50.0
    lda_mllt: bool = False     # a third stage on LDA + MLLT features (Kaldi's tri2b)
    splice_context: int = 3    # +-frames of static MFCCs the LDA sees
    lda_dim: int = 40
    sat: bool = False          # speaker-adaptive training on fMLLR features (Kaldi's tri3b)
    fmllr_iters: tuple[int, ...] = (2, 4, 8)  # SAT passes that re-estimate the transforms
    fmllr_min_frames: float = 200.0  # a speaker with fewer speech frames keeps no transform
    nnet: NnetOptions = field(default_factory=NnetOptions)  # realignment by a network
    # every realignment while training kept to the reference CTM the jobs hold (set_guide;
    # alignment/guide.py), the flat start included; each stage's final alignment is free
    guided: bool = False
    # silence's log-likelihoods + log(boost) when aligning (Kaldi's --boost-silence)
    boost_silence: float = 1.0
    # the flat start gives an utterance's leading / trailing frames this many dB below its
    # loudest to silence (ShardJob.equal_align); 0: Kaldi's plain equal alignment
    flat_start_silence_db: float = 30.0
    # the flat start's passes after its first accumulate Baum-Welch statistics (every
    # frame shared among the states by posterior, HTK's HERest) instead of a Viterbi
    # alignment's, at this acoustic scale (alignment/forward_backward.py)
    baum_welch_passes: int = 0
    baum_welch_scale: float = 1.0
    # the monophone stage trains on this many of the shortest utterances (Kaldi's
    # subset_data_dir.sh --shortest), then aligns them all for the tree; 0: all
    mono_subset: int = 0


@dataclass
class Stage:
    """A trained model: its tree, transition model and GMMs."""
    name: str
    tree: Any                        # khg.ContextDependency
    tm: Any                          # khg.TransitionModel
    am: Any                          # khg.AmDiagGmm
    built: Tree | None = None        # the hand-built tree (triphone stages)
    transform: np.ndarray | None = None  # LDA + MLLT [dim, 13 x splice] (lda_mllt stage)
    speaker_transforms: dict[str, np.ndarray] | None = None  # fMLLR [dim, dim+1] (sat)


@dataclass
class History:
    iters: list[dict] = field(default_factory=list)  # stage, iter, loglike/frame, gauss, realigned
    realignments: dict[str, int] = field(default_factory=dict)
    nn_senones: int | None = None   # leaves of the network's tree (network_tree)
    nnet: list[dict] = field(default_factory=list)  # alignment-network rounds
    fmllr: list[dict] = field(default_factory=list)  # fMLLR estimations (sat)
    flat_start: dict = field(default_factory=dict)   # utterances, quiet_edges, silence_db
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall time training it


def _sum(items: list) -> Any:
    """Reduce the shards' statistics into a fresh total (arrays that come back from Ray's
    object store are read-only, so no shard's own arrays are added into)."""
    if isinstance(items[0], gmm.GmmStats):
        total = gmm.GmmStats()
        for x in items:
            total.add(x)
        return total
    if isinstance(items[0], ClassStats):
        return functools.reduce(ClassStats.add, items)
    tree_total = TreeStats(items[0].dim)
    for x in items:
        tree_total.merge(x)
    return tree_total


OnIter = Callable[[Stage, int], None]


def _align(jobs: list, st: Stage, opts: RecipeOptions, guided: bool = False) -> None:
    """Realign every job with `st` (kept to the reference when `guided`), silence boosted
    by opts.boost_silence as Kaldi's recipes align with gmm-boost-silence's copy."""
    am = st.am
    if opts.boost_silence != 1.0:
        sil = gmm.pdf_of_transitions(st.tm)[gmm.phone_of_transitions(st.tm) == lg.SIL_ID]
        am = gmm.boost_silence(st.am, np.unique(sil).tolist(), opts.boost_silence)
    run_jobs(jobs, "align_guided" if guided else "align", st.tm, am, opts.beam, opts.retry_beam)


def _rounds(jobs: list, st: Stage, iters: int, target_gauss: int, opts: RecipeOptions,
            hist: History, aligned: bool, on_iter: OnIter | None = None,
            soft_passes: int = 0) -> None:
    """`iters` passes of accumulate + update; passes 1..soft_passes accumulate Baum-Welch
    statistics; a Viterbi pass realigns first after the soft ones and whenever its index
    is a multiple of realign_every (pass 0 only when `aligned` is False); then `on_iter`."""
    gauss0 = st.am.num_gauss
    grow = max(1, int(iters * 0.75))
    for it in range(iters):
        t0 = time.perf_counter()
        soft = 0 < it <= soft_passes
        realign = _realigns(it, aligned, opts.realign_every, soft_passes)
        if realign:
            _align(jobs, st, opts, guided=opts.guided)
            hist.realignments[st.name] = hist.realignments.get(st.name, 0) + 1
        if on_iter:
            on_iter(st, it)
        if soft:
            stats = _sum(run_jobs(jobs, "accumulate_soft", st.tm, st.am, opts.baum_welch_scale))
        else:
            stats = _sum(run_jobs(jobs, "accumulate", st.tm, st.am))
        if stats.frames == 0:
            why = sorted({v.split(":")[0] for v in failures(jobs).values()})
            raise NothingToAlign(f"{st.name} iteration {it}: every utterance failed to align "
                               f"(reasons: {', '.join(why) or 'none recorded'})")
        goal = gauss0 + (target_gauss - gauss0) * min(it + 1, grow) // grow
        gmm.update(st.tm, st.am, stats, goal)
        hist.iters.append({"stage": st.name, "iter": it, "realigned": realign, "soft": soft,
                           "loglike_per_frame": round(stats.loglike / stats.frames, 4),
                           "frames": stats.frames, "gaussians": st.am.num_gauss,
                           "seconds": round(time.perf_counter() - t0, 2)})
        log.info("align %s iter %d: loglike/frame %.3f over %d frames, %d Gaussians%s",
                 st.name, it, stats.loglike / stats.frames, stats.frames, st.am.num_gauss,
                 " (realigned)" if realign else " (Baum-Welch)" if soft else "")


def _realigns(it: int, aligned: bool, every: int, soft_passes: int) -> bool:
    """Whether pass `it` realigns first: never a soft pass; the first pass after the soft
    ones; else every `every`-th (pass 0 only when the jobs hold no alignment)."""
    if 0 < it <= soft_passes:
        return False
    if soft_passes and it == soft_passes + 1:
        return True
    return (it > 0 or not aligned) and it % every == 0


def _train(jobs: list, st: Stage, iters: int, target_gauss: int, opts: RecipeOptions,
           hist: History, flat_start: bool, on_iter: OnIter | None = None,
           widen: bool = False) -> None:
    """Compile the training graphs of `st`, train it (from equal alignments when
    `flat_start`, else from the alignments the jobs hold) and leave the jobs aligned by it
    (with `widen`, every utterance of the jobs, not only the subset it trained on)."""
    run_jobs(jobs, "compile", st.tm, st.tree)
    if flat_start and opts.guided:  # the flat model's path that keeps to the reference
        _align(jobs, st, opts, guided=True)
    elif flat_start:
        reps = run_jobs(jobs, "equal_align", st.tm, opts.flat_start_silence_db)
        hist.flat_start = {"utterances": sum(r.aligned for r in reps),
                           "quiet_edges": sum(r.quiet_edges for r in reps),
                           "silence_db": opts.flat_start_silence_db}
    _rounds(jobs, st, iters, target_gauss, opts, hist, aligned=flat_start, on_iter=on_iter,
            soft_passes=opts.baum_welch_passes if flat_start and not opts.guided else 0)
    if widen:  # the tree learns from every utterance's alignment
        run_jobs(jobs, "use_subset", None)
        run_jobs(jobs, "compile", st.tm, st.tree)
    _align(jobs, st, opts)
    hist.realignments[st.name] = hist.realignments.get(st.name, 0) + 1


def monophone(jobs: list, lang: lg.Lang, opts: RecipeOptions, hist: History) -> Stage:
    """The flat start and its rounds (on the opts.mono_subset shortest utterances when
    set); the jobs are left holding every utterance's monophone alignment."""
    topo = lg.topology(lang)
    tree = gmm.monophone_tree(topo)
    subset = _shortest(jobs, opts.mono_subset)
    fs = run_jobs(jobs, "feature_stats")
    n = sum(f[0] for f in fs)
    if n == 0:
        raise NothingToAlign("no utterance has features to align")
    mean = sum(f[1] for f in fs) / n
    var = sum(f[2] for f in fs) / n - mean ** 2
    tm, am = gmm.init_flat(tree, topo, mean, var)
    st = Stage("mono", tree, tm, am)
    _train(jobs, st, opts.mono_iters, opts.mono_gauss, opts, hist, flat_start=True,
           widen=bool(subset))
    if subset:
        hist.flat_start["subset"] = subset
    return st


def _shortest(jobs: list, n: int) -> dict:
    """Restrict the jobs to the `n` shortest utterances of all (ties by id); a summary
    of the subset, {} when `n` is 0 or covers every utterance."""
    lengths: dict[str, int] = {}
    for part in run_jobs(jobs, "lengths"):
        lengths.update(part)
    if n <= 0 or n >= len(lengths):
        return {}
    keep = sorted(lengths, key=lambda u: (lengths[u], u))[:n]
    run_jobs(jobs, "use_subset", keep)
    frames = sum(lengths[u] for u in keep)
    log.info("align mono: training on the %d shortest of %d utterances (%d of %d frames, "
             "up to %d each)", n, len(lengths), frames, sum(lengths.values()),
             lengths[keep[-1]])
    return {"utterances": n, "of": len(lengths), "frames": frames,
            "max_frames": lengths[keep[-1]]}


def triphone(jobs: list, lang: lg.Lang, prev: Stage, opts: RecipeOptions,
             hist: History, name: str = "tri", on_iter: OnIter | None = None) -> Stage:
    """A tree grown on `prev`'s alignments in the current features, a model initialised
    from its leaves' statistics, and its rounds."""
    topo = lg.topology(lang)
    stats: TreeStats = _sum(run_jobs(jobs, "tree_stats", prev.tm))
    classes = {p: topo.num_pdf_classes(p) for p in topo.phones}
    built = build_tree(stats, classes, opts.num_senones, {lang.sil_id}, opts.min_leaf_count)
    tree = built.context_dependency()
    tm = khg.TransitionModel(ctx_dep=tree, hmm_topo=topo)
    am = khg.AmDiagGmm()
    d = stats.dim
    glob = np.sum(built.leaf_stats, axis=0)
    for row in built.leaf_stats:
        src = row if row[0] >= 1.0 else glob   # a leaf no frame reached: global stats
        mean = src[1:1 + d] / src[0]
        am.add_pdf(gmm.single_gaussian(mean, src[1 + d:] / src[0] - mean ** 2))
    st = Stage(name, tree, tm, am, built, transform=prev.transform,
               speaker_transforms=prev.speaker_transforms)
    _train(jobs, st, opts.tri_iters, opts.tri_gauss, opts, hist, flat_start=False,
           on_iter=on_iter)
    return st


def lda_mllt(jobs: list, lang: lg.Lang, prev: Stage, opts: RecipeOptions,
             hist: History) -> Stage:
    """Kaldi's train_lda_mllt.sh: LDA on spliced static MFCCs with `prev`'s pdfs as classes,
    an MLLT on top (lda_mllt.py), then a new tree and triphone model in that space."""
    ctx = opts.splice_context
    run_jobs(jobs, "set_transform", None, ctx)
    a = lda(_sum(run_jobs(jobs, "class_stats", prev.tm, False)), opts.lda_dim)
    run_jobs(jobs, "set_transform", a, ctx)
    transform = mllt(_sum(run_jobs(jobs, "class_stats", prev.tm, True))) @ a
    run_jobs(jobs, "set_transform", transform, ctx)
    st = triphone(jobs, lang, prev, opts, hist, name="lda_mllt")
    st.transform = transform
    return st


def sat(jobs: list, lang: lg.Lang, prev: Stage, opts: RecipeOptions, hist: History) -> Stage:
    """Kaldi's train_sat.sh: per-speaker fMLLR transforms (fmllr.py) estimated with
    `prev`'s model on its alignments, a new tree and triphone model on the transformed
    features, the transforms re-estimated with that model at `fmllr_iters`."""
    transforms = _fmllr(jobs, prev, {}, opts, hist)

    def reestimate(st: Stage, it: int) -> None:
        nonlocal transforms
        if it in opts.fmllr_iters:
            transforms = _fmllr(jobs, st, transforms, opts, hist)
            st.speaker_transforms = transforms

    return triphone(jobs, lang, dataclasses.replace(prev, speaker_transforms=transforms),
                    opts, hist, name="sat", on_iter=reestimate)


def _fmllr(jobs: list, st: Stage, current: dict[str, np.ndarray], opts: RecipeOptions,
           hist: History) -> dict[str, np.ndarray]:
    """Every speaker's transform re-estimated from `current` under `st`'s model and
    alignments (statistics summed over the jobs), and applied in the jobs."""
    total: dict[str, fmllr.FmllrStats] = {}
    for per_speaker in run_jobs(jobs, "fmllr_stats", st.tm, st.am):
        for spk, s in per_speaker.items():
            total[spk] = total[spk].add(s) if spk in total else s
    new, gain, frames, few = {}, 0.0, 0.0, 0
    for spk, s in sorted(total.items()):
        if s.beta < opts.fmllr_min_frames:  # keeps what it had (none, or a transform from
            few += 1                        # more frames before some failed to align)
            if spk in current:
                new[spk] = current[spk]
            continue
        w0 = current.get(spk, fmllr.identity(len(s.k)))
        new[spk] = fmllr.estimate(s, w0)
        gain += s.beta * (fmllr.objective(s, new[spk]) - fmllr.objective(s, w0))
        frames += s.beta
    run_jobs(jobs, "set_fmllr", new)
    hist.fmllr.append({"stage": st.name, "speakers": len(total) - few, "too_few_frames": few,
                       "gain_per_frame": round(gain / max(frames, 1.0), 4)})
    log.info("align %s: fMLLR for %d speakers (%d with too few frames), objective +%.4f "
             "per frame", st.name, len(total) - few, few, gain / max(frames, 1.0))
    return new


def nnet_realign(jobs: list, prev: Stage, opts: RecipeOptions, hist: History) -> Stage:
    """Rounds of: train the alignment network (alignment/nnet.py) on the current
    alignments, realign with it. The model files stay `prev`'s; the alignments change."""
    no = opts.nnet
    folds = max(no.folds, 1)
    for r in range(no.rounds):
        t0 = time.perf_counter()
        parts = run_jobs(jobs, "nnet_examples", prev.tm, folds)
        feats, labels, fold = ([x for p in parts for x in p[i]] for i in range(3))
        nets, priors, losses = [], [], []
        for k in range(folds):
            keep = [i for i, f in enumerate(fold) if f != k or folds == 1]
            if not keep:
                raise RuntimeError(f"nnet realignment: fold {k} leaves nothing to train on")
            net, log_priors, xent = nnet.train([feats[i] for i in keep],
                                               [labels[i] for i in keep], prev.tm.num_pdfs, no)
            nets.append(net)
            priors.append(log_priors)
            losses.append([round(x, 4) for x in xent])
        reps = run_jobs(jobs, "align_nnet", prev.tm, nets, priors, no.acoustic_scale,
                        opts.beam, opts.retry_beam)
        hist.realignments["nnet"] = hist.realignments.get("nnet", 0) + 1
        hist.nnet.append({"round": r, "frames": int(sum(len(y) for y in labels)),
                          "folds": folds, "xent_per_epoch": losses,
                          "aligned": sum(x.aligned for x in reps),
                          "seconds": round(time.perf_counter() - t0, 1)})
        log.info("align nnet round %d: cross-entropy per fold and epoch %s over %d frames, "
                 "%d aligned", r, losses, hist.nnet[-1]["frames"], hist.nnet[-1]["aligned"])
    return dataclasses.replace(prev, name="nnet")


def network_tree(jobs: list, lang: lg.Lang, final: Stage, num_leaves: int,
                 min_count: float) -> Tree:
    """The network's tree (one pdf class per phone, Kaldi's chain build_tree.sh idea): the
    final alignments' (left, phone, right) statistics clustered to `num_leaves` leaves;
    silence stays one class, closure phones (folded into the phone before) get none."""
    stats: TreeStats = _sum(run_jobs(jobs, "context_stats", final.tm))
    classes = {p: 1 for p in [lang.sil_id, *lang.nonsil_ids]}
    return build_tree(stats, classes, num_leaves, {lang.sil_id}, min_count)


def frame_classes(ct: ContextTree, phones: np.ndarray, start: np.ndarray, sil: int
                  ) -> np.ndarray:
    """The network tree's leaf of every frame of one utterance's (folded) alignment."""
    left, right = phone_contexts(phones, start, sil)
    seg_first = np.flatnonzero(start)
    per_seg = [ct.leaf_ids(int(left[a]), int(phones[a]), int(right[a])) for a in seg_first]
    return np.asarray(per_seg, np.int32)[np.cumsum(start) - 1]


def train(jobs: list, lang: lg.Lang, opts: RecipeOptions,
          on_stage: Callable[[Stage, list], None] | None = None) -> tuple[Stage, History]:
    """Both stages; `on_stage(stage, jobs)` after each (e.g. to score its alignments).
    With `opts.guided`, each stage's guided alignment follows its free one, and is passed
    to `on_stage` too, as the stage `<name>_guided`."""
    hist = History()

    def done(st: Stage) -> Stage:
        if on_stage:
            on_stage(st, jobs)
        if opts.guided:  # the next stage's tree and transforms learn the guided alignment
            _align(jobs, st, opts, guided=True)
            if on_stage:
                on_stage(dataclasses.replace(st, name=f"{st.name}_guided"), jobs)
        return st

    def timed(make: Callable[[], Stage]) -> Stage:
        t0 = time.perf_counter()
        st = make()
        hist.seconds[st.name] = round(time.perf_counter() - t0, 1)
        log.info("align %s stage trained in %.1f s", st.name, hist.seconds[st.name])
        return done(st)

    mono = timed(lambda: monophone(jobs, lang, opts, hist))
    final = timed(lambda: triphone(jobs, lang, mono, opts, hist))
    if opts.lda_mllt:
        final = timed(lambda: lda_mllt(jobs, lang, final, opts, hist))
    if opts.sat:
        final = timed(lambda: sat(jobs, lang, final, opts, hist))
    if opts.nnet.rounds:
        final = timed(lambda: nnet_realign(jobs, final, opts, hist))
    if opts.guided:  # the outputs are the final model's free alignment
        _align(jobs, final, opts)
    return final, hist


def failures(jobs: list) -> dict[str, str]:
    out: dict[str, str] = {}
    for rep in run_jobs(jobs, "report"):
        out.update(rep.failed)
    return out

