"""An ASGI response held back whole, then sent rewritten: the shell of the amflow plugin's
two root middlewares (amflow.trigger_refusal rewrites a refused trigger's text,
amflow.refusal_in_view adds a script to the UI's pages)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

Message = dict[str, Any]
Rewrite = Callable[[Message, bytes], Awaitable[bytes]]


def holding_send(send: Callable[[Message], Awaitable[None]],
                 hold: Callable[[Message], bool], rewrite: Rewrite
                 ) -> Callable[[Message], Awaitable[None]]:
    """A `send` for the wrapped app: every message goes on to `send`, except a response
    whose start message `hold` picks. That one is kept until its body is complete, then
    sent whole with the body `rewrite(start, body)` gives, and that body's length."""
    held: dict[str, Message] = {}
    chunks: list[bytes] = []

    async def send_or_hold(message: Message) -> None:
        if message["type"] == "http.response.start" and hold(message):
            held["start"] = message  # decided once the body is complete
            return
        if "start" not in held:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            start = held["start"]
            body = await rewrite(start, b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", [])
                       if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

    return send_or_hold


def header(message: Message, name: bytes) -> bytes | None:
    """A response start's header, by its lower-case name."""
    return next((v for k, v in message.get("headers", []) if k.lower() == name), None)
