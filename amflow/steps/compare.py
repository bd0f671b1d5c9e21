"""`amflow compare RUN [RUN ...]`: runs side by side (decoding/compare.py).

The first run is the base: every other run's decode gets its WER delta and a
matched-pairs test against the base's decode named by `--pair DECODE=BASE_DECODE`, else
the one of the same name (decode, decode-sequence, ...), else the base's one decode of the
same model kind and split (a student against another run's baseline). `--pair` also pairs
two decodes of the first run itself, of any kinds: `amflow compare SSL_RUN --pair
decode-ctc=decode` tests the CTC SSL student against the hybrid one. Prints the
table; `--out` also writes the comparison as JSON (a file path or storage URI).
"""
from __future__ import annotations

import os
from typing import Any

from core.config import Config
from core.runs import StepError
from core.storage import Storage
from amflow.services.compared_runs import load_run
from decoding.compare import compare, render_markdown


def run(ctx: Any, args: Any) -> dict[str, Any]:
    cfg: Config = ctx.cfg
    root = cfg.storage.root
    if "://" not in root and not os.path.isabs(root):
        root = os.path.abspath(root)
    st = Storage(cfg.storage)
    pairs = {}
    for p in getattr(args, "pair", None) or []:
        new, sep, old = p.partition("=")
        if not (sep and new and old):
            raise StepError(f"--pair {p!r}: want DECODE=BASE_DECODE, e.g. "
                            f"decode-student=decode-baseline")
        pairs[new] = old
    try:
        result = compare([load_run(st, root, r) for r in args.runs], pairs=pairs)
    except FileNotFoundError as exc:
        raise StepError(str(exc)) from None
    print(render_markdown(result), flush=True)
    if getattr(args, "out", None):
        st.write_json(args.out, result)
    heads = [r for r in result["rows"] if r["decode"] == "decode"]
    return {"base": result["base"], "runs": result["runs"],
            "wer": {r["run"]: r["wer"] for r in heads},
            "significant": {r["run"]: r["vs_base"]["significant"] for r in heads
                            if "vs_base" in r}}
