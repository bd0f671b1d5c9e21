"""Every day of a corpus as daily_data's interval partitions (select -> features -> targets
per day, one day after another: a backfill with max_active_runs 1, without Airflow) against
one snapshot run of the same days (one interval spanning them all): wall time of each, and
whether they hold the same utterances and frames. Then a no-op pass over the partitions
(every step handed back) and its time per interval.

    python scripts/daily_vs_snapshot.py --out /tmp/dvs [--set corpus.hours=0.05 ...]

The steps run in this process on one local Ray (as the Airflow tasks join one head), each
interval with the keys daily_data gives it (so a day below `daily.inline_hours` of audio
runs without Ray; `--set daily.inline_hours=0` measures every day on Ray); a random
10-class teacher scores (its targets are not the point here, their cost is).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amflow.orchestration.intervals import interval_overrides  # noqa: E402
from amflow.steps import features, select, targets  # noqa: E402
from tasks.intervals import Interval  # noqa: E402
from core.config import Config, load_config  # noqa: E402
from core.runs import StepContext  # noqa: E402

STEPS = (("select", select), ("features", features), ("targets", targets))


def _teacher(cfg: Config, path: Path) -> str:
    import torch

    from core.storage import Storage
    from training.checkpoint import save_model
    from training.models import TeacherBLSTM

    torch.manual_seed(0)
    save_model(Storage(cfg.storage), str(path), TeacherBLSTM(192, 16, 1, 10),
               cmvn={"count": 1, "sum": [0.0] * 192, "sumsq": [1.0] * 192},
               phones=[f"p{i}" for i in range(10)], features={})
    return str(path)


def _chain(base: list[str], run_id: str, start: str, end: str,
           extra: tuple[str, ...] = ()) -> tuple[float, dict]:
    """select -> features -> targets of one interval [start, end) with the keys daily_data
    gives it (`interval_overrides`: daily.* as select.* and ray.inline_hours): (wall s,
    summaries, each with its step's wall time as `_s`)."""
    interval = Interval(*(dt.datetime.fromisoformat(d).replace(tzinfo=dt.timezone.utc)
                          for d in (start, end)))
    config = str(ROOT / "configs" / "local.yaml")
    keys = interval_overrides(config, base, interval)[1]
    cfg = load_config(config, [*base, *keys, *extra])
    t0 = time.perf_counter()
    out = {}
    for name, mod in STEPS:
        t = time.perf_counter()
        out[name] = {**mod.run(StepContext(cfg, run_id, name)), "_s": time.perf_counter() - t}
    return time.perf_counter() - t0, out


def _per_step(chains: list[dict]) -> dict[str, float]:
    """Mean wall seconds of each step over `chains` (summaries as _chain returns them)."""
    return {name: round(sum(c[name]["_s"] for c in chains) / len(chains), 2)
            for name, _ in STEPS}


def _days(corpus: Path) -> list[str]:
    return sorted(p.name.split("=", 1)[1] for p in (corpus / "metadata").iterdir()
                  if any(p.rglob("*.jsonl")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    from tasks.corpus import build_corpus

    store, corpus = args.out / "store", args.out / "corpus"
    cfg = load_config(ROOT / "configs" / "local.yaml", [f"storage.root={store}", *args.sets])
    if not (corpus / "_SUCCESS.json").exists():
        build_corpus(cfg, str(corpus), use_ray=False)
    base = [f"storage.root={store}", f"data.corpus={corpus}", *args.sets, "targets.actors=1",
            "targets.fidelity_sample_frames=100",
            f"targets.teacher={_teacher(cfg, args.out / 'teacher.pt')}"]
    days = _days(corpus)
    nxt = [(dt.date.fromisoformat(d) + dt.timedelta(days=1)).isoformat() for d in days]
    from core.raycluster import init_ray

    init_ray(load_config(ROOT / "configs" / "local.yaml", base))  # paid once, by neither
    snap_s, snap = _chain(base, "snapshot", days[0], nxt[-1])
    # the snapshot in one process too: the backfill is held to the faster of the two
    inline_s = _chain(base, "snapshot-inline", days[0], nxt[-1], ("ray.inline_hours=1e9",))[0]
    daily = [_chain(base, f"daily-{d}", d, n) for d, n in zip(days, nxt)]
    noop = [_chain(base, f"daily-{d}", d, n)[0] for d, n in zip(days, nxt)]
    backfill_s = sum(s for s, _ in daily)
    report = {
        "days": len(days), "snapshot_s": round(snap_s, 1),
        "snapshot_inline_s": round(inline_s, 1), "backfill_s": round(backfill_s, 1),
        "ratio": round(backfill_s / min(snap_s, inline_s), 2),
        "noop_s_per_interval": round(sum(noop) / len(noop), 2),
        # where an interval's time goes: a day's steps against the snapshot's
        "step_s": {"snapshot": _per_step([snap]), "per_day": _per_step([o for _, o in daily])},
        # where each ran: in the step's process (below daily.inline_hours) or on Ray
        "executor": {"snapshot": snap["features"]["metrics"].get("executor"),
                     "days": sorted({o["features"]["metrics"].get("executor", "-")
                                     for _, o in daily})},
        "utterances": {"snapshot": snap["targets"]["counts"]["out"],
                       "days": sum(o["targets"]["counts"]["out"] for _, o in daily)},
        "frames": {"snapshot": snap["targets"]["metrics"].get("frames", 0),
                   "days": sum(o["targets"]["metrics"].get("frames", 0) for _, o in daily)},
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
