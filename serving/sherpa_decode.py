"""An exported CTC student (training/families/ctc_onnx.py's sherpa graph) decoded by sherpa-onnx:
what a deployment without amflow runs, used by `amflow export`'s checks and the tests.

    recognizer(model_path, tokens_path, features, threads, graph, max_active)
        -> sherpa-onnx's OfflineRecognizer
        the zipformer-CTC loader (inputs x, x_lens; outputs log_probs, log_probs_len; the
        vocabulary size read from log_probs' last dimension; greedy search, blank <blk>)
        with `features` (ctc_onnx.sherpa_features: amflow's fbank settings) as its
        FeatureExtractorConfig. The config objects are sherpa-onnx's public API (the C, C++,
        Java, Kotlin, Swift and Go APIs take the same fields); the Python convenience
        constructors (OfflineRecognizer.from_zipformer_ctc) pass only the sample rate and
        the number of bins, and leave snip_edges and the sample scale at values amflow's
        fbank does not use. With `graph` (the export's TLG.fst): its CTC graph search
        (OfflineCtcFstDecoderConfig: kaldi-decoder's FasterDecoder, beam 16, `max_active`)
        instead of greedy search.
    from_folder(folder, model, graph, threads) -> the recognizer an export folder's
        sherpa.json describes (amflow/services/ctc_export.py), from its files alone;
        graph=False: greedy search
    words(rec, waves, sample_rate) -> 1-best words per utterance (float [-1, 1] samples)
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def recognizer(model_path: str, tokens_path: str, features: dict[str, Any], threads: int = 1,
               graph: str = "", max_active: int = 3000):
    import sherpa_onnx as so
    from sherpa_onnx.lib._sherpa_onnx import OfflineRecognizer

    cfg = so.OfflineRecognizerConfig(
        feat_config=so.FeatureExtractorConfig(**features),
        model_config=so.OfflineModelConfig(
            zipformer_ctc=so.OfflineZipformerCtcModelConfig(model=model_path),
            tokens=tokens_path, num_threads=int(threads), provider="cpu"),
        ctc_fst_decoder_config=so.OfflineCtcFstDecoderConfig(graph=graph,
                                                              max_active=int(max_active)),
        decoding_method="greedy_search")
    return OfflineRecognizer(cfg)


def from_folder(folder: str, model: str = "", graph: bool = True, threads: int = 1):
    """The recognizer of an export folder (its sherpa.json); `model`: another of its
    sherpa graphs (model.sherpa.int8.onnx)."""
    import json
    import os

    path = os.path.join(folder, "sherpa.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not a CTC export of this amflow (`amflow export` "
                                "writes sherpa.json beside model.sherpa.onnx)")
    with open(path) as f:
        cfg = json.load(f)
    fst = os.path.join(folder, cfg["ctc_graph"]) if graph and cfg["ctc_graph"] else ""
    return recognizer(os.path.join(folder, model or cfg["model"]),
                      os.path.join(folder, cfg["tokens"]), cfg["feat_config"], threads,
                      graph=fst, max_active=cfg["ctc_max_active"])


def words(rec, waves: Sequence[np.ndarray], sample_rate: int) -> list[list[str]]:
    streams = []
    for w in waves:
        s = rec.create_stream()
        s.accept_waveform(int(sample_rate), np.asarray(w, np.float32))
        streams.append(s)
    rec.decode_streams(streams)
    # sherpa-onnx writes a <unk> piece into the text; amflow's tokenizer drops it
    # (Tokenizer.decode) before it splits the pieces into words
    return [s.result.text.replace("<unk>", "").split() for s in streams]
