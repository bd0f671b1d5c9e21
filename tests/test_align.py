"""amflow align: flat start, the hand-written decision tree, CTM scoring, the step."""
from __future__ import annotations

import json

import kaldi_hmm_gmm  # noqa: F401  first: the OpenFST import-order trap (alignment/__init__.py)
import numpy as np
import pyarrow.parquet as pq
import pytest

from alignment import ctm as C
from alignment import gmm
from alignment import lexicon_graphs as lg
from alignment.features import FeatureOptions
from alignment.jobs import ShardJob, Utterance, run_jobs
from alignment.train import History, RecipeOptions, monophone
from alignment.tree import TreeStats, build_tree
from core.config import ConfigError, load_config
from core.senones import ContextTree


def _synthetic_tree_stats(rng: np.random.Generator) -> tuple[TreeStats, dict[int, int]]:
    """Phone 1 silence (5 states), phones 2..6 (3 states); the left context 3 and the
    state shift the mean, so splits on the left phone gain likelihood."""
    classes = {1: 5, 2: 3, 3: 3, 4: 3, 5: 3, 6: 3}
    keys, feats = [], []
    for _ in range(6000):
        p, left, right, c = (int(rng.integers(2, 7)), int(rng.integers(0, 7)),
                             int(rng.integers(0, 7)), int(rng.integers(0, 3)))
        keys.append((left, p, right, c))
        feats.append(rng.standard_normal(3) + 2.0 * (left == 3) + c + p)
    for _ in range(500):
        keys.append((0, 1, 0, int(rng.integers(0, 5))))
        feats.append(rng.standard_normal(3))
    st = TreeStats(3)
    st.add_frames(np.array(keys), np.array(feats))
    return st, classes


def test_tree_has_num_senones_leaves_and_maps_every_context():
    st, classes = _synthetic_tree_stats(np.random.default_rng(0))
    tree = build_tree(st, classes, 40, no_split={1}, min_count=20)
    assert tree.num_leaves == 40
    cd = tree.context_dependency()  # Kaldi's own reader parsed the hand-written bytes
    assert (cd.num_pdfs, cd.context_width, cd.central_position) == (40, 3, 1)
    seen = set()
    for left in range(7):
        for p, n in classes.items():
            for right in range(7):
                for c in range(n):
                    ok, pdf = cd.compute([left, p, right], c)
                    assert ok and 0 <= pdf < 40
                    seen.add(pdf)
                    if p == 1:  # silence is not split: one pdf per state
                        assert pdf == cd.compute([0, 1, 0], c)[1]
    assert seen == set(range(40))
    # the first split of a speech phone asks about the left context (it moves the mean)
    assert str(cd).count("SE 0") >= 5
    with pytest.raises(ValueError, match="num_senones"):
        build_tree(st, classes, 10, no_split={1})


def test_tree_stats_merge_is_the_sum_of_shards():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 3, size=(200, 4))
    feats = rng.standard_normal((200, 2))
    whole = TreeStats(2)
    whole.add_frames(keys, feats)
    a, b = TreeStats(2), TreeStats(2)
    a.add_frames(keys[:77], feats[:77])
    b.add_frames(keys[77:], feats[77:])
    merged = a.merge(b)
    assert merged.table.keys() == whole.table.keys()
    for k in whole.table:
        np.testing.assert_allclose(merged.table[k], whole.table[k])


def test_ctm_score_counts_frames_and_boundaries():
    ref = [("sil", 0.0, 0.1), ("a", 0.1, 0.3), ("b", 0.3, 0.5)]
    hyp = [("sil", 0.0, 0.12), ("a", 0.12, 0.35), ("b", 0.35, 0.5)]
    sc = C.score(hyp, ref, 50)
    assert sc.frames == 50 and sc.frames_right == 50 - 2 - 5
    # a: start 20 ms off (within), end 50 ms off; b: start 50 ms off, end exact
    assert (sc.boundaries, sc.boundaries_within) == (4, 2)
    assert sc.same_sequence == 1
    assert sc.summary()["frame_phone_accuracy_same_sequence"] == round(43 / 50, 4)
    other = C.score([("sil", 0.0, 0.1), ("a", 0.1, 0.5)], ref, 50)  # b not spoken
    assert other.same_sequence == other.same_sequence_frames == 0
    both = C.Score().add(sc).add(other).summary()
    assert both["frame_phone_accuracy_same_sequence"] == round(43 / 50, 4)
    assert both["frame_phone_accuracy"] == round((43 + 30) / 100, 4)
    segs = C.segments(np.array([1, 1, 2, 2, 2, 2]), np.array([1, 0, 1, 0, 1, 0], bool))
    assert segs == [(1, 0, 2), (2, 2, 2), (2, 4, 2)]
    assert C.ctm_lines("u", segs, ["<eps>", "sil", "a"])[1] == "u 1 0.02 0.02 a"


