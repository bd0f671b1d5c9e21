"""What the parsers hand the writer: one `Entry` per utterance, and the rejects.

An `Entry` names a stretch of one recording (`start`..`end` seconds of `audio_uri`, some
or all of its channels), the speaker, and the transcript (`None`: not transcribed). The
parsers are pure (text in, entries out); opening audio is the writer's job.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field

from core.outcomes import Reject
from core.storage import Storage, join

# Reject reasons of `amflow import` (the rejects table's `reason` column).
REASONS = {
    "missing_audio": "no audio entry for the utterance, or its file does not exist",
    "unreadable_audio": "the audio file exists but is not decodable audio",
    "empty_audio": "the audio (or the cut segment) holds no samples",
    "nonfinite_audio": "the samples hold NaN or inf",
    "empty_text": "the transcript is empty (or missing where the split needs one)",
    "untranscribable_text": "the transcript holds characters the ingest.locale text rule "
                            "cannot make words of (symbols, emoji, letters outside the "
                            "locale's alphabet; the detail names them)",
    "unreadable_number": "the transcript holds a number the ingest.locale text rule does "
                         "not spell out (English: only 0..99 and 1st..99th)",
    "oov_words": "the transcript has words that are not in ingest.lexicon",
    "no_pronunciation": "a word is not in ingest.lexicon and ingest.g2p made no "
                        "pronunciation for it (the detail says why)",
    "no_speaker": "no speaker for the utterance (utt2spk / supervision speaker)",
    "duplicate_utt_id": "the utterance id occurs again (or twice with different values)",
    "bad_segment": "segment end <= start, start < 0, or beyond the end of the recording",
    "duration_mismatch": "the audio's length disagrees with reco2dur/utt2dur",
    "wav_scp_pipe_unsupported": "a wav.scp command (`... |`) other than `flac -d` of a file",
    "unsupported_source": "a lhotse audio source that is not a file, or channels over files",
    "unsupported_transform": "a lhotse recording transform other than Resample",
    "malformed_entry": "a manifest line that cannot be parsed",
}


@dataclass
class Entry:
    utt_id: str
    speaker_id: str
    text: str | None  # None: not transcribed; normalized (text_normalize.py) before writing
    audio_uri: str  # absolute URI of the recording file
    recording_id: str
    start: float = 0.0
    end: float | None = None  # None: to the end of the recording
    channels: tuple[int, ...] | None = None  # channels of the file to average; None: all
    expected_s: float | None = None  # the utterance's length from utt2dur, if given
    recording_s: float | None = None  # the recording's length from reco2dur, if given
    where: str = ""  # provenance for reject details, e.g. "segments:12"
    text_original: str | None = None  # the transcript as given, where normalizing changed it

    @property
    def whole(self) -> bool:
        """Does the entry cover its whole recording (no cut needed)?"""
        return self.start == 0.0 and self.end is None


@dataclass
class Parsed:
    """A parser's result: entries to write, rejects, and how many items came in."""

    entries: list[Entry] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    items_in: int = 0
    inputs: dict[str, str] = field(default_factory=dict)  # name -> URI of the files read

    def reject(self, utt_id: str, reason: str, detail: str = "") -> None:
        assert reason in REASONS, reason
        self.rejects.append(Reject(utt_id, reason, detail))


def decode_text(data: bytes, name: str) -> str:
    """Manifest bytes -> text; gzip is decompressed (by its magic bytes: the storage layer
    may already have decompressed a `.gz` by its name). Bad bytes: a ValueError naming it."""
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: not UTF-8 text or gzipped text: {exc}") from None


def read_manifest(storage: Storage, uri: str) -> str:
    return decode_text(storage.read_bytes(uri), uri)


def resolve_audio(base: str, path: str) -> str:
    """An absolute URI for an audio path: URIs and absolute paths kept, others under base."""
    if "://" in path or path.startswith("/"):
        return path
    out = join(base, path)
    return out if "://" in out else os.path.abspath(out)
