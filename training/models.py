"""Acoustic models: the unidirectional LSTM student and the bidirectional LSTM teacher.

Both map low-frame-rate features [B, T, D] to per-frame class logits [B, T, C].
The student delays its output by `lookahead` frames: logits[t] is produced after the
model has read frames up to t + lookahead (the input is padded with `lookahead`
zero frames at the end, and the first `lookahead` outputs are dropped), so a streaming
deployment sees 3 frames (90 ms at 33 Hz) of future context, as in the paper.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class _LSTMBody(nn.Module):
    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int,
                 bidirectional: bool):
        super().__init__()
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=layers, batch_first=True,
                            bidirectional=bidirectional)
        self.output = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def _run(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        if lengths is None:
            y, _ = self.lstm(x)
        else:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            y, _ = self.lstm(packed)
            y, _ = pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        return self.output(y)


class StudentLSTM(_LSTMBody):
    kind = "student"

    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int,
                 lookahead: int = 3):
        super().__init__(input_dim, hidden, layers, num_classes, bidirectional=False)
        self.lookahead = lookahead

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if self.lookahead:
            x = nn.functional.pad(x, (0, 0, 0, self.lookahead))
            if lengths is not None:
                lengths = lengths + self.lookahead
        y = self._run(x, lengths)
        return y[:, self.lookahead:, :]


class TeacherBLSTM(_LSTMBody):
    kind = "teacher"

    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int):
        super().__init__(input_dim, hidden, layers, num_classes, bidirectional=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, lengths)


def build_model(kind: str, input_dim: int, num_classes: int, model_cfg: Any) -> nn.Module:
    """`kind` is 'student' or 'teacher'; sizes come from `model_cfg` (config.model)."""
    if kind == "student":
        s = model_cfg.student
        return StudentLSTM(input_dim, s.hidden, s.layers, num_classes, s.lookahead)
    if kind == "teacher":
        t = model_cfg.teacher
        return TeacherBLSTM(input_dim, t.hidden, t.layers, num_classes)
    raise ValueError(f"unknown model kind {kind!r}")


def model_spec(model: nn.Module) -> dict[str, Any]:
    """What is needed to rebuild `model` from a checkpoint."""
    lstm = model.lstm
    spec = {"kind": model.kind, "input_dim": lstm.input_size, "hidden": lstm.hidden_size,
            "layers": lstm.num_layers, "num_classes": model.output.out_features}
    if isinstance(model, StudentLSTM):
        spec["lookahead"] = model.lookahead
    return spec


def model_from_spec(spec: dict[str, Any]) -> nn.Module:
    if spec["kind"] == "student":
        return StudentLSTM(spec["input_dim"], spec["hidden"], spec["layers"],
                           spec["num_classes"], spec.get("lookahead", 0))
    return TeacherBLSTM(spec["input_dim"], spec["hidden"], spec["layers"], spec["num_classes"])


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