def test_closures_get_their_own_phone_and_fold_into_the_phone_before():
    lang = lg.make_lang({"cat": [("k", "a", "t")], "at": [("a", "t")]}, stops={"t", "k"})
    assert lang.prons["cat"] == [("k_cl", "k", "a", "t_cl", "t")]
    cl = lang.closure_ids
    assert {lang.phones[i] for i in cl} == {"k_cl", "t_cl"} and not cl & set(lang.nonsil_ids)
    topo = lg.topology(lang)
    assert all(topo.num_pdf_classes(i) == 1 for i in cl)
    pid = lang.phone_id
    # k_cl k a a t_cl t_cl t: the first closure goes to silence, the second to "a"
    seq = ["k_cl", "k", "a", "a", "t_cl", "t_cl", "t"]
    phones = np.array([pid[p] for p in seq])
    starts = np.array([1, 1, 1, 0, 1, 0, 1], bool)
    ph, st = C.fold_closures(phones, starts, cl, lang.sil_id)
    assert [lang.phones[p] for p in ph] == ["sil", "k", "a", "a", "a", "a", "t"]
    assert C.segments(ph, st) == [(lang.sil_id, 0, 1), (pid["k"], 1, 1), (pid["a"], 2, 4),
                                  (pid["t"], 6, 1)]
    # align.shared_closure: one closure phone before every stop, a one-state model
    shared = lg.make_lang({"cat": [("k", "a", "t")]}, stops={"t", "k"},
                          shared_closure=True)
    assert shared.prons["cat"] == [("kt_cl", "k", "a", "kt_cl", "t")]
    assert shared.closure_of == {"k": "kt_cl", "t": "kt_cl"}
    assert [shared.phones[i] for i in shared.closure_ids] == ["kt_cl"]
    assert lg.topology(shared).num_pdf_classes(shared.phone_id["kt_cl"]) == 1


def _three_pdfs() -> "gmm.khg.AmDiagGmm":
    am = gmm.khg.AmDiagGmm()
    for j in range(3):
        am.add_pdf(gmm.single_gaussian(np.full(4, float(j)), np.full(4, 0.5 + j)))
    return am


def test_mix_up_is_reproducible_and_splits_as_kaldi_allocates():
    # kaldi-hmm-gmm's own split perturbs from a random source srand does not reach: the
    # same model mixed up twice differed. gmm.mix_up takes the same allocation, seeded.
    occs = np.array([100, 400, 900], np.float32)
    a, b = _three_pdfs(), _three_pdfs()
    for am in (a, b):
        gmm.mix_up(am, occs, 10, power=0.2, seed=5)
    kaldi = _three_pdfs()
    kaldi.split_by_count(state_occs=occs, target_components=10, perturb_factor=0.01,
                         power=0.2, min_count=20.0)
    assert a.num_gauss == 10
    for j in range(3):
        assert a.num_gauss_in_pdf(j) == kaldi.num_gauss_in_pdf(j)
        pa, pb = a.get_pdf(j), b.get_pdf(j)
        np.testing.assert_array_equal(pa.means, pb.means)
        np.testing.assert_array_equal(pa.weights, pb.weights)
        assert len({tuple(m) for m in pa.means}) == pa.num_gauss  # split apart
        # the perturbation is small against the parent's spread, and the weights still sum to 1
        assert np.abs(pa.means - j).max() < 0.2 * np.sqrt(0.5 + j)
        assert float(np.sum(pa.weights)) == pytest.approx(1.0, abs=1e-6)
    other = _three_pdfs()
    gmm.mix_up(other, occs, 10, power=0.2, seed=6)
    assert not np.array_equal(other.get_pdf(2).means, a.get_pdf(2).means)


def test_boost_silence_raises_only_the_silence_pdfs_log_likelihood_by_log_boost():
    am = _three_pdfs()
    gmm.mix_up(am, np.array([100, 400, 900], np.float32), 7, power=0.2, seed=5)
    boosted = gmm.boost_silence(am, [1], 1.25)
    x = np.linspace(-1, 2, 4).astype(np.float32)
    assert boosted.log_likelihood(1, x) == pytest.approx(am.log_likelihood(1, x) + np.log(1.25),
                                                         abs=1e-4)
    for j in (0, 2):
        assert boosted.log_likelihood(j, x) == pytest.approx(am.log_likelihood(j, x), abs=1e-6)
    assert float(np.sum(am.get_pdf(1).weights)) == pytest.approx(1.0, abs=1e-6)  # a copy


