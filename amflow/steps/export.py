"""`amflow export --run-id R [--model M] --format onnx [--quantize int8]`: the student as
ONNX graphs a runtime without amflow can run, checked against torch before it is kept.

Reads   --model  a train step of the run (`train-baseline`) or a model URI (default: the
                 model `amflow decode` would decode, train[-<decode.tag>]/model.pt), the
                 run's lexicon, LM and graph (as decode), the acwt decode tuned
                 (decode[-<tag>]/result.json, else decode.acwt[0]), and export.check_split's
                 utterances of data.corpus for the checks
Writes  runs/<R>/<export_dir_name>/: export-<decode.tag> when tagged; untagged, the folder
        follows the model: train/model.pt -> export, train-<t>/ -> export-<t>, another
        folder F of the run -> export-F, a model outside the run -> export-model-<digest>
        (so exports of different models never overwrite each other); an untagged export
        at a decode.chunking other than the model's own adds it (export-conformer-4x8):
        a Conformer's graphs are exported at that chunking, as decode and serve read it
          model.onnx               whole utterance: x [B, T, D] -> log_probs [B, T, C]
          model.streaming.onnx     one step: x, lengths, h0, c0 -> log_probs, hn, cn
          model.int8.onnx, model.streaming.int8.onnx   with --quantize int8
          card.json                the model card (spec, classes, CMVN, features, priors, info)
          classes.txt              class names, line i = output i
          features.json            how input rows are made from 16 kHz audio
          decoding.json            log priors, acwt, search settings for hybrid decoding
          gate.json                the speech gate amflow serves with (serve.speech_*):
                                   settings, frame counts, rule (CTC exports too)
          checks.json              the checks below; _SUCCESS.json (with them) when they pass
Every graph's metadata names the model.pt it came from (amflow_model_digest,
amflow_model_uri): `amflow serve` refuses a graph exported from another model.
The checks (serving/export_checks.py), on real utterances: the whole-utterance graph's and
the streaming graph's (8 streams a batch, 4-5 rows a step) log-posteriors within
export.tolerance of torch's (in units of the value's size above 1: max_scaled_diff), and
the same 1-best words from the run's graph. A failed check
fails the step (checks.json says which; no _SUCCESS.json). int8 is measured, not held to
the tolerance: its largest difference, its words and its WER change against torch's, with
a 95 % CI.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import numpy as np

from core.config import DecodeConfig
from amflow.services import decoder_setup
from amflow.services.export_folder import export_dir_name
from core.runs import StepContext, StepError, step_dir_name
from core.storage import digest_of
from decoding.assets import tuned_acwt

FORMATS = ("onnx",)
QUANTIZE = ("int8",)


def graphs(model, card, quantize: str | None) -> dict[str, bytes]:
    """The model family's graphs (model.onnx, model.streaming.onnx), int8 beside."""
    from serving.onnx_export import quantize_int8
    from training.families import family_of

    out = family_of(model).export_graphs(model, card)
    if quantize == "int8":
        for name in list(out):
            out[name.replace(".onnx", ".int8.onnx")] = quantize_int8(out[name])
    return out


def beside(decoder, acwt: float, acwt_from: str, dc: DecodeConfig) -> dict[str, str]:
    """card.json, classes.txt, features.json, decoding.json: what a deployment needs."""
    from serving.onnx_export import features_json

    card = decoder.card
    decoding = {"log_prior": [float(v) for v in decoder.log_prior],
                "priors_from": decoder.prior_source, "acwt": acwt, "acwt_from": acwt_from,
                "beam": dc.beam, "max_active": dc.max_active,
                "scores": "acwt * (log_probs - log_prior) per frame and class",
                "graph": decoder.graph_info}
    return {"card.json": json.dumps(card.to_meta(), indent=1),
            "classes.txt": "".join(f"{p}\n" for p in card.phones),
            "features.json": json.dumps(features_json(card), indent=1),
            "decoding.json": json.dumps(decoding, indent=1)}


def check_inputs(ctx: StepContext, decoder, corpus: str) -> tuple[list, list[np.ndarray], int]:
    """export.check_split's utterances (up to export.check_utterances), featurised as the
    decode step does (per-speaker streams)."""
    from amflow.services.ctc_export import check_records
    from decoding.decode import featurize

    recs = check_records(ctx, corpus)
    feats, rejects, _ = featurize(ctx.storage, corpus, recs, decoder.card)
    if not feats:
        raise StepError(f"none of the {len(recs)} check utterances could be read: {rejects[:3]}")
    return [r for r, _ in feats], [x for _, x in feats], len(rejects)


