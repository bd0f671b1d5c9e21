"""bench trainers: the bench profile and its precedence (no training here)."""
from types import SimpleNamespace

import pytest

from core.config import ConfigError, load_config
from bench.trainers import BENCH_PROFILE, bench_config


def test_profile_applied_and_set_wins():
    cfg = load_config(None, ["train.lr=0.2"])
    conf, applied = bench_config(cfg, SimpleNamespace(overrides=["train.lr=0.2"]))
    assert conf.get("train.lr") == 0.2  # given with --set: kept
    assert "train.lr" not in applied
    assert conf.get("train.optimizer") == BENCH_PROFILE["train.optimizer"]
    assert conf.model.student.hidden == BENCH_PROFILE["model.student.hidden"]
    assert conf.get("train.gtc_tau_scale") == BENCH_PROFILE["train.gtc_tau_scale"]
    assert cfg.get("train.optimizer") == "adam"  # the step's own config is left alone


def test_profile_config_mode():
    cfg = load_config(None, ["bench.profile=config"])
    conf, applied = bench_config(cfg, SimpleNamespace(overrides=[]))
    assert applied == {}
    assert conf.to_dict() == cfg.to_dict()


def test_bench_keys_are_checked_at_load_time():
    for bad, key in (("bench.profile=mine", "bench.profile"),
                     ("bench.lr_rule=cube", "bench.lr_rule"),
                     ("bench.workers=4,x", "bench.workers[1]")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [bad])
        assert err.value.key == key


def test_method_variants():
    from core.runs import StepError
    from bench.trainers import parse_algo

    assert parse_algo("ma+ng") == ("ma", {"natural_gradient": True})
    assert parse_algo("gtc") == ("gtc", {})
    for bad in ("gtc+ng", "ma+xx", "adam"):
        with pytest.raises(StepError, match="bench.algos"):
            parse_algo(bad)
