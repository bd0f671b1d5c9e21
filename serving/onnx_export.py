"""What `amflow export` writes beside a model's graphs: features.json (how a deployment
makes the graphs' input rows). The hybrid LSTM student's graphs themselves are its
family's (training/families/lstm_onnx.py, the family file's export_graphs); their names
stay importable from here.
"""
from __future__ import annotations

from typing import Any

from training.families.lstm_onnx import (GATES_TORCH_TO_ONNX, INPUTS_STREAMING,  # noqa: F401
                                         OPSET, OUTPUTS_STREAMING, metadata, quantize_int8,
                                         streaming_graph, utterance_graph)


def features_json(card) -> dict[str, Any]:
    """How the graphs' input rows are made from 16 kHz audio (what a deployment must
    reproduce, or hand amflow's serving/features.py the job)."""
    from core.config import FeaturesConfig
    from training.data import Normalizer
    from training.loop import dataclass_from_dict

    fcfg = dataclass_from_dict(FeaturesConfig, card.features)
    norm = Normalizer.from_stats(card.cmvn, card.input_dim)
    return {
        "pipeline": ["fbank: Kaldi compute-fbank-feats recipe on samples x 32768 "
                     "(tasks/fbank.py), log(max(energy, FLT_EPSILON))",
                     "causal mean normalisation over the speaker's stream: frame t minus the "
                     "mean of the last cmn_window frames (the first cmn_min_window frames of "
                     "a stream use the mean of the first cmn_min_window)",
                     "low frame rate: row r = frames r*subsample .. r*subsample+stack-1, "
                     "concatenated",
                     "global CMVN: x = (row - cmvn_mean) * cmvn_inv_std"],
        "fbank": {k: getattr(fcfg, k) for k in (
            "sample_rate", "num_mel_bins", "frame_length_ms", "frame_shift_ms", "dither",
            "preemph_coeff", "remove_dc_offset", "window_type", "low_freq", "high_freq",
            "snip_edges")},
        "cmn_window": fcfg.cmn_window, "cmn_min_window": fcfg.cmn_min_window,
        "stack": fcfg.stack, "subsample": fcfg.subsample,
        "cmvn_mean": [float(v) for v in norm.mean], "cmvn_inv_std": [float(v) for v in norm.inv_std],
        "amflow_features": dict(card.features)}
