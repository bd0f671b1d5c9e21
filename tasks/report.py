"""`amflow report`: the demo's report, opening with a table like Table II of the paper.

Reads the evaluation JSONs of the teacher, the supervised baseline and the SSL student,
every step's `_SUCCESS.json` of the runs involved, and the benchmark / simulator tables
when present; writes `runs/<run>/report/report.md` (+ `report.json` and PNGs).

The report opens with Table II in words: WER per condition of the teacher, the baseline
and the SSL student (`amflow decode` results), and the SSL student's relative WER
reduction over the baseline beside the paper's. Frame accuracy and PER follow.

Relative frame-error reduction of SSL over the baseline, per condition:
    rel_fer = (err_baseline - err_ssl) / err_baseline,  err = 1 - frame_accuracy
WERR = (WER_baseline - WER_ssl) / WER_baseline.
"""
from __future__ import annotations

import io
import json
from typing import Any, Sequence

from core.storage import Storage

CONDITIONS = ("DP1", "DP2", "DP3", "DP4", "DP5")
# Table II of the petabyte paper: the SSL student's WERR over the baseline, DP1..DP5 (%).
PAPER_WERR = {"DP1": 9.8, "DP2": 22.2, "DP3": 21.8, "DP4": 16.5, "DP5": 18.9}


def wer_table(teacher: dict | None, baseline: dict, ssl: dict) -> list[dict[str, Any]]:
    """Rows per condition (and 'all'): WER of each model, SSL's WERR, the paper's WERR."""
    rows = []
    for cond in (*CONDITIONS, "all"):
        t, b, s = (_wer(r, cond) for r in (teacher, baseline, ssl))
        if b is None or s is None:
            continue
        rows.append({"condition": cond, "teacher_wer": t, "baseline_wer": b, "ssl_wer": s,
                     "werr": (b - s) / b if b > 0 else 0.0, "paper_werr": PAPER_WERR.get(cond)})
    return rows


