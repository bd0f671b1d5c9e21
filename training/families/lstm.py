"""The LSTM families: the unidirectional LSTM student and the bidirectional LSTM teacher.

Both map low-frame-rate features [B, T, D] to per-frame class logits [B, T, C], with
optional `lengths` [B] for padded batches (the padding must be zeros), and go with the
hybrid decoder (H o L o G over the classes, scores less the class log-priors).

The student delays its output by `lookahead` frames: logits[t] is produced after the
model has read frames up to t + lookahead (the input is padded with `lookahead` zero
frames at the end, and the first `lookahead` outputs are dropped), so a streaming
deployment sees 3 frames (90 ms at 33 Hz) of future context, as in the paper. Because the
student is causal apart from that look-ahead, zero padding at the end of a sequence does
not change the outputs of the real frames, so it never needs `lengths`.

Paper sizes (config `model.*` in aws.yaml): student 5 x 768 LSTM (~24 M parameters with
192-d input and 3,183 senones), teacher 5 x 768-per-direction BLSTM.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import nn

from core.config import ModelConfig
from training.families.base import ModelFamily, register_family

# oneDNN's LSTM costs ~4 ms per call more than PyTorch's native one at batch 1-8 (its
# weights are re-laid-out per call) and wins from ~16 streams a batch (tools: /stats).
ONEDNN_MIN_BATCH = 16


class _LSTMBody(nn.Module):
    kind = "base"

    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int,
                 bidirectional: bool, dropout: float = 0.0):
        super().__init__()
        if min(input_dim, hidden, layers, num_classes) < 1:
            raise ValueError(f"bad model size: input_dim={input_dim} hidden={hidden} "
                             f"layers={layers} num_classes={num_classes}")
        self.bidirectional = bidirectional
        self.dropout = float(dropout)
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=layers, batch_first=True,
                            bidirectional=bidirectional,
                            dropout=self.dropout if layers > 1 else 0.0)
        self.output = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)
        self.drop = nn.Dropout(self.dropout)
        self._init_forget_bias()

    def _apply(self, fn, recurse=True):
        # nn.LSTM does not re-flatten its weights when moved: on a GPU cuDNN would then
        # copy them into one buffer at every call (PyTorch warns). A no-op on a CPU.
        out = super()._apply(fn, recurse)
        self.lstm.flatten_parameters()
        return out

    @property
    def num_classes(self) -> int:
        return self.output.out_features

    @property
    def input_dim(self) -> int:
        return self.lstm.input_size

    def _init_forget_bias(self) -> None:
        # A forget-gate bias of 1 (split over the two bias vectors) lets gradients flow
        # through time from the first update; gates are ordered i, f, g, o in PyTorch.
        h = self.lstm.hidden_size
        with torch.no_grad():
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_"):
                    p[h:2 * h].fill_(0.5)

    def _run(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        x = self.drop(x)
        if lengths is None:
            y, _ = self.lstm(x)
        elif x.is_cuda and self.packed_on_cuda:
            y = self._run_packed(x, lengths)
        else:
            y = self._run_padded(x, lengths)
        return self.output(self.drop(y))

    # On a GPU cuDNN runs packed sequences natively, with the weights in one flat buffer;
    # the per-layer padded path below is the CPU's (False: bench.gpu's comparison).
    packed_on_cuda = True

    def _run_packed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        y, _ = self.lstm(packed)
        return nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])[0]

    def _run_padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A bidirectional LSTM over a zero-padded batch, exact for every real frame.

        The forward direction is causal, so trailing padding never reaches real frames.
        The backward direction runs forward over each sequence reversed within its own
        length (padding stays at the end), then is reversed back. This gives the same
        outputs as packing, ~1.4-2x faster on CPU, where packed sequences pay a per-step
        regrouping cost.
        """
        lstm = self.lstm
        steps = x.shape[1]
        t = torch.arange(steps, device=x.device)[None, :]
        lens = lengths.to(x.device)[:, None]
        rev = torch.where(t < lens, lens - 1 - t, t)[:, :, None]  # an involution

        def flip(z: torch.Tensor) -> torch.Tensor:
            return z.gather(1, rev.expand(-1, -1, z.shape[2]))

        for layer in range(lstm.num_layers):
            if layer and self.training and lstm.dropout:
                x = nn.functional.dropout(x, lstm.dropout, training=True)
            outs = []
            for suffix in ("", "_reverse") if lstm.bidirectional else ("",):
                inp = flip(x) if suffix else x
                y = _one_layer(lstm, layer, suffix, inp)
                outs.append(flip(y) if suffix else y)
            x = torch.cat(outs, -1) if len(outs) > 1 else outs[0]
        return x


