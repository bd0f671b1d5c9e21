"""The amflow tab of a DAG run in the Airflow UI: one HTML page from the run's files.

Read through `core.storage` (local disk or S3), never from Airflow's database:
- the per-condition table: every `evaluate*/result.json` of the run and, for a student
  run, of the teacher run that trained its teacher (teacher / baseline / SSL), with
  frame accuracy, PER and, once decoding lands, WER with its 95 % CI (`decode*/_SUCCESS.json`,
  its result.json for the CIs of older decodes);
- every PNG under the run (report plots, learning curves), inlined as data: URIs (the
  UI shows the page in a sandboxed iframe, whose own requests carry no session cookie);
- each step's counts, rejects and wall time from its `_SUCCESS.json`;
- results that are older than the model they score are flagged stale (a train task was
  cleared without its evaluate).
"""
from __future__ import annotations

import base64
import html
from typing import Any

from core.storage import Storage, join

SUCCESS = "_SUCCESS.json"
CONDITIONS = ("DP1", "DP2", "DP3", "DP4", "DP5", "all")
ROLE_ORDER = {"teacher": 0, "baseline": 1, "": 2}
CSS = """body{font-family:system-ui,sans-serif;margin:16px;color:#1f2937}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d1d5db;padding:4px 8px}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.stale{color:#b45309;font-weight:600}.ci{color:#4b5563;font-size:90%}img{max-width:100%;border:1px solid #e5e7eb;margin:6px 0}
figure{margin:0 0 16px}figcaption{font-size:90%;color:#4b5563}"""


def _steps(st: Storage, run_uri: str) -> dict[str, dict[str, Any]]:
    """`<step dir name>: _SUCCESS.json` of every finished step of a run."""
    out = {}
    if not st.exists(run_uri):
        return out
    for uri in st.list(run_uri, suffix=SUCCESS, recursive=True):
        rel = uri[len(run_uri.rstrip("/")) + 1:]
        if rel.count("/") == 1 and "_shards" not in rel:
            out[rel.split("/")[0]] = st.read_json(uri)
    return out


def teacher_run_of(steps: dict[str, dict[str, Any]]) -> str:
    """The run that trained the teacher a student run used (from its targets step)."""
    summary = steps.get("targets") or {}
    for where in (summary.get("inputs") or {}, summary.get("metrics") or {}):
        uri = str(where.get("teacher") or "")
        parts = uri.rstrip("/").split("/")
        if len(parts) >= 3 and parts[-3] != "" and "runs" in parts[:-2]:
            return parts[-3]
    return ""


def _role(step_dir: str) -> str:
    return step_dir.partition("-")[2]  # evaluate-teacher -> teacher, evaluate -> ""


def _evaluations(st: Storage, root: str, run_id: str, steps: dict) -> list[dict[str, Any]]:
    """One entry per evaluated model: label, result.json, WER (if decoded), stale flag."""
    runs = [(run_id, steps)]
    teacher = teacher_run_of(steps)
    if teacher and teacher != run_id:
        runs.insert(0, (teacher, _steps(st, join(root, "runs", teacher))))
    found = []
    for rid, rsteps in runs:
        for name, summary in rsteps.items():
            if not name.startswith("evaluate"):
                continue
            uri = summary.get("out") or join(root, "runs", rid, name, "result.json")
            if not st.exists(uri):
                continue
            role = _role(name)
            train = rsteps.get("train-" + role if role else "train", {})
            decode = rsteps.get("decode-" + role if role else "decode", {})
            found.append({
                "label": (role or ("SSL student" if "targets" in rsteps else "model"))
                + ("" if rid == run_id else f" (run {rid})"),
                "role": role, "result": st.read_json(uri),
                "decode": _decoded(st, decode),
                "stale": bool(train) and train.get("finished_at", "") > summary.get("finished_at", "")})
    return sorted(found, key=lambda e: ROLE_ORDER.get(e["role"], 3))


def _decoded(st: Storage, summary: dict[str, Any]) -> dict[str, Any]:
    """A decode step's metrics, with the 95 % CIs of its result.json (`wer_ci95`,
    `per_condition_ci95`) where the metrics lack them (decodes before they carried it)."""
    metrics = dict(summary.get("metrics") or {})
    out = summary.get("out")
    if out and "per_condition_ci95" not in metrics and st.exists(out):
        result = st.read_json(out)
        for key in ("wer_ci95", "per_condition_ci95"):
            if result.get(key) is not None:
                metrics.setdefault(key, result[key])
    return metrics


