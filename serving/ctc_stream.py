"""The CTC student in the recognizer: serving.recognizer.StreamModel's interface on
training.ctc.streaming.CtcStreamingStep.

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


class CtcStreamModel:
    lookahead = 0  # the step holds its own look-ahead back (training/ctc/streaming.py)

    def __init__(self, model, dtype=None, device: str = "cpu"):
        """`dtype`: a torch dtype (serving.recognizer.torch_dtype's), None: float32."""
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

    def zero_state(self) -> CtcState:
        return self._zero

    def utterance_end(self, state: CtcState) -> CtcState:
        return replace(state, final=True)

    def forward(self, rows: list[np.ndarray], states: list[CtcState]
                ) -> tuple[list[np.ndarray], list[CtcState]]:
        import torch

        lens = [len(r) for r in rows]
        x = np.zeros((len(rows), max(lens + [1]), self.input_dim), np.float32)
        for i, r in enumerate(rows):
            x[i, :lens[i]] = r
        stacked = [np.stack([s.tensors[k] for s in states], a)
                   for k, a in enumerate(self.batch_axis)]
        with torch.inference_mode():
            st = [torch.from_numpy(t).to(self.device) if t.dtype == np.int64
                  else torch.from_numpy(t).to(self.device, self.dtype) for t in stacked]
            out, n, *new = self.step(torch.from_numpy(x).to(self.device, self.dtype),
                                     torch.tensor(lens, device=self.device),
                                     torch.tensor([s.final for s in states], device=self.device),
                                     *st)
            logp = out.float().cpu().numpy()
            n = n.cpu().tolist()
            new = [t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
                   for t in new]
        outs = [logp[i, :k] for i, k in enumerate(n)]
        return outs, [CtcState(tuple(np.array(np.take(t, i, axis=a))
                                     for t, a in zip(new, self.batch_axis)))
                      for i in range(len(rows))]
