"""`amflow corpus`: synthesise the embedded espeak-ng speech corpus.

    amflow corpus --config configs/local.yaml --out URI [--set corpus.hours=H] [--force]

Writes, under the corpus root `--out` (a path, file:// or s3:// URI; default data.corpus):

    audio/<split>/<speaker>/<utt_id>.wav            16 kHz, 16-bit PCM, mono
    audio_clean/<split>/<speaker>/<utt_id>.wav      the dry (close-talk) rendering of the
                        splits in corpus.clean_splits (default: labeled): the same
                        speech before room and noise, time-aligned
                        with the far-field file (same length, shifted by the same
                        direct-path delay), so alignments.ctm covers both; what the
                        example servers (training/example_servers.py) re-render
    metadata/date=YYYY-MM-DD/bucket=NN/part-NNNNN.jsonl
        one record per utterance: utt_id, speaker_id, duration (s), created_at (ISO 8601),
        locale, audio_uri (relative to the root), text, condition (DP1..DP5),
        split (labeled|unlabeled|dev|test), and the acoustics (distance_m, rt60_s, snr_db);
        records of those splits also `clean_audio_uri` (the dry rendering, relative to
        the root; `amflow evaluate --set evaluate.audio=clean` scores it)
    alignments.ctm      `utt_id 1 start duration phone` for the labeled, dev and test
                        splits; phones contiguous from 0 to the end of each file
                        (`sil` for silence), espeak-ng phoneme mnemonics
    phones.txt          the phone inventory, sorted, with `sil` and `<unk>`: every phone
                        espeak-ng says for the embedded vocabulary (the same list for any
                        size or seed) and any other phone the corpus holds
    lexicon.txt         Kaldi lexicon of the generator's whole vocabulary in those phones,
                        pronunciation variants included (tasks/speech/lexicon.py); the same
                        for any size or seed
    lexicon.json        its size and its check against the alignments: the share of
                        labeled utterances whose aligned phones it can spell
    _SUCCESS.json       counts per split and condition, audio seconds, speakers, wall
                        seconds, audio seconds per wall second, the plan fingerprint
    _batches/<id>.json  done-marker of one batch (+ <id>.ctm, its alignments)

Pure core (no Ray, no storage):
    plan_corpus(cc, variants) -> Plan        speakers, utterances, batches, deterministic
    synthesize_batch(batch, ctx) -> BatchOutput   WAV bytes, records, CTM lines
    synthesize_utterance(utt, speaker, ctx) -> UtteranceOutput
Shell:
    build_corpus(cfg, out, force=False, use_ray=True) -> summary dict
    run(cfg, args) -> summary dict            (the CLI entry)

Determinism: every utterance is a function of the seed and its plan entry only (espeak
is reloaded per utterance, numpy generators are seeded from the plan), so a seed gives
byte-identical WAVs, metadata and alignments, in-process or on Ray, in any order.
Idempotence: a batch whose marker exists with the same fingerprint is skipped; a corpus
whose _SUCCESS.json carries the same plan fingerprint is left as it is (unless force).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import heapq
import io
import json
import logging
import math
import os
import re
import time
import wave
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import numpy as np
from scipy import signal

from core.config import Config, CorpusConfig
from core.progress import Progress
from core.raycluster import init_ray, step_resources
from core.outcomes import SUCCESS, StepError
from core.storage import Storage, join
from tasks.alignments import read_ctm
from tasks.select import MetadataError, metadata_files, parse_metadata_line
from tasks.speech import espeak, room
from tasks.speech import lexicon as lx
from tasks.speech import text as T
from tasks.speech.espeak import VoiceParams

log = logging.getLogger(__name__)

SPLITS = ("labeled", "unlabeled", "dev", "test")
ALIGNED_SPLITS = ("labeled", "dev", "test")
SIL = "sil"
CLEAN_SPLITS = ("labeled",)  # default corpus.clean_splits: dry renderings kept (audio_clean/)
UNK = "<unk>"
BATCHES = "_batches"
CTM = "alignments.ctm"
PHONES = "phones.txt"
LEXICON = "lexicon.txt"
LEXICON_REPORT = "lexicon.json"
LAYOUT_VERSION = 2  # 2: audio_clean/ for the labeled split
GENERATOR = "amflow corpus"

# Variants that are not plausible human talkers (robots, whisper, effects).
EXCLUDED_VARIANTS = ("robot", "robosoft", "demonic", "announcer", "whisper", "croak",
                     "fast", "tweaky", "storm", "anxious")


# -- the plan (pure) -------------------------------------------------------------------

@dataclass(frozen=True)
class Speaker:
    speaker_id: str
    index: int
    variant: str  # espeak voice variant ("" = the language voice)
    pitch: int
    pitch_range: int
    rate: int  # wpm
    word_gap: int
    test: bool
    bucket: int

    def voice(self, language: str):
        return VoiceParams(language=language, variant=self.variant, pitch=self.pitch,
                           pitch_range=self.pitch_range, rate=self.rate,
                           word_gap=self.word_gap)


@dataclass(frozen=True)
class Utterance:
    utt_id: str
    speaker_id: str
    split: str
    condition: str
    text: str
    created_at: str  # ISO 8601, UTC
    seed: int
    lead_s: float  # silence before the speech
    trail_s: float  # silence after it
    text_key: tuple[int, ...]  # the sentence generator key (used if the text must shrink)

    @property
    def audio_rel(self) -> str:
        return f"audio/{self.split}/{self.speaker_id}/{self.utt_id}.wav"

    @property
    def clean_rel(self) -> str:
        return f"audio_clean/{self.split}/{self.speaker_id}/{self.utt_id}.wav"

    @property
    def date(self) -> str:
        return self.created_at[:10]


@dataclass(frozen=True)
class Batch:
    index: int
    batch_id: str
    speaker: Speaker
    utts: tuple[Utterance, ...]

    def fingerprint(self, ctx: "SynthContext") -> str:
        payload = json.dumps({"ctx": ctx.fingerprinted(), "speaker": asdict(self.speaker),
                              "utts": [asdict(u) for u in self.utts],
                              "layout": LAYOUT_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def metadata_parts(self) -> list[str]:
        dates = sorted({u.date for u in self.utts})
        return [metadata_part(d, self.speaker.bucket, self.index) for d in dates]


@dataclass(frozen=True)
class SynthContext:
    """Everything besides the plan entry that an utterance depends on."""

    seed: int
    language: str
    locale: str
    sample_rate: int
    min_duration: float
    max_duration: float
    babble_banks: int
    espeak_version: str = ""
    clean_splits: tuple[str, ...] = CLEAN_SPLITS

    def fingerprinted(self) -> dict:
        """What a batch's fingerprint hashes: the default clean_splits is left out, so
        corpora written before the key existed stay valid."""
        d = asdict(self)
        if tuple(d["clean_splits"]) == CLEAN_SPLITS:
            del d["clean_splits"]
        return d


@dataclass
class Plan:
    speakers: list[Speaker]
    batches: list[Batch]
    ctx: SynthContext
    target_seconds: float
    estimated_seconds: float

    @property
    def utterances(self) -> list[Utterance]:
        return [u for b in self.batches for u in b.utts]

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for b in self.batches:
            h.update(b.fingerprint(self.ctx).encode())
        return h.hexdigest()[:16]


def metadata_part(date: str, bucket: int, batch_index: int) -> str:
    return f"metadata/date={date}/bucket={bucket:02d}/part-{batch_index:05d}.jsonl"


def usable_variants(names: Iterable[str]) -> list[str]:
    """Human-sounding variants, sorted, with "" (the plain language voice) first."""
    keep = sorted({n for n in names if n and not any(x in n.lower() for x in EXCLUDED_VARIANTS)})
    return ["", *keep]


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([k & 0xFFFFFFFF for k in key]))


def _seed_int(*key: int) -> int:
    return int(np.random.SeedSequence([k & 0xFFFFFFFF for k in key]).generate_state(1)[0])


# Stream tags, so that changing one part of the plan does not reshuffle the others.
_T_SPEAKER, _T_TEST, _T_TEXT, _T_COND, _T_TIME, _T_UTT, _T_PAD = 1, 2, 3, 4, 5, 6, 7


def plan_speakers(cc: CorpusConfig, variants: list[str]) -> list[Speaker]:
    """`cc.speakers` voices: variant x pitch x range x rate x word gap, per speaker index."""
    pool = usable_variants(variants)
    order = _rng(cc.seed, _T_SPEAKER).permutation(len(pool))
    test = set(int(i) for i in _rng(cc.seed, _T_TEST).permutation(cc.speakers)[:cc.test_speakers])
    speakers = []
    for i in range(cc.speakers):
        r = _rng(cc.seed, _T_SPEAKER, i)
        speakers.append(Speaker(
            speaker_id=f"spk{i:03d}", index=i,
            # distinct variants first, then cycled (and told apart by the prosody)
            variant=pool[int(order[i % len(pool)])],
            pitch=int(r.integers(20, 81)), pitch_range=int(r.integers(25, 91)),
            rate=int(r.integers(135, 206)), word_gap=int(r.choice([0, 0, 0, 1, 2])),
            test=i in test, bucket=i % cc.buckets))
    return speakers


def _split_targets(cc: CorpusConfig) -> dict[str, float]:
    total = cc.hours * 3600.0
    shares = {"test": cc.test_share, "dev": cc.dev_share, "labeled": cc.labeled_share}
    shares["unlabeled"] = 1.0 - sum(shares.values())
    return {s: total * v for s, v in shares.items()}


def _draft_text(cc: CorpusConfig, spk: Speaker, n: int) -> tuple[str, tuple[int, ...], float,
                                                                  float, float]:
    """A sentence for the n-th utterance of a speaker, with padding, inside the bounds."""

    pads = _rng(cc.seed, _T_PAD, spk.index, n)
    lead = round(float(pads.uniform(0.1, 0.35)), 3)
    trail = round(float(pads.uniform(0.2, 0.4)), 3)
    lo = cc.min_duration + 0.1
    hi = cc.max_duration * 0.85  # the estimate is within ~15 %: keep clear of the cap
    r = _rng(cc.seed, _T_TEXT, spk.index, n)
    target = float(r.uniform(lo, hi)) - lead - trail
    best = None
    for attempt in range(12):
        words = max(3, int(round(target / (0.27 * 175.0 / spk.rate))))
        key = (spk.index, n, attempt)
        s = T.sentence_for(cc.seed, _T_TEXT, *key, target_words=words)
        est = T.estimate_seconds(s, spk.rate, spk.word_gap) + lead + trail
        err = max(lo - est, est - hi, 0.0)
        if best is None or err < best[0]:
            best = (err, s, key, est)
        if err == 0:
            break
        target *= 0.85 if est > hi else 1.15
    _, s, key, est = best
    return s, key, est, lead, trail


def plan_corpus(cc: CorpusConfig, variants: list[str], espeak_version: str = "") -> Plan:
    """The whole corpus as data: who says what, where, when, in which split and batch.

    Split durations follow the shares (test from the test speakers only, the others from
    the remaining speakers); each split cycles through the conditions in shuffled
    blocks, so every condition is in every split; a speaker's utterances are spread over
    recording sessions on `days` days from `start_date` and numbered in time order.
    """
    speakers = plan_speakers(cc, variants)
    ctx = SynthContext(seed=cc.seed, language=cc.language, locale=cc.locale,
                       sample_rate=cc.sample_rate, min_duration=cc.min_duration,
                       max_duration=cc.max_duration, babble_banks=cc.babble_banks,
                       espeak_version=espeak_version, clean_splits=tuple(cc.clean_splits))
    targets = _split_targets(cc)
    test_pool = [s for s in speakers if s.test]
    train_pool = [s for s in speakers if not s.test]
    planned: dict[int, list[dict]] = defaultdict(list)  # speaker index -> drafts
    spoken = {s.index: 0.0 for s in speakers}
    total_est = 0.0
    for split in ("test", "dev", "labeled", "unlabeled"):
        pool = test_pool if split == "test" else train_pool
        target = targets[split]
        if target <= 0:
            continue
        cond_rng = _rng(cc.seed, _T_COND, SPLITS.index(split))
        conds: list[str] = []
        acc = 0.0
        # the speaker with the least planned audio so far speaks next (ties: lowest index)
        heap = [(spoken[s.index], s.index) for s in pool]
        heapq.heapify(heap)
        while acc < target or not conds:
            _, idx = heapq.heappop(heap)
            spk = speakers[idx]
            n = len(planned[spk.index])
            text, key, est, lead, trail = _draft_text(cc, spk, n)
            if acc > 0 and acc + est / 2 > target:
                break
            if len(conds) % len(cc.conditions) == 0:
                conds_block = [cc.conditions[int(i)] for i in cond_rng.permutation(len(cc.conditions))]
            condition = conds_block[len(conds) % len(cc.conditions)]
            conds.append(condition)
            planned[spk.index].append(dict(split=split, condition=condition, text=text,
                                           key=key, lead=lead, trail=trail, est=est))
            spoken[spk.index] += est
            heapq.heappush(heap, (spoken[spk.index], spk.index))
            acc += est
        total_est += acc
    start = dt.datetime.fromisoformat(cc.start_date).replace(tzinfo=dt.timezone.utc)
    batches: list[Batch] = []
    for spk in speakers:
        drafts = planned.get(spk.index, [])
        if not drafts:
            continue
        r = _rng(cc.seed, _T_TIME, spk.index)
        drafts = [drafts[int(i)] for i in r.permutation(len(drafts))]  # interleave splits
        times = _session_times(r, len(drafts), start, cc.days)
        utts = []
        for seq, (d, t) in enumerate(zip(drafts, times)):
            utts.append(Utterance(
                utt_id=f"{spk.speaker_id}-{seq:05d}", speaker_id=spk.speaker_id,
                split=d["split"], condition=d["condition"], text=d["text"],
                created_at=t.isoformat(timespec="seconds"),
                seed=_seed_int(cc.seed, _T_UTT, spk.index, seq),
                lead_s=d["lead"], trail_s=d["trail"], text_key=tuple(d["key"])))
        for k in range(0, len(utts), cc.batch_utts):
            idx = len(batches)
            batches.append(Batch(index=idx, batch_id=f"b{idx:05d}", speaker=spk,
                                 utts=tuple(utts[k:k + cc.batch_utts])))
    return Plan(speakers=speakers, batches=batches, ctx=ctx,
                target_seconds=cc.hours * 3600.0, estimated_seconds=total_est)


def _session_times(r: np.random.Generator, n: int, start: dt.datetime,
                   days: int) -> list[dt.datetime]:
    """n increasing timestamps: sessions of a few utterances on random days."""
    per_session = int(r.integers(4, 13))
    sessions = max(1, math.ceil(n / per_session))
    day_offsets = np.sort(r.integers(0, days, size=sessions))
    out: list[dt.datetime] = []
    for s in range(sessions):
        t = start + dt.timedelta(days=int(day_offsets[s]),
                                 seconds=int(r.integers(7 * 3600, 21 * 3600)))
        if out and t <= out[-1]:
            t = out[-1] + dt.timedelta(minutes=int(r.integers(5, 90)))
        for _ in range(min(per_session, n - len(out))):
            out.append(t)
            t = t + dt.timedelta(seconds=int(r.integers(4, 120)))
    return out


# -- synthesis of one utterance (pure: arrays and bytes, no storage) --------------------

@dataclass
class UtteranceOutput:
    wav: bytes
    record: dict[str, Any]
    segments: list[tuple[str, int, int]]  # (phone, start, end) in output samples
    num_samples: int
    clean_wav: bytes | None = None  # labeled split: the dry rendering, aligned with `wav`


@dataclass
class BatchOutput:
    files: dict[str, bytes]  # relative path -> WAV bytes
    records: list[dict[str, Any]]
    ctm_lines: list[str]
    phones: set[str] = field(default_factory=set)


def _resample(x: np.ndarray, fs_in: int, fs_out: int) -> np.ndarray:
    if fs_in == fs_out:
        return x
    g = math.gcd(fs_in, fs_out)
    return signal.resample_poly(x, fs_out // g, fs_in // g)


def _crowd_voice(seed: int, k: int, language: str, variants: tuple[str, ...]):
    r = _rng(seed, 99, k)
    return VoiceParams(language=language, variant=variants[int(r.integers(len(variants)))],
                       pitch=int(r.integers(15, 86)), pitch_range=int(r.integers(20, 95)),
                       rate=int(r.integers(140, 221)))


@lru_cache(maxsize=16)
def babble_bank(seed: int, bank: int, language: str, fs: int) -> tuple[np.ndarray, ...]:
    """Six sentences by six background voices (not corpus speakers), at `fs`."""

    names = tuple(usable_variants(v.variant_name for v in espeak.variants()))
    out = []
    for k in range(6):
        voice = _crowd_voice(seed, bank * 100 + k, language, names)
        s = T.sentence_for(seed, 98, bank, k, target_words=12)
        syn = espeak.synthesize(s, voice, seed=_seed_int(seed, 97, bank, k))
        out.append(_resample(syn.audio.astype(np.float64) / 32768.0, syn.sample_rate, fs))
    return tuple(out)


def wav_bytes(samples: np.ndarray, fs: int) -> bytes:
    """16-bit mono PCM WAV (the `wave` module writes no timestamps: deterministic)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(fs)
        w.writeframes(np.ascontiguousarray(samples, dtype="<i2").tobytes())
    return buf.getvalue()


