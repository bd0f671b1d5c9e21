"""bench trainers: the bench profile and its precedence (no training here)."""
from types import SimpleNamespace

import pytest

from amflow.config import load_config
from bench.trainers import BENCH_PROFILE, bench_config


def test_profile_applied_and_set_wins(monkeypatch):
    monkeypatch.delenv("AMFLOW_BENCH_PROFILE", raising=False)
    cfg = load_config(None, ["train.lr=0.2"])
    conf, applied = bench_config(cfg, SimpleNamespace(overrides=["train.lr=0.2"]))
    assert conf["train"]["lr"] == 0.2  # given with --set: kept
    assert "train.lr" not in applied
    assert conf["train"]["optimizer"] == BENCH_PROFILE["train.optimizer"]
    assert conf["model"]["student"]["hidden"] == BENCH_PROFILE["model.student.hidden"]
    assert conf["train"]["gtc_tau_scale"] == BENCH_PROFILE["train.gtc_tau_scale"]


def test_profile_config_mode(monkeypatch):
    monkeypatch.setenv("AMFLOW_BENCH_PROFILE", "config")
    cfg = load_config(None, [])
    conf, applied = bench_config(cfg, SimpleNamespace(overrides=[]))
    assert applied == {}
    assert conf == cfg.to_dict()


def test_method_variants():
    from amflow.runs import StepError
    from bench.trainers import parse_algo

    assert parse_algo("ma+ng") == ("ma", {"natural_gradient": True})
    assert parse_algo("gtc") == ("gtc", {})
    for bad in ("gtc+ng", "ma+xx", "adam"):
        with pytest.raises(StepError, match="AMFLOW_BENCH_ALGOS"):
            parse_algo(bad)