def _training_graph(words: list[str]):
    prons = {"a": [("ah", "b")], "bee": [("b", "iy")], "cat": [("k", "ah", "t")],
             "the": [("dh", "ah"), ("dh", "iy")]}
    lang = lg.make_lang(prons)
    topo = lg.topology(lang)
    tree = gmm.monophone_tree(topo)
    tm = gmm.khg.TransitionModel(ctx_dep=tree, hmm_topo=topo)
    gc = lg.graph_compiler(lang, tm, tree, lg.lexicon_fst(lang))
    return gc.compile_graph_from_text(lg.word_ids(lang, words)[0]), tm, lang


def test_equal_align_is_a_path_of_the_graph_spread_over_every_frame():
    words = ["the", "cat", "a", "bee"]
    g, tm, lang = _training_graph(words)
    ali = gmm.equal_align(g, 120)
    assert len(ali) == 120 and ali == gmm.equal_align(g, 120)
    phones, _, start = gmm.phones_and_pdfs(tm, ali)
    spoken = [lang.phones[p] for p in phones[start] if p != lang.sil_id]
    assert spoken in (["dh", v, "k", "ah", "t", "ah", "b", "b", "iy"] for v in ("ah", "iy"))
    # frames spread equally: every phone's 3 states hold 120 / (phones x 3) frames or so
    seg = np.diff(np.flatnonzero(np.append(start, True)))
    assert seg.max() <= 2 * seg[phones[start] != lang.sil_id].min() + 3
    assert gmm.equal_align(g, 26) is None  # 9 phones x 3 states > 26 frames
    paths = {tuple(gmm.equal_align(g, 120, seed=s)) for s in range(8)}
    assert len(paths) > 1  # the seed draws the path (silences, pronunciations)


def test_flat_start_draws_each_utterance_its_own_path_and_repeats_it():
    # one seed for every utterance (Kaldi's srand(3) per call) gave every path the same
    # first choice: no utterance's leading silence went to silence
    _, tm, lang = _training_graph(["the"])
    tree = gmm.monophone_tree(lg.topology(lang))
    noise = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    utts = [Utterance(f"u{i}", "spk", ["the", "cat", "a", "bee"], noise) for i in range(8)]

    def flat_start() -> dict:
        job = ShardJob("s", lambda: (utts, []), lang, FeatureOptions())
        job.compile(tm, tree)
        job.equal_align()
        return job.ali

    first, again = flat_start(), flat_start()
    assert first == again
    starts_silent = {u: tm.transition_id_to_phone(a[0]) == lang.sil_id for u, a in first.items()}
    assert len(set(starts_silent.values())) == 2, starts_silent


def test_equal_align_gives_the_quiet_edges_to_silence_and_spreads_the_rest():
    g, tm, lang = _training_graph(["the", "cat", "a", "bee"])
    is_sil = gmm.phone_of_transitions(tm) == lang.sil_id
    for lead, trail in [(20, 15), (0, 30), (7, 0), (0, 0)]:
        for seed in range(4):
            ali = gmm.equal_align(g, 120, seed=seed, edges=gmm.SilenceEdges(lead, trail, is_sil))
            sil = np.array([is_sil[t] for t in ali])
            assert len(ali) == 120
            assert sil[:lead].all() and not sil[lead], (lead, trail, seed)
            assert sil[120 - trail:].all() and not sil[119 - trail], (lead, trail, seed)
            phones, _, start = gmm.phones_and_pdfs(tm, ali)
            seg = np.diff(np.flatnonzero(np.append(start, True)))
            speech = seg[phones[start] != lang.sil_id]
            assert speech.max() <= 2 * speech.min() + 3  # the phones still share equally


def test_quiet_edges_are_frames_far_below_the_loudest():
    nats = 10 * np.log10(np.e)  # dB per nat of log energy
    e = np.concatenate([np.full(10, -60.0), np.full(50, -10.0), np.full(5, -60.0)]) / nats
    assert gmm.quiet_edges(e, 30.0) == (10, 5)
    assert gmm.quiet_edges(e, 60.0) is None      # nothing 60 dB down: nothing to tell
    short = np.concatenate([np.full(2, -60.0), np.full(50, -10.0), np.full(4, -60.0)]) / nats
    assert gmm.quiet_edges(short, 30.0) == (0, 4)  # under silence's 3 states: none


