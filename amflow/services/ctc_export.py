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
          TLG.fst, words.txt    (when the run has an LM) sherpa-onnx's CTC graph search:
                                amflow's L o G (decoding/ctc_graph.py, decode's builder and
                                LM) read as CTC reads repeats (repeats="blank"), weights times
                                SHERPA_BEAM / decode.beam; OpenFst binary, input labels
                                token id + 1 (blank 1), output labels words.txt
          sherpa.json           sherpa-onnx's recognizer config for the folder (model,
                                tokens, feat_config, ctc_graph, ctc_max_active) and the
                                search's settings: LM weight, acwt, blank penalty (what
                                `amflow decode` tuned on dev for this model: tuned_scales),
                                the scores' scale, the beam
          streaming.json        model.streaming.onnx's inputs, outputs, state, protocol
          card.json, features.json (with `sherpa_onnx`: FeatureExtractorConfig's arguments),
          decoding.json (greedy search, its blank penalty), checks.json, _SUCCESS.json
model.sherpa.onnx's outputs are scale x (log p - blank penalty), scale = acwt x SHERPA_BEAM /
decode.beam (1 without an LM): sherpa-onnx's graph search then searches amflow decode's
score (acwt x (log p - penalty) + graph cost) with decode.beam; greedy search is unchanged.
The checks, on export.check_split's utterances:
  model.onnx         on amflow's features (per-speaker streams, as decode): log-probs
                     within export.tolerance of torch's (in units of each value's size
                     above 1: serving/export_checks.py scaled_diff), the same greedy words
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
  sherpa-onnx + TLG.fst  (with an LM) its graph search on the audio: its words against
                     amflow's T o L o G search (decode's graph, decode.beam) of each
                     utterance alone, and the WER change against that search of the
                     speaker streams (checks.json `tlg`; measured, not held)
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


# sherpa-onnx's graph search (offline-ctc-fst-decoder.cc) sets only max_active; its beam is
# kaldi-decoder's FasterDecoderOptions default
SHERPA_BEAM = 16.0


@dataclasses.dataclass
class Scales:
    """The search's settings the export ships: what `amflow decode` tuned on
    decode.tune_split for this model (decode[-<tag>]/result.json), else the config's."""
    lm_weight: float
    acwt: float  # 1 / lm_weight
    blank_penalty: float
    source: str  # where they come from, for the export's json


def tuned_scales(ctx: StepContext, model_uri: str) -> Scales:
    """The LM weight and blank penalty `amflow decode` tuned for this model on its
    tune split (dev; decode.tune_split never takes test), T o L o G's first, greedy
    search's (its penalty alone) next; else decode.ctc_lm_weights[0] and
    decode.blank_penalties[0]."""
    dc = ctx.cfg.decode
    uri = ctx.other(step_dir_name("decode", dc.tag), "result.json")
    res = ctx.storage.read_json(uri) if ctx.storage.exists(uri) else {}
    why = "no decode of it" if not res else None
    if res and res.get("model") != model_uri:
        why = f"{uri} decoded another model ({res.get('model')})"
    elif res and res.get("search") not in ("tlg", "greedy"):
        why = f"{uri} is a {res.get('search') or 'hybrid'} decode"
    elif res and res.get("tuning") and res.get("tune_split") not in ("dev", "labeled"):
        why = f"{uri} was tuned on {res.get('tune_split')!r}, not on dev"
    if why:
        w = float(dc.ctc_lm_weights[0])
        return Scales(w, round(1.0 / w, 6), float(dc.blank_penalties[0]),
                      f"decode.ctc_lm_weights[0], decode.blank_penalties[0] ({why})")
    tuned = f"tuned on {res['tune_split']}" if res.get("tuning") else "not tuned (one setting)"
    if res["search"] == "greedy":
        w = float(dc.ctc_lm_weights[0])
        return Scales(w, round(1.0 / w, 6), float(res["blank_penalty"]),
                      f"blank penalty: {uri} (greedy, {tuned}); LM weight: "
                      "decode.ctc_lm_weights[0]")
    return Scales(float(res["lm_weight"]), float(res["acwt"]), float(res["blank_penalty"]),
                  f"{uri} (T o L o G, {tuned})")


