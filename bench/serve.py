"""`amflow bench serve --run-id R [--url URL] [--streams 1,5,10,20,40,80]`: latency of the
running streaming recognizer (`amflow serve`) against N concurrent real-time streams.

Each stream is one test speaker's session: that speaker's test utterances (data.corpus,
time order, from the first one, so the speaker's mean normalisation is the offline
decode's) played at --speed x real time (1 = a live talker) in --chunk-ms chunks on an
absolute schedule, an `end_utterance` after each utterance and `eof` after --seconds of
audio. Streams start staggered over the first second (arrivals are not synchronised).
Stream i speaks as speaker i mod S, so at N > S several streams replay the same speech.

Per N: latency = end of an utterance's audio (its end message sent) -> its final
transcript received, median and 98th percentile over every utterance of every stream
(and the replica's part of it: its `server_ms`, end message received -> final sent);
the batch-size histogram (how many streams shared each forward that carried a stream's
rows: DeepSpeech2 figure 5); the WER of the streamed finals, the offline `amflow decode`
WER of the same utterances (runs/<R>/decode/hyps.jsonl) and how many finals differ from
the offline words; what the level cost (cores of the replica, from its /stats, and of
the clients: one asyncio process for all streams, on the same machine). Writes
runs/<R>/bench/serve.json ({"rows": [{streams, p50_ms, p98_ms, wer, ...}]}) and, beside
it, serve_latency.png (figure 6) and serve_batch_sizes.png (figure 5).

Side by side, each deployed by the bench in turn (same levels, same audio, same config
otherwise): `--backends torch,onnxruntime` (serve.backend), or `--models A,B` (model.pt
URIs of any streaming kind: the hybrid student beside the CTC student; each model's
offline words are those of the decode that tuned it, amflow.steps.serve.decode_record).
The first one's result is the usual JSON; `backends` / `models` hold each one's, `ratios`
first / other per level.

`--knee [--bound-ms 70] [--repeats 3]`: instead of fixed levels, the largest number of
streams at p98 <= the bound, searched (bench/knee.py: doubling from the first --streams
level, default 10, up to serve.max_streams x serve.replicas, then bisection; each level run
--repeats times, passing on the median of the runs' p98). `rows` then holds each measured
level's median run, `knee` the search (knee, per-run knees, every level's runs); side by
side, each deployment's `knee` and `knee_ratios` (other / first, min..max over the runs).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from core.config import ServeConfig
from core.runs import StepError
from serving.auth import client_token

DEFAULT_STREAMS = (1, 5, 10, 20, 40, 80)


def speaker_sessions(ctx, corpus: str, seconds: float) -> list[list]:
    """Per test speaker, its first utterances (time order) up to `seconds` of audio."""
    from decoding.decode import split_records

    recs, _ = split_records(ctx.storage, corpus, "test")
    by: dict[str, list] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id)):
        if sum(x.duration for x in by[r.speaker_id]) < seconds:
            by[r.speaker_id].append(r)
    return [by[s] for s in sorted(by)]


def load_audio(ctx, corpus: str, sessions: list[list]) -> dict[str, bytes]:
    from core.config import FeaturesConfig
    from tasks.audio import load_audio_result, resolve_uri

    fcfg = FeaturesConfig()
    out = {}
    for recs in sessions:
        for r in recs:
            res = load_audio_result(ctx.storage, resolve_uri(corpus, r.audio_uri), fcfg, r.duration)
            if res.samples is None:
                raise StepError(f"{r.utt_id}: {res.reason}")
            pcm = np.clip(np.round(res.samples * 32768.0), -32768, 32767).astype("<i2")
            out[r.utt_id] = pcm.tobytes()
    return out


async def one_stream(url: str, recs: list, audio: dict[str, bytes], start_s: float,
                     chunk_ms: float, speed: float, token: str | None = None) -> dict:
    """`token`: the service's client token (serving/auth.py), sent as a Bearer header."""
    import websockets

    await asyncio.sleep(start_s)
    step = int(16000 * chunk_ms / 1000) * 2  # bytes per chunk
    result: dict[str, Any] = {"utts": [], "error": None, "batch_sizes": {}}
    ends: dict[int, float] = {}
    try:
        # No permessage-deflate: PCM hardly compresses, and deflating every 100 ms chunk
        # costs the server ~2 % of its CPU (py-spy at 40 streams).
        async with websockets.connect(url, max_size=2 ** 22, open_timeout=30,
                                      compression=None,
                                      additional_headers=auth_headers(token)) as ws:
            await ws.send(json.dumps({"sample_rate": 16000, "format": "s16le"}))
            ready = json.loads(await ws.recv())
            if not ready.get("ready"):
                raise RuntimeError(ready.get("error", ready))
            reader = asyncio.create_task(_read(ws, recs, ends, result))
            t0 = time.perf_counter()
            sent = 0.0  # audio seconds sent
            for k, r in enumerate(recs):
                pcm = audio[r.utt_id]
                for i in range(0, len(pcm), step):
                    if speed > 0:  # absolute schedule: no drift from slow sends
                        delay = t0 + sent / speed - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    await ws.send(pcm[i:i + step])
                    sent += len(pcm[i:i + step]) / 32000
                ends[k] = time.perf_counter()
                last = k == len(recs) - 1
                await ws.send(json.dumps({"eof": True} if last else {"end_utterance": True}))
            await asyncio.wait_for(reader, 120)
    except Exception as exc:  # one failed stream is counted, the others go on
        result["error"] = repr(exc)
    return result


