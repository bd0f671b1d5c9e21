"""How much does the demo's orchestration cost? Its wall time against the floor of any way
of running the same steps.

floor = corpus stage + the longest path through both DAGs, each task weighted by its step's
own `wall_s` (from `_SUCCESS.json`), with ssl_student's first task after the teacher's
`train` as `make demo` chains them + simulate and report (outside Airflow either way).
No flow (the scheduler, `airflow dags test`, a shell loop) runs these steps in less.

    python scripts/demo_floor.py ROOT PREFIX DEMO_LOG
        ROOT: the demo's storage root (data), PREFIX: DEMO_PREFIX (demo),
        DEMO_LOG: `make demo`'s output (its "=== [ Ns] k/5 ..." stage lines)
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dag_tasks() -> dict[str, tuple[list[tuple[str, str]], dict[str, str]]]:
    """Per DAG: its edges, and each task's step directory (as the runner names it)."""
    sys.path.insert(0, str(ROOT / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    from amflow.orchestration.airflow_step import step_dir_for as _step_dir_name

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    return {d: ([(t.task_id, n) for t in bag.dags[d].tasks for n in t.downstream_task_ids],
                {t.task_id: _step_dir_name(t.step, t.sets) for t in bag.dags[d].tasks
                 if hasattr(t, "step")})  # not the branch gates: they run no step
            for d in ("teacher", "ssl_student")}


def step_walls(run_dir: Path, dirs: dict[str, str]) -> dict[str, float]:
    """Each task's step wall_s; tasks whose step never ran (skipped by a param) are absent."""
    out = {}
    for task, step_dir in dirs.items():
        path = run_dir / step_dir / "_SUCCESS.json"
        if path.exists():
            out[task] = float(json.loads(path.read_text())["wall_s"])
    return out


def longest_path(walls: dict[str, float], edges: list[tuple[str, str]], start: str) -> float:
    memo: dict[str, float] = {}

    def down(node: str) -> float:
        if node not in memo:
            nxt = [b for a, b in edges if a == node and b in walls]
            memo[node] = walls[node] + max((down(b) for b in nxt), default=0.0)
        return memo[node]
    return down(start)


def main() -> int:
    root, prefix, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    dags = dag_tasks()
    runs = {"teacher": f"{prefix}-teacher", "ssl_student": f"{prefix}-ssl"}
    walls = {f"{d}.{task}": wall for d, (_, dirs) in dags.items()
             for task, wall in step_walls(root / "runs" / runs[d], dirs).items()}
    all_edges = [(f"{d}.{a}", f"{d}.{b}") for d, (es, _) in dags.items() for a, b in es]
    all_edges.append(("teacher.train", "ssl_student.select"))
    path = longest_path(walls, all_edges, "teacher.select")
    text = log.read_text()
    stage = {m.group(2): int(m.group(1))
             for m in re.finditer(r"=== \[ *(\d+)s\] (\S+)", text)}
    corpus, post, demo = stage["2/5"], stage["done"] - stage["4/5"], stage["done"]
    floor = corpus + path + post
    print(f"corpus {corpus} s, DAG phase {stage['4/5'] - stage['2/5']} s (longest path of "
          f"step walls {path:.0f} s), simulate + report {post} s, demo {demo} s")
    print(f"floor {floor:.0f} s; demo / floor = {demo / floor:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
