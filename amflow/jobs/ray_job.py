"""`runner.mode: ray_job`: a Ray job submitted through `ray.job_submission.JobSubmissionClient`
to `runner.ray_dashboard`; the driver is placed on the step's pool by
`ray.step_resources[step]` (as `entrypoint_resources`)."""
from __future__ import annotations

import shlex
import time

from amflow.jobs.base import TERMINAL


class RayJobBackend:
    """Ray jobs through the dashboard's job-submission API."""

    mode = "ray_job"

    def __init__(self, address: str, cwd: str | None = None, env: dict[str, str] | None = None):
        from ray.job_submission import JobSubmissionClient

        self.address = address
        self.cwd = cwd
        self.env = env or {}
        self.client = JobSubmissionClient(address)

    def exists(self, jid: str) -> bool:
        try:
            self.client.get_job_info(jid)
            return True
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc) or "not found" in str(exc).lower():
                return False
            raise

    def entrypoint(self, argv: list[str]) -> str:
        cmd = shlex.join(argv)
        return f"cd {shlex.quote(self.cwd)} && {cmd}" if self.cwd else cmd

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        if self.exists(jid):
            return False
        env = {"PYTHONUNBUFFERED": "1", **self.env}
        try:
            self.client.submit_job(entrypoint=self.entrypoint(argv), submission_id=jid,
                                   runtime_env={"env_vars": env},
                                   entrypoint_resources=resources or None,
                                   metadata={"amflow_job": jid})
        except RuntimeError as exc:
            if "already exists" in str(exc):
                return False
            raise
        return True

    def status(self, jid: str) -> str:
        return str(self.client.get_job_status(jid))

    def logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        text = self.client.get_job_logs(jid)
        new = text[offset:]
        end = new.rfind("\n") + 1
        return new[:end], offset + end

    def final_logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        text = self.client.get_job_logs(jid)
        return text[offset:], len(text)

    def stop(self, jid: str, grace_s: float = 30.0) -> bool:
        try:
            if self.status(jid) in TERMINAL:
                return False
            stopped = self.client.stop_job(jid)
        except RuntimeError:
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.status(jid) not in TERMINAL:
            time.sleep(0.5)
        return stopped

    def submitted_at(self, jid: str) -> float | None:
        info = self.client.get_job_info(jid)
        return info.start_time / 1000.0 if info.start_time else None

    def live_jobs(self, prefix: str) -> list[str]:
        """Ids starting with `prefix` whose job has not ended."""
        return sorted(j.submission_id for j in self.client.list_jobs()
                      if (j.submission_id or "").startswith(prefix)
                      and str(j.status) not in TERMINAL)