def _dry_speech(utt: Utterance, spk: Speaker, ctx: SynthContext):
    """espeak speech at ctx.sample_rate with its phone segments; shrinks text if too long."""

    fs = ctx.sample_rate
    voice = spk.voice(ctx.language)
    text = utt.text
    for attempt in range(6):
        syn = espeak.synthesize(text, voice, seed=utt.seed)
        x = _resample(syn.audio.astype(np.float64) / 32768.0, syn.sample_rate, fs)
        total = (len(x) + round(utt.lead_s * fs) + round(utt.trail_s * fs)) / fs
        # leave room for the direct-path delay (< 20 ms at 5 m)
        if total + 0.02 <= ctx.max_duration or T.word_count(text) <= 3:
            break
        words = max(3, T.word_count(text) - 2 - attempt)
        text = T.sentence_for(ctx.seed, 96, *utt.text_key, attempt, target_words=words)
    scale = fs / syn.sample_rate
    segs = [(p, int(round(a * scale)), int(round(b * scale))) for p, a, b in syn.segments()]
    segs = [(p, a, min(b, len(x))) for p, a, b in segs if min(b, len(x)) > a]
    if segs:
        segs[-1] = (segs[-1][0], segs[-1][1], len(x))
    return x, segs, text


def _pad_segments(segs: list[tuple[str, int, int]], lead: int, total: int) -> list[tuple[str, int, int]]:
    """Shift by `lead`, cover [0, total) with `sil` at both ends, merge silences."""
    out: list[tuple[str, int, int]] = [(SIL, 0, lead)] if lead > 0 else []
    for p, a, b in segs:
        out.append((p, a + lead, b + lead))
    end = out[-1][2] if out else 0
    if end < total:
        out.append((SIL, end, total))
    merged: list[tuple[str, int, int]] = []
    for p, a, b in out:
        if b <= a:
            continue
        if merged and merged[-1][0] == p == SIL:
            merged[-1] = (SIL, merged[-1][1], b)
        else:
            merged.append((p, a, b))
    return merged


