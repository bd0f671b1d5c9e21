"""Client authentication of the streaming service (serving/auth.py, serving/app.py): with a
token set, a WebSocket without it or with a wrong one is closed 1008 with no detail, one
with it (handshake header or the first message) is served; `amflow serve` refuses a
non-loopback bind without a token unless told to. The replica's StreamHandler runs in a
FastAPI app without Ray (starlette's TestClient)."""
# no `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime

import dataclasses
import json

import pytest

from core.config import ServeConfig
from serving import auth
from tests.test_serving import tiny_system  # noqa: F401  (the module fixture)

TOKEN = "s3cret-token"
HEADER = {"sample_rate": 16000, "format": "s16le"}


@pytest.fixture(scope="module")
def client(tiny_system):  # noqa: F811
    from fastapi import FastAPI, Request, WebSocket
    from fastapi.responses import JSONResponse
    from starlette.testclient import TestClient

    from serving.app import StreamHandler, make_recognizer

    scfg = ServeConfig(device="cpu", dtype="fp32", speech_gate=False, idle_timeout_s=10)
    handler = StreamHandler(make_recognizer(tiny_system["assets"], scfg), scfg,
                            auth.digest(TOKEN))
    api = FastAPI()

    @api.websocket("/ws")  # the Replica's routes, without Ray Serve
    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        await handler.handle(ws)

    @api.get("/stats")
    def stats(request: Request) -> JSONResponse:
        if not handler.may_read(request.headers):
            return JSONResponse({}, status_code=401)
        return JSONResponse(handler.stats())

    with TestClient(api) as c:
        yield c, handler


def _refused(c, headers=None, first=None) -> tuple[int, list]:
    """(close code, messages received before it) of a client that sends `first`."""
    from starlette.websockets import WebSocketDisconnect

    got = []
    with c.websocket_connect("/ws", headers=headers or {}) as ws:
        if first is not None:
            ws.send_text(json.dumps(first))
        with pytest.raises(WebSocketDisconnect) as exc:
            while True:
                got.append(ws.receive_json())
    return exc.value.code, got


def _served(c, headers=None, first=None) -> list[dict]:
    with c.websocket_connect("/ws", headers=headers or {}) as ws:
        ws.send_text(json.dumps(first or HEADER))
        msgs = [ws.receive_json()]
        ws.send_bytes(b"\x00\x00" * 1600)
        ws.send_text(json.dumps({"eof": True}))
        while not msgs[-1].get("eof"):
            msgs.append(ws.receive_json())
    return msgs


def test_no_token_or_a_wrong_one_is_closed_1008_with_no_detail(client):
    c, handler = client
    before = handler.unauthorized
    cases = [({}, HEADER), ({"Authorization": "Bearer nope"}, None),
             ({"Authorization": f"Basic {TOKEN}"}, HEADER), ({}, {**HEADER, "token": "nope"}),
             ({}, {**HEADER, "token": TOKEN[:-1]}), ({}, {**HEADER, "token": 1})]
    for headers, first in cases:
        assert _refused(c, headers, first) == (auth.POLICY_VIOLATION, []), (headers, first)
    assert handler.unauthorized - before == len(cases)
    assert c.get("/stats").status_code == 401
    assert c.get("/stats", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_the_right_token_in_the_header_or_the_first_message_is_served(client):
    c, handler = client
    for headers, first in [({"Authorization": f"Bearer {TOKEN}"}, None),
                           ({"authorization": f"bearer  {TOKEN} "}, None),
                           ({}, {**HEADER, "token": TOKEN})]:
        msgs = _served(c, headers, first)
        assert msgs[0]["ready"] is True and msgs[-1]["eof"] is True, msgs
        assert "final" in msgs[-1]
    stats = c.get("/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    assert stats.status_code == 200 and stats.json()["admitted"] >= 3


def test_no_token_set_serves_anyone_on_loopback():
    assert auth.token_digest(ServeConfig(), {}) is None
    assert auth.token_digest(ServeConfig(), {"AMFLOW_SERVE_TOKEN": ""}) is None
    assert auth.token_digest(ServeConfig(token_env=""), {"AMFLOW_SERVE_TOKEN": "x"}) is None
    assert auth.token_digest(ServeConfig(token_env="T"), {"T": "x"}) == auth.digest("x")
    assert auth.client_token(ServeConfig(token_env="T"), {"T": "x\n"}) == "x"  # from a file
    assert auth.token_digest(ServeConfig(token_env="T"), {"T": " \n"}) is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        auth.check_bind(ServeConfig(host=host), has_token=False)


def test_a_public_bind_without_a_token_is_refused_naming_the_keys(monkeypatch):
    from core.config import load_config
    from core.runs import StepError
    from serving.app import client_token, start

    monkeypatch.delenv("AMFLOW_SERVE_TOKEN", raising=False)
    base = load_config(None, [])
    for host in ("0.0.0.0", "::", "10.1.2.3", "example.org"):
        cfg = dataclasses.replace(base, serve=dataclasses.replace(base.serve, host=host))
        with pytest.raises(StepError, match=r"serve\.allow_unauthenticated.*") as exc:
            start(cfg, {})  # refused before Ray or anything starts
        assert "serve.host" in str(exc.value) and "$AMFLOW_SERVE_TOKEN" in str(exc.value)
    ok = load_config(None, ["serve.host=0.0.0.0", "serve.allow_unauthenticated=true"])
    assert client_token(ok.serve) is None
    monkeypatch.setenv("AMFLOW_SERVE_TOKEN", TOKEN)
    assert client_token(load_config(None, ["serve.host=0.0.0.0"]).serve) == auth.digest(TOKEN)
