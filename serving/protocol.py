"""The WebSocket protocol's checks (pure, so they are tested without a server).

Client -> server:
    1. a text message, JSON: {"sample_rate": 16000, "format": "s16le"} (and "token": the
       client token, when the service wants one and the handshake had no Authorization)
    2. binary messages: 16-bit little-endian mono PCM, any size up to serve.max_chunk_bytes
       (an even number of bytes)
    3. optionally a text {"end_utterance": true} between utterances of one speaker (the
       server sends that utterance's final; the speaker's mean normalisation carries on)
    4. a text {"eof": true}: the server sends the last final and closes (1000)
Server -> client (text, JSON):
    {"ready": true, "stream": id, "max_chunk_bytes": n}
    {"partial": "words so far", "stable": "the prefix that no longer changes", "utterance": k}
    {"final": "words", "utterance": k, "reached_final": bool, "frames": rows, ...}
    {"error": "what was wrong", "code": close code}, then the close with that code:
        1003 unsupported data (bad header, rate, format, odd-length PCM, binary first),
        1009 a chunk larger than serve.max_chunk_bytes, 1013 the replica is full (try
        again later), 1001 the client sent nothing for serve.idle_timeout_s, 1008 a
        missing or wrong client token (serving/auth.py; no error message with it).
"""
from __future__ import annotations

import json

import numpy as np

UNSUPPORTED, TOO_BIG, TRY_AGAIN, GOING_AWAY, NORMAL = 1003, 1009, 1013, 1001, 1000
FORMATS = ("s16le", "pcm_s16le")


class ProtocolError(Exception):
    def __init__(self, message: str, code: int = UNSUPPORTED):
        super().__init__(message)
        self.code = code

    def message(self) -> dict:
        return {"error": str(self), "code": self.code}


def parse_header(msg: dict, sample_rate: int) -> dict:
    """The first message (an ASGI websocket.receive dict) -> the declared stream."""
    text = msg.get("text")
    if text is None:
        raise ProtocolError("the first message must be a JSON text header "
                            '{"sample_rate": 16000, "format": "s16le"}, got binary data')
    try:
        head = json.loads(text)
    except ValueError:
        raise ProtocolError("the header is not JSON") from None
    if not isinstance(head, dict):
        raise ProtocolError("the header must be a JSON object")
    if head.get("sample_rate") != sample_rate:
        raise ProtocolError(f"sample_rate {head.get('sample_rate')!r} is not supported: "
                            f"send {sample_rate} Hz audio")
    if head.get("format", "s16le") not in FORMATS:
        raise ProtocolError(f"format {head.get('format')!r} is not supported: send s16le "
                            "(16-bit little-endian mono PCM)")
    channels = head.get("channels", 1)
    # bool is an int to Python; "abc", 1.5, [1] and null are not channel counts: each gets
    # the same JSON error and 1003 as any other bad header (int("abc") raised ValueError in
    # the replica, and the socket closed 1006 with no message).
    if isinstance(channels, bool) or not isinstance(channels, int) or channels != 1:
        raise ProtocolError(f"channels {channels!r} is not supported: only mono audio "
                            "(channels: 1)")
    return head


def pcm_samples(data: bytes, max_bytes: int) -> np.ndarray:
    """A binary message -> float32 samples in [-1, 1]."""
    if len(data) > max_bytes:
        raise ProtocolError(f"chunk of {len(data)} bytes is larger than the limit "
                            f"({max_bytes} bytes)", TOO_BIG)
    if len(data) % 2:
        raise ProtocolError(f"chunk of {len(data)} bytes is not whole 16-bit samples")
    return np.frombuffer(data, "<i2").astype(np.float32) / np.float32(32768.0)


def parse_control(text: str) -> str:
    """A text message after the header -> "eof" | "end_utterance"."""
    try:
        msg = json.loads(text)
    except ValueError:
        raise ProtocolError("a text message must be JSON ({\"eof\": true})") from None
    if isinstance(msg, dict) and msg.get("eof"):
        return "eof"
    if isinstance(msg, dict) and msg.get("end_utterance"):
        return "end_utterance"
    raise ProtocolError(f"unknown control message {text[:100]!r}")