def synthesize_utterance(utt: Utterance, spk: Speaker, ctx: SynthContext) -> UtteranceOutput:
    """One far-field utterance: espeak -> 16 kHz -> padding -> room + noise -> int16 WAV."""

    fs = ctx.sample_rate
    x, segs, text = _dry_speech(utt, spk, ctx)
    lead, trail = int(round(utt.lead_s * fs)), int(round(utt.trail_s * fs))
    dry = np.concatenate([np.zeros(lead), x, np.zeros(trail)])
    # short utterances get more trailing silence, up to the minimum duration
    short = int(math.ceil(ctx.min_duration * fs)) - len(dry)
    if short > 0:
        dry = np.concatenate([dry, np.zeros(short)])
    active = np.zeros(len(dry), bool)
    for p, a, b in segs:
        if p != SIL:
            active[a + lead:b + lead] = True
    rng = _rng(utt.seed, 1)
    scene = room.sample_scene(utt.condition, rng)
    babble = None
    if "babble" in scene.noises:
        babble = list(babble_bank(ctx.seed, utt.seed % ctx.babble_banks, ctx.language, fs))
    out = room.render(dry, fs, scene, rng, active=active, babble_sources=babble)
    n = len(out.audio)
    # Level: active speech at -30..-20 dBFS, then keep the peaks clear of clipping.
    act = np.zeros(n, bool)
    act[out.delay:out.delay + len(active)] = active
    speech_rms = float(np.sqrt(np.mean(out.speech[act] ** 2))) if act.any() else 1.0
    gain = 10 ** (rng.uniform(-30.0, -20.0) / 20.0) / max(speech_rms, 1e-9)
    y = out.audio * gain
    peak = float(np.max(np.abs(y))) if n else 0.0
    if peak > 0.97:
        y *= 0.97 / peak
    pcm = np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)
    clean = None
    if utt.split in ctx.clean_splits:
        clean = wav_bytes(_clean_pcm(dry, out.delay, n, active, gain * speech_rms), fs)
    # Alignment: the dry phones, shifted by the padding and the direct-path delay.
    segments = _pad_segments(segs, lead + out.delay, n)
    record = {
        "utt_id": utt.utt_id,
        "speaker_id": utt.speaker_id,
        "duration": n / fs,
        "created_at": utt.created_at,
        "locale": ctx.locale,
        "audio_uri": utt.audio_rel,
        "text": text,
        "condition": utt.condition,
        "split": utt.split,
        "distance_m": round(scene.room.distance, 3),
        "rt60_s": round(scene.room.rt60, 3),
        "snr_db": round(scene.snr_db, 2),
    }
    if clean is not None:
        record["clean_audio_uri"] = utt.clean_rel
    return UtteranceOutput(wav=wav_bytes(pcm, fs), record=record, segments=segments,
                           num_samples=n, clean_wav=clean)


