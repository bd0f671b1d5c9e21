"""A stand-in for the `amflow` CLI, to test orchestration without the pipeline's cost.

Same command line and contract as the real one (`<step> --config F --run-id ID [--set k=v]
[--force] [...]`): it loads and validates the config the same way, prints progress lines
on stderr, writes `<root>/runs/<id>/<step>[-<tag>]/_SUCCESS.json` and ends with
`AMFLOW_SUMMARY <json>` on stdout. What each step does is read from the JSON file named
by $AMFLOW_FAKE_PLAN: {"<step>": {"seconds": s, "fail_times": n, "lines": k, "error": m}}
(defaults: 0.5 s, never fails, 3 progress lines; `error` fails every time the way the
real CLI reports a StepError, `amflow <step>: error: m`; `"keep": true` returns the
step's existing summary, as the real steps do, unless --force). Every call is appended to
`<root>/runs/<id>/_calls.jsonl`, so tests can count how often a step ran and with what.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from core.config import load_config


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds")


def _png(width: int, height: int) -> bytes:
    """A valid grey PNG (a plot stand-in), without an imaging library."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    rows = b"".join(b"\x00" + bytes([128]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("step")
    p.add_argument("--config")
    p.add_argument("--run-id")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--force", action="store_true")
    p.add_argument("--model")
    p.add_argument("--out")
    args, _ = p.parse_known_args()
    cfg = load_config(args.config, args.overrides)
    plan = {}
    if os.environ.get("AMFLOW_FAKE_PLAN"):
        plan = json.loads(Path(os.environ["AMFLOW_FAKE_PLAN"]).read_text())
    spec = {"seconds": 0.5, "fail_times": 0, "lines": 3, **plan.get(args.step, {})}
    root = Path(cfg.storage.root)
    if args.step == "corpus":
        run_dir = root / "runs" / "_corpus"
        step_dir = Path(cfg.data.corpus)
    else:
        run_dir = root / "runs" / args.run_id
        owner = "train" if args.step == "sequence" else args.step  # sequence-<train.tag>
        tag = getattr(getattr(cfg, owner, None), "tag", "") or ""
        step_dir = run_dir / (f"{args.step}-{tag}" if tag else args.step)
    run_dir.mkdir(parents=True, exist_ok=True)
    calls = run_dir / "_calls.jsonl"
    previous = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    n_before = sum(1 for c in previous if c["step"] == args.step)
    with open(calls, "a") as f:
        f.write(json.dumps({"step": args.step, "argv": sys.argv[1:], "pid": os.getpid(),
                            "t": time.time(), "force": args.force}) + "\n")

    def on_term(signum, frame):  # noqa: ARG001
        print(f"[{args.step}] terminated by signal {signum}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    done = step_dir / "_SUCCESS.json"
    if spec.get("keep") and not args.force and done.exists():
        # what the real steps do with a finished step and no --force: return its summary
        print(f"[{args.step}] {done} exists, nothing to do", file=sys.stderr, flush=True)
        print("AMFLOW_SUMMARY " + done.read_text().strip(), flush=True)
        return 0
    print(f"[{args.step}] fake amflow {' '.join(sys.argv[1:])}", file=sys.stderr, flush=True)
    t0 = time.time()
    n = max(1, int(spec["lines"]))
    for i in range(n):
        time.sleep(float(spec["seconds"]) / n)
        print(f"[{args.step}] {i + 1}/{n} shards ({100 * (i + 1) // n}%)", file=sys.stderr,
              flush=True)
    if spec.get("error"):  # what the real CLI prints for a StepError (no retry helps)
        print(f"amflow {args.step}: error: {spec['error']}", file=sys.stderr, flush=True)
        return 1
    if n_before < int(spec["fail_times"]):
        print(f"[{args.step}] error: injected failure {n_before + 1}", file=sys.stderr, flush=True)
        return 1
    step_dir.mkdir(parents=True, exist_ok=True)
    if args.step in ("train", "sequence"):
        (step_dir / "model.pt").write_bytes(b"fake model")
        (step_dir / "curves.png").write_bytes(_png(64, 32))
    out_uri = ""
    if args.step == "evaluate":  # the real step's result.json layout, made-up numbers
        conds = {f"DP{i}": round(0.8 - 0.05 * i, 4) for i in range(1, 6)}
        out_uri = str(step_dir / "result.json")
        Path(out_uri).write_text(json.dumps({
            "frame_accuracy": 0.65, "per": 0.4, "per_condition": conds,
            "per_condition_per": {c: round(1 - a, 4) for c, a in conds.items()}}))
    if args.step == "decode":  # the real step's result.json and metrics keys
        conds = {f"DP{i}": round(0.1 + 0.02 * i, 4) for i in range(1, 6)}
        out_uri = str(step_dir / "result.json")
        Path(out_uri).write_text(json.dumps({
            "wer": 0.1661, "wer_ci95": [0.1423, 0.1871], "per_condition": conds,
            "per_condition_ci95": {c: [round(w - 0.02, 4), round(w + 0.02, 4)]
                                   for c, w in conds.items()}}))
    summary = {"step": args.step, "run_id": args.run_id, "uri": str(step_dir),
               "wall_s": round(time.time() - t0, 3), "host": socket.gethostname(),
               "started_at": _iso(t0), "finished_at": _iso(time.time()),
               "counts": {"in": 10, "out": 9, "rejected": 1}, "bytes": 1234,
               "metrics": {"frames_per_s": 1000.0, "hours": cfg.select.hours,
                           "algorithm": cfg.train.algorithm, "workers": cfg.train.workers,
                           "teacher": cfg.targets.teacher, "model_arg": args.model or "",
                           "forced": args.force},
               "inputs": {"config": args.config}}
    if out_uri:
        summary["out"] = out_uri
        result = json.loads(Path(out_uri).read_text())
        if args.step == "decode":
            result = {"wer": result["wer"], "wer_ci95": result["wer_ci95"],
                      "per_condition_wer": result["per_condition"]}
        summary["metrics"].update(result)
    (step_dir / "_SUCCESS.json").write_text(json.dumps(summary))
    from amflow.summary_line import human_summary  # as amflow.cli ends a step

    print(human_summary(args.step, summary), flush=True)
    print("AMFLOW_SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
