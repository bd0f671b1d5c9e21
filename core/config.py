"""One validated config schema for every step.

The schema is a tree of dataclasses. A YAML file and `--set a.b=c` overrides are merged
onto the defaults; an unknown key, a wrong type or an out-of-range value raises
`ConfigError` naming the dotted key. Steps receive the typed `Config` object.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.target_codes import FP16_CODE, sqrt_levels


class ConfigError(ValueError):
    """A bad config key or value; the message starts with the dotted key."""

    def __init__(self, key: str, message: str):
        super().__init__(f"config key '{key}': {message}")
        self.key = key
        self.reason = message


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


@dataclass
class S3Config:
    # Empty values mean "use the standard AWS chain" (env, profile, instance role).
    endpoint_url: str = ""
    region: str = ""
    access_key_id: str = ""
    secret_access_key: str = ""
    session_token: str = ""
    # Path-style addressing is required by most non-AWS endpoints (moto, MinIO).
    force_path_style: bool = False


@dataclass
class StorageConfig:
    root: str = "./data"
    s3: S3Config = field(default_factory=S3Config)
    retries: int = 5
    retry_backoff_s: float = 0.5

    def validate(self, key: str) -> None:
        _check(bool(self.root.strip()), f"{key}.root", "must be a non-empty URI")
        _check(self.retries >= 0, f"{key}.retries", "must be >= 0")


@dataclass
class DataConfig:
    corpus: str = "./data/corpus"
    # Pronunciation lexicon (Kaldi lexicon.txt) for decoding; empty = <corpus>/lexicon.txt,
    # which `amflow corpus` writes for the embedded corpus.
    lexicon: str = ""

    def lexicon_uri(self, corpus: str | None = None) -> str:
        """The lexicon to read: `lexicon`, else <corpus>/lexicon.txt (default: `corpus`)."""
        return self.lexicon or (corpus or self.corpus).rstrip("/") + "/lexicon.txt"

    def validate(self, key: str) -> None:
        _check(bool(self.corpus.strip()), f"{key}.corpus", "must be a non-empty URI")


@dataclass
class RayConfig:
    # Empty address: start (or join) a local Ray on this machine.
    address: str = ""
    num_cpus: int = 2
    num_gpus: int = 0
    # Torch/BLAS threads inside each Ray task, so tasks do not oversubscribe the cores.
    worker_threads: int = 1
    # Custom resources each step requests, so it lands on its pool on a cluster
    # (e.g. {"features": {"pool_c4": 0.01}}). Empty on a laptop.
    step_resources: dict[str, dict[str, float]] = field(default_factory=dict)

    def validate(self, key: str) -> None:
        _check(self.num_cpus >= 1, f"{key}.num_cpus", "must be >= 1")
        _check(self.num_gpus >= 0, f"{key}.num_gpus", "must be >= 0")


@dataclass
class CorpusConfig:
    """`amflow corpus`: the synthetic espeak-ng corpus (see tasks/corpus.py)."""

    hours: float = 0.3
    seed: int = 0
    # Shares of the corpus duration per split; unlabeled gets the rest, which must be
    # larger than the labeled share (several times larger, as in the paper).
    labeled_share: float = 0.12
    dev_share: float = 0.08
    test_share: float = 0.12
    # Speakers; `test_speakers` of them speak only the test split (unseen elsewhere).
    speakers: int = 24
    test_speakers: int = 4
    conditions: list[str] = field(default_factory=lambda: ["DP1", "DP2", "DP3", "DP4", "DP5"])
    sample_rate: int = 16000
    # Ray tasks in flight at once (each synthesises one batch of one speaker's utterances).
    workers: int = 2
    batch_utts: int = 16
    language: str = "en-us"  # espeak-ng voice language
    locale: str = "en-US"  # written to the metadata
    # Utterance durations (seconds, padding included) and recording dates.
    min_duration: float = 1.5
    max_duration: float = 5.0
    start_date: str = "2026-03-01"
    days: int = 21
    # Metadata partitions: metadata/date=YYYY-MM-DD/bucket=NN/part-*.jsonl.
    buckets: int = 16
    # Background talkers for babble noise: banks of sentences by voices outside the corpus.
    babble_banks: int = 4
    # Splits whose dry (close-talk) rendering is kept beside the far-field one
    # (audio_clean/, `clean_audio_uri`): labeled for the example servers; add test for a
    # close-talk test set (`amflow evaluate --set evaluate.audio=clean`).
    clean_splits: list[str] = field(default_factory=lambda: ["labeled"])

    def validate(self, key: str) -> None:
        _check(self.hours > 0, f"{key}.hours", "must be > 0")
        for name in ("labeled_share", "dev_share", "test_share"):
            v = getattr(self, name)
            _check(0 <= v < 1, f"{key}.{name}", "must be in [0, 1)")
        _check(self.labeled_share > 0 and self.test_share > 0, f"{key}.labeled_share",
               "labeled_share and test_share must be > 0")
        unlabeled = 1.0 - self.labeled_share - self.dev_share - self.test_share
        _check(unlabeled > self.labeled_share, f"{key}.labeled_share",
               f"the unlabeled share (1 - labeled - dev - test = {unlabeled:.3f}) must be "
               f"larger than the labeled share")
        _check(self.speakers >= 4, f"{key}.speakers", "must be >= 4")
        _check(0 < self.test_speakers < self.speakers, f"{key}.test_speakers",
               "must be in (0, corpus.speakers)")
        _check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        _check(self.batch_utts >= 1, f"{key}.batch_utts", "must be >= 1")
        _check(self.sample_rate == 16000, f"{key}.sample_rate", "only 16000 is supported")
        bad = [c for c in self.conditions if c not in ("DP1", "DP2", "DP3", "DP4", "DP5")]
        _check(not bad and self.conditions, f"{key}.conditions", f"must be among DP1..DP5, got {bad}")
        _check(0.5 <= self.min_duration < self.max_duration, f"{key}.min_duration",
               "must be >= 0.5 and < corpus.max_duration")
        _check(self.max_duration >= 3.0, f"{key}.max_duration", "must be >= 3.0")
        try:
            _dt.date.fromisoformat(self.start_date)
        except ValueError:
            raise ConfigError(f"{key}.start_date", "must be a date YYYY-MM-DD") from None
        _check(self.days >= 1, f"{key}.days", "must be >= 1")
        _check(1 <= self.buckets <= 100, f"{key}.buckets", "must be in [1, 100]")
        _check(self.babble_banks >= 1, f"{key}.babble_banks", "must be >= 1")
        bad = [x for x in self.clean_splits if x not in ("labeled", "unlabeled", "dev", "test")]
        _check(not bad, f"{key}.clean_splits",
               f"must be among labeled, unlabeled, dev, test, got {bad}")


@dataclass
class SelectConfig:
    hours: float = 1.0
    shard_hours: float = 0.05
    splits: list[str] = field(default_factory=lambda: ["labeled", "unlabeled"])
    # Mild oversampling from the mean utterance length, then trim to `hours`.
    oversample: float = 1.05
    seed: int = 0

    def validate(self, key: str) -> None:
        _check(self.hours > 0, f"{key}.hours", "must be > 0")
        _check(self.shard_hours > 0, f"{key}.shard_hours", "must be > 0")
        _check(self.oversample >= 1.0, f"{key}.oversample", "must be >= 1.0")
        _check(bool(self.splits), f"{key}.splits", "must name at least one split")
        bad = [s for s in self.splits if s not in ("labeled", "unlabeled", "dev", "test")]
        _check(not bad, f"{key}.splits", f"must be among labeled, unlabeled, dev, test; got {bad}")


@dataclass
class FeaturesConfig:
    backend: str = "numpy"  # numpy (batched, vectorised) | kaldi (kaldi-native-fbank per utterance)
    sample_rate: int = 16000
    num_mel_bins: int = 64
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0  # Kaldi units (int16 LSBs); 0 = off
    preemph_coeff: float = 0.97
    remove_dc_offset: bool = True
    window_type: str = "povey"
    low_freq: float = 20.0
    high_freq: float = 0.0
    snip_edges: bool = True
    # Causal mean normalisation carried over a speaker's stream (tasks/features.py).
    cmn_window: int = 600
    cmn_min_window: int = 100
    stack: int = 3
    subsample: int = 3
    # uint8 with a per-row column range meets the <= 25 MB per audio hour budget; float16 does not.
    storage_dtype: str = "uint8"  # float16 | uint8
    resample: bool = True
    downmix: bool = True
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
    io_threads: int = 4
    seed: int = 0
    # Where the labels come from: ctm (the corpus's alignments.ctm, its phones as classes) or
    # align (`amflow align`'s outputs of this run: the network tree's context-dependent
    # classes, so records with only a transcript are labeled data).
    labels: str = "ctm"
    # labels=align: the aligner's MFCC frames may differ from the fbank frames by this many
    # (trimmed, or padded with the last label); more is an alignment_mismatch reject.
    label_frame_tolerance: int = 2

    def validate(self, key: str) -> None:
        _check(self.labels in ("ctm", "align"), f"{key}.labels", "must be ctm or align")
        _check(self.label_frame_tolerance >= 0, f"{key}.label_frame_tolerance", "must be >= 0")
        _check(self.backend in ("numpy", "kaldi"), f"{key}.backend", "must be numpy or kaldi")
        _check(self.sample_rate > 0, f"{key}.sample_rate", "must be > 0")
        _check(self.num_mel_bins > 0, f"{key}.num_mel_bins", "must be > 0")
        _check(self.frame_length_ms > 0 and self.frame_shift_ms > 0, f"{key}.frame_shift_ms",
               "frame length and shift must be > 0")
        _check(self.dither >= 0, f"{key}.dither", "must be >= 0")
        _check(self.window_type in ("povey", "hanning", "hamming", "blackman", "rectangular"),
               f"{key}.window_type", "must be povey, hanning, hamming, blackman or rectangular")
        _check(0 <= self.preemph_coeff <= 1, f"{key}.preemph_coeff", "must be in [0, 1]")
        _check(self.cmn_window >= 1, f"{key}.cmn_window", "must be >= 1")
        _check(0 <= self.cmn_min_window <= self.cmn_window, f"{key}.cmn_min_window",
               "must be in [0, features.cmn_window]")
        _check(self.stack >= 1, f"{key}.stack", "must be >= 1")
        _check(self.subsample >= 1, f"{key}.subsample", "must be >= 1")
        _check(self.storage_dtype in ("float16", "uint8"), f"{key}.storage_dtype",
               "must be float16 or uint8")
        _check(self.duration_tolerance >= 0, f"{key}.duration_tolerance", "must be >= 0")
        _check(self.align_tolerance_s >= 0, f"{key}.align_tolerance_s", "must be >= 0")
        _check(self.fft_engine in ("auto", "torch", "scipy"), f"{key}.fft_engine",
               "must be auto, torch or scipy")
        _check(self.batch_seconds > 0, f"{key}.batch_seconds", "must be > 0")
        _check(self.io_threads >= 1, f"{key}.io_threads", "must be >= 1")


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
    k: int = 20
    # Per frame, keep only the fewest of the top-k whose teacher probability reaches this
    # share (1.0: all k, the paper's layout). A confident frame then stores 1-2 entries,
    # not k: amflow/records.py's `topk_len`, tasks/targets.kept_for_mass.
    mass: float = 1.0
    # How each entry is stored (amflow/records.py): fp16 = int16 index + fp16 logit (the
    # paper's layout); sqrt<L> = one-byte index (<= 256 classes) + one byte for the
    # probability, round(L * sqrt(p)): with mass 0.99 ~10x smaller than full fp16
    # posteriors at 67 classes (README, bench targets).
    codec: str = FP16_CODE
    zstd_level: int = 9  # of the target shards' Parquet; the sqrt codes gain from 19
    temperature: float = 1.0
    actors: int = 2
    threads_per_actor: int = 1
    batch_frames: int = 8000
    max_frames: int = 20000  # longer utterances are split into pieces of this size
    device: str = "auto"  # auto | cpu | cuda (resolved inside each actor)
    num_gpus_per_actor: float = -1.0  # -1: 1 when the cluster has GPUs and device allows
    # Half precision on GPU: true | false | auto (fp16 on GPUs before Ampere, where it is
    # faster; fp32 from Ampere on, where TF32 is: amflow/precision.py, bench/GPU.md).
    fp16: Any = "auto"
    fp16_on_cpu: bool = False  # run the fp16 GPU path on CPU (tests, debugging)
    # CPU actors: auto = bf16 when the CPU has native bf16 (AMX / AVX512-BF16), else fp32.
    cpu_precision: str = "auto"  # auto | fp32 | bf16
    fidelity_sample_frames: int = 20000

    def validate(self, key: str) -> None:
        _check(self.k >= 1, f"{key}.k", "must be >= 1")
        _check(0.0 < self.mass <= 1.0, f"{key}.mass", f"must be in (0, 1], got {self.mass}")
        _check(self.mass == 1.0 or self.k <= 255, f"{key}.k",
               f"must be <= 255 with {key}.mass < 1 (one byte counts each frame's entries)")
        _check(self.actors >= 1, f"{key}.actors", "must be >= 1")
        _check(isinstance(self.fp16, bool) or self.fp16 == "auto", f"{key}.fp16",
               f"must be true, false or auto, got {self.fp16!r}")
        _check(self.device in ("auto", "cpu", "cuda"), f"{key}.device", "must be auto, cpu or cuda")
        _check(self.cpu_precision in ("auto", "fp32", "bf16"), f"{key}.cpu_precision",
               "must be auto, fp32 or bf16")
        _check(self.temperature > 0, f"{key}.temperature", "must be > 0")
        if self.codec != FP16_CODE:
            try:
                sqrt_levels(self.codec)
            except ValueError:
                _check(False, f"{key}.codec",
                       f"must be fp16 or sqrt<L> with 2 <= L <= 255, got {self.codec!r}")
        _check(1 <= self.zstd_level <= 22, f"{key}.zstd_level", "must be in 1..22")


@dataclass
class RepartitionConfig:
    # Target partition duration; the count is rounded up to a multiple of train.workers.
    partition_hours: float = 0.05
    # Splits to partition; empty = every split the features step produced.
    splits: list[str] = field(default_factory=list)
    seed: int = 0
    # Shards shuffled together. A split with more feature shards is cut into shuffle
    # windows of about this many (shards drawn at random), each planned by its own task,
    # so the driver holds one line per shard and every shard feeds only its window's
    # partitions. 0 = one window per split (a global shuffle).
    window_shards: int = 64

    def validate(self, key: str) -> None:
        _check(self.partition_hours > 0, f"{key}.partition_hours", "must be > 0")
        _check(self.window_shards >= 0, f"{key}.window_shards", "must be >= 0")
        bad = [s for s in self.splits if s not in ("labeled", "unlabeled", "dev", "test")]
        _check(not bad, f"{key}.splits", f"must be among labeled, unlabeled, dev, test; got {bad}")


@dataclass
class StudentConfig:
    layers: int = 2
    hidden: int = 128
    lookahead: int = 3
    dropout: float = 0.0  # on the inputs, between layers and before the output layer

    def validate(self, key: str) -> None:
        _check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        _check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        _check(self.lookahead >= 0, f"{key}.lookahead", "must be >= 0")
        _check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class TeacherConfig:
    layers: int = 2
    hidden: int = 128
    dropout: float = 0.0

    def validate(self, key: str) -> None:
        _check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        _check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        _check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class ModelConfig:
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    # 0 = the run's phone inventory size; a larger number (e.g. 3183 senones) in config.
    num_classes: int = 0


@dataclass
class AugmentConfig:
    """On-the-fly far-field augmentation by the example servers (training/example_servers.py).

    Each epoch every labeled utterance's clean source (the corpus's `clean_audio_uri`, or
    its audio when the record says `clean: true`) is re-rendered: with `room_prob` in a
    random room of a random condition in `conditions` (tasks/speech/room.py: image-method
    RIR, babble/coloured/hum/fan/transient noise at the condition's SNR); otherwise with
    `noise_prob` plain additive noise of a random kind in `noises` at an SNR drawn from
    `snr_db`. Then with `speed_prob` a speed factor from `speeds` (labels stretched with
    it) and with `vtlp_prob` a VTLP warp factor from `vtlp` (mel filters warped).
    """
    enabled: bool = False
    # With `stored_prob` an utterance keeps the corpus's own rendering of it (its
    # `audio_uri`: the test conditions' renderer) and gets only speed and VTLP; the rest
    # are re-rendered from the clean source as below.
    stored_prob: float = 0.0
    room_prob: float = 0.7
    conditions: list[str] = field(default_factory=lambda: ["DP1", "DP2", "DP3", "DP4", "DP5"])
    noise_prob: float = 0.4
    noises: list[str] = field(default_factory=lambda: ["babble", "pink", "brown", "white",
                                                       "fan", "hum", "clatter"])
    snr_db: list[float] = field(default_factory=lambda: [5.0, 30.0])
    speed_prob: float = 0.5
    speeds: list[float] = field(default_factory=lambda: [0.9, 1.1])
    vtlp_prob: float = 0.5
    vtlp: list[float] = field(default_factory=lambda: [0.9, 1.1])  # warp factor range
    # The pool: `servers` Ray CPU actors per trainer, each `cpus_per_server` CPUs and the
    # custom `resources` (e.g. {pool_c4: 0.01}: the C4 pool on the cluster). 0 servers:
    # render in the trainer's own loader thread (tests, tiny runs).
    servers: int = 2
    cpus_per_server: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)
    # A task renders one speaker stream of up to `stream_utts` utterances in time order
    # (the causal CMN runs over it, as in the features step); chunks are shuffled within
    # windows of `window_streams` streams; at most `inflight` streams per server are
    # rendered ahead of the trainer (with train.prefetch minibatches: bounded memory).
    stream_utts: int = 8
    window_streams: int = 16
    inflight: int = 2

    def validate(self, key: str) -> None:
        conditions = ("DP1", "DP2", "DP3", "DP4", "DP5")  # tasks.speech.room.CONDITIONS
        for name in ("stored_prob", "room_prob", "noise_prob", "speed_prob", "vtlp_prob"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"{key}.{name}", "must be in [0, 1]")
        bad = [c for c in self.conditions if c not in conditions]
        _check(bool(self.conditions) and not bad, f"{key}.conditions",
               f"must be a non-empty list of {', '.join(conditions)} (got {bad or 'none'})")
        kinds = ("babble", "pink", "brown", "white", "fan", "hum", "clatter")
        bad = [n for n in self.noises if n not in kinds]
        _check(bool(self.noises) and not bad, f"{key}.noises",
               f"must be a non-empty list of {', '.join(kinds)} (got {bad or 'none'})")
        _check(len(self.snr_db) == 2 and self.snr_db[0] <= self.snr_db[1], f"{key}.snr_db",
               "must be [low, high] dB")
        _check(bool(self.speeds) and all(0.5 <= v <= 2.0 for v in self.speeds),
               f"{key}.speeds", "must be a non-empty list of factors in [0.5, 2]")
        _check(len(self.vtlp) == 2 and 0.7 <= self.vtlp[0] <= self.vtlp[1] <= 1.3,
               f"{key}.vtlp", "must be [low, high] within [0.7, 1.3]")
        _check(self.servers >= 0, f"{key}.servers", "must be >= 0")
        _check(self.cpus_per_server > 0, f"{key}.cpus_per_server", "must be > 0")
        _check(self.stream_utts >= 1, f"{key}.stream_utts", "must be >= 1")
        _check(self.window_streams >= 1, f"{key}.window_streams", "must be >= 1")
        _check(self.inflight >= 1, f"{key}.inflight", "must be >= 1")


# The sequence stage's defaults: sMBR over whole utterances (the full graph), 3 epochs
# (the paper's), at rates below the end of CE training.
# Sequence training reads the stored rendering: a teacher recipe's example servers are off.
SEQUENCE_RECIPE = {"criterion": "smbr", "epochs": 3, "finetune_epochs": 3, "lr": 1.0e-4,
                   "final_lr": 3.0e-5, "augment": {"enabled": False}}

# train.grow's second stage: the phone-class model grown into the leaves trains on this
# long (epochs: the labeled recipe's; unlabeled_passes: the ssl recipe's), at these rates,
# with the phone term (training/grow.py). The settings of the grown models measured with
# train.init_model (alignment/README.md: 10 epochs or one unlabeled pass at 0.001, w = 3).
GROW_RECIPE = {"epochs": 10, "unlabeled_passes": 1, "lr": 1.0e-3, "phone_weight": 3.0}

# `train.*` is split into typed sections below, but the sections are internal: users keep
# writing the flat keys (`train.lr`, `train.gtc_tau`, ...) in YAML, `--set`, the DAGs and
# the recipes (`train.teacher_recipe: {lr: ...}`), and every error names that flat key.
# One spelling per setting keeps the contract (configs, scripts, README, checkpoints'
# fingerprints) unchanged and recipes unambiguous; code reads `tc.optim.lr`. Each section's
# field names are the flat keys themselves, so the flat key -> section table (TRAIN_KEYS,
# built from the sections) is the only mapping.


@dataclass
class OptimConfig:
    """train.*: the local optimizer and the learning-rate schedule (training/schedules.py)."""

    lr: float = 1.0e-3
    final_lr: float = 1.0e-4
    labeled_lr_scale: float = 1.5
    optimizer: str = "adam"  # adam | sgd
    momentum: float = 0.9
    schedule: str = "exponential"  # exponential | newbob
    newbob_threshold: float = 0.005
    min_lr: float = 1.0e-5
    # Gradual warm-up (Goyal et al. 2017), for the large rates of many workers: over the
    # first `lr_warmup_units` units (passes, or ssl sub-epochs) the rate ramps linearly
    # from lr_warmup_start x the scheduled rate to the scheduled rate (0 units = off).
    lr_warmup_units: float = 0.0
    lr_warmup_start: float = 0.1
    max_change: float = 0.0  # 0 = off; Kaldi-style per-minibatch parameter change cap
    clip_grad_norm: float = 5.0

    def validate(self, key: str) -> None:
        _check(self.lr > 0, f"{key}.lr", "must be > 0")
        _check(self.optimizer in ("adam", "sgd"), f"{key}.optimizer", "must be adam or sgd")
        _check(self.schedule in ("exponential", "newbob"), f"{key}.schedule",
               "must be exponential or newbob")
        _check(self.final_lr > 0 and self.min_lr > 0, f"{key}.final_lr",
               "final_lr and min_lr must be > 0")
        _check(self.lr_warmup_units >= 0, f"{key}.lr_warmup_units", "must be >= 0")
        _check(0 < self.lr_warmup_start <= 1, f"{key}.lr_warmup_start", "must be in (0, 1]")


@dataclass
class PassesConfig:
    """train.*: how many passes over which data (training/schedules.py plan_passes)."""

    epochs: int = 6
    finetune_epochs: int = 1
    sub_epochs: int = 4
    unlabeled_passes: int = 1  # ssl: passes over the unlabeled data (the paper: 1)
    # SortaGrad (DeepSpeech2): the first epoch's minibatches in increasing utterance length.
    sortagrad: bool = False

    def validate(self, key: str) -> None:
        _check(self.epochs >= 1, f"{key}.epochs", "must be >= 1")
        _check(self.unlabeled_passes >= 1, f"{key}.unlabeled_passes", "must be >= 1")
        _check(self.finetune_epochs >= 0, f"{key}.finetune_epochs", "must be >= 0")
        _check(self.sub_epochs >= 1, f"{key}.sub_epochs", "must be >= 1")


@dataclass
class BatchesConfig:
    """train.*: the data a worker reads and how it is cut into minibatches (training/data.py)."""

    chunk_frames: int = 32
    minibatch_frames: int = 2048
    prefetch: int = 4
    labeled_split: str = "labeled"
    unlabeled_split: str = "unlabeled"
    dev_split: str = "dev"  # scored after every epoch / sub-epoch when it exists
    # Chunked BPTT: frames fed before / after each chunk but not scored.
    # right context -1 = the student's look-ahead (teacher: the left context).
    chunk_left_context: int = 8
    chunk_right_context: int = -1
    shuffle_partitions: int = 4  # partitions pooled before chunks are shuffled

    def validate(self, key: str) -> None:
        _check(self.chunk_frames >= 1, f"{key}.chunk_frames", "must be >= 1")
        _check(self.minibatch_frames >= self.chunk_frames, f"{key}.minibatch_frames",
               "must be >= train.chunk_frames")
        _check(self.chunk_left_context >= 0, f"{key}.chunk_left_context", "must be >= 0")
        _check(self.chunk_right_context >= -1, f"{key}.chunk_right_context", "must be >= -1")
        _check(self.shuffle_partitions >= 1, f"{key}.shuffle_partitions", "must be >= 1")
        _check(self.prefetch >= 1, f"{key}.prefetch", "must be >= 1")


@dataclass
class DistillConfig:
    """train.*: distillation from the teacher's top-k soft targets (training/losses.py)."""

    temperature: float = 1.0
    topk_fill: float = -1.0e4

    def validate(self, key: str) -> None:
        _check(self.temperature > 0, f"{key}.temperature", "must be > 0")


@dataclass
class MaskingConfig:
    """train.*: SpecAugment-style masking of training minibatches (0 masks = off): per
    sequence, `freq_masks` bands of up to `freq_mask_bins` mel bins (the same bins in every
    stacked frame) and `time_masks` spans of up to `time_mask_rows` rows are zeroed."""

    freq_masks: int = 0
    freq_mask_bins: int = 8
    time_masks: int = 0
    time_mask_rows: int = 3

    def validate(self, key: str) -> None:
        _check(min(self.freq_masks, self.freq_mask_bins, self.time_masks,
                   self.time_mask_rows) >= 0, f"{key}.freq_masks", "masking knobs must be >= 0")


@dataclass
class AlgoConfig:
    """train.*: the distributed algorithms' knobs (training/algorithms/)."""

    # GTC threshold in gradient units; 0 = per tensor, gtc_tau_scale x its mean |first
    # gradient|, which bounds the sent fraction by 1/gtc_tau_scale (algorithms/gtc.py).
    gtc_tau: float = 0.0
    gtc_tau_scale: float = 100.0
    # Minibatches over which tau ramps up geometrically from tau/gtc_tau_scale (0 = off).
    gtc_warmup: int = 0
    # Keep the momentum on each worker before compression (deep-gradient-compression
    # momentum correction, algorithms/gtc.py); needs optimizer sgd.
    gtc_momentum_correction: bool = False
    block_size: int = 50
    block_lr: float = 1.0  # zeta
    block_momentum: float = -1.0  # eta; < 0 = derive from zeta/(N(1-eta)) = C
    bmuf_c: float = 1.0
    # Zero the local SGD momentum after every block update (BMUF, HTM), as CNTK does.
    block_reset_momentum: bool = True
    group_size: int = 2
    # HTM's lower-tier (in-group, intra-host) GTC tau scale: the paper uses tau 2 inside
    # the groups against 8 for plain GTC, i.e. 4x denser where bandwidth is cheap.
    htm_tau_scale: float = 25.0
    ma_samples: int = 20000  # frames between averages (Kaldi's K)
    # Kaldi's online natural-gradient preconditioning inside ma (NG-SGD,
    # training/natural_gradient.py): students only; alpha smooths the Fisher factors.
    natural_gradient: bool = False
    ng_alpha: float = 4.0

    def validate(self, key: str) -> None:
        _check(self.group_size >= 1, f"{key}.group_size", "must be >= 1")
        _check(self.block_size >= 1, f"{key}.block_size", "must be >= 1")
        _check(self.ng_alpha > 0, f"{key}.ng_alpha", "must be > 0")


@dataclass
class SequenceConfig:
    """train.*: the training criterion. ce (cross-entropy on labels, distillation on soft
    targets), mmi (lattice-free MMI) or smbr (lattice-free sMBR): training/sequence.py, a
    phone n-gram denominator graph and a batched forward-backward, for sequence training on
    labeled data after CE."""

    criterion: str = "ce"
    # mmi, smbr: the numerator is the fixed frame alignment, or its phone sequence with
    # flexible timing (every segmentation of the aligned phones).
    sequence_numerator: str = "alignment"
    # LF-MMI's regularisers (Povey et al. 2016, sec. 2.6): CE interpolation weight and
    # the output L2 (0.5 * l2 * |logits|^2 per frame; Kaldi chain recipes use 5e-5).
    sequence_ce_weight: float = 0.1
    sequence_l2: float = 5.0e-5
    # Leaky HMM (LF-MMI sec. 2.5): per-frame probability of jumping to any state.
    leaky_hmm: float = 0.1
    # x = am_scale * (logits - prior_scale * log class priors); LF-MMI uses 1 and 0.
    sequence_am_scale: float = 1.0
    sequence_prior_scale: float = 0.0
    # Denominator phone n-gram: order (2..4) and the count below which a history of the
    # full length is pruned (it backs off to the shorter one).
    den_ngram_order: int = 2
    den_min_count: int = 2

    def validate(self, key: str) -> None:
        _check(self.criterion in ("ce", "mmi", "smbr"), f"{key}.criterion",
               "must be ce, mmi or smbr")
        _check(self.sequence_numerator in ("alignment", "flexible"),
               f"{key}.sequence_numerator", "must be alignment or flexible")
        _check(self.sequence_ce_weight >= 0, f"{key}.sequence_ce_weight", "must be >= 0")
        _check(self.sequence_l2 >= 0, f"{key}.sequence_l2", "must be >= 0")
        _check(0 <= self.leaky_hmm < 1, f"{key}.leaky_hmm", "must be in [0, 1)")
        _check(self.sequence_am_scale > 0, f"{key}.sequence_am_scale", "must be > 0")
        _check(self.sequence_prior_scale >= 0, f"{key}.sequence_prior_scale", "must be >= 0")
        _check(2 <= self.den_ngram_order <= 4, f"{key}.den_ngram_order", "must be 2, 3 or 4")
        _check(self.den_min_count >= 1, f"{key}.den_min_count", "must be >= 1")


@dataclass
class CheckpointsConfig:
    """train.*: checkpoints, metric records and fault injection (training/loop.py)."""

    checkpoint_every: int = 200  # minibatches
    log_every: int = 10  # minibatches per metrics.jsonl record
    keep_checkpoints: int = 2
    fail_after: int = 0  # fault injection: die once after this many minibatches (0 = off)

    def validate(self, key: str) -> None:
        _check(self.checkpoint_every >= 1, f"{key}.checkpoint_every", "must be >= 1")
        _check(self.log_every >= 1, f"{key}.log_every", "must be >= 1")
        _check(self.keep_checkpoints >= 1, f"{key}.keep_checkpoints", "must be >= 1")


# TrainConfig's sections: attribute name -> class. A flat key `train.<k>` lives in the
# section whose class has a field <k> (TRAIN_KEYS); the others are TrainConfig's own.
TRAIN_SECTIONS: dict[str, type] = {
    "optim": OptimConfig, "passes": PassesConfig, "batches": BatchesConfig,
    "distill": DistillConfig, "masking": MaskingConfig, "algo": AlgoConfig,
    "sequence": SequenceConfig, "checkpoints": CheckpointsConfig}


@dataclass
class TrainConfig:
    """`train.*`, the user's flat keys grouped into typed sections (see TRAIN_KEYS)."""

    model: str = "student"  # teacher | student
    # labeled: CE on hard labels; ssl: scheduled learning over unlabeled soft targets;
    # sequence: a sequence criterion (train.criterion mmi | smbr) on the labeled split,
    # starting from a CE / distilled model (train.init_model), the petabyte recipe's last
    # stage (`amflow sequence`; output dir sequence[-<tag>]).
    recipe: str = "labeled"
    algorithm: str = "sgd"  # sgd | gtc | bmuf | htm | ma
    workers: int = 1
    seed: int = 0
    # Output dir `train` (empty tag) or `train-<tag>`, so several trainings share a run.
    tag: str = ""
    threads: int = 0  # torch threads per worker; 0 = torch's default
    use_gpu: bool = False
    # The model a sequence recipe starts from; empty = this run's train[-<tag>]/model.pt.
    # Set for the labeled / ssl recipes: training starts from it; a phone-class model is
    # grown into this run's context-dependent leaves (training/grow.py), else the classes
    # must be this run's.
    init_model: str = ""
    # With context-dependent classes: + phone_weight x the same criterion on each frame's
    # phone (the classes' probabilities summed per phone; training/losses.py phone_loss).
    # The logged train loss includes the term; the dev loss is the classes' CE alone.
    phone_weight: float = 0.0
    # Grow inside this training (labeled and ssl recipes, context-dependent classes): first
    # the recipe as configured on each label's phone and the targets summed per phone (a
    # phone-class model, in train[-<tag>]/phones/), then that model grown into this run's
    # leaves trains on with train.grow_recipe's values: one `amflow train` does what
    # train.init_model does with a phone-class run's model (training/launch.py
    # train_grown). A train.init_model is started from instead (grown if it has a class
    # per phone); the sequence recipe starts from the grown model as from any other.
    grow: bool = False
    # train.* values of the grown stage (train.grow), over the recipe's own.
    grow_recipe: dict[str, Any] = field(default_factory=lambda: dict(GROW_RECIPE))
    # Example servers: labeled utterances re-rendered every epoch (off: the stored rendering).
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # train.* values used instead when train.model is teacher (see _apply_recipes); its
    # grow_recipe, a mapping, goes over train.grow_recipe's values for the teacher's
    # grown stage.
    teacher_recipe: dict[str, Any] = field(default_factory=dict)
    # train.* values used instead when train.recipe is sequence (after teacher_recipe's).
    sequence_recipe: dict[str, Any] = field(default_factory=lambda: dict(SEQUENCE_RECIPE))
    optim: OptimConfig = field(default_factory=OptimConfig)
    passes: PassesConfig = field(default_factory=PassesConfig)
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)

    @classmethod
    def from_flat(cls, **flat: Any) -> "TrainConfig":
        """A TrainConfig from flat `train.*` keys (unchecked, like a dataclass constructor:
        tests and benchmarks build one this way; `load_config` coerces and validates)."""
        return replace_train(cls(), **flat)

    def to_flat(self) -> dict[str, Any]:
        """The user-facing `train.*` mapping: flat keys (augment a nested mapping), in the
        order the keys were declared before the sections existed (checkpoint fingerprints
        compare this form, so checkpoints of earlier versions still resume)."""
        return {k: _plain(getattr(self._holder(k), k)) for k in TRAIN_KEY_ORDER}

    def _holder(self, key: str) -> Any:
        section = TRAIN_KEYS[key]
        return getattr(self, section) if section else self

    def validate(self, key: str) -> None:
        _check(self.model in ("teacher", "student"), f"{key}.model", "must be teacher or student")
        _check(self.recipe in ("labeled", "ssl", "sequence"), f"{key}.recipe",
               "must be labeled, ssl or sequence")
        _check(self.algorithm in ("sgd", "gtc", "bmuf", "htm", "ma"), f"{key}.algorithm",
               "must be one of sgd, gtc, bmuf, htm, ma")
        _check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        for name in TRAIN_SECTIONS:
            getattr(self, name).validate(key)
        ng = self.algo.natural_gradient
        _check(not ng or self.algorithm == "ma", f"{key}.natural_gradient",
               f"is applied by the ma trainer only (train.algorithm is {self.algorithm})")
        _check(not ng or self.model == "student",
               f"{key}.natural_gradient", "needs the unidirectional student (train.model)")
        _check("/" not in self.tag, f"{key}.tag", "must not contain '/'")
        _check(self.phone_weight >= 0, f"{key}.phone_weight", "must be >= 0")
        _check(self.phone_weight == 0 or self.recipe != "sequence", f"{key}.phone_weight",
               "applies to the ce recipes (labeled, ssl); the sequence recipe's criterion "
               "takes none: 0 there (a config file that sets it: add phone_weight: 0 to "
               "train.sequence_recipe)")
        _check(not self.augment.enabled or self.recipe == "labeled", f"{key}.augment.enabled",
               "augments the labeled recipes (teacher, baseline student); train.recipe is "
               f"{self.recipe}")
        # A sequence criterion needs hard labels and a trained model to start from: the
        # sequence recipe gives both; ce there would be a CE fine-tune under another name.
        criterion = self.sequence.criterion
        _check((criterion == "ce") == (self.recipe != "sequence"), f"{key}.criterion",
               f"is {criterion} with train.recipe={self.recipe}: the sequence recipe "
               "takes mmi or smbr, the labeled and ssl recipes take ce")


