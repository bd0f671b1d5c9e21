"""Runs side by side: WER with 95 % CIs, deltas against the first run with a matched-pairs
test, dev curves, and the model each result scored.

    load_run(st, run_id, run_uri, steps)    every decode*/ result (+ its hyps.jsonl rows)
                                            and every train*/sequence* dev curve of a run
                                            (`steps`: {step folder: its summary}, which
                                            the app reads: core.runs.Run.finished_steps)
    compare(runs, pairs) -> dict            rows per (run, decode); the first run is the
                                            base each other run's decode is tested on: the
                                            one named in `pairs`, of the same name, else of
                                            the same model kind and split; `pairs` also
                                            pairs the base run's own decodes (a CTC and a
                                            hybrid student of one run: any two kinds)
    pairs_in_report(decoded) -> list        SSL vs baseline and sequence vs CE, paired
    render_markdown(cmp) -> str             the headline table first
Pure over `core.storage`: the CLI step, the report and the Airflow compare page share
it. It lives in decoding/ (not tasks/) because it reads decode results and the tests in
decoding/significance.py; tasks/ must not import decoding/.
"""
from __future__ import annotations

import json
from typing import Any

from core.storage import Storage, join
from decoding.significance import ALPHA, bootstrap_ci, compare_rows

DECODE_PREFIX = "decode"
CURVE_PREFIXES = ("train", "sequence")


def read_rows(st: Storage, uri: str) -> list[dict]:
    """hyps.jsonl rows (utt_id, condition, ref, hyp, errors, ref_words); [] when absent."""
    if not st.exists(uri):
        return []
    return [json.loads(line) for line in st.read_text(uri).splitlines() if line.strip()]


def _decode(st: Storage, run_uri: str, step_dir: str, summary: dict) -> dict:
    out = str(summary.get("out") or join(run_uri, step_dir, "result.json"))
    result = st.read_json(out) if st.exists(out) else dict(summary.get("metrics") or {})
    model = result.get("model") or (summary.get("inputs") or {}).get("model", "")
    return {"result": result, "model": model,
            "rows": read_rows(st, join(run_uri, step_dir, "hyps.jsonl"))}


def _curve(st: Storage, run_uri: str, step_dir: str) -> list[dict]:
    uri = join(run_uri, step_dir, "metrics.jsonl")
    recs = read_rows(st, uri)
    return [{"unit": r["unit"], "frame_acc": r.get("frame_acc"), "loss": r.get("loss")}
            for r in recs if r.get("kind") == "dev" and r.get("unit") is not None]


def load_run(st: Storage, run_id: str, run_uri: str, steps: dict[str, dict]) -> dict:
    """Run `run_id`'s decodes and dev curves: `steps` maps each finished step folder under
    `run_uri` (the run's folder) to its summary."""
    if not steps:
        raise FileNotFoundError(f"run {run_id!r}: no finished step under {run_uri}")
    decodes = {d: _decode(st, run_uri, d, s) for d, s in sorted(steps.items())
               if d.split("-")[0] == DECODE_PREFIX}
    curves = {d: _curve(st, run_uri, d) for d in sorted(steps)
              if d.split("-")[0] in CURVE_PREFIXES}
    return {"run": run_id, "decodes": decodes, "curves": {k: v for k, v in curves.items() if v}}


def _ci(dec: dict) -> list[float] | None:
    ci = dec["result"].get("wer_ci95")
    if ci:
        return [float(ci[0]), float(ci[1])]
    rows = dec["rows"]
    if not rows:
        return None
    return list(bootstrap_ci([r["errors"] for r in rows], [r["ref_words"] for r in rows]))