def test_flat_start_puts_the_recordings_silent_edges_in_silence():
    _, tm, lang = _training_graph(["the"])
    tree = gmm.monophone_tree(lg.topology(lang))
    rng = np.random.default_rng(0)
    speech = rng.standard_normal(8000).astype(np.float32) * 0.1
    samples = np.concatenate([np.zeros(4000, np.float32), speech, np.zeros(2400, np.float32)])
    utts = [Utterance(f"u{i}", "spk", ["the", "cat", "a", "bee"], samples) for i in range(4)]
    job = ShardJob("s", lambda: (utts, []), lang, FeatureOptions())
    job.compile(tm, tree)
    rep = job.equal_align(tm, 30.0)
    assert rep.quiet_edges == 4
    for a in job.ali.values():  # 0.25 s of zeros, then 0.5 s of noise, then 0.15 s
        sil = np.array([tm.transition_id_to_phone(t) == lang.sil_id for t in a])
        first, last = np.flatnonzero(~sil)[[0, -1]]  # (between words, silence as drawn)
        assert 23 <= first <= 25 and 74 <= last <= 76, (first, last)


def test_equal_align_ignores_other_threads_drawing_from_rand(tmp_path):
    # kaldifst.equal_align draws from the C library's rand(), which Ray's own threads draw
    # from too: in actors the same graph got another path now and then, and the flat start
    # then gave another model. A native thread calling rand() in a loop shows it here.
    import ctypes
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the rand() thread")
    src = tmp_path / "spin.c"
    src.write_text("#include <pthread.h>\n#include <stdlib.h>\n"
                   "static volatile int halt; static pthread_t th;\n"
                   "static void *spin(void *a) { while (!halt) rand(); return a; }\n"
                   "void begin(void) { pthread_create(&th, 0, spin, 0); }\n"
                   "void end(void) { halt = 1; pthread_join(th, 0); }\n")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "spin.so"), str(src),
                    "-lpthread"], check=True)
    spin = ctypes.CDLL(str(tmp_path / "spin.so"))
    g, _, _ = _training_graph(["the", "cat", "a", "bee", "the", "cat"])
    quiet = gmm.equal_align(g, 150)
    spin.begin()
    try:
        busy = [gmm.equal_align(g, 150) for _ in range(100)]
    finally:
        spin.end()
    assert all(b == quiet for b in busy)


def test_align_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="align.retry_beam"):
        load_config(None, ["align.beam=20", "align.retry_beam=10"])
    with pytest.raises(ConfigError, match="align.splits"):
        load_config(None, ["align.splits=[bogus]"])
    with pytest.raises(ConfigError, match="align.lda_dim"):
        load_config(None, ["align.splice_context=1", "align.lda_dim=40"])  # 39 spliced dims
    with pytest.raises(ConfigError, match="align.boost_silence"):
        load_config(None, ["align.boost_silence=0"])
    with pytest.raises(ConfigError, match="align.fmllr_iters"):
        load_config(None, ["align.sat=true", "align.fmllr_iters=[2,-1]"])
    with pytest.raises(ConfigError, match="align.baum_welch_passes"):
        load_config(None, ["align.mono_iters=10", "align.baum_welch_passes=10"])
    with pytest.raises(ConfigError, match="align.baum_welch_scale"):
        load_config(None, ["align.baum_welch_scale=0"])
    with pytest.raises(ConfigError, match="align.mono_subset"):
        load_config(None, ["align.mono_subset=-1"])
    assert load_config(None, ["align.num_senones=800"]).align.num_senones == 800


def _tiny_jobs(tiny_corpus, n_jobs: int):
    """The tiny corpus's labeled utterances as `n_jobs` in-process jobs."""
    from core.config import FeaturesConfig
    from core.storage import Storage
    from core.config import StorageConfig
    from decoding.lexicon import read_lexicon, words_of
    from tasks.audio import load_audio
    from tasks.select import records_of_split

    st = Storage(StorageConfig())
    recs, _ = records_of_split(st, str(tiny_corpus), "labeled")
    recs = sorted(recs, key=lambda r: r.utt_id)[:4]
    fcfg = FeaturesConfig()
    utts = []
    for r in recs:
        samples, reason = load_audio(st, str(tiny_corpus / r.audio_uri), fcfg)
        assert samples is not None, reason
        utts.append(Utterance(r.utt_id, r.speaker_id, words_of(r.text), samples))
    lang = lg.make_lang(read_lexicon((tiny_corpus / "lexicon.txt").read_text()).prons)
    parts = [utts[i::n_jobs] for i in range(n_jobs)]
    jobs = [ShardJob(f"s{i}", (lambda p=p: (p, [])), lang, FeatureOptions())
            for i, p in enumerate(parts)]
    return jobs, lang, utts