def _clean_pcm(dry: np.ndarray, delay: int, n: int, active: np.ndarray,
               level: float) -> np.ndarray:
    """The dry speech as int16, shifted by the far-field's direct-path delay and cut to
    its length `n` (so one alignment serves both), its active speech at RMS `level` (the
    far-field speech's level). No random draw: the far-field rendering is unchanged."""
    x = np.zeros(n)
    m = min(len(dry), n - delay)
    x[delay:delay + m] = dry[:m]
    rms = float(np.sqrt(np.mean(dry[active] ** 2))) if active.any() else 1.0
    y = x * (level / max(rms, 1e-9))
    peak = float(np.max(np.abs(y))) if n else 0.0
    if peak > 0.97:
        y *= 0.97 / peak
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)


def ctm_lines(utt_id: str, segments: list[tuple[str, int, int]], fs: int) -> list[str]:
    """Kaldi CTM lines; boundaries rounded to 0.1 ms so that segments stay contiguous."""
    lines = []
    for p, a, b in segments:
        ta, tb = round(a * 10000 / fs), round(b * 10000 / fs)
        if tb > ta:
            lines.append(f"{utt_id} 1 {ta / 10000:.4f} {(tb - ta) / 10000:.4f} {p}")
    return lines


def synthesize_batch(batch: Batch, ctx: SynthContext) -> BatchOutput:
    out = BatchOutput(files={}, records=[], ctm_lines=[])
    for utt in batch.utts:
        u = synthesize_utterance(utt, batch.speaker, ctx)
        out.files[utt.audio_rel] = u.wav
        if u.clean_wav is not None:
            out.files[utt.clean_rel] = u.clean_wav
        out.records.append(u.record)
        out.phones.update(p for p, _, _ in u.segments)
        if utt.split in ALIGNED_SPLITS:
            out.ctm_lines.extend(ctm_lines(utt.utt_id, u.segments, ctx.sample_rate))
    return out