def compare(runs: list[dict], alpha: float = ALPHA,
            pairs: dict[str, str] | None = None) -> dict:
    """One row per (run, decode step); other runs' rows carry delta / p against the base
    decode they pair with (`base_decode`, `paired_by`): `pairs` (decode dir -> the base's
    decode dir) first, else the one of the same name, else the base's one decode of the
    same model kind (the architecture in result.json's `model_kind`) and split, so a
    student and another run's baseline meet even when their decodes are named apart."""
    if not runs:
        raise ValueError("compare needs at least one run")
    base = runs[0]
    rows = []
    for run in runs:
        for step_dir, dec in run["decodes"].items():
            res = dec["result"]
            row = {"run": run["run"], "decode": step_dir, "model": dec["model"],
                   "model_kind": res.get("model_kind"), "search": res.get("search"),
                   "wer": res.get("wer"), "wer_ci95": _ci(dec),
                   "per_condition": res.get("per_condition") or {},
                   "utterances": len(dec["rows"]) or None}
            match, how = base_decode(base, step_dir, dec, pairs or {})
            # the base run's own decodes meet each other when --pair names them (a CTC
            # student against the hybrid student of the same run: models of two kinds)
            if match and (run is not base or (how == "pair" and match != step_dir)):
                row["vs_base"] = _paired(base["decodes"][match], dec, alpha)
                row["base_decode"], row["paired_by"] = match, how
            rows.append(row)
    return {"base": base["run"], "runs": [r["run"] for r in runs], "alpha": alpha,
            "rows": rows, "curves": {r["run"]: r["curves"] for r in runs}}


def base_decode(base: dict, step_dir: str, dec: dict, pairs: dict[str, str]
                ) -> tuple[str | None, str]:
    """(the base run's decode dir to test `dec` against, how it was chosen)."""
    if step_dir in pairs:
        want = pairs[step_dir]
        if want not in base["decodes"]:
            raise FileNotFoundError(f"--pair {step_dir}={want}: run {base['run']!r} has no "
                                    f"{want} (it has {', '.join(base['decodes']) or 'none'})")
        return want, "pair"
    if step_dir in base["decodes"]:
        return step_dir, "name"
    kind, split = dec["result"].get("model_kind"), dec["result"].get("split")
    same = [d for d, b in base["decodes"].items() if kind is not None
            and b["result"].get("model_kind") == kind and b["result"].get("split") == split]
    return (same[0], "model_kind") if len(same) == 1 else (None, "")


def _paired(base: dict, new: dict, alpha: float) -> dict:
    bw, nw = base["result"].get("wer"), new["result"].get("wer")
    if base["rows"] and new["rows"]:
        return compare_rows(base["rows"], new["rows"], alpha=alpha)
    # no per-utterance rows: the delta, without a test
    delta = nw - bw if bw is not None and nw is not None else None
    return {"delta": delta, "significant": None, "p_mapsswe": None}


def pairs_in_report(decoded_rows: dict[str, list[dict]], alpha: float = ALPHA) -> list[dict]:
    """The report's paired tests: name -> (baseline rows, new rows), where both exist."""
    pairs = [("SSL vs baseline", "baseline", "ssl"),
             ("sequence vs CE: teacher", "teacher", "seq_teacher"),
             ("sequence vs CE: baseline", "baseline", "seq_baseline"),
             ("sequence vs CE: SSL", "ssl", "seq_ssl"),
             # the end-to-end students (tasks/e2e_table.py): CTC SSL vs its baseline, and
             # each against the hybrid SSL student
             ("CTC SSL vs CTC baseline", "ctc_baseline", "ctc_ssl"),
             ("CTC baseline vs hybrid SSL", "ssl", "ctc_baseline"),
             ("CTC SSL vs hybrid SSL", "ssl", "ctc_ssl"),
             ("joint CTC/attention SSL vs hybrid SSL", "ssl", "ctc_joint_ssl")]
    out = []
    for name, a, b in pairs:
        if decoded_rows.get(a) and decoded_rows.get(b):
            out.append({"comparison": name, "a": a, "b": b,
                        **compare_rows(decoded_rows[a], decoded_rows[b], alpha=alpha)})
    return out


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.2f}"


