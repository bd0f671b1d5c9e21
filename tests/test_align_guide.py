"""align.guide=ctm: alignment kept to a reference CTM (alignment/guide.py), the stacked GMM
scorer it runs on, and the recipe trained from the reference."""
from __future__ import annotations

import numpy as np
import pytest

from alignment import ctm as C
from alignment import gmm, guide
from alignment import lexicon_graphs as lg
from alignment.jobs import run_jobs
from alignment.train import History, RecipeOptions, monophone, train
from core.config import ConfigError, load_config
from tasks.alignments import read_ctm
from tests.test_align import _tiny_jobs


def _lang() -> lg.Lang:
    return lg.make_lang({"cat": [("k", "a", "t")], "at": [("a", "t")]}, stops={"t", "k"})


def test_allowed_phones_follow_the_reference_and_allow_the_next_stops_closure():
    lang = _lang()
    pid = lang.phone_id
    ref = [("sil", 0.0, 0.03), ("a", 0.03, 0.08), ("t", 0.08, 0.12), ("zz", 0.12, 0.14)]
    ok = guide.allowed_phones(ref, 16, lang)
    assert ok.shape == (16, len(lang.phones))
    assert [np.flatnonzero(ok[t]).tolist() for t in (0, 3, 8)] == \
        [[pid["sil"]], [pid["a"], pid["t_cl"]], [pid["t"]]]
    assert ok[12].all() and ok[13].all()     # a phone the lexicon does not know: anything
    assert ok[14].all() and ok[15].all()     # past the reference's end: anything
    shared = lg.make_lang({"cat": [("k", "a", "t")]}, stops={"t", "k"}, shared_closure=True)
    ok = guide.allowed_phones(ref, 16, shared)
    assert np.flatnonzero(ok[3]).tolist() == [shared.phone_id["a"], shared.phone_id["kt_cl"]]


