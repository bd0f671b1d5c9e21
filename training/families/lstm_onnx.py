"""The hybrid LSTM student (training/families/lstm.py StudentLSTM) as ONNX graphs, built node by
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
    lstm = getattr(model, "lstm", None)
    if lstm is None or not hasattr(model, "lookahead") or lstm.bidirectional:
        raise ValueError("only the hybrid LSTM student (unidirectional, training.families."
                         "lstm.StudentLSTM) exports to ONNX; this is a "
                         f"{getattr(model, 'kind', '?')}")


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
    if card is not None and card.features:  # (a benchmark's graph has no card)
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