def run_checks(ctx: StepContext, decoder, files: dict[str, bytes], recs, feats,
               acwt: float) -> dict[str, Any]:
    from decoding.decode import log_posteriors
    from decoding.graph import read_graph
    from decoding.search import Searcher
    from serving import export_checks as X
    from serving.onnx_runtime import OrtStreamModel, session, utterance_log_posteriors

    ec, dc = ctx.cfg.export, ctx.cfg.decode
    searcher = Searcher(read_graph(decoder.graph_dir), dc.beam, dc.max_active)
    t0 = time.perf_counter()
    ref = log_posteriors(decoder.model, feats)
    times = {"torch": time.perf_counter() - t0}
    lps = {}
    for name in [n for n in files if n.endswith(".onnx")]:
        t0 = time.perf_counter()
        if ".streaming." in name:
            lps[name] = X.streamed_log_posteriors(OrtStreamModel(files[name]), feats,
                                                  ec.chunk_rows, ec.streams)
        else:
            lps[name] = utterance_log_posteriors(session(files[name]), feats)
        times[name] = time.perf_counter() - t0
    ref_words = X.words(searcher, ref, decoder.log_prior, acwt)
    ref_rows = X.wer_rows(recs, ref_words)
    graphs_out = {}
    for name, lp in lps.items():
        hyps = X.words(searcher, lp, decoder.log_prior, acwt)
        held = ".int8." not in name  # int8 is measured, not held to the tolerance
        graphs_out[name] = X.graph_row(ref, lp, ref_words, hyps, recs, ref_rows, ec.tolerance,
                                       held, times[name])
    frames = sum(len(x) for x in feats)
    return {"utterances": len(feats), "frames": frames, "split": ec.check_split,
            "tolerance": ec.tolerance, "acwt": acwt, "torch_seconds": round(times["torch"], 2),
            "torch_wer": round(sum(r["errors"] for r in ref_rows) /
                               max(1, sum(r["ref_words"] for r in ref_rows)), 5),
            "torch_hyp_words": sum(len(w) for w in ref_words), "graphs": graphs_out,
            "passed": all(g["passed"] for g in graphs_out.values() if g["checked"])}


def export_inputs(ctx: StepContext, uri: str, data: bytes, corpus: str, fmt: str,
                  quantize: str | None) -> dict[str, Any]:
    return {"model": uri, "model_digest": digest_of(data), "data": corpus, "format": fmt,
            "quantize": quantize, "export": dataclasses.asdict(ctx.cfg.export),
            "decode": {k: getattr(ctx.cfg.decode, k) for k in ("beam", "max_active", "acwt", "blank_penalties")},
            "gate": {k: v for k, v in dataclasses.asdict(ctx.cfg.serve).items()
                     if k.startswith("speech_")}}  # gate.json


def gate_file(ctx: StepContext, card) -> dict[str, bytes]:
    """gate.json: the speech gate `amflow serve` applies (serve.speech_*), exported."""
    from serving.app import speech_gate
    from serving.onnx_export import gate_json

    return {"gate.json": json.dumps(gate_json(speech_gate(ctx.cfg.serve), card),
                                    indent=1).encode()}


def stamp(files: dict[str, bytes], uri: str, data: bytes) -> dict[str, bytes]:
    """Every graph with the model's digest and URI in its metadata (with_model)."""
    from serving.onnx_export import with_model

    digest = digest_of(data)
    return {n: with_model(b, digest, uri) if n.endswith(".onnx") else b
            for n, b in files.items()}


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    fmt = getattr(args, "format", None) or "onnx"
    quantize = getattr(args, "quantize", None)
    if fmt not in FORMATS or (quantize and quantize not in QUANTIZE):
        raise StepError(f"--format {fmt} --quantize {quantize}: amflow exports --format "
                        f"{'|'.join(FORMATS)} with --quantize {'|'.join(QUANTIZE)} or none")
    uri, corpus = decoder_setup.resolve_inputs(ctx, args)
    # decode.chunking's attention chunks (a Conformer), as decode and serve read the model:
    # the graphs are stamped with these bytes' digest, the one serve then checks
    data = decoder_setup.chunked(ctx, ctx.storage.read_bytes(uri), uri)
    ctx = decoder_setup.tagged_context(ctx, "export", export_dir_name(ctx, uri, data))
    inputs = export_inputs(ctx, uri, data, corpus, fmt, quantize)
    done = ctx.finished_on(inputs, ctx.path("checks.json"))
    if done is not None:
        return done
    from training.checkpoint import card_from_bytes

    from training.families import get_family

    model, card = card_from_bytes(data, uri)
    family = get_family(card.kind)
    if family.token_targets:
        return export_ctc(ctx, model, card, corpus, quantize, inputs, uri, data)
    if not family.streams:
        raise StepError(f"{uri} is a {card.kind}: amflow export takes a streaming model (the "
                        "hybrid LSTM student) or the CTC student; pass --model a "
                        "student's train step")
    decoder = decoder_setup.load_assets(ctx, uri, corpus, read={uri: data})
    acwt, acwt_from = tuned_acwt(ctx.storage, ctx.other(step_dir_name(
        "decode", ctx.cfg.decode.tag), "result.json"), ctx.cfg.decode.acwt[0])
    files = stamp(graphs(decoder.model, decoder.card, quantize), uri, data)
    recs, feats, rejected = check_inputs(ctx, decoder, corpus)
    checks = run_checks(ctx, decoder, files, recs, feats, acwt)
    files.update({k: v.encode() for k, v in beside(decoder, acwt, acwt_from, ctx.cfg.decode).items()})
    files.update(gate_file(ctx, decoder.card))
    return _keep(ctx, files, checks, len(recs), rejected, inputs)