def test_flat_start_converges_and_alignments_cover_every_frame(tiny_corpus):
    jobs, lang, utts = _tiny_jobs(tiny_corpus, 2)
    hist = History()
    opts = RecipeOptions(mono_iters=6, realign_every=2, mono_gauss=300)
    mono = monophone(jobs, lang, opts, hist)
    ll = [it["loglike_per_frame"] for it in hist.iters]
    assert ll[-1] > ll[0] + 1.0, ll            # the flat start learns
    assert hist.realignments["mono"] >= 3
    rows = [r for rs in run_jobs(jobs, "results", mono.tm) for r in rs]
    assert {r["utt_id"] for r in rows} == {u.utt_id for u in utts}
    for job in jobs:
        for r in job.results(mono.tm):
            assert len(r["phones"]) == len(job.feats[r["utt_id"]])  # every frame aligned
            assert (r["phones"] >= 1).all() and r["starts"][0]
            assert (r["senones"] < mono.tm.num_pdfs).all()


def test_baum_welch_passes_train_the_flat_start_then_viterbi_realigns(tiny_corpus):
    jobs, lang, _ = _tiny_jobs(tiny_corpus, 1)
    hist = History()
    opts = RecipeOptions(mono_iters=5, realign_every=2, mono_gauss=200, baum_welch_passes=2,
                         baum_welch_scale=0.3)
    mono = monophone(jobs, lang, opts, hist)
    assert [(it["soft"], it["realigned"]) for it in hist.iters] == [
        (False, False), (True, False), (True, False), (False, True), (False, True)]
    ll = [it["loglike_per_frame"] for it in hist.iters]
    assert ll[2] > ll[1]  # EM: the soft passes raise the (scaled) likelihood
    for r in jobs[0].results(mono.tm):
        assert len(r["phones"]) == len(jobs[0].feats[r["utt_id"]])


def test_mono_subset_trains_on_the_shortest_then_aligns_every_utterance(tiny_corpus):
    jobs, lang, utts = _tiny_jobs(tiny_corpus, 2)
    frames = {u: len(f) for j in jobs for u, f in j.feats.items()}
    shortest = sorted(frames, key=lambda u: (frames[u], u))[:2]
    hist = History()
    opts = RecipeOptions(mono_iters=4, realign_every=2, mono_gauss=200, mono_subset=2)
    mono = monophone(jobs, lang, opts, hist)
    # every pass trained on the two shortest utterances' frames only
    assert {it["frames"] for it in hist.iters} == {sum(frames[u] for u in shortest)}
    assert hist.flat_start["utterances"] == 2
    assert hist.flat_start["subset"] == {
        "utterances": 2, "of": 4, "frames": sum(frames[u] for u in shortest),
        "max_frames": frames[shortest[-1]]}
    # then the subset's model aligned all four (the tree's statistics need them)
    rows = [r for rs in run_jobs(jobs, "results", mono.tm) for r in rs]
    assert sorted(r["utt_id"] for r in rows) == sorted(u.utt_id for u in utts)
    assert all(len(r["phones"]) == frames[r["utt_id"]] for r in rows)
    assert hist.realignments["mono"] == 2  # pass 2, then all four at the stage's end


