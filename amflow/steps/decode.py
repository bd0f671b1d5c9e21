"""`amflow decode`: a model to words on a corpus split; WER per condition.

Resolves the run-layout inputs (the model of train[-<tag>] or --model, the run's
lm/lm.arpa or decode.lm, the graph cache runs/<R>/graph/), assembles the decoder with
`decoding.assets.DecoderAssets`, tunes acwt on decode.tune_split and scores the split
with a pool of `decoding.decode.DecodeWorker` actors. Outputs: --out (default
runs/<R>/decode[-<tag>]/result.json), hyps.jsonl, hyps.parquet, rejects, _SUCCESS.json.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from core.runs import StepContext, StepError, rejects_table, step_dir_name
from core.storage import digest_of
from decoding import decode as D
from decoding import error_analysis
from decoding.assets import DecoderAssets
from tasks.select import corpus_fingerprint
from amflow.steps.train_plan import model_dir_name


def tagged_context(ctx: StepContext, step: str = "decode", name: str = "") -> StepContext:
    """The context of <step>[-<decode.tag>] (the CLI gives the plain step name): decode's
    and export's, which resolve their inputs alike (`resolve_inputs`); `name`: that
    folder instead (export's follows its model)."""
    name = name or step_dir_name(step, ctx.cfg.decode.tag)
    if ctx.step == name:
        return ctx
    new = StepContext(ctx.cfg, ctx.run_id, name, force=ctx.force)
    new.started = ctx.started
    return new


_context = tagged_context  # decode's own name for it (tests/test_decoding.py)


def model_uri(ctx: StepContext, model: str | None) -> str:
    """--model: a train step of this run (its model.pt: `train-baseline`) or a model URI;
    by default train[-<decode.tag>]/model.pt."""
    if not model:
        uri = ctx.other(model_dir_name(ctx.cfg.decode.tag), "model.pt")
    elif "/" in model or "://" in model or model.endswith(".pt"):
        uri = model
    else:
        uri = ctx.other(model, "model.pt")
    if not ctx.storage.exists(uri):
        raise StepError(f"model {uri} not found: train one with `amflow train`, or pass "
                        f"--model a train step of run {ctx.run_id} (e.g. train-baseline) or "
                        "a model.pt URI")
    return uri


def resolve_inputs(ctx: StepContext, args: Any) -> tuple[str, str]:
    """(the model's URI, the corpus) of --model and --data (default data.corpus)."""
    corpus = getattr(args, "data", None) or ctx.cfg.data.corpus
    return model_uri(ctx, getattr(args, "model", None)), corpus


def lm_uri(ctx: StepContext) -> tuple[str, str]:
    """(the LM's URI, how to make it when missing): decode.lm, else this run's lm step."""
    if ctx.cfg.decode.lm:
        return ctx.cfg.decode.lm, "decode.lm does not exist"
    return ctx.other("lm", "lm.arpa"), (f"run `amflow lm --run-id {ctx.run_id}` first "
                                        "(or set decode.lm to an ARPA file)")


def load_assets(ctx: StepContext, model: str, corpus: str,
                read: dict[str, bytes] | None = None) -> DecoderAssets:
    """The decoder for `model` with this run's lexicon, LM and graph cache (`read`: those
    objects' bytes, read once by `read_inputs`)."""
    lm, hint = lm_uri(ctx)
    return DecoderAssets.load(
        ctx.storage, ctx.cfg.decode, model_uri=model,
        lexicon_uri=ctx.cfg.data.lexicon_uri(corpus), lm_uri=lm,
        graph_root=ctx.other("graph"), lm_hint=hint, require=("cmvn", "phones"), read=read)


def read_inputs(ctx: StepContext, model: str, corpus: str) -> dict[str, bytes]:
    """The model's, LM's and lexicon's bytes (those that exist), read once: the digests
    decode_inputs keeps are those of the bytes the decoder then loads, and a multi-GB LM
    on S3 is fetched once, not twice."""
    st = ctx.storage
    uris = (model, lm_uri(ctx)[0], ctx.cfg.data.lexicon_uri(corpus))
    return {u: st.read_bytes(u) for u in uris if st.exists(u)}


# decode.* keys that place or pace the decode, or name where it goes: the words are the
# same whatever they are (decode.lm is an input, compared by its digest).
OPERATIONAL_KEYS = {"tag", "workers", "batch_frames", "lm"}


def decode_inputs(ctx: StepContext, model: str, corpus: str, split: str,
                  read: dict[str, bytes] | None = None) -> dict[str, Any]:
    """What a decode's words depend on: the model, LM and lexicon (their URIs and their
    bytes' digests: one trained or made again at the same URI decodes differently), the
    corpus (made from other inputs: `corpus_fingerprint`) and split, and the decode keys
    that shape the search. `read`: `read_inputs`' bytes (else each is read here)."""
    st = ctx.storage
    read = read if read is not None else read_inputs(ctx, model, corpus)
    lm, lexicon = lm_uri(ctx)[0], ctx.cfg.data.lexicon_uri(corpus)
    keys = {k: v for k, v in dataclasses.asdict(ctx.cfg.decode).items()
            if k not in OPERATIONAL_KEYS}
    gate = D.decode_gate(ctx.cfg)  # off: absent, so decodes recorded before it stay done
    keys.pop("speech_gate")
    if gate is not None:
        keys["speech_gate"] = dataclasses.asdict(gate)

    def digest(uri: str) -> str | None:
        return digest_of(read[uri]) if uri in read else None

    return {"model": model, "model_digest": digest(model), "data": corpus,
            "data_fingerprint": corpus_fingerprint(st, corpus), "split": split,
            "lm": lm, "lm_digest": digest(lm), "lexicon": lexicon,
            "lexicon_digest": digest(lexicon), "decode": keys}


def _decode(ctx: StepContext, a: DecoderAssets, corpus: str, split: str) -> tuple[dict, dict]:
    """Tune acwt, score and search `split`; (result.json body, step metrics)."""
    dc = ctx.cfg.decode
    recs, rejects = D.split_records(ctx.storage, corpus, split)
    n_in = len(recs) + len(rejects)
    t0 = time.perf_counter()
    pool = D.Pool(ctx.cfg, a.model_bytes, a.graph_dir, a.log_prior, corpus)
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


def ctc_graph(ctx: StepContext, card, read: dict[str, bytes]) -> tuple[str, dict, set]:
    """A CTC model's T o L o G over the LM's words (cached in runs/<R>/graph/<key>/):
    (local dir, info, vocabulary)."""
    from decoding.assets import ensure_graph, load_lm
    from decoding.ctc_graph import build_tlg, lm_words
    from training.ctc.tokens import Tokenizer

    lm, hint = lm_uri(ctx)
    arpa = load_lm(ctx.storage, lm, hint, read)
    tok = Tokenizer.from_dict(card.tokenizer)
    graph_dir, info = ensure_graph(ctx.storage, ctx.other("graph"), None, "", arpa,
                                   [*tok.symbols, tok.digest, "ctc-tlg"], 0.0,
                                   builder=lambda: build_tlg(tok, arpa))
    return graph_dir, info, set(lm_words(arpa))


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
    card = _card(read, model)
    if card.kind == "ctc":  # an end-to-end model: tokens to words (decoding/ctc_decode.py)
        result, summary = _decode_ctc(ctx, model, read, card, corpus, split)
    else:
        assets = load_assets(ctx, model, corpus, read)
        read.clear()  # the LM's text is in the graph now: not held through the decode
        result, summary = _decode(ctx, assets, corpus, split)
    ctx.storage.write_json(out_uri, result)
    print(D.render(result), flush=True)
    return ctx.finish(inputs=inputs,
                      counts=summary["counts"], metrics=summary["metrics"], extra={"out": out_uri})
