"""The data pipeline: `select.*`, `features.*`, `targets.*`, `repartition.*`."""
from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from core.target_codes import FP16_CODE, sqrt_levels
from core.config.errors import check


def _check_when(value: str, key: str) -> None:
    """An optional ISO 8601 date or date-time (empty: unset)."""
    if value:
        try:
            _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            check(False, key, f"must be an ISO 8601 date or time (YYYY-MM-DD[THH:MM]), got "
                              f"{value!r}")


@dataclass
class SelectConfig:
    hours: float = 1.0  # hours of audio to select from the corpus (all of it when it holds less)
    shard_hours: float = 0.05  # target duration of a shard, the unit of parallel work
    # Corpus splits to select from: labeled, unlabeled, dev, test.
    splits: list[str] = field(default_factory=lambda: ["labeled", "unlabeled"])
    # Mild oversampling from the mean utterance length, then trim to `hours`.
    oversample: float = 1.05
    seed: int = 0  # seeds the uniform sample
    interval_start: str = ""  # data interval start (ISO 8601, inclusive, UTC if naive): select only records created from then; reads only the metadata/date=* partitions of the interval; empty: the whole corpus
    interval_end: str = ""  # data interval end (ISO 8601, exclusive); set with select.interval_start

    def validate(self, key: str) -> None:
        check(self.hours > 0, f"{key}.hours", "must be > 0")
        _check_when(self.interval_start, f"{key}.interval_start")
        _check_when(self.interval_end, f"{key}.interval_end")
        check(bool(self.interval_start) == bool(self.interval_end), f"{key}.interval_end",
              "select.interval_start and select.interval_end are set together (or neither)")
        if self.interval_start:
            a, b = (_dt.datetime.fromisoformat(v.strip()) for v in
                    (self.interval_start, self.interval_end))
            a, b = (t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc) for t in (a, b))
            check(a < b, f"{key}.interval_end", f"must be after select.interval_start "
                                                f"({self.interval_start}), got {self.interval_end}")
        check(self.shard_hours > 0, f"{key}.shard_hours", "must be > 0")
        check(self.oversample >= 1.0, f"{key}.oversample", "must be >= 1.0")
        check(bool(self.splits), f"{key}.splits", "must name at least one split")
        bad = [s for s in self.splits if s not in ("labeled", "unlabeled", "dev", "test")]
        check(not bad, f"{key}.splits", f"must be among labeled, unlabeled, dev, test; got {bad}")