def _section_keys() -> dict[str, str]:
    keys = {f.name: "" for f in dataclasses.fields(TrainConfig) if f.name not in TRAIN_SECTIONS}
    for section, cls in TRAIN_SECTIONS.items():
        keys.update({f.name: section for f in dataclasses.fields(cls)})
    return keys


# Flat key `train.<k>` -> the TrainConfig section holding it ("" = TrainConfig itself).
TRAIN_KEYS: dict[str, str] = _section_keys()

# The flat keys in the order TrainConfig declared them when it was one flat class.
TRAIN_KEY_ORDER: tuple[str, ...] = (
    "model", "recipe", "algorithm", "workers", "epochs", "finetune_epochs", "lr", "final_lr",
    "labeled_lr_scale", "optimizer", "momentum", "schedule", "newbob_threshold", "min_lr",
    "lr_warmup_units", "lr_warmup_start", "sub_epochs", "unlabeled_passes", "chunk_frames",
    "minibatch_frames", "max_change", "clip_grad_norm", "temperature", "topk_fill",
    "checkpoint_every", "seed", "prefetch", "tag", "labeled_split", "unlabeled_split",
    "dev_split", "chunk_left_context", "chunk_right_context", "shuffle_partitions",
    "log_every", "keep_checkpoints", "threads", "fail_after", "freq_masks", "freq_mask_bins",
    "time_masks", "time_mask_rows", "augment", "sortagrad", "gtc_tau", "gtc_tau_scale",
    "gtc_warmup", "gtc_momentum_correction", "block_size", "block_lr", "block_momentum",
    "bmuf_c", "block_reset_momentum", "group_size", "htm_tau_scale", "ma_samples",
    "natural_gradient", "ng_alpha", "use_gpu", "criterion", "sequence_numerator",
    "sequence_ce_weight", "sequence_l2", "leaky_hmm", "sequence_am_scale",
    "sequence_prior_scale", "den_ngram_order", "den_min_count", "teacher_recipe",
    "sequence_recipe", "init_model", "phone_weight", "grow", "grow_recipe")
