"""`amflow decode`: a model to words on a corpus split; WER per condition.

Resolves the run-layout inputs with amflow.services.decoder_setup (the model of
train[-<tag>] or --model, the run's lm/lm.arpa or decode.lm, the graph cache
runs/<R>/graph/), assembles the decoder with `decoding.assets.DecoderAssets`, tunes acwt
on decode.tune_split and scores the split with a pool of `decoding.decode.DecodeWorker`
actors. Outputs: --out (default
runs/<R>/decode[-<tag>]/result.json), hyps.jsonl, hyps.parquet, rejects, _SUCCESS.json.
"""
from __future__ import annotations

import time
from typing import Any

from core.runs import StepContext, StepError, rejects_table
from decoding import decode as D
from decoding import error_analysis
from decoding.assets import DecoderAssets
from amflow.services.decoder_setup import (ctc_graph, decode_inputs, load_assets, lm_uri,
                                           read_inputs, resolve_inputs, tagged_context)

_context = tagged_context  # decode's own name for it (tests/test_decoding.py)


def _decode(ctx: StepContext, a: DecoderAssets, corpus: str, split: str) -> tuple[dict, dict]:
    """Tune acwt, score and search `split`; (result.json body, step metrics)."""
    dc = ctx.cfg.decode
    recs, rejects = D.split_records(ctx.storage, corpus, split)
    n_in = len(recs) + len(rejects)
    t0 = time.perf_counter()
    pool = D.Pool(ctx.cfg, a.model_bytes, a.graph_dir, a.log_prior, corpus,
                  inline=D.inline_for(ctx.cfg, ctx.storage, corpus, recs, [dc.tune_split]))
    tuning, acwt = D.tune_acwt(dc, ctx.storage, pool, corpus, a.lexicon)
    scored = pool.score(D.shards_of(recs, 2 * dc.workers), f"decode {split}: features+model")
    hyps, search_s, frames = pool.search(scored, acwt, f"decode {split}: search")
    wall = time.perf_counter() - t0
    rejects += [r for s in scored for r in s["rejects"]]
    result, rows, oov = D.score_hyps(hyps, a.lexicon)
    result.update(error_analysis.result_fields(rows))  # wer_ci95, S/D/I counts, confusions
    audio_s = sum(s["audio_s"] for s in scored)
    result.update({
        "model": a.model_uri, "data": corpus, "split": split, "acwt": acwt, "lm_weight": 1 / acwt,
        "tune_split": dc.tune_split, "tuning": tuning, "lm": a.lm_uri, "lexicon": a.lexicon_uri,
        "graph": a.graph_info, "priors_from": a.prior_source, "oov": oov,
        "rejected": D.reasons(rejects), "audio_s": round(audio_s, 2),
        "rtf": D.rtf(scored, search_s, audio_s, wall, pool.workers),
        "model_kind": a.card.kind})
    D.write_hyps(ctx.storage, ctx.step_uri, rows)
    ctx.storage.write_text(ctx.path("errors.txt"), error_analysis.render(rows))  # sclite-like
    if rejects:
        ctx.storage.write_parquet(ctx.path("rejects", "rejects.parquet"), rejects_table(rejects))
    metrics = D.step_metrics(result, scored, frames, acwt=acwt)
    counts = {"in": n_in, "out": len(hyps), "rejected": len(rejects)}
    return result, dict(metrics=metrics, counts=counts)


def _card(read: dict[str, bytes], model: str):
    from training.checkpoint import card_from_bytes

    return card_from_bytes(read[model], model)[1]


def _decode_ctc(ctx: StepContext, model: str, read: dict[str, bytes], card, corpus: str,
                split: str) -> tuple[dict, dict]:
    from decoding.ctc_decode import check_ctc_card, decode_ctc

    check_ctc_card(card, model)
    graph = ctc_graph(ctx, card, read) if ctx.cfg.decode.ctc_search == "tlg" else None
    model_bytes = read[model]
    read.clear()
    result, summary = decode_ctc(ctx.cfg, ctx.step_uri, model, model_bytes, card, corpus, split,
                                 graph, lm_uri(ctx)[0])
    if summary["rejects"]:
        ctx.storage.write_parquet(ctx.path("rejects", "rejects.parquet"),
                                  rejects_table(summary["rejects"]))
    return result, summary


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    ctx = tagged_context(ctx)
    dc = ctx.cfg.decode
    split = getattr(args, "split", None) or "test"
    if split == dc.tune_split:
        raise StepError(f"--split {split} is decode.tune_split: tune on one split, score another")
    out_uri = getattr(args, "out", None) or ctx.path("result.json")
    model, corpus = resolve_inputs(ctx, args)
    read = read_inputs(ctx, model, corpus)
    inputs = decode_inputs(ctx, model, corpus, split, read)
    done = ctx.finished_on(inputs, out_uri)
    if done is not None:
        return done
    from training.families import get_family

    card = _card(read, model)
    if get_family(card.kind).token_targets:  # end to end: tokens to words (decoding/ctc_decode.py)
        result, summary = _decode_ctc(ctx, model, read, card, corpus, split)
    else:
        assets = load_assets(ctx, model, corpus, read)
        read.clear()  # the LM's text is in the graph now: not held through the decode
        result, summary = _decode(ctx, assets, corpus, split)
    ctx.storage.write_json(out_uri, result)
    print(D.render(result), flush=True)
    return ctx.finish(inputs=inputs,
                      counts=summary["counts"], metrics=summary["metrics"], extra={"out": out_uri})