@dataclass
class FeaturesConfig:
    backend: str = "numpy"  # numpy (batched, vectorised) | kaldi (kaldi-native-fbank per utterance)
    sample_rate: int = 16000  # Hz the audio is read (and resampled) at
    num_mel_bins: int = 64  # log-mel filterbank channels
    frame_length_ms: float = 25.0  # analysis window
    frame_shift_ms: float = 10.0  # hop between frames
    dither: float = 0.0  # Kaldi units (int16 LSBs); 0 = off
    preemph_coeff: float = 0.97  # pre-emphasis (Kaldi)
    remove_dc_offset: bool = True  # subtract each frame's mean (Kaldi)
    window_type: str = "povey"  # povey | hanning | hamming | blackman | rectangular
    low_freq: float = 20.0  # Hz, lowest mel bin edge
    high_freq: float = 0.0  # Hz, highest mel bin edge; <= 0: Nyquist plus this (Kaldi)
    snip_edges: bool = True  # only whole frames inside the audio (Kaldi)
    # Causal mean normalisation carried over a speaker's stream (tasks/features.py).
    cmn_window: int = 600
    # A stream's first frames are normalised by the mean of this many (cold start).
    cmn_min_window: int = 100
    stack: int = 3  # low frame rate: frames stacked into one row
    subsample: int = 3  # low frame rate: keep every n-th stacked row (3: 33 Hz)
    # uint8 with a per-row column range meets the <= 25 MB per audio hour budget; float16 does not.
    storage_dtype: str = "uint8"  # float16 | uint8
    resample: bool = True  # resample audio at another rate (else: a reject)
    downmix: bool = True  # average multi-channel audio to mono (else: a reject)
    # Reject audio whose length differs from the metadata duration by more than
    # max(0.1 s, this fraction of it); 0 = do not check.
    duration_tolerance: float = 0.25
    # Alignment frames may miss the audio by at most this much at either end or in a gap.
    align_tolerance_s: float = 0.3
    # FFT + mel matmul engine of the numpy backend: torch's (MKL) when importable, else
    # scipy.fft + numpy BLAS. Same results to float32 rounding.
    fft_engine: str = "auto"  # auto | torch | scipy
    # Audio seconds per batched fbank call, and threads fetching audio ahead of it.
    batch_seconds: float = 60.0
    io_threads: int = 4  # threads reading audio ahead of the fbank
    seed: int = 0  # seeds the hierarchical shuffle (shard order, rows within a shard)
    # Where the labels come from: ctm (the corpus's alignments.ctm, its phones as classes) or
    # align (`amflow align`'s outputs of this run: the network tree's context-dependent
    # classes, so records with only a transcript are labeled data).
    labels: str = "ctm"
    # labels=align: the aligner's MFCC frames may differ from the fbank frames by this many
    # (trimmed, or padded with the last label); more is an alignment_mismatch reject.
    label_frame_tolerance: int = 2

    def validate(self, key: str) -> None:
        check(self.labels in ("ctm", "align"), f"{key}.labels", "must be ctm or align")
        check(self.label_frame_tolerance >= 0, f"{key}.label_frame_tolerance", "must be >= 0")
        check(self.backend in ("numpy", "kaldi"), f"{key}.backend", "must be numpy or kaldi")
        check(self.sample_rate > 0, f"{key}.sample_rate", "must be > 0")
        check(self.num_mel_bins > 0, f"{key}.num_mel_bins", "must be > 0")
        check(self.frame_length_ms > 0 and self.frame_shift_ms > 0, f"{key}.frame_shift_ms",
               "frame length and shift must be > 0")
        check(self.dither >= 0, f"{key}.dither", "must be >= 0")
        check(self.window_type in ("povey", "hanning", "hamming", "blackman", "rectangular"),
               f"{key}.window_type", "must be povey, hanning, hamming, blackman or rectangular")
        check(0 <= self.preemph_coeff <= 1, f"{key}.preemph_coeff", "must be in [0, 1]")
        check(self.cmn_window >= 1, f"{key}.cmn_window", "must be >= 1")
        check(0 <= self.cmn_min_window <= self.cmn_window, f"{key}.cmn_min_window",
               "must be in [0, features.cmn_window]")
        check(self.stack >= 1, f"{key}.stack", "must be >= 1")
        check(self.subsample >= 1, f"{key}.subsample", "must be >= 1")
        check(self.storage_dtype in ("float16", "uint8"), f"{key}.storage_dtype",
               "must be float16 or uint8")
        check(self.duration_tolerance >= 0, f"{key}.duration_tolerance", "must be >= 0")
        check(self.align_tolerance_s >= 0, f"{key}.align_tolerance_s", "must be >= 0")
        check(self.fft_engine in ("auto", "torch", "scipy"), f"{key}.fft_engine",
               "must be auto, torch or scipy")
        check(self.batch_seconds > 0, f"{key}.batch_seconds", "must be > 0")
        check(self.io_threads >= 1, f"{key}.io_threads", "must be >= 1")


LABEL_KEYS = ("labels", "label_frame_tolerance")


def features_dict(fcfg: FeaturesConfig) -> dict[str, Any]:
    """The features section as recorded in plans and model cards. With the default
    labels=ctm the label keys are left out, so those records stay as they were before
    the keys existed (byte-identical outputs on the default path)."""
    d = dataclasses.asdict(fcfg)
    if fcfg.labels == "ctm":
        for k in LABEL_KEYS:
            d.pop(k)
    return d