def test_shard_statistics_sum_to_the_single_job_statistics(tiny_corpus):
    one, lang, _ = _tiny_jobs(tiny_corpus, 1)
    two, _, _ = _tiny_jobs(tiny_corpus, 2)
    topo = lg.topology(lang)
    tree = gmm.monophone_tree(topo)
    stats = [run_jobs(js, "feature_stats") for js in (one, two)]
    n = stats[0][0][0]
    assert n == sum(s[0] for s in stats[1])
    mean, var = stats[0][0][1] / n, stats[0][0][2] / n - (stats[0][0][1] / n) ** 2
    tm, am = gmm.init_flat(tree, topo, mean, var)
    for js in (one, two):
        run_jobs(js, "compile", tm, tree)
        run_jobs(js, "equal_align")
    a = run_jobs(one, "accumulate", tm, am)[0]
    parts = run_jobs(two, "accumulate", tm, am)
    b = parts[0].add(parts[1])
    assert a.frames == b.frames and a.loglike == pytest.approx(b.loglike, rel=1e-6)
    for j in range(len(a.occ)):
        np.testing.assert_allclose(a.x[j], b.x[j], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a.trans, b.trans)
    # Baum-Welch statistics reduce the same way
    a = run_jobs(one, "accumulate_soft", tm, am, 0.3)[0]
    parts = run_jobs(two, "accumulate_soft", tm, am, 0.3)
    b = parts[0].add(parts[1])
    assert a.frames == b.frames == n and a.loglike == pytest.approx(b.loglike, rel=1e-9)
    assert sum(o.sum() for o in a.occ) == pytest.approx(n)
    for j in range(len(a.occ)):
        np.testing.assert_allclose(a.x2[j], b.x2[j], rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(a.trans, b.trans)


def test_align_step_end_to_end(tiny_corpus, tmp_path):
    from core.runs import StepContext
    from amflow.steps import align
    from amflow.steps import select

    cfg = load_config(None, [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}",
                             "select.splits=[labeled]", "select.hours=0.004",
                             "align.use_ray=false", "align.mono_iters=4", "align.tri_iters=2",
                             "align.num_senones=250", "align.tri_gauss=400",
                             "align.mono_gauss=300"])
    select.run(StepContext(cfg, "r", "select"))
    out = align.run(StepContext(cfg, "r", "align"))
    c = out["counts"]
    assert c["in"] == c["out"] + c["rejected"] and c["out"] >= 3
    d = tmp_path / "runs" / "r" / "align"
    table = pq.read_table(list((d / "alignments").glob("*.parquet"))[0])
    for n, ph, sen, nn in zip(*(table.column(k).to_pylist() for k in
                                ("num_frames", "phones", "senones", "nn_senones"))):
        assert n == len(ph) == len(sen) and max(sen) < out["metrics"]["num_senones"]
        assert len(nn) == n and max(nn) < out["metrics"]["nn_senones"]
    # the network's tree: one class per (phone in context), each frame's class's phone
    # is the frame's aligned phone
    tree = ContextTree.from_dict(json.loads((d / "nn_tree.json").read_text()))
    names = [p.split()[0] for p in (d / "phones.txt").read_text().splitlines()]
    leaf_phone = tree.leaf_phone
    for ph, nn in zip(table.column("phones").to_pylist(), table.column("nn_senones").to_pylist()):
        assert [leaf_phone[c] for c in nn] == [names[p] for p in ph]
    assert (d / "nn_tree").read_bytes().startswith(b"\0BContextDependency ")
    assert (d / "tree").read_bytes().startswith(b"\0BContextDependency ")
    assert (d / "final.mdl").read_text().startswith("<TransitionModel>")
    ctm = (d / "alignments.ctm").read_text().splitlines()
    assert {ln.split()[0] for ln in ctm} == set(table.column("utt_id").to_pylist())
    m = out["metrics"]
    assert m["score_tri"]["frames"] > 0 and 0 <= m["score_tri"]["frame_phone_accuracy"] <= 1
    assert set(m["stage_seconds"]) == {"mono", "tri"}  # what each stage cost, and each pass
    assert all(it["seconds"] >= 0 for it in m["iterations"])
    passes = sum(it["seconds"] for it in m["iterations"])  # (both rounded)
    assert passes <= sum(m["stage_seconds"].values()) + 0.1
    assert json.loads((d / "_SUCCESS.json").read_text())["counts"] == c
    # a re-run is a no-op; another setting starts over
    assert align.run(StepContext(cfg, "r", "align"))["finished_at"] == out["finished_at"]
    sets2 = [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}",
             "select.splits=[labeled]", "select.hours=0.004", "align.use_ray=false",
             "align.mono_iters=3", "align.tri_iters=2", "align.num_senones=250",
             "align.tri_gauss=400", "align.mono_gauss=300", "align.lda_mllt=true",
             "align.splice_context=2", "align.lda_dim=20", "align.sat=true",
             "align.fmllr_iters=[1]", "align.fmllr_min_frames=50", "align.nnet_rounds=1",
             "align.nnet_epochs=1"]
    cfg2 = load_config(None, sets2)
    redone = align.run(StepContext(cfg2, "r", "align"))  # (finished_at has 1 s resolution)
    assert redone["metrics"]["iterations"] != out["metrics"]["iterations"]
    # with LDA + MLLT, a third stage on 20-dimensional features, its transform written
    stages = {it["stage"] for it in redone["metrics"]["iterations"]}
    assert stages == {"mono", "tri", "lda_mllt", "sat"}
    assert redone["metrics"]["score_lda_mllt"]["frames"] > 0
    # then SAT: per-speaker fMLLR from the LDA + MLLT model, re-estimated at pass 1 of its own
    fm = redone["metrics"]["fmllr"]
    assert [f["stage"] for f in fm] == ["lda_mllt", "sat"] and fm[0]["speakers"] >= 1
    assert fm[0]["gain_per_frame"] > 0 and redone["metrics"]["score_sat"]["frames"] > 0
    trans = (d / "trans.ark").read_text()
    first = trans.split("]")[0].splitlines()
    assert first[0].endswith("  [") and len(first) == 21 and len(first[1].split()) == 21
    # then a round of realignment by the alignment network (alignment/nnet.py)
    rounds = redone["metrics"]["nnet_rounds"]
    assert len(rounds) == 1 and rounds[0]["aligned"] > 0 and rounds[0]["frames"] > 0
    assert redone["metrics"]["score_nnet"]["frames"] > 0
    assert redone["metrics"]["realignments"]["nnet"] == 1
    mat = (d / "final.mat").read_text().split("]")[0].strip(" [\n").splitlines()
    assert len(mat) == 20 and all(len(r.split()) == 13 * 5 for r in mat)
    assert "<DIMENSION> 20 " in (d / "final.mdl").read_text()
    _a_student_run_takes_the_teachers_tree(tiny_corpus, tmp_path, d / "nn_tree.json")
    _a_run_takes_another_runs_alignments(sets2, redone, d)


