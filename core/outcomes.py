"""What library work reports besides its outputs, in whatever folder it was handed:
the error that stops it (`StepError`), the items it turned away (`Reject` rows in a
rejects table), and a shard's done-marker (`shard_marker_uri`).

Libraries (tasks/, alignment/, training/, decoding/, serving/) import these from here;
where a run's folders are (`runs/<run_id>/<step>/`) is the app's business (core.runs,
which the libraries never import): a library is handed the folder to write into.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import pyarrow as pa

from core.storage import join

# The marker a finished piece of work writes last in its folder (a step's, a corpus's):
# its summary. Its presence says the folder is complete.
SUCCESS = "_SUCCESS.json"
REJECT_SCHEMA = pa.schema([("utt_id", pa.string()), ("shard", pa.string()),
                           ("reason", pa.string()), ("detail", pa.string())])


class StepError(RuntimeError):
    """A step cannot proceed (missing input, broken invariant); the message says why."""


class ConservationError(StepError):
    pass


@dataclass
class Reject:
    utt_id: str
    reason: str
    detail: str = ""
    shard: str = ""


def rejects_table(rejects: Iterable[Reject]) -> pa.Table:
    rows = list(rejects)
    return pa.table({
        "utt_id": [r.utt_id for r in rows],
        "shard": [r.shard for r in rows],
        "reason": [r.reason for r in rows],
        "detail": [r.detail[:2000] for r in rows],
    }, schema=REJECT_SCHEMA)


def shard_marker_uri(step_uri: str, shard_id: str) -> str:
    """A shard's done-marker in a step's output folder (written last, after its outputs)."""
    return join(step_uri, "_shards", f"{shard_id}.json")