# -- the shell: storage, Ray, markers ----------------------------------------------------

def _marker(out: str, batch: Batch) -> str:
    return join(out, BATCHES, f"{batch.batch_id}.json")


def _batch_ctm(out: str, batch: Batch) -> str:
    return join(out, BATCHES, f"{batch.batch_id}.ctm")


def run_batch(storage: Storage, out: str, batch: Batch, ctx: SynthContext) -> dict[str, Any]:
    """Synthesise one batch and publish it: WAVs, metadata parts, CTM part, then marker."""
    t0 = time.perf_counter()
    res = synthesize_batch(batch, ctx)
    audio_bytes = 0
    for rel, data in res.files.items():
        storage.write_bytes(join(out, rel), data)
        audio_bytes += len(data)
    by_date: dict[str, list[dict]] = defaultdict(list)
    for rec in res.records:
        by_date[rec["created_at"][:10]].append(rec)
    for date, recs in sorted(by_date.items()):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
        storage.write_text(join(out, metadata_part(date, batch.speaker.bucket, batch.index)), text)
    storage.write_text(_batch_ctm(out, batch), "".join(line + "\n" for line in res.ctm_lines))
    stats = {
        "batch": batch.batch_id,
        "fingerprint": batch.fingerprint(ctx),
        "utterances": len(res.records),
        "audio_s": round(sum(r["duration"] for r in res.records), 4),
        "audio_bytes": audio_bytes,
        "per_split": dict(Counter(r["split"] for r in res.records)),
        "per_condition": dict(Counter(r["condition"] for r in res.records)),
        "split_seconds": _sum_by(res.records, "split"),
        "condition_seconds": _sum_by(res.records, "condition"),
        "phones": sorted(res.phones),
        "speaker": batch.speaker.speaker_id,
        "compute_s": round(time.perf_counter() - t0, 3),
    }
    storage.write_json(_marker(out, batch), stats)
    return stats