async def _read(ws, recs, ends, result) -> None:
    async for raw in ws:
        m = json.loads(raw)
        if "final" in m:
            k = m["utterance"]
            result["utts"].append({"utt_id": recs[k].utt_id, "hyp": m["final"],
                                   "latency_ms": 1000 * (time.perf_counter() - ends[k]),
                                   "server_ms": m.get("server_ms")})
            if m.get("eof"):
                result["batch_sizes"] = m.get("batch_sizes", {})
                return
        elif "error" in m:
            raise RuntimeError(m["error"])


async def load_level(url: str, n: int, sessions: list[list], audio: dict, chunk_ms: float,
                     speed: float, seed: int, token: str | None = None) -> list[dict]:
    rng = random.Random(seed + n)
    jobs = [one_stream(url, sessions[i % len(sessions)], audio, rng.uniform(0, 1.0), chunk_ms,
                       speed, token) for i in range(n)]
    return await asyncio.gather(*jobs)


def summarise(n: int, results: list[dict], refs: dict, offline: dict) -> dict:
    from decoding import wer as W
    from decoding.lexicon import words_of

    lat, server, streamed, off, differ = [], [], [], [], 0
    batches: Counter = Counter()
    for res in results:
        for u in res["utts"]:
            lat.append(u["latency_ms"])
            if u.get("server_ms") is not None:
                server.append(u["server_ms"])
            ref = words_of(refs[u["utt_id"]])
            streamed.append(W.score(ref, u["hyp"].split()))
            if u["utt_id"] in offline:
                off.append(W.score(ref, offline[u["utt_id"]].split()))
                differ += u["hyp"] != offline[u["utt_id"]]
        for k, v in res["batch_sizes"].items():
            batches[int(k)] += v
    errors = [r["error"] for r in results if r["error"]]
    total = sum(batches.values()) or 1
    return {"streams": n,
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat else None,
            "p98_ms": round(float(np.percentile(lat, 98)), 1) if lat else None,
            # the replica's part: its end-of-utterance message received -> final sent
            "server_p50_ms": round(float(np.percentile(server, 50)), 1) if server else None,
            "server_p98_ms": round(float(np.percentile(server, 98)), 1) if server else None,
            "wer": round(W.aggregate(streamed)["wer"], 5) if streamed else None,
            "offline_wer": round(W.aggregate(off)["wer"], 5) if off else None,
            "finals_differing_from_offline": differ, "utterances": len(lat),
            "failed_streams": len(errors), "errors": errors[:5],
            "batch_size_mean": round(sum(k * v for k, v in batches.items()) / total, 2),
            "batch_size_hist": {str(k): round(v / total, 4) for k, v in sorted(batches.items())}}


