"""Example servers: labeled utterances re-rendered every epoch on a CPU pool, streamed in.

After the Samsung end-to-end framework's example servers (and DeepSpeech2's noise and
SortaGrad): instead of one stored rendering of each labeled utterance, every epoch draws
new acoustics for it — a random room and noise (tasks.speech.room), or plain additive
noise at a random SNR, speed perturbation and VTLP — from its clean (close-talk) source,
featurises it exactly as the features step does (fbank, causal CMN over the speaker's
stream, LFR stacking, global CMVN) and hands minibatches to the trainer. Nothing augmented
is written anywhere.

Clean sources (`load_clean_sources`): a corpus metadata record's `clean_audio_uri`
(`amflow corpus` keeps the labeled split's dry rendering under `audio_clean/`, aligned
with the far-field file), or its `audio_uri` when the record says `clean: true`. The
frame labels are the stored 100 Hz `frame_labels` of the labeled partitions (the same
utterances and the same worker shares as the stored-data training).

How one pass is made (`ExampleServers`, an `training.inputs.InputSource`):

1. Plan. Per utterance and pass, `draw_recipe` seeds a generator from (train.seed, pass,
   utt_id) and draws the augmentation; the speed factor fixes the augmented frame count
   before any audio is read (`augmented_frames`), so the pass's minibatches are planned
   with `training.data.plan_pass` like stored data: the worker's utterances are grouped
   into speaker streams (up to `stream_utts`, time order), the streams play the role of
   partitions (shuffled order, chunks shuffled within windows of `window_streams`).
   A pass is a function of (seed, pass, rank): deterministic, and resumable at any
   minibatch.
2. Render. Each stream is one task for the pool (`ExampleServer` Ray actors with
   `cpus_per_server` CPUs and `resources`, e.g. the C4 pool; `servers: 0` renders in
   the trainer's loader thread): read -> augment -> speed -> fbank (VTLP-warped filters)
   -> causal CMN over the stream -> LFR -> offset -> CMVN; labels stretched with the
   speed factor. An unreadable source is a reject with its reason (counted per pass);
   its chunks drop out of their minibatches and the pass goes on with the same number
   of steps.
3. Stream. `AugmentedStream` keeps at most `window_streams + servers * inflight`
   streams in flight (one window ahead of the one being consumed, so the servers render
   the next window while the trainer eats this one), takes their results in order,
   collates a window's minibatches and hands them over a queue of `train.prefetch`:
   bounded memory, and the pool stops when the trainer does (backpressure). When a pass
   has submitted its last stream, the next pass's first window is submitted too, so a
   new epoch does not start on an idle pool.

Per pass `pass_metrics` reports examples rendered, examples/s, the pool's CPU seconds and
the cores they amount to per trainer, and rejects by reason.
"""
from __future__ import annotations

import collections
import json
import logging
import math
import time
import zlib
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch
from scipy import signal

from core import records
from core.config import AugmentConfig, FeaturesConfig, StorageConfig, TrainConfig
from core.prefetch import Prefetch
from core.storage import Storage, iter_jsonl, join
from tasks.audio import load_audio_result, resolve_uri
from tasks.corpus import babble_bank
from tasks.fbank import FbankComputer
from tasks.features import StreamCMN, stack_frames
from tasks.speech import room
from training.data import (IGNORE, Batch, Normalizer, PassSpec, SplitIndex, _Utterances,
                           plan_pass)
from training.inputs import pass_spec
from training.schedules import PassInfo

log = logging.getLogger(__name__)

NOISE_KINDS = ("babble", "pink", "brown", "white", "fan", "hum", "clatter")
_T_AUGMENT = 21  # seed stream tag