def _with_ci(ev: dict[str, Any], cond: str) -> str:
    """WER % of a model on a condition, with its 95 % CI where the decode has one."""
    decode = ev["decode"]
    ci = decode.get("wer_ci95") if cond == "all" else \
        (decode.get("per_condition_ci95") or {}).get(cond)
    text = _pct(_metric(ev, "wer", cond))
    if text and isinstance(ci, (list, tuple)) and len(ci) == 2:
        text += f" <span class=ci>({_pct(ci[0])}–{_pct(ci[1])})</span>"
    return text


def _pct(v: Any) -> str:
    return "" if not isinstance(v, (int, float)) else f"{100 * v:.1f}"


def _metric(ev: dict[str, Any], name: str, cond: str) -> Any:
    result, decode = ev["result"], ev["decode"]
    if name == "fa":
        return result.get("frame_accuracy") if cond == "all" else result.get("per_condition", {}).get(cond)
    if name == "per":
        return result.get("per") if cond == "all" else result.get("per_condition_per", {}).get(cond)
    return decode.get("wer") if cond == "all" else (decode.get("per_condition_wer") or {}).get(cond)


def conditions_table(evals: list[dict[str, Any]]) -> str:
    """Rows: conditions; columns: FA %, PER % (and WER % where decoded) per model."""
    if not evals:
        return "<p>No evaluation in this run yet.</p>"
    metrics = [("fa", "FA %"), ("per", "PER %")]
    if any(e["decode"].get("wer") is not None for e in evals):
        metrics.append(("wer", "WER % (95 % CI)"))
    head = "".join(f"<th>{html.escape(e['label'])} {label}"
                   f"{' <span class=stale>(stale)</span>' if e['stale'] else ''}</th>"
                   for name, label in metrics for e in evals)
    rows = []
    for cond in CONDITIONS:
        cells = [_with_ci(e, cond) if name == "wer" else _pct(_metric(e, name, cond))
                 for name, _ in metrics for e in evals]
        if any(cells):
            rows.append(f"<tr><th>{cond}</th>" + "".join(f"<td class=n>{c}</td>" for c in cells)
                        + "</tr>")
    note = ""
    if any(e["stale"] for e in evals):
        note = ("<p class=stale>stale: the model was trained again after this evaluation "
                "(its train task was cleared without Downstream); clear the evaluate task "
                "to refresh it.</p>")
    return f"<table><tr><th>condition</th>{head}</tr>{''.join(rows)}</table>{note}"


def steps_table(steps: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, s in sorted(steps.items(), key=lambda kv: kv[1].get("started_at", "")):
        c = s.get("counts") or {}
        rows.append(f"<tr><td>{html.escape(name)}</td><td class=n>{s.get('wall_s', 0):.1f}</td>"
                    f"<td class=n>{c.get('in', '')}</td><td class=n>{c.get('out', '')}</td>"
                    f"<td class=n>{c.get('rejected', '')}</td>"
                    f"<td>{html.escape(str(s.get('finished_at', '')))}</td></tr>")
    return ("<table><tr><th>step</th><th>wall s</th><th>in</th><th>out</th><th>rejected</th>"
            "<th>finished</th></tr>" + "".join(rows) + "</table>")


def plots(st: Storage, run_uri: str) -> list[tuple[str, str]]:
    """(name relative to the run, data: URI) of every PNG of the run, report first."""
    if not st.exists(run_uri):
        return []
    uris = sorted(st.list(run_uri, suffix=".png", recursive=True),
                  key=lambda u: ("/report/" not in u, u))
    out = []
    for uri in uris:
        data = base64.b64encode(st.read_bytes(uri)).decode()
        out.append((uri[len(run_uri.rstrip("/")) + 1:], f"data:image/png;base64,{data}"))
    return out


def render_run(st: Storage, root: str, run_id: str, title: str = "") -> str:
    """The whole page for one amflow run under storage root `root`."""
    run_uri = join(root, "runs", run_id)
    steps = _steps(st, run_uri)
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>amflow {html.escape(run_id)}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h2>amflow run <code>{html.escape(run_id)}</code></h2>",
             f"<p>{html.escape(title)} Files: <code>{html.escape(run_uri)}</code></p>"]
    if not steps:
        parts.append("<p>No step of this run has finished yet.</p></body></html>")
        return "".join(parts)
    parts += ["<h3>Results per condition (test split)</h3>",
              conditions_table(_evaluations(st, root, run_id, steps)),
              "<h3>Steps: counts, rejects, wall time</h3>", steps_table(steps), "<h3>Plots</h3>"]
    figures = plots(st, run_uri)
    parts += [f"<figure><img alt='{html.escape(name)}' src='{src}'><figcaption>"
              f"{html.escape(name)}</figcaption></figure>" for name, src in figures]
    if not figures:
        parts.append("<p>No plot yet.</p>")
    parts.append("</body></html>")
    return "".join(parts)


