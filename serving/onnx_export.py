"""What `amflow export` writes beside a model's graphs: features.json (how a deployment
makes the graphs' input rows), gate.json (the speech gate: `gate_json`, `gate_from_json`),
and the model a graph was exported from in its metadata (`with_model` stamps it,
`exported_from` reads it: `amflow serve` refuses a graph of another model). The hybrid LSTM student's graphs themselves are its
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


MODEL_DIGEST, MODEL_URI = "amflow_model_digest", "amflow_model_uri"


def with_model(graph: bytes, digest: str, uri: str) -> bytes:
    """The graph with the digest (core.storage.digest_of) and URI of the model.pt it was
    exported from in its metadata: a server refuses a graph of another model by it."""
    import onnx
    from onnx import helper

    m = onnx.load_from_string(graph)
    meta = {p.key: p.value for p in m.metadata_props}
    meta.update({MODEL_DIGEST: digest, MODEL_URI: uri})
    del m.metadata_props[:]
    helper.set_model_props(m, meta)
    return m.SerializeToString()


def exported_from(graph: bytes) -> tuple[str | None, str | None]:
    """(the model digest, the model URI) a graph's metadata names; None for a graph
    exported before amflow recorded them."""
    import onnx

    meta = {p.key: p.value for p in onnx.load_from_string(graph).metadata_props}
    return meta.get(MODEL_DIGEST), meta.get(MODEL_URI)


def gate_json(gate, card) -> dict[str, Any]:
    """gate.json: the speech gate amflow serves this model with (serve.speech_*,
    tasks/speech_activity.py), in seconds and dB (`settings`: GateSettings' fields) and in
    this model's fbank frames (`frames`), with the rule, so a deployment of the exported
    folder keeps silence, a constant signal and steady noise out of the recognizer too.
    `gate` None: serve.speech_gate was off (enabled false, the settings are the defaults)."""
    import dataclasses

    from core.config import FeaturesConfig
    from tasks.speech_activity import GateSettings, full_scale_noise_db
    from training.loop import dataclass_from_dict

    fcfg = dataclass_from_dict(FeaturesConfig, card.features)
    settings = gate or GateSettings()
    act, pad = settings.activity(fcfg), settings.frame_gate(fcfg)
    return {
        "enabled": gate is not None, "settings": dataclasses.asdict(settings),
        "frames": {"frame_shift_ms": fcfg.frame_shift_ms, "floor_frames": act.floor_frames,
                   "smooth_frames": act.smooth, "steady_frames": act.steady_frames,
                   "pad_frames": pad.lead, "audible_energy_db": round(act.audible_db, 4),
                   "full_scale_white_noise_energy_db": round(full_scale_noise_db(fcfg), 4)},
        "rule": [
            "on the fbank frames (features.json), before the mean normalisation, per stream",
            "energy of a frame: 10 log10 of the sum over mel bins of exp(log-mel) (dB)",
            "a frame below audible_energy_db is no sound (digital silence, a constant "
            "signal): dropped, and the floor and smoothing restart after it (the next 2 "
            "frames are not counted either)",
            "smoothed energy: 10 log10 of the mean power of the frame and the "
            "smooth_frames - 1 before it",
            "floor: the least smoothed energy of the frame and the floor_frames - 1 before it; "
            "where the smoothed energy held within steady_db for steady_frames, at least "
            "that span's least energy (a steady sound is no speech)",
            "speech: smoothed energy > floor + threshold_db",
            "recognised: speech frames, pad_frames after each and pad_frames before each "
            "(held until speech comes); the rest are dropped, also from the mean "
            "normalisation; an utterance with no speech has no rows: no words"],
        "implementation": "tasks/speech_activity.py (SpeechActivity, SpeechGate, "
                          "GateSettings(**settings))"}


def gate_from_json(doc: dict):
    """gate.json -> tasks.speech_activity.GateSettings (None when it says enabled false)."""
    from tasks.speech_activity import GateSettings

    return GateSettings(**doc["settings"]) if doc.get("enabled") else None
