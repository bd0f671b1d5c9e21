from __future__ import annotations

import threading
import time

import pytest

from core.prefetch import Prefetch, prefetch


def test_prefetch_keeps_order_and_runs_ahead_on_another_thread():
    seen = []

    def source():
        for i in range(20):
            seen.append(threading.current_thread().name)
            yield i

    assert list(prefetch(source(), depth=3, name="pf-test")) == list(range(20))
    assert set(seen) == {"pf-test"}


def test_prefetch_reraises_the_producers_error_in_order():
    def source():
        yield 1
        yield 2
        raise ValueError("bad item 3")

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for x in prefetch(source(), depth=1):
            got.append(x)
    assert got == [1, 2]


def test_closing_early_stops_the_producer():
    made = []

    def source():
        for i in range(10_000):
            made.append(i)
            yield i

    pf = Prefetch(source, depth=2)
    for x in pf:
        if x == 3:
            break
    time.sleep(0.3)
    assert pf._thread is None and len(made) < 10  # depth-bounded, then stopped
    assert not [t for t in threading.enumerate() if t.name == "amflow-prefetch"]


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        Prefetch(lambda: [], depth=0)