@dataclass
class TargetsConfig:
    teacher: str = ""  # URI of a teacher checkpoint; empty = the run's own teacher step output
    k: int = 20  # teacher classes kept per frame (the paper: 20)
    # Per frame, keep only the fewest of the top-k whose teacher probability reaches this
    # share (1.0: all k, the paper's layout). A confident frame then stores 1-2 entries,
    # not k: amflow/records.py's `topk_len`, tasks/targets.kept_for_mass.
    mass: float = 1.0
    # How each entry is stored (amflow/records.py): fp16 = int16 index + fp16 logit (the
    # paper's layout); sqrt<L> = one-byte index (<= 256 classes) + one byte for the
    # probability, round(L * sqrt(p)): with mass 0.99 ~10x smaller than full fp16
    # posteriors at 67 classes (docs/results/2026-11-27-targets-codec.md).
    codec: str = FP16_CODE
    zstd_level: int = 9  # of the target shards' Parquet; the sqrt codes gain from 19
    # Kept only so configs that set it still load: targets are stored as raw logits, the
    # temperature is training's (train.temperature); any value but 1 is refused.
    temperature: float = 1.0
    actors: int = 2  # teacher actors scoring in parallel (one CPU core or GPU each)
    threads_per_actor: int = 1  # torch threads per CPU actor
    batch_frames: int = 8000  # frames per padded teacher batch (length-sorted)
    max_frames: int = 20000  # longer utterances are split into pieces of this size
    device: str = "auto"  # auto | cpu | cuda (resolved inside each actor)
    num_gpus_per_actor: float = -1.0  # -1: 1 when the cluster has GPUs and device allows
    # Half precision on GPU: true | false | auto (fp16 on GPUs before Ampere, where it is
    # faster; fp32 from Ampere on, where TF32 is: amflow/precision.py, bench/GPU.md).
    fp16: bool | str = "auto"
    fp16_on_cpu: bool = False  # run the fp16 GPU path on CPU (tests, debugging)
    # CPU actors: auto = bf16 when the CPU has native bf16 (AMX / AVX512-BF16), else fp32.
    cpu_precision: str = "auto"  # auto | fp32 | bf16
    # Frames scored in full to report the mass and KL the top-k keep.
    fidelity_sample_frames: int = 20000

    def validate(self, key: str) -> None:
        check(self.k >= 1, f"{key}.k", "must be >= 1")
        check(0.0 < self.mass <= 1.0, f"{key}.mass", f"must be in (0, 1], got {self.mass}")
        check(self.mass == 1.0 or self.k <= 255, f"{key}.k",
               f"must be <= 255 with {key}.mass < 1 (one byte counts each frame's entries)")
        check(self.actors >= 1, f"{key}.actors", "must be >= 1")
        check(isinstance(self.fp16, bool) or self.fp16 == "auto", f"{key}.fp16",
               f"must be true, false or auto, got {self.fp16!r}")
        check(self.device in ("auto", "cpu", "cuda"), f"{key}.device", "must be auto, cpu or cuda")
        check(self.cpu_precision in ("auto", "fp32", "bf16"), f"{key}.cpu_precision",
               "must be auto, fp32 or bf16")
        check(self.temperature == 1.0, f"{key}.temperature",
              "is not applied (targets are stored as raw logits); set train.temperature, "
              "the distillation temperature, instead")
        if self.codec != FP16_CODE:
            try:
                sqrt_levels(self.codec)
            except ValueError:
                check(False, f"{key}.codec",
                       f"must be fp16 or sqrt<L> with 2 <= L <= 255, got {self.codec!r}")
        check(1 <= self.zstd_level <= 22, f"{key}.zstd_level", "must be in 1..22")


@dataclass
class RepartitionConfig:
    # Target partition duration; the count is rounded up to a multiple of train.workers.
    partition_hours: float = 0.05
    # Splits to partition; empty = every split the features step produced.
    splits: list[str] = field(default_factory=list)
    seed: int = 0  # seeds the shuffle of shards and rows into partitions
    # Shards shuffled together. A split with more feature shards is cut into shuffle
    # windows of about this many (shards drawn at random), each planned by its own task,
    # so the driver holds one line per shard and every shard feeds only its window's
    # partitions. 0 = one window per split (a global shuffle).
    window_shards: int = 64
    days: int = 0  # also train on the last N days of daily_data's interval partitions (runs/<daily.dataset>-YYYY-MM-DD/), ending at repartition.to_date or the newest; 0: none
    from_date: str = ""  # first day (YYYY-MM-DD) of daily_data's partitions to add (with to_date: a date range instead of the last N days)
    to_date: str = ""  # last day (YYYY-MM-DD, inclusive) of the partitions to add; empty: the newest partition

    def validate(self, key: str) -> None:
        check(self.partition_hours > 0, f"{key}.partition_hours", "must be > 0")
        check(self.days >= 0, f"{key}.days", "must be >= 0 (0: no daily partitions)")
        _check_when(self.from_date, f"{key}.from_date")
        _check_when(self.to_date, f"{key}.to_date")
        check(self.window_shards >= 0, f"{key}.window_shards", "must be >= 0")
        bad = [s for s in self.splits if s not in ("labeled", "unlabeled", "dev", "test")]
        check(not bad, f"{key}.splits", f"must be among labeled, unlabeled, dev, test; got {bad}")
