"""The CTC student (training.ctc.model.CtcModel, and the joint CTC/attention model's
encoder + CTC output) as ONNX graphs, exported by torch.onnx's TorchScript exporter
(dynamo=False: no onnxscript needed) from modules that compute what CtcModel.encode and
ctc_output compute in eval mode, written so the exporter can trace them: BatchNorm as its
running-statistics affine map times the mask (what MaskedBatchNorm gives in eval), a
bidirectional layer as two one-way layers, the backward one over each utterance reversed
within its own length (as the packed sequences do), and no boolean indexing.

    utterance_graph(model, card) -> bytes      amflow's features in
        x [N, T, D] float32 model rows (features.json: zero rows past each end),
        x_lens [N] int64 -> log_probs [N, T', C], log_probs_len [N] int64
    sherpa_graph(model, card, blank_penalty) -> bytes   sherpa-onnx's zipformer-CTC convention
        x [N, T, bins] float32 log-mel fbank frames as sherpa-onnx computes them with
        `sherpa_features(card)`, x_lens [N] int64 -> log_probs [N, T', C] (C static: the
        loader reads the vocabulary size from it), log_probs_len [N] int64. Inside:
        amflow's causal mean normalisation (restarted at each utterance: sherpa-onnx
        decodes utterances, not a speaker's stream), the low-frame-rate stacking, the
        global CMVN, the model; the blank's log-probability lowered by `blank_penalty`
        (amflow's greedy search setting: sherpa-onnx's greedy search has none)
    streaming_graph(model, card) -> bytes      one streaming step (CtcStreamingStep,
        branch_free): x [B, T, D] model rows, lengths [B] int64, final [B] bool, the state
        (streaming_state(model): names, shapes, dtypes, batch axes) -> log_probs
        [B, T_out, C], out_lengths [B] int64, the state out (each name + "_out"); a
        unidirectional model only (NotStreamable otherwise)
    tokens_txt(tokenizer) -> str    "symbol id" per line, <blk> 0 (sherpa-onnx's blank)
    sherpa_features(card) -> dict   sherpa_onnx.FeatureExtractorConfig's arguments that
        give amflow's fbank (refused, naming the features.* key, where sherpa-onnx has no
        setting for amflow's)
    UtteranceFrontEnd(fcfg, cmvn)   the in-graph front end alone (tests compare it to
        tasks.features' StreamCMN + stack_frames + the Normalizer)
"""
from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import torch
from torch import nn

from training.ctc.model import CtcModel

OPSET = 17
INPUTS = ("x", "x_lens")
OUTPUTS = ("log_probs", "log_probs_len")
# sherpa-onnx's FeatureExtractorConfig fixes these (kaldi-native-fbank's defaults): an
# amflow fbank with other values cannot be reproduced there
SHERPA_FIXED = {"frame_length_ms": 25.0, "frame_shift_ms": 10.0, "preemph_coeff": 0.97,
                "remove_dc_offset": True, "window_type": "povey"}


def _mask(lengths: torch.Tensor, steps: Any) -> torch.Tensor:
    return torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]


def _affine(bn: nn.BatchNorm1d, x: torch.Tensor, dim: int) -> torch.Tensor:
    """BatchNorm in eval mode (running statistics) along `dim` of x."""
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shift = bn.bias - bn.running_mean * scale
    shape = [1] * x.dim()
    shape[dim] = -1
    return x * scale.view(shape) + shift.view(shape)


def _one_way(rnn: nn.Module, reverse: bool) -> nn.Module:
    """One direction of a one-layer (bidirectional) recurrent layer as its own layer."""
    new = type(rnn)(rnn.input_size, rnn.hidden_size, batch_first=True)
    sfx = "_reverse" if reverse else ""
    new.load_state_dict({k: getattr(rnn, f"{k}{sfx}").detach().clone()
                         for k in new.state_dict()})
    return new.eval()


