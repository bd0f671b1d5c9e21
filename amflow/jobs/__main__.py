"""`python -m amflow.jobs run|stop|status`: run a step where runner.mode says, in the
foreground, streaming its output; SIGTERM/SIGINT stops its job."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from core.config import load_config
from amflow.jobs import StepRunner, default_state_dir, make_backend
from amflow.jobs.base import resolve_config
from amflow.jobs.naming import SUMMARY_PREFIX, slug, step_command
from amflow.steps.registry import STEPS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m amflow.jobs",
        description="Run an amflow step where runner.mode says (local subprocess or Ray job), "
                    "streaming its output; SIGTERM/SIGINT stops the job.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a step to completion (submit or re-attach, follow)")
    run.add_argument("step", choices=STEPS, metavar="STEP",
                     help="a step of `amflow` (amflow.steps.registry)")
    run.add_argument("--config", default="configs/local.yaml")
    run.add_argument("--run-id", required=True)
    run.add_argument("--job-id", help="submission id (default: amflow-cli-<step>-<run-id>)")
    run.add_argument("--set", dest="overrides", action="append", default=[])
    run.add_argument("--force", action="store_true")
    for name in ("stop", "status"):
        sp = sub.add_parser(name, help=f"{name} a job by id")
        sp.add_argument("job_id")
        sp.add_argument("--config", default="configs/local.yaml")
        sp.add_argument("--set", dest="overrides", action="append", default=[])
    a, extra = parser.parse_known_args(argv)
    cfg = load_config(resolve_config(a.config), a.overrides)
    state_dir = Path(cfg.runner.state_dir or default_state_dir())
    state_dir.mkdir(parents=True, exist_ok=True)
    runner = StepRunner(make_backend(cfg, state_dir), state_dir, poll_s=cfg.runner.poll_s)
    if a.cmd == "stop":
        runner.stop(a.job_id)
        return 0
    if a.cmd == "status":
        print(runner.backend.status(a.job_id))
        return 0
    jid = a.job_id or f"amflow-cli-{slug(a.step, 24)}-{slug(a.run_id, 60)}"
    cmd = step_command(cfg.runner.command, a.step, config=a.config, run_id=a.run_id,
                       overrides=a.overrides, extra_args=extra, force=a.force)

    def on_term(signum, frame):  # noqa: ARG001
        runner.stop(jid)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    out = runner.run(jid, cmd, budget_s=float("inf"),
                     resources=dict(cfg.ray.step_resources.get(a.step, {})))
    if out.summary is not None:
        print(SUMMARY_PREFIX + json.dumps(out.summary, sort_keys=True), flush=True)
    return 0 if out.ok else 1




if __name__ == "__main__":
    sys.exit(main())
