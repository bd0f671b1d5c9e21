"""Error analysis of decoded utterances, sclite-style.

    align(ref, hyp) -> list[(ref_word|None, hyp_word|None, op)]   op in C S D I
    alignment_lines(row) -> str      REF/HYP/EVAL lines for one hyps.jsonl row; errors in
                                     upper case, '***' for the missing side (as sclite prints)
    analyse(rows, top=20) -> dict    S/D/I per condition and overall, top confusion pairs,
                                     top deleted / inserted words
    render(rows) -> str              the whole text file written beside hyps.jsonl
    result_fields(rows) -> dict      CIs and S/D/I counts for the `decode --out` JSON
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Sequence

import kaldialign

from decoding.significance import bootstrap_ci

EPS = "<eps>"


def align(ref: Sequence[str], hyp: Sequence[str]) -> list[tuple]:
    out = []
    for r, h in kaldialign.align(list(ref), list(hyp), EPS):
        r = None if r == EPS else r
        h = None if h == EPS else h
        op = "I" if r is None else "D" if h is None else "C" if r == h else "S"
        out.append((r, h, op))
    return out


def _words(s: str) -> list[str]:
    return s.split() if s else []


def alignment_lines(row: dict) -> str:
    refs, hyps, evals = [], [], []
    for r, h, op in align(_words(row["ref"]), _words(row["hyp"])):
        rw = "*" * len(h or "") or "***" if r is None else (r if op == "C" else r.upper())
        hw = "*" * len(r or "") or "***" if h is None else (h if op == "C" else h.upper())
        width = max(len(rw), len(hw))
        refs.append(rw.ljust(width))
        hyps.append(hw.ljust(width))
        evals.append(("" if op == "C" else op).ljust(width))
    head = f"id: ({row['utt_id']})  condition: {row.get('condition', 'unknown')}"
    return "\n".join([head, "REF:  " + " ".join(refs), "HYP:  " + " ".join(hyps),
                      "Eval: " + " ".join(evals).rstrip(), ""])


def _counts() -> dict:
    return {"ref_words": 0, "sub": 0, "del": 0, "ins": 0, "cor": 0}


def analyse(rows: Iterable[dict], top: int = 20) -> dict:
    per = defaultdict(_counts)
    confusions, deleted, inserted = Counter(), Counter(), Counter()
    for row in rows:
        c = per[row.get("condition", "unknown")]
        ref = _words(row["ref"])
        c["ref_words"] += len(ref)
        for r, h, op in align(ref, _words(row["hyp"])):
            key = {"C": "cor", "S": "sub", "D": "del", "I": "ins"}[op]
            c[key] += 1
            if op == "S":
                confusions[(r, h)] += 1
            elif op == "D":
                deleted[r] += 1
            elif op == "I":
                inserted[h] += 1
    total = _counts()
    for c in per.values():
        for k in total:
            total[k] += c[k]
    for c in list(per.values()) + [total]:
        n = c["ref_words"]
        c["wer"] = (c["sub"] + c["del"] + c["ins"]) / n if n else 0.0
    return {"errors": total, "per_condition": {k: per[k] for k in sorted(per)},
            "confusions": [{"ref": r, "hyp": h, "count": n}
                           for (r, h), n in confusions.most_common(top)],
            "deleted": [{"word": w, "count": n} for w, n in deleted.most_common(top)],
            "inserted": [{"word": w, "count": n} for w, n in inserted.most_common(top)]}


def render(rows: Sequence[dict], top: int = 20) -> str:
    a = analyse(rows, top)
    out = ["# S/D/I per condition", f"{'condition':<12} {'words':>6} {'sub':>5} {'del':>5} "
           f"{'ins':>5} {'WER%':>6}"]
    for name, c in list(a["per_condition"].items()) + [("ALL", a["errors"])]:
        out.append(f"{name:<12} {c['ref_words']:>6} {c['sub']:>5} {c['del']:>5} {c['ins']:>5} "
                   f"{100 * c['wer']:>6.2f}")
    out += ["", "# top confusion pairs (ref -> hyp: count)"]
    out += [f"{x['ref']} -> {x['hyp']}: {x['count']}" for x in a["confusions"]]
    out += ["", "# per-utterance alignment (errors in upper case)", ""]
    out += [alignment_lines(r) for r in rows]
    return "\n".join(out) + "\n"


def result_fields(rows: Sequence[dict], seed: int = 0) -> dict:
    """What `decode --out` adds from its hyps rows: wer_ci95 (bootstrap over utterances),
    per_condition_ci95, and S/D/I counts overall (`errors`) and per condition."""
    rows = list(rows)
    a = analyse(rows, top=10)
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r.get("condition", "unknown")].append(r)

    def ci(rs: list[dict]) -> list[float]:
        return list(bootstrap_ci([r["errors"] for r in rs], [r["ref_words"] for r in rs],
                                 seed=seed))

    return {"wer_ci95": ci(rows), "per_condition_ci95": {c: ci(by[c]) for c in sorted(by)},
            "errors": a["errors"], "per_condition_errors": a["per_condition"],
            "confusions": a["confusions"]}
