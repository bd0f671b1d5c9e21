"""Compare two scripts/identity_check.sh output trees where their digests differ: Parquet
files by their rows' decoded values (features and top-k targets decoded as the trainer
does, whatever column types either tree stored), model files by every tensor and value,
JSON by content, naming what differs.

    python scripts/identity_compare.py OLD_TREE NEW_TREE FILES
FILES: the relative paths to compare, one a line (those whose digests differ).
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from core import records  # noqa: E402
from core.config import StorageConfig  # noqa: E402
from core.storage import Storage  # noqa: E402


def flat(obj, pre=""):
    if isinstance(obj, dict):
        return {k2: v2 for k, v in obj.items() for k2, v2 in flat(v, f"{pre}.{k}").items()}
    return {pre: obj}


def eq(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) \
            and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y))
    if isinstance(x, dict) and isinstance(y, dict):
        return set(x) == set(y) and all(eq(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(eq(a, b) for a, b in zip(x, y))
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - objects without equality differ
        return False


def parquet_equal(st: Storage, a: Path, b: Path) -> bool:
    ra = list(records.iter_rows(records.read_table(st, str(a))))
    rb = list(records.iter_rows(records.read_table(st, str(b))))
    if len(ra) != len(rb):
        return False
    for x, y in zip(ra, rb):
        if not eq(x, y):
            return False
        if "feats" in x and not eq(records.decode_feats(x), records.decode_feats(y)):
            return False
        if x.get("k") is not None and not eq(records.decode_topk(x), records.decode_topk(y)):
            return False
    return True


def differing_keys(a: Path, b: Path) -> list[str]:
    if a.suffix == ".pt":
        load = lambda p: torch.load(io.BytesIO(p.read_bytes()), weights_only=False)  # noqa: E731
        fa, fb = [flat(load(a))], [flat(load(b))]
    else:
        parse = lambda p: [json.loads(x) for x in p.read_text().splitlines() if x.strip()] \
            if p.suffix == ".jsonl" else [json.loads(p.read_text())]  # noqa: E731
        fa, fb = [flat(x) for x in parse(a)], [flat(x) for x in parse(b)]
    keys = {k for x, y in zip(fa, fb) for k in set(x) | set(y) if not eq(x.get(k), y.get(k))}
    return sorted(keys) + (["<number of records>"] if len(fa) != len(fb) else [])


def main() -> int:
    old, new = Path(sys.argv[1]), Path(sys.argv[2])
    st = Storage(StorageConfig())
    for rel in [x.strip() for x in Path(sys.argv[3]).read_text().splitlines() if x.strip()]:
        a, b = old / rel, new / rel
        if rel.endswith(".parquet"):
            print(rel, "values equal" if parquet_equal(st, a, b) else "VALUES DIFFER")
        elif rel.endswith((".pt", ".json", ".jsonl")):
            keys = differing_keys(a, b)
            print(rel, "equal" if not keys else f"differs in {keys}")
        else:
            print(rel, "bytes differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
