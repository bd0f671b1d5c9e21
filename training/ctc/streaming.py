"""The CTC student's streaming step: a chunk of rows in, the log-posteriors they complete
out, all state explicit (tensors only: serving batches it, and it can be traced/exported).

    step = CtcStreamingStep(model)            a unidirectional CtcModel, eval mode
    CtcStreamingStep(model, branch_free=True)  the same outputs with no Python branch on
        the inputs' values: one trace serves every input (torch.onnx.export with
        dynamo=False, opset 17, exports it; onnxruntime gives the eager outputs on other
        batch sizes and ragged lengths: tests/test_ctc_serving.py)
    state = step.zero_state(batch)            tuple of tensors, names: step.state_names
    log_probs, out_lengths, *state = step(x, lengths, final, *state)

    x        [B, T, stack*bins] float   the stacked rows (as CtcModel.forward takes them),
                                        rows past a stream's length are padding
    lengths  [B] int64                  new rows per stream (0 allowed)
    final    [B] bool                   these are the utterance's last rows: flush it
    state    rows_seen [B] int64        rows of this utterance consumed so far
             conv<i>   [B, C_in, ctx_i, F_in]  the i-th convolution's left context (its
                                        input positions the next output still reads)
             rnn_h     [layers, B, H]   the recurrent state (rnn_c as well for an LSTM)
             row_buf   [B, lookahead, D]  the row convolution's last `lookahead` inputs
                                        (only when the model has a row convolution)
    log_probs    [B, T_out, C]           log-softmax over tokens + blank; stream b's first
                                        out_lengths[b] rows are valid
    out_lengths  [B] int64

The outputs of a stream, concatenated over its calls (the last with final), equal the
whole-utterance `CtcModel.forward` + log_softmax of the concatenated rows (eval mode),
whatever the chunking (tests/test_ctc_serving.py). Each output frame is emitted as soon
as every input it reads has arrived: frame t (one per row at the default strides) needs
row t + 2 + lookahead (the first convolution reads one frame into the next row, the
second one output ahead, the row convolution `lookahead` outputs ahead): with the default
shape and lookahead 3 that is 5 rows, 150 ms behind the audio (plus the row's own 30 ms).

How the whole-utterance zero padding is reproduced: every convolution keeps `ctx_i` of
its input positions (zeros at the start); its windows start at the context's start, so
a stream's first `spurious_i` outputs lie before the utterance (they read only the
initial zeros and the previous layer's spurious outputs, which are zeroed: exactly the
zero padding the offline convolution reads there). Those before the recurrent layers and
those of the row convolution are dropped (per stream, by a gather), so the recurrent
state never sees them. `final` appends each convolution's right padding (zeros) and the
row convolution's `lookahead` zeros, as the offline forward pads the end. BatchNorm uses
its running averages (eval), as CtcModel does at inference.

Needs: a unidirectional model (a bidirectional layer reads the whole utterance) and time
strides that divide the stacking per layer (stack 3, strides (3, 1): one output per row),
so that every call's rows feed each convolution whole strides.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class NotStreamable(ValueError):
    pass


def _bn(bn: nn.BatchNorm1d, x: torch.Tensor, dim: int) -> torch.Tensor:
    """BatchNorm with its running averages (CtcModel in eval mode), channels on `dim`."""
    shape = [1] * x.dim()
    shape[dim] = -1
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shift = bn.bias - bn.running_mean * scale
    return x * scale.view(shape) + shift.view(shape)


def _take(x: torch.Tensor, start: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """x's positions start[b] .. start[b] + n - 1 along `dim` (1 or 2), per stream b
    (indices past the end are clamped: the caller masks what it does not use). Advanced
    indexing, not torch.gather: gather with an expanded index cost ~4 ms a forward at 40
    streams."""
    idx = (start[:, None] + torch.arange(n, device=x.device)[None, :]).clamp(0, x.shape[dim] - 1)
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    if dim == 1:
        return x[rows, idx]
    return x[rows, :, idx].transpose(1, 2)  # advanced dims first: [B, n, C, ...] -> [B, C, n, ...]


def _steps(n: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] mask: position < n[b]."""
    return torch.arange(size, device=n.device)[None, :] < n[:, None]