assert set(TRAIN_KEY_ORDER) == set(TRAIN_KEYS) and len(TRAIN_KEY_ORDER) == len(TRAIN_KEYS)


def train_key_type(key: str) -> Any:
    """The type of flat key `train.<key>` (its section field's annotation)."""
    section = TRAIN_KEYS[key]
    return typing.get_type_hints(TRAIN_SECTIONS[section] if section else TrainConfig)[key]


def replace_train(tc: TrainConfig, **flat: Any) -> TrainConfig:
    """A copy of `tc` with flat `train.*` keys replaced (dataclasses.replace for the
    user's keys), sections copied so `tc` is left as it was."""
    unknown = sorted(set(flat) - set(TRAIN_KEYS))
    if unknown:
        raise ConfigError(f"train.{unknown[0]}", "unknown key")
    by_section: dict[str, dict[str, Any]] = {}
    for k, v in flat.items():
        by_section.setdefault(TRAIN_KEYS[k], {})[k] = v
    top = by_section.pop("", {})
    sections = {s: dataclasses.replace(getattr(tc, s), **kw) for s, kw in by_section.items()}
    return dataclasses.replace(tc, **top, **sections)


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


@dataclass
class EvaluateConfig:
    baseline: str = ""  # optional model URI to compare against
    # Output dir `evaluate` (empty tag) or `evaluate-<tag>`; the default --model is then
    # this run's `train[-<tag>]/model.pt`.
    tag: str = ""
    batch_frames: int = 20000
    # Which rendering to score: stored (the record's audio_uri) or clean (its dry,
    # close-talk `clean_audio_uri`, condition "dry"; records without one are rejects).
    audio: str = "stored"

    def validate(self, key: str) -> None:
        _check(self.audio in ("stored", "clean"), f"{key}.audio", "must be stored or clean")


