"""The hybrid LSTM student (training.models.StudentLSTM) as ONNX graphs, built node by
node with onnx.helper (torch.onnx's exporter needs onnxscript; a hand-built graph also
keeps ONNX's own LSTM op, whose `sequence_lens` gives each stream of a batch its state at
its own last row, as the torch recognizer's packed sequences do).

    streaming_graph(model) -> onnx.ModelProto
        x [B, T, D] float32, lengths [B] int32, h0 / c0 [layers, B, hidden]
        -> log_probs [B, T, C], hn / cn [layers, B, hidden]
        one step of a stream: rows in, state in, log-posteriors and state out. Rows past
        a stream's length are padding (their outputs are zeros); the look-ahead is the
        caller's (drop an utterance's first `lookahead` outputs, feed `lookahead` zero rows
        at its end: serving/recognizer.py), as with the torch model's streaming step.
    utterance_graph(model) -> onnx.ModelProto
        x [B, T, D] float32 (zero rows past each utterance's end) -> log_probs [B, T, C]
        the whole-utterance model, look-ahead inside (StudentLSTM.forward + log_softmax)
    quantize_int8(model_bytes) -> bytes
        int8 dynamic quantization (onnxruntime.quantization.quantize_dynamic: the LSTM and
        MatMul weights in int8, activations quantized per call)
    metadata(card, streaming) -> dict     what the graphs carry as metadata_props
    gate_json(gate, card) / gate_from_json(doc)   gate.json: the speech gate (settings,
        frame counts and rule) beside the graphs
    with_model(graph, digest, uri) / exported_from(graph)   the model.pt a graph was
        exported from (its digest and URI, in the metadata; `amflow export` stamps every
        graph it writes, `amflow serve` refuses a graph of another model)

PyTorch orders an LSTM's gates i, f, g, o; ONNX orders them i, o, f, c: the weight
blocks are permuted, and ONNX's B is PyTorch's two bias vectors concatenated.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

OPSET = 17
GATES_TORCH_TO_ONNX = (0, 3, 1, 2)  # i, o, f, c taken from torch's i, f, g, o blocks
INPUTS_STREAMING = ("x", "lengths", "h0", "c0")
OUTPUTS_STREAMING = ("log_probs", "hn", "cn")


def _gates(w: np.ndarray, hidden: int) -> np.ndarray:
    blocks = [w[k * hidden:(k + 1) * hidden] for k in range(4)]
    return np.concatenate([blocks[k] for k in GATES_TORCH_TO_ONNX])


def lstm_layer_weights(lstm, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W [1, 4H, in], R [1, 4H, H], B [1, 8H]) of one layer, in ONNX's gate order."""
    h = lstm.hidden_size

    def get(name: str) -> np.ndarray:
        return getattr(lstm, f"{name}_l{layer}").detach().float().cpu().numpy()

    w, r = _gates(get("weight_ih"), h), _gates(get("weight_hh"), h)
    if lstm.bias:
        b = np.concatenate([_gates(get("bias_ih"), h), _gates(get("bias_hh"), h)])
    else:
        b = np.zeros(8 * h, np.float32)
    return w[None], r[None], b[None]


def _check_student(model) -> None:
    if getattr(model, "kind", None) != "student" or model.lstm.bidirectional:
        raise ValueError("only the hybrid LSTM student (unidirectional, training.models."
                         f"StudentLSTM) exports to ONNX; this is a {getattr(model, 'kind', '?')}")


def _lstm_stack(model, nodes: list, inits: list, x: str, lengths: str, h0: str, c0: str
                ) -> tuple[str, list[str], list[str]]:
    """The LSTM layers from time-major `x` [T, B, D]: (output [T, B, H], Y_h names, Y_c names)."""
    from onnx import helper, numpy_helper

    lstm = model.lstm
    hs, cs = [], []
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    for k in range(lstm.num_layers):
        w, r, b = lstm_layer_weights(lstm, k)
        for name, arr in (("W", w), ("R", r), ("B", b)):
            inits.append(numpy_helper.from_array(arr.astype(np.float32), f"{name}{k}"))
        states = []
        if h0:
            inits.append(numpy_helper.from_array(np.array([k], np.int64), f"l{k}_start"))
            inits.append(numpy_helper.from_array(np.array([k + 1], np.int64), f"l{k}_end"))
            for src in (h0, c0):
                states.append(f"{src}_l{k}")
                nodes.append(helper.make_node("Slice", [src, f"l{k}_start", f"l{k}_end"],
                                              [states[-1]]))
        ins = [x, f"W{k}", f"R{k}", f"B{k}", lengths, *states] if h0 else [x, f"W{k}", f"R{k}", f"B{k}"]
        nodes.append(helper.make_node(
            "LSTM", ins,
            [f"y{k}", f"hn{k}", f"cn{k}"], hidden_size=lstm.hidden_size))
        nodes.append(helper.make_node("Squeeze", [f"y{k}", "axis1"], [f"y{k}_sq"]))
        x = f"y{k}_sq"
        hs.append(f"hn{k}")
        cs.append(f"cn{k}")
    return x, hs, cs


