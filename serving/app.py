"""`amflow serve`: the streaming recognizer as a Ray Serve application.

    amflow serve --model M [--config C] [--run-id R]

Reads   --model  model.pt (a student: CMVN, phones, features config and priors inside;
        or a unidirectional CTC student: CMVN, features config and tokenizer inside);
        the decoding graph of its run (runs/<R>/graph/<key>/, built with the decode step's
        lexicon and LM when missing: H o L o G, or a CTC model's T o L o G) and the scales
        that `amflow decode` tuned for it (runs/<R>/decode[-<tag>]/result.json: the acwt,
        and a CTC model's LM weight and blank penalty), unless serve.acwt is set.
Serves  http://<serve.host>:<serve.port>/    the page (microphone or a dropped WAV)
        ws://.../ws                          the streaming API (serving/protocol.py)
        GET /stats                           this replica's streams and batch-size histogram

The Ray Serve shell is thin: `Replica` (one per serve.replicas, each with serve.num_cpus /
num_gpus / resources) holds a serving.recognizer.Recognizer and one BatchDispatcher
(serving/dispatch.py), and runs each WebSocket as a Session.
"""
# No `from __future__ import annotations` here: FastAPI reads the route signatures
# (ws: WebSocket) at runtime, and the Serve classes are defined inside build_app.

import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from core.config import Config, DecodeConfig, ServeConfig
from core.outcomes import StepError
from decoding.assets import DecoderAssets
from serving import auth
from serving import protocol as P

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("static") / "index.html"
SWITCH_INTERVAL_S = 0.001
INGRESS_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}


# ----------------------------------------------------------------- what a replica needs
def replica_assets(decoder: DecoderAssets, serve_cfg: ServeConfig, decode_cfg: DecodeConfig,
                   acwt: float, acwt_from: str) -> dict[str, Any]:
    """Model bytes, graph files, log priors and search settings (read once by the driver,
    shipped to every replica, so replicas on other nodes need no shared disk). serve.acwt,
    when set, wins over `acwt` (decoding.assets.tuned_acwt's)."""
    from training.families import get_family

    if not get_family(decoder.card.kind).streams:
        raise StepError(f"{decoder.model_uri} is a {decoder.card.kind}: only a streaming "
                        "model (the student: unidirectional LSTM with look-ahead) can stream")
    sc, dc = serve_cfg, decode_cfg
    return {"model": decoder.model_bytes, "model_uri": decoder.model_uri,
            "kind": decoder.card.kind,
            "graph": decoder.graph_bytes(), "graph_info": decoder.graph_info,
            "log_prior": decoder.log_prior, "acwt": sc.acwt or acwt, "acwt_from":
            "serve.acwt" if sc.acwt else acwt_from, "beam": sc.beam or dc.beam,
            "max_active": sc.max_active or dc.max_active}


def ctc_replica_assets(model_bytes: bytes, model_uri: str, model, graph_dir: str,
                       graph_info: dict, serve_cfg: ServeConfig, decode_cfg: DecodeConfig,
                       tuned: dict) -> dict[str, Any]:
    """replica_assets for a CTC model: its T o L o G and the LM weight (acwt = 1 / weight)
    and blank penalty `amflow decode` tuned (`tuned`: lm_weight, acwt, blank_penalty,
    from); serve.acwt, when set, wins over the tuned acwt."""
    from decoding.assets import GRAPH_FILES

    if getattr(model, "bidirectional", False):
        raise StepError(f"{model_uri} is a bidirectional CTC model: it reads whole utterances "
                        "and cannot stream (train one with model.ctc.bidirectional=false)")
    sc, dc = serve_cfg, decode_cfg
    graph = {n: Path(graph_dir, n).read_bytes() for n in GRAPH_FILES}
    return {"model": model_bytes, "model_uri": model_uri, "kind": "ctc", "graph": graph,
            "graph_info": graph_info, "log_prior": None, "acwt": sc.acwt or tuned["acwt"],
            "acwt_from": "serve.acwt" if sc.acwt else tuned["from"],
            "lm_weight": round(1.0 / (sc.acwt or tuned["acwt"]), 6),
            "blank_penalty": tuned["blank_penalty"], "beam": sc.beam or dc.beam,
            "max_active": sc.max_active or dc.max_active}


def make_recognizer(assets: dict, scfg: ServeConfig) -> Any:
    from serving.recognizer import Recognizer

    device = scfg.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    # the graph is read into memory whole: its files need to live only while it is read
    with tempfile.TemporaryDirectory(prefix="amflow-serve-graph-") as graph_dir:
        for name, data in assets["graph"].items():
            Path(graph_dir, name).write_bytes(data)
        return Recognizer(assets["model"], graph_dir, assets["log_prior"], assets["acwt"],
                          assets["beam"], assets["max_active"], scfg.dtype, device,
                          gate=speech_gate(scfg), onnx=_onnx_graph(assets, scfg),
                          threads=scfg.threads,
                          blank_penalty=assets.get("blank_penalty", 0.0))