def _sum_by(records: list[dict], key: str) -> dict[str, float]:
    acc: dict[str, float] = defaultdict(float)
    for r in records:
        acc[r[key]] += r["duration"]
    return {k: round(v, 4) for k, v in acc.items()}


def _done(storage: Storage, out: str, batch: Batch, ctx: SynthContext) -> dict | None:
    uri = _marker(out, batch)
    if not storage.exists(uri):
        return None
    try:
        stats = storage.read_json(uri)
    except (ValueError, OSError):
        return None
    return stats if stats.get("fingerprint") == batch.fingerprint(ctx) else None


def _ray_batch(storage: Storage, out: str, batch: Batch, ctx: SynthContext) -> dict:
    return run_batch(storage, out, batch, ctx)


def _run_all(cfg: Config, storage: Storage, out: str, todo: list[Batch], ctx: SynthContext,
             use_ray: bool) -> list[dict]:
    results: list[dict] = []
    t0 = time.monotonic()

    def postfix() -> dict:
        audio = sum(s["audio_s"] for s in results)
        wall = max(time.monotonic() - t0, 1e-6)
        return {"audio_min": round(audio / 60.0, 2), "audio_s_per_wall_s": round(audio / wall, 1)}

    with Progress(len(todo), "corpus", "batches") as bar:
        if not use_ray:
            for b in todo:
                results.append(run_batch(storage, out, b, ctx))
                bar.update(1, **postfix())
            return results
        import ray  # deferred: heavy, and only a Ray fan-out needs it

        remote = ray.remote(_ray_batch).options(
            num_cpus=1, max_retries=3, resources=step_resources(cfg, "corpus") or None)
        storage_ref, ctx_ref = ray.put(storage), ray.put(ctx)
        queue = list(todo)
        pending: dict[Any, Batch] = {}
        while queue or pending:
            while queue and len(pending) < cfg.corpus.workers:
                b = queue.pop(0)
                pending[remote.remote(storage_ref, out, b, ctx_ref)] = b
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                pending.pop(ref)
                results.append(ray.get(ref))
                bar.update(1, **postfix())
    return results


# Files this step writes; only these are ever deleted as stale.
_OWN_FILES = {
    "metadata": re.compile(r"date=\d{4}-\d{2}-\d{2}/bucket=\d{2}/part-\d{5}\.jsonl"),
    "audio": re.compile(r"(labeled|unlabeled|dev|test)/spk\d{3,}/spk\d{3,}-\d{5}\.wav"),
    "audio_clean": re.compile(r"(labeled|unlabeled|dev|test)/spk\d{3,}/spk\d{3,}-\d{5}\.wav"),
    BATCHES: re.compile(r"b\d{5,}\.(json|ctm)"),
}


def _cleanup(storage: Storage, out: str, plan: Plan) -> int:
    """Delete our metadata parts, audio and markers that the current plan does not have
    (left by an earlier plan, e.g. more hours). Files we did not name are never touched."""
    keep = {join(out, p) for b in plan.batches for p in b.metadata_parts()}
    keep |= {join(out, u.audio_rel) for u in plan.utterances}
    keep |= {join(out, u.clean_rel) for u in plan.utterances
             if u.split in plan.ctx.clean_splits}
    for b in plan.batches:
        keep |= {_marker(out, b), _batch_ctm(out, b)}
    removed = 0
    for sub, pattern in _OWN_FILES.items():
        base = join(out, sub)
        for uri in storage.list(base, recursive=True):
            if uri not in keep and pattern.fullmatch(uri[len(base) + 1:]):
                storage.delete(uri)
                removed += 1
    return removed


