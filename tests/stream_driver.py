"""Clients streaming utterances through the serving Batch Dispatch (serving/dispatch.py),
as the WebSocket app's sessions do: one driver for the hybrid and the CTC serving tests."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence


def drive_streams(rec: Any, waves: Sequence[Any], clients: Sequence[tuple[int, bool]], *,
                  model: Any = None, prepare: Callable | None = None, max_wait_s: float = 0.0,
                  pause_s: float = 0.0, timeout_s: float = 120.0
                  ) -> tuple[list[list[dict]], list[int]]:
    """Each client (chunk samples, pause) streams every wave at once with the others, in
    chunks of its size; `pause` sleeps `pause_s` after each chunk (0: only yields to the
    loop; a real-time client), else it sends as fast as it can, its next utterance arriving
    while a forward still holds the last one's rows. Returns each client's messages and the
    dispatcher's batch sizes. `model`: what the dispatcher forwards (default rec.model).
    A test that wants partials from a model that is not slowed needs `pause_s` > 0: with
    bare yields a loaded machine may see every chunk of an utterance fed before its first
    forward, and so no partial."""
    from serving.dispatch import BatchDispatcher
    from serving.recognizer import Session

    async def main():
        disp = BatchDispatcher(model or rec.model, max_batch=8, max_rows=16, prepare=prepare,
                               max_wait_s=max_wait_s)
        task = asyncio.create_task(disp.run())
        loop = asyncio.get_running_loop()

        async def one(chunk: int, pause: bool) -> list[dict]:
            msgs: list[dict] = []
            s = Session(rec, lambda m: loop.call_soon_threadsafe(msgs.append, m))
            disp.add(s)
            for w in waves:
                for i in range(0, len(w), chunk):
                    s.feed(w[i:i + chunk])
                    disp.notify()
                    if pause:
                        await asyncio.sleep(pause_s)
                s.end_utterance()
                disp.notify()
                if not pause:  # the next utterance and its end arrive while a forward holds
                    while s.ready():  # this one's last rows (a client faster than real time)
                        await asyncio.sleep(0.001)
                await asyncio.sleep(0.002 if pause else 0)
            while sum("final" in m for m in msgs) < len(waves):
                await asyncio.sleep(0.01)
            disp.remove(s)
            return msgs

        out = await asyncio.wait_for(asyncio.gather(*(one(c, p) for c, p in clients)),
                                     timeout_s)
        task.cancel()
        return out, disp.batch_sizes

    return asyncio.run(main())
