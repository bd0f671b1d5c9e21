"""A refused trigger's reason, seen (API server side, beside amflow.trigger_refusal).

Airflow's trigger and Backfill dialogs show a refusal in a red box at their top; the
dialog is taller than the window, so a user at its Trigger button sees only a toast with
the HTTP status ("Bad Request"). This ASGI middleware (a root middleware of the amflow
plugin) adds one small script, `static/refusal_in_view.js`, to the pages of Airflow's UI
(the single-page app's HTML, nothing else): when a refusal appears in an open dialog it
scrolls the box into view and puts the reason's first line in the toast. Airflow's own
scripts are untouched; if the dialog changes shape in another Airflow, the script finds
no refusal and does nothing.
"""
from __future__ import annotations

from pathlib import Path

from amflow.held_response import header, holding_send

SCRIPT = (Path(__file__).parent / "static" / "refusal_in_view.js").read_text()
TAG = b"<script>" + SCRIPT.encode() + b"</script>"
# the UI's HTML is served for every path the single-page app routes; not these
NOT_PAGES = ("/api/", "/execution/", "/static/", "/amflow/", "/auth/", "/mcp")


def with_script(html: bytes) -> bytes:
    """`html` with the script before its `</head>` (unchanged without one)."""
    head = html.rfind(b"</head>")
    return html if head < 0 else html[:head] + TAG + html[head:]


def is_page_request(scope) -> bool:
    path = scope.get("path", "")
    return (scope["type"] == "http" and scope.get("method") == "GET"
            and not path.startswith(NOT_PAGES))


class RefusalInView:
    """ASGI middleware: see the module doc."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if not is_page_request(scope):
            await self.app(scope, receive, send)
            return
        # uncompressed, so that the page can be read (a page is small; Airflow gzips it)
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", [])
                                      if k.lower() != b"accept-encoding"]}
        await self.app(scope, receive, holding_send(send, _readable_page, _with_script))


def _readable_page(start) -> bool:
    """An HTML page Airflow sent uncompressed."""
    return (header(start, b"content-type") or b"").startswith(b"text/html") \
        and header(start, b"content-encoding") is None


async def _with_script(start, html: bytes) -> bytes:
    return with_script(html)
