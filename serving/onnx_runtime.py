"""The exported student (training/families/lstm_onnx.py) in onnxruntime: the recognizer's
streaming step and the whole-utterance log-posteriors, no torch.

    session(model_bytes, threads) -> onnxruntime.InferenceSession (CPU, `threads` intra-op)
    OrtStreamModel(model_bytes, threads)      what serving.recognizer.StreamModel is, in
        onnxruntime: .forward(rows, states) -> (log posteriors, states), each stream with
        its own (h, c) and its own row count (the LSTM's sequence_lens: a short stream's
        state is taken at its last row, as torch's packed sequences do)
    OrtCtcStreamModel(model_bytes, threads)   serving.ctc_stream.CtcStreamModel's interface
        on the CTC student's exported streaming graph (training/families/ctc_onnx.py): the same
        per-stream state and batching (serving.ctc_stream.CtcStreams), onnxruntime's step
    stream_model(model_bytes, threads)   the one of the two the graph's metadata names
    utterance_log_posteriors(sess, feats, batch_frames) -> list of [T_i, C]
        decoding.decode.log_posteriors with the whole-utterance graph
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from serving.ctc_stream import CtcState, CtcStreams


def session(model_bytes: bytes, threads: int = 1):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def graph_metadata(sess) -> dict[str, str]:
    return dict(sess.get_modelmeta().custom_metadata_map)


class OrtStreamModel:
    """serving.recognizer.StreamModel's interface on the exported streaming graph."""

    def __init__(self, model_bytes: bytes, threads: int = 1):
        self.sess = session(model_bytes, threads)
        meta = graph_metadata(self.sess)
        if meta.get("streaming") != "1":
            raise ValueError("this ONNX graph is not amflow's streaming graph (its metadata "
                             "says streaming=" f"{meta.get('streaming')!r}): serve "
                             "model.streaming.onnx")
        if meta.get("model_type") != "amflow_hybrid_lstm":
            raise ValueError("this ONNX graph is not the hybrid student's streaming graph "
                             f"(model_type={meta.get('model_type')!r}): serve the "
                             "model.streaming.onnx `amflow export` wrote for this model")
        self.lookahead = int(meta["lookahead"])
        self.input_dim = int(meta["input_dim"])
        self.state_shape = (int(meta["num_layers"]), int(meta["hidden_size"]))
        self.num_classes = int(meta["num_classes"])
        self.dtype = f"onnxruntime {meta.get('quantization', 'fp32')}"

    def zero_state(self) -> np.ndarray:
        return np.zeros((2, *self.state_shape), np.float32)

    def forward(self, rows: list[np.ndarray], states: list[np.ndarray]
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        lens = [len(r) for r in rows]
        x = np.zeros((len(rows), max(lens), self.input_dim), np.float32)
        for i, r in enumerate(rows):
            x[i, :lens[i]] = r
        hc = np.stack(states, 2)  # [2, layers, B, hidden]
        logp, h, c = self.sess.run(None, {"x": x, "lengths": np.asarray(lens, np.int32),
                                          "h0": np.ascontiguousarray(hc[0]),
                                          "c0": np.ascontiguousarray(hc[1])})
        outs = [logp[i, :n] for i, n in enumerate(lens)]
        hc = np.stack([h, c])
        return outs, [np.ascontiguousarray(hc[:, :, i]) for i in range(len(rows))]


class OrtCtcStreamModel(CtcStreams):
    """The CTC student's streaming graph (model_type amflow_ctc_streaming): its state
    tensors' names, shapes and batch axes are in the graph's metadata (`state`)."""

    def __init__(self, model_bytes: bytes, threads: int = 1):
        import json

        self.sess = session(model_bytes, threads)
        meta = graph_metadata(self.sess)
        if meta.get("model_type") != "amflow_ctc_streaming":
            raise ValueError("this ONNX graph is not the CTC student's streaming graph (its "
                             f"metadata says model_type={meta.get('model_type')!r}): serve "
                             "the model.streaming.onnx `amflow export` wrote for this model")
        state = json.loads(meta["state"])
        self.state_names = [s["name"] for s in state]
        self.batch_axis = [int(s["batch_axis"]) for s in state]
        self.input_dim, self.num_classes = int(meta["input_dim"]), int(meta["vocab_size"])
        self.lookahead_rows = int(meta["lookahead_rows"])
        self.state_shapes = [tuple(d for d in s["shape"] if d != "B") for s in state]
        self._zero = CtcState(tuple(
            np.zeros(sh, np.int64 if s["dtype"] == "int64" else np.float32)
            for sh, s in zip(self.state_shapes, state)))
        self.dtype = f"onnxruntime {meta.get('quantization', 'fp32')}"

    def _run(self, x, lens, final, states):
        feed = {"x": x, "lengths": lens, "final": final}
        feed.update({n: np.ascontiguousarray(t) for n, t in zip(self.state_names, states)})
        logp, n, *new = self.sess.run(None, feed)
        return logp, n.tolist(), new


def stream_model(model_bytes: bytes, threads: int = 1):
    """The streaming wrapper of an exported streaming graph, by its metadata's model_type:
    the hybrid student's (OrtStreamModel) or the CTC student's (OrtCtcStreamModel)."""
    import onnx

    m = onnx.load_from_string(model_bytes)
    kind = {p.key: p.value for p in m.metadata_props}.get("model_type")
    return (OrtCtcStreamModel if kind == "amflow_ctc_streaming" else OrtStreamModel)(
        model_bytes, threads)


def utterance_log_posteriors(sess, feats: Sequence[np.ndarray], batch_frames: int = 20000
                             ) -> list[np.ndarray]:
    """Log-posteriors per utterance from the whole-utterance graph: length-sorted, zero-
    padded batches (the student is causal but for its look-ahead, which sees zeros past an
    utterance's end either way), as decoding.decode.log_posteriors batches them."""
    from decoding.batching import batched

    # a graph that attends across frames (the Conformer's) also takes the lengths
    with_lengths = "lengths" in {i.name for i in sess.get_inputs()}

    def forward(x: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
        (y,) = sess.run(None, {"x": x, **({"lengths": lens} if with_lengths else {})})
        return [y[j, :n] for j, n in enumerate(lens)]

    return batched(feats, forward, batch_frames)
