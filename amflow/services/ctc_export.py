"""`amflow export` of a CTC student (and of the joint CTC/attention student's encoder and
CTC output): the CTC family's graphs (training/families/ctc_onnx.py), sherpa-onnx's files
beside them, checked.

Writes  runs/<R>/export[-<decode.tag>]/
          model.onnx            x [N, T, D] model rows, x_lens -> log_probs, log_probs_len
          model.sherpa.onnx     sherpa-onnx (zipformer-CTC loader): x [N, T, bins] fbank
                                frames, x_lens -> log_probs, log_probs_len; amflow's
                                normalisation, stacking and CMVN inside
          model.streaming.onnx  one streaming step (unidirectional models): x, lengths,
                                final, the state -> log_probs, out_lengths, the state
                                out (training/families/ctc_onnx.py streaming_graph;
                                streaming.json and the graph's metadata name the state tensors, their
                                shapes and batch axes); serve.backend=onnxruntime runs it
          model.int8.onnx, model.sherpa.int8.onnx, model.streaming.int8.onnx
                                with --quantize int8
          tokens.txt            "symbol id", <blk> 0 (amflow's and sherpa-onnx's class list)
          streaming.json        model.streaming.onnx's inputs, outputs, state, protocol
          card.json, features.json (with `sherpa_onnx`: FeatureExtractorConfig's arguments),
          decoding.json (greedy search, its blank penalty), checks.json, _SUCCESS.json
The checks, on export.check_split's utterances:
  model.onnx         on amflow's features (per-speaker streams, as decode): log-probs
                     within export.tolerance of torch's, the same greedy words
  model.streaming.onnx  the same rows as concurrent streams (export.streams a batch,
                     export.chunk_rows (+1 for every other stream) rows a call, `final` on
                     each utterance's last): log-probs within export.tolerance of torch's
                     whole-utterance forward, the same greedy words
  model.sherpa.onnx  on amflow's fbank frames of each utterance alone: log-probs within
                     export.tolerance of torch's on amflow's rows of that utterance alone,
                     the same greedy words (the blank penalty is in the graph)
  sherpa-onnx        (when the sherpa_onnx package is installed) its OfflineRecognizer on the
                     audio: its words against torch's greedy words of each utterance alone
                     (measured: sherpa-onnx's fbank is kaldi-native-fbank's, amflow's may be
                     numpy's; they agree to float rounding), and its WER change against
                     amflow's decode of the speaker streams, with a 95 % CI
  int8 graphs        measured, as for the hybrid student
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from typing import Any

import numpy as np

from core.runs import StepContext, StepError, step_dir_name


def blank_penalty(ctx: StepContext) -> tuple[float, str]:
    """The greedy search's blank penalty: the one `amflow decode` tuned for greedy search
    (decode[-<tag>]/result.json), else decode.blank_penalties[0]."""
    uri = ctx.other(step_dir_name("decode", ctx.cfg.decode.tag), "result.json")
    if ctx.storage.exists(uri):
        res = ctx.storage.read_json(uri)
        if res.get("search") == "greedy" and "blank_penalty" in res:
            return float(res["blank_penalty"]), uri
    return float(ctx.cfg.decode.blank_penalties[0]), "decode.blank_penalties[0]"


def graphs(model, card, penalty: float, quantize: str | None) -> dict[str, bytes]:
    """The family's graphs (model.onnx; model.streaming.onnx when it streams) and the
    sherpa-onnx graph of a CTC model."""
    from serving.ctc_onnx import sherpa_graph
    from serving.onnx_export import quantize_int8
    from training.families import family_of

    own = family_of(model).export_graphs(model, card)
    out = {"model.onnx": own.pop("model.onnx"),
           "model.sherpa.onnx": sherpa_graph(model, card, penalty), **own}
    if quantize == "int8":
        for name in list(out):
            out[name.replace(".onnx", ".int8.onnx")] = quantize_int8(out[name])
    return out


def beside(model, card, tokenizer, penalty: float, penalty_from: str) -> dict[str, str]:
    from serving.ctc_onnx import sherpa_features, streaming_json, tokens_txt
    from serving.onnx_export import features_json

    feats = features_json(card)
    try:
        feats["sherpa_onnx"] = sherpa_features(card)
    except ValueError as exc:
        raise StepError(str(exc)) from exc
    feats["sherpa_onnx_graph"] = (
        "model.sherpa.onnx takes the fbank frames sherpa-onnx computes with `sherpa_onnx` "
        "above; the causal mean normalisation (restarted at each utterance), the stacking "
        "and the global CMVN are inside the graph")
    decoding = {"search": "greedy", "blank_penalty": penalty, "blank_from": penalty_from,
                "blank_penalty_in": "model.sherpa.onnx subtracts it from the blank's log-"
                "probability; model.onnx does not (subtract it before the search)",
                "subsampling": model.subsampling, "tokenizer": tokenizer.kind}
    out = {} if model.bidirectional else {
        "streaming.json": json.dumps(streaming_json(model), indent=1)}
    return {**out, "card.json": json.dumps(card.to_meta(), indent=1),
            "tokens.txt": tokens_txt(tokenizer),
            "features.json": json.dumps(feats, indent=1),
            "decoding.json": json.dumps(decoding, indent=1)}


@dataclasses.dataclass
class CheckInputs:
    recs: list  # the records checked (both sets of features readable)
    rows: list[np.ndarray]  # amflow's model rows, per-speaker streams (as decode)
    alone_rows: list[np.ndarray]  # amflow's model rows of each utterance alone
    frames: list[np.ndarray]  # amflow's fbank frames of each utterance (sherpa's input)
    waves: list[np.ndarray]  # the samples, [-1, 1]
    rejected: int


def check_records(ctx: StepContext, corpus: str) -> list:
    """export.check_split's transcribed utterances in stream order (speaker, time), the
    first export.check_utterances of them (0: all)."""
    from decoding.decode import split_records

    ec = ctx.cfg.export
    recs, _ = split_records(ctx.storage, corpus, ec.check_split)
    if not recs:
        raise StepError(f"export.check_split={ec.check_split!r}: no utterances with a "
                        f"transcript in {corpus}; set it to a split the corpus has")
    recs = sorted(recs, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id))
    return recs[:ec.check_utterances] if ec.check_utterances else recs


def check_inputs(ctx: StepContext, card, corpus: str) -> CheckInputs:
    from decoding.decode import featurize
    from tasks.features import featurize_records
    from tasks.fbank import FbankComputer, fbank
    from serving.ctc_onnx import features_config
    from training.data import Normalizer

    recs = check_records(ctx, corpus)
    streams, rejects, _ = featurize(ctx.storage, corpus, recs, card)
    fcfg, norm = features_config(card), Normalizer.from_stats(card.cmvn, card.input_dim)
    computer = FbankComputer(fcfg)
    alone = {r.utt_id: (w, x) for r, w, x in featurize_records(
        ctx.storage, corpus, [dataclasses.replace(r, speaker_id=r.utt_id) for r in recs],
        fcfg, computer, rejects)}
    keep = [(r, x) for r, x in streams if r.utt_id in alone]
    if not keep:
        raise StepError(f"none of the {len(recs)} check utterances could be read: {rejects[:3]}")
    waves = [alone[r.utt_id][0] for r, _ in keep]
    return CheckInputs([r for r, _ in keep], [x for _, x in keep],
                       [norm(alone[r.utt_id][1]).astype(np.float32) for r, _ in keep],
                       fbank(waves, fcfg, computer), waves, len(recs) - len(keep))


def _ort_log_probs(blob: bytes, feats: list[np.ndarray]) -> list[np.ndarray]:
    from decoding.batching import batched
    from serving.onnx_runtime import session

    sess = session(blob)

    def forward(x: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
        lp, n = sess.run(None, {"x": x, "x_lens": lens})
        return [lp[j, :k] for j, k in enumerate(n)]

    return batched(feats, forward)


def _sherpa_words(files: dict[str, bytes], name: str, card, waves) -> list[list[str]]:
    from serving import sherpa_decode
    from serving.ctc_onnx import sherpa_features

    with tempfile.TemporaryDirectory(prefix="amflow-sherpa-") as tmp:
        for f in (name, "tokens.txt"):
            with open(os.path.join(tmp, f), "wb") as fh:
                fh.write(files[f])
        rec = sherpa_decode.recognizer(os.path.join(tmp, name), os.path.join(tmp, "tokens.txt"),
                                       sherpa_features(card))
        return sherpa_decode.words(rec, waves, int(card.features["sample_rate"]))


def _graph_row(ref, lp, ref_words, hyps, recs, ref_rows, tol, held, seconds) -> dict:
    from serving import export_checks as X

    diff = X.compare(ref, lp) if lp is not None else None
    same = sum(a == b for a, b in zip(ref_words, hyps))
    passed = (diff is None or diff <= tol) and hyps == ref_words
    return {"max_abs_diff": diff, "same_words": same,
            "wer_vs_torch": X.paired_delta(ref_rows, X.wer_rows(recs, hyps)),
            "seconds": round(seconds, 2), "checked": held, "passed": passed if held else None}


def run_checks(ctx: StepContext, model, card, tokenizer, files: dict[str, bytes],
               ci: CheckInputs, penalty: float) -> dict[str, Any]:
    from decoding.ctc_decode import ctc_log_probs, greedy_words
    from serving import export_checks as X
    from serving.onnx_runtime import OrtCtcStreamModel

    tol = ctx.cfg.export.tolerance
    t0 = time.perf_counter()
    ref = {"streams": ctc_log_probs(model, ci.rows), "alone": ctc_log_probs(model, ci.alone_rows)}
    torch_s = time.perf_counter() - t0
    ref_words = {k: [greedy_words(lp, tokenizer, penalty) for lp in v] for k, v in ref.items()}
    ref_rows = X.wer_rows(ci.recs, ref_words["streams"])
    out: dict[str, dict] = {}
    for name in [n for n in files if n.endswith(".onnx")]:
        sherpa = ".sherpa." in name
        t0 = time.perf_counter()
        if ".streaming." in name:
            lp = X.streamed_log_posteriors(OrtCtcStreamModel(files[name]), ci.rows,
                                           ctx.cfg.export.chunk_rows, ctx.cfg.export.streams)
        else:
            lp = _ort_log_probs(files[name], ci.frames if sherpa else ci.rows)
        secs = time.perf_counter() - t0
        hyps = [greedy_words(x, tokenizer, 0.0 if sherpa else penalty) for x in lp]
        key = "alone" if sherpa else "streams"
        if sherpa:  # the graph lowered the blank by the penalty: torch's are without it
            lp = [x + np.float32(penalty) * np.eye(1, x.shape[1], 0, dtype=np.float32)
                  for x in lp]
        out[name] = _graph_row(ref[key], lp, ref_words[key], hyps, ci.recs, ref_rows, tol,
                               ".int8." not in name, secs)
    runtime = sherpa_runtime(files, card, ci, ref_words, ref_rows)
    out.update(runtime)
    return {"sherpa_onnx_runtime": _sherpa_version() if runtime else (
                "not checked: the sherpa_onnx package is not installed (pip install "
                "sherpa-onnx==2.0.1, amflow's test extra)"),"utterances": len(ci.recs), "frames": sum(len(x) for x in ci.rows),
            "split": ctx.cfg.export.check_split, "tolerance": tol, "search": "greedy",
            "blank_penalty": penalty, "torch_seconds": round(torch_s, 2),
            "torch_wer": round(sum(r["errors"] for r in ref_rows) /
                               max(1, sum(r["ref_words"] for r in ref_rows)), 5),
            # what restarting the mean normalisation at each utterance costs (sherpa-onnx
            # decodes utterances; amflow's decode carries it over a speaker's stream)
            "torch_alone_vs_streams": X.paired_delta(
                ref_rows, X.wer_rows(ci.recs, ref_words["alone"])),
            "torch_hyp_words": sum(len(w) for w in ref_words["streams"]), "graphs": out,
            "passed": all(g["passed"] for g in out.values() if g["checked"])}


def _sherpa_version() -> str:
    from importlib.metadata import version

    return f"sherpa-onnx {version('sherpa-onnx')}"


def sherpa_runtime(files, card, ci: CheckInputs, ref_words, ref_rows) -> dict[str, dict]:
    """sherpa-onnx's recognizer on the audio, when the package is installed (measured)."""
    try:
        import sherpa_onnx  # noqa: F401
    except ImportError:
        return {}
    out = {}
    for name in [n for n in files if ".sherpa." in n]:
        t0 = time.perf_counter()
        hyps = _sherpa_words(files, name, card, ci.waves)
        row = _graph_row(None, None, ref_words["alone"], hyps, ci.recs, ref_rows, 0.0, False,
                         time.perf_counter() - t0)
        out[f"sherpa-onnx:{name}"] = row
    return out