def _output_layer(model, nodes: list, inits: list, y: str) -> str:
    """Batch-major log-softmax of the output layer over time-major `y` [T, B, H]."""
    from onnx import helper, numpy_helper

    wt = model.output.weight.detach().float().cpu().numpy().T.copy()
    inits.append(numpy_helper.from_array(wt, "out_w"))
    inits.append(numpy_helper.from_array(
        model.output.bias.detach().float().cpu().numpy(), "out_b"))
    nodes += [helper.make_node("Transpose", [y], ["y_bt"], perm=[1, 0, 2]),
              helper.make_node("MatMul", ["y_bt", "out_w"], ["logits_nb"]),
              helper.make_node("Add", ["logits_nb", "out_b"], ["logits"]),
              helper.make_node("LogSoftmax", ["logits"], ["log_probs_all"], axis=-1)]
    return "log_probs_all"


def streaming_graph(model, card=None):
    """State in, state out (module docstring)."""
    from onnx import TensorProto, helper

    _check_student(model)
    lstm = model.lstm
    L, H, D, C = lstm.num_layers, lstm.hidden_size, lstm.input_size, model.output.out_features
    nodes: list = [helper.make_node("Transpose", ["x"], ["x_tb"], perm=[1, 0, 2])]
    inits: list = []
    y, hs, cs = _lstm_stack(model, nodes, inits, "x_tb", "lengths", "h0", "c0")
    out = _output_layer(model, nodes, inits, y)
    nodes += [helper.make_node("Identity", [out], ["log_probs"]),
              helper.make_node("Concat", hs, ["hn"], axis=0),
              helper.make_node("Concat", cs, ["cn"], axis=0)]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "amflow_student_streaming",
        [helper.make_tensor_value_info("x", f32, ["B", "T", D]),
         helper.make_tensor_value_info("lengths", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("h0", f32, [L, "B", H]),
         helper.make_tensor_value_info("c0", f32, [L, "B", H])],
        [helper.make_tensor_value_info("log_probs", f32, ["B", "T", C]),
         helper.make_tensor_value_info("hn", f32, [L, "B", H]),
         helper.make_tensor_value_info("cn", f32, [L, "B", H])], inits)
    return _model(graph, metadata(model, card, streaming=True))


def utterance_graph(model, card=None):
    """The whole utterance, look-ahead inside (module docstring)."""
    from onnx import TensorProto, helper, numpy_helper

    _check_student(model)
    la, D, C = int(model.lookahead), model.lstm.input_size, model.output.out_features
    inits: list = [numpy_helper.from_array(np.array([0, 0, 0, 0, la, 0], np.int64), "pads"),
                   numpy_helper.from_array(np.array([la], np.int64), "la_start"),
                   numpy_helper.from_array(np.array([2 ** 62], np.int64), "la_end"),
                   numpy_helper.from_array(np.array([1], np.int64), "time_axis")]
    nodes: list = [helper.make_node("Pad", ["x", "pads"], ["x_la"], mode="constant"),
                   helper.make_node("Transpose", ["x_la"], ["x_tb"], perm=[1, 0, 2])]
    y, _, _ = _lstm_stack(model, nodes, inits, "x_tb", "", "", "")
    out = _output_layer(model, nodes, inits, y)
    nodes.append(helper.make_node("Slice", [out, "la_start", "la_end", "time_axis"],
                                  ["log_probs"]))
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "amflow_student_utterance", [helper.make_tensor_value_info("x", f32, ["B", "T", D])],
        [helper.make_tensor_value_info("log_probs", f32, ["B", "T", C])], inits)
    return _model(graph, metadata(model, card, streaming=False))


def _model(graph, meta: dict[str, str]):
    import onnx
    from onnx import helper

    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="amflow")
    m.ir_version = 8  # what onnxruntime 1.16+ reads; opset 17 needs no newer
    helper.set_model_props(m, meta)
    onnx.checker.check_model(m, full_check=True)
    return m


def metadata(model, card=None, streaming: bool = True) -> dict[str, str]:
    """metadata_props: what a runtime needs to feed the graph without amflow."""
    lstm = model.lstm
    meta = {"model_type": "amflow_hybrid_lstm", "streaming": str(int(streaming)),
            "lookahead": str(int(model.lookahead)), "input_dim": str(lstm.input_size),
            "num_layers": str(lstm.num_layers), "hidden_size": str(lstm.hidden_size),
            "num_classes": str(model.output.out_features),
            "output": "log-posteriors over the classes (classes.txt); hybrid decoding "
                      "scores acwt * (log_probs - log_prior), decoding.json"}
    if card is not None:
        f = card.features
        meta["features"] = json.dumps({k: f.get(k) for k in (
            "sample_rate", "num_mel_bins", "frame_length_ms", "frame_shift_ms", "stack",
            "subsample", "cmn_window", "cmn_min_window")})
    return meta


def quantize_int8(model_bytes: bytes) -> bytes:
    """int8 dynamic quantization of an exported graph (LSTM and MatMul weights)."""
    import os
    import tempfile

    import onnx
    from onnx import helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="amflow-quant-") as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        with open(src, "wb") as f:
            f.write(model_bytes)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        m = onnx.load(dst)
    meta = {p.key: p.value for p in m.metadata_props}
    meta["quantization"] = "int8"  # dynamic: int8 weights, activations quantized per call
    helper.set_model_props(m, meta)
    return m.SerializeToString()


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