@dataclasses.dataclass
class SherpaSearch:
    """What sherpa-onnx's graph search gets: the H o L o G (None without an LM) scaled so
    that its fixed beam is decode.beam, and the scale of model.sherpa.onnx's scores."""
    graph: Any  # decoding.graph.DecodingGraph, or None
    amflow_graph_dir: str  # amflow decode's own T o L o G (the checks' reference)
    scale: float  # model.sherpa.onnx's outputs: scale x (log p - blank penalty)
    graph_scale: float
    note: str


def sherpa_search(ctx: StepContext, card, tokenizer, scales: Scales) -> SherpaSearch:
    """amflow's L o G of the run's LM (decoding/ctc_graph.py, the builder decode uses), read
    as CTC reads repeats (repeats="blank": sherpa-onnx's reading of a path), every weight
    times SHERPA_BEAM / decode.beam, and the scores times that and acwt: sherpa-onnx then
    searches acwt x (log p - blank penalty) + graph cost, amflow decode's score, with
    decode.beam (in amflow's units) and decode.max_active."""
    from amflow.services.decoder_setup import ctc_graph, lm_uri
    from decoding.assets import load_lm
    from decoding.ctc_graph import build_tlg, scaled

    lm, hint = lm_uri(ctx)
    if not ctx.storage.exists(lm):
        return SherpaSearch(None, "", 1.0, 1.0, f"not exported: no LM at {lm} ({hint}); "
                            "sherpa-onnx gets greedy search only")
    k = SHERPA_BEAM / float(ctx.cfg.decode.beam)
    graph_dir = ctc_graph(ctx, card, {})[0]
    hlg = scaled(build_tlg(tokenizer, load_lm(ctx.storage, lm, hint), repeats="blank"), k)
    return SherpaSearch(hlg, graph_dir, round(k * scales.acwt, 6), k, f"TLG.fst from {lm}")


def graphs(model, card, penalty: float, quantize: str | None, scale: float = 1.0
           ) -> dict[str, bytes]:
    """The family's graphs (model.onnx; model.streaming.onnx when it streams) and the
    sherpa-onnx graph of a CTC model (its scores times `scale`)."""
    from serving.ctc_onnx import sherpa_graph
    from serving.onnx_export import quantize_int8
    from training.families import family_of

    own = family_of(model).export_graphs(model, card)
    out = {"model.onnx": own.pop("model.onnx"),
           "model.sherpa.onnx": sherpa_graph(model, card, penalty, scale), **own}
    if quantize == "int8":
        for name in list(out):
            out[name.replace(".onnx", ".int8.onnx")] = quantize_int8(out[name])
    return out


def graph_files(search: SherpaSearch) -> dict[str, bytes]:
    """TLG.fst (OpenFst binary, as kaldifst writes it) and words.txt (its output labels)."""
    if search.graph is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="amflow-tlg-") as tmp:
        search.graph.write(tmp)
        with open(os.path.join(tmp, "HLG.fst"), "rb") as f:
            fst = f.read()
    words = "".join(f"{w} {i}\n" for i, w in enumerate(search.graph.words))
    return {"TLG.fst": fst, "words.txt": words.encode()}


def sherpa_json(ctx: StepContext, scales: Scales, search: SherpaSearch) -> dict:
    """sherpa.json: sherpa-onnx's OfflineRecognizerConfig for the folder (serving/
    sherpa_decode.py's from_folder reads it; beside() adds feat_config), and where each
    setting comes from."""
    dc = ctx.cfg.decode
    return {
        "model": "model.sherpa.onnx", "tokens": "tokens.txt", "decoding_method": "greedy_search",
        "ctc_graph": "TLG.fst" if search.graph is not None else "",
        "ctc_max_active": int(dc.max_active), "graph": search.note,
        "lm_weight": scales.lm_weight, "acwt": scales.acwt,
        "blank_penalty": scales.blank_penalty, "tuned": scales.source,
        "scores": "model.sherpa.onnx's log_probs are scale x (log p - blank_penalty): "
                  "greedy search's argmax is the same; the graph search adds TLG.fst's "
                  "costs (the LM's, times graph_scale)",
        "scale": search.scale, "graph_scale": search.graph_scale,
        "beam": {"sherpa_onnx": SHERPA_BEAM, "amflow_units": float(dc.beam)},
        "words": "the result's text: the path's tokens, spelled (one word per ▁); "
                 "result.words are words.txt ids, without the words the graph outputs "
                 "on epsilon arcs",
        "graph_info": search.graph.info if search.graph is not None else None}


