"""`amflow report`: the demo report of a run (Table II per condition, curves, timings).

Finds the evaluations and decodes of the teacher/baseline run and the SSL run through the
run layout (`step_dir_name` for the tagged ones); the tables and plots live in `tasks.report`.
"""
from __future__ import annotations

from typing import Any

from amflow.steps.registry import report_order
from core.runs import Run, StepContext, StepError, runs_uri, step_dir_name
from core.storage import Storage, join
from decoding.compare import significance_section
from tasks.e2e_table import E2E_TAGS, e2e_rows, e2e_werr, render_e2e
from tasks.report import (CONDITIONS, bar_png, curves_png, pct, read_json_or_none,
                          render_steps, render_table_ii, sequence_choice_rows,
                          sequence_section, sequence_wer_table, table_ii, wer_section,
                          wer_table)



def run_steps(storage: Storage, run: Run) -> list[dict[str, Any]]:
    """The `_SUCCESS.json` of each step folder of `run` (the report's own aside), in
    pipeline order."""
    found = [s for d, s in run.finished_steps(storage).items() if d != "report"]
    order = {name: i for i, name in enumerate(report_order())}
    return sorted(found, key=lambda s: (order.get(s.get("step", ""), 99), s.get("step", "")))


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    rc = ctx.cfg.report
    teacher_run = rc.teacher_run or ctx.run_id
    root = runs_uri(ctx.cfg.storage.root)
    evals = {
        "teacher": rc.teacher_eval or _result(root, teacher_run, "evaluate", "teacher"),
        "baseline": rc.baseline_eval or _result(root, teacher_run, "evaluate", "baseline"),
        "ssl": rc.ssl_eval or _result(root, ctx.run_id, "evaluate"),
    }
    loaded = {k: read_json_or_none(ctx.storage, v) for k, v in evals.items()}
    missing = [f"{k} ({evals[k]})" for k, v in loaded.items() if v is None]
    if loaded["baseline"] is None or loaded["ssl"] is None:
        raise StepError("report needs the baseline and SSL evaluations; missing: "
                        + ", ".join(missing))
    rows = table_ii(loaded["teacher"] or {}, loaded["baseline"], loaded["ssl"])
    decodes = {
        "teacher": _result(root, teacher_run, "decode", "teacher"),
        "baseline": _result(root, teacher_run, "decode", "baseline"),
        "ssl": _result(root, ctx.run_id, "decode")}
    decoded = {k: read_json_or_none(ctx.storage, v) for k, v in decodes.items()}
    wer_rows = (wer_table(decoded["teacher"], decoded["baseline"], decoded["ssl"])
                if decoded["baseline"] and decoded["ssl"] else [])
    seq_decodes = {
        "teacher": _result(root, teacher_run, "decode-sequence", "teacher"),
        "baseline": _result(root, teacher_run, "decode-sequence", "baseline"),
        "ssl": _result(root, ctx.run_id, "decode-sequence")}
    seq_decoded = {k: read_json_or_none(ctx.storage, v) for k, v in seq_decodes.items()}
    seq_rows = (sequence_wer_table(decoded, seq_decoded)
                if any(seq_decoded.values()) else [])
    choice_rows = _sequence_choice(ctx, root, teacher_run)
    runs = [teacher_run] if teacher_run == ctx.run_id else [teacher_run, ctx.run_id]
    steps = [s for r in runs for s in run_steps(ctx.storage, Run(ctx.cfg.storage.root, r))]
    e2e_decodes = {k: _result(root, ctx.run_id, "decode", tag) for k, tag in E2E_TAGS.items()}
    e2e_md, e2e = _e2e_section(ctx, decoded, e2e_decodes)
    sig_md, significance = significance_section(ctx.storage, {**decodes, **e2e_decodes},
                                                seq_decodes)

    parts = ["# amflow report", "",
             f"Runs: teacher/baseline `{teacher_run}`, SSL student `{ctx.run_id}`. "
             "Frame accuracy (FA) and phone error rate (PER, greedy collapse of frame outputs) "
             "on the test split (speakers unseen in training), per far-field condition.", ""]
    if wer_rows:
        parts += wer_section(wer_rows, decoded["ssl"])
    if seq_rows:
        parts += sequence_section(seq_rows, choice_rows)
    parts += e2e_md
    parts += sig_md  # CIs and paired tests (decoding/compare.py)
    parts += ["## Frame accuracy and phone error rate (cf. Table II)", "",
              render_table_ii(rows), "", "![frame accuracy](accuracy.png)", ""]
    gains = [r["rel_fer_reduction"] for r in rows
             if r["condition"] in CONDITIONS[1:] and r["rel_fer_reduction"] is not None]
    if gains:
        parts += [f"SSL relative frame-error reduction in DP2..DP5: min {pct(min(gains))} %, "
                  f"max {pct(max(gains))} %.", ""]
    parts += _curves_part(ctx, root, teacher_run)
    for title, rel in [("Distributed trainers (cf. Table I)", "bench/trainers.md"),
                       ("Scaling simulator (cf. HTM paper Table 1)", "simulate/table.md")]:
        for r in runs:
            uri = join(root, r, rel)
            if ctx.storage.exists(uri):
                parts += [f"## {title}", "", ctx.storage.read_text(uri), ""]
                break
    parts += ["## Steps: timings, throughput, storage", "", render_steps(steps), ""]
    ctx.storage.write_bytes(ctx.path("accuracy.png"), bar_png(rows))
    md = "\n".join(parts)
    ctx.storage.write_text(ctx.path("report.md"), md)
    ctx.storage.write_json(ctx.path("report.json"), {"table_ii": rows, "table_ii_wer": wer_rows,
                                                     "table_ii_wer_sequence": seq_rows,
                                                     "sequence_choice": choice_rows,
                                                     "evaluations": evals, "decodes": decodes,
                                                     "sequence_decodes": seq_decodes,
                                                     "significance": significance,
                                                     "table_ii_e2e": e2e,
                                                     "e2e_decodes": e2e_decodes,
                                                     "steps": steps})
    print(md)
    metrics = {"table_ii": rows, "table_ii_wer": wer_rows, "table_ii_wer_sequence": seq_rows,
               "table_ii_e2e": e2e, "report": ctx.path("report.md")}
    return ctx.finish(inputs=evals, counts={"in": len(rows), "out": len(rows)}, metrics=metrics)