# ----------------------------------------------------------------- clean sources
def load_clean_sources(storage: Storage, corpus: str) -> dict[str, dict[str, str]]:
    """{utt_id: {uri, stored_uri, speaker_id, created_at}} of every metadata record with a
    clean source (`stored_uri`: the record's own rendering, `audio_uri`)."""
    root = corpus.rstrip("/")
    uris = storage.list(join(root, "metadata"), suffix=".jsonl", recursive=True)
    if storage.exists(join(root, "metadata.jsonl")):
        uris.append(join(root, "metadata.jsonl"))
    out: dict[str, dict[str, str]] = {}
    for uri in uris:
        for _, line in iter_jsonl(storage.read_text(uri)):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # the select step rejects malformed lines with their reason
            if not isinstance(rec, dict) or not isinstance(rec.get("utt_id"), str):
                continue
            src = rec.get("clean_audio_uri") or (rec.get("audio_uri") if rec.get("clean") is True
                                                 else None)
            if isinstance(src, str) and src:
                stored = rec.get("audio_uri")
                out[rec["utt_id"]] = {"uri": resolve_uri(root, src),
                                      "stored_uri": resolve_uri(root, stored)
                                      if isinstance(stored, str) and stored else "",
                                      "speaker_id": str(rec.get("speaker_id", "")),
                                      "created_at": str(rec.get("created_at", ""))}
    return out


# ----------------------------------------------------------------- augmentation recipes
@dataclass(frozen=True)
class Recipe:
    """What one utterance gets in one pass (all drawn before any audio is read)."""
    seed: int  # the rendering's own generator (room, noise samples)
    condition: str = ""  # a room of this condition ("" = no room)
    noise: str = ""  # additive noise kind without a room ("" = none)
    snr_db: float = 0.0
    speed: float = 1.0
    warp: float = 1.0  # VTLP
    stored: bool = False  # the corpus's own rendering (audio_uri) instead of the clean source

    @property
    def is_identity(self) -> bool:
        return not self.condition and not self.noise and self.speed == 1.0 and self.warp == 1.0


def draw_recipe(acfg: AugmentConfig, seed: int, pass_index: int, utt_id: str) -> Recipe:
    """The augmentation of `utt_id` in pass `pass_index`: independent of the order in
    which utterances are drawn or rendered, so any worker or server can compute it."""
    if not acfg.enabled:
        return Recipe(seed=0)
    rng = np.random.default_rng(np.random.SeedSequence(
        [seed & 0xFFFFFFFF, _T_AUGMENT, pass_index, zlib.crc32(utt_id.encode())]))
    u = rng.random(5)
    condition = noise = ""
    snr = 0.0
    if u[0] < acfg.room_prob:
        condition = acfg.conditions[int(rng.integers(len(acfg.conditions)))]
    elif u[1] < acfg.noise_prob:
        noise = acfg.noises[int(rng.integers(len(acfg.noises)))]
        snr = float(rng.uniform(acfg.snr_db[0], acfg.snr_db[1]))
    speed = float(acfg.speeds[int(rng.integers(len(acfg.speeds)))]) if u[2] < acfg.speed_prob \
        else 1.0
    warp = float(rng.uniform(acfg.vtlp[0], acfg.vtlp[1])) if u[3] < acfg.vtlp_prob else 1.0
    # The stored rendering already has its room and noise. Drawn last, from the same
    # generator state, so that stored_prob changes no other utterance's draws.
    stored = bool(u[4] < acfg.stored_prob)
    if stored:
        condition, noise, snr = "", "", 0.0
    return Recipe(int(rng.integers(2**31)), condition, noise, snr, speed, warp, stored)


def _fbank_geometry(fcfg: FeaturesConfig) -> tuple[int, int]:
    sr = fcfg.sample_rate
    return (int(round(sr * fcfg.frame_length_ms / 1000.0)),
            int(round(sr * fcfg.frame_shift_ms / 1000.0)))


def augmented_frames(frames: int, speed: float, fcfg: FeaturesConfig) -> int:
    """100 Hz frames of a `frames`-frame utterance played at `speed`: the most frames its
    shortest possible source (snip_edges) still fills after resampling."""
    if speed == 1.0:
        return frames
    length, shift = _fbank_geometry(fcfg)
    n_min = length + shift * (frames - 1)
    return max(0, 1 + int(math.floor((n_min / speed - length) / shift)))


def stretch_labels(frame_labels: np.ndarray, speed: float, frames: int,
                   fcfg: FeaturesConfig) -> np.ndarray:
    """100 Hz labels of the sped-up signal: each new frame takes the label of the source
    frame under its centre (a 0.9x slower utterance's phones last 1/0.9 as long)."""
    if speed == 1.0:
        return frame_labels[:frames]
    length, shift = _fbank_geometry(fcfg)
    centre = (np.arange(frames) * shift + length / 2.0) * speed
    src = np.rint((centre - length / 2.0) / shift).astype(np.int64)
    return frame_labels[np.clip(src, 0, len(frame_labels) - 1)]