def _check_target(storage: Storage, out: str) -> None:
    """Refuse to write into a corpus that this step did not create (a user's own)."""
    if storage.list(join(out, BATCHES)):
        return
    success = join(out, SUCCESS)
    if storage.exists(success):
        try:
            if storage.read_json(success).get("generator") == GENERATOR:
                return
        except (ValueError, OSError):
            pass
    if storage.list(join(out, "metadata"), recursive=True) or storage.exists(join(out, CTM)):
        raise StepError(f"{out} already holds a corpus that `amflow corpus` did not write; "
                        f"choose another --out")


@lru_cache(maxsize=4)
def vocabulary_phones(language: str) -> frozenset[str]:
    """The phones espeak-ng uses for the embedded vocabulary, said in running text.

    Every vocabulary word, in sentences of 12 (so that cross-word effects such as
    linking and flapping show up too), with the language voice. The phone set does not
    depend on the voice variant or the prosody, so this is the inventory of any corpus
    of this module, whatever its size or seed.
    """

    words = T.vocabulary()
    order = _rng(0, 95).permutation(len(words))
    found: set[str] = set()
    voice = espeak.VoiceParams(language=language)
    for k in range(0, len(order), 12):
        sentence = " ".join(words[int(i)] for i in order[k:k + 12]) + "."
        found.update(p for p, _, _ in espeak.synthesize(sentence, voice, seed=k).segments())
    return frozenset(found)


def phone_inventory(phones: Iterable[str]) -> list[str]:
    """Sorted phones with `sil` and `<unk>` (the class list, index = class id)."""
    return sorted(set(phones) | {SIL, UNK})


def _done_and_todo(storage: Storage, out: str, plan: Plan, force: bool
                   ) -> tuple[dict[str, dict], list[Batch]]:
    """(stats of the batches already written, by id; the batches still to synthesise)."""
    done: dict[str, dict] = {}
    todo: list[Batch] = []
    for b in plan.batches:
        stats = None if force else _done(storage, out, b, plan.ctx)
        if stats is None:
            todo.append(b)
        else:
            done[b.batch_id] = stats
    return done, todo


def build_corpus(cfg: Config, out: str, force: bool = False, use_ray: bool = True) -> dict:
    """Plan, synthesise the batches not yet done, then publish the root files."""

    started = time.time()
    cc = cfg.corpus
    storage = Storage(cfg.storage)
    names = [v.variant_name for v in espeak.variants()]
    plan = plan_corpus(cc, names, espeak_version=espeak.version())
    fp = plan.fingerprint()
    success_uri = join(out, SUCCESS)
    if not force and storage.exists(success_uri):
        prev = storage.read_json(success_uri)
        if prev.get("plan_fingerprint") == fp:
            log.info("corpus at %s is complete for this plan (%s): nothing to do", out, fp)
            lexicon = ensure_lexicon(cfg, storage, out, use_ray)
            return dict(_summary(prev), skipped=True, lexicon=lexicon)
    _check_target(storage, out)
    done, todo = _done_and_todo(storage, out, plan, force)
    log.info("corpus: %d utterances in %d batches (%d already written), ~%.0f s of audio",
             len(plan.utterances), len(plan.batches), len(done), plan.estimated_seconds)
    if todo and use_ray:

        init_ray(cfg)  # before the clock: audio s per wall s measures synthesis alone
    t_synth = time.monotonic()
    fresh = _run_all(cfg, storage, out, todo, plan.ctx, use_ray) if todo else []
    synth_wall = time.monotonic() - t_synth
    for s in fresh:
        done[s["batch"]] = s
    stats = [done[b.batch_id] for b in plan.batches]
    ctm_text = "".join(storage.read_text(_batch_ctm(out, b)) for b in plan.batches)
    storage.write_text(join(out, CTM), ctm_text)
    observed = {p for s in stats for p in s["phones"]}
    phones = phone_inventory(observed | vocabulary_phones(cc.language))
    storage.write_text(join(out, PHONES), "".join(p + "\n" for p in phones))
    removed = _cleanup(storage, out, plan)
    fresh_audio = sum(s["audio_s"] for s in fresh)
    wall = time.time() - started
    summary = {
        "generator": GENERATOR,
        "out": out,
        "plan_fingerprint": fp,
        "seed": cc.seed,
        "espeak_version": plan.ctx.espeak_version,
        "layout_version": LAYOUT_VERSION,
        "utterances": sum(s["utterances"] for s in stats),
        "audio_s": round(sum(s["audio_s"] for s in stats), 3),
        "audio_bytes": sum(s["audio_bytes"] for s in stats),
        "per_split": _merge_counts(s["per_split"] for s in stats),
        "per_condition": _merge_counts(s["per_condition"] for s in stats),
        "split_seconds": _merge_counts((s["split_seconds"] for s in stats), digits=3),
        "condition_seconds": _merge_counts((s["condition_seconds"] for s in stats), digits=3),
        "speakers": len({s["speaker"] for s in stats}),
        "speakers_per_split": _speakers_per_split(plan),
        "phones": len(phones),
        "ctm_lines": ctm_text.count("\n"),
        "batches": len(plan.batches),
        "batches_written": len(fresh),
        "batches_skipped": len(plan.batches) - len(fresh),
        "stale_files_removed": removed,
        "wall_s": round(wall, 3),
        "synth_wall_s": round(synth_wall, 3),
        "audio_s_written": round(fresh_audio, 3),
        "audio_s_per_wall_s": round(fresh_audio / synth_wall, 2) if fresh else 0.0,
        "audio_s_per_wall_s_total": round(fresh_audio / wall, 2) if fresh else 0.0,
        "workers": cc.workers if use_ray else 1,
        "created_at": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(
            timespec="seconds"),
        "config": asdict(cc),
    }
    summary["lexicon"] = ensure_lexicon(cfg, storage, out, use_ray)
    storage.write_json(success_uri, summary)
    log.info("corpus: %.1f s of audio (%d utterances) at %s; %.1f audio s per wall s",
             summary["audio_s"], summary["utterances"], out, summary["audio_s_per_wall_s"])
    return dict(_summary(summary), skipped=False)


