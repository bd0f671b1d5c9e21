"""Which step of a recipe runs when, in `amflow run`: a step starts once its upstream steps
are done (Recipe.upstream_for_cli), at most `jobs` at once, like `make -j`.

One step at a time runs on the calling thread (`in_process`: in the recipe's interpreter,
with its warm torch and Ray); a step that becomes ready while that one runs starts as its
own process (`start_process`), so a short step (a decode, the LM) does not wait behind a
long one (the teacher's training). Among ready steps, the one with the most steps after it
(that wait on it, directly or not) goes first, to this thread when it is free: the
teacher's training before the baseline's, the SSL run's first step before the teacher's
decode. Ties go by the recipe's order. A failure lets the running steps finish and
starts nothing new; the first error is raised once they have.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, TypeVar

S = TypeVar("S")  # a step: anything with an `id`
Done = Callable[[Any, Any, BaseException | None], None]  # (step, result, error)


class Scheduler(Generic[S]):
    def __init__(self, steps: list[S], upstream: dict[str, frozenset[str]], jobs: int,
                 in_process: Callable[[S], Any], start_process: Callable[[S, Done], None]):
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        # the order steps are taken in when ready: most steps after them first, then the
        # recipe's order
        after = _steps_after(upstream)
        self.pending = sorted(steps, key=lambda s: -len(after[s.id]))
        self.upstream, self.jobs = upstream, jobs
        self.in_process, self.start_process = in_process, start_process
        self.done: set[str] = set()
        self.running: set[str] = set()
        self.results: list[Any] = []  # in the order the steps finished
        self.error: BaseException | None = None
        self.main_busy = False
        self.cond = threading.Condition()

    def run(self) -> list[Any]:
        while True:
            step = self._next_for_this_thread()
            if step is None:
                return self.results
            try:
                result, error = self.in_process(step), None
            except Exception as exc:  # noqa: BLE001 - raised again once the others end
                result, error = None, exc
            self._finished(step, result, error, main=True)

    def _ready(self) -> list[S]:
        return [s for s in self.pending if self.upstream[s.id] <= self.done]

    def _next_for_this_thread(self) -> S | None:
        """The next ready step for this thread, once there is one (the ready steps after
        it start as processes while slots are free); None when all have ended."""
        with self.cond:
            while True:
                ready = [] if self.error else self._ready()
                if ready:
                    break
                if not self.running:
                    if self.error is not None:
                        raise self.error
                    if self.pending:  # cannot happen for a parsed recipe: `after` is earlier
                        raise RuntimeError("steps wait on each other: "
                                           + ", ".join(s.id for s in self.pending))
                    return None
                self.cond.wait()
            step = ready[0]
            self._take(step)
            self.main_busy = True
            self._start_ready_processes()
            return step

    def _take(self, step: S) -> None:
        self.pending.remove(step)
        self.running.add(step.id)

    def _start_ready_processes(self) -> None:
        """Called holding the lock while this thread runs a step: the ready steps, in order,
        as processes while fewer than `jobs` run."""
        for step in self._ready():
            if len(self.running) >= self.jobs or self.error is not None:
                return
            self._take(step)
            try:
                self.start_process(step, self._finished)
            except Exception as exc:  # noqa: BLE001 - e.g. no interpreter to start
                self.running.discard(step.id)
                self.error = self.error or exc

    def _finished(self, step: S, result: Any, error: BaseException | None,
                  main: bool = False) -> None:
        with self.cond:
            self.running.discard(step.id)
            if error is None:
                self.done.add(step.id)
                self.results.append(result)
            elif self.error is None:
                self.error = error
            if main:
                self.main_busy = False
            elif self.main_busy:
                self._start_ready_processes()
            self.cond.notify_all()


def _steps_after(upstream: dict[str, frozenset[str]]) -> dict[str, set[str]]:
    """For each step, the steps that wait on it, directly or through others."""
    down: dict[str, set[str]] = {sid: set() for sid in upstream}
    for sid, ups in upstream.items():
        for u in ups:
            down.setdefault(u, set()).add(sid)
    memo: dict[str, set[str]] = {}

    def closure(sid: str) -> set[str]:
        if sid not in memo:
            memo[sid] = set()
            for d in down.get(sid, ()):
                memo[sid] |= {d} | closure(d)
        return memo[sid]

    return {sid: closure(sid) for sid in upstream}