def render_wer_table(rows: list[dict[str, Any]]) -> str:
    out = ["| condition | teacher WER % | baseline WER % | SSL WER % | SSL WERR % | "
           "paper WERR % |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        paper = "–" if r["paper_werr"] is None else f"{r['paper_werr']:.1f}"
        out.append(f"| {r['condition']} | {pct(r['teacher_wer'])} | {pct(r['baseline_wer'])} | "
                   f"{pct(r['ssl_wer'])} | {pct(r['werr'])} | {paper} |")
    return "\n".join(out)


def sequence_wer_table(ce: dict[str, dict | None], seq: dict[str, dict | None]
                       ) -> list[dict[str, Any]]:
    """Rows per condition (and 'all'): each model's WER after CE and after sequence
    training, the relative gain of sequence training, and SSL's WERR over the baseline
    once both are sequence-trained. `ce` / `seq`: decode results by model name."""
    rows = []
    for cond in (*CONDITIONS, "all"):
        row: dict[str, Any] = {"condition": cond}
        for name in ("teacher", "baseline", "ssl"):
            c, q = _wer(ce.get(name), cond), _wer(seq.get(name), cond)
            row[f"{name}_ce"], row[f"{name}_seq"] = c, q
            row[f"{name}_gain"] = (c - q) / c if c and q is not None else None
        b, q = row["baseline_seq"], row["ssl_seq"]
        row["werr_seq"] = (b - q) / b if b and q is not None else None
        row["paper_werr"] = PAPER_WERR.get(cond)
        if b is not None or q is not None:
            rows.append(row)
    return rows


def _wer(res: dict | None, cond: str) -> float | None:
    if not res:
        return None
    return res.get("wer") if cond == "all" else res.get("per_condition", {}).get(cond)


def render_sequence_wer_table(rows: list[dict[str, Any]]) -> str:
    models = [m for m in ("teacher", "baseline", "ssl") if any(r[f"{m}_seq"] is not None
                                                               for r in rows)]
    names = {"teacher": "teacher", "baseline": "baseline", "ssl": "SSL"}
    head = ["condition"] + [f"{names[m]} {k}" for m in models
                            for k in ("CE WER %", "seq. WER %", "gain %")]
    head += ["SSL WERR after seq. %", "paper WERR %"]
    out = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for r in rows:
        cells = [r["condition"]] + [pct(r[f"{m}_{k}"]) for m in models
                                    for k in ("ce", "seq", "gain")]
        paper = "–" if r["paper_werr"] is None else f"{r['paper_werr']:.1f}"
        out.append("| " + " | ".join(cells + [pct(r["werr_seq"]), paper]) + " |")
    return "\n".join(out)


def sequence_choice_rows(selections: dict[str, dict | None]) -> list[dict[str, Any]]:
    """Per sequence-trained model (`selections`: its sequence step's `selection` metrics,
    {} for a step that shipped its last epoch unchosen): which model `amflow sequence`
    shipped, the CE model's and the shipped model's dev error, and the paired test."""
    rows = []
    for name in ("teacher", "baseline", "ssl"):
        sel = selections.get(name)
        if sel is None:
            continue
        rows.append({"model": name, "rule": sel.get("rule", "last"),
                     "epoch": sel.get("chosen_epoch"), "epochs": sel.get("epochs"),
                     "split": sel.get("split"), "ce_dev": sel.get("ce_wer"),
                     "chosen_dev": sel.get("chosen_wer"), "delta": sel.get("delta"),
                     "p": sel.get("p_mapsswe"), "last_dev": sel.get("last_wer"),
                     "rejected": sel.get("rejected")})
    return rows


def shipped_text(row: dict[str, Any]) -> str:
    """What the sequence step shipped, in words: the CE model where dev rejected every
    epoch, else the epoch dev chose (or the last one, unchosen, before the choice existed)."""
    if row["rule"] == "last":
        return f"last epoch {row['epoch'] or ''} (not chosen on dev)".replace("  ", " ")
    kept = "CE model" if row["epoch"] == 0 else f"epoch {row['epoch']} of {row['epochs']}"
    rejected = row.get("rejected")
    if rejected:  # dev's lowest epoch, whose gain the paired test called chance
        return (f"{kept} ({rejected['name']} was {100 * rejected['delta']:+.2f} on dev, "
                f"p = {rejected['p_mapsswe']:.2g}: not significant)")
    return kept + (" (dev rejected every epoch)" if row["epoch"] == 0 else "")


def render_sequence_choice(rows: list[dict[str, Any]]) -> str:
    names = {"teacher": "teacher", "baseline": "baseline", "ssl": "SSL"}
    out = ["| model | shipped (chosen on dev) | dev: CE % | dev: shipped % | change, points | "
           "p | dev: last epoch % |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        delta = "–" if r["delta"] is None else f"{100 * r['delta']:+.2f}"
        p = "–" if r["p"] is None else f"{r['p']:.3g}"
        out.append(f"| {names[r['model']]} | {shipped_text(r)} | {pct(r['ce_dev'])} | "
                   f"{pct(r['chosen_dev'])} | {delta} | {p} | {pct(r['last_dev'])} |")
    return "\n".join(out)


def relative_error_reduction(acc_base: float, acc_new: float) -> float:
    err_b, err_n = 1.0 - acc_base, 1.0 - acc_new
    return (err_b - err_n) / err_b if err_b > 0 else 0.0


def table_ii(teacher: dict, baseline: dict, ssl: dict) -> list[dict[str, Any]]:
    """Rows per condition (and 'all'): frame accuracy and PER of each model, SSL's gain."""
    rows = []
    for cond in (*CONDITIONS, "all"):
        def fa(ev: dict) -> float | None:
            return ev.get("frame_accuracy") if cond == "all" else ev.get("per_condition", {}).get(cond)

        def per(ev: dict) -> float | None:
            return ev.get("per") if cond == "all" else ev.get("per_condition_per", {}).get(cond)

        t, b, s = fa(teacher), fa(baseline), fa(ssl)
        framed = b is not None and s is not None  # none where scored by transcripts alone
        if not framed and (per(baseline) is None or per(ssl) is None):
            continue
        rows.append({"condition": cond, "teacher_fa": t, "baseline_fa": b, "ssl_fa": s,
                     "teacher_per": per(teacher), "baseline_per": per(baseline),
                     "ssl_per": per(ssl),
                     "rel_fer_reduction": relative_error_reduction(b, s) if framed else None})
    return rows


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_table_ii(rows: list[dict[str, Any]]) -> str:
    out = ["| condition | teacher FA % | baseline FA % | SSL FA % | teacher PER % | "
           "baseline PER % | SSL PER % | SSL rel. frame-error reduction % |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['condition']} | {pct(r['teacher_fa'])} | {pct(r['baseline_fa'])} | "
                   f"{pct(r['ssl_fa'])} | {pct(r['teacher_per'])} | {pct(r['baseline_per'])} | "
                   f"{pct(r['ssl_per'])} | {pct(r['rel_fer_reduction'])} |")
    return "\n".join(out)


def render_steps(steps: list[dict[str, Any]]) -> str:
    out = ["| run | step | wall s | items in | out | rejected | audio h | x real time | "
           "bytes / audio h |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in steps:
        m, c = s.get("metrics", {}), s.get("counts", {})
        def g(*keys):
            for k in keys:
                if m.get(k) is not None:
                    return m[k]
            return None
        xrt, hours, bph = g("x_real_time", "xrt"), g("audio_hours"), g("bytes_per_audio_hour")
        out.append(f"| {s['run_id']} | {s['step']} | {s.get('wall_s', 0):.1f} | {c.get('in', '')} | "
                   f"{c.get('out', '')} | {c.get('rejected', '')} | "
                   f"{'' if hours is None else f'{hours:.3f}'} | "
                   f"{'' if xrt is None else f'{xrt:.0f}'} | "
                   f"{'' if bph is None else f'{bph / 1e6:.2f} MB'} |")
    return "\n".join(out)


def read_json_or_none(storage: Storage, uri: str) -> dict | None:
    return storage.read_json(uri) if storage.exists(uri) else None


def curves_png(storage: Storage, sources: dict[str, str]) -> bytes | None:
    """One PNG with the training loss of each model, from their metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for label, uri in sources.items():
        if not storage.exists(uri):
            continue
        xs, ys = [], []
        for line in storage.read_text(uri).splitlines():
            rec = json.loads(line)
            if "loss" in rec and rec.get("kind", "train") == "train":
                xs.append(rec.get("frames_seen", rec.get("step", len(xs))))
                ys.append(rec["loss"])
        if xs:
            ax.plot(xs, ys, label=label, linewidth=1)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("frames seen")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def bar_png(rows: list[dict[str, Any]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    conds = [r["condition"] for r in rows]
    x = np.arange(len(conds))
    # PER where the evaluations had no frame reference (scored by transcripts alone)
    framed = any(r["baseline_fa"] is not None for r in rows)
    metric, ylabel = ("fa", "frame accuracy %") if framed else ("per", "phone error rate %")
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (model, label) in enumerate([("teacher", "teacher (BLSTM)"),
                                        ("baseline", "baseline student"),
                                        ("ssl", "SSL student")]):
        ax.bar(x + (i - 1) * 0.27, [100 * (r[f"{model}_{metric}"] or 0) for r in rows], 0.27,
               label=label)
    ax.set_xticks(x, conds)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def wer_section(wer_rows: list[dict], ssl_decode: dict) -> list[str]:
    """The report's WER section; `ssl_decode` is the SSL student's decode result."""
    d = ssl_decode
    graph = d.get("graph") or {}
    hclg = ("H o C o L o G" if graph.get("context") else "H o L o G")  # C: context-dependent
    classes = f", {graph['classes']} classes" if graph.get("classes") else ""
    return ["## Word error rate: SSL student vs supervised baseline (cf. Table II)", "",
            render_wer_table(wer_rows), "",
            f"Decoded with {hclg}{classes} (lexicon `{d.get('lexicon')}`, LM `{d.get('lm')}`), "
            f"acoustic scale tuned on {d.get('tune_split') or 'nothing'} per model "
            f"(SSL {d.get('acwt')}); the paper decodes with a 4-gram and sMBR-trained "
            "models, so compare the WERR, not the WER.", ""]


def sequence_section(seq_rows: list[dict], choice_rows: list[dict] | None = None
                     ) -> list[str]:
    """The sequence table (test WER, CE -> the model the sequence step shipped) and, where
    the steps recorded it, which model dev chose for each (`sequence_choice_rows`)."""
    out = ["## After sequence training (train.criterion on the labeled split; CE rows "
           "beside)", "",
           render_sequence_wer_table(seq_rows), "",
           "seq.: the model `amflow sequence` shipped, chosen on dev among the CE model and "
           "every epoch (the CE model itself where dev rejected every epoch: gain 0). "
           "gain: relative WER reduction over the same model's CE / distilled training "
           "(Kaldi's usual: ~10 %). The paper's Table II compares sMBR-trained models: its "
           "WERR column is beside ours.", ""]
    if choice_rows:
        out += ["Chosen on dev (WER on a fixed dev subset at each model's tuned acwt; "
                "frame error where the step had no LM; p: paired MAPSSWE test of the "
                "shipped model against the CE model on dev):", "",
                render_sequence_choice(choice_rows), ""]
    return out
