"""Read one recording and turn its entries into input-format audio (mono 16-bit at
ingest.sample_rate, 16 kHz by default).

A recording is opened once (ranged reads through pyarrow's filesystem, so an S3 object is
not downloaded to read its header) and every entry on it is either

- referenced where it is: the entry spans the whole file, the file is mono 16-bit PCM
  WAV/FLAC at the rate, and ingest.copy_audio is off; its duration comes from the header; or
- cut (and downmixed, resampled) into new WAV bytes that the writer stores under audio/.
"""
from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow.fs as pafs
import soundfile as sf
from scipy.signal import resample_poly

from core.storage import Storage
from tasks.importers.entries import Entry

RATE = 16000
# Segments ending up to this far past the recording are cut at its end, further is a
# bad_segment: the default of Kaldi's extract-segments (--max-overshoot).
MAX_OVERSHOOT_S = 0.5
# reco2dur/utt2dur/manifest durations may differ from the audio by rounding only.
DURATION_TOLERANCE_S = 0.1
DURATION_TOLERANCE_FRAC = 0.01
_IN_PLACE_FORMATS = ("WAV", "FLAC")


@dataclass
class Header:
    rate: int
    channels: int
    frames: int
    format: str
    subtype: str
    mtime: str  # ISO 8601, UTC

    @property
    def seconds(self) -> float:
        return self.frames / float(self.rate)

    def in_format(self, rate: int) -> bool:
        return (self.rate == rate and self.channels == 1 and self.subtype == "PCM_16"
                and self.format in _IN_PLACE_FORMATS)


@dataclass
class Cut:
    """One entry's outcome: a reject reason, or the audio (in place, or new WAV bytes)."""

    entry: Entry
    reason: str = ""
    detail: str = ""
    seconds: float = 0.0
    wav: bytes | None = None  # None and no reason: reference entry.audio_uri in place
    mtime: str = ""
    source_rate: int = 0  # the recording's own sample rate


def _mismatch(have: float, want: float | None) -> bool:
    if want is None:
        return False
    return abs(have - want) > max(DURATION_TOLERANCE_S, DURATION_TOLERANCE_FRAC * want)


def read_recording(storage: Storage, uri: str, entries: list[Entry],
                   copy_audio: bool, rate: int = RATE) -> list[Cut]:
    """Every entry of one recording file as a Cut (one reason for all if the file fails)."""
    def fail(reason: str, detail: str) -> list[Cut]:
        return [Cut(e, reason, detail) for e in entries]

    try:
        fs, path = storage.resolve(uri)
        info = storage.retry(lambda: fs.get_file_info(path), f"stat {uri}")
    except Exception as exc:  # noqa: BLE001 - a bad URI or an unreachable store
        return fail("unreadable_audio", f"{uri}: {type(exc).__name__}: {exc}")
    if info.type != pafs.FileType.File:
        return fail("missing_audio", f"{uri} does not exist")
    mtime = (info.mtime or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    try:
        with fs.open_input_file(path) as f, sf.SoundFile(f) as snd:
            head = Header(snd.samplerate, snd.channels, snd.frames, snd.format, snd.subtype,
                          mtime.isoformat(timespec="seconds"))
            if head.frames <= 0:
                return fail("empty_audio", f"{uri}: the header says 0 samples")
            return [_cut_entry(snd, head, e, copy_audio, rate) for e in entries]
    except Exception as exc:  # noqa: BLE001 - libsndfile and pyarrow raise several types
        return fail("unreadable_audio", f"{uri}: {type(exc).__name__}: {exc}")


def _cut_entry(snd: sf.SoundFile, head: Header, e: Entry, copy_audio: bool,
               rate: int = RATE) -> Cut:
    cut = Cut(e, mtime=head.mtime, source_rate=head.rate)
    if _mismatch(head.seconds, e.recording_s):
        cut.reason, cut.detail = "duration_mismatch", (
            f"{e.audio_uri}: {head.seconds:.3f} s of audio, the manifest says {e.recording_s} s")
        return cut
    s0 = int(round(e.start * head.rate))
    s1 = head.frames if e.end is None else int(round(e.end * head.rate))
    if s1 > head.frames and (s1 - head.frames) / head.rate <= MAX_OVERSHOOT_S:
        s1 = head.frames
    if s1 > head.frames or s0 >= s1:
        cut.reason, cut.detail = "bad_segment", (
            f"{e.where}: {e.start}..{e.end} s of a {head.seconds:.3f} s recording")
        return cut
    whole = s0 == 0 and s1 == head.frames and e.channels is None
    if whole and head.in_format(rate) and not copy_audio:
        cut.seconds = head.seconds
    else:
        snd.seek(s0)
        samples, why = _samples(snd.read(s1 - s0, dtype=_dtype(head, e, rate),
                                         always_2d=True), head.rate, e.channels, rate)
        if samples is None:
            cut.reason, cut.detail = why[0], f"{e.audio_uri}: {why[1]}"
            return cut
        cut.wav, cut.seconds = wav_bytes(samples, rate), len(samples) / float(rate)
    if _mismatch(cut.seconds, e.expected_s):
        cut.reason, cut.detail, cut.wav = "duration_mismatch", (
            f"{e.where}: {cut.seconds:.3f} s of audio, utt2dur says {e.expected_s} s"), None
    return cut


def _dtype(head: Header, e: Entry, rate: int = RATE) -> str:
    """int16 when the samples go through unchanged (one channel, the rate, 16-bit)."""
    one = head.channels == 1 or (e.channels is not None and len(e.channels) == 1)
    return "int16" if one and head.rate == rate and head.subtype == "PCM_16" else "float32"


def _samples(x: np.ndarray, rate: int, channels: tuple[int, ...] | None,
             out_rate: int = RATE) -> tuple[np.ndarray | None, tuple[str, str]]:
    """[frames, ch] as read -> (int16 mono at out_rate, ("", "")) or (None, (reason,
    detail))."""
    if channels is not None:
        x = x[:, list(channels)]
    if x.shape[0] == 0:
        return None, ("empty_audio", "no samples in the segment")
    if x.dtype == np.int16:
        return np.ascontiguousarray(x[:, 0]), ("", "")
    mono = x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0]
    if not np.isfinite(mono).all():
        return None, ("nonfinite_audio", f"{int((~np.isfinite(mono)).sum())} samples")
    if rate != out_rate:
        frac = Fraction(out_rate, rate)
        mono = resample_poly(mono, frac.numerator, frac.denominator).astype(np.float32)
    if mono.shape[0] == 0:
        return None, ("empty_audio", "no samples left after resampling")
    return np.round(np.clip(mono, -1.0, 1.0) * 32767.0).astype(np.int16), ("", "")


def wav_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