def p_text(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def mark(test: dict | None) -> str:
    """Delta text with its significance: '-3.10 (p=0.002)' or '-0.40 (n.s., p=0.41)'."""
    if not test or test.get("delta") is None:
        return ""
    d = f"{100 * test['delta']:+.2f}"
    p = test.get("p_mapsswe")
    if p is None:
        return f"{d} (no per-utterance hyps: untested)"
    return f"{d} ({p_text(p)})" if test["significant"] else f"{d} (n.s., {p_text(p)})"


def render_markdown(cmp: dict) -> str:
    lines = [f"# amflow compare: {', '.join(cmp['runs'])} (base: {cmp['base']})", "",
             "| run | decode | WER % | 95 % CI | Δ vs base (abs. %) | WERR | model |",
             "|---|---|---:|---|---|---:|---|"]
    for r in cmp["rows"]:
        ci = r["wer_ci95"]
        ci_s = f"{_pct(ci[0])}-{_pct(ci[1])}" if ci else "-"
        t = r.get("vs_base")
        werr = f"{100 * t['werr']:.1f} %" if t and t.get("werr") is not None else ""
        vs = mark(t) + (f" vs {r['base_decode']}" if t and r.get("base_decode") != r["decode"]
                        else "")
        kind = f" ({r['model_kind']})" if r.get("model_kind") else ""
        lines.append(f"| {r['run']} | {r['decode']} | {_pct(r['wer'])} | {ci_s} | {vs} | "
                     f"{werr} | {r['model']}{kind} |")
    lines += ["", f"n.s.: not significant (MAPSSWE, two-sided p >= {cmp['alpha']}), "
                  "utterances matched by utt_id."]
    return "\n".join(lines) + "\n"


def _dirname(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0]


def significance_section(st: Storage, ce: dict[str, str], seq: dict[str, str],
                         alpha: float = ALPHA) -> tuple[list[str], dict]:
    """The report's 'how sure' section from its decode result URIs (`ce` / `seq`: model
    name -> result.json): each model's WER with its 95 % CI, and the paired tests (SSL vs
    baseline, sequence vs CE), from the hyps.jsonl beside each result."""
    named = {**ce, **{f"seq_{k}": v for k, v in seq.items()}}
    rows, cis = {}, {}
    for name, uri in named.items():
        r = read_rows(st, join(_dirname(uri), "hyps.jsonl"))
        if r:
            rows[name] = r
            cis[name] = bootstrap_ci([x["errors"] for x in r], [x["ref_words"] for x in r])
    tests = pairs_in_report(rows, alpha)
    if not rows:
        return [], {"wer_ci95": {}, "tests": []}
    md = ["## How sure: 95 % confidence intervals and paired tests", "",
          "| model | WER % | 95 % CI | utterances |", "|---|---:|---|---:|"]
    for name, r in rows.items():
        wer = sum(x["errors"] for x in r) / max(1, sum(x["ref_words"] for x in r))
        md.append(f"| {name} | {_pct(wer)} | {_pct(cis[name][0])}-{_pct(cis[name][1])} | "
                  f"{len(r)} |")
    if tests:
        md += ["", "| comparison | WER % (a -> b) | Δ abs. % | significant |",
               "|---|---|---|---|"]
        md += [f"| {t['comparison']} | {_pct(t['wer_a'])} -> {_pct(t['wer_b'])} | {mark(t)} | "
               f"{'yes' if t['significant'] else 'no'} |" for t in tests]
    md += ["", f"CI: bootstrap over utterances (1000 resamples). Tests: NIST MAPSSWE on "
               f"per-utterance errors, utterances matched by utt_id; n.s. where p >= {alpha}. "
               "A difference inside the CIs' overlap can still be significant: the paired "
               "test removes the per-utterance difficulty both models share.", ""]
    return md, {"wer_ci95": {k: list(v) for k, v in cis.items()}, "tests": tests}
