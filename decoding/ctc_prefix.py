"""CTC prefix beam search and attention rescoring (decode.ctc_search rescore): the joint
CTC/attention student's decoding (ESPnet / WeNet "attention rescoring"), without an LM.

    prefix_beam_search(log_probs, beam, blank_penalty) -> [(token ids, CTC log p)]
        the `beam` best label sequences of a CTC output [T, C] (class 0 the blank), each
        with its total log-probability over all alignments (Graves 2012, ch. 7.5; the
        per-frame candidates are the `beam` best classes of the frame)
    rescore(nbest, attention_scores, weight) -> index of the best
        (1 - weight) x CTC + weight x attention log p
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

NEG_INF = float("-inf")


def _lse(a: float, b: float) -> float:
    return float(np.logaddexp(a, b))


def prefix_beam_search(log_probs: np.ndarray, beam: int = 8, blank_penalty: float = 0.0
                       ) -> list[tuple[tuple[int, ...], float]]:
    lp = np.array(log_probs, dtype=np.float64)
    lp[:, 0] -= blank_penalty
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, NEG_INF)}  # (blank, non-blank)
    for frame in lp:
        cand = np.argsort(frame)[-beam:]
        nxt: dict[tuple[int, ...], list[float]] = defaultdict(lambda: [NEG_INF, NEG_INF])
        for prefix, (pb, pnb) in beams.items():
            total = _lse(pb, pnb)
            for c in (int(c) for c in cand):
                p = frame[c]
                if c == 0:  # a blank keeps the prefix
                    nxt[prefix][0] = _lse(nxt[prefix][0], total + p)
                    continue
                new = prefix + (c,)
                if prefix and prefix[-1] == c:
                    # the same token again: a new token only after a blank; else it repeats
                    nxt[new][1] = _lse(nxt[new][1], pb + p)
                    nxt[prefix][1] = _lse(nxt[prefix][1], pnb + p)
                else:
                    nxt[new][1] = _lse(nxt[new][1], total + p)
        ranked = sorted(nxt.items(), key=lambda kv: -_lse(*kv[1]))[:beam]
        beams = {k: (v[0], v[1]) for k, v in ranked}
    out = [(k, _lse(*v)) for k, v in beams.items()]
    return sorted(out, key=lambda kv: -kv[1])


def rescore(nbest: Sequence[tuple[Sequence[int], float]], attention: Sequence[float],
            weight: float) -> int:
    """The n-best entry with the best (1 - weight) x CTC + weight x attention log p."""
    scores = [(1 - weight) * c + weight * a for (_, c), a in zip(nbest, attention)]
    return int(np.argmax(scores)) if scores else -1
