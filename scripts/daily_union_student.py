"""A student trained on the union of daily_data's partitions against one trained on a
snapshot of the same data: test WER of each with its 95 % CI, and their paired difference.

    python scripts/daily_union_student.py --teacher-run RUN [--config configs/tiny.yaml]
                                          [--prefix dus] [--set key=value ...]

RUN is a finished teacher run of the same config (`make quickstart` makes
`quickstart-<time>-teacher`). Both students use its teacher and the config's SSL recipe:

  snapshot   one run: select (labeled + unlabeled) -> align -> features -> lm -> targets
             -> repartition -> train -> decode, as the quickstart's SSL stages;
  union      every day of the corpus as daily_data's interval partition (select ->
             features -> targets of that day, run `<daily.dataset>-YYYY-MM-DD`), then a
             student run over the window of all of them (`repartition.from_date/to_date`):
             select (labeled) -> align -> features -> lm -> repartition -> train -> decode.

The steps run in this process, as `amflow <step>` would run them, on one local Ray. The
two decodes are then compared by `amflow compare` (paired bootstrap over utterances).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)  # configs name ./data relative to the project

from amflow.cli import SUMMARY_PREFIX, main as amflow  # noqa: E402
from amflow.orchestration.intervals import interval_overrides  # noqa: E402
from core.config import load_config  # noqa: E402
from tasks.intervals import Interval  # noqa: E402

STUDENT_STEPS = ("select", "align", "features", "lm")


def _step(step: str, config: str, run_id: str | None, sets: list[str], *extra: str,
          show: bool = False) -> dict:
    """`amflow STEP --config C --run-id R --set ...` in this process: its summary (and,
    with `show`, what it printed for people)."""
    argv = [step, "--config", config, *(["--run-id", run_id] if run_id else []), *extra,
            *[a for s in sets for a in ("--set", s)], "--log-level", "WARNING"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = amflow(argv)
    if rc != 0:
        raise SystemExit(f"amflow {' '.join(argv)} failed (exit {rc})")
    lines = out.getvalue().splitlines()
    if show:
        print("\n".join(x for x in lines if not x.startswith(SUMMARY_PREFIX)))
    line = [x for x in lines if x.startswith(SUMMARY_PREFIX)][-1]
    return json.loads(line[len(SUMMARY_PREFIX):])


def _days(corpus: Path) -> list[str]:
    return sorted(p.name.split("=", 1)[1] for p in (corpus / "metadata").iterdir()
                  if p.name.startswith("date=") and any(p.rglob("*.jsonl")))


def _snapshot(config: str, run_id: str, sets: list[str]) -> dict:
    for step in (*STUDENT_STEPS, "targets", "repartition", "train"):
        _step(step, config, run_id, sets)
    return _step("decode", config, run_id, sets, "--split", "test")


def _partitions(config: str, sets: list[str], days: list[str]) -> dict[str, float]:
    """Each day as daily_data makes it (its run id and select keys: the DAG's own
    interval_overrides): {day: seconds}."""
    took = {}
    for day in days:
        start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc)
        run_id, keys = interval_overrides(config, sets,
                                          Interval(start, start + dt.timedelta(days=1)))
        t0 = time.perf_counter()
        for step in ("select", "features", "targets"):
            _step(step, config, run_id, [*sets, *keys])
        took[day] = round(time.perf_counter() - t0, 1)
    return took


def _union(config: str, run_id: str, sets: list[str], days: list[str]) -> dict:
    window = [*sets, f"repartition.from_date={days[0]}", f"repartition.to_date={days[-1]}"]
    for step in (*STUDENT_STEPS, "repartition", "train"):
        _step(step, config, run_id, window)
    return _step("decode", config, run_id, window, "--split", "test")


def _wer(decode: dict) -> dict:
    m = decode["metrics"]
    return {k: m.get(k) for k in ("wer", "wer_ci95", "words", "utterances") if k in m}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher-run", required=True)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--prefix", default="dus")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    cfg = load_config(args.config, args.sets)
    root = cfg.storage.root
    teacher = f"{os.path.abspath(root)}/runs/{args.teacher_run}/train-teacher/model.pt"
    if not Path(teacher).exists():
        raise SystemExit(f"no teacher at {teacher}: run `make quickstart` (or name a finished "
                         f"teacher run of {args.config} with --teacher-run)")
    days = _days(Path(cfg.data.corpus))
    sets = [*args.sets, "train.model=student", "train.regime=ssl", f"targets.teacher={teacher}"]
    from core.raycluster import init_ray

    init_ray(cfg)  # paid once, by neither
    t0 = time.perf_counter()
    snap = _snapshot(args.config, f"{args.prefix}-snapshot", sets)
    snap_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_day = _partitions(args.config, sets, days)
    union = _union(args.config, f"{args.prefix}-union", sets, days)
    union_s = time.perf_counter() - t0
    compared = _step("compare", args.config, None, args.sets, f"{args.prefix}-snapshot",
                     f"{args.prefix}-union", show=True)
    print(json.dumps({
        "days": len(days), "teacher": teacher,
        "snapshot": {**_wer(snap), "wall_s": round(snap_s, 1)},
        "union": {**_wer(union), "wall_s": round(union_s, 1),
                  "partitions_s": round(sum(per_day.values()), 1)},
        "compare": compared.get("metrics", compared),
    }, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