def ensure_lexicon(cfg: Config, storage: Storage, out: str, use_ray: bool = True) -> dict:
    """Write lexicon.txt (and its check, lexicon.json) unless the corpus has them."""
    if storage.exists(join(out, LEXICON)) and storage.exists(join(out, LEXICON_REPORT)):
        return storage.read_json(join(out, LEXICON_REPORT))

    t0 = time.time()
    variants = usable_variants(v.variant_name for v in espeak.variants())
    requests = lx.espeak_requests(cfg.corpus.language, variants=variants)
    key = hashlib.sha256(repr((espeak.version(), lx.LEXICON_VERSION, requests)).encode())
    cache = os.path.join(os.environ.get("AMFLOW_CACHE") or os.path.expanduser("~/.cache/amflow"),
                         f"lexicon-{key.hexdigest()[:16]}.txt")
    if os.path.exists(cache):  # a function of espeak-ng and the vocabulary only
        with open(cache) as f:
            text = f.read()
        lex = lx.read_lexicon(text)
        unexplained = int(text.split("\n", 1)[0].rsplit("=", 1)[-1])
    else:
        lex, unexplained = lx.espeak_lexicon(_said_groups(cfg, requests, use_ray))
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache + ".tmp", "w") as f:
            f.write(f"# unexplained_groups={unexplained}\n" + lex.to_text())
        os.replace(cache + ".tmp", cache)
    storage.write_text(join(out, LEXICON), lex.to_text())
    # no wall time in it: a corpus is the same bytes however (and wherever) it was built
    report = {"words": len(lex), "prons": lex.num_prons, "unexplained_groups": unexplained,
              "linking_rules": sorted(map(list, lx.linking_rules(lex)))}
    report.update(_lexicon_check(storage, out, lex))
    storage.write_json(join(out, LEXICON_REPORT), report)
    log.info("lexicon: %d words, %d pronunciations in %.1f s; spells %.2f %% of the labeled "
             "utterances' aligned phones", report["words"], report["prons"], time.time() - t0,
             100 * report["labeled"]["share"])
    return report


def _said_groups(cfg: Config, requests: list, use_ray: bool) -> list:
    if not use_ray:
        return lx.said_groups_many(requests)
    import ray  # deferred: heavy, and only a Ray fan-out needs it

    init_ray(cfg)
    n = max(cfg.corpus.workers, 1) * 4
    task = ray.remote(num_cpus=1)(lx.said_groups_many)
    return [g for part in ray.get([task.remote(requests[i::n]) for i in range(n)]) for g in part]


def _lexicon_check(storage: Storage, out: str, lex) -> dict:
    """Per aligned split: the share of utterances whose aligned phones the lexicon spells."""

    aligns, _ = read_ctm(storage.read_text(join(out, CTM)))
    pairs: dict[str, list] = defaultdict(list)
    for uri in metadata_files(storage, out):
        for line in storage.read_text(uri).splitlines():
            try:
                rec = parse_metadata_line(line) if line.strip() else None
            except MetadataError:
                continue
            a = aligns.get(rec.utt_id) if rec else None
            if a is not None and rec.text:
                pairs[rec.split or "labeled"].append((lx.words_of(rec.text), a.phones))
    return {split: lx.coverage(lex, pairs.get(split, [])) for split in ALIGNED_SPLITS}


def _merge_counts(items: Iterable[dict], digits: int | None = None) -> dict:
    acc: dict[str, float] = defaultdict(float)
    for d in items:
        for k, v in d.items():
            acc[k] += v
    return {k: (round(v, digits) if digits is not None else int(v)) for k, v in sorted(acc.items())}


def _speakers_per_split(plan: Plan) -> dict[str, int]:
    sets: dict[str, set] = defaultdict(set)
    for u in plan.utterances:
        sets[u.split].add(u.speaker_id)
    return {k: len(v) for k, v in sorted(sets.items())}


_SUMMARY_KEYS = ("out", "utterances", "audio_s", "per_split", "per_condition", "speakers",
                 "batches", "batches_written", "wall_s", "audio_s_per_wall_s",
                 "plan_fingerprint", "lexicon")


def _summary(full: dict) -> dict:
    return {k: full[k] for k in _SUMMARY_KEYS if k in full}
