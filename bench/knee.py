"""The knee of the load curve: the largest number of concurrent real-time streams a
deployment serves at p98 latency <= a bound (NVIDIA Riva's "max streams at a latency
bound"; DeepSpeech2 §7.1: 10 streams at p98 70 ms on one GPU), found by bisection.

Pure: `measure(n, repeat)` runs one level (n streams, the repeat-th run) and returns its
row (`bench serve`'s: `p98_ms`, `failed_streams`); tests pass a fake one.

A level is run `repeats` times and passes when the MEDIAN of its runs' p98 is within the
bound. The median, not the mean or the worst: on a shared machine one run in three can
meet a neighbour's burst; the worst would make the knee that burst's, the mean would let
one wild run (a p98 of seconds) fail a level the other runs hold; the median of 3 is the
level's typical p98 and ignores one outlier either way. A run with failed streams counts
as over the bound (its p98 is over the streams that survived).

The search: bracket by doubling from `start` (a passing level doubles, up to `limit`, the
most streams the deployment admits), then bisect between the last passing and the first
failing level down to one stream. It assumes p98 grows with the load (a monotone curve);
each measured level is reported, so a non-monotone one shows.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

Measure = Callable[[int, int], dict]


def run_p98(row: dict) -> float:
    """One run's p98 for the pass test: inf when streams failed or nothing was measured."""
    if row.get("failed_streams") or row.get("p98_ms") is None:
        return math.inf
    return float(row["p98_ms"])


def run_level(measure: Measure, n: int, repeats: int, bound_ms: float) -> dict:
    """n streams, `repeats` runs: the runs' p98, their median, whether the level passes,
    and `row`: the run whose p98 is the median (the level's representative row)."""
    rows = [measure(n, r) for r in range(repeats)]
    p98 = [run_p98(r) for r in rows]
    median = statistics.median(p98)
    middle = sorted(range(repeats), key=lambda i: p98[i])[(repeats - 1) // 2]
    return {"streams": n, "p98_ms": [_num(x) for x in p98], "median_p98_ms": _num(median),
            "passed": median <= bound_ms, "row": rows[middle]}


def _num(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 1)


def search(measure: Measure, bound_ms: float = 70.0, repeats: int = 3, start: int = 10,
           limit: int = 100) -> dict:
    """The knee: {knee, capped (the limit passed: the knee is at least it), bound_ms,
    repeats, statistic, limit, levels (each measured level by stream count: its runs'
    p98, their median, passed), knee_per_repeat, rows (each level's median run's row)}."""
    if repeats < 1 or limit < 1 or start < 1:
        raise ValueError(f"knee search: repeats ({repeats}), start ({start}) and limit "
                         f"({limit}) must be >= 1")
    levels: dict[int, dict] = {}

    def passes(n: int) -> bool:
        if n not in levels:
            levels[n] = run_level(measure, n, repeats, bound_ms)
        return levels[n]["passed"]

    lo, hi, n = 0, None, min(start, limit)
    while hi is None:  # bracket: double while it passes
        if not passes(n):
            hi = n
        elif n >= limit:
            break
        else:
            lo, n = n, min(2 * n, limit)
    if hi is None:
        lo = n
    while hi is not None and hi - lo > 1:  # bisect: lo passes, hi fails
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    ordered = [{k: v for k, v in levels[n].items() if k != "row"} for n in sorted(levels)]
    return {"knee": lo, "capped": hi is None, "bound_ms": bound_ms, "repeats": repeats,
            "statistic": "median over the repeats of each run's p98 (a run with failed "
                         "streams counts as over the bound)",
            "limit": limit, "levels": ordered,
            "knee_per_repeat": per_repeat_knees(ordered, repeats, bound_ms),
            "rows": [levels[n]["row"] for n in sorted(levels)]}


def per_repeat_knees(levels: list[dict], repeats: int, bound_ms: float) -> list[int]:
    """The knee each repeat alone shows on the measured levels: the largest level up to
    which that repeat's run passed at every measured level (the spread of the knee)."""
    out = []
    for r in range(repeats):
        knee = 0
        for lv in sorted(levels, key=lambda lv: lv["streams"]):
            p98 = lv["p98_ms"][r]
            if p98 is None or p98 > bound_ms:
                break
            knee = lv["streams"]
        out.append(knee)
    return out


def knee_ratio(base: dict, other: dict) -> dict:
    """other's knee / base's (> 1 where the other serves more streams), and its spread:
    min..max of the per-repeat knees' ratios (repeat r of one against repeat r of the
    other, and every pairing, so the spread does not depend on run order). A pairing whose
    base run held no level has no ratio: `undefined` counts those."""
    def ratio(a: int, b: int) -> float | None:
        return round(a / b, 3) if b else None

    pairs = [ratio(o, b) for o in other["knee_per_repeat"] for b in base["knee_per_repeat"]]
    known = [p for p in pairs if p is not None]
    return {"ratio": ratio(other["knee"], base["knee"]),
            "min": min(known) if known else None, "max": max(known) if known else None,
            "undefined": len(pairs) - len(known), "knees": [base["knee"], other["knee"]],
            "capped": base["capped"] or other["capped"]}