@dataclass
class LmConfig:
    """`amflow lm`: a word n-gram with interpolated Kneser-Ney smoothing (decoding/lm.py)."""

    order: int = 3
    # The embedded default trains on sentences drawn from the corpus text generator with
    # a seed no audio uses (never on dev/test transcripts).
    sentences: int = 100_000
    seed: int = 20261123
    # Also estimate from this corpus split's transcripts (e.g. labeled); empty = none.
    text_split: str = ""
    # Highest-order n-grams seen fewer times are pruned (their mass backs off): a 3-gram
    # of 100k generator sentences has 356k trigrams, 2/3 of them seen once; cut at 2 the
    # decoding graph is ~3x smaller at a small perplexity cost (see the lm step's metrics).
    min_count: int = 2

    def validate(self, key: str) -> None:
        _check(1 <= self.order <= 5, f"{key}.order", "must be in [1, 5]")
        _check(self.min_count >= 1, f"{key}.min_count", "must be >= 1")
        _check(self.sentences >= 0, f"{key}.sentences", "must be >= 0")
        _check(self.text_split in ("", "labeled", "unlabeled"), f"{key}.text_split",
               "must be empty, labeled or unlabeled (never dev or test)")
        _check(self.sentences > 0 or bool(self.text_split), f"{key}.sentences",
               "must be > 0 when lm.text_split is empty (no text to estimate from)")


