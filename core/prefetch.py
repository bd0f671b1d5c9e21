"""One background thread that runs an iterable ahead of its consumer.

`prefetch(iterable, depth)` yields the items of `iterable` in order while a daemon
thread produces up to `depth` of them ahead (loading the next minibatch while the
current one trains, say). An exception in the producer is re-raised in the consumer at
the point it happened; closing the generator early (break, GeneratorExit) stops the
producer and joins it. `Prefetch` is the same as an object that also reports where the
time went: `produce_s` (the producer working) and `wait_s` (the consumer starved).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")
_END = object()


class _Error:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetch(Generic[T]):
    """Iterate `source()` on a background thread, at most `depth` items ahead."""

    def __init__(self, source: Callable[[], Iterable[T]], depth: int = 2,
                 name: str = "amflow-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.source = source
        self.name = name
        self.produce_s = 0.0
        self.wait_s = 0.0
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, item: object) -> bool:
        """Blocking put that gives up once the consumer has stopped."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            t0 = time.perf_counter()
            for item in self.source():
                self.produce_s += time.perf_counter() - t0
                if not self._put(item):
                    return
                t0 = time.perf_counter()
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put(_Error(exc))

    def __iter__(self) -> Iterator[T]:
        self.close()
        self._stop.clear()
        self._thread = threading.Thread(target=self._produce, name=self.name, daemon=True)
        self._thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = self._q.get()
                self.wait_s += time.perf_counter() - t0
                if item is _END:
                    return
                if isinstance(item, _Error):
                    raise item.exc
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer (dropping what it made ahead) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            while True:
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=10)
            self._thread = None


def prefetch(iterable: Iterable[T], depth: int = 2, name: str = "amflow-prefetch"
             ) -> Iterator[T]:
    """The items of `iterable`, produced on a background thread `depth` ahead."""
    return iter(Prefetch(lambda: iterable, depth, name))
