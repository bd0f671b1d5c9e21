"""What to change when a step rejects an utterance, by reject reason.

A step that rejects every input must not stop with a bare "nothing to do": it writes its
rejects and says which reasons rejected how many and which key or file to change
(`nothing_left`). The hints name config keys and inputs, not code.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

HINTS = {
    "no_clean_audio": "the records have no clean rendering: set align.audio=stored (and "
                      "evaluate.audio=stored) to use the recordings as they are, or mark "
                      "clean recordings (`amflow import --set ingest.clean=true`, or "
                      "`clean_audio_uri` / `clean: true` in the metadata)",
    "missing_audio": "the audio_uri does not exist: check the metadata's paths (relative "
                     "ones are under data.corpus) or ingest.audio_root",
    "unreadable_audio": "the audio could not be read from storage: check storage.s3 / "
                        "permissions",
    "corrupt_audio": "the files are not WAV/FLAC audio: convert them (amflow import does)",
    "wrong_sample_rate": "the audio's rate differs from features.sample_rate: set "
                         "features.resample=true or features.sample_rate to the audio's rate",
    "wrong_channels": "the audio has several channels: set features.downmix=true",
    "duration_mismatch": "the audio's length disagrees with the metadata's `duration`: "
                         "raise features.duration_tolerance or fix the metadata",
    "no_transcript": "the records have no `text`: align/decode need transcribed splits "
                     "(align.splits, --split)",
    "oov_word": "transcript words are missing from the lexicon (data.lexicon or "
                "<corpus>/lexicon.txt): add them, or import with ingest.g2p=espeak",
    "oov_words": "transcript words are missing from ingest.lexicon: add them, or set "
                 "ingest.g2p=espeak to make their pronunciations",
    "too_short": "the utterances are shorter than their phones need: check the "
                 "transcripts or drop them",
    "no_path": "no alignment fits: raise align.retry_beam, or check the transcripts",
    "align_failed": "alignment failed: raise align.retry_beam, or check the transcripts",
    "missing_alignment": "no alignment for the utterance: run `amflow align` on its split "
                         "(align.splits) or give alignments.ctm",
}


def by_reason(reasons: Iterable[str]) -> list[tuple[str, int]]:
    return Counter(reasons).most_common()


def nothing_left(step: str, n_in: int, reasons: Iterable[str], where: str) -> str:
    """`<step>: all N inputs were rejected: no_clean_audio 12 (fix: ...); ... Rejects: <where>`"""
    counts = by_reason(reasons)
    parts = [f"{reason} {n}" + (f" ({HINTS[reason]})" if reason in HINTS else "")
             for reason, n in counts]
    return (f"{step}: all {n_in} utterances were rejected, none is left: "
            + ("; ".join(parts) or "no reason recorded") + (f". Rejects: {where}" if where
                                                             else ""))