@dataclass
class DecodeConfig:
    """`amflow decode`: WFST decoding to words and WER (decoding/decode.py)."""

    # ARPA LM URI; empty = this run's `amflow lm` output (built first when missing).
    lm: str = ""
    # Output dir `decode` (empty tag) or `decode-<tag>`; default --model as for evaluate.
    tag: str = ""
    # Acoustic scales tried on the tuning split (the LM weight is its inverse); the best
    # one is applied to the scored split.
    acwt: list[float] = field(default_factory=lambda: [0.2, 0.3, 0.4, 0.5, 0.7])
    tune_split: str = "dev"  # empty = no tuning: decode.acwt's first value
    # In graph-cost units (LM plus acwt-scaled acoustic costs). On the demo's baseline at
    # acwt 0.3 (dev): beam 13 WER 28.3 % at 27x real time per core, 10: 28.9 % at 71x,
    # 8 (max_active 1000): 29.7 % at 154x; `amflow bench decode` prints 10 beside 8.
    beam: float = 10.0
    max_active: int = 2000
    sil_prob: float = 0.5
    # Ray actors that featurise, run the model and search (each one CPU).
    workers: int = 2
    batch_frames: int = 20000

    def validate(self, key: str) -> None:
        _check(bool(self.acwt) and all(a > 0 for a in self.acwt), f"{key}.acwt",
               "must be a non-empty list of scales > 0")
        _check(self.tune_split in ("", "dev", "labeled"), f"{key}.tune_split",
               "must be empty, dev or labeled (never test)")
        _check(self.beam > 0, f"{key}.beam", "must be > 0")
        _check(self.max_active >= 10, f"{key}.max_active", "must be >= 10")
        _check(0 < self.sil_prob < 1, f"{key}.sil_prob", "must be in (0, 1)")
        _check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        _check("/" not in self.tag, f"{key}.tag", "must not contain '/'")


@dataclass
class ServeConfig:
    """`amflow serve`: the streaming recognizer on Ray Serve (serving/)."""

    host: str = "127.0.0.1"
    port: int = 8000
    app_name: str = "amflow-serve"
    # haproxy: Ray Serve's HAProxy ingress with direct ingress to the replicas (WebSocket
    # frames go client -> HAProxy -> replica; its RAY_SERVE_ENABLE_DIRECT_INGRESS and
    # RAY_SERVE_ENABLE_HA_PROXY must be set where Ray starts: `amflow serve` sets them
    # for the local Ray it starts; a cluster sets them on its nodes). proxy: the default
    # Python proxy actor, which relays every frame over a Ray call (~2x the CPU per stream).
    ingress: str = "haproxy"
    # Replicas of the recognizer deployment, and what each one asks Ray for: on the
    # cluster, GPU replicas on the P3 pool (num_gpus 1, resources {pool_p3: 0.01}).
    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    # Streams one replica admits; one more is refused with close code 1013 (try again).
    max_streams: int = 100
    max_chunk_bytes: int = 64000  # one binary message (2 s of 16 kHz s16le); more: 1009
    # Batch Dispatch: at most this many streams per forward, rows per stream per forward.
    max_batch: int = 128
    max_rows: int = 32
    # How long rows of partial hypotheses may wait for other streams' rows before a
    # forward (an utterance's end never waits); 0: DeepSpeech2's eager dispatch. On a
    # CPU a forward of 1 stream costs about what one of 8 does (serving/dispatch.py).
    max_wait_ms: float = 50.0
    search_threads: int = 1
    # Model precision: auto = fp16 on GPUs before Ampere, else fp32 (amflow/precision.py);
    # fp16 | bf16 | fp32.
    dtype: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 1  # torch threads per replica
    # Search settings; 0 = the decode step's (decode.beam, decode.max_active), so the
    # streamed words are the offline decode's. acwt 0 = the one `amflow decode` tuned for
    # this model (its result.json), else decode.acwt[0].
    acwt: float = 0.0
    beam: float = 0.0
    max_active: int = 0
    # A client that sends nothing for this long is closed (1001).
    idle_timeout_s: float = 30.0

    def validate(self, key: str) -> None:
        _check(1 <= self.port <= 65535, f"{key}.port", "must be in [1, 65535]")
        _check(self.replicas >= 1, f"{key}.replicas", "must be >= 1")
        _check(self.ingress in ("haproxy", "proxy"), f"{key}.ingress", "must be haproxy or proxy")
        _check(self.num_cpus >= 0 and self.num_gpus >= 0, f"{key}.num_gpus",
               "num_cpus and num_gpus must be >= 0")
        _check(self.max_streams >= 1, f"{key}.max_streams", "must be >= 1")
        _check(self.max_chunk_bytes >= 2, f"{key}.max_chunk_bytes", "must be >= 2")
        _check(self.max_batch >= 1, f"{key}.max_batch", "must be >= 1")
        _check(self.max_rows >= 1, f"{key}.max_rows", "must be >= 1")
        _check(self.max_wait_ms >= 0, f"{key}.max_wait_ms", "must be >= 0")
        _check(self.search_threads >= 1, f"{key}.search_threads", "must be >= 1")
        _check(self.dtype in ("auto", "fp32", "fp16", "bf16"), f"{key}.dtype",
               "must be auto, fp32, fp16 or bf16")
        _check(self.device in ("auto", "cpu", "cuda"), f"{key}.device", "must be auto, cpu or cuda")
        _check(self.threads >= 1, f"{key}.threads", "must be >= 1")
        _check(self.acwt >= 0 and self.beam >= 0 and self.max_active >= 0, f"{key}.acwt",
               "acwt, beam and max_active must be >= 0 (0: the decode step's)")
        _check(self.idle_timeout_s > 0, f"{key}.idle_timeout_s", "must be > 0")


@dataclass
class SimulateConfig:
    """`amflow simulate`: the throughput projection (cost models in training/simulate.py)."""

    workers: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    gpus_per_host: int = 8
    intra_host_gbps: float = 300.0
    inter_host_gbps: float = 25.0
    params: int = 24_000_000
    minibatch_frames: int = 2048
    # 0 = the V100 time per minibatch implied by the HTM paper's 1-GPU baseline
    # (first epoch of 2000 h at 33.3 frames/s in 290 min), scaled to minibatch_frames.
    compute_s_per_minibatch: float = 0.0
    # Per-message latency of one ring hop between hosts (TCP), microseconds.
    latency_us: float = 25.0
    # GPU memory bandwidth, for the GTC encode (passes over the gradient) and decode.
    hbm_gbps: float = 900.0
    # > 0: GTC's encode + decode run at this many GB/s of gradient instead (a codec off
    # the GPU's memory path, e.g. `bench gtc`'s one-core CPU rate); 0 = the HBM model.
    codec_gbps: float = 0.0
    # Coefficient of variation of one worker's time per minibatch (straggler wait at
    # every synchronisation); < 0 = the value measured by `amflow bench trainers`.
    jitter_cv: float = 0.0
    # Fraction of gradient elements GTC sends per minibatch; < 0 = measured.
    gtc_sent_fraction: float = -1.0
    htm_sent_fraction: float = -1.0
    block_size: int = 50
    group_size: int = 8
    ma_samples: int = 400_000

    def validate(self, key: str) -> None:
        _check(self.gpus_per_host >= 1, f"{key}.gpus_per_host", "must be >= 1")
        _check(bool(self.workers) and all(w >= 1 for w in self.workers), f"{key}.workers",
               "must be a non-empty list of worker counts >= 1")
        _check(self.intra_host_gbps > 0 and self.inter_host_gbps > 0, f"{key}.inter_host_gbps",
               "bandwidths must be > 0")
        _check(self.params >= 1, f"{key}.params", "must be >= 1")
        _check(self.minibatch_frames >= 1, f"{key}.minibatch_frames", "must be >= 1")
        _check(self.compute_s_per_minibatch >= 0, f"{key}.compute_s_per_minibatch",
               "must be >= 0")
        _check(self.block_size >= 1, f"{key}.block_size", "must be >= 1")
        _check(self.group_size >= 1, f"{key}.group_size", "must be >= 1")
        _check(self.codec_gbps >= 0, f"{key}.codec_gbps", "must be >= 0")
        _check(self.gtc_sent_fraction <= 1 and self.htm_sent_fraction <= 1,
               f"{key}.gtc_sent_fraction", "must be <= 1")


