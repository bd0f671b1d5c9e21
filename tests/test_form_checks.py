"""Override validation shared by the CLI and the trigger form: one line naming the key."""
import pytest

from core.config import check_override


@pytest.mark.parametrize("item,message", [
    ("train.foo=1", "unknown key train.foo"),
    ("train.lr=abc", "train.lr: expected a number, got 'abc'"),
    ("train.epochs=1.5", "train.epochs: expected an integer, got 1.5"),
    ("train.lr.x=1", "unknown key train.lr.x"),
    ("nope=1", "unknown key nope"),
])
def test_bad_override_message_names_the_key(item, message):
    assert check_override(item) == message


@pytest.mark.parametrize("item", ["train.lr=0.002", "runner.env.X=1", " select.hours = 2",
                                  "decode.acwt=0.5,0.6", "train.teacher_preset.epochs=3"])
def test_good_overrides_pass(item):
    assert check_override(item) is None


def test_not_a_pair_and_empty_key():
    assert "key=value" in check_override("not-a-pair")
    assert "empty key" in check_override("=1")


def test_airflow_param_refusal_carries_the_message():
    from airflow.sdk import Param
    from airflow.sdk.definitions.param import ParamValidationError

    from amflow.form_checks import OVERRIDE_FORMAT, register

    register()
    p = Param(None, type=["null", "array"], items={"type": "string", "format": OVERRIDE_FORMAT})
    assert p.resolve(["train.lr=0.1"]) == ["train.lr=0.1"]
    with pytest.raises(ParamValidationError, match="unknown key train.foo"):
        p.resolve(["train.lr=0.1", "train.foo=1"])
    with pytest.raises(ParamValidationError, match=r"train.lr: expected a number, got 'abc'"):
        p.resolve(["train.lr=abc"])


# ------------------------------------------------------------------ a refusal in plain words
def _ssl_params() -> dict:
    """ssl_student's trigger params as the API server has them (name: schema, value)."""
    import sys

    from tests.airflow_env import ROOT

    sys.path.insert(0, str(ROOT / "dags"))
    from amflow_common import common_params, local_defaults

    return {k: {"schema": p.schema, "value": p.value}
            for k, p in common_params(local_defaults()).items()}


def test_every_problem_in_plain_words_with_the_limit_named():
    from amflow.form_checks import param_problems

    problems = param_problems(_ssl_params(), {
        "hours": -5, "workers": 0, "epochs": 1000,
        "overrides": ["train.foo=1", "train.lr=0.1", "train.lr=abc", "bad"]})
    assert problems == [
        "Hours of audio (hours): -5 is out of range: it must be more than 0 and less than "
        "10,000,000",
        "Training workers (workers): 0 is out of range: it must be a whole number from 1 to "
        "1,024",
        "Epochs (epochs): 1000 is out of range: it must be a whole number from 1 to 100",
        "Config overrides (overrides), line 1: unknown key train.foo",
        "Config overrides (overrides), line 3: train.lr: expected a number, got 'abc'",
        "Config overrides (overrides), line 4: " + check_override("bad")]
    assert not any("Failed validating" in p or "schema" in p for p in problems)
    assert param_problems(_ssl_params(), {"hours": 0.5, "workers": 1024, "epochs": 1}) == []


def test_wrong_types_and_choices_in_words():
    from amflow.form_checks import param_problems

    problems = param_problems(_ssl_params(), {"workers": 1.5, "algorithm": "adam", "config": ""})
    assert "Config file (config): must not be empty" in problems
    assert "Training workers (workers): expected a whole number, got 1.5" in problems
    assert ("Training algorithm (algorithm): 'adam' is not one of 'sgd', 'gtc', 'bmuf', "
            "'htm', 'ma'") in problems


