"""`amflow report`: the step's `run`, resolving inputs through the run layout and calling `tasks.report`."""
from __future__ import annotations

from typing import Any
from amflow.runs import StepContext, StepError
from amflow.storage import join
from tasks.report import CONDITIONS, _bar_png, _curves_png, _pct, _read_json, _run_steps, render_sequence_wer_table, render_steps, render_table_ii, render_wer_table, sequence_wer_table, table_ii, wer_table


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
                                                     "steps": steps})
    print(md)
    metrics = {"table_ii": rows, "table_ii_wer": wer_rows, "table_ii_wer_sequence": seq_rows,
               "report": ctx.path("report.md")}
    return ctx.finish(inputs=evals, counts={"in": len(rows), "out": len(rows)}, metrics=metrics)