@dataclass
class RunnerConfig:
    """Where Airflow runs a step: a local subprocess, a container or a Ray job on a cluster."""

    mode: str = "local"  # local | container | ray_job
    ray_dashboard: str = "http://127.0.0.1:8265"
    # How an Airflow task waits for its job. defer: hand the wait to Airflow's triggerer
    # (one try from submit to end, so the task's duration is the step's; no worker slot
    # or execution-API token held while waiting). reschedule: poke in short tries (for
    # an Airflow without a triggerer); the UI then shows only the last poke's duration.
    wait: str = "defer"
    # With wait=defer, follow the job this long in the task itself first: a step that ends
    # by then finishes without a deferral round trip (a second worker start and DAG parse).
    defer_after_s: float = 20.0
    poll_s: float = 5.0
    # One Airflow try waits at most this long (and at most half the execution-API token
    # lifetime) before handing over to the next poke (UP_FOR_RESCHEDULE, same try number).
    max_wait_per_try_s: float = 600.0
    # Pause between two tries of a step that still runs. Keep it above the executor's
    # event latency (a few scheduler loops): a poke that starts before the scheduler saw
    # the previous one end is taken for a stray success and failed by Airflow.
    reschedule_s: float = 30.0
    # The command that runs a step; the step name and its arguments are appended.
    command: list[str] = field(default_factory=lambda: ["amflow"])
    # Directory the step runs in. Empty: the project root for local steps; for Ray jobs the
    # job's own working directory (set it to the image's project dir, e.g. /app).
    workdir: str = ""
    # Where the runner keeps job state (pid, exit code, log, log cursor) on the Airflow side.
    # Empty: $AMFLOW_RUNNER_STATE, else $AIRFLOW_HOME/amflow_jobs, else ~/.cache/amflow/jobs.
    state_dir: str = ""
    # Give up (stop the job, fail the try) after this many seconds; 0 = no limit.
    step_timeout_s: float = 0.0
    # Extra environment variables for the step (a Ray job's runtime_env env_vars).
    env: dict[str, str] = field(default_factory=dict)
    # mode=container (amflow.jobs.container): the image a step runs in (empty: the CPU image
    # `make image` builds, localhost/amflow:<project version>), the engine's CLI (podman, or
    # docker: the same `run` flags), the container's network (empty: none when storage and
    # corpus are local paths, host when one is on S3) and extra `run` options. Without a
    # --shm-size among them /dev/shm gets half the host's memory (podman's default is 64 MB;
    # Ray puts its object store, 30 % of memory, there, else on the slower disk).
    image: str = ""
    container_engine: str = "podman"
    container_network: str = ""
    container_options: list[str] = field(default_factory=list)

    def validate(self, key: str) -> None:
        _check(self.mode in ("local", "container", "ray_job"), f"{key}.mode",
               "must be local, container or ray_job")
        _check(self.container_engine in ("podman", "docker"), f"{key}.container_engine",
               "must be podman or docker")
        _check(self.container_network in ("", "none", "host", "bridge", "slirp4netns"),
               f"{key}.container_network",
               "must be empty (auto), none, host, bridge or slirp4netns")
        _check(not self.image or " " not in self.image, f"{key}.image",
               f"must be an image reference without spaces, got {self.image!r}")
        _check(self.wait in ("defer", "reschedule"), f"{key}.wait", "must be defer or reschedule")
        _check(self.defer_after_s >= 0, f"{key}.defer_after_s", "must be >= 0")
        _check(self.poll_s > 0, f"{key}.poll_s", "must be > 0")
        _check(self.max_wait_per_try_s >= self.poll_s, f"{key}.max_wait_per_try_s",
               "must be >= runner.poll_s")
        _check(self.reschedule_s > 0, f"{key}.reschedule_s", "must be > 0")
        _check(bool(self.command), f"{key}.command", "must name an executable")
        _check(self.step_timeout_s >= 0, f"{key}.step_timeout_s", "must be >= 0")


@dataclass
class ReportConfig:
    """`amflow report`: which runs and evaluations the report compares."""

    teacher_run: str = ""  # run holding the teacher and the baseline; empty = this run
    teacher_eval: str = ""  # URIs; empty = the conventional places under the runs
    baseline_eval: str = ""
    ssl_eval: str = ""


@dataclass
class CostConfig:
    """On-demand USD/hour, for the infra cost estimate (python -m core.cost)."""

    p3_16xlarge: float = 24.48
    x1_32xlarge: float = 13.338
    c4_4xlarge: float = 0.796
    # How many measured CPU cores one GPU-pool vCPU is worth for GPU steps measured
    # without a GPU; 1.0 assumes no GPU speedup (an upper bound on cost).
    gpu_speedup: float = 1.0

    def validate(self, key: str) -> None:
        for name in ("p3_16xlarge", "x1_32xlarge", "c4_4xlarge"):
            _check(getattr(self, name) >= 0, f"{key}.{name}", "must be >= 0")
        _check(self.gpu_speedup > 0, f"{key}.gpu_speedup", "must be > 0")


@dataclass
class IngestConfig:
    """`amflow import` (keys `ingest.*`; `import` is a Python keyword): bring a Kaldi data
    directory or lhotse manifests into the input corpus format."""

    # Split of the records with a transcript; a record without one is unlabeled (with
    # dev/test, which need transcripts, it is an empty_text reject).
    split: str = "labeled"
    locale: str = "en-US"  # written to the metadata
    # Kaldi lexicon.txt URI: transcripts with a word not in it are oov_words rejects, and
    # it is copied to <out>/lexicon.txt (what `amflow decode` reads). Empty: no check.
    lexicon: str = ""
    # ISO 8601 time for every record; empty = the audio file's modification time. (Any:
    # YAML reads an unquoted timestamp as a datetime; validate() turns it into the string.)
    created_at: Any = ""
    condition: str = ""  # written as `condition` when set (e.g. the recording setup)
    # Base of relative audio paths; empty = the Kaldi data dir / the recordings
    # manifest's folder.
    audio_root: str = ""
    # Copy audio that is already 16 kHz mono 16-bit WAV/FLAC into <out>/audio/ too, so the
    # corpus stands alone; off = such files are referenced where they are (absolute URI).
    # Segments and audio in any other format are always written to <out>/audio/.
    copy_audio: bool = False
    workers: int = 4  # recordings read at once (threads: the work is mostly I/O on S3)

    def validate(self, key: str) -> None:
        import datetime as _dt

        _check(self.split in ("labeled", "unlabeled", "dev", "test"), f"{key}.split",
               f"must be labeled, unlabeled, dev or test, got {self.split!r}")
        _check(bool(self.locale.strip()), f"{key}.locale", "must be a non-empty locale")
        _check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        if isinstance(self.created_at, (_dt.date, _dt.datetime)):
            self.created_at = self.created_at.isoformat()
        _check(isinstance(self.created_at, str), f"{key}.created_at",
               f"must be an ISO 8601 time, got {self.created_at!r}")
        if self.created_at.strip():
            try:
                _dt.datetime.fromisoformat(self.created_at.strip())
            except ValueError:
                raise ConfigError(f"{key}.created_at",
                                  f"must be ISO 8601, got {self.created_at!r}") from None


@dataclass
class BenchConfig:
    """`amflow bench <what>` knobs (bench/*.py), set with `--set bench.<key>=...`."""

    # bench trainers: the worker counts and methods compared (`ma+ng` is ma with Kaldi's
    # natural gradient), passes per method (0 = the profile's train.epochs), 1-worker SGD
    # passes of the shared starting model, the learning-rate rule (tuned | sqrt | linear |
    # none), the profile (bench: the bench's own model/train settings; config: the
    # config's), the synthetic corpus length when the run has no data (seconds), keeping
    # the config's BMUF/HTM sync settings, and the bench corpus's hours and labeled share.
    workers: list[int] = field(default_factory=lambda: [4, 8])
    algos: list[str] = field(default_factory=lambda: ["sgd", "gtc", "bmuf", "htm", "ma"])
    epochs: int = 0
    pretrain: int = 3
    lr_rule: str = "tuned"
    profile: str = "bench"
    synth_seconds: float = 1800.0
    keep_sync: bool = False
    corpus_hours: float = 2.5
    labeled_share: float = 0.35
    # bench gtc: codec minibatches (the sent fraction settles after ~gtc_tau_scale of
    # them; the second half is counted), and minibatches of the overhead comparison
    # (0 = train.block_size + 10).
    gtc_steps: int = 160
    overhead_steps: int = 0
    # bench sequence: timed minibatches per criterion.
    seq_steps: int = 20
    # bench features: audio seconds featurised, and rounds.
    seconds: float = 1200.0
    repeats: int = 3

    def validate(self, key: str) -> None:
        _check(bool(self.workers) and all(w >= 1 for w in self.workers), f"{key}.workers",
               "must be a non-empty list of worker counts >= 1")
        _check(bool(self.algos), f"{key}.algos", "must name at least one method")
        _check(self.epochs >= 0, f"{key}.epochs", "must be >= 0 (0: the profile's train.epochs)")
        _check(self.pretrain >= 0, f"{key}.pretrain", "must be >= 0")
        _check(self.lr_rule in ("tuned", "sqrt", "linear", "none"), f"{key}.lr_rule",
               "must be one of tuned, sqrt, linear, none")
        _check(self.profile in ("bench", "config"), f"{key}.profile", "must be bench or config")
        _check(self.synth_seconds > 0, f"{key}.synth_seconds", "must be > 0")
        _check(self.corpus_hours > 0, f"{key}.corpus_hours", "must be > 0")
        _check(0 < self.labeled_share < 1, f"{key}.labeled_share", "must be in (0, 1)")
        _check(self.gtc_steps >= 2, f"{key}.gtc_steps", "must be >= 2")
        _check(self.overhead_steps >= 0, f"{key}.overhead_steps",
               "must be >= 0 (0: train.block_size + 10)")
        _check(self.seq_steps >= 1, f"{key}.seq_steps", "must be >= 1")
        _check(self.seconds > 0, f"{key}.seconds", "must be > 0")
        _check(self.repeats >= 1, f"{key}.repeats", "must be >= 1")