def test_pdf_scorer_is_kaldis_log_likelihood_of_every_pdf():
    am = gmm.khg.AmDiagGmm()
    rng = np.random.default_rng(0)
    for j in range(3):
        am.add_pdf(gmm.single_gaussian(rng.normal(size=4), np.full(4, 0.5 + j)))
    gmm.mix_up(am, np.array([100, 400, 900], np.float32), 9, power=0.2, seed=1)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    got = gmm.PdfScorer.of(am)(x)
    want = [[am.log_likelihood(j, x[t]) for j in range(3)] for t in range(5)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _frames_right(job, tm, ref: dict, lang) -> float:
    """Share of the job's frames whose aligned phone is the reference's (ctm.score)."""
    score = C.Score()
    for r in job.results(tm):
        hyp = [(lang.phones[p], s * 0.01, (s + n) * 0.01)
               for p, s, n in C.segments(r["phones"], r["starts"])]
        score.add(C.score(hyp, ref[r["utt_id"]], len(r["phones"])))
    return score.frames_right / score.frames


def test_guided_alignment_keeps_to_a_reference_the_acoustics_disagree_with(tiny_corpus):
    jobs, lang, _ = _tiny_jobs(tiny_corpus, 1)
    job = jobs[0]
    mono = monophone(jobs, lang, RecipeOptions(mono_iters=4, mono_gauss=200), History())
    # unguided: the scorer's matrix through DecodableCtc is gmm.align's own search
    u = job.ids()[0]
    free, _ = gmm.align(mono.tm, mono.am, job.graphs[u], job.feats[u], 10.0, 40.0)
    ll = 0.1 * gmm.PdfScorer.of(mono.am)(job.feats[u])[:, gmm.pdf_of_transitions(mono.tm)[1:]]
    assert gmm.align_loglikes(mono.tm, job.graphs[u], ll, 10.0, 40.0)[0] == free
    # a reference the model did not find: its own alignment with the start of every
    # segment of >= 8 frames 2 frames later (a 5-state silence still fits)
    ref = {}
    for r in job.results(mono.tm):
        segs = C.segments(r["phones"], r["starts"])
        starts = [s + (2 if k and n >= 8 else 0) for k, (_, s, n) in enumerate(segs)]
        ends = starts[1:] + [len(r["phones"])]
        ref[r["utt_id"]] = [(lang.phones[p], a * 0.01, b * 0.01)
                            for (p, _, _), a, b in zip(segs, starts, ends)]
    assert _frames_right(job, mono.tm, ref, lang) < 0.97   # the free path is elsewhere
    run_jobs(jobs, "set_guide", ref)
    job.align_guided(mono.tm, mono.am, 10.0, 40.0)
    assert _frames_right(job, mono.tm, ref, lang) == 1.0


def test_recipe_trained_from_the_reference_ctm_agrees_with_it(tiny_corpus):
    ref = {u: list(zip(a.phones, a.starts.tolist(), a.ends.tolist()))
           for u, a in read_ctm((tiny_corpus / "alignments.ctm").read_text())[0].items()}
    opts = dict(mono_iters=4, tri_iters=2, num_senones=250, mono_gauss=300, tri_gauss=400)
    scores, seen = {}, {}
    for guided in (False, True):
        jobs, lang, _ = _tiny_jobs(tiny_corpus, 2)
        if guided:
            run_jobs(jobs, "set_guide", ref)

        def on_stage(st, js, guided=guided):
            seen[(guided, st.name)] = np.mean([_frames_right(j, st.tm, ref, lang) for j in js])
        final, hist = train(jobs, lang, RecipeOptions(**opts, guided=guided), on_stage)
        assert {it["stage"] for it in hist.iters} == {"mono", "tri"}
        scores[guided] = np.mean([_frames_right(j, final.tm, ref, lang) for j in jobs])
    # each stage's free alignment is passed on, and with guided its guided one after it;
    # the outputs are the last stage's free alignment
    assert sorted(seen) == [(False, "mono"), (False, "tri"), (True, "mono"),
                            (True, "mono_guided"), (True, "tri"), (True, "tri_guided")]
    assert scores[True] == seen[(True, "tri")]
    kept = seen[(True, "tri_guided")]
    # four utterances: the flat start barely learns; the reference's own segmentation does
    assert scores[True] > scores[False] + 0.05, scores
    assert kept > 0.9 and kept >= scores[True], (kept, scores)


def test_guide_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="align.guide"):
        load_config(None, ["align.guide=reference"])
    with pytest.raises(ConfigError, match="align.guide"):
        load_config(None, ["align.guide=ctm", "align.nnet_rounds=1"])
    assert load_config(None, ["align.guide=ctm"]).align.guide == "ctm"


def test_align_step_trained_from_the_corpus_ctm_reports_both_bounds(tiny_corpus, tmp_path):
    import shutil

    from core.runs import StepContext, StepError
    from amflow.steps import align, select

    sets = [f"storage.root={tmp_path}", f"data.corpus={tiny_corpus}", "select.splits=[labeled]",
            "select.hours=0.004", "align.use_ray=false", "align.mono_iters=4",
            "align.tri_iters=2", "align.num_senones=250", "align.tri_gauss=400",
            "align.mono_gauss=300", "align.guide=ctm"]
    cfg = load_config(None, sets)
    select.run(StepContext(cfg, "r", "select"))
    m = align.run(StepContext(cfg, "r", "align"))["metrics"]
    assert m["guide"] == "ctm"
    for stage in ("mono", "tri"):
        free, kept = m[f"score_{stage}"], m[f"score_{stage}_guided"]
        assert free["frames"] == kept["frames"] > 0
        assert kept["frame_phone_accuracy"] > 0.9
    # no reference CTM: a clear error, before any training
    bare = tmp_path / "bare"
    shutil.copytree(tiny_corpus, bare, ignore=shutil.ignore_patterns("alignments.ctm"))
    cfg = load_config(None, [*sets, f"data.corpus={bare}"])
    select.run(StepContext(cfg, "b", "select"))
    with pytest.raises(StepError, match="align.guide=ctm needs the corpus's reference CTM"):
        align.run(StepContext(cfg, "b", "align"))
