"""The learning-curve PNG of one training, from its metrics.jsonl records.

Three panels over frames seen: training loss (per logged block) with the dev loss after
each epoch / sub-epoch; frame accuracy (training blocks and dev); the learning rate.
Labeled and unlabeled (soft-target) blocks of a scheduled-learning run are drawn in
separate colours, and fine-tuning passes are shaded.
"""
from __future__ import annotations

import io
from typing import Any, Sequence


def plot_learning_curve(records: Sequence[dict[str, Any]], title: str = "") -> bytes:
    # Deferred: matplotlib takes about a second to import; only rank 0 plots, once.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    dev = [r for r in records if r.get("kind") == "dev" and r.get("unit") is not None]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True,
                             gridspec_kw={"height_ratios": [3, 3, 1.5]})
    ax_loss, ax_acc, ax_lr = axes
    colours = {"labeled": "tab:blue", "unlabeled": "tab:orange"}
    for data in ("unlabeled", "labeled"):
        pts = [r for r in train if r.get("data") == data]
        if not pts:
            continue
        label = "labeled (CE)" if data == "labeled" else "unlabeled (distillation)"
        xs = [r["frames_seen"] for r in pts]
        style = {"ms": 3, "lw": 0.8, "color": colours[data], "label": label}
        ax_loss.plot(xs, [r["loss"] for r in pts], ".-", **style)
        ax_acc.plot(xs, [100 * r["frame_acc"] for r in pts], ".-", **style)
    if dev:
        xs = [r["frames_seen"] for r in dev]
        ax_loss.plot(xs, [r["loss"] for r in dev], "o-", color="tab:red", label="dev")
        ax_acc.plot(xs, [100 * r["frame_acc"] for r in dev], "o-", color="tab:red", label="dev")
    if train:
        ax_lr.plot([r["frames_seen"] for r in train], [r["lr"] for r in train], "-",
                   color="tab:green")
        # shade full-sequence fine-tuning
        full = [r["frames_seen"] for r in train if r.get("mode") == "full"]
        if full:
            for ax in axes:
                ax.axvspan(min(full), max(full), color="0.92", zorder=0)
            ax_loss.text(min(full), 1.0, " fine-tuning", transform=ax_loss.get_xaxis_transform(),
                         va="top", fontsize=8, color="0.4")
    ax_loss.set_ylabel("loss (CE per frame)")
    if train and min(r["loss"] for r in train) > 0:
        ax_loss.set_yscale("log")
    ax_acc.set_ylabel("frame accuracy %")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_yscale("log")
    ax_lr.set_xlabel("frames seen (all workers)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if train or dev:
        ax_loss.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
