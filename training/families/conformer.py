"""The Conformer family: a streaming Conformer-style student (model.conformer; the network
is training/families/conformer_model.py) with the hybrid head: frame classes over the
run's senones or phones, trained like the LSTM student (labels, the teacher's top-k soft
targets, sequence criteria), decoded over H o L o G with the class priors, served chunk by
chunk by `amflow serve` on torch.

Its streaming step (ConformerStream) holds a stream's rows until they fill a chunk, runs
whole chunks with the cached keys/values and convolution histories, and on the call that
carries an utterance's last rows (`utterance_end`) runs the partial last chunk: the outputs
equal the eval-mode whole-utterance pass, which uses the same chunking.

`conformer_ctc` (ConformerCtcFamily) is the same encoder with the CTC head over tokens,
trained like the GRU CTC student on transcripts and pseudo-labels.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from core.config import ModelConfig
from training.families.base import ModelFamily, register_family
from training.families.conformer_model import (ConformerCtcModel, ConformerModel,
                                               stream_chunk, stream_chunks, zero_stream_state)

# The attention context a frame of an unlimited left context (left_chunks -1) is counted
# with in flops_per_frame: half of a 10 s utterance at 33 Hz (it grows with the utterance).
UNLIMITED_CONTEXT_FRAMES = 167


def stream_rows(model: ConformerModel, xs: list[torch.Tensor], states: list[list[torch.Tensor]]
                ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """New rows xs[b] [1, n_b, D] of B streams -> per stream (logits [1, m_b, C] of the rows
    that completed chunks, its state). A state is [held rows [1, p, D], final flag,
    *zero_stream_state]: rows short of a chunk wait, unless the flag says they are the
    utterance's last. Whole chunks of all streams run together (one batch per round of
    chunks); an utterance's partial last chunk runs alone."""
    rows = [torch.cat([s[0], x], 1) for x, s in zip(xs, states)]
    inner = [list(s[2:]) for s in states]
    done = [0] * len(rows)
    outs = [[torch.zeros(1, 0, model.num_classes, dtype=r.dtype, device=r.device)] for r in rows]
    chunk = model.chunk
    while ready := [b for b, r in enumerate(rows) if r.shape[1] - done[b] >= chunk]:
        y, new = stream_chunks(model, torch.cat([rows[b][:, done[b]:done[b] + chunk]
                                                 for b in ready]), [inner[b] for b in ready])
        for j, b in enumerate(ready):
            outs[b].append(y[j:j + 1])
            inner[b], done[b] = new[j], done[b] + chunk
    for b, s in enumerate(states):
        if bool(s[1]) and rows[b].shape[1] > done[b]:  # the utterance's partial last chunk
            y, inner[b] = stream_chunk(model, rows[b][:, done[b]:], inner[b])
            outs[b].append(y)
            done[b] = rows[b].shape[1]
    return [(torch.cat(outs[b], 1), [rows[b][:, done[b]:], s[1], *inner[b]])
            for b, s in enumerate(states)]


class ConformerStream:
    """The recognizer's streaming step (serving/recognizer.py): the streams of a forward
    run their whole chunks together (stream_rows); `lookahead` is 0 because the step holds
    its chunk's rows itself and is told by `utterance_end(state)` which forward carries an
    utterance's last rows.
    The frame count and the flag stay float32 whatever the serving dtype (a bf16 count
    would skip positions past 256)."""

    lookahead = 0

    def __init__(self, model: ConformerModel, dtype: torch.dtype = torch.float32,
                 device: str = "cpu"):
        self.model = model.to(device=device, dtype=dtype).eval()
        self.dtype, self.device = dtype, device
        self.input_dim = int(model.input_dim)
        zero = zero_stream_state(self.model)
        held = np.zeros((1, 0, self.input_dim), np.float32)
        self._zero = [held, np.float32(0)] + [t.float().cpu().numpy() for t in zero]

    def zero_state(self) -> list[np.ndarray]:
        return list(self._zero)

    def utterance_end(self, state: list[np.ndarray]) -> list[np.ndarray]:
        return [state[0], np.float32(1), *state[2:]]

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.asarray(a, np.float32))
        return t.to(self.device, self.dtype if t.dim() else torch.float32)

    def forward(self, rows: list[np.ndarray], states: list) -> tuple[list, list]:
        """Only the streams whose rows fill a chunk (or end their utterance) go through the
        model; the others just hold their new rows (no state to convert: at 100-ms client
        chunks, most calls of a stream), with no output yet."""
        outs: list = [None] * len(rows)
        new: list = [None] * len(rows)
        run = []
        for i, (r, s) in enumerate(zip(rows, states)):
            held = s[0].shape[1] + len(r)
            if held >= self.model.chunk or (bool(s[1]) and held):
                run.append(i)
            else:
                outs[i] = np.zeros((0, self.model.num_classes), np.float32)
                new[i] = [np.concatenate([s[0], np.asarray(r, np.float32)[None]], 1), *s[1:]]
        if run:
            with torch.inference_mode():
                done = stream_rows(self.model, [self._tensor(rows[i])[None] for i in run],
                                   [[self._tensor(t) for t in states[i]] for i in run])
                for i, (y, st) in zip(run, done):
                    outs[i] = torch.log_softmax(y[0].float(), -1).cpu().numpy()
                    new[i] = [t.float().cpu().numpy() for t in st]
        return outs, new