def _curves_part(ctx: StepContext, root: str, teacher_run: str) -> list[str]:
    curves = curves_png(ctx.storage, {
        "teacher": join(root, teacher_run, step_dir_name("train", "teacher"), "metrics.jsonl"),
        "baseline": join(root, teacher_run, step_dir_name("train", "baseline"), "metrics.jsonl"),
        "SSL student": join(root, ctx.run_id, "train", "metrics.jsonl")})
    if not curves:
        return []
    ctx.storage.write_bytes(ctx.path("learning_curves.png"), curves)
    return ["## Learning curves", "", "![learning curves](learning_curves.png)", ""]


def _e2e_section(ctx: StepContext, decoded: dict, e2e_decodes: dict[str, str]
                 ) -> tuple[list[str], dict]:
    """The end-to-end students' rows beside the hybrid ones (tasks/e2e_table.py), from the
    SSL run's decode-ctc-baseline / decode-ctc / decode-ctc-joint results."""
    e2e = {k: read_json_or_none(ctx.storage, v) for k, v in e2e_decodes.items()}
    if not any(e2e.values()):
        return [], {"rows": [], "werr": {}}
    both = {"baseline": decoded.get("baseline"), "ssl": decoded.get("ssl"), **e2e}
    rows, werr = e2e_rows(both), e2e_werr(both)
    md = ["## End-to-end students beside the hybrid ones (cf. Table II)", "",
          render_e2e(rows, werr), "",
          "WER % on the test split; CTC models decoded with T o L o G (their tokens spelled "
          "into the LM's words), LM weight and blank penalty tuned on dev; hybrid ones with "
          "H o (C o) L o G. x hybrid SSL: the model's WER over the hybrid SSL student's. "
          "Paired tests against the hybrid SSL student: the next section.", ""]
    return md, {"rows": rows, "werr": werr}


def _sequence_choice(ctx: StepContext, root: str, teacher_run: str) -> list[dict]:
    """Which model each sequence step shipped (tasks/report.py sequence_choice_rows)."""
    return sequence_choice_rows({
        "teacher": _selection(ctx, root, teacher_run, "teacher"),
        "baseline": _selection(ctx, root, teacher_run, "baseline"),
        "ssl": _selection(ctx, root, ctx.run_id, "")})


def _selection(ctx: StepContext, root: str, run_id: str, tag: str) -> dict | None:
    """The model `amflow sequence` shipped for train.tag `tag` (its _SUCCESS.json metrics
    `selection`); {} for a step that shipped its last epoch unchosen; None: no such step."""
    run = Run(ctx.cfg.storage.root, run_id)
    done = read_json_or_none(ctx.storage, run.success(step_dir_name("sequence", tag)))
    if done is None:
        return None
    return (done.get("metrics") or {}).get("selection") or {}


def _result(root: str, run_id: str, step: str, tag: str = "") -> str:
    """The result.json of a (tagged) step of a run."""
    return join(root, run_id, step_dir_name(step, tag), "result.json")