def test_middleware_rewrites_airflows_refusal_only(monkeypatch):
    """PlainTriggerRefusal around a stand-in for Airflow's trigger route: its 400
    'Invalid input for param' text becomes every problem in words; anything else (another
    path, another refusal, a success) goes out as it was."""
    import asyncio
    import json

    from amflow import trigger_refusal

    monkeypatch.setattr(trigger_refusal, "dag_params", lambda dag_id: _ssl_params())

    def airflow(status: int, detail: str):
        async def app(scope, receive, send):
            body = b""
            while True:  # the route reads the whole request, as FastAPI does
                m = await receive()
                body += m.get("body", b"")
                if not m.get("more_body"):
                    break
            assert json.loads(body)  # the request reached Airflow whole
            payload = json.dumps({"detail": detail}).encode()
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload[:5], "more_body": True})
            await send({"type": "http.response.body", "body": payload[5:]})
        return app

    def call(app, path="/api/v2/dags/ssl_student/dagRuns"):
        conf = {"workers": 0, "overrides": ["a.b=1", "train.x=2"]}
        request = json.dumps({"conf": conf} if "dags/" in path else
                             {"dag_id": "ssl_student", "dag_run_conf": conf})
        parts = [{"type": "http.request", "body": request[:7].encode(), "more_body": True},
                 {"type": "http.request", "body": request[7:].encode()}]
        sent = []

        async def receive():
            return parts.pop(0)

        async def send(m):
            sent.append(m)
        scope = {"type": "http", "method": "POST", "path": path}
        asyncio.run(trigger_refusal.PlainTriggerRefusal(app)(scope, receive, send))
        body = b"".join(m.get("body", b"") for m in sent[1:])
        length = dict(sent[0]["headers"])[b"content-length"]
        assert int(length) == len(body)
        return sent[0]["status"], json.loads(body)["detail"]

    raw = "Invalid input for param workers: 0 is less than or equal to the minimum of 0\n\n" \
          "Failed validating 'exclusiveMinimum' in schema: {...}"
    status, detail = call(airflow(400, raw))
    assert status == 400 and detail == (
        "This run was not triggered: 3 problems.\n"
        "- Training workers (workers): 0 is out of range: it must be a whole number from 1 "
        "to 1,024\n"
        "- Config overrides (overrides), line 1: unknown key a\n"
        "- Config overrides (overrides), line 2: unknown key train.x")
    assert call(airflow(400, "Dag has import errors")) == (400, "Dag has import errors")
    # a backfill's refusal (422, the DAG in the body), from the UI's Backfill dialog too
    assert call(airflow(422, raw), "/api/v2/backfills") == (422, detail)
    assert call(airflow(422, raw), "/api/v2/backfills/dry_run") == (422, detail)
    assert call(airflow(200, "ok")) == (200, "ok")
    assert call(airflow(400, raw), "/api/v2/dags/ssl_student/dagRuns/x/clear")[1] == raw


def test_refusal_in_view_adds_its_script_to_the_ui_pages_only():
    """RefusalInView around a stand-in for Airflow's API server: the UI's HTML (which
    Airflow would gzip) goes out uncompressed with the script before </head> and the right
    length; an API answer, a static file and a POST go out as they were."""
    import asyncio

    from amflow.refusal_in_view import RefusalInView, TAG

    page = b"<html><head><title>Airflow</title></head><body>" + b"x" * 2000 + b"</body></html>"

    async def airflow(scope, receive, send):
        gzip = any(k == b"accept-encoding" for k, _ in scope["headers"])
        html = not scope["path"].startswith(("/api/", "/static/"))
        body = page if html else b'{"ok": true}'
        headers = [(b"content-type", b"text/html; charset=utf-8" if html else b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if gzip:  # a stand-in for the compression: marked, left readable
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})

    def get(path, method="GET"):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(m):
            sent.append(m)
        scope = {"type": "http", "method": method, "path": path,
                 "headers": [(b"accept-encoding", b"gzip, deflate")]}
        asyncio.run(RefusalInView(airflow)(scope, receive, send))
        headers = dict(sent[0]["headers"])
        body = b"".join(m.get("body", b"") for m in sent[1:])
        assert int(headers[b"content-length"]) == len(body)
        return headers, body

    headers, body = get("/dags/ssl_student")
    assert b"content-encoding" not in headers
    assert body == page.replace(b"</head>", TAG + b"</head>")
    assert b"This run was not triggered" in TAG  # the script looks for trigger_refusal's text
    for path, method in (("/api/v2/dags", "GET"), ("/static/assets/x.js", "GET"),
                         ("/dags/ssl_student", "POST")):
        headers, body = get(path, method)
        assert TAG not in body and headers[b"content-encoding"] == b"gzip"
