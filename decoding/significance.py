"""WER confidence intervals and matched-pairs significance tests on per-utterance errors.

    bootstrap_ci(errors, ref_words, groups=None) -> (lo, hi)   95 % CI of WER, resampling
                         utterances (or whole groups, e.g. speakers, so correlated utterances
                         move together)
    mapsswe(err_a, err_b) -> dict      NIST's matched-pairs sentence-segment word error test
                         (normal approximation on per-segment error differences), two-sided p
    paired_bootstrap(err_a, err_b, ref_words) -> dict   Bisani & Ney paired bootstrap p
    compare_rows(rows_a, rows_b) -> dict   both tests on hyps.jsonl rows matched by utt_id;
                         `significant` is False where p >= alpha

Pure numpy; a fixed seed makes every number reproducible.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

ALPHA = 0.05


def _wer(errors: np.ndarray, words: np.ndarray) -> float:
    n = float(words.sum())
    return float(errors.sum()) / n if n else 0.0


def bootstrap_ci(errors: Sequence[int], ref_words: Sequence[int], groups: Sequence | None = None,
                 n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the corpus WER sum(errors)/sum(ref_words)."""
    e = np.asarray(errors, dtype=float)
    w = np.asarray(ref_words, dtype=float)
    if len(e) != len(w):
        raise ValueError(f"errors ({len(e)}) and ref_words ({len(w)}) differ in length")
    if len(e) == 0:
        return (0.0, 0.0)
    if groups is not None:
        # sum per group first: a speaker's utterances are resampled as one unit
        keys, inv = np.unique(np.asarray(groups, dtype=str), return_inverse=True)
        e = np.bincount(inv, weights=e, minlength=len(keys))
        w = np.bincount(inv, weights=w, minlength=len(keys))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(e), size=(n_boot, len(e)))
    tot_w = w[idx].sum(axis=1)
    wers = np.divide(e[idx].sum(axis=1), tot_w, out=np.zeros(n_boot), where=tot_w > 0)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(wers, [tail, 1.0 - tail])
    return (float(lo), float(hi))


def mapsswe(err_a: Sequence[int], err_b: Sequence[int]) -> dict:
    """NIST MAPSSWE: z = mean(d) / (sd(d) / sqrt(n)) over per-segment differences d = a - b."""
    d = np.asarray(err_a, dtype=float) - np.asarray(err_b, dtype=float)
    n = len(d)
    if n != len(err_b):
        raise ValueError("err_a and err_b must be paired (same length)")
    if n < 2:
        return {"z": 0.0, "p": 1.0, "n": n}
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return {"z": 0.0 if mean == 0 else math.copysign(math.inf, mean),
                "p": 1.0 if mean == 0 else 0.0, "n": n}
    z = mean / (sd / math.sqrt(n))
    return {"z": z, "p": math.erfc(abs(z) / math.sqrt(2.0)), "n": n}


def paired_bootstrap(err_a: Sequence[int], err_b: Sequence[int], ref_words: Sequence[int],
                     n_boot: int = 1000, seed: int = 0) -> dict:
    """Two-sided p: how often the resampled WER difference falls on the other side of zero."""
    a = np.asarray(err_a, dtype=float)
    b = np.asarray(err_b, dtype=float)
    w = np.asarray(ref_words, dtype=float)
    if not (len(a) == len(b) == len(w)):
        raise ValueError("err_a, err_b and ref_words must be paired (same length)")
    if len(a) == 0:
        return {"p": 1.0, "prob_b_better": 0.0}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    diff = (a[idx].sum(axis=1) - b[idx].sum(axis=1))
    better, worse = float((diff > 0).mean()), float((diff < 0).mean())
    p = min(1.0, 2.0 * min(1.0 - better, 1.0 - worse))
    return {"p": p, "prob_b_better": better}


def compare_rows(rows_a: Sequence[dict], rows_b: Sequence[dict], alpha: float = ALPHA,
                 seed: int = 0) -> dict:
    """A (baseline) vs B (new) on the utterances both decoded, matched by utt_id."""
    by_b = {r["utt_id"]: r for r in rows_b}
    pairs = [(r, by_b[r["utt_id"]]) for r in rows_a if r["utt_id"] in by_b]
    ea = np.array([int(a["errors"]) for a, _ in pairs], dtype=float)
    eb = np.array([int(b["errors"]) for _, b in pairs], dtype=float)
    w = np.array([int(a["ref_words"]) for a, _ in pairs], dtype=float)
    m = mapsswe(ea, eb)
    pb = paired_bootstrap(ea, eb, w, seed=seed)
    wa, wb = _wer(ea, w), _wer(eb, w)
    p = m["p"]
    return {"utterances": len(pairs), "ref_words": int(w.sum()), "wer_a": wa, "wer_b": wb,
            "delta": wb - wa, "werr": (wa - wb) / wa if wa > 0 else 0.0,
            "p_mapsswe": p, "z_mapsswe": m["z"], "p_bootstrap": pb["p"],
            "significant": bool(p < alpha), "alpha": alpha,
            "only_a": len(rows_a) - len(pairs), "only_b": len(rows_b) - len(pairs)}
