"""An exported CTC student (training/families/ctc_onnx.py's sherpa graph) decoded by sherpa-onnx:
what a deployment without amflow runs, used by `amflow export`'s checks and the tests.

    recognizer(model_path, tokens_path, features, threads) -> sherpa-onnx's OfflineRecognizer
        the zipformer-CTC loader (inputs x, x_lens; outputs log_probs, log_probs_len; the
        vocabulary size read from log_probs' last dimension; greedy search, blank <blk>)
        with `features` (ctc_onnx.sherpa_features: amflow's fbank settings) as its
        FeatureExtractorConfig. The config objects are sherpa-onnx's public API (the C, C++,
        Java, Kotlin, Swift and Go APIs take the same fields); the Python convenience
        constructors (OfflineRecognizer.from_zipformer_ctc) pass only the sample rate and
        the number of bins, and leave snip_edges and the sample scale at values amflow's
        fbank does not use.
    words(rec, waves, sample_rate) -> 1-best words per utterance (float [-1, 1] samples)
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def recognizer(model_path: str, tokens_path: str, features: dict[str, Any], threads: int = 1):
    import sherpa_onnx as so
    from sherpa_onnx.lib._sherpa_onnx import OfflineRecognizer

    cfg = so.OfflineRecognizerConfig(
        feat_config=so.FeatureExtractorConfig(**features),
        model_config=so.OfflineModelConfig(
            zipformer_ctc=so.OfflineZipformerCtcModelConfig(model=model_path),
            tokens=tokens_path, num_threads=int(threads), provider="cpu"),
        decoding_method="greedy_search")
    return OfflineRecognizer(cfg)


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