# ------------------------------------------------------------------ the compare page
COMPARE_CSS = """.wrap{max-width:1240px}td.model{font-size:85%;word-break:break-all;max-width:360px}
.ns{color:#6b7280}.sig{color:#047857;font-weight:600}.worse{color:#b91c1c}
.legend span{display:inline-block;margin-right:14px}"""
COLOURS = ("#2563eb", "#ea580c", "#059669", "#9333ea", "#dc2626", "#0891b2", "#ca8a04")


def p_text(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def _delta_cell(test: dict | None, row: dict | None = None, base: str = "") -> str:
    if row is not None and row["run"] == base:
        return "<td class=ns>the base</td>"
    if not test:  # the base run has no result of this decode step to test against
        return f"<td class=ns>no {html.escape(row['decode'] if row else 'decode')} in the base</td>"
    if test.get("delta") is None:
        return "<td class=ns>no WER on one side</td>"
    d = 100 * test["delta"]
    p = test.get("p_mapsswe")
    if p is None:
        return f"<td class='n ns'>{d:+.2f} (untested: no hyps)</td>"
    if not test["significant"]:
        return f"<td class='n ns'>{d:+.2f} <b>n.s.</b> ({p_text(p)})</td>"
    cls = "sig" if d < 0 else "worse"
    return f"<td class='n {cls}'>{d:+.2f} ({p_text(p)})</td>"


def compare_table(cmp: dict) -> str:
    """The headline: WER, its 95 % CI, the delta against the base run with significance."""
    head = ("<tr><th>run</th><th>decode</th><th>WER %</th><th>95 % CI</th>"
            "<th>Δ vs base (abs. %)</th><th>WERR %</th><th>model</th></tr>")
    rows = []
    for r in cmp["rows"]:
        ci = r.get("wer_ci95")
        ci_s = f"{100 * ci[0]:.1f}–{100 * ci[1]:.1f}" if ci else "no per-utterance hyps"
        t = r.get("vs_base")
        werr = _pct(t.get("werr")) if t and t.get("p_mapsswe") is not None else ""
        rows.append(f"<tr><td>{html.escape(r['run'])}</td><td>{html.escape(r['decode'])}</td>"
                    f"<td class=n>{_pct(r.get('wer'))}</td><td class=n>{ci_s}</td>"
                    f"{_delta_cell(t, r, cmp['base'])}<td class=n>{werr}</td>"
                    f"<td class=model><code>{html.escape(str(r.get('model') or ''))}</code></td>"
                    "</tr>")
    if not rows:
        return ("<p id=headline class=stale>No decode result in these runs yet: a run has a "
                "WER once its decode task has finished.</p>")
    return f"<table id=headline>{head}{''.join(rows)}</table>"


def undecoded_note(cmp: dict) -> str:
    """Why a ticked run has no row: no decode step of it has finished."""
    shown = {r["run"] for r in cmp["rows"]}
    missing = [r for r in cmp["runs"] if r not in shown]
    if not missing:
        return ""
    names = ", ".join(f"<code>{html.escape(r)}</code>" for r in missing)
    return (f"<p class=stale id=undecoded>No WER for {names}: no decode of "
            f"{'it' if len(missing) == 1 else 'them'} has finished yet (its dev curves, if "
            f"any, are below).</p>")


def order_runs(runs: list[str], base: str) -> list[str]:
    """The ticked runs with the base first (compare() tests each other run against its
    first run); the base is added when it was not ticked. No base: the first ticked."""
    runs = list(dict.fromkeys(runs))
    if not base:
        return runs
    return [base, *[r for r in runs if r != base]]


def compare_conditions(cmp: dict) -> str:
    conds = sorted({c for r in cmp["rows"] for c in r.get("per_condition") or {}})
    if not conds:
        return ""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in conds)
    rows = [f"<tr><td>{html.escape(r['run'])}</td><td>{html.escape(r['decode'])}</td>"
            + "".join(f"<td class=n>{_pct((r.get('per_condition') or {}).get(c))}</td>"
                      for c in conds) + "</tr>" for r in cmp["rows"]]
    return (f"<h3>WER % per condition</h3><table><tr><th>run</th><th>decode</th>{head}</tr>"
            f"{''.join(rows)}</table>")


