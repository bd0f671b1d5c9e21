"""The CTC criterion of a minibatch, in the training loop's `LossOut` terms.

    ctc_batch_loss(model, batch) -> LossOut
        loss     summed CTC negative log-likelihood / target tokens (per token, so the
                 logged loss does not grow with utterance length)
        frames   target tokens (what the loop's accumulators, metrics and the `ma`
                 trainer's sample count weigh by; for this model a "frame" is a token)
        correct  tokens minus the greedy output's edit distance to the target, floored at
                 0 per utterance: the loop's "frame_acc" is token accuracy (1 - TER)

An utterance too short for its targets (CTC needs a frame per token and a blank between
repeats) has no alignment: its loss is zeroed (`zero_infinity`), not a NaN, and the
index already rejects such rows (training/ctc/data.py).
"""
from __future__ import annotations

import torch
from torch import nn

from training.losses import LossOut


def greedy_ids(logits: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best class per frame, repeats collapsed, blanks (0) dropped; per sequence."""
    best = logits.argmax(-1).cpu()
    out = []
    for row, n in zip(best, lengths.cpu().tolist()):
        seq = torch.unique_consecutive(row[:n]).tolist()
        out.append([i for i in seq if i != 0])
    return out


def token_errors(hyps: list[list[int]], refs: list[list[int]]) -> int:
    import kaldialign

    return sum(min(kaldialign.edit_distance(r, h)["total"], len(r)) for h, r in zip(hyps, refs))


def ctc_batch_loss(model: nn.Module, batch) -> LossOut:
    """See the module doc; a joint CTC/attention model (model.decoder) is trained on
    (1 - w) x CTC + w x the decoder's cross-entropy, w = model.attention_weight."""
    h, n = model.encode(batch.x, batch.lengths)
    logits = model.ctc_output(h, n)
    out_len = n.clamp_max(logits.shape[1])
    logp = torch.log_softmax(logits.float(), -1)
    tok, tok_len = batch.tokens, batch.token_lengths
    nll = nn.functional.ctc_loss(logp.transpose(0, 1), tok, out_len, tok_len, blank=0,
                                 reduction="sum", zero_infinity=True)
    if getattr(model, "decoder", None) is not None:
        w = model.attention_weight
        nll = (1 - w) * nll + w * model.decoder.nll(h, out_len, tok, tok_len)
    tokens = int(tok_len.sum())
    refs = [t[:n].tolist() for t, n in zip(tok.cpu(), tok_len.cpu().tolist())]
    with torch.no_grad():
        errors = token_errors(greedy_ids(logp.detach(), out_len), refs)
    return LossOut(nll / max(tokens, 1), tokens, tokens - errors)
