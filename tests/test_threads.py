"""train.threads: 0 takes the CPUs Ray gives the worker; more than given is a WARNING."""
from __future__ import annotations

import os

from training import threads as T


def test_threads_from_the_cpus_given(monkeypatch, caplog):
    monkeypatch.setattr(T, "cpus_given", lambda: (1, "CPUs free in Ray"))
    assert T.torch_threads(0) == (1, "train.threads=0: 1 (CPUs free in Ray)")
    with caplog.at_level("WARNING", logger="training.threads"):
        assert T.torch_threads(1)[0] == 1
        assert not caplog.records
        assert T.torch_threads(2)[0] == 2  # kept (part of the result), but said
    assert "train.threads=2 exceeds the 1 CPU(s)" in caplog.text and "train.threads=0" \
        in caplog.text


def test_cpus_given_without_ray_is_the_affinity():
    n, why = T.cpus_given()
    assert 1 <= n <= len(os.sched_getaffinity(0)) and why
