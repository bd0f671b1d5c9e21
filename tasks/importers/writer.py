"""Write parsed entries as a corpus in the input format (the shell: storage, threads).

Under the corpus root `out`, one import per source split (ledger.py: an import adds a
split beside those earlier imports wrote, and replaces one only with --force):

    metadata/split=<split>/<source>-part-NNNNN.jsonl   one record per utterance (the input
                        format, `split` always set; `text` normalized by the
                        ingest.locale rule, text_normalize.py, the transcript as given in
                        `text_original` where that changed it) plus provenance:
                        recording_id, and for audio written here source_uri,
                        source_start, source_end
    audio/<split>/<speaker>/<utt_id>.wav      mono 16-bit at ingest.sample_rate (16 kHz):
                        cut segments and audio converted from other formats or rates
                        (and all audio with ingest.copy_audio);
                        audio already in the format is referenced where it is
    _imports/<source>.json, <source>.rejects.parquet   each import's ledger and rejects
    rejects.parquet     every split's rejects: utt_id, shard (the source split), reason,
                        detail (core.outcomes.REJECT_SCHEMA)
    lexicon.txt         a copy of ingest.lexicon, when given (what `amflow decode` reads)
    _SUCCESS.json       over every split: counts (in = out + rejected, also per source),
                        rejects per reason, utterances and hours per split, speakers, the
                        sources and the fingerprint
    _import.json        written first: marks the root as an import's (also a killed one)

Re-running with the same inputs and config is a no-op (each split's fingerprint); with
other inputs, --force redoes that split and removes the metadata parts and audio files of
its previous import that the new one does not have; without --force it is refused. A
corpus root that holds a corpus `amflow import` did not write is refused.
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
import dataclasses
from dataclasses import asdict, dataclass, field

from core.config import ConfigError, IngestConfig
from core.progress import Progress
from core.outcomes import ConservationError, Reject, StepError, rejects_table
from core.storage import Storage, join
# The OOV check must split and case words exactly as `amflow decode` and `amflow lm` do:
# pure text functions, no model.
from tasks.speech.lexicon import LexiconError, read_lexicon, words_of
import tasks.importers.kaldi as kaldi
import tasks.importers.ledger as ledger
import tasks.importers.lexicons as lexicons
import tasks.importers.lhotse as lhotse
import tasks.importers.text_normalize as text_normalize
from tasks.importers.audio import Cut, read_recording
from tasks.importers.entries import Entry, Parsed, read_manifest

log = logging.getLogger(__name__)

GENERATOR = ledger.GENERATOR
# Bump when the same inputs would give different output (3: transcripts normalized).
IMPORT_VERSION = 3
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


def text_rule(icfg: IngestConfig) -> text_normalize.Rule:
    """The transcript rule of ingest.locale; a ConfigError naming it when there is none."""
    try:
        return text_normalize.rule_for(icfg.locale)
    except ValueError as exc:
        raise ConfigError("ingest.locale", str(exc)) from None


def assign_splits(entries: list[Entry], icfg: IngestConfig, vocab: set[str] | None,
                  unpronounced: dict[str, str] | None = None
                  ) -> tuple[list[tuple[Entry, str]], list[Reject]]:
    """Each entry's split (transcribed: ingest.split, else unlabeled), or a reject: a
    dev/test entry without text, a transcript without words, or words not in `vocab`
    (no_pronunciation when G2P tried them: `unpronounced` word -> why)."""
    unpronounced = unpronounced or {}
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
        elif oov and any(w in unpronounced for w in oov):
            rejects.append(Reject(e.utt_id, "no_pronunciation", "; ".join(
                f"{w}: {unpronounced.get(w, 'not in ingest.lexicon')}" for w in oov[:10])))
        elif oov:
            rejects.append(Reject(e.utt_id, "oov_words", f"{len(oov)} not in ingest.lexicon: "
                                  f"{' '.join(oov[:20])}"))
        else:
            kept.append((e, icfg.split))
    return kept, rejects


def pronounce_missing(storage: Storage, out: str, parsed: list[Parsed], vocab: set[str] | None,
                      lexicon_text: str, icfg: IngestConfig
                      ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """ingest.g2p: pronunciations for the transcripts' words that ingest.lexicon lacks
    (every word, without one); ({}, {}) when off."""
    if icfg.g2p == "off":
        return {}, {}
    words = {w for p in parsed for e in p.entries if e.text for w in words_of(e.text)}
    return lexicons.pronounce(storage, out, sorted(w for w in words
                                                   if vocab is None or w not in vocab),
                              lexicon_text, icfg)


def fingerprint(source: Source, icfg: IngestConfig, lexicon_text: str) -> str:
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    key = {"version": IMPORT_VERSION, "format": source.format, "audio_root": source.audio_root,
           "texts": {k: digest(v) for k, v in sorted(source.texts.items())},
           "config": {k: v for k, v in asdict(icfg).items() if k != "workers"},
           "lexicon": digest(lexicon_text)}
    return digest(json.dumps(key, sort_keys=True))[:32]


def _record(cut: Cut, split: str, icfg: IngestConfig, audio_uri: str) -> dict:
    e = cut.entry
    rec = {"utt_id": e.utt_id, "speaker_id": e.speaker_id, "duration": round(cut.seconds, 4),
           "created_at": icfg.created_at.strip() or cut.mtime, "locale": icfg.locale,
           "audio_uri": audio_uri}
    if e.text is not None:
        rec["text"] = e.text
        if e.text_original is not None:  # normalizing changed it: the transcript as given
            rec["text_original"] = e.text_original
    if icfg.condition:
        rec["condition"] = icfg.condition
    if icfg.clean:  # the audio is a clean source (example servers, align/evaluate.audio)
        rec["clean"] = True
    rec["split"] = split
    rec["recording_id"] = e.recording_id
    rec["source_rate"] = cut.source_rate
    if cut.wav is not None:
        rec.update(source_uri=e.audio_uri, source_start=e.start, source_end=e.end)
    return rec


def import_recording(storage: Storage, out: str, items: list[tuple[int, Entry, str]],
                     icfg: IngestConfig) -> list[tuple[int, dict | Reject]]:
    """One recording's entries -> (index, metadata record or reject); cut audio is stored."""
    split_of = {id(e): (i, s) for i, e, s in items}
    results: list[tuple[int, dict | Reject]] = []
    for cut in read_recording(storage, items[0][1].audio_uri, [e for _, e, _ in items],
                              icfg.copy_audio, icfg.sample_rate):
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


