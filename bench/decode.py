"""`amflow bench decode --run-id R`: decoding speed per core and the oracle WER.

Measured side by side in one process, torch on one thread, on the corpus's test split
(`--data`/data.corpus) with the run's model (`--model`, default runs/<R>/train/model.pt),
LM and graph (as `amflow decode` builds them):
- forward: the acoustic model alone (length-sorted batches), as a real-time factor per
  core (CPU seconds per audio second) and as "x real time";
- forward + search: the same plus the beam search at the acoustic scale `amflow decode`
  tuned for this model (its result.json), else decode.acwt's first value, with
  decode.beam / decode.max_active and with a narrower beam (8 / 1000), and the WER of each;
- search / forward: how much the WFST search adds;
- oracle: the reference alignment's phones as posteriors (0.9 on the aligned class)
  through the same graph: the WER the lexicon, LM and graph allow with a perfect
  acoustic model.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
# torch is deferred to run(): `amflow bench --help` should not pay for it
from core.config import Config, FeaturesConfig
from core.runs import StepContext, StepError
from amflow.services import decoder_setup
from core.storage import join
from decoding import decode as D
from decoding import wer as W
from decoding.assets import DecoderAssets, tuned_acwt
from decoding.graph import read_graph
from decoding.lexicon import words_of
from decoding.search import Searcher, acoustic_scores, log_priors, oracle_log_posteriors
from tasks import alignments as al
from tasks.alignments import read_ctm
from tasks.fbank import FbankComputer
from training.loop import dataclass_from_dict

# The narrower search printed beside decode.beam's: the speed/accuracy trade in one run.
FAST_BEAM, FAST_MAX_ACTIVE = 8.0, 1000


def _oracle_rows(rec, aligns, ids, fcfg: FeaturesConfig, num_rows: int) -> np.ndarray | None:
    a = aligns.get(rec.utt_id)
    if a is None:
        return None
    n100 = FbankComputer(fcfg).num_frames(int(round(rec.duration * fcfg.sample_rate)))
    fl, _, _ = al.frame_labels_ids(a.starts, a.ends,
                                   np.array([ids.get(p, ids.get("<unk>", 0)) for p in a.phones]),
                                   n100, fcfg)
    return None if fl is None else al.lfr_labels(fl, num_rows, fcfg.stack, fcfg.subsample)


def _beams(a: DecoderAssets, feats, post, forward_s: float, audio_s: float, acwt: float,
           cfg: Config) -> tuple[list[dict], list, Searcher]:
    """forward + search per beam (decode.beam's and the narrower one): speed and WER."""
    graph, prior = read_graph(a.graph_dir), a.log_prior
    beams = [(cfg.decode.beam, cfg.decode.max_active)]
    if (FAST_BEAM, FAST_MAX_ACTIVE) != beams[0]:
        beams.append((FAST_BEAM, FAST_MAX_ACTIVE))
    rows = []
    for beam, max_active in beams:
        searcher = Searcher(graph, beam, max_active)
        t0 = time.process_time()
        hyps = [searcher.best_words(acoustic_scores(lp, prior, acwt))[0] for lp in post]
        search_s = time.process_time() - t0
        wer = W.aggregate(W.score(words_of(r.text), h, r.condition)
                          for (r, _), h in zip(feats, hyps))
        rows.append({"beam": beam, "max_active": max_active, "search_s": search_s,
                     "forward_plus_search_rtf_per_core": (forward_s + search_s) / audio_s,
                     "forward_plus_search_x_real_time": audio_s / (forward_s + search_s),
                     "search_over_forward": search_s / forward_s,
                     "model_wer": wer["wer"], "model_per_condition": wer["per_condition"]})
    return rows, beams, searcher


def _oracle(st, corpus: str, a: DecoderAssets, feats, searcher: Searcher) -> list:
    """The reference alignment's phones as posteriors through the same graph."""
    phones = a.phones
    fcfg = dataclass_from_dict(FeaturesConfig, a.card.features)
    aligns, _ = read_ctm(st.read_text(join(corpus, "alignments.ctm")))
    ids = {p: i for i, p in enumerate(phones)}
    uniform = log_priors(np.ones(len(phones)))
    oracle = []
    for (r, x) in feats:
        labels = _oracle_rows(r, aligns, ids, fcfg, len(x))
        if labels is not None:
            lp = oracle_log_posteriors(labels, len(phones))
            words = searcher.best_words(acoustic_scores(lp, uniform, 1.0))[0]
            oracle.append(W.score(words_of(r.text), words, r.condition))
    return oracle


def run(ctx: StepContext, args: Any) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    cfg, st = ctx.cfg, ctx.storage
    corpus = getattr(args, "data", None) or cfg.data.corpus
    model_uri = getattr(args, "model", None) or ctx.other("train", "model.pt")
    if not st.exists(model_uri):
        raise StepError(f"model {model_uri} not found (pass --model)")
    a = decoder_setup.load_assets(ctx, model_uri, corpus)
    graph_info = a.graph_info
    run_dir, train_dir = model_uri.rsplit("/", 2)[:2]
    tuned = join(run_dir, train_dir.replace("train", "decode", 1), "result.json")
    acwt, _ = tuned_acwt(st, tuned, cfg.decode.acwt[0])
    recs, _ = D.split_records(ctx.storage, corpus, "test")
    feats, _, audio_s = D.featurize(st, corpus, recs, a.card)

    t0 = time.process_time()
    post = D.log_posteriors(a.model, [x for _, x in feats])
    forward_s = time.process_time() - t0
    rows, beams, searcher = _beams(a, feats, post, forward_s, audio_s, acwt, cfg)
    oracle = _oracle(st, corpus, a, feats, searcher)
    oracle_wer = W.aggregate(oracle)
    frames = sum(len(p) for p in post)
    result = {
        "model": model_uri, "utterances": len(feats), "audio_s": round(audio_s, 2),
        "frames": frames, "acwt": acwt, "graph": graph_info,
        "forward_rtf_per_core": forward_s / audio_s, "forward_x_real_time": audio_s / forward_s,
        **{k: v for k, v in rows[0].items() if k != "search_s"}, "beams": rows,
        "oracle_wer": oracle_wer["wer"], "oracle_per_condition": oracle_wer["per_condition"],
        "oracle_utterances": len(oracle)}
    lines = [f"decode bench on {len(feats)} test utterances ({audio_s:.0f} s of audio), one "
             f"core, acwt {acwt}:",
             f"  forward alone                       {audio_s / forward_s:8.1f} x real time"]
    for r in rows:
        lines.append(f"  forward + search, beam {r['beam']:>4} / {r['max_active']:>5} active "
                     f"{r['forward_plus_search_x_real_time']:8.1f} x real time (search = "
                     f"{r['search_over_forward']:.2f} x forward), WER {100 * r['model_wer']:.2f} %")
    lines.append(f"  oracle WER (alignment phones as posteriors, beam {beams[-1][0]}): "
                 f"{100 * oracle_wer['wer']:.2f} % on {len(oracle)} utterances")
    print("\n".join(lines), flush=True)
    return result
