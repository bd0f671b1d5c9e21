"""Batch Dispatch (DeepSpeech2 section 7.1): one eager scheduler per replica.

Whenever the previous forward has finished, the scheduler takes every stream that has
rows ready, however few, pads them into one batch (each stream with its own LSTM state),
runs one model forward and hands each stream its outputs. It never waits to fill a batch:
DeepSpeech2 found eager batching gives the lowest end-user latency, and the batch grows
by itself with load (work piles up while a forward runs). With max_wait_s > 0 (serve.
max_wait_ms) the rows of partial hypotheses wait up to that long for other streams'
rows (batch_due_in says why); an utterance's end still goes at once. The forward runs
on one dedicated thread (torch releases the GIL, so the event loop keeps receiving
audio); the search runs per stream on a thread pool, off the model's critical path; a
stream whose final is due is searched before the others' partials. `prepare(sessions)`,
when given, runs on the event loop before each batch is chosen: the sessions' features,
computed for all of them at once (serving.recognizer.featurize).

    BatchDispatcher(model, max_batch, max_rows, search_threads, prepare, max_wait_s)
        .add(session) / .remove(session) / .notify()   from the event loop
        await .run()                                  the scheduler loop (an asyncio task)
        .batch_sizes                                  Counter: forwards per batch size
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

log = logging.getLogger(__name__)


class BatchDispatcher:
    def __init__(self, model, max_batch: int = 64, max_rows: int = 32, search_threads: int = 1,
                 prepare: Callable[[list], None] | None = None, max_wait_s: float = 0.0):
        self.model = model
        self.max_batch, self.max_rows = int(max_batch), int(max_rows)
        self.max_wait_s = float(max_wait_s)
        self.prepare = prepare or (lambda sessions: None)
        self.sessions: dict[int, object] = {}  # insertion order: oldest stream first
        self.wake = asyncio.Event()
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="forward")
        self.search_pool = ThreadPoolExecutor(max(1, search_threads), thread_name_prefix="search")
        self.queued: dict[int, object] = {}  # streams with a search task submitted
        self.searching: set[int] = set()  # those a search thread is running
        self.pick_lock = threading.Lock()
        self.batch_sizes: collections.Counter = collections.Counter()
        self.forward_s = 0.0
        self.forwards = 0

    def add(self, session) -> None:
        self.sessions[id(session)] = session

    def remove(self, session) -> None:
        session.closed = True
        self.sessions.pop(id(session), None)

    def notify(self) -> None:
        self.wake.set()

    def next_batch(self) -> list:
        """The streams with ready rows, at most max_batch, oldest stream first. With
        max_wait_s, when no stream's rows are past their wait yet, only the streams with
        an utterance end: a final's forward stays small (a forward of 35 streams costs
        ~5x one of 1 on a CPU); the others' rows go together at their deadline."""
        ready = [s for s in self.sessions.values() if s.ready()]
        if self.max_wait_s > 0 and len(ready) < self.max_batch:
            now = time.perf_counter()
            if all(now - (s.waiting_since or now) < self.max_wait_s for s in ready):
                ready = [s for s in ready if s.end_pending()] or ready
        return ready[: self.max_batch]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.until_due()
            try:
                await self.step(loop)
            except Exception:  # one bad batch must not stop every stream's scheduler
                log.exception("batch dispatch step failed")
            self.start_searches(loop)

    async def until_due(self) -> None:
        """Return when a batch is due (batch_due_in), else sleep until it will be or
        until new input (notify) may change that. Nothing is featurized here: audio
        waits in its session until the step, so that prepare() gets every stream's."""
        while True:
            wait = self.batch_due_in()
            if wait is not None and wait <= 0:
                return
            self.wake.clear()
            try:
                async with asyncio.timeout(wait):  # None: until notified
                    await self.wake.wait()
            except TimeoutError:
                pass

    def batch_due_in(self) -> float | None:
        """Seconds until the next batch is due; 0: now; None: no stream has input (rows,
        or audio not featurized yet: Session.has_input).

        max_wait_s 0 is DeepSpeech2's eager dispatch: whatever is ready goes as soon as
        the previous forward finished. With max_wait_s > 0, ready rows wait up to that
        long for other streams' rows, unless an utterance has ended in them (its client
        waits for the final: that stream goes at once, next_batch) or max_batch streams
        are ready. Why wait on a CPU: a forward costs about the same for 1 stream
        as for 8 (each row step reads all the LSTM's weights, ~8 MB, from memory), so
        eager forwards of 1-2 streams each, 400 a second at 40 streams, spent ~0.6 core."""
        ready = [s for s in self.sessions.values() if s.has_input()]
        if not ready:
            return None
        if self.max_wait_s <= 0 or len(ready) >= self.max_batch:
            return 0.0
        if any(s.end_pending() for s in ready):
            return 0.0
        now = time.perf_counter()
        return min(s.waiting_since or now for s in ready) + self.max_wait_s - now

    async def step(self, loop) -> int:
        self.prepare(list(self.sessions.values()))
        batch = self.next_batch()
        if not batch:
            return 0
        rows = [s.take(self.max_rows) for s in batch]
        states = [s.state for s in batch]
        t0 = time.perf_counter()
        try:
            outs, new_states = await loop.run_in_executor(self.model_thread, self.model.forward,
                                                          rows, states)
        except Exception:
            for s in batch:
                s.forward_failed()
            raise
        self.forward_s += time.perf_counter() - t0
        self.forwards += 1
        self.batch_sizes[len(batch)] += 1
        for s, out, st in zip(batch, outs, new_states):
            s.after_forward(out, st, len(batch))
        return len(batch)

    def start_searches(self, loop, sessions: list | None = None) -> None:
        """A search task per stream with posteriors queued; each task searches the most
        urgent queued stream when a thread takes it, not the one it was submitted for: a
        final then waits for at most the searches already running, not for every partial
        queued before it."""
        for s in list(self.sessions.values()) if sessions is None else sessions:
            with self.pick_lock:
                if not s.search_due() or id(s) in self.queued:
                    continue
                self.queued[id(s)] = s
            fut = loop.run_in_executor(self.search_pool, self._search_next)
            fut.add_done_callback(self._searched)

    def _search_next(self):
        """On a search thread: run the oldest queued stream with a final due, else the
        oldest queued one."""
        with self.pick_lock:
            waiting = [s for k, s in self.queued.items() if k not in self.searching]
            s = next((s for s in waiting if s.final_due()), waiting[0])
            self.searching.add(id(s))
        try:
            s.run_search()
        finally:
            with self.pick_lock:
                self.searching.discard(id(s))
                self.queued.pop(id(s), None)
        return s

    def _searched(self, fut) -> None:
        if fut.exception() is not None:
            log.error("search failed on a stream: %r", fut.exception())
            return
        s = fut.result()
        if s.search_due() and not s.closed:  # more posteriors arrived while it searched
            self.start_searches(asyncio.get_running_loop(), [s])

    def stats(self) -> dict:
        return {"streams": len(self.sessions), "forwards": self.forwards,
                "forward_ms_mean": round(1000 * self.forward_s / max(1, self.forwards), 3),
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())}}
