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
from typing import Any

from amflow.runs import SUCCESS, StepContext, StepError
from amflow.storage import join
from decoding.compare import significance_section

CONDITIONS = ("DP1", "DP2", "DP3", "DP4", "DP5")
STEP_ORDER = ("corpus", "select", "features", "targets", "repartition", "lm", "train-teacher",
              "train-baseline", "train", "evaluate-teacher", "evaluate-baseline", "evaluate",
              "decode-teacher", "decode-baseline", "decode", "sequence-teacher",
              "sequence-baseline", "sequence", "evaluate-sequence-teacher",
              "evaluate-sequence-baseline", "evaluate-sequence", "decode-sequence-teacher",
              "decode-sequence-baseline", "decode-sequence", "simulate")
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
        out.append(f"| {r['condition']} | {_pct(r['teacher_wer'])} | {_pct(r['baseline_wer'])} | "
                   f"{_pct(r['ssl_wer'])} | {_pct(r['werr'])} | {paper} |")
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
        cells = [r["condition"]] + [_pct(r[f"{m}_{k}"]) for m in models
                                    for k in ("ce", "seq", "gain")]
        paper = "–" if r["paper_werr"] is None else f"{r['paper_werr']:.1f}"
        out.append("| " + " | ".join(cells + [_pct(r["werr_seq"]), paper]) + " |")
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
        if b is None or s is None:
            continue
        rows.append({"condition": cond, "teacher_fa": t, "baseline_fa": b, "ssl_fa": s,
                     "teacher_per": per(teacher), "baseline_per": per(baseline),
                     "ssl_per": per(ssl), "rel_fer_reduction": relative_error_reduction(b, s)})
    return rows


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_table_ii(rows: list[dict[str, Any]]) -> str:
    out = ["| condition | teacher FA % | baseline FA % | SSL FA % | teacher PER % | "
           "baseline PER % | SSL PER % | SSL rel. frame-error reduction % |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['condition']} | {_pct(r['teacher_fa'])} | {_pct(r['baseline_fa'])} | "
                   f"{_pct(r['ssl_fa'])} | {_pct(r['teacher_per'])} | {_pct(r['baseline_per'])} | "
                   f"{_pct(r['ssl_per'])} | {_pct(r['rel_fer_reduction'])} |")
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


def _read_json(ctx: StepContext, uri: str) -> dict | None:
    return ctx.storage.read_json(uri) if ctx.storage.exists(uri) else None


def _run_steps(ctx: StepContext, run_id: str) -> list[dict[str, Any]]:
    base = join(ctx.cfg.storage.root, "runs", run_id)
    found = []
    for uri in ctx.storage.list(base, suffix=SUCCESS, recursive=True):
        rel = uri[len(base) + 1:]
        if rel.count("/") != 1 or rel.startswith("report/") or "_shards" in rel:
            continue
        found.append(ctx.storage.read_json(uri))
    order = {name: i for i, name in enumerate(STEP_ORDER)}
    return sorted(found, key=lambda s: (order.get(s.get("step", ""), 99), s.get("step", "")))