def lfr_rows(frames: int, stack: int, subsample: int) -> int:
    return 0 if frames < stack else (frames - stack) // subsample + 1


# ----------------------------------------------------------------- rendering (pure)
def _noise(kind: str, rng: np.random.Generator, n: int, fs: int,
           babble: list[np.ndarray] | None) -> np.ndarray | None:
    if kind in ("pink", "brown", "white"):
        return room.colored_noise(rng, n, {"white": 0.0, "pink": 1.0, "brown": 2.0}[kind], fs)
    if kind == "hum":
        return room.hum(rng, n, fs)
    if kind == "fan":
        return room.fan(rng, n, fs)
    if kind == "clatter":
        return room.clatter(rng, n, fs)
    if kind == "babble" and babble:
        return room.babble(rng, n, babble, int(rng.integers(3, 7)))
    return None


def _rms(x: np.ndarray, active: np.ndarray | None) -> float:
    ref = x[active] if active is not None and active.any() else x
    return float(np.sqrt(np.mean(np.square(ref, dtype=np.float64)))) if len(ref) else 0.0


def _speed(x: np.ndarray, speed: float) -> np.ndarray:
    """Resampled so that it plays `speed` times faster (pitch and tempo, as Kaldi's)."""
    if speed == 1.0:
        return x
    r = Fraction(speed).limit_denominator(100)
    return signal.resample_poly(x, r.denominator, r.numerator)


def augment_audio(x: np.ndarray, recipe: Recipe, fs: int, active: np.ndarray | None,
                  babble: list[np.ndarray] | None) -> np.ndarray:
    """The clean signal `x` in the recipe's acoustics, same length and timing (the direct
    path's delay is taken out again, so the labels still fit)."""
    rng = np.random.default_rng(recipe.seed)
    y = x.astype(np.float64)
    n = len(y)
    if recipe.condition:
        scene = room.sample_scene(recipe.condition, rng)
        out = room.render(y, fs, scene, rng, active=active,
                          babble_sources=babble if "babble" in scene.noises else None)
        # The room attenuates by the distance (DP5: ~35 dB); the corpus levels every
        # rendering to a speaking level, so do we: the clean input's RMS.
        y = out.audio[out.delay:out.delay + n]
        y = y * (_rms(x, active) / max(_rms(out.speech[out.delay:out.delay + n], active), 1e-12))
    elif recipe.noise:
        noise = _noise(recipe.noise, rng, n, fs, babble)
        if noise is not None:
            y = y + room.mix_at_snr(y, noise, recipe.snr_db, active)
    peak = float(np.max(np.abs(y))) if n else 0.0
    if peak > 0.97:
        y = y * (0.97 / peak)
    return _speed(y, recipe.speed).astype(np.float32)


class SourceUtt(NamedTuple):
    """A labeled utterance the servers render (sorted: speaker, time, id)."""
    speaker_id: str
    created_at: str
    utt_id: str
    uri: str  # the clean source
    frame_labels: np.ndarray  # int16, 100 Hz
    stored_uri: str  # the corpus's own rendering ("" = unknown)


@dataclass
class StreamItem:
    """One utterance of a stream task: where its clean audio is and what it gets."""
    pos: int  # its row in the pass's index
    utt_id: str
    uri: str  # the clean source
    frame_labels: np.ndarray  # int16, 100 Hz, of the clean (= far-field) signal
    recipe: Recipe
    stored_uri: str = ""  # the corpus's own rendering (recipe.stored)


@dataclass
class Rendered:
    pos: int
    x: np.ndarray | None  # [rows, D] float32 after CMVN, at the pass's offset
    labels: np.ndarray | None  # [rows] int64
    reason: str = ""
    detail: str = ""


