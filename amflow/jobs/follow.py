"""Following a job: submit-or-attach, stream its output, poll until done or out of budget.

`follow` streams new output lines and returns after a time budget, so a caller can poll in
short tries (an Airflow task defers or reschedules between them).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amflow.jobs.base import SUCCEEDED, TERMINAL, Emit, read_json, write_json
from amflow.jobs.naming import parse_summary


@dataclass
class Outcome:
    job_id: str
    status: str  # RUNNING while the budget ran out first, else terminal
    submitted: bool  # this call started the job (False: re-attached)
    summary: dict[str, Any] | None = None
    tail: list[str] = field(default_factory=list)  # last output lines, for error messages
    pokes: int = 1

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED and self.summary is not None


FIRST_POLL_S = 0.2
POLL_SHARE = 0.1


def next_poll_s(elapsed_s: float, poll_s: float) -> float:
    """The pause before the next status check of a job followed for `elapsed_s`.

    A tenth of the time followed so far, at least FIRST_POLL_S and at most `poll_s`: a job
    that ends is seen within 10 % of its run time (0.2 s for a 1-s step, where a fixed 5-s
    poll would double it), while a long one is polled every `poll_s` as before (about 7
    extra status checks per doubling of the time until then).
    """
    return min(poll_s, max(FIRST_POLL_S, POLL_SHARE * elapsed_s))


class StepRunner:
    """Submit-or-attach, stream output, poll until done or out of budget."""

    def __init__(self, backend, state_dir: Path, poll_s: float = 5.0, emit: Emit | None = None):
        self.backend = backend
        self.state_dir = Path(state_dir)
        self.poll_s = poll_s
        self.emit = emit or (lambda line: print(line, flush=True))

    def _cursor_path(self, jid: str) -> Path:
        d = self.state_dir / jid
        d.mkdir(parents=True, exist_ok=True)
        return d / "cursor.json"

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        started = self.backend.submit(jid, argv, resources)
        where = getattr(self.backend, "address", None) or "this machine"
        if started:
            self.emit(f"[amflow-runner] started {self.backend.mode} job {jid} on {where}: "
                      f"{shlex.join(argv)}")
        else:
            self.emit(f"[amflow-runner] re-attached to {self.backend.mode} job {jid} "
                      f"(status {self.backend.status(jid)})")
        return started

    def follow(self, jid: str, budget_s: float, prefix: str = "") -> Outcome:
        """Stream new output lines until the job ends or `budget_s` runs out."""
        cpath = self._cursor_path(jid)
        state = read_json(cpath, {"offset": 0, "pokes": 0, "tail": []})
        state["pokes"] += 1
        tail: list[str] = state.get("tail", [])
        t0 = time.monotonic()
        deadline = t0 + budget_s

        def pump(final: bool) -> None:
            read = self.backend.final_logs if final else self.backend.logs
            text, state["offset"] = read(jid, state["offset"])
            for line in text.splitlines():
                self.emit(prefix + line)
                tail.append(line)
            del tail[:-200]
            state["tail"] = tail
            write_json(cpath, state)

        pumped = float("-inf")
        while True:
            status = self.backend.status(jid)
            if status in TERMINAL:
                pump(final=True)
                break
            now = time.monotonic()
            # output every poll_s as before: the extra checks of a short start are a status
            # read each (a Ray job's log is one more request to the head and the node)
            if now - pumped >= self.poll_s or now >= deadline:
                pump(final=False)
                pumped = now
            if now >= deadline:
                break
            time.sleep(min(next_poll_s(now - t0, self.poll_s), max(0.05, deadline - now)))
        summary = parse_summary("\n".join(tail)) if status == SUCCEEDED else None
        if status == SUCCEEDED and summary is None:
            # The summary line may have scrolled out of the tail: read the whole log once.
            full, _ = self.backend.final_logs(jid, 0)
            summary = parse_summary(full)
        return Outcome(jid, status, submitted=False, summary=summary, tail=tail[-40:],
                       pokes=state["pokes"])

    def run(self, jid: str, argv: list[str], budget_s: float,
            resources: dict[str, float] | None = None, prefix: str = "") -> Outcome:
        started = self.submit(jid, argv, resources)
        out = self.follow(jid, budget_s, prefix=prefix)
        out.submitted = started
        return out

    def stop(self, jid: str) -> bool:
        stopped = self.backend.stop(jid)
        self.emit(f"[amflow-runner] {'stopped' if stopped else 'nothing to stop for'} job {jid}")
        return stopped
