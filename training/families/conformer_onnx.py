"""The Conformer's whole-utterance ONNX graph (`amflow export`'s model.onnx):

    x [B, T, D] float32 (zero rows past each utterance's end), lengths [B] int64
    -> log_probs [B, T, C]

the eval-mode forward (the configured chunk and left context) and a log-softmax. Unlike
the LSTM student's graph it takes the lengths: a frame attends to the rest of its chunk,
so padding must be masked (serving/onnx_runtime.utterance_log_posteriors feeds them to a
graph that has the input). Traced with torch.onnx's TorchScript exporter (dynamo=False:
the dynamo exporter needs onnxscript), whose ops are plain: MatMul, Softmax, Conv, Where.
No streaming graph yet: `amflow serve` streams the Conformer on torch (ConformerStream).
"""
from __future__ import annotations

import io
import json
import warnings

import torch
from torch import nn

OPSET = 17


class _LogProbs(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.model(x, lengths), -1)


def metadata(model, card=None) -> dict[str, str]:
    """metadata_props: what a runtime needs to feed the graph without amflow."""
    c = model.config
    meta = {"model_type": f"amflow_{model.kind}", "streaming": "0",
            "input_dim": str(model.input_dim), "num_classes": str(model.num_classes),
            "chunk": str(c["chunk"]), "left_chunks": str(c["left_chunks"]),
            "inputs": "x [B, T, D] (zero rows past each length), lengths [B] int64",
            "output": "log-posteriors [B, T, C] over the classes (classes.txt or tokens.txt)"}
    if card is not None and card.features:
        f = card.features
        meta["features"] = json.dumps({k: f.get(k) for k in (
            "sample_rate", "num_mel_bins", "frame_length_ms", "frame_shift_ms", "stack",
            "subsample", "cmn_window", "cmn_min_window")})
    return meta


def utterance_graph(model, card=None) -> bytes:
    """The serialized graph (module docstring). The trace's example batch has two lengths
    (equal lengths would trace the unmasked branch) and the model is left in the mode it
    was in (the exporter's own restore would put every submodule in training mode)."""
    import onnx
    from onnx import helper

    was_training = model.training
    wrapper = _LogProbs(model.float().cpu()).eval()
    x = torch.zeros(2, 2 * model.chunk + 3, model.input_dim)
    lengths = torch.tensor([x.shape[1], x.shape[1] - 2], dtype=torch.int64)
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python-level shapes
            torch.onnx.export(wrapper, (x, lengths), buf, dynamo=False, opset_version=OPSET,
                              input_names=["x", "lengths"], output_names=["log_probs"],
                              dynamic_axes={"x": {0: "B", 1: "T"}, "lengths": {0: "B"},
                                            "log_probs": {0: "B", 1: "T"}})
    finally:
        model.train(was_training)
    m = onnx.load_from_string(buf.getvalue())
    helper.set_model_props(m, metadata(model, card))
    onnx.checker.check_model(m)
    return m.SerializeToString()
