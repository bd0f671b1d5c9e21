"""Decode, validate, downmix and resample utterance audio (WAV and FLAC, via soundfile).

Public functions (also used by `amflow evaluate` to featurise a corpus on the fly):

    load_audio(storage, uri, fcfg, expected_duration=None) -> (samples, reject_reason | None)
        Read `uri` through `Storage` (local, file://, s3://) and return float32 mono samples
        in [-1, 1] at `fcfg.sample_rate`. On failure `samples` is None and the reason is one
        of REASONS below; `describe(reason)` or the exception text gives the detail.
    decode_audio(data, fcfg, expected_duration=None) -> AudioResult
        The same for bytes already in memory; `AudioResult` carries reason and detail.
    resolve_uri(corpus_root, audio_uri) -> str
        An absolute URI for a metadata `audio_uri` (absolute URI/path, or relative to the
        corpus root).

Rules:
- WAV headers are checked against the bytes present: a `data` chunk that claims more
  bytes than the file holds is `truncated_audio` (libsndfile would silently read less).
- Zero samples is `empty_audio`; NaN or inf samples (float WAV) is `nonfinite_audio`.
- A sample rate other than `fcfg.sample_rate` is resampled (polyphase, scipy) when
  `fcfg.resample`, else rejected as `wrong_sample_rate`; more than one channel is averaged
  when `fcfg.downmix`, else rejected as `wrong_channels`.
- When the metadata duration is given and `fcfg.duration_tolerance` > 0, audio whose
  length differs by more than max(0.1 s, tolerance x duration) is `duration_mismatch`.
"""
from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from core.config import FeaturesConfig
from core.storage import Storage, join

REASONS = {
    "missing_audio": "the audio file does not exist",
    "unreadable_audio": "the audio file could not be read from storage",
    "corrupt_audio": "the file is not decodable WAV/FLAC audio",
    "truncated_audio": "the file ends before its header says the audio does",
    "empty_audio": "the file holds no samples",
    "nonfinite_audio": "the samples hold NaN or inf",
    "wrong_sample_rate": "sample rate differs and features.resample is off",
    "wrong_channels": "more than one channel and features.downmix is off",
    "duration_mismatch": "decoded length disagrees with the metadata duration",
}


def describe(reason: str) -> str:
    return REASONS.get(reason, reason)


@dataclass
class AudioResult:
    samples: np.ndarray | None
    reason: str | None = None
    detail: str = ""
    source_rate: int = 0
    channels: int = 0


def resolve_uri(corpus_root: str, audio_uri: str) -> str:
    """Absolute URI of a metadata `audio_uri`: absolute URIs/paths kept, others joined."""
    if "://" in audio_uri or audio_uri.startswith("/"):
        return audio_uri
    return join(corpus_root, audio_uri)


@dataclass
class WavInfo:
    fmt: int = 0
    channels: int = 0
    rate: int = 0
    bits: int = 0
    block_align: int = 0
    data_offset: int = 0
    data_size: int = 0
    little_endian: bool = True


def scan_wav(data: bytes) -> WavInfo | tuple[str, str] | None:
    """RIFF/WAVE bytes -> WavInfo, or (reason, detail) if the data chunk is cut short or
    missing; None when the bytes are not WAV (e.g. FLAC)."""
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RIFX") or data[8:12] != b"WAVE":
        return None
    endian = "<" if data[:4] == b"RIFF" else ">"
    info = WavInfo(little_endian=endian == "<")
    pos = 12
    while pos + 8 <= len(data):
        cid = data[pos:pos + 4]
        (size,) = struct.unpack(endian + "I", data[pos + 4:pos + 8])
        body = pos + 8
        if cid == b"fmt " and body + 16 <= len(data):
            (info.fmt, info.channels, info.rate, _, info.block_align,
             info.bits) = struct.unpack(endian + "HHIIHH", data[body:body + 16])
        if cid == b"data":
            have = len(data) - body
            if size != 0xFFFFFFFF and size > have:
                return "truncated_audio", f"data chunk declares {size} bytes, file holds {have}"
            size = min(size, have)
            if info.block_align and size % info.block_align:
                return "truncated_audio", (f"data chunk of {size} bytes is not a whole number "
                                           f"of {info.block_align}-byte frames")
            info.data_offset, info.data_size = body, size
            return info
        pos = body + size + (size & 1)
    return "corrupt_audio", "no data chunk before the end of the file"


