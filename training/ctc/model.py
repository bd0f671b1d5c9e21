"""The CTC student: DeepSpeech2's shape, at the size of the embedded corpus.

    stacked LFR rows [B, T, stack*bins]
      -> unstacked to the 10 ms fbank frames [B, 1, stack*T, bins]
      -> 2-D convolutions over (time, frequency), each Conv -> BatchNorm -> clipped ReLU
         (DS2 sec. 3.5; the time strides subsample: (3, 1) gives back the 33 Hz rate)
      -> recurrent layers (GRU by default, DS2 sec. 3.4), each with sequence-wise
         BatchNorm on its input (DS2 eq. 8: statistics over all frames of the minibatch)
      -> unidirectional: a row convolution over `lookahead` future steps (DS2 sec. 3.7,
         the streaming model); bidirectional: none needed
      -> BatchNorm -> linear output over the tokens + blank (class 0)

BatchNorm statistics are taken over the real frames only (padding excluded), and padded
frames are zeroed after every layer, so an utterance gets the same outputs alone or in a
padded batch (the causal layers never see the padding; the convolutions and the row
convolution see zeros where they would see their own zero padding alone). In eval mode
BatchNorm uses its running averages (DS2: "store a running average ... for deployment").

`forward(x, lengths)` -> logits [B, T', C]; `output_lengths(lengths)` -> T' per sequence.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from core.config import CtcConfig
from training.ctc.attention import AttentionDecoder

RNN_TYPES = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}


def _mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    return torch.arange(steps, device=lengths.device)[None, :] < lengths[:, None]


class MaskedBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the real frames of x [B, T, D] (or [B, T, C, F]: per channel C);
    padded frames come out zero."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = torch.zeros_like(x)
        out[mask] = super().forward(x[mask])
        return out


class ConvBlock(nn.Module):
    """Conv2d over [B, C, T, F] -> BatchNorm (no conv bias: BN cancels it) -> clipped ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int], stride: tuple[int, int]):
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride,
                              padding=(kernel[0] // 2, kernel[1] // 2), bias=False)
        self.bn = MaskedBatchNorm(c_out)

    def out_len(self, n: torch.Tensor) -> torch.Tensor:
        k, s = self.kernel[0], self.stride[0]
        return torch.div(n + 2 * (k // 2) - k, s, rounding_mode="floor") + 1

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        lengths = self.out_len(lengths)
        m = _mask(lengths, y.shape[2])
        y = self.bn(y.transpose(1, 2), m).transpose(1, 2)  # [B, T, C, F]: per-channel stats
        return torch.clamp(y, 0.0, 20.0), lengths


class RowConv(nn.Module):
    """DS2's row convolution: r[t] = sum_j W[j] * h[t + j], j = 0..lookahead (per unit)."""

    def __init__(self, dim: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv = nn.Conv1d(dim, dim, lookahead + 1, groups=dim, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = nn.functional.pad(h.transpose(1, 2), (0, self.lookahead))
        return self.conv(x).transpose(1, 2)


class CtcModel(nn.Module):
    kind = "ctc"

    def __init__(self, input_dim: int, num_classes: int, stack: int = 3,
                 channels: Sequence[int] = (32, 32), time_strides: Sequence[int] = (3, 1),
                 freq_strides: Sequence[int] = (2, 2), time_kernels: Sequence[int] = (7, 3),
                 freq_kernel: int = 11, rnn: str = "gru", layers: int = 3, hidden: int = 256,
                 bidirectional: bool = False, lookahead: int = 3, dropout: float = 0.0,
                 attention_weight: float = 0.0, decoder_hidden: int = 128):
        super().__init__()
        if input_dim % stack:
            raise ValueError(f"input_dim {input_dim} is not a multiple of stack {stack}")
        if not (len(channels) == len(time_strides) == len(freq_strides) == len(time_kernels)):
            raise ValueError("channels, time_strides, freq_strides and time_kernels must have "
                             "one entry per convolution")
        if rnn not in RNN_TYPES:
            raise ValueError(f"unknown rnn {rnn!r} ({', '.join(RNN_TYPES)})")
        self.config = {"input_dim": input_dim, "num_classes": num_classes, "stack": stack,
                       "channels": list(channels), "time_strides": list(time_strides),
                       "freq_strides": list(freq_strides), "time_kernels": list(time_kernels),
                       "freq_kernel": freq_kernel, "rnn": rnn, "layers": layers,
                       "hidden": hidden, "bidirectional": bidirectional,
                       "lookahead": lookahead, "dropout": dropout,
                       "attention_weight": attention_weight, "decoder_hidden": decoder_hidden}
        self.stack, self.bins = stack, input_dim // stack
        self.bidirectional, self.lookahead = bidirectional, lookahead
        convs, c_in, f = [], 1, self.bins
        for c, ts, fs, tk in zip(channels, time_strides, freq_strides, time_kernels):
            convs.append(ConvBlock(c_in, c, (tk, freq_kernel), (ts, fs)))
            c_in, f = c, (f + 2 * (freq_kernel // 2) - freq_kernel) // fs + 1
        self.convs = nn.ModuleList(convs)
        dirs = 2 if bidirectional else 1
        self.norms = nn.ModuleList()
        self.rnns = nn.ModuleList()
        dim = c_in * f
        for _ in range(layers):
            self.norms.append(MaskedBatchNorm(dim))
            self.rnns.append(RNN_TYPES[rnn](dim, hidden, batch_first=True,
                                            bidirectional=bidirectional))
            dim = hidden * dirs
        self.row_conv = RowConv(dim, lookahead) if lookahead and not bidirectional else None
        self.out_norm = MaskedBatchNorm(dim)
        self.output = nn.Linear(dim, num_classes)
        self.drop = nn.Dropout(dropout)
        # joint CTC/attention (training/ctc/attention.py): a decoder over the same encoder
        self.attention_weight = float(attention_weight)
        self.decoder = (AttentionDecoder(dim, num_classes, decoder_hidden)
                        if attention_weight > 0 else None)

    @property
    def num_classes(self) -> int:
        return self.output.out_features

    @property
    def input_dim(self) -> int:
        return self.stack * self.bins

    @property
    def subsampling(self) -> int:
        """10 ms frames per output frame."""
        s = 1
        for c in self.convs:
            s *= c.stride[0]
        return s

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        n = lengths * self.stack
        for c in self.convs:
            n = c.out_len(n)
        return n

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.ctc_output(*self.encode(x, lengths))

    def ctc_output(self, h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """CTC logits [B, T', C] of the encoder's outputs."""
        return self.output(self.drop(self.out_norm(h, _mask(n, h.shape[1]))))

    def encode(self, x: torch.Tensor, lengths: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(encoder outputs [B, T', D], their lengths [B]): what the CTC output layer and
        the attention decoder read."""
        b, t, _ = x.shape
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.long, device=x.device)
        lengths = lengths.to(x.device)
        n = lengths * self.stack
        y = (x * _mask(lengths, t)[:, :, None]).reshape(b, 1, t * self.stack, self.bins)
        for conv in self.convs:
            y, n = conv(y, n)
        h = y.transpose(1, 2).flatten(2)  # [B, T', C * F]
        m = _mask(n, h.shape[1])
        for norm, rnn in zip(self.norms, self.rnns):
            h = self._recurrent(rnn, norm(self.drop(h), m), n) * m[:, :, None]
        if self.row_conv is not None:
            h = self.row_conv(h) * m[:, :, None]
        return h, n

    def _recurrent(self, rnn: nn.Module, h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        if not self.bidirectional or bool((n == h.shape[1]).all()):
            return rnn(h)[0]  # causal: trailing padding never reaches a real frame
        packed = nn.utils.rnn.pack_padded_sequence(h, n.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        return nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=True,
                                                total_length=h.shape[1])[0]


def ctc_model_from_config(input_dim: int, num_classes: int, stack: int, cfg: CtcConfig) -> CtcModel:
    """A CtcModel from config.model.ctc."""
    return CtcModel(input_dim, num_classes, stack, channels=cfg.channels,
                    time_strides=cfg.time_strides, freq_strides=cfg.freq_strides,
                    time_kernels=cfg.time_kernels, freq_kernel=cfg.freq_kernel, rnn=cfg.rnn,
                    layers=cfg.layers, hidden=cfg.hidden, bidirectional=cfg.bidirectional,
                    lookahead=cfg.lookahead, dropout=cfg.dropout,
                    attention_weight=cfg.attention_weight, decoder_hidden=cfg.decoder_hidden)