def _a_run_takes_another_runs_alignments(sets, first, d):
    """align.reuse=<an align output>: the same utterances, settings, lexicon and corpus give
    that output's alignments, rejects and models, with no GMM trained; another setting is
    an error naming the key."""
    from core.runs import StepContext, StepError
    from amflow.steps import align
    from amflow.steps import select

    cfg = load_config(None, [*sets, f"align.reuse={d}", "align.use_ray=true"])
    select.run(StepContext(cfg, "u", "select"))
    out = align.run(StepContext(cfg, "u", "align"))
    assert out["metrics"]["alignments_from"] == str(d)
    assert out["counts"] == first["counts"] and out["metrics"]["frames"] == \
        first["metrics"]["frames"]
    # scored again over this run's utterances (the same ones here): the source's final score
    assert out["metrics"]["score_taken"] == first["metrics"]["score_nnet"]
    assert out["metrics"]["source_scores"]["score_sat"] == first["metrics"]["score_sat"]
    u = d.parent.parent / "u" / "align"
    mine = sorted(r for f in (u / "alignments").glob("*.parquet")
                  for r in map(str, pq.read_table(f).to_pylist()))
    theirs = sorted(r for f in (d / "alignments").glob("*.parquet")
                    for r in map(str, pq.read_table(f).to_pylist()))
    assert mine == theirs and len(mine) == first["counts"]["out"]
    for name in ("alignments.ctm", "final.mdl", "final.mat", "trans.ark", "nn_tree.json"):
        assert (u / name).read_bytes() == (d / name).read_bytes(), name
    assert align.run(StepContext(cfg, "u", "align"))["finished_at"] == out["finished_at"]
    cfg = load_config(None, [*sets, f"align.reuse={d}", "align.beam=11"])
    with pytest.raises(StepError, match=r"align.reuse: .* other align settings: align.beam"):
        align.run(StepContext(cfg, "u", "align"))


def _a_student_run_takes_the_teachers_tree(tiny_corpus, tmp_path, tree_uri):
    """align.network_tree (a student's run: targets.teacher): the network's classes are the
    given tree's, not grown again; a tree of other phones fails before any training; a
    finished run is kept while the tree there is the same, aligned again when it changed."""
    from core.runs import StepContext, StepError
    from amflow.steps import align
    from amflow.steps import select

    sets = [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}", "select.splits=[labeled]",
            "select.hours=0.004", "align.use_ray=false", "align.mono_iters=2",
            "align.tri_iters=1", "align.num_senones=250", "align.tri_gauss=300",
            "align.mono_gauss=250", "align.nn_senones=80"]
    tree = ContextTree.from_dict(json.loads(tree_uri.read_text()))
    teacher_tree = tmp_path / "teacher_tree.json"  # where a teacher is trained again
    teacher_tree.write_text(tree_uri.read_text())
    cfg = load_config(None, [*sets, f"align.network_tree={teacher_tree}"])
    select.run(StepContext(cfg, "s", "select"))
    out = align.run(StepContext(cfg, "s", "align"))
    d = tmp_path / "runs" / "s" / "align"
    assert ContextTree.from_dict(json.loads((d / "nn_tree.json").read_text())) == tree
    assert out["metrics"]["nn_senones"] == tree.num_leaves != 80
    assert out["metrics"]["network_tree_from"] == str(teacher_tree)
    assert not (d / "nn_tree").exists()  # a taken tree exists as JSON only
    assert align.run(StepContext(cfg, "s", "align"))["finished_at"] == out["finished_at"]
    # the same place now holds another tree (one class per phone): labelled with it
    roots = ContextTree(tree.phones, {p: i for i, p in enumerate(sorted(tree.roots))},
                        len(tree.roots), tree.sil)
    teacher_tree.write_text(json.dumps(roots.to_dict()))
    again = align.run(StepContext(cfg, "s", "align"))
    assert ContextTree.from_dict(json.loads((d / "nn_tree.json").read_text())) == roots
    assert again["metrics"]["nn_senones"] == len(tree.roots) != tree.num_leaves
    table = pq.read_table(list((d / "alignments").glob("*.parquet"))[0])
    assert max(max(nn) for nn in table.column("nn_senones").to_pylist()) < len(tree.roots)
    other = tree.to_dict()
    other["phones"] = [*other["phones"], "zz"]
    (tmp_path / "other.json").write_text(json.dumps(other))
    cfg = load_config(None, [*sets, f"targets.teacher={tmp_path / 'other.json'}"])
    with pytest.raises(StepError, match="targets.teacher: .* same phone set"):
        align.run(StepContext(cfg, "s", "align"))