def write_metadata(storage: Storage, out: str, records: list[dict], source: str) -> list[str]:
    """metadata/split=<s>/<source>-part-NNNNN.jsonl; returns the URIs written."""
    by_split: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_split[r["split"]].append(r)
    written = []
    for split, recs in sorted(by_split.items()):
        for k in range(0, len(recs), PART_RECORDS):
            uri = join(out, "metadata", f"split={split}",
                       ledger.part_name(source, k // PART_RECORDS))
            storage.write_text(uri, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                            for r in recs[k:k + PART_RECORDS]))
            written.append(uri)
    return written


def import_corpus(storage: Storage, source: Source, out: str, icfg: IngestConfig,
                  force: bool = False) -> dict:
    """One source as split `ingest.split` (see import_sources)."""
    return import_sources(storage, {icfg.split: source}, out, icfg, force=force)


def import_sources(storage: Storage, sources: dict[str, Source], out: str,
                   icfg: IngestConfig, force: bool = False) -> dict:
    """Each source (source split -> Source) into the corpus at `out`, beside the splits
    earlier imports wrote there; returns the root's _SUCCESS.json summary (the whole
    corpus) with `imported` (the splits written now) and `skipped`.

    A split already imported from the same inputs and config is skipped; from others it
    is refused unless `force` (then replaced: its old records and audio removed). An
    utt_id that two splits would hold is refused before anything is written."""
    started = time.time()
    for s in sources:
        if s not in ledger.SPLITS:
            raise StepError(f"--src {s}=...: the split must be one of "
                            f"{', '.join(ledger.SPLITS)} (or train, Kaldi's name for labeled)")
    rule = text_rule(icfg)
    vocab, lexicon_text = load_vocabulary(storage, icfg.lexicon)
    legacy = ledger.check_root(storage, out, force)
    ledgers = ledger.read_ledgers(storage, out)
    plans = {s: dataclasses.replace(icfg, split=s) for s in sources}
    fps = {s: fingerprint(src, plans[s], lexicon_text) for s, src in sources.items()}
    todo = _to_import(ledgers, fps, force)
    if not todo and not legacy and storage.exists(join(out, ledger.SUCCESS)):
        log.info("import: %s already holds these imports (%s): nothing to do", out,
                 ", ".join(sorted(sources)))
        return dict(storage.read_json(join(out, ledger.SUCCESS)), skipped=True, imported=[])
    storage.write_json(join(out, ledger.OWNER), {"generator": GENERATOR})
    parsed = {s: sources[s].parse() for s in todo}
    for s in todo:  # before G2P and the OOV check: they see the normalized words only
        text_normalize.normalize_entries(parsed[s], rule)
    made, failed = pronounce_missing(storage, out, [parsed[s] for s in todo], vocab,
                                     lexicon_text, icfg)
    if icfg.g2p != "off":
        vocab = (vocab or set()) | set(made)
    kept, early = {}, {}
    for s in todo:
        kept[s], early[s] = assign_splits(parsed[s].entries, plans[s], vocab, failed)
    ledger.check_clashes(storage, out, {s: [(e.utt_id, sp) for e, sp in kept[s]]
                                        for s in todo},
                         [s for s in ledgers if s not in todo])
    if legacy:  # --force over an older import's corpus: its files go
        for stale in sorted(set(legacy) | ledger.owned_files(storage, legacy, out)):
            storage.delete(stale)
    for s in todo:
        _write_source(storage, out, s, sources[s], parsed[s], kept[s], early[s], plans[s],
                      fps[s], lexicon_text)
        lexicons.write_g2p(storage, out, s, made, failed, parsed[s].entries)
    return _write_root(storage, out, icfg, lexicon_text, todo, started)


def _to_import(ledgers: dict[str, dict], fps: dict[str, str], force: bool) -> list[str]:
    """The source splits to (re)import; a StepError for a split imported from other inputs
    or config without `force` (never replace another import's records unasked)."""
    todo = []
    for s, fp in sorted(fps.items()):
        led = ledgers.get(s)
        if led is not None and led.get("fingerprint") == fp and not force:
            log.info("import: split %s already imported from these inputs: skipped", s)
            continue
        if led is not None and not force:
            n = led.get("counts", {}).get("out", 0)
            raise StepError(
                f"split {s} was imported before from {led.get('inputs')} ({n} utterances) "
                f"with other inputs or ingest.* settings; --force replaces split {s} (and "
                f"only it), or import into another --out")
        todo.append(s)
    return todo


def _write_source(storage: Storage, out: str, source: str, src: Source, parsed: Parsed,
                  kept: list[tuple[Entry, str]], early: list[Reject], icfg: IngestConfig,
                  fp: str, lexicon_text: str) -> dict:
    """One source split's records, audio, rejects and ledger; what the split held before
    and does not hold now is removed."""
    started = time.time()
    old_parts = set(ledger.parts_of(storage, out, [source]))
    old_audio = ledger.owned_files(storage, old_parts, out)
    if storage.exists(ledger.ledger_uri(out, source)):  # unfinished until rewritten
        storage.delete(ledger.ledger_uri(out, source))
    log.info("import %s: %d %s items, %d entries to read from %d recordings, %d rejected "
             "so far", source, parsed.items_in, src.format, len(kept),
             len({e.audio_uri for e, _ in kept}), len(parsed.rejects) + len(early))
    records, audio_rejects = import_all(storage, out, kept, icfg)
    rejects = [dataclasses.replace(r, shard=source)
               for r in parsed.rejects + early + audio_rejects]
    counts = {"in": parsed.items_in, "out": len(records), "rejected": len(rejects)}
    if counts["in"] != counts["out"] + counts["rejected"]:
        raise ConservationError(f"import {source}: items in ({counts['in']}) != out "
                                f"({counts['out']}) + rejected ({counts['rejected']})")
    warn_upsampled(records, icfg.sample_rate, source)
    parts = write_metadata(storage, out, records, source)
    new_audio = {join(out, r["audio_uri"]) for r in records if "source_uri" in r}
    for stale in sorted((old_parts - set(parts)) | (old_audio - new_audio)):
        storage.delete(stale)
    storage.write_parquet(ledger.rejects_uri(out, source), rejects_table(rejects))
    led = _ledger(src, source, fp, counts, records, rejects, icfg, lexicon_text, started)
    storage.write_json(ledger.ledger_uri(out, source), led)
    log.info("import %s: %d utterances (%.2f h), %d rejected %s", source, counts["out"],
             sum(led["split_seconds"].values()) / 3600.0, counts["rejected"],
             led["rejects_by_reason"])
    return led


def warn_upsampled(records: list[dict], rate: int, source: str) -> int:
    """Recordings below ingest.sample_rate are upsampled: the band above their Nyquist
    frequency is empty, and the features' mel bins there carry nothing. A WARNING with
    the counts and the two ways out; the number of such records."""
    low = Counter(r["source_rate"] for r in records if 0 < r["source_rate"] < rate)
    if low:
        native = max(low)
        log.warning("import %s: %d utterance(s) recorded at %s Hz were upsampled to %d Hz: "
                    "nothing above %d Hz is in them. Keep them at their rate "
                    "(ingest.sample_rate=%d, then features.sample_rate=%d: mel bins up to "
                    "%d Hz), or limit the mel bins (features.high_freq=%d)", source,
                    sum(low.values()), "/".join(str(r) for r in sorted(low)), rate,
                    native // 2, native, native, native // 2, native // 2)
    return sum(low.values())


def _write_root(storage: Storage, out: str, icfg: IngestConfig, lexicon_text: str,
                imported: list[str], started: float) -> dict:
    """The root's rejects.parquet, lexicon.txt and _SUCCESS.json over every split."""
    ledgers = ledger.read_ledgers(storage, out)
    storage.write_parquet(join(out, ledger.REJECTS),
                          ledger.merged_rejects(storage, out, ledgers))
    if lexicon_text:
        digest = hashlib.sha256(lexicon_text.encode()).hexdigest()
        other = sorted(s for s, led in ledgers.items()
                       if led.get("lexicon_sha256") not in (None, digest))
        if other:
            log.warning("import: split(s) %s were checked against another ingest.lexicon "
                        "than %s, which is now %s: import them again with this one "
                        "(--force) if their words may be missing from it",
                        ", ".join(other), icfg.lexicon, join(out, LEXICON))
    lex = lexicons.write_lexicon(storage, out, lexicon_text, ledgers)
    if lex is not None:
        lex["uri"] = icfg.lexicon or None
    else:
        log.warning("import: no ingest.lexicon and ingest.g2p=off: %s has no lexicon.txt, "
                    "which align, lm and decode need (data.lexicon); set ingest.g2p=espeak "
                    "to make one from the transcripts' words", out)
    summary = ledger.root_summary(ledgers)
    summary.update(
        out=out, lexicon=lex,
        wall_s=round(time.time() - started, 3), config=asdict(icfg),
        created_at=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(
            timespec="seconds"))
    storage.write_json(join(out, ledger.SUCCESS), summary)
    log.info("import: %s holds %d utterances (%.2f h) in splits %s, %d rejected %s",
             out, summary["counts"]["out"], summary["audio_s"] / 3600.0,
             summary["per_split"], summary["counts"]["rejected"],
             summary["rejects_by_reason"])
    return dict(summary, skipped=False, imported=imported)


def _ledger(src: Source, source: str, fp: str, counts: dict, records: list[dict],
            rejects: list[Reject], icfg: IngestConfig, lexicon_text: str,
            started: float) -> dict:
    seconds: dict[str, float] = defaultdict(float)
    speakers: dict[str, set] = defaultdict(set)
    for r in records:
        seconds[r["split"]] += r["duration"]
        speakers[r["split"]].add(r["speaker_id"])
    written = sum(1 for r in records if "source_uri" in r)
    return {
        "generator": GENERATOR, "source": source, "format": src.format,
        "inputs": src.inputs, "audio_root": src.audio_root, "fingerprint": fp,
        "counts": counts,
        "rejects_by_reason": dict(sorted(Counter(r.reason for r in rejects).items())),
        "per_split": dict(sorted(Counter(r["split"] for r in records).items())),
        "source_rates": {str(k): v for k, v in sorted(Counter(r["source_rate"]
                                                              for r in records).items())},
        "split_seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
        "speakers": {k: sorted(v) for k, v in sorted(speakers.items())},
        "transcribed": sum(1 for r in records if "text" in r),
        "audio_files_written": written, "audio_referenced": counts["out"] - written,
        "lexicon_sha256": (hashlib.sha256(lexicon_text.encode()).hexdigest()
                           if lexicon_text else None),
        "wall_s": round(time.time() - started, 3),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(icfg),
    }