def beside(model, card, tokenizer, scales: Scales, sherpa: dict, streaming: bool
           ) -> dict[str, str]:
    """The files beside the graphs; streaming.json when model.streaming.onnx was made."""
    from serving.ctc_onnx import output_frame_shift, sherpa_features, streaming_json, tokens_txt
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
    decoding = {"search": "greedy", "blank_penalty": scales.blank_penalty,
                "blank_from": scales.source,
                "blank_penalty_in": "model.sherpa.onnx subtracts it from the blank's log-"
                "probability (and multiplies by sherpa.json's scale); model.onnx does not "
                "(subtract it before the search)",
                "subsampling": output_frame_shift(model, card), "tokenizer": tokenizer.kind}
    out = {"streaming.json": json.dumps(streaming_json(model), indent=1)} if streaming else {}
    return {**out, "card.json": json.dumps(card.to_meta(), indent=1),
            "tokens.txt": tokens_txt(tokenizer),
            "features.json": json.dumps(feats, indent=1),
            "decoding.json": json.dumps(decoding, indent=1),
            "sherpa.json": json.dumps({**sherpa, "feat_config": feats["sherpa_onnx"]}, indent=1,
                                      ensure_ascii=False)}


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


def _sherpa_words(files: dict[str, bytes], name: str, card, waves, graph: bool = False,
                  max_active: int = 3000) -> list[list[str]]:
    """sherpa-onnx's words for `waves` with graph `name` (and TLG.fst: its graph search)."""
    from serving import sherpa_decode
    from serving.ctc_onnx import sherpa_features

    with tempfile.TemporaryDirectory(prefix="amflow-sherpa-") as tmp:
        for f in (name, "tokens.txt") + (("TLG.fst",) if graph else ()):
            with open(os.path.join(tmp, f), "wb") as fh:
                fh.write(files[f])
        rec = sherpa_decode.recognizer(
            os.path.join(tmp, name), os.path.join(tmp, "tokens.txt"), sherpa_features(card),
            graph=os.path.join(tmp, "TLG.fst") if graph else "", max_active=max_active)
        return sherpa_decode.words(rec, waves, int(card.features["sample_rate"]))


def _unscaled(lp: list[np.ndarray], scale: float, penalty: float) -> list[np.ndarray]:
    """model.sherpa.onnx's outputs back to log-probabilities (torch's are without the
    penalty and the scale)."""
    return [x / np.float32(scale) + np.float32(penalty) * np.eye(1, x.shape[1], 0,
                                                                 dtype=np.float32)
            for x in lp]


def run_checks(ctx: StepContext, model, card, tokenizer, files: dict[str, bytes],
               ci: CheckInputs, scales: Scales, search: SherpaSearch) -> dict[str, Any]:
    from decoding.ctc_decode import ctc_log_probs, greedy_words
    from serving import export_checks as X
    from serving.onnx_runtime import OrtCtcStreamModel

    tol, penalty = ctx.cfg.export.tolerance, scales.blank_penalty
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
        if sherpa:  # the graph scaled and lowered the blank: torch's are without it
            lp = _unscaled(lp, search.scale, penalty)
        out[name] = X.graph_row(ref[key], lp, ref_words[key], hyps, ci.recs, ref_rows, tol,
                                ".int8." not in name, secs)
    runtime = sherpa_runtime(files, card, ci, ref_words, ref_rows)
    tlg = tlg_checks(ctx, tokenizer, files, card, ci, ref, scales, search) if runtime else {}
    out.update(runtime)
    out.update(tlg.pop("graphs", {}))
    return {"sherpa_onnx_runtime": _sherpa_version() if runtime else (
                "not checked: the sherpa_onnx package is not installed (pip install "
                "sherpa-onnx==2.0.1, amflow's test extra)"),"utterances": len(ci.recs), "frames": sum(len(x) for x in ci.rows),
            "split": ctx.cfg.export.check_split, "tolerance": tol, "search": "greedy",
            "blank_penalty": penalty, "blank_from": scales.source,
            "torch_seconds": round(torch_s, 2),
            "torch_wer": round(sum(r["errors"] for r in ref_rows) /
                               max(1, sum(r["ref_words"] for r in ref_rows)), 5),
            # what restarting the mean normalisation at each utterance costs (sherpa-onnx
            # decodes utterances; amflow's decode carries it over a speaker's stream)
            "torch_alone_vs_streams": X.paired_delta(
                ref_rows, X.wer_rows(ci.recs, ref_words["alone"])),
            "torch_hyp_words": sum(len(w) for w in ref_words["streams"]), "graphs": out,
            "tlg": tlg or None,
            "passed": all(g["passed"] for g in out.values() if g["checked"])}