def attention_flops_per_frame(model: ConformerModel) -> int:
    """The attention's own operations per frame (its projections are weights): scores and
    the weighted sum, 2 x dim x (keys a frame sees) each, per block. A frame sees
    left_chunks x chunk cached keys and on average (chunk + 1) / 2 of its own chunk."""
    c = model.config
    if c["left_chunks"] < 0:
        keys = UNLIMITED_CONTEXT_FRAMES
    else:
        keys = c["left_chunks"] * c["chunk"] + (c["chunk"] + 1) / 2
    return int(round(c["layers"] * 2 * 2 * c["dim"] * keys))


@register_family("conformer")
class ConformerFamily(ModelFamily):
    """The streaming Conformer student with the hybrid head (model.conformer)."""

    decoder = "hybrid"
    streams = True

    model_class = ConformerModel

    def config(self, model_cfg: ModelConfig):
        return model_cfg.conformer  # both heads share the encoder's section

    def build(self, input_dim: int, num_classes: int, model_cfg: ModelConfig,
              stack: int = 3) -> nn.Module:
        return self.model_class(input_dim, num_classes,
                                **dataclasses.asdict(model_cfg.conformer))

    def spec(self, model):
        # the output layer's size, not the built one: train.grow replaces the layer
        return {**model.config, "num_classes": model.num_classes}

    def from_spec(self, spec):
        return self.model_class(**{k: v for k, v in spec.items() if k not in ("format", "kind")})

    def lookahead(self, model):
        return int(model.lookahead)  # a chunk's first frame waits for the rest of it

    def chunk_right_context(self, model, batches):
        return int(model.lookahead)  # a chunk pass sees what the stream's chunks see

    def flops_per_frame(self, model):
        return super().flops_per_frame(model) + attention_flops_per_frame(model)

    def stream_model(self, model, dtype, device):
        return ConformerStream(model, dtype, device)

    def with_chunking(self, spec, chunk, left_chunks):
        return {**spec, "chunk": int(chunk), "left_chunks": int(left_chunks)}

    def export_graphs(self, model, card):
        from training.families.conformer_onnx import utterance_graph

        return {"model.onnx": utterance_graph(model, card)}


@register_family("conformer_ctc")
class ConformerCtcFamily(ConformerFamily):
    """The same streaming encoder (model.conformer) with the CTC head over characters or
    BPE pieces (the GRU CTC student's tokens, model.ctc.tokens): trained on whole
    transcripts (labels and train.pseudolabels), decoded over T o L o G or greedily,
    served chunk by chunk with the same streaming step."""

    decoder = "ctc"
    whole_utterances = True  # its targets are whole transcripts: no chunk passes
    grows = False  # over tokens, not phone classes
    regimes = ("labeled",)  # its pseudo-labels are transcripts (train.pseudolabels)
    model_class = ConformerCtcModel

    def ctc_export_module(self, model):
        from training.families.ctc_onnx import CtcLogProbs

        return CtcLogProbs(model)  # the chunked encoder traces as it is

    def export_graphs(self, model, card):
        # the CTC students' convention (x, x_lens -> log_probs, log_probs_len), so `amflow
        # export`'s CTC checks, the sherpa-onnx graph and its loaders take it as they take
        # the GRU student's; no streaming graph yet (amflow serve streams it on torch)
        from training.families.ctc_onnx import utterance_graph

        return {"model.onnx": utterance_graph(model, card)}