@dataclass
class AlignConfig:
    """`amflow align`: GMM-HMM forced alignment to senones (alignment/)."""

    # Corpus splits (of the select manifests) to align; they need transcripts.
    splits: list[str] = field(default_factory=lambda: ["labeled"])
    num_senones: int = 500          # decision-tree leaves of the context-dependent model
    # Leaves of the network's tree (one HMM state per phone, for the low-frame-rate network's
    # targets with features.labels=align); 0: num_senones.
    nn_senones: int = 0
    # The network's tree taken instead of grown: a model.pt whose card carries one, or an
    # nn_tree.json. "": the teacher's (targets.teacher) in a student's run, so that the
    # student's classes are the teacher's by construction; else grown from this alignment.
    network_tree: str = ""
    mono_iters: int = 25
    tri_iters: int = 15
    realign_every: int = 2          # realign before every n-th accumulation pass
    mono_gauss: int = 1000          # Gaussians in total, reached by mixing up
    tri_gauss: int = 4000
    beam: float = 10.0
    retry_beam: float = 40.0
    sil_prob: float = 0.5           # optional silence between words in the training graphs
    min_leaf_count: float = 50.0    # frames a tree leaf needs
    # Which rendering to align: stored (the record's audio_uri) or clean (its dry
    # `clean_audio_uri`, same length and timing: alignments of the dry rendering label the
    # stored far-field audio frame for frame; records without one are rejects). On the
    # embedded corpus reverberation costs ~25 points of frame accuracy (see alignment/).
    audio: str = "stored"
    # Unvoiced stops whose silent closure gets its own one-state phone (TIMIT's tcl/kcl/pcl);
    # the outputs give closure frames to the preceding phone, as espeak-ng's phone events
    # do. Empty: none.
    closure_stops: list[str] = field(default_factory=lambda: ["p", "t", "k"])
    # One closure phone shared by all of align.closure_stops (as TIMIT's 39-phone set folds
    # pcl/tcl/kcl) instead of one each: +2.6 points of boundaries within 20 ms on two
    # corpora (k and p had started ~25 ms early; alignment/README.md). false: one each.
    shared_closure: bool = True
    # Silence's likelihood times this when aligning (Kaldi's --boost-silence; 1: none).
    boost_silence: float = 1.0
    # The flat start's equal alignment gives an utterance's leading and trailing frames
    # more than this many dB below its loudest frame to silence and spreads the phones
    # over the rest (an utterance with no frame that quiet: Kaldi's plain equal alignment).
    # Plain equal alignment taught the phone models the first frames of silence: the
    # demo's last phones ended 35 ms after espeak-ng's (alignment/README.md). 0: off.
    flat_start_silence_db: float = 30.0
    # The monophone passes after the flat start's first accumulate Baum-Welch statistics
    # (every frame shared among the states by its forward-backward posterior, as HTK's
    # HERest trains a flat start) instead of one Viterbi alignment's, at this acoustic
    # scale (alignment/forward_backward.py); the passes after them realign as before.
    # Viterbi training from the equal alignment locks boundaries in early
    # (alignment/README.md). 0: Viterbi only (Kaldi's train_mono.sh). On the far-field
    # rendering 10 passes at 0.3 add 3-8 points of frames, on the dry one none: on in
    # configs/aws.yaml (stored recordings), off in configs/local.yaml's dry alignment.
    baum_welch_passes: int = 0
    baum_welch_scale: float = 1.0
    # The monophone stage trains on this many of the shortest utterances (Kaldi's recipes
    # train mono on `subset_data_dir.sh --shortest`: an equal alignment is least wrong on
    # few words, and the stage's passes then cost a fraction), and its model aligns every
    # utterance for the tree and the triphone stage. 0: all of them.
    mono_subset: int = 0
    # A third stage on LDA + MLLT features (Kaldi's train_lda_mllt.sh): static MFCCs spliced
    # over +-splice_context frames, projected to lda_dim (alignment/lda_mllt.py).
    lda_mllt: bool = False
    splice_context: int = 3
    lda_dim: int = 40
    # Speaker-adaptive training after the last GMM stage (Kaldi's train_sat.sh):
    # per-speaker fMLLR transforms (alignment/fmllr.py), a new tree and model on the
    # transformed features, the transforms re-estimated at the passes listed (those past
    # align.tri_iters never come: the first estimate, from the stage before, always does).
    sat: bool = False
    fmllr_iters: list[int] = field(default_factory=lambda: [2, 4, 8])
    fmllr_min_frames: float = 200.0  # a speaker with fewer speech frames keeps no transform
    # Rounds of realignment by a full-rate alignment network (alignment/nnet.py: an MLP on
    # +-nnet_context frames of the final features, trained on the current alignments,
    # nnet_epochs each; its scaled likelihoods replace the GMMs'); 0: off.
    nnet_rounds: int = 0
    nnet_context: int = 5
    nnet_epochs: int = 4
    nnet_acoustic_scale: float = 0.1
    # none: a flat start from the transcripts. ctm: train from the corpus's reference CTM
    # (<corpus>/alignments.ctm): every realignment while training keeps to its phones
    # (alignment/guide.py), the flat start included; each stage's final alignment and the
    # outputs are free. The stages' scores then bound what this model class can reach
    # against that CTM (`score_<stage>`: the model trained on it, aligning freely;
    # `score_<stage>_guided`: the path kept to it).
    guide: str = "none"
    # One Ray actor per select shard (Kaldi's JOBs); false: every shard in this process.
    use_ray: bool = True
    # Alignments taken from an earlier `amflow align` instead of trained again (as a Kaldi
    # recipe points a later stage at exp/tri*_ali): "teacher" (a student's run takes its
    # teacher run's, when that run aligned every utterance here with the same settings,
    # lexicon, corpus and network tree; else it trains, and its log says why), "never", or
    # the URI of an align output (runs/<R>/align), which must match.
    reuse: str = "teacher"

    def validate(self, key: str) -> None:
        _check(bool(self.reuse), f"{key}.reuse",
               "must be teacher, never or the URI of an align output (runs/<R>/align)")
        _check(bool(self.splits) and all(s in ("labeled", "unlabeled", "dev", "test")
                                         for s in self.splits), f"{key}.splits",
               "must be a non-empty list of labeled, unlabeled, dev, test")
        _check(self.num_senones >= 1, f"{key}.num_senones", "must be >= 1")
        _check(self.nn_senones >= 0, f"{key}.nn_senones", "must be >= 0 (0: align.num_senones)")
        _check(self.mono_iters >= 1, f"{key}.mono_iters", "must be >= 1")
        _check(self.tri_iters >= 1, f"{key}.tri_iters", "must be >= 1")
        _check(self.realign_every >= 1, f"{key}.realign_every", "must be >= 1")
        _check(self.mono_gauss >= 1, f"{key}.mono_gauss", "must be >= 1")
        _check(self.tri_gauss >= self.num_senones, f"{key}.tri_gauss",
               "must be >= align.num_senones (one Gaussian per senone at least)")
        _check(self.beam > 0, f"{key}.beam", "must be > 0")
        _check(self.retry_beam >= self.beam, f"{key}.retry_beam", "must be >= align.beam")
        _check(0 < self.sil_prob < 1, f"{key}.sil_prob", "must be in (0, 1)")
        _check(self.min_leaf_count > 0, f"{key}.min_leaf_count", "must be > 0")
        _check(self.audio in ("stored", "clean"), f"{key}.audio", "must be stored or clean")
        _check(0 <= self.splice_context <= 10, f"{key}.splice_context", "must be in [0, 10]")
        _check(1 <= self.lda_dim <= 13 * (2 * self.splice_context + 1), f"{key}.lda_dim",
               "must be in [1, 13 x (2 align.splice_context + 1)]")
        _check(all(i >= 0 for i in self.fmllr_iters), f"{key}.fmllr_iters",
               "must be pass numbers (>= 0) of the triphone rounds")
        _check(self.fmllr_min_frames > 0, f"{key}.fmllr_min_frames", "must be > 0")
        _check(self.nnet_rounds >= 0, f"{key}.nnet_rounds", "must be >= 0")
        _check(0 <= self.nnet_context <= 20, f"{key}.nnet_context", "must be in [0, 20]")
        _check(self.nnet_epochs >= 1, f"{key}.nnet_epochs", "must be >= 1")
        _check(self.nnet_acoustic_scale > 0, f"{key}.nnet_acoustic_scale", "must be > 0")
        _check(self.guide in ("none", "ctm"), f"{key}.guide", "must be none or ctm")
        _check(self.boost_silence > 0, f"{key}.boost_silence", "must be > 0")
        _check(self.flat_start_silence_db >= 0, f"{key}.flat_start_silence_db",
               "must be >= 0 (0: off)")
        _check(0 <= self.baum_welch_passes < self.mono_iters, f"{key}.baum_welch_passes",
               "must be in [0, align.mono_iters - 1] (the first pass accumulates from the "
               "equal alignment)")
        _check(0 < self.baum_welch_scale <= 1, f"{key}.baum_welch_scale", "must be in (0, 1]")
        _check(self.mono_subset >= 0, f"{key}.mono_subset",
               "must be >= 0 (shortest utterances the monophone stage trains on; 0: all)")
        _check(self.guide == "none" or self.nnet_rounds == 0, f"{key}.guide",
               "ctm trains the GMMs from the reference; align.nnet_rounds must then be 0")