def export_ctc(ctx: StepContext, model, card, corpus: str, quantize: str | None,
               inputs: dict, uri: str, data: bytes) -> dict[str, Any]:
    """The CTC student's export (amflow/services/ctc_export.py); the joint CTC/attention
    model's encoder and CTC output (its attention decoder is not exported)."""
    from amflow.services import ctc_export as E
    from decoding.ctc_decode import check_ctc_card
    from training.ctc.tokens import Tokenizer

    check_ctc_card(card, uri)
    tokenizer = Tokenizer.from_dict(card.tokenizer)
    scales = E.tuned_scales(ctx, uri)  # decode's, tuned on dev (never test)
    search = E.sherpa_search(ctx, card, tokenizer, scales)  # TLG.fst, the scores' scale
    files = stamp(E.graphs(model, card, scales.blank_penalty, quantize, search.scale), uri, data)
    streaming = "model.streaming.onnx" in files
    files.update({k: v.encode() for k, v in E.beside(
        model, card, tokenizer, scales, E.sherpa_json(ctx, scales, search), streaming).items()})
    files.update(E.graph_files(search))
    files.update(gate_file(ctx, card))
    ci = E.check_inputs(ctx, card, corpus)
    checks = E.run_checks(ctx, model, card, tokenizer, files, ci, scales, search)
    checks["streaming_graph"] = ("model.streaming.onnx (streaming.json)" if streaming else
                                 "not exported: a bidirectional model reads whole utterances "
                                 "(it cannot stream)" if getattr(model, "bidirectional", False)
                                 else f"not exported: a {card.kind} model has no streaming "
                                 "graph yet (amflow serve streams it on torch)")
    checks["attention_decoder"] = ("not exported (decode.ctc_search rescore needs it: "
                                   "amflow's torch decode)" if getattr(model, "decoder", None)
                                   is not None else None)
    return _keep(ctx, files, checks, len(ci.recs), ci.rejected, inputs)


def _keep(ctx: StepContext, files: dict[str, bytes], checks: dict, n: int, rejected: int,
          inputs: dict) -> dict[str, Any]:
    """Write the files and checks.json; fail the step when a held check failed."""
    checks = {**checks, "model": inputs["model"], "model_digest": inputs["model_digest"]}
    for name, blob in files.items():
        ctx.storage.write_bytes(ctx.path(name), blob)
    ctx.storage.write_json(ctx.path("checks.json"), checks)
    print(render(checks), flush=True)
    if not checks["passed"]:
        raise StepError(f"the export's checks failed (see {ctx.path('checks.json')}): "
                        + "; ".join(f"{n}: max |diff| {g['max_abs_diff']:.2e} (scaled "
                                    f"{g['max_scaled_diff']:.2e}, tolerance "
                                    f"{ctx.cfg.export.tolerance:.0e}), same words "
                                    f"{g['same_words']}/{checks['utterances']}"
                                    for n, g in checks["graphs"].items() if g["passed"] is False))
    metrics = {"passed": True, "utterances": checks["utterances"],
               "tolerance": ctx.cfg.export.tolerance,
               **{f"{k}.max_abs_diff": g["max_abs_diff"] for k, g in checks["graphs"].items()},
               **{f"{k}.max_scaled_diff": g["max_scaled_diff"]
                  for k, g in checks["graphs"].items()},
               **{f"{k}.same_words": g["same_words"] for k, g in checks["graphs"].items()},
               "checks": checks}
    # counts: the check utterances (an unreadable one is rejected, the others checked)
    counts = {"in": n + rejected, "out": n, "rejected": rejected}
    return ctx.finish(inputs=inputs, counts=counts,
                      metrics=metrics, bytes_written=sum(len(b) for b in files.values()),
                      extra={"out": ctx.path("checks.json"), "files": sorted(files)})


def render(checks: dict) -> str:
    lines = [f"export checks on {checks['utterances']} {checks['split']} utterances "
             f"({checks['frames']} rows), tolerance {checks['tolerance']}, torch WER "
             f"{checks['torch_wer']:.4f}:"]
    for name, g in checks["graphs"].items():
        w = g["wer_vs_torch"]
        verdict = {True: "ok", False: "FAILED", None: "measured"}[g["passed"]]
        diff = "-" if g["max_abs_diff"] is None else f"{g['max_abs_diff']:.2e}"
        scaled = "-" if g["max_scaled_diff"] is None else f"{g['max_scaled_diff']:.2e}"
        lines.append(f"  {name:28s} max |diff| {diff:>8s} (scaled {scaled:>8s})  same words "
                     f"{g['same_words']}/{checks['utterances']}  WER {w['wer_b']:.4f} "
                     f"(delta {w['delta']:+.4f}, 95% CI {w['delta_ci95']})  {g['seconds']} s  "
                     f"{verdict}")
    return "\n".join(lines)
