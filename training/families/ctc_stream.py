"""The CTC student in the recognizer: serving.recognizer.StreamModel's interface on
training.ctc.streaming.CtcStreamingStep.

    CtcStreams                                 the shared part of both backends (the state
        per stream, batching in numpy); serving.onnx_runtime.OrtCtcStreamModel is the
        exported streaming graph's
    CtcStreamModel(model, torch_dtype, device)
        .forward(rows, states) -> (log posteriors, states)   a batch of streams, each with
            its own rows (any count, 0 too) and state; the outputs are the frames the rows
            completed (the model's look-ahead is inside the step: `lookahead` is 0, the
            session drops and pads nothing)
        .zero_state() -> CtcState              a fresh utterance
        .utterance_end(state) -> CtcState      the next forward carries the utterance's
            last rows: the step flushes it (right padding), as the offline forward ends
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class CtcState:
    tensors: tuple  # one stream's state tensors (CtcStreamingStep.state_names), no batch dim
    final: bool = False


class CtcStreams:
    """What both CTC streaming backends share: a stream's state is a CtcState (its tensors
    without the batch axis); forward batches the streams' rows and states in numpy, runs
    the step (`_run`, the backend's), and splits the outputs per stream. The torch step
    (CtcStreamModel) and the exported graph in onnxruntime
    (serving.onnx_runtime.OrtCtcStreamModel) differ only in `_run`."""

    lookahead = 0  # the step holds its own look-ahead back (training/ctc/streaming.py)
    batch_axis: list[int]  # the batch axis of each state tensor
    input_dim: int
    _zero: CtcState

    def zero_state(self) -> CtcState:
        return self._zero

    def utterance_end(self, state: CtcState) -> CtcState:
        return replace(state, final=True)

    def _run(self, x: np.ndarray, lens: np.ndarray, final: np.ndarray,
             states: list[np.ndarray]) -> tuple[np.ndarray, list[int], list[np.ndarray]]:
        """(log_probs [B, T_out, C], out_lengths, the new state tensors), numpy."""
        raise NotImplementedError

    def forward(self, rows: list[np.ndarray], states: list[CtcState]
                ) -> tuple[list[np.ndarray], list[CtcState]]:
        lens = [len(r) for r in rows]
        x = np.zeros((len(rows), max(lens + [1]), self.input_dim), np.float32)
        for i, r in enumerate(rows):
            x[i, :lens[i]] = r
        stacked = [np.stack([s.tensors[k] for s in states], a)
                   for k, a in enumerate(self.batch_axis)]
        logp, n, new = self._run(x, np.asarray(lens, np.int64),
                                 np.asarray([s.final for s in states], bool), stacked)
        outs = [logp[i, :k] for i, k in enumerate(n)]
        return outs, [CtcState(tuple(np.array(np.take(t, i, axis=a))
                                     for t, a in zip(new, self.batch_axis)))
                      for i in range(len(rows))]


class CtcStreamModel(CtcStreams):
    def __init__(self, model, dtype=None, device: str = "cpu"):
        """`dtype`: a torch dtype (serving.recognizer.torch_dtype), None: float32."""
        import torch

        from training.ctc.streaming import CtcStreamingStep

        self.device = device
        self.dtype = dtype or torch.float32
        self.step = CtcStreamingStep(model.to(device=device, dtype=self.dtype).eval())
        self.input_dim = model.input_dim
        self.num_classes = model.num_classes
        self.lookahead_rows = self.step.lookahead_rows
        # the batch axis of each state tensor: the recurrent state is [layers, B, H]
        self.batch_axis = [1 if n.startswith("rnn_") else 0 for n in self.step.state_names]
        zero = self.step.zero_state(1, dtype=self.dtype)
        self._zero = CtcState(tuple(np.take(t.float().numpy() if t.is_floating_point()
                                            else t.numpy(), 0, axis=a)
                                    for t, a in zip(zero, self.batch_axis)))

    def _run(self, x, lens, final, states):
        import torch

        with torch.inference_mode():
            st = [torch.from_numpy(t).to(self.device) if t.dtype == np.int64
                  else torch.from_numpy(t).to(self.device, self.dtype) for t in states]
            out, n, *new = self.step(torch.from_numpy(x).to(self.device, self.dtype),
                                     torch.from_numpy(lens).to(self.device),
                                     torch.from_numpy(final).to(self.device), *st)
            logp = out.float().cpu().numpy()
            new = [t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
                   for t in new]
        return logp, n.cpu().tolist(), new
