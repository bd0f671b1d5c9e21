"""The short human line a step prints just before its `AMFLOW_SUMMARY <json>` line.

The JSON line is the machine's (the runner parses it; Airflow keeps it as XCom) and runs
to thousands of characters, cut at the edge of a task log. The line before it is for
people: `amflow decode: WER 16.6 % (95 % CI 14.2-18.7), 364 in, 360 out, 4 rejected,
12.3 s`: the step's headline metrics as percentages (WER with its confidence interval
where the step has one), its counts and its wall time.
"""
from __future__ import annotations

from typing import Any

# (metric key, label): rates shown as percentages, in this order
RATES = (("wer", "WER"), ("frame_accuracy", "FA"), ("per", "PER"), ("ser", "SER"),
         ("dev_frame_acc", "dev FA"))


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def _rate(metrics: dict[str, Any], key: str, label: str) -> str:
    v = metrics.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return ""
    text = f"{label} {_pct(v)} %"
    ci = metrics.get(f"{key}_ci95")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(
            isinstance(x, (int, float)) for x in ci):
        text += f" (95 % CI {_pct(ci[0])}-{_pct(ci[1])})"
    return text


def human_summary(step: str, summary: dict[str, Any]) -> str:
    """One short line saying what the step did (see the module doc)."""
    metrics = summary.get("metrics") if isinstance(summary.get("metrics"), dict) else {}
    parts = [t for t in (_rate(metrics, k, label) for k, label in RATES) if t]
    counts = summary.get("counts") if isinstance(summary.get("counts"), dict) else {}
    parts += [f"{counts[k]:,} {k}" for k in ("in", "out", "rejected")
              if isinstance(counts.get(k), int)]
    wall = summary.get("wall_s")
    if isinstance(wall, (int, float)):
        parts.append(f"{wall:.1f} s")
    return f"amflow {step}: " + (", ".join(parts) if parts else "done") + _size(summary)


def _size(summary: dict[str, Any]) -> str:
    """A training's model size and why, and the epochs train.min_updates gave it."""
    size = summary.get("model_size")
    if not isinstance(size, dict) or "why" not in size:
        return ""
    budget = summary.get("metrics", {}).get("min_updates")
    return f"; model size {size['why']}" + (f"; {budget_line(budget)}" if budget else "")


def budget_line(derived: dict[str, Any]) -> str:
    """`train.min_updates 2,000 / 59 minibatches an epoch -> 34 epochs (train.epochs 16)`."""
    return (f"train.min_updates {derived['min_updates']:,} / "
            f"{derived['minibatches_per_epoch']:,} minibatches an epoch -> "
            f"{derived['epochs']} epochs (train.epochs {derived['train_epochs']})")