@pytest.mark.integration
def test_ray_actor_jobs_reduce_to_the_in_process_result(tiny_corpus, ray_local):
    """The same recipe pass on Ray actors (statistics come back read-only from the
    object store) and in-process gives the same model."""
    local, lang, utts = _tiny_jobs(tiny_corpus, 2)
    actor = ray_local.remote(ShardJob).options(num_cpus=0.01)
    parts = [utts[i::2] for i in range(2)]
    remote = [actor.remote(f"s{i}", (lambda p=p: (p, [])), lang, FeatureOptions())
              for i, p in enumerate(parts)]
    opts = RecipeOptions(mono_iters=3, realign_every=2, mono_gauss=200)
    a = monophone(local, lang, opts, History())
    hist = History()
    b = monophone(remote, lang, opts, hist)
    assert a.am.num_gauss == b.am.num_gauss
    ra = [r for rs in run_jobs(local, "results", a.tm) for r in rs]
    rb = [r for rs in run_jobs(remote, "results", b.tm) for r in rs]
    assert [r["utt_id"] for r in ra] == [r["utt_id"] for r in rb]
    for x, y in zip(ra, rb):
        np.testing.assert_array_equal(x["senones"], y["senones"])
    assert len(hist.iters) == 3


def test_align_warns_when_the_tree_has_fewer_leaves_than_asked(caplog):
    from amflow.steps.align import warn_fewer_leaves

    with caplog.at_level("WARNING", logger="amflow.steps.align"):
        warn_fewer_leaves("align.nn_senones", 100, 100, 50.0)
        assert not caplog.records
        warn_fewer_leaves("align.nn_senones", 100, 32, 50.0)
    assert "32 leaves, fewer than align.nn_senones=100" in caplog.text


def test_align_that_rejects_everything_says_why_and_writes_its_rejects(tiny_corpus, tmp_path):
    """align.audio=clean on a split with no clean rendering (the tiny corpus keeps one of
    labeled and dev only): every record is a
    no_clean_audio reject; the error names the reason, the count and the key to change."""
    from core.runs import StepContext, StepError
    from amflow.steps import align, select

    cfg = load_config(None, [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}",
                             "select.splits=[test]", "select.hours=0.002",
                             "align.splits=[test]", "align.audio=clean",
                             "align.use_ray=false", "align.mono_iters=2", "align.tri_iters=1"])
    select.run(StepContext(cfg, "r", "select"))
    shards = json.loads((tmp_path / "runs" / "r" / "select" / "shards.json").read_text())
    n = sum(e["utts"] for e in shards["shards"])
    assert n > 0
    with pytest.raises(StepError) as err:
        align.run(StepContext(cfg, "r", "align"))
    assert f"all {n} utterances were rejected" in str(err.value)
    assert f"no_clean_audio {n}" in str(err.value) and "align.audio=stored" in str(err.value)
    rejects = pq.read_table(tmp_path / "runs" / "r" / "align" / "rejects" / "align.parquet")
    assert rejects.num_rows == n and set(rejects.column("reason").to_pylist()) == \
        {"no_clean_audio"}


def test_nothing_left_names_reasons_counts_and_fixes():
    from core.reject_hints import nothing_left

    msg = nothing_left("evaluate (split 'test')", 5,
                       ["no_clean_audio"] * 3 + ["wrong_sample_rate"] * 2, "")
    assert msg.startswith("evaluate (split 'test'): all 5 utterances were rejected")
    assert "no_clean_audio 3 (" in msg and "evaluate.audio=stored" in msg
    assert "wrong_sample_rate 2 (" in msg and "features.resample=true" in msg
