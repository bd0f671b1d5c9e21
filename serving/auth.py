"""Client authentication of the streaming service (pure, so it is tested without a server).

The token comes from the environment variable that `serve.token_env` names (default
AMFLOW_SERVE_TOKEN), not from a config key: configs are committed YAML, a token is a
secret that a deployment injects (a Kubernetes secret, a systemd EnvironmentFile, the
shell). The driver reads it once and ships only its SHA-256 to the replicas (they may run
on other nodes, without that environment), so no replica holds the token itself.

A client gives it either as an HTTP header on the WebSocket handshake,
`Authorization: Bearer <token>`, or (browsers cannot set headers on a WebSocket) as a
`"token"` field of its first message, the JSON header. A missing or wrong token is
refused with close code 1008 (policy violation) and no detail, so a prober learns
nothing but that a token is needed.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os

from core.config import ServeConfig

POLICY_VIOLATION = 1008
LOOPBACK_NAMES = ("localhost",)


class AuthError(ValueError):
    """A deployment the service refuses to start (the message names the config key)."""


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def token_digest(scfg: ServeConfig, environ: dict | None = None) -> bytes | None:
    """SHA-256 of the token in the environment variable serve.token_env names, None when
    no token is set (serve.token_env empty, or its variable unset or empty)."""
    token = client_token(scfg, environ)
    return digest(token) if token else None


def client_token(scfg: ServeConfig, environ: dict | None = None) -> str | None:
    """The token a client of this config sends (bench serve): the same variable."""
    env = os.environ if environ is None else environ
    # stripped: a token read from a file keeps its newline; a header's value loses it
    token = env.get(scfg.token_env, "").strip() if scfg.token_env else ""
    return token or None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; any other name or address (0.0.0.0 included)
    may be reachable from outside this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(scfg: ServeConfig, has_token: bool) -> None:
    """Refuse to serve a non-loopback serve.host without a token unless
    serve.allow_unauthenticated says so."""
    if has_token or scfg.allow_unauthenticated or is_loopback(scfg.host):
        return
    var = f"${scfg.token_env}" if scfg.token_env else "serve.token_env (empty now)"
    raise AuthError(
        f"serve.host={scfg.host} is not a loopback address and no client token is set: "
        f"set {var} to a secret (clients send it as `Authorization: Bearer <token>`), or "
        "set serve.allow_unauthenticated=true to serve anyone who can reach the port")


def bearer(headers) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None without one."""
    value = headers.get("authorization") if headers is not None else None
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def first_message_token(msg: dict) -> str | None:
    """The "token" field of the first message (an ASGI websocket.receive dict)."""
    try:
        head = json.loads(msg.get("text") or "")
    except ValueError:
        return None
    token = head.get("token") if isinstance(head, dict) else None
    return token if isinstance(token, str) else None


def matches(token: str | None, want: bytes) -> bool:
    """Constant-time comparison of the digests (equal lengths whatever the token)."""
    return token is not None and hmac.compare_digest(digest(token), want)