def _onnx_graph(assets: dict, scfg: ServeConfig) -> bytes | None:
    if scfg.backend != "onnxruntime":
        return None
    if not assets.get("onnx"):
        raise ValueError("serve.backend=onnxruntime but no exported graph was shipped: "
                         "run `amflow export` (or set serve.onnx_model)")
    return assets["onnx"]


def speech_gate(scfg: ServeConfig):
    """serve.speech_* -> the recognizer's speech gate (None with serve.speech_gate off)."""
    from tasks.speech_activity import settings_of

    return settings_of(scfg) if scfg.speech_gate else None


# ----------------------------------------------------------------- one WebSocket stream
class StreamHandler:
    """The replica's event-loop side (no Ray): admission, the protocol, one Session per
    WebSocket, the dispatcher task."""

    def __init__(self, rec, scfg: ServeConfig, token: bytes | None = None):
        """`token`: the SHA-256 of the client token (serving/auth.py), None: no token."""
        import torch

        from serving.dispatch import BatchDispatcher
        from serving.recognizer import featurize

        torch.set_num_threads(scfg.threads)
        # The forward thread, the search threads and the event loop share one GIL; a
        # thread waiting for it waits up to the switch interval (5 ms by default) while
        # another computes in Python: 1 ms keeps that convoy off the latency.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.rec, self.scfg, self.token = rec, scfg, token
        self.dispatcher = BatchDispatcher(rec.model, scfg.max_batch, scfg.max_rows,
                                          scfg.search_threads, prepare=featurize,
                                          max_wait_s=scfg.max_wait_ms / 1000)
        self.task: asyncio.Task | None = None
        self.admitted = 0
        self.refused = 0
        self.unauthorized = 0
        self.next_id = 0

    def stats(self) -> dict:
        return {**self.dispatcher.stats(), "cpu_s": round(time.process_time(), 3),
                "admitted": self.admitted, "refused": self.refused,
                "unauthorized": self.unauthorized,
                "max_streams": self.scfg.max_streams, "acwt": self.rec.acwt,
                "model_kind": self.rec.kind, "blank_penalty": self.rec.blank_penalty,
                "beam": self.rec.beam, "dtype": str(self.rec.model.dtype),
                "backend": self.scfg.backend}

    def may_read(self, headers) -> bool:
        """/stats: open without a token, else only with `Authorization: Bearer <token>`."""
        return self.token is None or auth.matches(auth.bearer(headers), self.token)

    async def handle(self, ws) -> None:
        """`ws`: a starlette WebSocket, already accepted."""
        from serving.recognizer import Session

        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.dispatcher.run())
        loop = asyncio.get_running_loop()
        # a token in the handshake's header is checked at once; else the first message's
        in_header = auth.bearer(ws.headers) if self.token is not None else None
        if in_header is not None and not auth.matches(in_header, self.token):
            return await self._refuse(ws)
        try:
            first = await asyncio.wait_for(ws.receive(), self.scfg.idle_timeout_s)
            if (self.token is not None and in_header is None
                    and not auth.matches(auth.first_message_token(first), self.token)):
                return await self._refuse(ws)
            P.parse_header(first, self.rec.fcfg.sample_rate)
        except asyncio.TimeoutError:
            return await _close(ws, P.ProtocolError("no header", P.GOING_AWAY))
        except P.ProtocolError as exc:
            return await _close(ws, exc)
        if len(self.dispatcher.sessions) >= self.scfg.max_streams:
            self.refused += 1
            return await _close(ws, P.ProtocolError(
                f"this replica serves {self.scfg.max_streams} streams already: try again later",
                P.TRY_AGAIN))
        out: asyncio.Queue = asyncio.Queue()
        self.next_id += 1
        session = Session(self.rec, lambda m: loop.call_soon_threadsafe(out.put_nowait, m),
                          sid=str(self.next_id))
        self.dispatcher.add(session)
        self.admitted += 1
        state = {"eof": False}
        pump = asyncio.create_task(self._pump(ws, session, out, state))
        try:
            await ws.send_json({"ready": True, "stream": session.id,
                                "max_chunk_bytes": self.scfg.max_chunk_bytes})
            err = await self._receive(ws, session, state, pump)
            if err is not None:
                await _close(ws, err)
            elif state["eof"]:
                await pump
        except Exception as exc:  # a vanished client: its stream ends, the others go on
            log.info("stream %s ended: %r", session.id, exc)
        finally:
            self.dispatcher.remove(session)
            pump.cancel()

    async def _refuse(self, ws) -> None:
        """A missing or wrong token: 1008 and nothing else (no message, no reason)."""
        self.unauthorized += 1
        try:
            await ws.close(auth.POLICY_VIOLATION)
        except Exception:  # already gone
            pass

    async def _receive(self, ws, session, state, pump) -> P.ProtocolError | None:
        while True:
            try:
                # asyncio.timeout, not wait_for: wait_for wraps every receive in a new
                # task (~3x the overhead, on 10 messages per second per stream)
                async with asyncio.timeout(self.scfg.idle_timeout_s):
                    msg = await ws.receive()
            except asyncio.TimeoutError:
                return P.ProtocolError(f"nothing received for {self.scfg.idle_timeout_s} s",
                                       P.GOING_AWAY)
            if msg["type"] == "websocket.disconnect":
                return None
            try:
                if msg.get("bytes") is not None:
                    session.feed(P.pcm_samples(msg["bytes"], self.scfg.max_chunk_bytes))
                else:
                    what = P.parse_control(msg.get("text") or "")
                    session.end_utterance()
                    if what == "eof":
                        state["eof"] = True
                        self.dispatcher.notify()
                        return None
            except P.ProtocolError as exc:
                return exc
            self.dispatcher.notify()

    async def _pump(self, ws, session, out: asyncio.Queue, state) -> None:
        """Send the session's messages in order; after eof, close once the last final
        (the one of the last utterance) went out."""
        while True:
            msg = await out.get()
            last = state["eof"] and "final" in msg and msg["utterance"] == session.utt - 1
            if last:
                msg["eof"] = True
                msg["batch_sizes"] = {str(k): v for k, v in sorted(session.batch_sizes.items())}
            await ws.send_json(msg)
            if last:
                await ws.close(P.NORMAL)
                return


