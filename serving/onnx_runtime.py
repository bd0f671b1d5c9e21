"""The exported student (serving/onnx_export.py) in onnxruntime: the recognizer's
streaming step and the whole-utterance log-posteriors, no torch.

    session(model_bytes, threads) -> onnxruntime.InferenceSession (CPU, `threads` intra-op)
    OrtStreamModel(model_bytes, threads)      what serving.recognizer.StreamModel is, in
        onnxruntime: .forward(rows, states) -> (log posteriors, states), each stream with
        its own (h, c) and its own row count (the LSTM's sequence_lens: a short stream's
        state is taken at its last row, as torch's packed sequences do)
    utterance_log_posteriors(sess, feats, batch_frames) -> list of [T_i, C]
        decoding.decode.log_posteriors with the whole-utterance graph
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


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


def utterance_log_posteriors(sess, feats: Sequence[np.ndarray], batch_frames: int = 20000
                             ) -> list[np.ndarray]:
    """Log-posteriors per utterance from the whole-utterance graph: length-sorted, zero-
    padded batches (the student is causal but for its look-ahead, which sees zeros past an
    utterance's end either way), as decoding.decode.log_posteriors batches them."""
    from decoding.batching import batched

    def forward(x: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
        (y,) = sess.run(None, {"x": x})
        return [y[j, :n] for j, n in enumerate(lens)]

    return batched(feats, forward, batch_frames)