def plot(rows: list[dict], path_latency: str, path_batches: str, storage) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["p50_ms"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["streams"] for r in ok], [r["p50_ms"] for r in ok], "o-", label="50%ile")
    ax.plot([r["streams"] for r in ok], [r["p98_ms"] for r in ok], "s-", label="98%ile")
    ax.axhline(70, color="grey", ls=":", label="70 ms (DeepSpeech2 p98 at 10 streams)")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("end of audio -> final transcript (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("amflow serve: latency vs load (cf. DeepSpeech2 fig. 6)")
    _save(fig, path_latency, storage)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in ok:
        h = {int(k): v for k, v in r["batch_size_hist"].items()}
        ks = sorted(h)
        ax.plot(ks, [h[k] for k in ks], "o-", label=f"{r['streams']} streams")
    ax.set_xlabel("batch size")
    ax.set_ylabel("probability")
    ax.set_xscale("log")
    ax.legend()
    ax.set_title("batch sizes a stream saw (cf. DeepSpeech2 fig. 5)")
    _save(fig, path_batches, storage)
    plt.close("all")


def _save(fig, uri: str, storage) -> None:
    import io

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    storage.write_bytes(uri, buf.getvalue())


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def replica_cpu(url: str, token: str | None = None) -> float | None:
    """The replica's process CPU seconds (its /stats), None if it does not say."""
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/stats", headers=auth_headers(token))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read()).get("cpu_s")
    except (OSError, ValueError):
        return None


def cpu_row(n: int, sessions: list[list], wall: float, client_s: float,
            replica_s: float | None) -> dict:
    """What the level cost: cores of the replica process and of these clients (one
    asyncio process for all streams, sharing the machine with the server), and the
    replica's core-seconds per audio second per stream (with one replica: its part of
    the feasibility sum, N of these must fit the cores the clients leave). With several
    replicas, `replica_s` is the one that answered /stats, serving about N/replicas of
    the streams: its cores are one replica's, its per-stream figure is too low by that
    factor."""
    audio_s = sum(r.duration for i in range(n) for r in sessions[i % len(sessions)])
    return {"audio_s": round(audio_s, 1), "client_cores": round(client_s / wall, 3),
            "replica_cores": None if replica_s is None else round(replica_s / wall, 3),
            "replica_core_s_per_audio_s": None if replica_s is None
            else round(replica_s / audio_s, 5)}


def offline_hyps(ctx, model: str | None = None) -> dict[str, str]:
    """The offline decode's words per utterance: decode[-<decode.tag>]'s, or with `model`
    the decode that tuned that model (its kind's record, amflow.steps.serve.decode_record)."""
    tag = ctx.cfg.decode.tag
    uri = ctx.other(f"decode-{tag}" if tag else "decode", "hyps.jsonl")
    if model:
        from amflow.steps.serve import decode_record
        from training.checkpoint import load_model_card

        _, record = decode_record(ctx, model, load_model_card(ctx.storage, model)[1].kind)
        uri = record.rsplit("/", 1)[0] + "/hyps.jsonl" if record else ""
    if not uri or not ctx.storage.exists(uri):
        return {}
    return {d["utt_id"]: d["hyp"] for d in map(json.loads, ctx.storage.read_text(uri).splitlines())}


def run(ctx, args) -> dict[str, Any]:
    """Against the running service (--url), or with --backends, against a service this
    bench deploys once per backend (serve.backend), one after the other, side by side."""
    backends = [b for b in (getattr(args, "backends", None) or "").split(",") if b]
    models = [m for m in (getattr(args, "models", None) or "").split(",") if m]
    if backends and models:
        raise StepError("bench serve: --backends or --models, not both")
    if backends:
        return run_backends(ctx, args, backends)
    if models:
        return run_models(ctx, args, models)
    sc = ctx.cfg.serve
    url = (getattr(args, "url", None) or f"http://{sc.host}:{sc.port}/")
    return measure(ctx, args, url)


def measure(ctx, args, url: str, plot_tag: str = "", model: str | None = None
            ) -> dict[str, Any]:
    from core.storage import join

    ws_url = url.replace("http", "ws", 1).rstrip("/") + "/ws"
    levels = [int(x) for x in (getattr(args, "streams", None) or
                               ",".join(map(str, DEFAULT_STREAMS))).split(",")]
    seconds = float(getattr(args, "seconds", None) or 20.0)
    speed = float(getattr(args, "speed", None) if getattr(args, "speed", None) is not None else 1.0)
    chunk_ms = float(getattr(args, "chunk_ms", None) or 100.0)
    corpus = getattr(args, "data", None) or ctx.cfg.data.corpus
    sessions = speaker_sessions(ctx, corpus, seconds)
    audio = load_audio(ctx, corpus, sessions)
    refs = {r.utt_id: r.text for s in sessions for r in s}
    offline = offline_hyps(ctx, model)
    token = client_token(ctx.cfg.serve)

    def level(n: int, repeat: int = 0) -> dict:
        return measure_level(url, ws_url, n, sessions, audio, chunk_ms, speed, refs, offline,
                             token, seed=repeat)

    knee = search_knee(ctx.cfg.serve, args, level) if getattr(args, "knee", False) else None
    rows = knee.pop("rows") if knee else [level(n) for n in levels]
    out_dir = join(ctx.run_uri, "bench")
    plots = [f"serve{plot_tag}_latency.png", f"serve{plot_tag}_batch_sizes.png"]
    plot(rows, join(out_dir, plots[0]), join(out_dir, plots[1]), ctx.storage)
    held = [r["streams"] for r in rows if r["p98_ms"] is not None and r["p98_ms"] <= 70
            and not r["failed_streams"]]
    out = {"url": url, "rows": rows, "seconds_per_stream": seconds, "speed": speed,
           "chunk_ms": chunk_ms, "speakers": len(sessions),
           "max_streams_p98_le_70ms": max(held) if held else 0, "plots": plots}
    return {**out, "knee": knee} if knee else out


def search_knee(scfg: ServeConfig, args: Any, level: Any) -> dict:
    """--knee: bench.knee.search over `level(n, repeat)` from the first --streams level
    (default 10) up to what the deployment admits (serve.max_streams x serve.replicas)."""
    from bench import knee as K

    bound, repeats = getattr(args, "bound_ms", None), getattr(args, "repeats", None)
    bound, repeats = float(70.0 if bound is None else bound), int(3 if repeats is None else repeats)
    first = (getattr(args, "streams", None) or "").split(",")[0]
    limit = scfg.max_streams * scfg.replicas
    if repeats < 1 or bound <= 0:
        raise StepError(f"bench serve --knee: --repeats ({repeats}) must be >= 1 and "
                        f"--bound-ms ({bound}) > 0")
    out = K.search(level, bound, repeats, int(first) if first else 10, limit)
    print(f"knee: {out['knee']} streams at median p98 <= {bound} ms over {repeats} runs "
          f"per level{' (capped: the deployment admits no more)' if out['capped'] else ''}; "
          f"per run {out['knee_per_repeat']}", flush=True)
    return out


def measure_level(url: str, ws_url: str, n: int, sessions, audio, chunk_ms: float,
                  speed: float, refs: dict, offline: dict, token: str | None = None,
                  seed: int = 0) -> dict:
    """One run of n streams (`seed`: their staggered starts; a repeat gets another)."""
    t0, c0, s0 = time.perf_counter(), time.process_time(), replica_cpu(url, token)
    results = asyncio.run(load_level(ws_url, n, sessions, audio, chunk_ms, speed, seed, token))
    wall, s1 = time.perf_counter() - t0, replica_cpu(url, token)
    row = summarise(n, results, refs, offline)
    row["wall_s"] = round(wall, 1)
    row.update(cpu_row(n, sessions, wall, time.process_time() - c0,
                       None if s0 is None or s1 is None else s1 - s0))
    print(f"{n:>4} streams: p50 {row['p50_ms']} ms, p98 {row['p98_ms']} ms, WER "
          f"{row['wer']} (offline {row['offline_wer']}, {row['finals_differing_from_offline']} "
          f"finals differ), mean batch {row['batch_size_mean']}, "
          f"{row['failed_streams']} failed; cores: replica {row['replica_cores']}, "
          f"clients {row['client_cores']}", flush=True)
    return row


def run_backends(ctx, args, backends: list[str]) -> dict[str, Any]:
    """Deploy the run's recognizer with each serve.backend in turn (same config otherwise),
    measure the same levels against each, and compare: the first backend's result is the
    usual JSON (`rows` ...), `backends` holds each one's, `ratios` first / other per level."""
    import dataclasses

    model = getattr(args, "model", None)
    variants = [(b, dataclasses.replace(ctx.cfg, serve=dataclasses.replace(ctx.cfg.serve, backend=b)),
                 model) for b in backends]
    return side_by_side(ctx, args, variants, "backend")


def run_models(ctx, args, models: list[str]) -> dict[str, Any]:
    """Deploy each model in turn (its kind from its card: a hybrid student, a CTC student),
    same config otherwise; labelled by kind (kind-2, ... when a kind repeats)."""
    from training.checkpoint import load_model_card

    variants, seen = [], Counter()
    for m in models:
        if not ctx.storage.exists(m):
            raise StepError(f"bench serve --models: {m} not found")
        kind = load_model_card(ctx.storage, m)[1].kind
        seen[kind] += 1
        variants.append((kind if seen[kind] == 1 else f"{kind}-{seen[kind]}", ctx.cfg, m))
    out = side_by_side(ctx, args, variants, "model")
    out["models"] = {label: {**r, "model": m} for (label, _, m), r in
                     zip(variants, out.pop("models").values())}
    return out


def side_by_side(ctx, args, variants: list[tuple[str, Any, str | None]], what: str
                 ) -> dict[str, Any]:
    """Deploy each (label, config, model) in turn, measure the same levels against each:
    the first's result is the usual JSON, `<what>s` holds each one's, `ratios` first /
    other per level; every row says its `<what>`."""
    from ray import serve

    from amflow.steps.serve import load_assets, serve_context
    from core.runs import StepContext
    from serving import app

    per: dict[str, dict] = {}
    try:
        for label, cfg, model in variants:
            vctx, model_uri = serve_context(StepContext(cfg, ctx.run_id, ctx.step), model)
            url = app.start(cfg, load_assets(vctx, model_uri))
            print(f"bench serve: {what} {label} on {url}", flush=True)
            # offline words: the decode that tuned this model (its kind's, found by the
            # model, not by decode.tag: --model <ctc model.pt> --backends needs no tag)
            per[label] = measure(vctx, args, url, plot_tag=f"_{label}", model=model_uri)
            # the app goes, Serve stays: a shutdown and a new start on a loaded machine
            # could meet the old controller, which ignores the new http_options (the next
            # app came up on Serve's default port while the bench called serve.port)
            serve.delete(cfg.serve.app_name)
            for row in per[label]["rows"]:
                row[what] = label
    finally:
        serve.shutdown()
    labels = [v[0] for v in variants]
    first = per[labels[0]]
    out = {**first, f"{what}s": {b: {"rows": r["rows"], "plots": r["plots"],
                                     "max_streams_p98_le_70ms": r["max_streams_p98_le_70ms"],
                                     **({"knee": r["knee"]} if "knee" in r else {})}
                                 for b, r in per.items()},
           "ratios": {b: backend_ratios(first["rows"], per[b]["rows"]) for b in labels[1:]}}
    if "knee" in first:  # other's knee / first's, min..max over the runs' knees
        from bench.knee import knee_ratio

        out["knee_ratios"] = {b: knee_ratio(first["knee"], per[b]["knee"]) for b in labels[1:]}
    return out


def backend_ratios(base: list[dict], other: list[dict]) -> list[dict]:
    """Per level, base / other: > 1 where the other backend is faster or cheaper."""
    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    return [{"streams": a["streams"], "p50_ms": ratio(a["p50_ms"], b["p50_ms"]),
             "p98_ms": ratio(a["p98_ms"], b["p98_ms"]),
             "replica_core_s_per_audio_s": ratio(a["replica_core_s_per_audio_s"],
                                                 b["replica_core_s_per_audio_s"])}
            for a, b in zip(base, other)]
