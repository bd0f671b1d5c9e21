"""A refused trigger explained in plain words, every problem at once (API server side).

Airflow refuses a trigger (or a backfill) whose params fail their JSON schema with HTTP
400 (422) and `Invalid input for param <name>: <jsonschema's dump of the failing
schema>`, naming the first bad param only, and of a list param (the override lines) one
bad item only. The UI shows that text in the trigger dialog. This ASGI middleware
(installed by the amflow plugin as a root middleware) leaves every request to Airflow,
its authentication and its checks; only when Airflow answers a trigger (`POST
/api/v2/dags/<dag>/dagRuns`) or a backfill (`POST /api/v2/backfills`, its dry run) with
such a refusal does it replace the text with `amflow.form_checks.param_problems` of the
same conf against the DAG's params: one line per problem, the limit a number must keep
named. Anything it cannot read (another refusal, a compressed body, a DAG it cannot
load) goes out as Airflow wrote it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from amflow.held_response import header, holding_send

TRIGGER_PATH = re.compile(r"^/api/v2/dags/(?P<dag>[^/]+)/dagRuns/?$")
# a backfill (the UI's Backfill dialog) checks its dag_run_conf the same way; its refusal
# is a 422 with the same text, the DAG named in the request body
BACKFILL_PATH = re.compile(r"^/api/v2/backfills(/dry_run)?/?$")
REFUSED = (400, 422)
AIRFLOW_REFUSAL = "Invalid input for param "


def refusal_text(problems: list[str]) -> str:
    head = ("This run was not triggered: " if len(problems) == 1
            else f"This run was not triggered: {len(problems)} problems.\n")
    return head + "\n".join(("" if len(problems) == 1 else "- ") + p for p in problems)


def dag_params(dag_id: str) -> dict[str, dict[str, Any]]:
    """`name: {"schema", "value"}` of the DAG's params, as the API server has them."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = SerializedDagModel.get(dag_id, session=session)
        if model is None:
            return {}
        return {name: {"schema": dict(p.schema), "value": p.value}
                for name, p in model.dag.params.items()}


def explain(dag_id: str, request_body: bytes, detail: str) -> str:
    """The plain text for Airflow's refusal `detail`, or "" to keep Airflow's. `dag_id`:
    from the path (a trigger), or "" (a backfill: the body names it)."""
    from amflow.form_checks import param_problems

    if not detail.startswith(AIRFLOW_REFUSAL):
        return ""
    try:
        body = json.loads(request_body or b"{}")
        dag_id = dag_id or str(body.get("dag_id") or "")
        conf = (body.get("conf") if "conf" in body else body.get("dag_run_conf")) or {}
        problems = param_problems(dag_params(dag_id), conf) if isinstance(conf, dict) else []
    except Exception:  # noqa: BLE001 - any doubt: Airflow's own words go out
        return ""
    return refusal_text(problems) if problems else ""


class PlainTriggerRefusal:
    """ASGI middleware: see the module doc."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        match = TRIGGER_PATH.match(path) or BACKFILL_PATH.match(path)
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        dag_id = match.groupdict().get("dag") or ""
        body = bytearray()

        async def keep_body():
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def answer(start, payload: bytes) -> bytes:
            return await _answer(start, payload, dag_id, bytes(body))

        await self.app(scope, keep_body, holding_send(send, _refused, answer))


def _refused(start) -> bool:
    return start["status"] in REFUSED


async def _answer(start, payload: bytes, dag_id: str, request: bytes) -> bytes:
    """The refusal's body in plain words, or as Airflow wrote it."""
    from starlette.concurrency import run_in_threadpool

    if header(start, b"content-encoding") is not None:
        return payload
    try:
        detail = json.loads(payload).get("detail")
    except (ValueError, AttributeError):
        return payload
    text = await run_in_threadpool(explain, dag_id, request, detail) \
        if isinstance(detail, str) else ""
    return json.dumps({"detail": text}).encode() if text else payload