def dev_curves_svg(curves: dict[str, dict[str, list[dict]]], w: int = 640, h: int = 260) -> str:
    """Dev frame accuracy per training unit, one line per (run, training step)."""
    lines = [(f"{run} {step}", pts) for run, by in curves.items() for step, pts in by.items()
             if any(p.get("frame_acc") is not None for p in pts)]
    if not lines:
        return "<p>No dev curve in these runs.</p>"
    xs = [p["unit"] for _, pts in lines for p in pts]
    ys = [p["frame_acc"] for _, pts in lines for p in pts if p.get("frame_acc") is not None]
    x0, x1, y0, y1 = min(xs), max(xs) or 1, min(ys), max(ys)
    sx = lambda x: 40 + (w - 50) * (x - x0) / ((x1 - x0) or 1)  # noqa: E731
    sy = lambda y: h - 25 - (h - 35) * (y - y0) / ((y1 - y0) or 1)  # noqa: E731
    svg, legend = [], []
    for i, (name, pts) in enumerate(lines):
        c = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{sx(p['unit']):.1f},{sy(p['frame_acc']):.1f}" for p in pts
                        if p.get("frame_acc") is not None)
        svg.append(f"<polyline fill=none stroke='{c}' stroke-width=2 points='{path}'/>")
        legend.append(f"<span style='color:{c}'>■ {html.escape(name)}</span>")
    axes = (f"<text x=2 y=14 font-size=11>{100 * y1:.1f} %</text>"
            f"<text x=2 y={h - 25} font-size=11>{100 * y0:.1f} %</text>"
            f"<text x={w - 90} y={h - 5} font-size=11>training unit</text>")
    return (f"<h3>Dev frame accuracy</h3><svg id=devcurves width={w} height={h} "
            f"role=img aria-label='dev curves'>{axes}{''.join(svg)}</svg>"
            f"<div class=legend>{''.join(legend)}</div>")


def run_picker(available: list[str], selected: list[str], config: str, base: str = "") -> str:
    """Tick the runs; pick the base the others' deltas are tested against."""
    boxes = "".join(f"<label><input type=checkbox name=runs value='{html.escape(r)}'"
                    f"{' checked' if r in selected else ''}> {html.escape(r)}</label> "
                    for r in available)
    options = "<option value=''>the first ticked run (list order)</option>" + "".join(
        f"<option value='{html.escape(r)}'{' selected' if r == base else ''}>"
        f"{html.escape(r)}</option>" for r in available)
    return (f"<form method=get><input type=hidden name=config value='{html.escape(config)}'>"
            f"<p>Runs: {boxes or 'none found'}</p><p><label>Base (each other run's delta "
            f"is against it): <select name=base>{options}</select></label> "
            f"<button type=submit>Compare</button></p></form>")


PICK_RUNS = ("Tick one run to see its WER with its 95 % CI, or two or more to test each "
             "against the base you pick; then press Compare.")


def render_compare(cmp: dict | None, available: list[str], selected: list[str],
                   config: str, error: str = "") -> str:
    """The compare page: the run picker, then the headline table, conditions, curves."""
    base = cmp["base"] if cmp else ""
    parts = ["<!doctype html><html><head><meta charset=utf-8><title>amflow compare</title>"
             f"<style>{CSS}{COMPARE_CSS}</style></head><body><div class=wrap>",
             "<h2>amflow: compare runs</h2>", run_picker(available, selected, config, base)]
    if error:
        parts.append(f"<p class=stale>{html.escape(error)}</p>")
    if cmp:
        alone = len(cmp["runs"]) == 1
        parts += [f"<h3>WER, base <code>{html.escape(cmp['base'])}</code>"
                  f"{' (one run: nothing to test it against)' if alone else ''}</h3>",
                  compare_table(cmp), undecoded_note(cmp),
                  f"<p>CI: bootstrap over utterances. Δ: matched-pairs test (NIST MAPSSWE, "
                  f"utterances matched by id); <b>n.s.</b>: not significant, p ≥ "
                  f"{cmp['alpha']}.</p>",
                  compare_conditions(cmp), dev_curves_svg(cmp["curves"])]
    parts.append("</div></body></html>")
    return "".join(parts)
