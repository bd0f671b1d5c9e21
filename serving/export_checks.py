"""What an ONNX export must prove before it is kept: its log-posteriors are torch's and
its words are the same (amflow export runs these on real utterances of the run).

    streamed_log_posteriors(stream_model, feats, chunk_rows, streams)
        utterances run as concurrent streams through a streaming model (StreamModel or
        OrtStreamModel, or the CTC student's CtcStreamModel or OrtCtcStreamModel),
        `streams` at a time, each fed chunk_rows rows a step (a few streams with one row
        more, so batches mix row counts, as Batch Dispatch's do), the look-ahead handled
        as serving.recognizer.Session does (a CTC step is told which call carries an
        utterance's last rows: it pads the end itself)
    compare(torch_lp, other_lp) -> max |difference| over every frame
    scaled_diff(torch_lp, other_lp) -> max |difference| / max(1, |torch's value|): what
        export.tolerance holds a graph to
    graph_row(...) -> one graph's checks.json line (both differences, words, WER, passed)
    words(searcher, lps, log_prior, acwt) -> 1-best words per utterance
    wer_rows(records, hyps) -> per-utterance scores (hyps.jsonl's fields)
    paired_delta(rows_a, rows_b) -> WER of each, the change, its 95 % bootstrap CI and p
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def streamed_log_posteriors(model, feats: Sequence[np.ndarray], chunk_rows: int = 4,
                            streams: int = 8) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for g in range(0, len(feats), streams):
        out += _stream_group(model, feats[g:g + streams], chunk_rows)
    return out


def _stream_group(model, feats: Sequence[np.ndarray], chunk_rows: int) -> list[np.ndarray]:
    la = model.lookahead
    xs = [np.concatenate([f, np.zeros((la, f.shape[1]), np.float32)]) for f in feats]
    step = [chunk_rows + (i % 2) for i in range(len(xs))]
    pos = [0] * len(xs)
    states = [model.zero_state() for _ in xs]
    ends = hasattr(model, "utterance_end")
    outs: list[list[np.ndarray]] = [[] for _ in xs]
    while True:
        live = [i for i in range(len(xs)) if pos[i] < len(xs[i])]
        if not live:
            break
        if ends:  # a CTC step flushes its look-ahead on the call with the last rows
            for i in live:
                if pos[i] + step[i] >= len(xs[i]):
                    states[i] = model.utterance_end(states[i])
        lp, st = model.forward([xs[i][pos[i]:pos[i] + step[i]] for i in live],
                               [states[i] for i in live])
        for i, y, s in zip(live, lp, st):
            outs[i].append(y)
            states[i] = s
            pos[i] += step[i]
    return [np.concatenate(o)[la:] for o in outs]


def _pairs(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> list[tuple]:
    """(torch's, the graph's) per utterance, the empty ones left out; both alike in shape."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError("the two sets of log-posteriors differ in shape")
    return [(x, y) for x, y in zip(a, b) if x.size]


def compare(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max((float(np.abs(x - y).max()) for x, y in _pairs(a, b)), default=0.0)


def scaled_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """The largest |a - b| / max(1, |a|) (a: torch's log-posteriors): a difference in
    units of the value's own size where it is above 1. float32 rounds relative to a
    number's size, and two graphs that sum in another order (the CTC student's streaming
    step computes its GRU cell by hand) part by a few float32 steps of each log-posterior:
    on the demo's CTC student (364 test utterances, 2026-12-07) the streaming graph's
    largest |difference| was 1.25e-4, at log p = -8.7 (an unlikely class); 4.0e-5 where
    log p > -1 (the classes a search follows), 4.8e-5 of the value at most, the same
    greedy class on all 35,901 frames, the same words on every utterance."""
    return max((float((np.abs(x - y) / np.maximum(1.0, np.abs(x))).max())
                for x, y in _pairs(a, b)), default=0.0)


def graph_row(ref, lp, ref_words, hyps, recs, ref_rows, tolerance: float, held: bool,
              seconds: float) -> dict:
    """One graph's line of checks.json: its largest difference from torch's log-posteriors
    (`ref`; plain and scaled; None when the runtime gives words only, lp None), how many
    utterances keep torch's words, its WER change with a CI, and, when `held`, whether it
    passes: scaled difference within `tolerance` and every utterance's words the same."""
    diff = compare(ref, lp) if lp is not None else None
    scaled = scaled_diff(ref, lp) if lp is not None else None
    passed = (scaled is None or scaled <= tolerance) and hyps == ref_words
    return {"max_abs_diff": diff, "max_scaled_diff": scaled,
            "same_words": sum(a == b for a, b in zip(ref_words, hyps)),
            "wer_vs_torch": paired_delta(ref_rows, wer_rows(recs, hyps)),
            "seconds": round(seconds, 2), "checked": held, "passed": passed if held else None}


def words(searcher, lps: Sequence[np.ndarray], log_prior: np.ndarray, acwt: float
          ) -> list[list[str]]:
    from decoding.search import acoustic_scores

    return [searcher.best_words(acoustic_scores(lp, log_prior, acwt))[0] for lp in lps]


def wer_rows(records: Sequence, hyps: Sequence[Sequence[str]]) -> list[dict]:
    from decoding import wer as W
    from decoding.lexicon import words_of

    rows = []
    for r, h in zip(records, hyps):
        s = W.score(words_of(r.text), list(h), r.condition or "unknown")
        rows.append({"utt_id": r.utt_id, "condition": r.condition or "unknown",
                     "hyp": " ".join(h), "errors": s.errors, "ref_words": s.ref_words})
    return rows


def paired_delta(rows_a: Sequence[dict], rows_b: Sequence[dict], n_boot: int = 1000,
                 seed: int = 0) -> dict:
    """B's WER minus A's on the same utterances, with its 95 % paired bootstrap CI
    (utterances resampled together) and the matched-pairs tests (decoding.significance)."""
    from decoding.significance import compare_rows

    res = compare_rows(rows_a, rows_b, seed=seed)
    ea = np.array([r["errors"] for r in rows_a], float)
    eb = np.array([r["errors"] for r in rows_b], float)
    w = np.array([r["ref_words"] for r in rows_a], float)
    idx = np.random.default_rng(seed).integers(0, len(ea), size=(n_boot, len(ea)))
    d = (eb[idx].sum(axis=1) - ea[idx].sum(axis=1)) / np.maximum(w[idx].sum(axis=1), 1)
    return {"wer_a": round(res["wer_a"], 5), "wer_b": round(res["wer_b"], 5),
            "delta": round(res["delta"], 5),
            "delta_ci95": [round(float(np.percentile(d, 2.5)), 5),
                           round(float(np.percentile(d, 97.5)), 5)],
            "p_mapsswe": round(res["p_mapsswe"], 4), "p_bootstrap": round(res["p_bootstrap"], 4),
            "utterances": res["utterances"], "ref_words": res["ref_words"]}