def tlg_checks(ctx: StepContext, tokenizer, files, card, ci: CheckInputs, ref: dict,
               scales: Scales, search: SherpaSearch) -> dict[str, Any]:
    """sherpa-onnx's graph search with TLG.fst against amflow decode's T o L o G search of
    the same log-probabilities (measured, not held): same words per utterance alone, and
    the WER change against amflow's decode of the speaker streams. `hlg_in_amflow`:
    amflow's searcher on TLG.fst with sherpa-onnx's scores and beam (what sherpa-onnx
    should give: the difference from decode is then the repeats' reading alone)."""
    from decoding.ctc_decode import ctc_scores
    from decoding.graph import read_graph
    from decoding.search import Searcher
    from serving import export_checks as X

    if search.graph is None:
        return {"graph": search.note}
    dc = ctx.cfg.decode
    own = Searcher(read_graph(search.amflow_graph_dir), dc.beam, dc.max_active)
    words = {k: [own.best_words(ctc_scores(lp, scales.acwt, scales.blank_penalty))[0]
                 for lp in v] for k, v in ref.items()}
    hlg = Searcher(search.graph, SHERPA_BEAM, dc.max_active)
    hlg_words = [hlg.best_words(ctc_scores(lp, search.scale, scales.blank_penalty))[0]
                 for lp in ref["alone"]]
    rows = X.wer_rows(ci.recs, words["streams"])
    graphs = {}
    for name in [n for n in files if ".sherpa." in n]:
        t0 = time.perf_counter()
        hyps = _sherpa_words(files, name, card, ci.waves, graph=True, max_active=dc.max_active)
        graphs[f"sherpa-onnx+TLG.fst:{name}"] = X.graph_row(
            None, None, words["alone"], hyps, ci.recs, rows, 0.0, False,
            time.perf_counter() - t0)
    return {"graph": search.note, "lm_weight": scales.lm_weight, "acwt": scales.acwt,
            "blank_penalty": scales.blank_penalty, "tuned": scales.source,
            "amflow_wer": round(sum(r["errors"] for r in rows) /
                                max(1, sum(r["ref_words"] for r in rows)), 5),
            "amflow_hyp_words": sum(len(w) for w in words["alone"]),
            "amflow_alone_vs_streams": X.paired_delta(rows, X.wer_rows(ci.recs, words["alone"])),
            "hlg_in_amflow_same_words": sum(a == b for a, b in zip(words["alone"], hlg_words)),
            "graphs": graphs}


def _sherpa_version() -> str:
    from importlib.metadata import version

    return f"sherpa-onnx {version('sherpa-onnx')}"


def sherpa_runtime(files, card, ci: CheckInputs, ref_words, ref_rows) -> dict[str, dict]:
    """sherpa-onnx's recognizer on the audio, greedy search, when the package is installed
    (measured)."""
    try:
        import sherpa_onnx  # noqa: F401
    except ImportError:
        return {}
    from serving import export_checks as X

    out = {}
    for name in [n for n in files if ".sherpa." in n]:
        t0 = time.perf_counter()
        hyps = _sherpa_words(files, name, card, ci.waves)
        row = X.graph_row(None, None, ref_words["alone"], hyps, ci.recs, ref_rows, 0.0, False,
                          time.perf_counter() - t0)
        out[f"sherpa-onnx:{name}"] = row
    return out