@dataclass
class Config:
    storage: StorageConfig = field(default_factory=StorageConfig)
    data: DataConfig = field(default_factory=DataConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    repartition: RepartitionConfig = field(default_factory=RepartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    lm: LmConfig = field(default_factory=LmConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    align: AlignConfig = field(default_factory=AlignConfig)

    def validate(self, key: str) -> None:
        """What no one section can check: a network tree grown by align has at most
        align.nn_senones leaves, and the network's classes are its leaves (a tree taken from
        a teacher is checked at train, where its leaf count is known)."""
        a = self.align
        if self.features.labels == "align" and not (a.network_tree or self.targets.teacher):
            most = a.nn_senones or a.num_senones
            _check(self.model.num_classes <= most, "model.num_classes",
                   f"must be 0 (the tree's leaf count) or at most the {most} leaves align "
                   f"grows (align.nn_senones, or align.num_senones when that is 0), got "
                   f"{self.model.num_classes}")

    def to_dict(self) -> dict[str, Any]:
        """The user-facing mapping (`train.*` flat, as YAML spells it): load_config of it
        gives this config back."""
        return _to_data(self)

    def get(self, dotted: str) -> Any:
        """The value of a user key, e.g. `train.lr` (found in its section)."""
        node: Any = self
        for part in dotted.split("."):
            if isinstance(node, TrainConfig) and part in TRAIN_KEYS:
                node = node._holder(part)
            node = getattr(node, part)
        return node


def _to_data(obj: Any) -> Any:
    """A config dataclass as the plain mapping a user writes (TrainConfig: flat keys)."""
    if isinstance(obj, TrainConfig):
        return obj.to_flat()
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [_to_data(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_data(v) for k, v in obj.items()}
    return obj


def user_keys() -> list[tuple[str, bool]]:
    """Every key a user may set (YAML, `--set`, a DAG's overrides), dotted as they write it
    (`train.lr`: train's flat keys, not its internal sections), and whether it holds a
    mapping (`runner.env`: any sub-key, `runner.env.X`, may be set)."""
    def walk(cls: type, prefix: str) -> list[tuple[str, bool]]:
        if cls is TrainConfig:
            fields = [(k, train_key_type(k)) for k in TRAIN_KEY_ORDER]
        else:
            hints = typing.get_type_hints(cls)
            fields = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
        out = []
        for name, tp in fields:
            key = f"{prefix}{name}"
            if dataclasses.is_dataclass(tp):
                out += walk(tp, key + ".")
            else:
                out.append((key, typing.get_origin(tp) is dict or tp is Any))
        return out

    return walk(Config, "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if tp is Any:  # checked where it is used (e.g. train.teacher_recipe)
        return value
    origin = typing.get_origin(tp)
    if tp is TrainConfig:
        _check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build_train(value, key)
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [yaml.safe_load(v.strip()) if item_tp is not str else v.strip()
                     for v in value.split(",") if v.strip()]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # `--set decode.acwt=0.5`: a list of one
        _check(isinstance(value, list), key, f"must be a list, got {type(value).__name__}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        _check(isinstance(value, dict), key, f"must be a mapping, got {type(value).__name__}")
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        _check(ok, key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, key, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        _check(isinstance(value, (str, int, float)) and not isinstance(value, bool), key,
               f"must be a string, got {value!r}")
        return str(value)
    raise ConfigError(key, f"unsupported type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else k
            raise ConfigError(where, f"unknown key (known: {', '.join(sorted(names))})")
    obj = cls()
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        current = getattr(obj, k)
        if dataclasses.is_dataclass(current) and isinstance(v, dict):
            merged = _to_data(current)
            _deep_update(merged, v)
            v = merged
        setattr(obj, k, _coerce(v, hints[k], key))
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(prefix)
    return obj


def _build_train(data: dict[str, Any], prefix: str) -> TrainConfig:
    """TrainConfig from the user's flat `train.*` mapping: each key checked and coerced
    under the name the user wrote (`train.lr`), then placed in its section."""
    for k in data:
        if k not in TRAIN_KEYS:
            raise ConfigError(f"{prefix}.{k}",
                              f"unknown key (known: {', '.join(sorted(TRAIN_KEYS))})")
    merged = TrainConfig().to_flat()
    _deep_update(merged, data)
    tc = replace_train(TrainConfig(), **{
        k: _coerce(v, train_key_type(k), f"{prefix}.{k}") for k, v in merged.items()})
    tc.validate(prefix)
    return tc


def _deep_update(base: dict, update: dict) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", parsed YAML scalar of c). Empty value is the empty string."""
    if "=" not in item:
        raise ConfigError(item, "override must look like key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(item, "override has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key, value


def check_override(item: str) -> str | None:
    """None when `key=value` is a valid override on its own, else one short line naming
    the key ("unknown key train.foo", "train.lr: expected a number, got 'abc'"). The
    trigger form and the CLI share it; cross-key checks still run in load_config."""
    try:
        key, value = parse_override(str(item))
    except ConfigError as e:
        return f"{e.reason}: {item!r}"
    except yaml.YAMLError:
        return f"{str(item).split('=', 1)[0].strip()}: the value is not valid YAML"
    try:
        _coerce(value, _field_type(key), key)
    except ConfigError as e:
        if e.reason.startswith("unknown key"):
            return f"unknown key {e.key}"
        reason = e.reason[5:] if e.reason.startswith("must ") else e.reason
        reason = "expected " + reason[3:] if reason.startswith("be ") else reason
        return f"{e.key}: {reason}"
    return None


def _field_type(key: str) -> Any:
    """The declared type of a dotted key; ConfigError for an unknown one. Only the key's
    own type: range and cross-key checks depend on the config file it lands in."""
    tp: Any = Config
    for i, part in enumerate(key.split(".")):
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            continue
        if tp is Any:
            return Any
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(".".join(key.split(".")[:i + 1]), "unknown key")
        if tp is TrainConfig and TRAIN_KEYS.get(part):  # a flat train key lives in a section
            tp = TRAIN_SECTIONS[TRAIN_KEYS[part]]
        hints = typing.get_type_hints(tp)
        if part not in hints:
            raise ConfigError(".".join(key.split(".")[:i + 1]), "unknown key")
        tp = hints[part]
    return tp


def _nest(key: str, value: Any) -> dict:
    out: dict = {}
    node = out
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- `key=value` overrides, then validate every section."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.exists():
            raise ConfigError("--config", f"file not found: {p}")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError("--config", f"{p} must hold a mapping at the top level")
        data = loaded
    explicit: set[str] = set()
    for item in overrides or []:
        key, value = parse_override(item)
        explicit.add(key)
        _deep_update(data, _nest(key, value))
    _apply_recipes(data, explicit)
    return _build(Config, data, "")


def with_overrides(cfg: Config, values: dict[str, Any]) -> Config:
    """A copy of `cfg` with user keys set (`{"train.lr": 0.5, "model.student.layers": 2}`),
    coerced and validated as `--set` would be (recipes are not re-applied)."""
    data = cfg.to_dict()
    for key, value in values.items():
        _deep_update(data, _nest(key, value))
    return _build(Config, data, "")


def _apply_recipes(data: dict[str, Any], explicit: set[str]) -> None:
    """train.teacher_recipe's keys replace train.* when train.model is teacher, then
    train.sequence_recipe's when train.recipe is sequence.

    The teacher is trained differently from the students (bigger, longer, regularised
    harder) on the same labeled data, and sequence training is a short, slow-rate stage
    after either; one config holds every recipe. An explicit `--set train.<key>` still wins.
    """
    train = data.get("train")
    if not isinstance(train, dict):
        return
    if isinstance(train.get("grow_recipe"), dict):  # a key set: the others keep their defaults
        train["grow_recipe"] = {**GROW_RECIPE, **train["grow_recipe"]}
    _recipe_keys(train, "grow_recipe")  # checked here, applied by train.grow's second stage
    for name, applies in (("teacher_recipe", train.get("model") == "teacher"),
                          ("sequence_recipe", train.get("recipe") == "sequence")):
        recipe = _recipe_keys(train, name)
        if applies:
            for k, v in recipe.items():
                if f"train.{k}" in explicit:
                    continue
                # a mapping (augment) merges: `--set train.augment.enabled=false` still wins
                mine = {sub.split(".", 2)[2] for sub in explicit
                        if sub.startswith(f"train.{k}.")}
                if k == "grow_recipe":  # the teacher's own grown stage, over the shared one
                    v = {**(train.get(k) or GROW_RECIPE), **v}  # (merged with it above)
                if isinstance(v, dict) and mine and isinstance(train.get(k), dict):
                    v = {**v, **{m: train[k][m] for m in mine if m in train[k]}}
                train[k] = v


def _recipe_keys(train: dict[str, Any], name: str) -> dict[str, Any]:
    """train.<name>, checked: a mapping of train.* keys with values of their types."""
    default = getattr(TrainConfig(), name)
    recipe = train.get(name, default) or {}
    if not isinstance(recipe, dict):
        raise ConfigError(f"train.{name}", "must be a mapping of train.* keys")
    names = set(TRAIN_KEYS) - {"teacher_recipe", "sequence_recipe", "grow_recipe", "model",
                               "recipe"}
    if name == "teacher_recipe":  # the teacher may grow longer than the students
        names.add("grow_recipe")
    if name == "grow_recipe":
        names -= NOT_IN_A_GROWN_RECIPE
    _check_recipe(recipe, names, f"train.{name}")
    return recipe


# A grown stage's recipe (train.grow_recipe, train.teacher_recipe.grow_recipe) is the same
# training, grown: it cannot set what starts or names it.
NOT_IN_A_GROWN_RECIPE = frozenset({"grow", "init_model", "tag", "grow_recipe"})


def _check_recipe(recipe: dict[str, Any], names: set[str], where: str) -> None:
    """Each key of `recipe` one of `names`, its value of that train key's type (a nested
    grow_recipe checked alike)."""
    for k, v in recipe.items():
        if k not in names:
            raise ConfigError(f"{where}.{k}", f"not a train key that a recipe can set "
                                              f"(known: {', '.join(sorted(names))})")
        if k == "grow_recipe":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}.{k}", "must be a mapping of train.* keys")
            _check_recipe(v, names - NOT_IN_A_GROWN_RECIPE, f"{where}.{k}")
        else:
            _coerce(v, train_key_type(k), f"{where}.{k}")


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