def _curves_png(ctx: StepContext, sources: dict[str, str]) -> bytes | None:
    """One PNG with the training loss of each model, from their metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for label, uri in sources.items():
        if not ctx.storage.exists(uri):
            continue
        xs, ys = [], []
        for line in ctx.storage.read_text(uri).splitlines():
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


def _bar_png(rows: list[dict[str, Any]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    conds = [r["condition"] for r in rows]
    x = np.arange(len(conds))
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (key, label) in enumerate([("teacher_fa", "teacher (BLSTM)"),
                                      ("baseline_fa", "baseline student"),
                                      ("ssl_fa", "SSL student")]):
        ax.bar(x + (i - 1) * 0.27, [100 * (r[key] or 0) for r in rows], 0.27, label=label)
    ax.set_xticks(x, conds)
    ax.set_ylabel("frame accuracy %")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    rc = ctx.cfg.report
    teacher_run = rc.teacher_run or ctx.run_id
    root = join(ctx.cfg.storage.root, "runs")
    evals = {
        "teacher": rc.teacher_eval or join(root, teacher_run, "evaluate-teacher", "result.json"),
        "baseline": rc.baseline_eval or join(root, teacher_run, "evaluate-baseline", "result.json"),
        "ssl": rc.ssl_eval or join(root, ctx.run_id, "evaluate", "result.json"),
    }
    loaded = {k: _read_json(ctx, v) for k, v in evals.items()}
    missing = [f"{k} ({evals[k]})" for k, v in loaded.items() if v is None]
    if loaded["baseline"] is None or loaded["ssl"] is None:
        raise StepError("report needs the baseline and SSL evaluations; missing: " + ", ".join(missing))
    rows = table_ii(loaded["teacher"] or {}, loaded["baseline"], loaded["ssl"])
    decodes = {
        "teacher": join(root, teacher_run, "decode-teacher", "result.json"),
        "baseline": join(root, teacher_run, "decode-baseline", "result.json"),
        "ssl": join(root, ctx.run_id, "decode", "result.json")}
    decoded = {k: _read_json(ctx, v) for k, v in decodes.items()}
    wer_rows = (wer_table(decoded["teacher"], decoded["baseline"], decoded["ssl"])
                if decoded["baseline"] and decoded["ssl"] else [])
    seq_decodes = {
        "teacher": join(root, teacher_run, "decode-sequence-teacher", "result.json"),
        "baseline": join(root, teacher_run, "decode-sequence-baseline", "result.json"),
        "ssl": join(root, ctx.run_id, "decode-sequence", "result.json")}
    seq_decoded = {k: _read_json(ctx, v) for k, v in seq_decodes.items()}
    seq_rows = (sequence_wer_table(decoded, seq_decoded)
                if any(seq_decoded.values()) else [])
    runs = [teacher_run] if teacher_run == ctx.run_id else [teacher_run, ctx.run_id]
    steps = [s for r in runs for s in _run_steps(ctx, r)]
    sig_md, significance = significance_section(ctx.storage, decodes, seq_decodes)

    parts = ["# amflow report", "",
             f"Runs: teacher/baseline `{teacher_run}`, SSL student `{ctx.run_id}`. "
             "Frame accuracy (FA) and phone error rate (PER, greedy collapse of frame outputs) "
             "on the test split (speakers unseen in training), per far-field condition.", ""]
    if wer_rows:
        d = decoded["ssl"]
        parts += ["## Word error rate: SSL student vs supervised baseline (cf. Table II)", "",
                  render_wer_table(wer_rows), "",
                  f"Decoded with H o L o G (lexicon `{d.get('lexicon')}`, LM `{d.get('lm')}`), "
                  f"acoustic scale tuned on {d.get('tune_split') or 'nothing'} per model "
                  f"(SSL {d.get('acwt')}); the paper decodes with a 4-gram and sMBR-trained "
                  "models, so compare the WERR, not the WER.", ""]
    if seq_rows:
        parts += ["## After sequence training (train.criterion on the labeled split; CE rows "
                  "beside)", "",
                  render_sequence_wer_table(seq_rows), "",
                  "gain: relative WER reduction of sequence training over the same model's "
                  "CE / distilled training (Kaldi's usual: ~10 %). The paper's Table II "
                  "compares sMBR-trained models: its WERR column is beside ours.", ""]
    parts += sig_md  # CIs and paired tests (decoding/compare.py)
    parts += ["## Frame accuracy and phone error rate (cf. Table II)", "",
              render_table_ii(rows), "", "![frame accuracy](accuracy.png)", ""]
    gains = [r["rel_fer_reduction"] for r in rows if r["condition"] in CONDITIONS[1:]]
    if gains:
        parts += [f"SSL relative frame-error reduction in DP2..DP5: min {_pct(min(gains))} %, "
                  f"max {_pct(max(gains))} %.", ""]
    curves = _curves_png(ctx, {
        "teacher": join(root, teacher_run, "train-teacher", "metrics.jsonl"),
        "baseline": join(root, teacher_run, "train-baseline", "metrics.jsonl"),
        "SSL student": join(root, ctx.run_id, "train", "metrics.jsonl")})
    if curves:
        ctx.storage.write_bytes(ctx.path("learning_curves.png"), curves)
        parts += ["## Learning curves", "", "![learning curves](learning_curves.png)", ""]
    for title, rel in [("Distributed trainers (cf. Table I)", "bench/trainers.md"),
                       ("Scaling simulator (cf. HTM paper Table 1)", "simulate/table.md")]:
        for r in runs:
            uri = join(root, r, rel)
            if ctx.storage.exists(uri):
                parts += [f"## {title}", "", ctx.storage.read_text(uri), ""]
                break
    parts += ["## Steps: timings, throughput, storage", "", render_steps(steps), ""]
    ctx.storage.write_bytes(ctx.path("accuracy.png"), _bar_png(rows))
    md = "\n".join(parts)
    ctx.storage.write_text(ctx.path("report.md"), md)
    ctx.storage.write_json(ctx.path("report.json"), {"table_ii": rows, "table_ii_wer": wer_rows,
                                                     "table_ii_wer_sequence": seq_rows,
                                                     "evaluations": evals, "decodes": decodes,
                                                     "sequence_decodes": seq_decodes,
                                                     "significance": significance,
                                                     "steps": steps})
    print(md)
    metrics = {"table_ii": rows, "table_ii_wer": wer_rows, "table_ii_wer_sequence": seq_rows,
               "report": ctx.path("report.md")}
    return ctx.finish(inputs=evals, counts={"in": len(rows), "out": len(rows)}, metrics=metrics)