async def _close(ws, exc: P.ProtocolError) -> None:
    try:
        await ws.send_json(exc.message())
        await ws.close(exc.code, reason=str(exc)[:120])
    except Exception:  # already gone
        pass


# ----------------------------------------------------------------- the Ray Serve shell
def build_app(assets: dict, scfg: ServeConfig, token: bytes | None = None):
    """The Serve application: a FastAPI ingress deployment with serve.replicas replicas;
    `token`: the client token's SHA-256 (serving/auth.py), None: no token."""
    from fastapi import FastAPI, Request, WebSocket
    from fastapi.responses import HTMLResponse, JSONResponse
    from ray import serve

    api = FastAPI(title="amflow streaming recognizer")

    @serve.deployment(num_replicas=scfg.replicas, ray_actor_options=actor_options(scfg),
                      # more than max_streams, so that a full replica gets the request and
                      # refuses it with 1013 instead of it waiting in the proxy's queue
                      max_ongoing_requests=scfg.max_streams + 16)
    @serve.ingress(api)
    class Replica:
        def __init__(self, assets: dict, scfg: ServeConfig, token: bytes | None):
            self.handler = StreamHandler(make_recognizer(assets, scfg), scfg, token)

        @api.get("/")
        def page(self) -> HTMLResponse:
            return HTMLResponse(PAGE.read_text())

        @api.get("/stats")
        def stats(self, request: Request) -> JSONResponse:
            if not self.handler.may_read(request.headers):
                return JSONResponse({}, status_code=401)
            return JSONResponse(self.handler.stats())

        @api.websocket("/ws")
        async def stream(self, ws: WebSocket) -> None:
            await ws.accept()
            await self.handler.handle(ws)

    return Replica.bind(assets, scfg, token)


def actor_options(scfg: ServeConfig) -> dict:
    opts: dict[str, Any] = {"num_cpus": scfg.num_cpus, "num_gpus": scfg.num_gpus}
    if scfg.resources:
        opts["resources"] = dict(scfg.resources)
    # One torch thread per replica unless configured: replicas must not oversubscribe.
    env = {v: str(scfg.threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    opts["runtime_env"] = {"env_vars": env}
    return opts


def client_token(scfg: ServeConfig) -> bytes | None:
    """The client token's SHA-256 (serving/auth.py; None: none set), once a non-loopback
    serve.host without one was refused (unless serve.allow_unauthenticated)."""
    token = auth.token_digest(scfg)
    try:
        auth.check_bind(scfg, token is not None)
    except auth.AuthError as exc:
        raise StepError(str(exc)) from None
    return token


def start(cfg: Config, assets: dict) -> str:
    """Deploy on the configured Ray (ray.address, or a local Ray); returns the page URL."""
    from ray import serve

    from core.raycluster import init_ray

    sc = cfg.serve
    token = client_token(sc)
    if sc.ingress == "haproxy":  # read by Ray Serve's controller and replicas at start
        os.environ.update(INGRESS_ENV)
        if cfg.ray.address:
            log.warning("serve.ingress=haproxy on an existing Ray cluster: its nodes must "
                        "start with %s, else Serve keeps its Python proxy",
                        " ".join(f"{k}={v}" for k, v in INGRESS_ENV.items()))
    init_ray(cfg)
    serve.start(http_options={"host": sc.host, "port": sc.port})
    serve.run(build_app(assets, sc, token), name=sc.app_name, route_prefix="/", blocking=False)
    return f"http://{sc.host}:{sc.port}/"
