"""The names of the top-k target codes (`targets.codec`, a target row's `topk_code`).

Kept apart from amflow/records.py, which codes them, so that validating a config (in the
DAG files, at parse time) imports neither numpy nor pyarrow.
"""
from __future__ import annotations

import re

FP16_CODE = "fp16"  # the paper's layout: stored as a null topk_code
_SQRT_CODE = re.compile(r"sqrt(\d+)(?:-u(8|16))?")


def sqrt_levels(code: str) -> int:
    """`sqrt<L>` or `sqrt<L>-u8|u16` -> L; ValueError for anything else."""
    m = _SQRT_CODE.fullmatch(code)
    if not m or not 2 <= int(m.group(1)) <= 255:
        raise ValueError(f"unknown top-k code {code!r}: fp16 or sqrt<L> with 2 <= L <= 255")
    return int(m.group(1))


def index_bytes(code: str | None) -> int:
    """Bytes per stored class index under a row's `topk_code` (null: int16)."""
    return 1 if code and code.endswith("-u8") else 2