def _reversed(h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Each utterance's frames reversed within its own length (padding stays put)."""
    t = torch.arange(h.shape[1], device=h.device)[None, :]
    idx = torch.where(t < n[:, None], n[:, None] - 1 - t, t)
    return torch.gather(h, 1, idx[:, :, None].expand(-1, -1, h.shape[2]))


class CtcEncoderExport(nn.Module):
    """CtcModel.encode + ctc_output + log_softmax, traceable (module docstring)."""

    def __init__(self, model):
        super().__init__()
        if not isinstance(model, CtcModel):
            raise ValueError(f"not a CTC student: {type(model).__name__}")
        self.m = model.eval()
        self.ways = nn.ModuleList(
            nn.ModuleList([_one_way(r, False), _one_way(r, True)]) for r in model.rnns
        ) if model.bidirectional else None

    def _rnn(self, k: int, h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        rnn = self.m.rnns[k]
        z = h.new_zeros((1, h.shape[0], rnn.hidden_size))
        state = (z, z) if isinstance(rnn, nn.LSTM) else z
        if self.ways is None:
            return rnn(h, state)[0]  # causal: trailing padding never reaches a real frame
        fwd, bwd = self.ways[k]
        back = _reversed(bwd(_reversed(h, n), state)[0], n)
        return torch.cat([fwd(h, state)[0], back], -1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.m
        b, t = x.shape[0], x.shape[1]
        n = lengths * m.stack
        y = (x * _mask(lengths, t)[:, :, None]).reshape(b, 1, t * m.stack, m.bins)
        for conv in m.convs:
            y = conv.conv(y)
            n = conv.out_len(n)
            y = _affine(conv.bn, y, 1) * _mask(n, y.shape[2])[:, None, :, None]
            y = torch.clamp(y, 0.0, 20.0)
        h = y.transpose(1, 2).flatten(2)
        mk = _mask(n, h.shape[1])[:, :, None].to(h.dtype)
        for k, norm in enumerate(m.norms):
            h = self._rnn(k, _affine(norm, h, -1) * mk, n) * mk
        if m.row_conv is not None:
            h = m.row_conv(h) * mk
        logits = m.output(_affine(m.out_norm, h, -1) * mk)
        return torch.log_softmax(logits, -1), n  # n <= T': the convolutions' own count


class CtcLogProbs(nn.Module):
    """A model with the CTC student's interface (encode(x, lengths) -> (h, n),
    ctc_output(h, n)) that traces as it is (the Conformer's CTC head): + log_softmax."""

    def __init__(self, model):
        super().__init__()
        self.m = model.eval()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, n = self.m.encode(x, lengths)
        return torch.log_softmax(self.m.ctc_output(h, n), -1), n


def export_module(model) -> nn.Module:
    """The model's family's traceable encoder + CTC output (ModelFamily.ctc_export_module)."""
    from training.families.base import family_of

    return family_of(model).ctc_export_module(model)


class UtteranceFrontEnd(nn.Module):
    """fbank frames [N, T, bins] + lengths -> model rows [N, T', stack*bins] + lengths:
    tasks.features' causal mean normalisation of one utterance (each its own stream), its
    low-frame-rate stacking, then the global CMVN."""

    def __init__(self, fcfg: FeaturesConfig, cmvn: dict | None, input_dim: int):
        super().__init__()
        from training.data import Normalizer

        self.window = int(fcfg.cmn_window)
        self.min_window = int(min(fcfg.cmn_min_window, fcfg.cmn_window))
        self.stack, self.subsample = int(fcfg.stack), int(fcfg.subsample)
        norm = Normalizer.from_stats(cmvn, input_dim)
        self.register_buffer("mean", torch.from_numpy(np.asarray(norm.mean, np.float32)))
        self.register_buffer("inv_std", torch.from_numpy(np.asarray(norm.inv_std, np.float32)))

    def normalise(self, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """StreamCMN.apply on each utterance alone: frame t minus the mean of the last
        `window` frames, the first min_window - 1 frames minus the mean of the first
        min(min_window, length); centred on the first 100 frames' mean as StreamCMN is
        (float32 prefix sums stay exact enough)."""
        b, t, d = x.shape[0], x.shape[1], x.shape[2]
        mk = _mask(lens, t)[:, :, None].to(x.dtype)
        x = x * mk  # sherpa-onnx pads a batch with log(1e-10): out of every sum
        k_ref = torch.clamp(lens, max=100).clamp(min=1).to(x.dtype)[:, None, None]
        ref = (x[:, :100] * mk[:, :100]).sum(1, keepdim=True) / k_ref
        xc = (x - ref) * mk
        p = torch.cat([x.new_zeros((b, 1, d)), torch.cumsum(xc, 1)], 1)  # p[t] = sum of t frames
        lag = torch.cat([x.new_zeros((b, self.window - 1, d)), p], 1)[:, :t]
        cnt = torch.clamp(torch.arange(t, device=x.device) + 1, max=self.window).to(x.dtype)
        running = (p[:, 1:] - lag) / cnt[None, :, None]
        k = torch.clamp(lens, max=self.min_window).clamp(min=1)
        cold = torch.gather(p, 1, k[:, None, None].expand(-1, 1, d)) / k.to(x.dtype)[:, None, None]
        is_cold = (torch.arange(t, device=x.device) < self.min_window - 1)[None, :, None]
        return xc - torch.where(is_cold, cold, running)

    def forward(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.normalise(x, lens)
        s, u = self.stack, self.subsample
        # `stack` zero frames after the end: an utterance shorter than a row still makes
        # one (past its length: the model masks rows past r_lens)
        y = torch.cat([y, y.new_zeros((y.shape[0], s, y.shape[2]))], 1)
        rows = (y.shape[1] - s) // u + 1
        y = torch.cat([y[:, j:j + u * (rows - 1) + 1:u] for j in range(s)], -1)
        r_lens = torch.clamp(torch.div(lens - s, u, rounding_mode="floor") + 1, min=0)
        return (y - self.mean) * self.inv_std, r_lens


class SherpaCtc(nn.Module):
    """The front end, the model, the blank penalty, the scale: sherpa_graph's module.
    `scale` multiplies its outputs (greedy search does not see it): sherpa-onnx's graph
    search takes them as its acoustic scores as they come, so the acoustic scale goes in
    here (amflow/services/ctc_export.py says which)."""

    def __init__(self, model, card, blank_penalty: float = 0.0, scale: float = 1.0):
        super().__init__()
        self.scale = float(scale)
        self.front = UtteranceFrontEnd(features_config(card), card.cmvn, model.input_dim)
        self.encoder = export_module(model)
        pen = torch.zeros(model.num_classes)
        pen[0] = -float(blank_penalty)
        self.register_buffer("penalty", pen)

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, r_lens = self.front(x, x_lens)
        lp, n = self.encoder(rows, r_lens)
        out = lp + self.penalty
        return (out if self.scale == 1.0 else out * self.scale), n


def features_config(card):
    """The card's features section as a FeaturesConfig, unknown keys ignored (what
    training.loop.dataclass_from_dict gives for this flat section; not imported from
    there: the training loop builds models through the families)."""
    import dataclasses

    from core.config import FeaturesConfig

    known = {f.name for f in dataclasses.fields(FeaturesConfig)}
    return FeaturesConfig(**{k: v for k, v in card.features.items() if k in known})


def _export(module: nn.Module, x: torch.Tensor, meta: dict[str, str]) -> bytes:
    import onnx
    from onnx import helper

    lens = torch.tensor([x.shape[1], max(1, x.shape[1] - 7)], dtype=torch.int64)
    buf = io.BytesIO()
    axes = {"x": {0: "N", 1: "T"}, "x_lens": {0: "N"}, "log_probs": {0: "N", 1: "T_out"},
            "log_probs_len": {0: "N"}}
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and GRU batch notes
        torch.onnx.export(module.eval(), (x, lens), buf, dynamo=False, opset_version=OPSET,
                          input_names=list(INPUTS), output_names=list(OUTPUTS),
                          dynamic_axes=axes, do_constant_folding=True)
    m = onnx.load_from_string(buf.getvalue())
    m.producer_name = "amflow"
    helper.set_model_props(m, meta)
    onnx.checker.check_model(m, full_check=True)
    return m.SerializeToString()


def utterance_graph(model, card) -> bytes:
    x = torch.randn(2, 40, model.input_dim)
    return _export(export_module(model), x, metadata(model, card, "amflow_ctc", "model rows"))


def sherpa_graph(model, card, blank_penalty: float = 0.0, scale: float = 1.0) -> bytes:
    bins = int(features_config(card).num_mel_bins)
    x = torch.randn(2, 130, bins) * 3 + 10
    meta = metadata(model, card, "amflow_ctc_sherpa", "log-mel fbank frames")
    meta["blank_penalty"] = str(float(blank_penalty))
    meta["scale"] = str(float(scale))
    return _export(SherpaCtc(model, card, blank_penalty, scale), x, meta)


STREAM_INPUTS = ("x", "lengths", "final")
STREAM_OUTPUTS = ("log_probs", "out_lengths")


def streaming_state(step) -> list[dict[str, Any]]:
    """The streaming graph's state tensors: name, shape ("B" the batch), dtype, batch axis
    (a fresh utterance's state is all zeros)."""
    out = []
    for name, t in zip(step.state_names, step.zero_state(1)):
        axis = 1 if name.startswith("rnn_") else 0
        shape: list = list(t.shape)
        shape[axis] = "B"
        out.append({"name": name, "shape": shape, "batch_axis": axis,
                    "dtype": "int64" if t.dtype == torch.int64 else "float32"})
    return out


def streaming_graph(model, card) -> bytes:
    """CtcStreamingStep(branch_free=True) traced once (no branch on the inputs' values: the
    one trace serves every batch size, row count and `final`)."""
    import warnings

    import onnx
    from onnx import helper

    from training.ctc.streaming import CtcStreamingStep

    step = CtcStreamingStep(model.eval(), branch_free=True)
    state = streaming_state(step)
    names = [s["name"] for s in state]
    axes = {n: {a: "B"} for n, a in zip(names, (s["batch_axis"] for s in state))}
    axes.update({f"{n}_out": {a: "B"} for n, a in zip(names, (s["batch_axis"] for s in state))})
    axes.update({"x": {0: "B", 1: "T"}, "lengths": {0: "B"}, "final": {0: "B"},
                 "log_probs": {0: "B", 1: "T_out"}, "out_lengths": {0: "B"}})
    args = (torch.randn(2, 4, model.input_dim), torch.tensor([4, 3]),
            torch.tensor([False, True]), *step.zero_state(2))
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and GRU batch notes
        torch.onnx.export(step, args, buf, dynamo=False, opset_version=OPSET,
                          input_names=[*STREAM_INPUTS, *names],
                          output_names=[*STREAM_OUTPUTS, *(f"{n}_out" for n in names)],
                          dynamic_axes=axes, do_constant_folding=True)
    m = onnx.load_from_string(buf.getvalue())
    m.producer_name = "amflow"
    meta = metadata(model, card, "amflow_ctc_streaming", "model rows, one chunk a call")
    meta.update({"streaming": "1", "state": json.dumps(state),
                 "lookahead_rows": str(step.lookahead_rows), "num_classes": str(
                     model.num_classes)})
    helper.set_model_props(m, meta)
    onnx.checker.check_model(m, full_check=True)
    return m.SerializeToString()


def streaming_json(model) -> dict[str, Any]:
    """streaming.json: how to drive model.streaming.onnx (beside the graph's metadata)."""
    from training.ctc.streaming import CtcStreamingStep

    step = CtcStreamingStep(model.eval(), branch_free=True)
    return {"graph": "model.streaming.onnx", "inputs": [*STREAM_INPUTS, *step.state_names],
            "outputs": [*STREAM_OUTPUTS, *(f"{n}_out" for n in step.state_names)],
            "state": streaming_state(step), "lookahead_rows": step.lookahead_rows,
            "protocol": "per utterance: the state starts at zeros (shapes above, B = the "
                        "streams of the call); each call takes each stream's new rows (x, "
                        "zero rows past `lengths`), returns the output frames they complete "
                        "(the first out_lengths[b] of log_probs[b]) and the state for the "
                        "next call; final[b] on the call carrying an utterance's last rows "
                        "(no rows allowed) flushes the look-ahead. The outputs of an "
                        "utterance, concatenated, are model.onnx's of its rows"}


def metadata(model, card, model_type: str, inputs: str) -> dict[str, str]:
    """metadata_props: sizes and what goes in (WeNet's vocab_size / subsampling_factor
    keys too: sherpa-onnx's CTC loaders of other conventions read them)."""
    return {"model_type": model_type, "inputs": inputs,
            "vocab_size": str(model.num_classes), "subsampling_factor": str(
                output_frame_shift(model, card)), "input_dim": str(model.input_dim),
            "blank_id": "0", "bidirectional": str(int(getattr(model, "bidirectional", False))),
            "lookahead": str(int(model.lookahead)),
            "output": "log-probabilities over tokens.txt (0 = the blank) per output frame",
            "features": json.dumps(dict(card.features))}


def output_frame_shift(model, card) -> int:
    """10 ms frames per output frame: the family's rows per output x the rows' stack."""
    from training.families.base import family_of

    stack = dict(card.features).get("stack", getattr(model, "stack", 1))  # the GRU knows its own
    return family_of(model).subsampling(model) * int(stack)


def tokens_txt(tokenizer) -> str:
    """sherpa-onnx's tokens.txt: "symbol id" per line; the blank is <blk> at 0 (its
    greedy search looks the blank up by that name); ▁ marks a word's start, as sherpa-onnx
    reads BPE pieces (it writes a space for it)."""
    for s in tokenizer.symbols:
        if not s or any(c.isspace() for c in s):
            raise ValueError(f"token {s!r} has white space: tokens.txt cannot hold it")
    return "".join(f"{s} {i}\n" for i, s in enumerate(tokenizer.symbols))


def sherpa_features(card) -> dict[str, Any]:
    """FeatureExtractorConfig arguments computing amflow's fbank: samples taken at the
    int16 scale (normalize_samples False: amflow's fbank multiplies by 32768 too), the
    same mel range, dither and framing."""
    f = features_config(card)
    for key, want in SHERPA_FIXED.items():
        if getattr(f, key) != want:
            raise ValueError(f"features.{key}={getattr(f, key)!r}: sherpa-onnx computes fbank "
                             f"with {key}={want!r} and has no setting for it; this model "
                             "cannot be fed by sherpa-onnx's front end")
    return {"sampling_rate": int(f.sample_rate), "feature_dim": int(f.num_mel_bins),
            "low_freq": float(f.low_freq), "high_freq": float(f.high_freq),
            "dither": float(f.dither), "normalize_samples": False,
            "snip_edges": bool(f.snip_edges)}
