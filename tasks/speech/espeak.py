"""A ctypes binding to libespeak-ng.so.1: speech to memory, with phone alignments.

    voices(language)          -> [VoiceInfo]  espeak_ListVoices (all voices, or one language)
    variants()                -> [VoiceInfo]  the voice variants (espeak-ng-data/voices/!v)
    version()                 -> str          espeak_Info
    synthesize(text, voice, seed) -> Synthesis
        int16 audio at the engine's native rate (22050 Hz) and the espeakEVENT_PHONEME
        events, each at the audio sample where the phone starts; the espeakEVENT_WORD
        events say which phones each word of the text became (`word_phones`).
    phone_segments(events, num_samples) -> [(phone, start, end)]
        Contiguous segments covering [0, num_samples): pauses and the lead-in become `sil`.

Only the runtime library (Debian `libespeak-ng1`) is needed, no headers.

Determinism. espeak-ng keeps synthesis state in static variables (pitch phase, echo
buffer, random noise via libc `rand()`), so the same text synthesised twice in one
engine gives different samples, and `espeak_Initialize` after `espeak_Terminate` is not
supported. Every `synthesize` call therefore loads a fresh instance of the library
(from a private copy of the .so, so that no other user of the library in this process
keeps it loaded), seeds libc `rand()`, synthesises, terminates and unloads it. Loading
costs ~2 ms. The output is a function of (text, voice, seed) only, whatever was
synthesised before in the process.

libc `rand()` has one state per process, and several voice variants (f2, f3, whisper
...) draw from it while they speak: any other thread calling `rand()`/`random()` at the
same time (a Ray worker or a pytest process has C++ threads that may) changes their
samples. So `synthesize` runs in a synthesis process of its own, started on first use
and kept for the life of this one: a Python child that has no other threads and does
nothing else (`_serve`). espeak is not thread safe either: requests are serialised by a
lock.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

SIL = "sil"

# speak_lib.h
AUDIO_OUTPUT_SYNCHRONOUS = 2
INITIALIZE_PHONEME_EVENTS = 0x0001
EVENT_LIST_TERMINATED = 0
EVENT_WORD = 1
EVENT_PHONEME = 7
EVENT_SAMPLERATE = 8
CHARS_UTF8 = 1
POS_CHARACTER = 1
EE_OK = 0
RATE, VOLUME, PITCH, RANGE, WORDGAP = 1, 2, 3, 4, 7
RATE_MINIMUM, RATE_MAXIMUM = 80, 450

LIBRARY_NAME = "libespeak-ng.so.1"


class EspeakError(RuntimeError):
    """espeak-ng is missing, failed to initialise, or rejected a voice or a text."""


class _VOICE(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte),
                ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
                ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


class _EVENT_ID(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p),
                ("string", ctypes.c_char * 8)]


class _EVENT(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EVENT_ID)]


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                   ctypes.POINTER(_EVENT))


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    identifier: str  # file under espeak-ng-data/voices, e.g. "gmw/en-US" or "!v/f3"
    gender: int  # 0 unknown, 1 male, 2 female
    age: int
    languages: tuple[str, ...]

    @property
    def variant_name(self) -> str:
        """The name to put after '+' in a voice name ("!v/f3" -> "f3")."""
        return self.identifier.split("/", 1)[1] if self.identifier.startswith("!v/") else ""


@dataclass(frozen=True)
class VoiceParams:
    """One speaker: a language voice, an optional variant and prosody parameters."""

    language: str = "en-us"
    variant: str = ""  # a VoiceInfo.variant_name; "" = the language voice itself
    pitch: int = 50  # espeakPITCH, 0..100
    pitch_range: int = 50  # espeakRANGE, 0..100 (0 = monotone)
    rate: int = 175  # words per minute, 80..450
    word_gap: int = 0  # extra pause between words, units of 10 ms
    volume: int = 100

    def validate(self) -> None:
        if not (RATE_MINIMUM <= self.rate <= RATE_MAXIMUM):
            raise EspeakError(f"rate {self.rate} outside [{RATE_MINIMUM}, {RATE_MAXIMUM}] wpm")
        for name in ("pitch", "pitch_range"):
            v = getattr(self, name)
            if not 0 <= v <= 100:
                raise EspeakError(f"{name} {v} outside [0, 100]")
        if self.word_gap < 0 or self.volume < 0:
            raise EspeakError("word_gap and volume must be >= 0")


@dataclass
class Synthesis:
    audio: np.ndarray  # int16 [n]
    sample_rate: int
    events: list[tuple[str, int]]  # (espeak phoneme mnemonic, start sample), in order
    voice_identifier: str
    # espeakEVENT_WORD: (text character offset, 0-based; length in characters; index in
    # `events` of the word's first phone). espeak-ng may speak several text words as one
    # (e.g. "on the"): such a group has one event, at its first word.
    words: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate

    def segments(self) -> list[tuple[str, int, int]]:
        return phone_segments(self.events, len(self.audio))

    def word_phones(self) -> list[tuple[int, int, list[str]]]:
        """(text offset, length, phones) per word event, in order: the phones as
        `segments` has them (pauses and phones of no duration left out)."""
        ends = [pos for _, pos in self.events[1:]] + [len(self.audio)]
        heard = [p if end > pos and not is_pause(p) else ""
                 for (p, pos), end in zip(self.events, ends)]
        out = []
        for k, (pos, length, first) in enumerate(self.words):
            last = self.words[k + 1][2] if k + 1 < len(self.words) else len(self.events)
            out.append((pos, length, [p for p in heard[first:last] if p]))
        return out


# -- library loading -------------------------------------------------------------------

_lock = threading.RLock()
_private_copy: str | None = None


def _system_library() -> str:
    found = ctypes.util.find_library("espeak-ng")
    return found or LIBRARY_NAME


def _library_path() -> str:
    """A private copy of the library, so our dlopen/dlclose cycles own every reference."""
    global _private_copy
    if _private_copy is not None:
        return _private_copy
    system = _system_library()
    try:
        handle = ctypes.CDLL(system)
        real = _loaded_path(handle) or system
        _unload(handle)
        # One copy per library build, shared by this user's processes (a process only
        # needs a path that nothing else *in it* has loaded), published atomically.
        st = os.stat(real)
        cache = os.path.join(tempfile.gettempdir(), f"amflow-espeak-{os.getuid()}")
        os.makedirs(cache, exist_ok=True)
        dst = os.path.join(cache, f"libespeak-ng-{st.st_size}-{int(st.st_mtime)}.so")
        if not os.path.exists(dst):
            tmp = f"{dst}.tmp-{os.getpid()}"
            shutil.copyfile(real, tmp)
            os.replace(tmp, dst)
        _unload(ctypes.CDLL(dst))  # fails on a noexec temp dir: then use the system library
        _private_copy = dst
    except OSError:
        _private_copy = system
    return _private_copy


def _loaded_path(handle: ctypes.CDLL) -> str | None:
    """The file a loaded library came from (via dladdr on one of its symbols)."""

    class _DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        libdl = ctypes.CDLL(ctypes.util.find_library("dl") or "libc.so.6")
        info = _DlInfo()
        addr = ctypes.cast(handle.espeak_Initialize, ctypes.c_void_p)
        if libdl.dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (OSError, AttributeError):
        return None
    return None


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _declare(lib: ctypes.CDLL) -> None:
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
    lib.espeak_SetSynthCallback.restype = None
    lib.espeak_ListVoices.argtypes = [ctypes.POINTER(_VOICE)]
    lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_VOICE))
    lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_VOICE)]
    lib.espeak_SetVoiceByProperties.restype = ctypes.c_int
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    lib.espeak_GetCurrentVoice.argtypes = []
    lib.espeak_GetCurrentVoice.restype = ctypes.POINTER(_VOICE)
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_SetParameter.restype = ctypes.c_int
    lib.espeak_Synth.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                 ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint),
                                 ctypes.c_void_p]
    lib.espeak_Synth.restype = ctypes.c_int
    lib.espeak_Synchronize.argtypes = []
    lib.espeak_Synchronize.restype = ctypes.c_int
    lib.espeak_Terminate.argtypes = []
    lib.espeak_Terminate.restype = ctypes.c_int


class _Engine:
    """One freshly loaded, initialised instance of espeak-ng (use as a context manager)."""

    def __init__(self, data_path: str | None = None):
        self.data_path = data_path or os.environ.get("ESPEAK_DATA_PATH") or None
        self.lib: ctypes.CDLL | None = None
        self.sample_rate = 0

    def __enter__(self) -> "_Engine":
        _lock.acquire()
        try:
            try:
                lib = ctypes.CDLL(_library_path(), mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError:
                # the private copy may have been removed by a temp-dir cleaner: recopy
                global _private_copy
                _private_copy = None
                try:
                    lib = ctypes.CDLL(_library_path(), mode=os.RTLD_LOCAL | os.RTLD_NOW)
                except OSError as exc:
                    raise EspeakError(f"cannot load {LIBRARY_NAME} (install the Debian "
                                      f"package libespeak-ng1 / espeak-ng): {exc}") from exc
            _declare(lib)
            path = self.data_path.encode() if self.data_path else None
            rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, path,
                                         INITIALIZE_PHONEME_EVENTS)
            if rate <= 0:
                _unload(lib)
                raise EspeakError("espeak_Initialize failed: espeak-ng-data not found "
                                  "(set ESPEAK_DATA_PATH)")
            self.lib, self.sample_rate = lib, rate
        except BaseException:
            _lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.lib is not None:
                self.lib.espeak_Terminate()
                _unload(self.lib)
                self.lib = None
        finally:
            _lock.release()


def _unload(lib: ctypes.CDLL) -> None:
    import _ctypes

    _ctypes.dlclose(lib._handle)


# -- voices ----------------------------------------------------------------------------

def _voice_list(lib: ctypes.CDLL, spec: _VOICE | None) -> list[VoiceInfo]:
    arr = lib.espeak_ListVoices(ctypes.byref(spec) if spec is not None else None)
    out = []
    i = 0
    while arr[i]:
        v = arr[i].contents
        out.append(VoiceInfo(name=(v.name or b"").decode("utf-8", "replace"),
                             identifier=(v.identifier or b"").decode("utf-8", "replace"),
                             gender=int(v.gender), age=int(v.age),
                             languages=_parse_languages(v.languages)))
        i += 1
    return out


def _parse_languages(raw: bytes | None) -> tuple[str, ...]:
    """The voice table's languages field: (priority byte, name, NUL)* then NUL.

    ctypes stops a c_char_p at the first NUL, which is the end of the first name; that
    first (preferred) language is all we need.
    """
    if not raw:
        return ()
    return (raw[1:].decode("utf-8", "replace"),)


def voices(language: str | None = None) -> list[VoiceInfo]:
    """espeak_ListVoices: every voice (language=None) or those for one language."""
    with _Engine() as eng:
        spec = None
        if language is not None:
            spec = _VOICE()
            spec.languages = language.encode()
        return _voice_list(eng.lib, spec)


def version() -> str:
    """espeak_Info: the library version (the corpus depends on it byte for byte)."""
    with _Engine() as eng:
        eng.lib.espeak_Info.argtypes = [ctypes.c_void_p]
        eng.lib.espeak_Info.restype = ctypes.c_char_p
        return (eng.lib.espeak_Info(None) or b"").decode("utf-8", "replace")


def variants() -> list[VoiceInfo]:
    """The voice variants (espeak-ng-data/voices/!v), sorted by identifier."""
    return sorted((v for v in voices("variant") if v.variant_name),
                  key=lambda v: v.identifier)


def _current_identifier(lib: ctypes.CDLL) -> str:
    cur = lib.espeak_GetCurrentVoice()
    return (cur.contents.identifier or b"").decode() if cur else ""


def _set_voice(lib: ctypes.CDLL, voice: VoiceParams) -> str:
    """espeak_SetVoiceByProperties, then the prosody through espeak_SetParameter.

    A variant is selected by name ("en-us+f3", no language in the spec: with a language
    set, espeak matches the language voice and ignores the variant); the plain language
    voice by its language.
    """
    spec = _VOICE()
    if voice.variant:
        spec.name = f"{voice.language}+{voice.variant}".encode()
    else:
        spec.languages = voice.language.encode()
    rc = lib.espeak_SetVoiceByProperties(ctypes.byref(spec))
    ident = _current_identifier(lib)
    if voice.variant and rc == EE_OK and not ident.endswith("+" + voice.variant):
        rc = lib.espeak_SetVoiceByName(spec.name)
        ident = _current_identifier(lib)
    if rc != EE_OK or not ident or (voice.variant and not ident.endswith("+" + voice.variant)):
        raise EspeakError(f"voice {voice.language!r} variant {voice.variant!r} not available "
                          f"(espeak error {rc}, current voice {ident!r})")
    for param, value in ((RATE, voice.rate), (PITCH, voice.pitch), (RANGE, voice.pitch_range),
                         (WORDGAP, voice.word_gap), (VOLUME, voice.volume)):
        if lib.espeak_SetParameter(param, int(value), 0) != EE_OK:
            raise EspeakError(f"espeak_SetParameter({param}, {value}) failed")
    return ident


# -- synthesis -------------------------------------------------------------------------

def synthesize(text: str, voice: VoiceParams, seed: int = 0,
               data_path: str | None = None) -> Synthesis:
    """Speak `text` with `voice` into memory; phone events give sample-exact starts.

    Runs in this process's synthesis process (see the module docstring)."""
    voice.validate()
    if not text.strip():
        raise EspeakError("empty text")
    return _server.call((text, voice, seed, data_path))


