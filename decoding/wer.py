"""Word error rate: substitutions, deletions, insertions; per condition and overall.

    score(ref, hyp) -> WordScore     one utterance (kaldialign's edit distance)
    aggregate(scores) -> dict        wer, ser, sub/del/ins rates, per_condition{,_ser},
                                     counts; WER = (S + D + I) / reference words
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass
class WordScore:
    condition: str
    ref_words: int
    sub: int
    dels: int
    ins: int

    @property
    def errors(self) -> int:
        return self.sub + self.dels + self.ins


def score(ref: Sequence[str], hyp: Sequence[str], condition: str = "all") -> WordScore:
    import kaldialign

    r = kaldialign.edit_distance(list(ref), list(hyp))
    return WordScore(condition, len(ref), int(r["sub"]), int(r["del"]), int(r["ins"]))


def _rates(xs: list[WordScore]) -> dict[str, float]:
    n = sum(s.ref_words for s in xs)
    return {"wer": sum(s.errors for s in xs) / n if n else 0.0,
            "ser": sum(1 for s in xs if s.errors) / len(xs) if xs else 0.0,
            "sub": sum(s.sub for s in xs) / n if n else 0.0,
            "del": sum(s.dels for s in xs) / n if n else 0.0,
            "ins": sum(s.ins for s in xs) / n if n else 0.0,
            "ref_words": n, "utterances": len(xs)}


def aggregate(scores: Iterable[WordScore]) -> dict:
    scores = list(scores)
    by: dict[str, list[WordScore]] = defaultdict(list)
    for s in scores:
        by[s.condition].append(s)
    overall = _rates(scores)
    conds = {c: _rates(by[c]) for c in sorted(by)}
    return {**overall,
            "per_condition": {c: r["wer"] for c, r in conds.items()},
            "per_condition_ser": {c: r["ser"] for c, r in conds.items()},
            "per_condition_detail": conds}


def relative_reduction(base: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """(base - new) / base per key: the WERR of `new` over `base`."""
    return {k: (base[k] - new[k]) / base[k] if base[k] > 0 else 0.0
            for k in sorted(set(base) & set(new))}
