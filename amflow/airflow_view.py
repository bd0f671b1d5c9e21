"""The amflow tab of a DAG run in the Airflow UI: one HTML page from the run's files.

Read through `amflow.storage` (local disk or S3), never from Airflow's database:
- the per-condition table: every `evaluate*/result.json` of the run and, for a student
  run, of the teacher run that trained its teacher (teacher / baseline / SSL), with
  frame accuracy, PER and, once decoding lands, WER (`decode*/_SUCCESS.json`);
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

from amflow.storage import Storage, join

SUCCESS = "_SUCCESS.json"
CONDITIONS = ("DP1", "DP2", "DP3", "DP4", "DP5", "all")
ROLE_ORDER = {"teacher": 0, "baseline": 1, "": 2}
CSS = """body{font-family:system-ui,sans-serif;margin:16px;color:#1f2937}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d1d5db;padding:4px 8px}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.stale{color:#b45309;font-weight:600}img{max-width:100%;border:1px solid #e5e7eb;margin:6px 0}
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
                "decode": decode.get("metrics") or {},
                "stale": bool(train) and train.get("finished_at", "") > summary.get("finished_at", "")})
    return sorted(found, key=lambda e: ROLE_ORDER.get(e["role"], 3))


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
        metrics.append(("wer", "WER %"))
    head = "".join(f"<th>{html.escape(e['label'])} {label}"
                   f"{' <span class=stale>(stale)</span>' if e['stale'] else ''}</th>"
                   for name, label in metrics for e in evals)
    rows = []
    for cond in CONDITIONS:
        cells = [_pct(_metric(e, name, cond)) for name, _ in metrics for e in evals]
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
