"""Alignments taken from an earlier `amflow align` instead of trained again.

A student's run labels its labeled split with its teacher's network tree, and the
teacher's run has aligned those utterances already, with the same settings. Training the
GMMs again costs minutes of CPU, and nothing guarantees the same labels the teacher and the
baseline learned: on the demo's corpus a quiet re-run gave them bit for bit, but one run
under heavy CPU load parted from pass 1 on and changed 47 % of the CTM's phone segments, at
the same score (alignment/README.md). Kaldi's recipes do the same: a later stage is
pointed at an earlier stage's alignment directory (`exp/tri3b_ali`).

`problem` says why an align output cannot stand in for this run's (None: it can); `take`
reads what this run needs from it: its utterances' rows and rejects, grouped by this run's
shards, and their CTM lines. The step (amflow/steps/align.py) writes them and copies the
models.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from core.outcomes import SUCCESS, Reject
from core.senones import ContextTree
from core.storage import Storage, join

# Settings that do not change the alignments: where the jobs run, where the network's tree
# comes from (compared as a tree below), this key itself, and the splits (the utterances
# are compared instead).
NOT_COMPARED = ("use_ray", "network_tree", "reuse", "nn_senones", "splits")
# The models and trees an align output holds besides its alignments (some are optional).
MODEL_FILES = ("tree", "topo", "phones.txt", "final.mdl", "mono.mdl", "model.pkl",
               "final.mat", "trans.ark", "nn_tree")


@dataclasses.dataclass
class Taken:
    rows: dict[str, list[dict[str, Any]]]  # this run's shard -> its utterances' rows
    rejects: list[Reject]  # this run's utterances that the source rejected
    ctm: list[str]  # the source's CTM lines of this run's utterances
    summary: dict[str, Any]  # the source's _SUCCESS.json


def compared(settings: dict[str, Any]) -> dict[str, Any]:
    """The align settings two runs must share for one's alignments to serve the other."""
    return {k: v for k, v in settings.items() if k not in NOT_COMPARED}


def teacher_align_dir(card_info: dict[str, Any]) -> str:
    """The align output of the run a teacher was trained in (its model card's train_dir is
    runs/<R>/train-<tag>); "" when the card does not say."""
    train_dir = str(card_info.get("train_dir") or "").rstrip("/")
    if "/" not in train_dir:
        return ""
    return join(train_dir.rsplit("/", 1)[0], "align")


def problem(st: Storage, src: str, settings: dict[str, Any], lexicon: str, corpus: str,
            tree: dict | None, utts: set[str]) -> str | None:
    """Why the align output `src` cannot give this run's alignments; None when it can.
    `settings`: this run's `compared` settings; `lexicon`: its lexicon's sha256; `tree`:
    the network tree this run labels with (None: the source's own)."""
    if not st.exists(join(src, SUCCESS)):
        return f"it did not finish (no {SUCCESS})"
    plan_uri = join(src, "_plan.json")
    plan = st.read_json(plan_uri) if st.exists(plan_uri) else {}
    theirs = compared(plan.get("align") or {})
    if theirs != settings:
        keys = sorted(k for k in set(theirs) | set(settings) if theirs.get(k) != settings.get(k))
        return "other align settings: " + ", ".join(f"align.{k}" for k in keys)
    if plan.get("lexicon") != lexicon:
        return ("another lexicon" if plan.get("lexicon") else
                "it records no lexicon (an older amflow wrote it)")
    if st.read_json(join(src, SUCCESS)).get("inputs", {}).get("corpus") != corpus:
        return "another corpus"
    if tree is not None and (ContextTree.from_dict(st.read_json(join(src, "nn_tree.json")))
                             != ContextTree.from_dict(tree)):
        return "another network tree than the one this run labels with"
    missing = utts - _utt_ids(st, src)
    if missing:
        return (f"{len(missing)} of the {len(utts)} utterances here were not aligned there "
                f"(e.g. {min(missing)})")
    return None


def _utt_ids(st: Storage, src: str) -> set[str]:
    """The utterances an align output aligned or rejected."""
    ids: set[str] = set()
    for uri in st.list(join(src, "alignments"), suffix=".parquet"):
        ids.update(st.read_parquet(uri, columns=["utt_id"]).column("utt_id").to_pylist())
    rejects = join(src, "rejects", "align.parquet")
    if st.exists(rejects):
        ids.update(st.read_parquet(rejects, columns=["utt_id"]).column("utt_id").to_pylist())
    return ids


def take(st: Storage, src: str, shards: dict[str, list[str]]) -> Taken:
    """This run's utterances (`shards`: its shard -> utterance ids) out of `src`, which
    `problem` accepted: each aligned one's row, each rejected one's reject."""
    wanted = {u for utts in shards.values() for u in utts}
    rows: dict[str, dict[str, Any]] = {}
    for uri in st.list(join(src, "alignments"), suffix=".parquet"):
        rows.update((r["utt_id"], r) for r in st.read_parquet(uri).to_pylist()
                    if r["utt_id"] in wanted)
    uri = join(src, "rejects", "align.parquet")
    refused = ({r["utt_id"]: r for r in st.read_parquet(uri).to_pylist()}
               if st.exists(uri) else {})
    out: dict[str, list[dict[str, Any]]] = {}
    rejects = []
    for shard, utts in shards.items():
        out[shard] = [dict(rows[u], shard=shard) for u in utts if u in rows]
        rejects += [Reject(u, refused[u]["reason"], f"in {src}: {refused[u]['detail']}", shard)
                    for u in utts if u not in rows]
    ctm = [ln for ln in st.read_text(join(src, "alignments.ctm")).splitlines()
           if ln.split(" ", 1)[0] in rows]
    return Taken(out, rejects, ctm, st.read_json(join(src, SUCCESS)))
