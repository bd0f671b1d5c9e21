"""The Airflow trigger that waits for an amflow job (Airflow's deferral mechanism).

An amflow task submits its step's job and defers to `AmflowJobTrigger`; the triggerer
process polls the job (a local supervised process or a Ray job: amflow.jobs
backends, amflow.jobs) without holding a worker slot or an execution-API token, and fires once the
job has ended. The task then resumes in the same try (Airflow keeps the try's start
date across a deferral), so the task's duration in the UI is the step's wall time.

Progress lines are logged here about once a minute (the triggerer's part of the task
log); the job's whole output goes into the task log when the task resumes.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from core.config import load_config
from amflow.jobs import STOPPED, TERMINAL, make_backend, next_poll_s

PROGRESS_EVERY_S = 60.0


class AmflowJobTrigger(BaseTrigger):
    def __init__(self, job_id: str, config: str, overrides: list[str], state_dir: str,
                 poll_s: float = 5.0, step_timeout_s: float = 0.0) -> None:
        super().__init__()
        self.job_id = job_id
        self.config = config
        self.overrides = list(overrides)
        self.state_dir = state_dir
        # a status check is a file read (local) or one HTTP GET (Ray): polling at least
        # every 2 s keeps the end of a step from waiting on the next poll
        self.poll_s = min(float(poll_s), 2.0)
        self.step_timeout_s = float(step_timeout_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("amflow.orchestration.trigger.AmflowJobTrigger",
                {"job_id": self.job_id, "config": self.config, "overrides": self.overrides,
                 "state_dir": self.state_dir, "poll_s": self.poll_s,
                 "step_timeout_s": self.step_timeout_s})

    def _backend(self):
        return make_backend(load_config(self.config, self.overrides), Path(self.state_dir))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        backend = await asyncio.to_thread(self._backend)
        offset, last_note = 0, time.monotonic()
        started = last_note
        while True:
            status = await asyncio.to_thread(backend.status, self.job_id)
            if status in TERMINAL:
                yield TriggerEvent({"job_id": self.job_id, "status": status})
                return
            if self.step_timeout_s > 0 and await self._timed_out(backend):
                await asyncio.to_thread(backend.stop, self.job_id)
                yield TriggerEvent({"job_id": self.job_id, "status": STOPPED,
                                    "reason": f"step exceeded runner.step_timeout_s="
                                              f"{self.step_timeout_s:g}; job stopped"})
                return
            if time.monotonic() - last_note >= PROGRESS_EVERY_S:
                text, offset = await asyncio.to_thread(backend.logs, self.job_id, offset)
                lines = text.splitlines()
                self.log.info("job %s %s%s", self.job_id, status,
                              f"; latest: {lines[-1]}" if lines else "")
                last_note = time.monotonic()
            await asyncio.sleep(next_poll_s(time.monotonic() - started, self.poll_s))

    async def _timed_out(self, backend) -> bool:
        t0 = await asyncio.to_thread(backend.submitted_at, self.job_id)
        return t0 is not None and time.time() - t0 > self.step_timeout_s

    async def on_kill(self) -> None:
        """The user killed the deferred task (marked it failed, cleared it): stop its job.
        Not called when the triggerer merely restarts or hands the trigger over."""
        backend = await asyncio.to_thread(self._backend)
        await asyncio.to_thread(backend.stop, self.job_id)