def wav_truncation(data: bytes) -> tuple[str, str] | None:
    """For RIFF/WAVE bytes: (reason, detail) if the data chunk is cut short or missing."""
    r = scan_wav(data)
    return r if isinstance(r, tuple) else None


_INV_INT16 = np.float32(1.0 / 32768.0)


def _read_pcm16(data: bytes, info: WavInfo) -> np.ndarray:
    """Plain little-endian 16-bit PCM WAV: samples straight from the bytes, [frames, ch]."""
    a = np.frombuffer(data, dtype="<i2", count=info.data_size // 2, offset=info.data_offset)
    return np.multiply(a, _INV_INT16, dtype=np.float32).reshape(-1, info.channels)


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    from scipy.signal import resample_poly

    frac = Fraction(dst, src)
    y = resample_poly(x, frac.numerator, frac.denominator, axis=0)
    return y.astype(np.float32, copy=False)


def decode_audio(data: bytes, fcfg: FeaturesConfig,
                 expected_duration: float | None = None) -> AudioResult:
    """Bytes of a WAV/FLAC file -> float32 mono samples at fcfg.sample_rate, or a reason."""
    import soundfile as sf

    if not data:
        return AudioResult(None, "empty_audio", "zero-byte file")
    wav = scan_wav(data)
    if isinstance(wav, tuple):
        return AudioResult(None, wav[0], wav[1])
    if wav is not None and wav.fmt == 1 and wav.bits == 16 and wav.little_endian \
            and wav.channels >= 1 and wav.rate > 0 and wav.block_align == 2 * wav.channels:
        x, rate = _read_pcm16(data, wav), wav.rate
    else:
        try:
            x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except Exception as exc:  # noqa: BLE001 - libsndfile raises several types
            return AudioResult(None, "corrupt_audio", f"{type(exc).__name__}: {exc}")
    frames, channels = x.shape
    res = AudioResult(None, source_rate=int(rate), channels=int(channels))
    if frames == 0:
        res.reason, res.detail = "empty_audio", "no samples"
        return res
    if channels > 1:
        if not fcfg.downmix:
            res.reason, res.detail = "wrong_channels", f"{channels} channels"
            return res
        mono = x.mean(axis=1, dtype=np.float32)
    else:
        mono = x[:, 0]
    if not np.isfinite(mono).all():
        res.reason, res.detail = "nonfinite_audio", f"{int((~np.isfinite(mono)).sum())} samples"
        return res
    if rate != fcfg.sample_rate:
        if not fcfg.resample:
            res.reason, res.detail = "wrong_sample_rate", f"{rate} Hz, want {fcfg.sample_rate} Hz"
            return res
        mono = _resample(mono, int(rate), fcfg.sample_rate)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if expected_duration is not None and fcfg.duration_tolerance > 0:
        have = frames / float(rate)
        tol = max(0.1, fcfg.duration_tolerance * float(expected_duration))
        if math.isfinite(expected_duration) and abs(have - expected_duration) > tol:
            res.reason = "duration_mismatch"
            res.detail = f"audio {have:.3f} s, metadata {expected_duration:.3f} s"
            return res
    res.samples = mono
    return res


def read_audio_bytes(storage: Storage, uri: str) -> tuple[bytes | None, str | None, str]:
    """(bytes, None, "") or (None, reason, detail) for a missing or unreadable file."""
    try:
        return storage.read_bytes(uri), None, ""
    except FileNotFoundError:
        return None, "missing_audio", uri
    except Exception as exc:  # noqa: BLE001 - storage already retried transient errors
        text = str(exc)
        if "not found" in text.lower() or "no such file" in text.lower() \
                or "nosuchkey" in text.lower():
            return None, "missing_audio", uri
        return None, "unreadable_audio", f"{uri}: {type(exc).__name__}: {text}"


def load_audio(storage: Storage, uri: str, fcfg: FeaturesConfig,
               expected_duration: float | None = None) -> tuple[np.ndarray | None, str | None]:
    """float32 mono samples at fcfg.sample_rate, or (None, reject reason)."""
    res = load_audio_result(storage, uri, fcfg, expected_duration)
    return res.samples, res.reason


def load_audio_result(storage: Storage, uri: str, fcfg: FeaturesConfig,
                      expected_duration: float | None = None) -> AudioResult:
    data, reason, detail = read_audio_bytes(storage, uri)
    if data is None:
        return AudioResult(None, reason, detail)
    return decode_audio(data, fcfg, expected_duration)
