"""`python -m bench.serve_cost --run-id R [--streams 40] [--seconds 10] [--set k=v ...]`:
where a replica's CPU goes per stream per audio second, without Ray or WebSockets.

N sessions (serving.recognizer.Session, the served code) play the bench's test speakers
(bench/serve.py: the same utterances, 100 ms chunks) on a simulated clock, in one thread:
every tick each stream's chunk goes through the features, one Batch Dispatch forward
carries every ready stream, then each stream's search runs. The CPU time of each stage
(this thread's, so other jobs on the machine do not count) is divided by the audio
seconds all streams played: core-seconds per audio second per stream. What it leaves
out is the server's plumbing (WebSocket frames, ASGI, asyncio, threads): `amflow bench
serve` against a running service measures the whole.

The feasibility sum: N real-time streams need N x (this total) cores, which must fit in
the cores left over by everything else on the machine (the bench clients included).
"""
from __future__ import annotations

import argparse
import collections
import json
import time

import numpy as np

from serving import protocol as P


def load(run_id: str, sets: list[str], streams: int, seconds: float):
    """(Recognizer, per-stream utterance PCM lists) for the run's student."""
    from core.config import load_config
    from core.runs import StepContext
    # an entry point like amflow.cli: it uses the serve step's run-layout resolution
    from amflow.steps.serve import load_assets, serve_context
    from bench.serve import load_audio, speaker_sessions
    from serving.app import make_recognizer

    cfg = load_config(None, sets)
    ctx, model = serve_context(StepContext(cfg, run_id, "serve"), None)
    rec = make_recognizer(load_assets(ctx, model), cfg.serve)
    sessions = speaker_sessions(ctx, cfg.data.corpus, seconds)
    audio = load_audio(ctx, cfg.data.corpus, sessions)
    plays = [[audio[r.utt_id] for r in sessions[i % len(sessions)]] for i in range(streams)]
    return rec, plays


class Clock:
    """CPU seconds per stage, this thread only."""

    def __init__(self):
        self.s: collections.Counter = collections.Counter()

    def time(self, stage: str, fn, *args):
        t0 = time.thread_time()
        out = fn(*args)
        self.s[stage] += time.thread_time() - t0
        return out


def play(rec, plays: list[list[bytes]], chunk_ms: float = 100.0, max_rows: int = 32,
         batched: bool = True) -> dict:
    """`batched`: the fbank of all streams at once before each forward (what the
    dispatcher does); else each stream's chunk alone as it arrives."""
    from serving.recognizer import Session, featurize

    step = int(16000 * chunk_ms / 1000) * 2
    sent: list = []
    sessions = [Session(rec, sent.append, str(i)) for i in range(len(plays))]
    chunks = [list(_chunks(utts, step)) for utts in plays]
    clock, batches = Clock(), collections.Counter()
    audio_s = sum(len(b) for utts in plays for b in utts) / 32000
    for t in range(max(len(c) for c in chunks)):
        for s, c in zip(sessions, chunks):
            if t < len(c):
                clock.time("features", feed, s, c[t], batched)
        clock.time("features", featurize, sessions)
        ready = [s for s in sessions if s.ready()]
        while ready:
            batches[len(ready)] += 1
            clock.time("forward", forward, rec.model, ready, max_rows)
            ready = [s for s in sessions if s.ready()]
        for s in sessions:
            if s.search_due():
                clock.time("search", s.run_search)
    per = {k: v / audio_s for k, v in clock.s.items()}
    return {"streams": len(plays), "audio_s": round(audio_s, 1),
            "core_s_per_audio_s_per_stream": {k: round(v, 5) for k, v in per.items()},
            "total": round(sum(per.values()), 5),
            "streams_per_core": round(1 / sum(per.values()), 1),
            "batch_size_mean": round(sum(k * v for k, v in batches.items()) /
                                     max(1, sum(batches.values())), 2),
            "finals": sum("final" in m for m in sent)}


