"""Per-task overhead of runner.mode=container vs local, on a short step, side by side.

    .venv/bin/python infra/image/overhead.py [--repeat 3] [--image localhost/amflow:0.1.0]

Builds the tiny corpus (corpus.hours=0.05) once, then runs `amflow select` (a sub-second
step) through the job runner (amflow.jobs.StepRunner, as an Airflow task does) alternately
in local and container mode, `--repeat` times each, and prints per mode the task's wall
time (submit to outcome), the step's own wall_s, their difference (the overhead) and the
container/local ratio of the medians; plus a bare `podman run --rm IMAGE true`.
Needs the image (`make image`). Numbers are noisy on a shared machine: alternate, repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# local mode runs `amflow` from the project's venv, as `make` does
os.environ["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

from core.config import load_config  # noqa: E402 - after the path of a source checkout
from amflow.jobs import StepRunner, make_backend, step_command  # noqa: E402
from amflow.jobs.container import CONTAINERS_CONF, default_image  # noqa: E402

CONFIG = "configs/local.yaml"


def run_step(base: Path, mode: str, step: str, run_id: str | None, image: str) -> dict:
    sets = [f"storage.root={base / 'store'}", f"data.corpus={base / 'corpus'}",
            "corpus.hours=0.05", "select.splits=labeled,unlabeled,dev,test",
            f"runner.mode={mode}", f"runner.image={image}"]
    state = base / f"jobs-{mode}"
    cfg = load_config(ROOT / CONFIG, sets)
    runner = StepRunner(make_backend(cfg, state), state, poll_s=0.5, emit=lambda line: None)
    argv = step_command(cfg.runner.command, step, config=CONFIG, run_id=run_id, overrides=sets)
    t0 = time.perf_counter()
    out = runner.run(f"{mode}-{step}-{run_id}", argv, budget_s=600)
    task = time.perf_counter() - t0
    if not out.ok:
        raise SystemExit(f"{mode} {step} ended {out.status}:\n" + "\n".join(out.tail))
    return {"task_s": task, "step_s": float(out.summary.get("wall_s", 0.0))}


def bare_start_s(image: str) -> float:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    t0 = time.perf_counter()
    subprocess.run(["podman", "run", "--rm", "--network=none", image, "true"], env=env,
                   check=True)
    return time.perf_counter() - t0


def summarize(rows: list[dict]) -> dict:
    task = statistics.median(r["task_s"] for r in rows)
    step = statistics.median(r["step_s"] for r in rows)
    return {"task_s": round(task, 2), "step_s": round(step, 2), "overhead_s": round(task - step, 2),
            "runs": [{k: round(v, 2) for k, v in r.items()} for r in rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--image", default=default_image())
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="amflow-overhead-") as tmp:
        base = Path(tmp)
        run_step(base, "local", "corpus", None, a.image)
        rows: dict[str, list[dict]] = {"local": [], "container": []}
        for i in range(a.repeat):
            for mode in ("local", "container"):
                rows[mode].append(run_step(base, mode, "select", f"{mode}{i}", a.image))
        report = {mode: summarize(r) for mode, r in rows.items()}
    report["ratio_task_s"] = round(report["container"]["task_s"] / report["local"]["task_s"], 2)
    report["bare_podman_run_true_s"] = round(bare_start_s(a.image), 2)
    report["image"] = a.image
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
