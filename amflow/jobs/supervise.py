"""`python -m amflow.jobs.supervise --job-dir D -- CMD...`: the process a local job is.

It runs CMD, keeps its exit code in D/rc.json and turns SIGTERM into a recorded stop. A
module of its own, which the package does not import: run with -m, a module that
amflow.jobs already imported would run twice (runpy's RuntimeWarning in every job log).
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from amflow.jobs.base import write_json


def _supervise(job_dir: Path, argv: list[str]) -> int:
    """Run argv, keep its exit code in rc.json; SIGTERM stops it and records 'stopped'."""
    stopping = {"flag": False}
    child = subprocess.Popen(argv)

    def on_term(signum, frame):  # noqa: ARG001
        stopping["flag"] = True
        try:
            child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    rc = child.wait()
    write_json(job_dir / "rc.json", {"rc": rc, "stopped": stopping["flag"],
                                      "finished_at": time.time()})
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m amflow.jobs.supervise")
    p.add_argument("--job-dir", required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv[1:] if argv[:1] == ["_supervise"] else argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    return _supervise(Path(a.job_dir), cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