class CtcStreamingStep(nn.Module):
    def __init__(self, model, branch_free: bool = False):
        """`branch_free`: no Python branch on the inputs' values (every shift gathered,
        the recurrent layers always packed, no cut to the valid length), so one trace
        (torch.jit.trace, torch.onnx) serves every input; the same outputs, slower."""
        super().__init__()
        self.branch_free = branch_free
        if model.bidirectional:
            raise NotStreamable("a bidirectional CTC model reads the whole utterance: only a "
                                "unidirectional one (model.ctc.bidirectional=false) streams")
        self.model = model.eval()
        self.stack, self.bins = model.stack, model.bins
        self.lookahead = model.row_conv.lookahead if model.row_conv is not None else 0
        self.lstm = isinstance(model.rnns[0], nn.LSTM)
        self.ctx, self.spurious, self.rates = [], [], []
        spurious, per_row = 0, self.stack  # input positions per row of the layer's input
        for i, conv in enumerate(model.convs):
            (k, s), p = (conv.kernel[0], conv.stride[0]), conv.kernel[0] // 2
            if per_row % s:
                raise NotStreamable(f"time stride {s} of convolution {i} does not divide the "
                                    f"{per_row} positions a row gives it (model.ctc.time_strides "
                                    f"against features.stack {self.stack})")
            # the one context size in [k - s, k - 1] whose windows fall on the offline ones
            c = next(c for c in range(k - s, k) if (c + spurious - p) % s == 0)
            if c + spurious < p:
                raise NotStreamable(f"convolution {i} (kernel {k}, stride {s}) cannot stream")
            spurious = (c + spurious - p) // s
            per_row //= s
            self.ctx.append(c)
            self.spurious.append(spurious)
            self.rates.append(per_row)
        self.out_per_row = per_row  # output frames per row
        self.delay = self.spurious[-1]  # output frames dropped before the recurrent layers
        self.state_names = (["rows_seen"] + [f"conv{i}" for i in range(len(self.ctx))]
                            + ["rnn_h"] + (["rnn_c"] if self.lstm else [])
                            + (["row_buf"] if self.lookahead else []))

    @property
    def lookahead_rows(self) -> int:
        """Rows that must follow a row before its output frames are emitted: the
        convolutions' `delay` output frames, then the row convolution's `lookahead`."""
        return -(-(self.delay + self.lookahead) // self.out_per_row)

    def zero_state(self, batch: int, device=None, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
        m = self.model
        out = [torch.zeros(batch, dtype=torch.long, device=device)]
        c_in, f = 1, self.bins
        for conv, c in zip(m.convs, self.ctx):
            out.append(torch.zeros(batch, c_in, c, f, device=device, dtype=dtype))
            c_in = conv.conv.out_channels
            f = (f + 2 * conv.conv.padding[1] - conv.kernel[1]) // conv.stride[1] + 1
        rnn = m.rnns[0]
        out += [torch.zeros(len(m.rnns), batch, rnn.hidden_size, device=device, dtype=dtype)
                for _ in range(2 if self.lstm else 1)]
        if self.lookahead:
            out.append(torch.zeros(batch, self.lookahead, rnn.hidden_size, device=device,
                                   dtype=dtype))
        return tuple(out)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, final: torch.Tensor,
                *state: torch.Tensor):
        n_conv = len(self.ctx)
        rows_seen, convs = state[0], list(state[1:1 + n_conv])
        rnn_state = state[1 + n_conv:3 + n_conv] if self.lstm else state[1 + n_conv:2 + n_conv]
        row_buf = state[-1] if self.lookahead else None
        final = final.to(torch.bool)
        b, t, _ = x.shape
        x = x * _steps(lengths, t)[:, :, None].to(x.dtype)
        y = x.reshape(b, 1, t * self.stack, self.bins)
        n = lengths * self.stack
        new_convs = []
        for i, conv in enumerate(self.model.convs):
            y, n, st = self._conv(i, conv, y, n, final, rows_seen, convs[i])
            new_convs.append(st)
        h = y.transpose(1, 2).flatten(2)  # [B, M, C * F]
        # drop the outputs before the utterance (per stream), so the recurrent layers
        # never see them
        before = rows_seen * self.out_per_row
        off = (self.delay - before).clamp(min=0)
        off = torch.minimum(off, n)
        g = n - off
        if self.branch_free or bool((off > 0).any()):  # only at an utterance's start
            h = _take(h, off, h.shape[1], 1)
        h = h * _steps(g, h.shape[1])[:, :, None].to(h.dtype)
        h, rnn_state = self._recurrent(h, g, rnn_state)
        h_before = (before - self.delay).clamp(min=0)
        if self.lookahead:
            h, g, row_buf = self._row_conv(h, g, final, h_before, row_buf)
        logits = self.model.output(_bn(self.model.out_norm, h, 2))
        out = torch.log_softmax(logits.float(), -1)
        new_state = [rows_seen + lengths, *new_convs, *rnn_state]
        if self.lookahead:
            new_state.append(row_buf)
        return (out, g, *new_state)

    def _conv(self, i: int, conv, y: torch.Tensor, n: torch.Tensor, final: torch.Tensor,
              rows_seen: torch.Tensor, ctx: torch.Tensor):
        """One convolution over [its context, the new positions, right padding if final]:
        (outputs [B, C, M, F] zeroed where invalid or before the utterance, their count
        per stream, the new context)."""
        k, s = conv.kernel[0], conv.stride[0]
        p, c = k // 2, self.ctx[i]
        b, ch, _, f = y.shape
        z = torch.cat([ctx, y, y.new_zeros(b, ch, p, f)], 2)
        total = c + n + p * final.to(n.dtype)
        m = (torch.div(total - k, s, rounding_mode="floor") + 1).clamp(min=0)
        new_ctx = _take(z, m * s, c, 2)
        out = F.conv2d(z, conv.conv.weight, None, stride=conv.stride,
                       padding=(0, conv.conv.padding[1]))
        if not self.branch_free:  # windows over the padding: none valid
            out = out[:, :, :int(m.max()) if len(m) else 0]
        out = torch.clamp(_bn(conv.bn, out, 1), 0.0, 20.0)
        pos = (rows_seen * self.rates[i] - self.spurious[i])[:, None] + \
            torch.arange(out.shape[2], device=out.device)[None, :]
        keep = _steps(m, out.shape[2]) & (pos >= 0)
        return out * keep[:, None, :, None].to(out.dtype), m, new_ctx

    def _recurrent(self, h: torch.Tensor, g: torch.Tensor, state):
        """The recurrent layers over each stream's first g[b] positions, each from its own
        state; a stream with no new position keeps its state."""
        m = self.model
        mask = _steps(g, h.shape[1])[:, :, None].to(h.dtype)
        hs = state[0].unbind(0)
        cs = state[1].unbind(0) if self.lstm else None
        new_h, new_c = [], []
        # unpacked only when every stream fills the padded length (a recurrent layer run
        # over padding would carry it into the state)
        ragged = self.branch_free or h.shape[1] == 0 or bool((g != h.shape[1]).any())
        for j, (norm, rnn) in enumerate(zip(m.norms, m.rnns)):
            h0 = (hs[j][None], cs[j][None]) if self.lstm else hs[j][None]
            inp = _bn(norm, h, 2) * mask
            if not ragged:
                out, hn = rnn(inp, h0)
            else:
                packed = nn.utils.rnn.pack_padded_sequence(
                    inp, g.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
                out, hn = rnn(packed, h0)
                out = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                       total_length=h.shape[1])[0]
                keep = (g > 0)[None, :, None]
                hn = (torch.where(keep, hn[0], h0[0]), torch.where(keep, hn[1], h0[1])) \
                    if self.lstm else torch.where(keep, hn, h0)
            h = out * mask
            new_h.append((hn[0] if self.lstm else hn)[0])
            if self.lstm:
                new_c.append(hn[1][0])
        state = [torch.stack(new_h)] + ([torch.stack(new_c)] if self.lstm else [])
        return h, state

    def _row_conv(self, h: torch.Tensor, g: torch.Tensor, final: torch.Tensor,
                  h_before: torch.Tensor, buf: torch.Tensor):
        """DS2's row convolution over [its last `lookahead` inputs, the new ones, zeros if
        final]: (outputs shifted to start at the stream's first real one, their count,
        the new buffer)."""
        la = self.lookahead
        b, _, d = h.shape
        z = torch.cat([buf, h, h.new_zeros(b, la, d)], 1)
        new_buf = _take(z, g, la, 1)
        r = self.model.row_conv.conv(z.transpose(1, 2)).transpose(1, 2)  # window t: z[t..t+la]
        valid = g + la * final.to(g.dtype)
        off = torch.minimum((la - h_before).clamp(min=0), valid)  # windows before the utterance
        count = valid - off
        if self.branch_free or bool((off > 0).any()):  # only at an utterance's start
            r = _take(r, off, r.shape[1], 1)
        r = r * _steps(count, r.shape[1])[:, :, None].to(r.dtype)
        return r, count, new_buf
