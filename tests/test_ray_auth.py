"""core.raycluster.init_ray starts a local Ray with token auth said explicitly, so Ray
2.60 does not log its token-auth WARNING into every step's log; a mode the user set wins."""
from __future__ import annotations

import logging

import pytest

from core.config import load_config


@pytest.fixture
def fake_init(monkeypatch):
    """ray.init recorded, not run (a real start costs ~20 s here); Ray's config re-read
    from the restored environment afterwards."""
    import ray
    from ray._raylet import Config

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    yield seen
    monkeypatch.undo()
    Config.initialize("")


def test_local_ray_says_token_auth_and_ray_does_not_warn(fake_init, caplog):
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default)
    from ray._raylet import AuthenticationMode, get_authentication_mode

    from core.raycluster import init_ray

    init_ray(load_config(None, ["ray.num_cpus=1"]))
    assert len(fake_init) == 1
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert get_authentication_mode() == AuthenticationMode.TOKEN  # Ray's config knows it
    with caplog.at_level(logging.WARNING):
        assert enable_token_auth_by_default() is True  # what ray.init calls for a new cluster
    assert not [r for r in caplog.records if "Token authentication" in r.getMessage()]


def test_a_mode_the_user_set_wins(fake_init, monkeypatch):
    import os

    from core.raycluster import init_ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    init_ray(load_config(None, ["ray.num_cpus=1"]))
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
