"""Bring the field's corpus formats into amflow's input format (`amflow import`).

    kaldi.py     a Kaldi data dir (wav.scp, utt2spk, text, segments, reco2dur, utt2dur)
                 -> entries; pure
    lhotse.py    lhotse recordings + supervisions JSONL (plain or gzipped) -> entries;
                 pure, lhotse itself is not needed
    entries.py   `Entry` (a stretch of one recording, its speaker and transcript),
                 `Parsed` (entries, rejects, items in), the reject reasons
    text_normalize.py  the transcript rule per ingest.locale (NFKC, case, accents,
                 punctuation, digits): normalized text, or a reject naming what it cannot
                 make words of
    audio.py     one recording's entries -> audio in the format (referenced in place, or
                 cut / downmixed / resampled to 16 kHz mono 16-bit WAV)
    writer.py    the shell: read the inputs, assign splits, check words against a lexicon,
                 read recordings on threads, write metadata/, audio/, rejects.parquet,
                 lexicon.txt and _SUCCESS.json under the corpus root
    ledger.py    the corpus root's imports, one per source split: what each wrote, the
                 utt_id clash check, the root summary rebuilt from them

A transcribed utterance without alignments is a first-class labeled record: `text` is
set, `alignments.ctm` is not needed. An untranscribed one is unlabeled. Every input item
ends up as exactly one record or one reject (REASONS in entries.py).
"""
from tasks.importers.entries import REASONS, Entry, Parsed
from tasks.importers.writer import (Source, find_lhotse, import_corpus, import_sources,
                                    read_kaldi, read_lhotse)

__all__ = ["REASONS", "Entry", "Parsed", "Source", "find_lhotse", "import_corpus",
           "import_sources", "read_kaldi", "read_lhotse"]
