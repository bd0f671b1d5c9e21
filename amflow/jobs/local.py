"""`runner.mode: local`: a detached process on this machine (its own session), supervised
by `python -m amflow.jobs.supervise`, which keeps its exit code and output in a job
directory under `runner.state_dir`. The job outlives the process that started it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from amflow.jobs.base import (PENDING, PROJECT_ROOT, RUNNING, STOPPED, SUCCEEDED, TERMINAL,
                              FAILED, RunnerError, read_json, write_json)


class LocalBackend:
    """Detached supervised processes; state in `<state_dir>/<job_id>/`.

    job.json (argv, cwd, pid, submitted_at), output.log (stdout+stderr), rc.json (exit
    code, written last by the supervisor; its presence means the job is over).
    """

    mode = "local"

    def __init__(self, state_dir: Path, cwd: str | None = None,
                 env: dict[str, str] | None = None):
        self.state_dir = Path(state_dir)
        self.cwd = cwd or str(PROJECT_ROOT)
        self.env = env or {}
        self._procs: dict[str, subprocess.Popen] = {}

    def _dir(self, jid: str) -> Path:
        return self.state_dir / jid

    def exists(self, jid: str) -> bool:
        return (self._dir(jid) / "job.json").exists()

    def submit(self, jid: str, argv: list[str], resources: dict[str, float] | None = None) -> bool:
        d = self._dir(jid)
        d.mkdir(parents=True, exist_ok=True)
        try:  # the lock file makes submission of one id happen once, even under races
            fd = os.open(d / "submit.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        out = open(d / "output.log", "ab")
        sup = [sys.executable, "-m", "amflow.jobs.supervise", "--job-dir", str(d), "--",
               *argv]
        proc = subprocess.Popen(sup, cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self._procs[jid] = proc
        write_json(d / "job.json", {"argv": argv, "cwd": self.cwd, "pid": proc.pid,
                                     "pgid": proc.pid, "submitted_at": time.time()})
        return True

    def _alive(self, jid: str, pid: int) -> bool:
        proc = self._procs.get(jid)
        if proc is not None:
            return proc.poll() is None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, IndexError, PermissionError):
            try:
                os.kill(pid, 0)
                return True
            except OSError:
                return False

    def status(self, jid: str) -> str:
        d = self._dir(jid)
        rc = read_json(d / "rc.json")
        if rc is not None:
            if rc.get("stopped"):
                return STOPPED
            return SUCCEEDED if rc.get("rc") == 0 else FAILED
        job = read_json(d / "job.json")
        if job is None:
            if (d / "submit.lock").exists():
                return PENDING
            raise RunnerError(f"no local job {jid} under {self.state_dir}")
        if self._alive(jid, job["pid"]):
            return RUNNING
        # The supervisor died without writing its exit code (SIGKILL, reboot).
        rc = read_json(d / "rc.json")
        if rc is not None:
            return self.status(jid)
        return FAILED

    def logs(self, jid: str, offset: int = 0, whole_lines: bool = True) -> tuple[str, int]:
        """Output from `offset` on, and the next offset. While the job runs only whole
        lines are handed out (a partial last line waits for the next read)."""
        try:
            with open(self._dir(jid) / "output.log", "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return "", offset
        end = data.rfind(b"\n") + 1 if whole_lines else len(data)
        return data[:end].decode("utf-8", "replace"), offset + end

    def final_logs(self, jid: str, offset: int = 0) -> tuple[str, int]:
        return self.logs(jid, offset, whole_lines=False)

    def stop(self, jid: str, grace_s: float = 10.0) -> bool:
        job = read_json(self._dir(jid) / "job.json")
        if job is None or self.status(jid) in TERMINAL:
            return False
        pgid = job.get("pgid", job["pid"])
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.status(jid) not in TERMINAL:
            time.sleep(0.1)
        if self.status(jid) not in TERMINAL:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            write_json(self._dir(jid) / "rc.json", {"rc": -9, "stopped": True,
                                                    "finished_at": time.time()})
        return True

    def submitted_at(self, jid: str) -> float | None:
        job = read_json(self._dir(jid) / "job.json")
        return job.get("submitted_at") if job else None

    def live_jobs(self, prefix: str) -> list[str]:
        """Ids starting with `prefix` whose job has not ended."""
        if not self.state_dir.is_dir():
            return []
        ids = sorted(d.name for d in self.state_dir.iterdir()
                     if d.name.startswith(prefix) and (d / "job.json").exists())
        return [jid for jid in ids if self.status(jid) not in TERMINAL]
