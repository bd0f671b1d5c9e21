"""Write parsed entries as a corpus in the input format (the shell: storage, threads).

Under the corpus root `out`:

    metadata/split=<split>/part-NNNNN.jsonl   one record per utterance (the input format,
                        `split` always set) plus provenance: recording_id, and for audio
                        written here source_uri, source_start, source_end
    audio/<split>/<speaker>/<utt_id>.wav      16 kHz mono 16-bit: cut segments and audio
                        converted from other formats (and all audio with ingest.copy_audio);
                        audio already in the format is referenced where it is
    rejects.parquet     utt_id, reason, detail (core.runs.REJECT_SCHEMA)
    lexicon.txt         a copy of ingest.lexicon, when given (what `amflow decode` reads)
    _SUCCESS.json       counts (in = out + rejected), rejects per reason, utterances and
                        hours per split, speakers, the inputs and the fingerprint
    _import.json        written first: marks the root as an import's (also a killed one)

Re-running with the same inputs and config is a no-op (the fingerprint in _SUCCESS.json);
with other inputs, or --force, the import is redone and the metadata parts and audio files
of the previous import that the new one does not have are removed. A corpus root that
holds a corpus `amflow import` did not write is refused.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field

from core.config import ConfigError, IngestConfig
from core.progress import Progress
from core.runs import ConservationError, Reject, StepError, rejects_table
from core.storage import Storage, join
# The OOV check must split and case words exactly as `amflow decode` and `amflow lm` do:
# pure text functions, no model.
from tasks.speech.lexicon import LexiconError, read_lexicon, words_of
import tasks.importers.kaldi as kaldi
import tasks.importers.lhotse as lhotse
from tasks.importers.audio import Cut, read_recording
from tasks.importers.entries import Entry, Parsed, read_manifest

log = logging.getLogger(__name__)

GENERATOR = "amflow import"
IMPORT_VERSION = 1  # bump when the same inputs would give different output
SUCCESS = "_SUCCESS.json"
OWNER = "_import.json"  # marks a corpus root as written by `amflow import`
REJECTS = "rejects.parquet"
LEXICON = "lexicon.txt"
PART_RECORDS = 20000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Source:
    """What to import: the format, its files (name -> URI) and their text."""

    format: str  # kaldi | lhotse
    inputs: dict[str, str]
    texts: dict[str, str] = field(default_factory=dict)
    audio_root: str = ""  # base of relative audio paths

    def parse(self) -> Parsed:
        if self.format == "kaldi":
            parsed = kaldi.parse_kaldi_dir(self.texts, self.audio_root)
        else:
            parsed = lhotse.parse_lhotse(self.texts["recordings"], self.texts["supervisions"],
                                         self.audio_root)
        parsed.inputs = dict(self.inputs)
        return parsed


def read_kaldi(storage: Storage, src: str, audio_root: str = "") -> Source:
    """The Kaldi data directory `src`: wav.scp and utt2spk required, the rest if there."""
    source = Source("kaldi", {}, audio_root=audio_root or src)
    for name in (*kaldi.REQUIRED, *kaldi.OPTIONAL):
        uri = join(src, name)
        if storage.exists(uri):
            try:
                source.inputs[name], source.texts[name] = uri, storage.read_text(uri)
            except UnicodeDecodeError as exc:
                raise StepError(f"{uri}: not UTF-8 text ({exc})") from None
        elif name in kaldi.REQUIRED:
            raise StepError(f"{uri} not found: a Kaldi data directory needs "
                            f"{' and '.join(kaldi.REQUIRED)} (--src)")
    return source


def find_lhotse(storage: Storage, src: str) -> tuple[str, str]:
    """(recordings, supervisions) manifest URIs in the folder `src`, one of each."""
    found: dict[str, list[str]] = {"recordings": [], "supervisions": []}
    for uri in storage.list(src):
        name = uri.rsplit("/", 1)[-1]
        for kind in found:
            if kind in name and (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
                found[kind].append(uri)
    for kind, uris in found.items():
        if len(uris) != 1:
            raise StepError(f"--src {src}: want one *{kind}*.jsonl[.gz] manifest, found "
                            f"{len(uris)} ({', '.join(uris) or 'none'}); name them with "
                            f"--recordings and --supervisions")
    return found["recordings"][0], found["supervisions"][0]


def read_lhotse(storage: Storage, recordings: str, supervisions: str,
                audio_root: str = "") -> Source:
    source = Source("lhotse", {"recordings": recordings, "supervisions": supervisions},
                    audio_root=audio_root or recordings.rsplit("/", 1)[0])
    for name, uri in source.inputs.items():
        if not storage.exists(uri):
            raise StepError(f"lhotse {name} manifest {uri} not found")
        try:
            source.texts[name] = read_manifest(storage, uri)
        except ValueError as exc:
            raise StepError(f"lhotse {name} manifest {exc}") from None
    return source


def safe_name(name: str) -> str:
    """A file name for an id: unsafe characters replaced, plus a hash if any were."""
    clean = _UNSAFE.sub("_", name)[:120]
    if clean == name:
        return name
    return f"{clean}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def load_vocabulary(storage: Storage, uri: str) -> tuple[set[str] | None, str]:
    """(the lexicon's words, its text), or (None, "") without ingest.lexicon."""
    if not uri.strip():
        return None, ""
    try:
        text = storage.read_text(uri)
        return set(read_lexicon(text).prons), text
    except FileNotFoundError:
        raise ConfigError("ingest.lexicon", f"file not found: {uri}") from None
    except LexiconError as exc:
        raise ConfigError("ingest.lexicon", f"{uri}: {exc}") from None


def assign_splits(entries: list[Entry], icfg: IngestConfig, vocab: set[str] | None
                  ) -> tuple[list[tuple[Entry, str]], list[Reject]]:
    """Each entry's split (transcribed: ingest.split, else unlabeled), or a reject: a
    dev/test entry without text, a transcript without words, or words not in `vocab`."""
    kept, rejects = [], []
    for e in entries:
        if e.text is None:
            if icfg.split in ("dev", "test"):
                rejects.append(Reject(e.utt_id, "empty_text", f"no transcript, and "
                                      f"ingest.split={icfg.split} needs one"))
            else:
                kept.append((e, "unlabeled"))
            continue
        words = words_of(e.text)
        oov = sorted({w for w in words if w not in vocab}) if vocab is not None else []
        if not words:
            rejects.append(Reject(e.utt_id, "empty_text", f"no words in {e.text!r:.80}"))
        elif oov:
            rejects.append(Reject(e.utt_id, "oov_words", f"{len(oov)} not in ingest.lexicon: "
                                  f"{' '.join(oov[:20])}"))
        else:
            kept.append((e, icfg.split))
    return kept, rejects


def fingerprint(source: Source, icfg: IngestConfig, lexicon_text: str) -> str:
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    key = {"version": IMPORT_VERSION, "format": source.format, "audio_root": source.audio_root,
           "texts": {k: digest(v) for k, v in sorted(source.texts.items())},
           "config": {k: v for k, v in asdict(icfg).items() if k != "workers"},
           "lexicon": digest(lexicon_text)}
    return digest(json.dumps(key, sort_keys=True))[:32]


def previous_import(storage: Storage, out: str) -> tuple[bool, dict | None]:
    """(does `out` hold an earlier import, its _SUCCESS.json if that one finished); a
    StepError if `out` holds a corpus that `amflow import` did not write (never overwrite
    a user's corpus). OWNER is written before anything else, so an import killed half-way
    is still known as ours."""
    prev = None
    if storage.exists(join(out, SUCCESS)):
        try:
            prev = storage.read_json(join(out, SUCCESS))
        except (ValueError, OSError):
            prev = None
    if isinstance(prev, dict) and prev.get("generator") == GENERATOR:
        return True, prev
    if storage.exists(join(out, OWNER)):
        return True, None
    if storage.list(join(out, "metadata"), recursive=True) \
            or storage.exists(join(out, "metadata.jsonl")) \
            or storage.exists(join(out, "alignments.ctm")):
        raise StepError(f"{out} already holds a corpus that `amflow import` did not write; "
                        f"choose another --out")
    return False, None


def _record(cut: Cut, split: str, icfg: IngestConfig, audio_uri: str) -> dict:
    e = cut.entry
    rec = {"utt_id": e.utt_id, "speaker_id": e.speaker_id, "duration": round(cut.seconds, 4),
           "created_at": icfg.created_at.strip() or cut.mtime, "locale": icfg.locale,
           "audio_uri": audio_uri}
    if e.text is not None:
        rec["text"] = e.text
    if icfg.condition:
        rec["condition"] = icfg.condition
    rec["split"] = split
    rec["recording_id"] = e.recording_id
    if cut.wav is not None:
        rec.update(source_uri=e.audio_uri, source_start=e.start, source_end=e.end)
    return rec


def import_recording(storage: Storage, out: str, items: list[tuple[int, Entry, str]],
                     icfg: IngestConfig) -> list[tuple[int, dict | Reject]]:
    """One recording's entries -> (index, metadata record or reject); cut audio is stored."""
    split_of = {id(e): (i, s) for i, e, s in items}
    results: list[tuple[int, dict | Reject]] = []
    for cut in read_recording(storage, items[0][1].audio_uri, [e for _, e, _ in items],
                              icfg.copy_audio):
        index, split = split_of[id(cut.entry)]
        if cut.reason:
            results.append((index, Reject(cut.entry.utt_id, cut.reason, cut.detail)))
            continue
        uri = cut.entry.audio_uri
        if cut.wav is not None:
            uri = (f"audio/{split}/{safe_name(cut.entry.speaker_id)}/"
                   f"{safe_name(cut.entry.utt_id)}.wav")
            storage.write_bytes(join(out, uri), cut.wav)
        results.append((index, _record(cut, split, icfg, uri)))
    return results


def import_all(storage: Storage, out: str, kept: list[tuple[Entry, str]],
               icfg: IngestConfig) -> tuple[list[dict], list[Reject]]:
    """Every kept entry, one recording at a time on `ingest.workers` threads, in order."""
    groups: dict[str, list[tuple[int, Entry, str]]] = defaultdict(list)
    for i, (e, split) in enumerate(kept):
        groups[e.audio_uri].append((i, e, split))
    done: dict[int, dict | Reject] = {}
    audio_s = 0.0
    with Progress(len(groups), "import", unit="recordings") as bar, \
            ThreadPoolExecutor(max_workers=icfg.workers) as pool:
        futures = [pool.submit(import_recording, storage, out, g, icfg) for g in groups.values()]
        for fut in as_completed(futures):
            for index, res in fut.result():
                done[index] = res
                audio_s += res["duration"] if isinstance(res, dict) else 0.0
            bar.update(1, hours=audio_s / 3600.0)
    ordered = [done[i] for i in range(len(kept))]
    return ([r for r in ordered if isinstance(r, dict)],
            [r for r in ordered if isinstance(r, Reject)])


def write_metadata(storage: Storage, out: str, records: list[dict]) -> list[str]:
    """metadata/split=<s>/part-NNNNN.jsonl; returns the URIs written."""
    by_split: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_split[r["split"]].append(r)
    written = []
    for split, recs in sorted(by_split.items()):
        for k in range(0, len(recs), PART_RECORDS):
            uri = join(out, "metadata", f"split={split}", f"part-{k // PART_RECORDS:05d}.jsonl")
            storage.write_text(uri, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                            for r in recs[k:k + PART_RECORDS]))
            written.append(uri)
    return written


