"""Digest of every data file under a directory, for "same outputs to the byte" checks
(scripts/identity_check.sh). Parquet, .pt and .jsonl/.json files are digested by content
with wall-clock fields left out (times, hosts, rates); other files by their bytes.

    python scripts/identity_digest.py DIR   -> "<sha256> <relative path>" lines, sorted
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

# Keys whose values are measurements of the machine, not results.
VOLATILE = re.compile(r"(^|_)(s|wall|time|at|host|rtf|per_s|compute|elapsed|started|finished|"
                      r"seconds|sec|throughput|x_real_time|build)($|_)|_s$|_ms$|wall|rtf")
SKIP = re.compile(r"(^|/)(_SUCCESS\.json|_shards|_batches|last\.log|latest\.json)(/|$)|\.png$")


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items() if not VOLATILE.search(str(k))}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def digest(path: Path) -> str:
    h = hashlib.sha256()
    if path.suffix == ".parquet":
        h.update(repr(pq.read_table(path).to_pydict()).encode())
    elif path.suffix == ".pt":
        obj = torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
        h.update(_tensor_repr(_clean(obj)).encode())
    elif path.suffix in (".json", ".jsonl"):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for line in lines:
            if line.strip():
                h.update(json.dumps(_clean(json.loads(line)), sort_keys=True).encode())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def _tensor_repr(obj) -> str:
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k}:{_tensor_repr(v)}" for k, v in sorted(obj.items())) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_tensor_repr(v) for v in obj) + "]"
    if isinstance(obj, torch.Tensor):
        return hashlib.sha256(obj.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    return repr(obj)


def main(root: str) -> None:
    base = Path(root)
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        rel = path.relative_to(base).as_posix()
        if not SKIP.search(rel):
            print(digest(path), rel)


if __name__ == "__main__":
    main(sys.argv[1])