class Renderer:
    """Renders streams; what an example server holds (configs, CMVN, babble banks)."""

    def __init__(self, storage: Storage, fcfg: FeaturesConfig, norm: Normalizer,
                 babble: dict[str, Any] | None = None, sil_id: int = -1):
        self.storage, self.fcfg, self.norm = storage, fcfg, norm
        self.babble_cfg = babble or {}
        self.sil_id = sil_id
        self._computers: dict[float, Any] = {}

    def _computer(self, warp: float):
        c = self._computers.get(warp)
        if c is None:
            if len(self._computers) > 64:  # VTLP warps are continuous: keep a few
                self._computers.clear()
            c = self._computers[warp] = FbankComputer(self.fcfg, warp=warp)
        return c

    def _babble(self, recipe: Recipe) -> list[np.ndarray] | None:
        b = self.babble_cfg
        if not b:
            return None
        try:
            return list(babble_bank(int(b["seed"]), recipe.seed % int(b["banks"]),
                                    str(b["language"]), self.fcfg.sample_rate))
        except Exception as exc:  # noqa: BLE001 - no espeak: no babble, other noises go on
            log.warning("babble unavailable (%s): babble noise is skipped", exc)
            self.babble_cfg = {}
            return None

    def _active(self, frame_labels: np.ndarray, n: int) -> np.ndarray | None:
        """Speech samples (labels other than silence), for an SNR over active speech."""
        if self.sil_id < 0:
            return None
        _, shift = _fbank_geometry(self.fcfg)
        act = np.repeat(frame_labels != self.sil_id, shift)[:n]
        return np.pad(act, (0, n - len(act))) if len(act) < n else act

    def render_stream(self, items: list[StreamItem], offset: int, stack: int
                      ) -> tuple[list[Rendered], float]:
        """One speaker stream in time order -> per utterance features and labels (or a
        reject); the CPU seconds it took."""
        c0 = time.process_time()
        fcfg = self.fcfg
        length, shift = _fbank_geometry(fcfg)
        out: list[Rendered] = []
        kept: list[tuple[StreamItem, np.ndarray, np.ndarray]] = []
        for it in items:
            uri = it.stored_uri if it.recipe.stored and it.stored_uri else it.uri
            res = load_audio_result(self.storage, uri, fcfg)
            if res.samples is None:
                out.append(Rendered(it.pos, None, None, res.reason or "unreadable_audio",
                                    res.detail))
                continue
            x = res.samples
            frames = augmented_frames(len(it.frame_labels), it.recipe.speed, fcfg)
            if not it.recipe.is_identity:
                x = augment_audio(x, it.recipe, fcfg.sample_rate,
                                  self._active(it.frame_labels, len(x)), self._babble(it.recipe))
            need = length + shift * (frames - 1)
            if frames <= 0 or len(x) < need:
                out.append(Rendered(it.pos, None, None, "too_short",
                                    f"{len(x)} samples, need {need}"))
                continue
            f = self._computer(it.recipe.warp).compute([x[:need]])[0]
            if not np.isfinite(f).all():
                out.append(Rendered(it.pos, None, None, "nonfinite_features",
                                    f"{int((~np.isfinite(f)).sum())} values"))
                continue
            labels = stretch_labels(it.frame_labels, it.recipe.speed, frames, fcfg)
            kept.append((it, f, labels))
        if kept:
            cmn = StreamCMN(fcfg.num_mel_bins, fcfg.cmn_window, fcfg.cmn_min_window)
            normed = cmn.apply(np.concatenate([f for _, f, _ in kept]))
            o = 0
            for it, f, fl in kept:
                x = stack_frames(normed[o:o + len(f)], fcfg.stack, fcfg.subsample)
                o += len(f)
                if offset:
                    x = records.shift_offset(x, offset, stack)
                x = self.norm(x).astype(np.float32, copy=False)
                lab = records.offset_labels(fl.astype(np.int64), offset, stack, x.shape[0])
                out.append(Rendered(it.pos, x, lab))
        out.sort(key=lambda r: r.pos)
        return out, time.process_time() - c0


class ExampleServer:
    """A pool member (a Ray actor): one Renderer, one single-threaded process."""

    def __init__(self, storage_cfg: StorageConfig | None, fcfg: FeaturesConfig, norm: Normalizer,
                 babble: dict[str, Any], sil_id: int):
        torch.set_num_threads(1)
        self.renderer = Renderer(Storage(storage_cfg), fcfg, norm, babble, sil_id)

    def render(self, task: tuple[list[StreamItem], int, int]) -> tuple[list[Rendered], float]:
        return self.renderer.render_stream(*task)


