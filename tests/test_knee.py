"""`amflow bench serve --knee` (bench/knee.py): the search finds the largest stream count
whose median p98 over the repeats is within the bound, with fake measurements (instant,
deterministic): exactly, for every knee, in few levels; one wild run per level does not
move it; failed streams fail a level; the limit caps it; the ratio's spread."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from bench import knee as K


def curve(knee: int, spikes: dict[int, float] | None = None, failed_over: int | None = None):
    """A deployment whose p98 is 30 ms up to `knee` streams and grows past it; repeat r's
    run is `spikes[r]` ms instead when given (a neighbour's burst); runs over
    `failed_over` streams lose a stream. Records each (n, repeat) measured."""
    calls = []

    def measure(n: int, r: int) -> dict:
        calls.append((n, r))
        p98 = 30.0 + (0 if n <= knee else 50 + 5 * (n - knee))
        if spikes and r in spikes:
            p98 = spikes[r]
        failed = int(failed_over is not None and n > failed_over)
        return {"streams": n, "p98_ms": p98, "failed_streams": failed, "run": r}

    return measure, calls


@pytest.mark.parametrize("start", [1, 10, 37])
def test_the_search_finds_every_knee_exactly_in_few_levels(start):
    for true in range(0, 101):
        measure, calls = curve(true)
        out = K.search(measure, bound_ms=70, repeats=3, start=start, limit=100)
        assert out["knee"] == true, (start, true, out["levels"])
        assert out["capped"] == (true >= 100)
        levels = [lv["streams"] for lv in out["levels"]]
        assert len(levels) == len(set(levels)) <= 2 * math.ceil(math.log2(100)) + 1
        assert sorted(calls) == sorted((n, r) for n in levels for r in range(3))
        assert out["knee_per_repeat"] == [true] * 3 or true >= 100 or true == 0
        assert [r["streams"] for r in out["rows"]] == levels


def test_a_level_passes_on_the_median_run_so_one_wild_run_does_not_move_the_knee():
    measure, _ = curve(57, spikes={1: 5000.0})
    out = K.search(measure, bound_ms=70, repeats=3, start=10, limit=100)
    assert out["knee"] == 57
    assert out["knee_per_repeat"] == [57, 0, 57]
    lv = next(lv for lv in out["levels"] if lv["streams"] == 57)
    assert lv["p98_ms"] == [30.0, 5000.0, 30.0] and lv["median_p98_ms"] == 30.0 and lv["passed"]
    assert next(r for r in out["rows"] if r["streams"] == 57)["run"] != 1  # the median run's
    # two wild runs of three: the median is wild, every level fails
    measure, _ = curve(57, spikes={0: 900.0, 2: 900.0})
    assert K.search(measure, 70, 3, 10, 100)["knee"] == 0


def test_failed_streams_fail_a_level_whatever_its_p98():
    measure, _ = curve(80, failed_over=45)
    assert K.search(measure, 70, 3, 10, 100)["knee"] == 45
    row = {"p98_ms": 10.0, "failed_streams": 2}
    assert K.run_p98(row) == math.inf and K.run_p98({"p98_ms": None}) == math.inf


def test_the_limit_caps_the_search_and_says_so():
    measure, calls = curve(10_000)
    out = K.search(measure, 70, 2, 10, 100)
    assert out["knee"] == 100 and out["capped"] and max(n for n, _ in calls) == 100
    out = K.search(curve(10_000)[0], 70, 1, 500, 100)  # a start past the limit
    assert out["knee"] == 100 and [lv["streams"] for lv in out["levels"]] == [100]
    with pytest.raises(ValueError, match="repeats"):
        K.search(measure, 70, 0, 10, 100)


def test_the_ratio_between_deployments_and_its_spread():
    base = K.search(curve(40, spikes={2: 5000.0})[0], 70, 3, 10, 100)
    other = K.search(curve(60)[0], 70, 3, 10, 100)
    r = K.knee_ratio(base, other)
    assert r["ratio"] == 1.5 and r["knees"] == [40, 60] and not r["capped"]
    # repeat 2 of the base held no level: its pairings have no ratio; the others 60/40
    assert r["min"] == 1.5 and r["max"] == 1.5 and r["undefined"] == 3
    noisy = K.search(curve(30, spikes={0: 50.0})[0], 70, 3, 10, 100)  # run 0 holds 100
    r = K.knee_ratio(noisy, other)
    assert noisy["knee_per_repeat"] == [40, 30, 30]  # 40: the most run 0 was tried at
    assert r["ratio"] == 2.0 and r["min"] == 1.5 and r["max"] == 2.0 and r["undefined"] == 0


def test_bench_serve_knee_starts_at_the_first_streams_level_and_stops_at_what_is_admitted():
    from bench.serve import search_knee
    from core.config import ServeConfig
    from core.runs import StepError

    measure, calls = curve(10_000)
    args = SimpleNamespace(knee=True, bound_ms=None, repeats=2, streams="6,99")
    out = search_knee(ServeConfig(max_streams=20, replicas=2), args, measure)
    assert calls[0] == (6, 0) and out["knee"] == 40 and out["capped"] and out["repeats"] == 2
    assert out["bound_ms"] == 70.0
    with pytest.raises(StepError, match="--repeats"):
        search_knee(ServeConfig(), SimpleNamespace(repeats=0, bound_ms=None, streams=None),
                    measure)
