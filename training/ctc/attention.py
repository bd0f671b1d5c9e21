"""The attention decoder of the joint CTC/attention student (model.ctc.attention_weight > 0).

The ESPnet / WeNet joint recipe (and the Samsung framework's attention model) on the CTC
student's encoder: a one-layer GRU decoder with additive (Bahdanau) attention over the
encoder's outputs predicts the transcript's tokens one by one, then the end (class 0,
the CTC blank, doubles as <sos>/<eos> here: the decoder never predicts a blank). Training
minimises (1 - w) x CTC + w x the decoder's cross-entropy under teacher forcing (w =
model.ctc.attention_weight); decoding rescores the CTC prefix beam search's n-best with
the decoder (decoding/ctc_prefix.py).

    AttentionDecoder.nll(h, h_len, tokens, token_len) -> summed -log p(tokens + <eos>)
    AttentionDecoder.score(h, h_len, hyps) -> [log p(hyp + <eos>)] for one utterance
"""
from __future__ import annotations

import torch
from torch import nn

EOS = 0  # the blank's class id, as <sos> and <eos>


class AttentionDecoder(nn.Module):
    def __init__(self, enc_dim: int, num_classes: int, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(num_classes, hidden)
        self.cell = nn.GRUCell(hidden + enc_dim, hidden)
        self.att_enc = nn.Linear(enc_dim, hidden, bias=False)
        self.att_dec = nn.Linear(hidden, hidden)
        self.att_v = nn.Linear(hidden, 1, bias=False)
        self.output = nn.Linear(hidden + enc_dim, num_classes)
        self.hidden = hidden

    def _logits(self, h: torch.Tensor, h_len: torch.Tensor, inputs: torch.Tensor
                ) -> torch.Tensor:
        """Teacher-forced logits [B, L, C] for input tokens [B, L] (<sos> first)."""
        b, t, _ = h.shape
        keys = self.att_enc(h)
        pad = torch.arange(t, device=h.device)[None, :] >= h_len[:, None]
        s = h.new_zeros(b, self.hidden)
        ctx = h.new_zeros(b, h.shape[2])
        out = []
        for i in range(inputs.shape[1]):
            s = self.cell(torch.cat([self.embed(inputs[:, i]), ctx], -1), s)
            e = self.att_v(torch.tanh(keys + self.att_dec(s)[:, None, :])).squeeze(-1)
            a = torch.softmax(e.masked_fill(pad, float("-inf")), -1)
            ctx = torch.bmm(a[:, None, :], h).squeeze(1)
            out.append(self.output(torch.cat([s, ctx], -1)))
        return torch.stack(out, 1)

    def nll(self, h: torch.Tensor, h_len: torch.Tensor, tokens: torch.Tensor,
            token_len: torch.Tensor) -> torch.Tensor:
        """Summed negative log-likelihood of each transcript followed by <eos>."""
        b, n = tokens.shape
        inputs = torch.cat([tokens.new_full((b, 1), EOS), tokens], 1)  # <sos> + tokens
        target = torch.cat([tokens, tokens.new_zeros(b, 1)], 1)
        target[torch.arange(b), token_len] = EOS  # <eos> after each transcript
        keep = torch.arange(n + 1, device=tokens.device)[None, :] <= token_len[:, None]
        logp = torch.log_softmax(self._logits(h, h_len, inputs).float(), -1)
        picked = logp.gather(-1, target[:, :, None]).squeeze(-1)
        return -(picked * keep).sum()

    @torch.no_grad()
    def score(self, h: torch.Tensor, h_len: int, hyps: list[list[int]]) -> list[float]:
        """log p(hyp + <eos>) of each token sequence given one utterance's encoder
        outputs h [T, D]."""
        hl = torch.tensor([h_len], device=h.device)
        out = []
        for y in hyps:
            tok = torch.tensor([y], dtype=torch.long, device=h.device).reshape(1, len(y))
            out.append(-float(self.nll(h[None], hl, tok, torch.tensor([len(y)], device=h.device))))
        return out