def _our_files(storage: Storage, out: str) -> tuple[set[str], set[str]]:
    """(metadata part URIs, audio URIs) an earlier import wrote under `out`: the audio
    is what its records point at relative to the root (files it referenced are not ours)."""
    parts = set(storage.list(join(out, "metadata"), suffix=".jsonl", recursive=True))
    audio = set()
    for uri in parts:
        for line in storage.read_text(uri).splitlines():
            try:
                rel = json.loads(line).get("audio_uri", "") if line.strip() else ""
            except (ValueError, AttributeError):
                continue  # not ours to judge: the new import rewrites the metadata anyway
            if isinstance(rel, str) and rel and "://" not in rel and not rel.startswith("/"):
                audio.add(join(out, rel))
    return parts, audio


def import_corpus(storage: Storage, source: Source, out: str, icfg: IngestConfig,
                  force: bool = False) -> dict:
    """Parse `source`, write the corpus under `out`, return the _SUCCESS.json summary."""
    started = time.time()
    vocab, lexicon_text = load_vocabulary(storage, icfg.lexicon)
    fp = fingerprint(source, icfg, lexicon_text)
    ours, prev = previous_import(storage, out)
    if prev is not None and prev.get("fingerprint") == fp and not force:
        log.info("import: %s already holds this import (%s): nothing to do", out, fp)
        return dict(prev, skipped=True)
    old_parts, old_audio = _our_files(storage, out) if ours else (set(), set())
    storage.write_json(join(out, OWNER), {"generator": GENERATOR})
    parsed = source.parse()
    kept, rejects = assign_splits(parsed.entries, icfg, vocab)
    rejects = parsed.rejects + rejects
    log.info("import: %d %s items, %d entries to read from %d recordings, %d rejected so far",
             parsed.items_in, source.format, len(kept), len({e.audio_uri for e, _ in kept}),
             len(rejects))
    records, audio_rejects = import_all(storage, out, kept, icfg)
    rejects += audio_rejects
    counts = {"in": parsed.items_in, "out": len(records), "rejected": len(rejects)}
    if counts["in"] != counts["out"] + counts["rejected"]:
        raise ConservationError(f"import: items in ({counts['in']}) != out ({counts['out']}) "
                                f"+ rejected ({counts['rejected']})")
    parts = write_metadata(storage, out, records)
    new_audio = {join(out, r["audio_uri"]) for r in records if "source_uri" in r}
    for stale in sorted((old_parts - set(parts)) | (old_audio - new_audio)):
        storage.delete(stale)
    storage.write_parquet(join(out, REJECTS), rejects_table(rejects))
    if lexicon_text:
        storage.write_text(join(out, LEXICON), lexicon_text)
    summary = _summary(source, out, fp, counts, records, rejects, icfg, started)
    summary["lexicon"] = {"uri": icfg.lexicon, "words": len(vocab)} if vocab else None
    storage.write_json(join(out, SUCCESS), summary)
    log.info("import: %d utterances (%.2f h) into %s, %d rejected %s", counts["out"],
             summary["audio_s"] / 3600.0, out, counts["rejected"], summary["rejects_by_reason"])
    return dict(summary, skipped=False)