def _chunks(utts: list[bytes], step: int):
    """(pcm chunk | None for the end of an utterance) in play order."""
    for pcm in utts:
        for i in range(0, len(pcm), step):
            yield pcm[i:i + step]
        yield None


def feed(session, chunk, batched: bool) -> None:
    if chunk is None:
        session.end_utterance()
    else:
        session.feed(P.pcm_samples(chunk, 1 << 22))
    if not batched:
        session.ready()  # featurizes this stream's queue alone


def forward(model, batch: list, max_rows: int) -> None:
    rows = [s.take(max_rows) for s in batch]
    outs, states = model.forward(rows, [s.state for s in batch])
    for s, out, st in zip(batch, outs, states):
        s.after_forward(out, st, len(batch))


async def realtime(rec, plays: list[list[bytes]], chunk_ms: float = 100.0,
                   max_rows: int = 32, max_wait_s: float = 0.0) -> dict:
    """The streams at 1x real time through the served dispatcher (asyncio, its forward
    thread and search pool, featurize as prepare), without the WebSockets: latency from
    an utterance's end to its final, on the replica's code alone."""
    import asyncio
    import random

    from serving.dispatch import BatchDispatcher
    from serving.recognizer import Session, featurize

    disp = BatchDispatcher(rec.model, max_batch=128, max_rows=max_rows, prepare=featurize,
                           max_wait_s=max_wait_s)
    task = asyncio.create_task(disp.run())
    loop = asyncio.get_running_loop()
    step, lat = int(16000 * chunk_ms / 1000) * 2, []
    rng = random.Random(0)

    async def one(utts: list[bytes]) -> None:
        finals = []
        s = Session(rec, lambda m: loop.call_soon_threadsafe(finals.append, m))
        disp.add(s)
        await asyncio.sleep(rng.uniform(0, 1.0))
        t0, sent = time.perf_counter(), 0.0
        for chunk in _chunks(utts, step):
            if chunk is None:
                s.end_utterance()
            else:
                await asyncio.sleep(max(0.0, t0 + sent - time.perf_counter()))
                s.feed(P.pcm_samples(chunk, 1 << 22))
                sent += len(chunk) / 32000
            disp.notify()
        while sum("final" in m for m in finals) < len(utts):
            await asyncio.sleep(0.01)
        lat.extend(m["server_ms"] for m in finals if "final" in m)
        disp.remove(s)

    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(u) for u in plays))
    task.cancel()
    cores = (time.process_time() - c0) / (time.perf_counter() - t0)
    return {"streams": len(plays), "finals": len(lat), "cores": round(cores, 3),
            "p50_ms": round(float(np.percentile(lat, 50)), 1),
            "p98_ms": round(float(np.percentile(lat, 98)), 1),
            "batch_size_mean": round(sum(k * v for k, v in disp.batch_sizes.items()) /
                                     max(1, disp.forwards), 2)}


def main(argv=None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id", default="demo-ssl")
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    p.add_argument("--set", action="append", default=[], help="config key=value")
    p.add_argument("--per-stream-fbank", action="store_true",
                   help="each chunk's fbank alone (the unbatched way), for comparison")
    p.add_argument("--realtime", action="store_true",
                   help="play at 1x through the dispatcher: latency end of utterance -> final")
    p.add_argument("--max-wait-ms", type=float, default=0.0,
                   help="--realtime: the dispatcher's max_wait (0: eager)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rec, plays = load(a.run_id, a.set, a.streams, a.seconds)
    if a.realtime:
        import asyncio
        import sys

        sys.setswitchinterval(0.001)  # as the replica does (serving/app.py)
        print(json.dumps(asyncio.run(realtime(rec, plays, max_wait_s=a.max_wait_ms / 1000)),
                         indent=1))
        return
    print(json.dumps(play(rec, plays, batched=not a.per_stream_fbank), indent=1))


if __name__ == "__main__":
    main()
