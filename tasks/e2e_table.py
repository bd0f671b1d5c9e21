"""The report's end-to-end rows (cf. Table II): the CTC students beside the hybrid ones.

    e2e_rows(decoded) -> list[dict]     one row per model with a decode result: WER and its
                                        95 % CI, WER per condition, and the WER relative to
                                        the hybrid SSL student
    e2e_werr(decoded) -> dict           the CTC SSL student's relative WER reduction over
                                        the CTC baseline (labeled only), overall and per
                                        condition
    render_e2e(rows, werr) -> str       the markdown table

`decoded`: model name -> its `amflow decode` result.json (None when that model was not
decoded). The names are E2E_MODELS' keys; the report finds them by their decode tags
(E2E_TAGS, in the SSL run) beside the hybrid baseline (teacher run) and SSL student.
The paired tests against the hybrid SSL student are decoding/compare.py's (they need
the per-utterance hypotheses).
"""
from __future__ import annotations

from typing import Any

CONDITIONS = ("DP1", "DP2", "DP3", "DP4", "DP5")
# model name -> what the table calls it, in the table's order
E2E_MODELS = {"baseline": "hybrid baseline (labeled only)",
              "ssl": "hybrid SSL student",
              "ctc_baseline": "CTC baseline (labeled only)",
              "ctc_ssl": "CTC SSL student (labeled + pseudo-labels)",
              "ctc_joint_ssl": "joint CTC/attention SSL student"}
# the end-to-end models' decode tags (decode.tag in the ssl_student DAG: decode-<tag>/)
E2E_TAGS = {"ctc_baseline": "ctc-baseline", "ctc_ssl": "ctc", "ctc_joint_ssl": "ctc-joint"}


def _wer(res: dict | None, cond: str) -> float | None:
    if not res:
        return None
    return res.get("wer") if cond == "all" else (res.get("per_condition") or {}).get(cond)


def e2e_rows(decoded: dict[str, dict | None]) -> list[dict[str, Any]]:
    ref = _wer(decoded.get("ssl"), "all")
    rows = []
    for name, label in E2E_MODELS.items():
        res = decoded.get(name)
        if not res:
            continue
        wer = _wer(res, "all")
        rows.append({"model": name, "label": label, "wer": wer,
                     "wer_ci95": res.get("wer_ci95"),
                     "per_condition": {c: _wer(res, c) for c in CONDITIONS},
                     "search": res.get("search"),
                     "x_hybrid_ssl": wer / ref if ref and wer is not None else None})
    return rows


def e2e_werr(decoded: dict[str, dict | None]) -> dict[str, float | None]:
    """(WER_ctc_baseline - WER_ctc_ssl) / WER_ctc_baseline per condition and 'all'."""
    base, ssl = decoded.get("ctc_baseline"), decoded.get("ctc_ssl")
    out: dict[str, float | None] = {}
    for cond in (*CONDITIONS, "all"):
        b, s = _wer(base, cond), _wer(ssl, cond)
        out[cond] = (b - s) / b if b and s is not None else None
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def render_e2e(rows: list[dict[str, Any]], werr: dict[str, float | None]) -> str:
    out = ["| model | WER % | 95 % CI | " + " | ".join(CONDITIONS) + " | x hybrid SSL |",
           "|---|---:|---|" + "---:|" * len(CONDITIONS) + "---:|"]
    for r in rows:
        ci = r["wer_ci95"]
        ci_s = f"{_pct(ci[0])}-{_pct(ci[1])}" if ci else "–"
        x = "–" if r["x_hybrid_ssl"] is None else f"{r['x_hybrid_ssl']:.2f}"
        out.append(f"| {r['label']} | {_pct(r['wer'])} | {ci_s} | "
                   + " | ".join(_pct(r["per_condition"][c]) for c in CONDITIONS) + f" | {x} |")
    if any(v is not None for v in werr.values()):
        out.append(f"| CTC SSL's WERR over the CTC baseline % | {_pct(werr['all'])} | | "
                   + " | ".join(_pct(werr[c]) for c in CONDITIONS) + " | |")
    return "\n".join(out)