# ----------------------------------------------------------------- the input source
@dataclass
class PassStats:
    examples: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    rejects: dict[str, int] = field(default_factory=dict)


class ExampleServers:
    """`InputSource` of the labeled passes: this worker's labeled utterances, re-rendered
    every pass. Other pass kinds are not served (augmentation is for labeled recipes)."""

    def __init__(self, storage: Storage, tc: TrainConfig, fcfg: FeaturesConfig,
                 index: SplitIndex, sources: dict[str, dict[str, str]], rank: int, stack: int,
                 right: int, norm: Normalizer, storage_cfg: StorageConfig | None = None,
                 babble: dict[str, Any] | None = None, sil_id: int = -1,
                 passes: list[PassInfo] | None = None):
        self.storage, self.tc, self.acfg, self.fcfg = storage, tc, tc.augment, fcfg
        self.passes = passes or []
        self.rank, self.stack, self.right, self.norm = rank, stack, right, norm
        self.storage_cfg, self.babble, self.sil_id = storage_cfg, babble or {}, sil_id
        self.rows_in = index.rows_in
        self.rejected_rows = dict(index.rejected)
        self._load(index, sources)
        self._plans: dict[int, tuple[SplitIndex, Any, list[Recipe]]] = {}
        self.stats: dict[int, PassStats] = {}
        self._actors: list[Any] = []
        self._next_actor = 0
        self._ahead: dict[tuple[int, int], Any] = {}  # (pass, stream) -> result ref
        self.renderer = Renderer(storage, fcfg, norm, self.babble, sil_id)
        if self.pooled:  # the actors start (import, CMVN) while the trainer sets up
            self._pool()

    # -- the worker's utterances, as speaker streams
    def _load(self, index: SplitIndex, sources: dict[str, dict[str, str]]) -> None:
        """Keep the rows with a clean source and frame labels; group them into streams."""
        labels = _frame_labels(self.storage, index)
        utts = []
        for u in index.utt_ids:
            src = sources.get(u)
            fl = labels.get(u)
            reason = ("no_clean_source" if src is None else
                      "missing_frame_labels" if fl is None or len(fl) == 0 else "")
            if reason:
                self.rejected_rows[reason] = self.rejected_rows.get(reason, 0) + 1
                continue
            utts.append(SourceUtt(src["speaker_id"], src["created_at"], u, src["uri"], fl,
                                  src.get("stored_uri", "")))
        # Streams: a speaker's utterances in time order, `stream_utts` at a time.
        order = sorted(range(len(utts)), key=lambda k: utts[k][:3])
        self.utts = [utts[k] for k in order]
        self.stream_of = np.zeros(len(self.utts), np.int32)
        self.pos_in_stream = np.zeros(len(self.utts), np.int32)
        sid, prev, count = -1, None, 0
        for k, (spk, *_rest) in enumerate(self.utts):
            if spk != prev or count == self.acfg.stream_utts:
                sid, prev, count = sid + 1, spk, 0
            self.stream_of[k], self.pos_in_stream[k] = sid, count
            count += 1
        self.num_streams = sid + 1

    def _plan(self, p: PassInfo) -> tuple[SplitIndex, Any, list[Recipe]]:
        """The pass's recipes, its index of augmented lengths and its minibatch plan."""
        got = self._plans.get(p.index)
        if got is None:
            fc = self.fcfg
            recipes = [draw_recipe(self.acfg, self.tc.seed, p.index, u.utt_id) for u in self.utts]
            frames = np.array([lfr_rows(augmented_frames(len(u.frame_labels), r.speed, fc),
                                        fc.stack, fc.subsample)
                               for u, r in zip(self.utts, recipes)], np.int64)
            n = len(self.utts)
            index = SplitIndex([f"stream-{s}" for s in range(self.num_streams)], "labels",
                               self.stream_of.copy(), self.pos_in_stream.copy(), frames,
                               np.ones(n, bool), [u.utt_id for u in self.utts], [""] * n,
                               int(self.norm.mean.shape[0]), rows_in=n)
            plan = plan_pass(index, self.spec(p))
            got = self._plans[p.index] = (index, plan, recipes)
            while len(self._plans) > 2:  # the open pass and the warm one; others recompute
                del self._plans[next(iter(self._plans))]
        return got

    def spec(self, p: PassInfo) -> PassSpec:
        base = pass_spec(self.tc, p, self.rank, self.stack, self.right)
        return replace(base, shuffle_partitions=self.acfg.window_streams)

    # -- InputSource
    def num_batches(self, p: PassInfo) -> int:
        return self._plan(p)[1].num_batches

    def open(self, p: PassInfo, start: int, limit: int) -> "AugmentedStream":
        index, plan, recipes = self._plan(p)
        stats = self.stats.setdefault(p.index, PassStats())
        self._ahead = {k: v for k, v in self._ahead.items() if k[0] >= p.index}
        return AugmentedStream(self, p, index, plan, recipes, start, limit, stats)

    def totals(self) -> tuple[int, int, int]:
        rejected = sum(self.rejected_rows.values())
        return self.rows_in, len(self.utts), rejected

    def rejected(self) -> dict[str, Any]:
        return {"labeled": dict(self.rejected_rows)}

    def pass_metrics(self, p: PassInfo) -> dict[str, Any]:
        s = self.stats.get(p.index)
        if s is None:
            return {}
        return {"source": "example_servers", "servers": self.acfg.servers,
                "examples": s.examples, "examples_per_s": s.examples / max(s.wall_s, 1e-9),
                "augment_cpu_s": s.cpu_s, "augment_cores": s.cpu_s / max(s.wall_s, 1e-9),
                "stream_rejects": dict(s.rejects)}

    def close(self) -> None:
        if self._actors:
            import ray  # deferred: Ray loads only when the example servers run as actors

            for a in self._actors:
                ray.kill(a)
        self._actors, self._ahead = [], {}

    # -- the pool
    @property
    def pooled(self) -> bool:
        return self.acfg.servers > 0

    @property
    def max_in_flight(self) -> int:
        return self.acfg.window_streams + self.acfg.servers * self.acfg.inflight

    def submit(self, key: tuple[int, int], task: Any) -> Any:
        """The result ref of stream task `key` = (pass, stream): submitted earlier by
        `warm`, or now to the next server (equal-sized tasks: round robin; Ray queues
        an actor's calls)."""
        ref = self._ahead.pop(key, None)
        if ref is not None:
            return ref
        actors = self._pool()
        actor = actors[self._next_actor % len(actors)]
        self._next_actor += 1
        return actor.render.remote(task)

    def _pool(self) -> list[Any]:
        if not self._actors:
            import ray

            actor = ray.remote(ExampleServer).options(
                num_cpus=self.acfg.cpus_per_server, resources=dict(self.acfg.resources) or None)
            self._actors = [actor.remote(self.storage_cfg, self.fcfg, self.norm, self.babble,
                                         self.sil_id) for _ in range(self.acfg.servers)]
        return self._actors

    def warm(self, p: PassInfo) -> None:
        """Submit the first window of the pass after `p` (if the schedule has one)."""
        if p.index + 1 >= len(self.passes) or self.passes[p.index + 1].kind != "labeled":
            return
        q = self.passes[p.index + 1]
        index, plan, recipes = self._plan(q)
        if not plan.windows:
            return
        stream = AugmentedStream(self, q, index, plan, recipes, 0, plan.num_batches, PassStats())
        for s in plan.windows[0].parts:
            self._ahead[(q.index, s)] = self.submit((q.index, s), stream._task(s))