def _synthesize_here(text: str, voice: VoiceParams, seed: int = 0,
                     data_path: str | None = None) -> Synthesis:
    """`synthesize` in the calling process: deterministic only if no other thread of
    the process calls libc rand() meanwhile."""
    chunks: list[np.ndarray] = []
    raw_events: list[tuple[str, int, int]] = []  # (phone, audio_position ms, sample)
    raw_words: list[tuple[int, int, int]] = []  # (text offset, length, phone events before)

    def _callback(wav, numsamples, events) -> int:  # noqa: ANN001 - ctypes signature
        if wav and numsamples > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        if events:
            k = 0
            while events[k].type != EVENT_LIST_TERMINATED:
                ev = events[k]
                if ev.type == EVENT_PHONEME:
                    name = bytes(ev.id.string).split(b"\0", 1)[0].decode("utf-8", "replace")
                    raw_events.append((name, int(ev.audio_position), int(ev.sample)))
                elif ev.type == EVENT_WORD:
                    raw_words.append((int(ev.text_position) - 1, int(ev.length),
                                      sum(1 for e in raw_events if e[0])))
                k += 1
        return 0

    cb = _SYNTH_CALLBACK(_callback)
    with _Engine(data_path) as eng:
        lib = eng.lib
        lib.espeak_SetSynthCallback(cb)
        ident = _set_voice(lib, voice)
        _libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
        data = text.encode("utf-8") + b"\0"
        buf = ctypes.create_string_buffer(data, len(data))
        rc = lib.espeak_Synth(buf, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
        if rc != EE_OK:
            raise EspeakError(f"espeak_Synth failed with error {rc}")
        lib.espeak_Synchronize()
        sample_rate = eng.sample_rate
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    events = _event_samples(raw_events, sample_rate, len(audio))
    return Synthesis(audio=audio.astype(np.int16, copy=False), sample_rate=sample_rate,
                     events=events, voice_identifier=ident, words=raw_words)


class _SynthesisProcess:
    """The child process `synthesize` runs in: requests and replies are pickles over its
    stdin and a private copy of its stdout (espeak's own prints go to stderr)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.owner = 0

    def _start(self) -> subprocess.Popen:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = f"import sys; sys.path.insert(0, {root!r}); import {__name__} as m; m._serve()"
        # one BLAS/OpenMP thread: numpy must not start a thread pool in the child
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.owner = os.getpid()
        return self.proc

    def call(self, request: tuple) -> Synthesis:
        with _lock:
            for attempt in range(2):
                proc = self.proc
                if proc is None or self.owner != os.getpid() or proc.poll() is not None:
                    proc = self._start()  # first use, after a fork, or after a crash
                try:
                    pickle.dump(request, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                    proc.stdin.flush()
                    status, value = pickle.load(proc.stdout)
                except (OSError, EOFError, pickle.UnpicklingError) as exc:
                    self.close()
                    if attempt:
                        raise EspeakError(f"the espeak synthesis process died: {exc!r}") from exc
                    continue
                if status == "ok":
                    return value
                raise EspeakError(value) if status == "espeak" else RuntimeError(value)
        raise AssertionError("unreachable")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or self.owner != os.getpid():
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()


_server = _SynthesisProcess()
atexit.register(_server.close)


def _serve() -> None:
    """The synthesis process: one request at a time until stdin closes."""
    import traceback

    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            result: tuple = ("ok", _synthesize_here(*request))
        except EspeakError as exc:
            result = ("espeak", str(exc))
        except Exception:  # noqa: BLE001 - reported to the caller, which raises it
            result = ("error", traceback.format_exc())
        pickle.dump(result, reply, protocol=pickle.HIGHEST_PROTOCOL)
        reply.flush()


def _event_samples(raw: list[tuple[str, int, int]], sample_rate: int,
                   n: int) -> list[tuple[str, int]]:
    """Start sample of each phone event.

    `audio_position` is documented (milliseconds, truncated); `sample` is the exact
    sample count the event was queued at. Use `sample` whenever it agrees with the
    millisecond position, else fall back to the millisecond position.
    """
    out: list[tuple[str, int]] = []
    last = 0
    for name, ms, sample in raw:
        if not name:
            continue
        pos = sample if abs(sample * 1000.0 / sample_rate - ms) <= 1.5 else round(
            ms * sample_rate / 1000.0)
        pos = min(max(pos, last), n)
        out.append((name, pos))
        last = pos
    return out


def is_pause(phone: str) -> bool:
    """espeak's pause phonemes: '_', '_:', '_!', '_^_' ..."""
    return phone.startswith("_")


def phone_segments(events: list[tuple[str, int]], num_samples: int,
                   sil: str = SIL) -> list[tuple[str, int, int]]:
    """Contiguous (phone, start, end) segments covering [0, num_samples).

    Each phone lasts until the next event; pauses and any audio before the first phone
    are `sil`; adjacent silences are merged and empty segments dropped.
    """
    marks: list[tuple[str, int]] = [(sil, 0)]
    for name, pos in events:
        marks.append((sil if is_pause(name) else name, min(max(pos, 0), num_samples)))
    segs: list[tuple[str, int, int]] = []
    for i, (name, start) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else num_samples
        if end <= start:
            continue
        if segs and segs[-1][0] == name == sil:
            segs[-1] = (sil, segs[-1][1], end)
        else:
            segs.append((name, start, end))
    if not segs and num_samples > 0:
        segs.append((sil, 0, num_samples))
    return segs


def iter_phones(segments: list[tuple[str, int, int]]) -> Iterator[str]:
    return (p for p, _, _ in segments)