def _summary(source: Source, out: str, fp: str, counts: dict, records: list[dict],
             rejects: list[Reject], icfg: IngestConfig, started: float) -> dict:
    seconds: dict[str, float] = defaultdict(float)
    speakers: dict[str, set] = defaultdict(set)
    for r in records:
        seconds[r["split"]] += r["duration"]
        speakers[r["split"]].add(r["speaker_id"])
    written = sum(1 for r in records if "source_uri" in r)
    return {
        "generator": GENERATOR, "format": source.format, "inputs": source.inputs,
        "audio_root": source.audio_root, "out": out, "fingerprint": fp, "counts": counts,
        "rejects_by_reason": dict(sorted(Counter(r.reason for r in rejects).items())),
        "utterances": counts["out"],
        "per_split": dict(sorted(Counter(r["split"] for r in records).items())),
        "split_seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
        "split_hours": {k: round(v / 3600.0, 4) for k, v in sorted(seconds.items())},
        "audio_s": round(sum(seconds.values()), 3),
        "speakers": len({r["speaker_id"] for r in records}),
        "speakers_per_split": {k: len(v) for k, v in sorted(speakers.items())},
        "transcribed": sum(1 for r in records if "text" in r),
        "audio_files_written": written, "audio_referenced": counts["out"] - written,
        "wall_s": round(time.time() - started, 3),
        "created_at": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(
            timespec="seconds"),
        "config": asdict(icfg),
    }