def _frame_labels(storage: Storage, index: SplitIndex) -> dict[str, np.ndarray]:
    """utt_id -> stored 100 Hz frame labels (int16) of the index's rows."""
    want = set(index.utt_ids)
    out: dict[str, np.ndarray] = {}
    for uri in index.uris:
        cols = records.columns(records.read_table(storage, uri, ["utt_id", "frame_labels"]))
        for u, fl in zip(cols["utt_id"], cols["frame_labels"]):
            if u in want and fl is not None and len(fl):
                out[u] = fl.astype(np.int16)  # a copy: the table goes
    return out


class AugmentedStream:
    """Minibatches [start, limit) of one augmented pass, produced by a background thread
    that keeps the pool busy at most `servers * inflight` streams ahead."""

    def __init__(self, src: ExampleServers, p: PassInfo, index: SplitIndex, plan: Any,
                 recipes: list[Recipe], start: int, limit: int, stats: PassStats):
        self.src, self.p, self.index, self.plan, self.recipes = src, p, index, plan, recipes
        self.start, self.limit, self.stats = start, min(limit, plan.num_batches), stats
        self.offset = plan.spec.offset
        self._ahead = Prefetch(self._batches, max(1, src.tc.batches.prefetch),
                               name="amflow-example-servers")

    # -- what the windows need
    def _windows(self) -> list[tuple[list[int], list[np.ndarray]]]:
        """(streams to render, minibatches to emit) per window that has minibatches in
        [start, limit); earlier windows are skipped unrendered (resume)."""
        out, pos = [], 0
        for w in self.plan.windows:
            n = len(w.batches)
            lo, hi = max(self.start - pos, 0), min(self.limit - pos, n)
            if lo < hi:
                out.append((list(w.parts), w.batches[lo:hi]))
            pos += n
            if pos >= self.limit:
                break
        return out

    def _task(self, stream: int) -> tuple[list[StreamItem], int, int]:
        rows = np.nonzero(self.index.part == stream)[0]
        u = self.src.utts
        items = [StreamItem(int(k), u[k].utt_id, u[k].uri, u[k].frame_labels, self.recipes[k],
                            u[k].stored_uri) for k in rows]
        return items, self.offset, self.src.stack

    def _rendered(self) -> Iterator[tuple[list[Rendered], float]]:
        """Every needed stream's rendering, in window order, pool-parallel and bounded."""
        streams = [s for parts, _ in self._windows() for s in parts]
        if not self.src.pooled:
            for s in streams:
                yield self.src.renderer.render_stream(*self._task(s))
            return
        import ray

        refs: collections.deque = collections.deque()
        todo = collections.deque(streams)
        for _ in streams:
            while todo and len(refs) < self.src.max_in_flight:
                s = todo.popleft()
                refs.append(self.src.submit((self.p.index, s), self._task(s)))
                if not todo:
                    self.src.warm(self.p)
            yield ray.get(refs.popleft())

    def _batches(self) -> Iterator[Batch]:
        """The pass's minibatches, collated window by window as their streams render."""
        t0 = time.perf_counter()
        try:
            rendered = self._rendered()
            for parts, batches in self._windows():
                utts = _Utterances(self.src.storage, self.index, self.src.norm, 0, self.src.stack)
                for _ in parts:
                    self._cache(utts, *next(rendered))
                for bt in batches:
                    yield _collate(utts, bt)
        finally:
            self.stats.wall_s += time.perf_counter() - t0

    def _cache(self, utts: _Utterances, results: list[Rendered], cpu: float) -> None:
        self.stats.cpu_s += cpu
        for r in results:
            if r.x is None:
                self.stats.rejects[r.reason] = self.stats.rejects.get(r.reason, 0) + 1
                log.warning("example servers: %s rejected (%s: %s)",
                            self.index.utt_ids[r.pos], r.reason, r.detail)
            else:
                utts.cache[r.pos] = (r.x, r.labels)
                self.stats.examples += 1

    @property
    def wait_s(self) -> float:
        return self._ahead.wait_s

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._ahead)

    def close(self) -> None:
        self._ahead.close()


def _collate(utts: _Utterances, pieces: np.ndarray) -> Batch:
    """A minibatch of the rendered pieces; pieces of rejected utterances drop out. With
    none left it is an all-padding minibatch (0 scored frames): the trainer still steps,
    so every worker runs the pass's agreed number of steps."""
    ok = np.array([int(u) in utts.cache for u in pieces[:, 0]], bool)
    if ok.all():
        return utts.collate(pieces, False)
    if ok.any():
        return utts.collate(pieces[ok], False)
    d = utts.index.feat_dim
    return Batch(torch.zeros(1, 1, d), torch.ones(1, dtype=torch.int64),
                 torch.zeros(1, 1, dtype=torch.bool),
                 labels=torch.full((1, 1), IGNORE, dtype=torch.int64), frames=0)
