"""A corpus root's imports: one per source split, each owning what it wrote.

    _imports/<split>.json            the ledger of the import of that source split: its
                                     inputs, fingerprint, counts (in = out + rejected),
                                     records per split, speakers, lexicon digest
    _imports/<split>.rejects.parquet its rejects
    metadata/split=<s>/<split>-part-NNNNN.jsonl   its records (a labeled source's
                                     untranscribed records land in split=unlabeled, still
                                     named after the source that wrote them)

So `amflow import --src labeled=A` then `--src dev=B` then `--src test=C` adds splits
one by one; another import of a split that is already there replaces it only with
--force; an utt_id in two splits is refused. The root's `_SUCCESS.json` and
`rejects.parquet` are rebuilt from the ledgers after every import.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from typing import Any, Iterable

import pyarrow as pa

from core.outcomes import REJECT_SCHEMA, SUCCESS, StepError
from core.storage import Storage, join

GENERATOR = "amflow import"
LAYOUT = "splits"  # root _SUCCESS.json of a corpus whose imports keep per-split ledgers
SPLITS = ("labeled", "unlabeled", "dev", "test")
LEDGERS = "_imports"
OWNER = "_import.json"  # marks a corpus root as written by `amflow import`
REJECTS = "rejects.parquet"
_PART = re.compile(r"^(labeled|unlabeled|dev|test)-part-\d{5}\.jsonl$")


def part_name(source: str, index: int) -> str:
    return f"{source}-part-{index:05d}.jsonl"


def owner_of(part_uri: str) -> str | None:
    """The source split that wrote a metadata part (by its name); None: not ours (or an
    older amflow import's `part-NNNNN.jsonl`)."""
    m = _PART.match(part_uri.rsplit("/", 1)[-1])
    return m.group(1) if m else None


def ledger_uri(out: str, source: str) -> str:
    return join(out, LEDGERS, f"{source}.json")


def rejects_uri(out: str, source: str) -> str:
    return join(out, LEDGERS, f"{source}.rejects.parquet")


def read_ledgers(storage: Storage, out: str) -> dict[str, dict]:
    """source split -> its finished import's ledger."""
    found = {}
    for s in SPLITS:
        uri = ledger_uri(out, s)
        if storage.exists(uri):
            try:
                found[s] = storage.read_json(uri)
            except (ValueError, OSError):
                continue  # half written: as if that import never finished
    return found


def check_root(storage: Storage, out: str, force: bool) -> list[str]:
    """Refuse a root holding a corpus `amflow import` did not write; the metadata parts an
    older amflow import wrote (one import per root), which only --force replaces."""
    parts = storage.list(join(out, "metadata"), suffix=".jsonl", recursive=True)
    ours = storage.exists(join(out, OWNER))
    if not ours and (parts or storage.list(join(out, "metadata"), recursive=True)
                     or storage.exists(join(out, "metadata.jsonl"))
                     or storage.exists(join(out, "alignments.ctm"))):
        raise StepError(f"{out} already holds a corpus that `amflow import` did not write; "
                        f"choose another --out")
    legacy = [p for p in parts if owner_of(p) is None]
    if legacy and not force:
        raise StepError(f"{out} holds {len(legacy)} metadata file(s) of an older `amflow "
                        f"import` (one import per corpus root, e.g. {legacy[0]}): --force "
                        f"replaces them with this import, or choose another --out")
    return legacy


def owned_files(storage: Storage, parts: Iterable[str], out: str) -> set[str]:
    """The audio files under `out` that the records of `parts` point at (relative
    `audio_uri`s: files an import referenced in place are not ours to delete)."""
    audio = set()
    for uri in parts:
        for line in storage.read_text(uri).splitlines():
            try:
                rel = json.loads(line).get("audio_uri", "") if line.strip() else ""
            except (ValueError, AttributeError):
                continue
            if isinstance(rel, str) and rel and "://" not in rel and not rel.startswith("/"):
                audio.add(join(out, rel))
    return audio


def parts_of(storage: Storage, out: str, sources: Iterable[str]) -> list[str]:
    wanted = set(sources)
    return [p for p in storage.list(join(out, "metadata"), suffix=".jsonl", recursive=True)
            if owner_of(p) in wanted]


def check_clashes(storage: Storage, out: str, new: dict[str, list[tuple[str, str]]],
                  kept_sources: Iterable[str]) -> None:
    """Refuse (a StepError naming the ids, the splits and the fix) an utt_id that two
    sources of this import write, or that a kept earlier import's split holds.
    `new`: source -> [(utt_id, split)] it is about to write."""
    seen: dict[str, str] = {}
    for part in parts_of(storage, out, kept_sources):
        src = owner_of(part) or "?"
        for line in storage.read_text(part).splitlines():
            if line.strip():
                seen[json.loads(line)["utt_id"]] = f"split {src} (imported before)"
    clashes: list[str] = []
    for source, items in new.items():
        for utt, _split in items:
            if utt in seen:
                clashes.append(f"{utt}: in {seen[utt]} and in --src {source}")
            seen.setdefault(utt, f"--src {source}")
    if clashes:
        raise StepError(f"{len(clashes)} utt_id(s) would be in two splits (each utterance "
                        f"belongs to one split; give them distinct ids, or drop them from "
                        f"one source; --force replaces only the splits this import names): "
                        + "; ".join(clashes[:10]) + (" ..." if len(clashes) > 10 else ""))


def root_summary(ledgers: dict[str, dict]) -> dict[str, Any]:
    """The corpus root's _SUCCESS.json from its imports' ledgers (counts summed; the
    fingerprint is that of every source's, so `select` sees a split added or replaced)."""
    counts = Counter()
    per_split, seconds, reasons, rates = Counter(), Counter(), Counter(), Counter()
    speakers: dict[str, set] = {}
    written = referenced = transcribed = 0
    for led in ledgers.values():
        counts.update(led["counts"])
        per_split.update(led["per_split"])
        seconds.update(led["split_seconds"])
        reasons.update(led["rejects_by_reason"])
        rates.update(led.get("source_rates", {}))
        for split, spk in led["speakers"].items():
            speakers.setdefault(split, set()).update(spk)
        written += led["audio_files_written"]
        referenced += led["audio_referenced"]
        transcribed += led["transcribed"]
    fp = json.dumps(sorted((s, led["fingerprint"]) for s, led in ledgers.items()))
    return {
        "generator": GENERATOR, "layout": LAYOUT,
        "fingerprint": hashlib.sha256(fp.encode()).hexdigest()[:32],
        "sources": {s: {k: led[k] for k in ("format", "inputs", "audio_root", "fingerprint",
                                            "counts", "per_split", "rejects_by_reason",
                                            "finished_at")}
                    for s, led in sorted(ledgers.items())},
        "counts": {k: int(counts[k]) for k in ("in", "out", "rejected")},
        "rejects_by_reason": dict(sorted(reasons.items())),
        "utterances": int(counts["out"]), "per_split": dict(sorted(per_split.items())),
        "source_rates": dict(sorted(rates.items())),  # utterances per recording rate (Hz)
        "split_seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
        "split_hours": {k: round(v / 3600.0, 4) for k, v in sorted(seconds.items())},
        "audio_s": round(sum(seconds.values()), 3),
        "speakers": len(set().union(*speakers.values())) if speakers else 0,
        "speakers_per_split": {k: len(v) for k, v in sorted(speakers.items())},
        "transcribed": transcribed, "audio_files_written": written,
        "audio_referenced": referenced,
    }


def merged_rejects(storage: Storage, out: str, sources: Iterable[str]) -> pa.Table:
    tables = [storage.read_parquet(rejects_uri(out, s)) for s in sorted(sources)
              if storage.exists(rejects_uri(out, s))]
    return pa.concat_tables(tables) if tables else REJECT_SCHEMA.empty_table()