def _one_layer(lstm: nn.LSTM, layer: int, suffix: str, x: torch.Tensor) -> torch.Tensor:
    """Layer `layer` of `lstm`, one direction (`suffix` '' or '_reverse'), over batch-first x."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    params = {f"{n}_l0": getattr(lstm, f"{n}_l{layer}{suffix}") for n in names if lstm.bias or
              n.startswith("weight")}
    template = lstm_layer_template(x.shape[2], lstm.hidden_size, lstm.bias, x.dtype)
    return torch.func.functional_call(template, params, (x,))[0]


@functools.cache
def lstm_layer_template(input_size: int, hidden: int, bias: bool, dtype: torch.dtype) -> nn.LSTM:
    # A weightless one-layer LSTM shell (on the meta device); functional_call supplies the
    # weights. Its dtype must match the input's: nn.LSTM checks them against each other.
    # Built on the meta device, not moved there: initialising real weights would draw
    # from the global RNG the first time a shape is seen in a process, so dropout (which
    # draws from it) would depend on what the process ran before (a resumed or grown
    # training parted from the uninterrupted one at its first padded batch).
    return nn.LSTM(input_size, hidden, 1, bias=bias, batch_first=True, device="meta",
                   dtype=dtype)


class StudentLSTM(_LSTMBody):
    kind = "student"

    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int,
                 lookahead: int = 3, dropout: float = 0.0):
        super().__init__(input_dim, hidden, layers, num_classes, bidirectional=False,
                         dropout=dropout)
        if lookahead < 0:
            raise ValueError("lookahead must be >= 0")
        self.lookahead = lookahead

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        # Causal: right padding never reaches earlier outputs, so `lengths` is not needed
        # (it is accepted for interface parity with the teacher).
        if self.lookahead:
            x = nn.functional.pad(x, (0, 0, 0, self.lookahead))
        y = self._run(x, None)
        return y[:, self.lookahead:, :]


class TeacherBLSTM(_LSTMBody):
    kind = "teacher"

    def __init__(self, input_dim: int, hidden: int, layers: int, num_classes: int,
                 dropout: float = 0.0):
        super().__init__(input_dim, hidden, layers, num_classes, bidirectional=True,
                         dropout=dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if lengths is not None and bool((lengths == x.shape[1]).all()):
            lengths = None  # no padding: skip the packing overhead
        return self._run(x, lengths)


class LstmStream:
    """The recognizer's streaming step of an LSTM student: one LSTM forward over a batch
    of streams, each with its own (h, c) and its own number of new rows (packed, so a
    short stream's state stops at its last row). `dtype`: a torch dtype."""

    def __init__(self, model, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        self.device = device
        self.dtype = dtype
        self.lstm = model.lstm.to(device=device, dtype=self.dtype).eval()
        self.output = model.output.to(device=device, dtype=self.dtype).eval()
        self.lstm.flatten_parameters()  # moved alone: see _LSTMBody._apply
        self.lookahead = int(getattr(model, "lookahead", 0))
        self.input_dim = self.lstm.input_size
        self.state_shape = (self.lstm.num_layers, self.lstm.hidden_size)

    def zero_state(self) -> np.ndarray:
        """A stream's (h, c) as one float32 array [2, layers, hidden]."""
        return np.zeros((2, *self.state_shape), np.float32)

    def forward(self, rows: list[np.ndarray], states: list[np.ndarray]
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Batching and unbatching happen in numpy: a handful of torch calls per forward,
        because each one gives up the GIL and may wait a switch interval to get it back
        while the event loop and the search threads run."""
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        lens = [len(r) for r in rows]
        x = np.zeros((len(rows), max(lens), self.input_dim), np.float32)
        for i, r in enumerate(rows):
            x[i, :lens[i]] = r
        hc = np.stack(states, 2)  # [2, layers, B, hidden]
        torch.backends.mkldnn.enabled = len(rows) >= ONEDNN_MIN_BATCH  # forward thread only
        with torch.inference_mode():
            xt = torch.from_numpy(x).to(self.device, self.dtype)
            hct = torch.from_numpy(hc).to(self.device, self.dtype)
            h, c = hct[0], hct[1]
            if min(lens) == max(lens):
                y, (h, c) = self.lstm(xt, (h, c))
            else:  # packed: each stream's (h, c) is taken at its own last row
                packed = pack_padded_sequence(xt, torch.tensor(lens), batch_first=True,
                                              enforce_sorted=False)
                y, (h, c) = self.lstm(packed, (h, c))
                y, _ = pad_packed_sequence(y, batch_first=True)
            logp = torch.log_softmax(self.output(y).float(), -1).cpu().numpy()
            hc = torch.stack([h, c]).float().cpu().numpy()
        outs = [logp[i, :n] for i, n in enumerate(lens)]
        return outs, [np.ascontiguousarray(hc[:, :, i]) for i in range(len(rows))]


def lstm_parameter_count(input_dim: int, hidden: int, layers: int, num_classes: int,
                         bidirectional: bool = False) -> int:
    """Parameter count of a model of this shape, without building it."""
    dirs = 2 if bidirectional else 1
    total = 0
    for layer in range(layers):
        in_dim = input_dim if layer == 0 else hidden * dirs
        total += dirs * 4 * hidden * (in_dim + hidden + 2)
    return total + hidden * dirs * num_classes + num_classes


def _lstm_spec(model: _LSTMBody) -> dict[str, Any]:
    lstm = model.lstm
    return {"input_dim": lstm.input_size, "hidden": lstm.hidden_size, "layers": lstm.num_layers,
            "num_classes": model.output.out_features,
            "bidirectional": bool(lstm.bidirectional), "dropout": model.dropout}


@register_family("student")
class StudentFamily(ModelFamily):
    """The streaming hybrid student (model.student)."""

    decoder = "hybrid"
    streams = True

    def build(self, input_dim: int, num_classes: int, model_cfg: ModelConfig,
              stack: int = 3) -> nn.Module:
        s = model_cfg.student
        return StudentLSTM(input_dim, s.hidden, s.layers, num_classes, s.lookahead,
                           getattr(s, "dropout", 0.0))

    def spec(self, model):
        return {**_lstm_spec(model), "lookahead": model.lookahead}

    def from_spec(self, spec):
        return StudentLSTM(spec["input_dim"], spec["hidden"], spec["layers"],
                           spec["num_classes"], spec.get("lookahead", 0), spec.get("dropout", 0.0))

    def chunk_right_context(self, model, batches):
        return int(model.lookahead)  # a chunk sees what the streaming model will see

    def stream_model(self, model, dtype, device):
        return LstmStream(model, dtype, device)

    def streaming_signature(self, model):
        lstm = model.lstm
        return (int(model.lookahead), lstm.input_size, (lstm.num_layers, lstm.hidden_size),
                model.output.out_features)

    def export_graphs(self, model, card):
        from training.families.lstm_onnx import streaming_graph, utterance_graph

        return {"model.onnx": utterance_graph(model, card).SerializeToString(),
                "model.streaming.onnx": streaming_graph(model, card).SerializeToString()}


@register_family("teacher")
class TeacherFamily(ModelFamily):
    """The bidirectional hybrid teacher (model.teacher): whole utterances only."""

    decoder = "hybrid"
    regimes = ("labeled", "sequence")  # ssl is the student's regime

    def build(self, input_dim: int, num_classes: int, model_cfg: ModelConfig,
              stack: int = 3) -> nn.Module:
        t = model_cfg.teacher
        return TeacherBLSTM(input_dim, t.hidden, t.layers, num_classes,
                            getattr(t, "dropout", 0.0))

    def spec(self, model):
        return _lstm_spec(model)

    def from_spec(self, spec):
        return TeacherBLSTM(spec["input_dim"], spec["hidden"], spec["layers"],
                            spec["num_classes"], spec.get("dropout", 0.0))
