"""`train.*`: the user's flat keys, grouped into typed sections, and the presets."""
from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.config.errors import ConfigError, check

log = logging.getLogger(__name__)


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
    enabled: bool = False  # re-render the labeled utterances every epoch (labeled regime only)
    # With `stored_prob` an utterance keeps the corpus's own rendering of it (its
    # `audio_uri`: the test conditions' renderer) and gets only speed and VTLP; the rest
    # are re-rendered from the clean source as below.
    stored_prob: float = 0.0
    room_prob: float = 0.7  # chance of a random room of a random condition
    # The rooms' conditions to draw from, DP1..DP5.
    conditions: list[str] = field(default_factory=lambda: ["DP1", "DP2", "DP3", "DP4", "DP5"])
    noise_prob: float = 0.4  # without a room: chance of additive noise
    noises: list[str] = field(default_factory=lambda: ["babble", "pink", "brown", "white",
                                                       "fan", "hum", "clatter"])  # kinds drawn
    # [low, high] SNR of the additive noise.
    snr_db: list[float] = field(default_factory=lambda: [5.0, 30.0])
    speed_prob: float = 0.5  # chance of speed perturbation
    speeds: list[float] = field(default_factory=lambda: [0.9, 1.1])  # speed factors to draw from
    vtlp_prob: float = 0.5  # chance of a VTLP warp
    vtlp: list[float] = field(default_factory=lambda: [0.9, 1.1])  # warp factor range
    # The pool: `servers` Ray CPU actors per trainer, each `cpus_per_server` CPUs and the
    # custom `resources` (e.g. {pool_c4: 0.01}: the C4 pool on the cluster). 0 servers:
    # render in the trainer's own loader thread (tests, tiny runs).
    servers: int = 2
    cpus_per_server: float = 1.0  # CPUs of each server actor
    # Custom Ray resources of each server, e.g. {pool_c4: 0.01}.
    resources: dict[str, float] = field(default_factory=dict)
    # A task renders one speaker stream of up to `stream_utts` utterances in time order
    # (the causal CMN runs over it, as in the features step); chunks are shuffled within
    # windows of `window_streams` streams; at most `inflight` streams per server are
    # rendered ahead of the trainer (with train.prefetch minibatches: bounded memory).
    stream_utts: int = 8
    window_streams: int = 16  # streams whose chunks are shuffled together
    inflight: int = 2  # streams per server rendered ahead of the trainer

    def validate(self, key: str) -> None:
        conditions = ("DP1", "DP2", "DP3", "DP4", "DP5")  # tasks.speech.room.CONDITIONS
        for name in ("stored_prob", "room_prob", "noise_prob", "speed_prob", "vtlp_prob"):
            check(0.0 <= getattr(self, name) <= 1.0, f"{key}.{name}", "must be in [0, 1]")
        bad = [c for c in self.conditions if c not in conditions]
        check(bool(self.conditions) and not bad, f"{key}.conditions",
               f"must be a non-empty list of {', '.join(conditions)} (got {bad or 'none'})")
        kinds = ("babble", "pink", "brown", "white", "fan", "hum", "clatter")
        bad = [n for n in self.noises if n not in kinds]
        check(bool(self.noises) and not bad, f"{key}.noises",
               f"must be a non-empty list of {', '.join(kinds)} (got {bad or 'none'})")
        check(len(self.snr_db) == 2 and self.snr_db[0] <= self.snr_db[1], f"{key}.snr_db",
               "must be [low, high] dB")
        check(bool(self.speeds) and all(0.5 <= v <= 2.0 for v in self.speeds),
               f"{key}.speeds", "must be a non-empty list of factors in [0.5, 2]")
        check(len(self.vtlp) == 2 and 0.7 <= self.vtlp[0] <= self.vtlp[1] <= 1.3,
               f"{key}.vtlp", "must be [low, high] within [0.7, 1.3]")
        check(self.servers >= 0, f"{key}.servers", "must be >= 0")
        check(self.cpus_per_server > 0, f"{key}.cpus_per_server", "must be > 0")
        check(self.stream_utts >= 1, f"{key}.stream_utts", "must be >= 1")
        check(self.window_streams >= 1, f"{key}.window_streams", "must be >= 1")
        check(self.inflight >= 1, f"{key}.inflight", "must be >= 1")


# The presets: YAML overlays of train.* values for one kind of training (the teacher's, the
# CTC student's, a sequence stage's, a grown stage's), all in one folder, configs/presets/
# (an editable install keeps configs/ beside the code: infra/docker/Dockerfile). The
# sequence and grow presets are the defaults of train.sequence_preset and train.grow_preset.
PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs" / "presets"
# Where the presets lived before they were renamed from recipes (configs/recipes/,
# core/config/recipes/; a "recipe" is now a named pipeline of runs, in configs/recipes/):
# a missing file under such a folder that names a moved preset is read from PRESETS_DIR,
# with a WARNING.
_OLD_PRESET_DIRS = ("recipes",)
# train.model's values: the model families' names. training/families registers each family
# here (a new family adds its name); the built-in ones are listed too, because a config is
# loaded (the CLI's `--set train.model=...`) before anything imports training/families
# (tests/test_conformer.py checks the lists against the registry).
MODEL_FAMILIES: set[str] = {"teacher", "student", "ctc", "conformer", "conformer_ctc"}
# those of them trained on transcripts (the CTC decoder's families; registered the same way)
TOKEN_FAMILIES: set[str] = {"ctc", "conformer_ctc"}


def read_preset_file(path: Path, key: str) -> dict[str, Any]:
    """A preset: a YAML mapping of train.* keys (checked where it is applied)."""
    if not path.exists():
        path = _moved_preset(path, key)
    preset = yaml.safe_load(path.read_text()) or {}
    if not isinstance(preset, dict):
        raise ConfigError(key, f"{path} must hold a mapping of train.* keys")
    return preset


def _moved_preset(path: Path, key: str) -> Path:
    """A preset named by its old path (configs/recipes/teacher.yaml): the file in
    configs/presets/ of the same name, with a WARNING naming it; else not found."""
    moved = PRESETS_DIR / path.name
    if path.parent.name not in _OLD_PRESET_DIRS or not moved.exists():
        raise ConfigError(key, f"preset file not found: {path} (the shipped presets are in "
                               f"{PRESETS_DIR})")
    log.warning("%s: %s has moved to %s (presets live in configs/presets/; "
                "configs/recipes/ holds the pipeline recipes): reading that file",
                key, path, moved)
    return moved


SEQUENCE_PRESET = read_preset_file(PRESETS_DIR / "sequence.yaml", "train.sequence_preset")
GROW_PRESET = read_preset_file(PRESETS_DIR / "grow.yaml", "train.grow_preset")


# `train.*` is split into typed sections below, but the sections are internal: users keep
# writing the flat keys (`train.lr`, `train.gtc_tau`, ...) in YAML, `--set`, the DAGs and
# the presets (`train.teacher_preset: {lr: ...}`), and every error names that flat key.
# One spelling per setting keeps the contract (configs, scripts, README, checkpoints'
# fingerprints) unchanged and presets unambiguous; code reads `tc.optim.lr`. Each section's
# field names are the flat keys themselves, so the flat key -> section table (TRAIN_KEYS,
# built from the sections) is the only mapping.


@dataclass
class OptimConfig:
    """train.*: the local optimizer and the learning-rate schedule (training/schedules.py)."""

    # The learning rate at the start (per worker, before any rule for many workers).
    lr: float = 1.0e-3
    final_lr: float = 1.0e-4  # schedule exponential: the rate at the end
    labeled_lr_scale: float = 1.5  # ssl: the labeled passes' rate, x the current rate
    optimizer: str = "adam"  # adam | sgd
    momentum: float = 0.9  # optimizer sgd: momentum
    schedule: str = "exponential"  # exponential | newbob
    newbob_threshold: float = 0.005  # schedule newbob: halve the rate below this relative dev gain
    min_lr: float = 1.0e-5  # schedule newbob: stop the chunked phase below this rate
    # Gradual warm-up (Goyal et al. 2017), for the large rates of many workers: over the
    # first `lr_warmup_units` units (passes, or ssl sub-epochs) the rate ramps linearly
    # from lr_warmup_start x the scheduled rate to the scheduled rate (0 units = off).
    lr_warmup_units: float = 0.0
    lr_warmup_start: float = 0.1  # the warm-up's first rate, x the scheduled rate
    max_change: float = 0.0  # 0 = off; Kaldi-style per-minibatch parameter change cap
    clip_grad_norm: float = 5.0  # clip the gradient's global norm (0 = off)

    def validate(self, key: str) -> None:
        check(self.lr > 0, f"{key}.lr", "must be > 0")
        check(self.optimizer in ("adam", "sgd"), f"{key}.optimizer", "must be adam or sgd")
        check(self.schedule in ("exponential", "newbob"), f"{key}.schedule",
               "must be exponential or newbob")
        check(self.final_lr > 0 and self.min_lr > 0, f"{key}.final_lr",
               "final_lr and min_lr must be > 0")
        check(self.lr_warmup_units >= 0, f"{key}.lr_warmup_units", "must be >= 0")
        check(0 < self.lr_warmup_start <= 1, f"{key}.lr_warmup_start", "must be in (0, 1]")


@dataclass
class PassesConfig:
    """train.*: how many passes over which data (training/schedules.py plan_passes)."""

    epochs: int = 6  # labeled regime: passes over the labeled data
    # labeled regime: at least this many optimizer updates (0 = off). train.epochs is
    # raised to ceil(min_updates / minibatches of one epoch) when that is more, so a small
    # labeled set trains as long as a larger one (model.size's rows set it); the
    # minibatches of one epoch are those of its first pass (chunks, or whole utterances
    # for the CTC students) per worker (training/inputs.py epoch_minibatches). An epoch
    # count given beside the size's (the config, --set, a preset) turns the size's off.
    min_updates: int = 0
    finetune_epochs: int = 1  # the last units run on whole sequences instead of chunks
    sub_epochs: int = 4  # ssl: the unlabeled pass is cut into this many units
    unlabeled_passes: int = 1  # ssl: passes over the unlabeled data (the paper: 1)
    # SortaGrad (DeepSpeech2): the first epoch's minibatches in increasing utterance length.
    sortagrad: bool = False
    # train.model ctc with train.pseudolabels: train.epochs becomes this (0: no change), an
    # explicit --set train.epochs still wins. The SSL student sees several times the
    # baseline's audio per epoch, so it needs fewer epochs than the baseline's preset
    # (configs/presets/ctc.yaml says what was measured).
    pseudolabel_epochs: int = 0

    def validate(self, key: str) -> None:
        check(self.epochs >= 1, f"{key}.epochs", "must be >= 1")
        check(self.min_updates >= 0, f"{key}.min_updates", "must be >= 0")
        check(self.pseudolabel_epochs >= 0, f"{key}.pseudolabel_epochs", "must be >= 0")
        check(self.unlabeled_passes >= 1, f"{key}.unlabeled_passes", "must be >= 1")
        check(self.finetune_epochs >= 0, f"{key}.finetune_epochs", "must be >= 0")
        check(self.sub_epochs >= 1, f"{key}.sub_epochs", "must be >= 1")


@dataclass
class BatchesConfig:
    """train.*: the data a worker reads and how it is cut into minibatches (training/data.py)."""

    chunk_frames: int = 32  # chunked BPTT: frames per chunk (33 Hz rows)
    minibatch_frames: int = 2048  # frames per worker minibatch
    prefetch: int = 4  # minibatches read ahead of the trainer
    labeled_split: str = "labeled"  # the split the labeled passes read
    unlabeled_split: str = "unlabeled"  # the split the ssl passes read (with soft targets)
    dev_split: str = "dev"  # scored after every epoch / sub-epoch when it exists
    # Chunked BPTT: frames fed before / after each chunk but not scored.
    # right context -1 = the student's look-ahead (teacher: the left context).
    chunk_left_context: int = 8
    chunk_right_context: int = -1  # frames after each chunk, not scored; -1: the look-ahead
    shuffle_partitions: int = 4  # partitions pooled before chunks are shuffled

    def validate(self, key: str) -> None:
        check(self.chunk_frames >= 1, f"{key}.chunk_frames", "must be >= 1")
        check(self.minibatch_frames >= self.chunk_frames, f"{key}.minibatch_frames",
               "must be >= train.chunk_frames")
        check(self.chunk_left_context >= 0, f"{key}.chunk_left_context", "must be >= 0")
        check(self.chunk_right_context >= -1, f"{key}.chunk_right_context", "must be >= -1")
        check(self.shuffle_partitions >= 1, f"{key}.shuffle_partitions", "must be >= 1")
        check(self.prefetch >= 1, f"{key}.prefetch", "must be >= 1")


@dataclass
class DistillConfig:
    """train.*: distillation from the teacher's top-k soft targets (training/losses.py)."""

    temperature: float = 1.0  # distillation temperature T for teacher and student (loss x T^2)
    topk_fill: float = -1.0e4  # logit given to the classes outside the stored top-k

    def validate(self, key: str) -> None:
        check(self.temperature > 0, f"{key}.temperature", "must be > 0")


@dataclass
class MaskingConfig:
    """train.*: SpecAugment-style masking of training minibatches (0 masks = off): per
    sequence, `freq_masks` bands of up to `freq_mask_bins` mel bins (the same bins in every
    stacked frame) and `time_masks` spans of up to `time_mask_rows` rows are zeroed."""

    freq_masks: int = 0  # frequency bands masked per sequence
    freq_mask_bins: int = 8  # widest band, mel bins
    time_masks: int = 0  # time spans masked per sequence
    time_mask_rows: int = 3  # longest span, rows

    def validate(self, key: str) -> None:
        check(min(self.freq_masks, self.freq_mask_bins, self.time_masks,
                   self.time_mask_rows) >= 0, f"{key}.freq_masks", "masking knobs must be >= 0")


@dataclass
class AlgoConfig:
    """train.*: the distributed algorithms' knobs (training/algorithms/)."""

    # GTC threshold in gradient units; 0 = per tensor, gtc_tau_scale x its mean |first
    # gradient|, which bounds the sent fraction by 1/gtc_tau_scale (algorithms/gtc.py).
    gtc_tau: float = 0.0
    gtc_tau_scale: float = 100.0  # with gtc_tau 0: tau = this x mean |first gradient| per tensor
    # Minibatches over which tau ramps up geometrically from tau/gtc_tau_scale (0 = off).
    gtc_warmup: int = 0
    # Keep the momentum on each worker before compression (deep-gradient-compression
    # momentum correction, algorithms/gtc.py); needs optimizer sgd.
    gtc_momentum_correction: bool = False
    block_size: int = 50  # bmuf, htm: minibatches of local SGD between block updates
    block_lr: float = 1.0  # zeta
    block_momentum: float = -1.0  # eta; < 0 = derive from zeta/(N(1-eta)) = C
    bmuf_c: float = 1.0  # C in the derived eta = 1 - zeta / (N C)
    # Zero the local SGD momentum after every block update (BMUF, HTM), as CNTK does.
    block_reset_momentum: bool = True
    group_size: int = 2  # htm: workers per group (one host); 1 is bmuf
    # HTM's lower-tier (in-group, intra-host) GTC tau scale: the paper uses tau 2 inside
    # the groups against 8 for plain GTC, i.e. 4x denser where bandwidth is cheap.
    htm_tau_scale: float = 25.0
    ma_samples: int = 20000  # frames between averages (Kaldi's K)
    # Kaldi's online natural-gradient preconditioning inside ma (NG-SGD,
    # training/natural_gradient.py): students only; alpha smooths the Fisher factors.
    natural_gradient: bool = False
    ng_alpha: float = 4.0  # natural gradient: alpha

    def validate(self, key: str) -> None:
        check(self.group_size >= 1, f"{key}.group_size", "must be >= 1")
        check(self.block_size >= 1, f"{key}.block_size", "must be >= 1")
        check(self.ng_alpha > 0, f"{key}.ng_alpha", "must be > 0")


@dataclass
class SequenceConfig:
    """train.*: the training criterion. ce (cross-entropy on labels, distillation on soft
    targets), mmi (lattice-free MMI) or smbr (lattice-free sMBR): training/sequence.py, a
    phone n-gram denominator graph and a batched forward-backward, for sequence training on
    labeled data after CE."""

    criterion: str = "ce"  # ce | mmi | smbr (the sequence regime: mmi or smbr)
    # mmi, smbr: the numerator is the fixed frame alignment, or its phone sequence with
    # flexible timing (every segmentation of the aligned phones).
    sequence_numerator: str = "alignment"
    # LF-MMI's regularisers (Povey et al. 2016, sec. 2.6): CE interpolation weight and
    # the output L2 (0.5 * l2 * |logits|^2 per frame; Kaldi chain recipes use 5e-5).
    sequence_ce_weight: float = 0.1
    sequence_l2: float = 5.0e-5  # output L2 weight
    # Smoothing toward the CE model the sequence training starts from: + this weight x the
    # cross-entropy of the model's posteriors against the CE model's on every scored frame
    # (knowledge distillation; KL-regularised training). 0: off (the loss before the key).
    sequence_kd_weight: float = 0.0
    # Leaky HMM (LF-MMI sec. 2.5): per-frame probability of jumping to any state.
    leaky_hmm: float = 0.1
    # x = am_scale * (logits - prior_scale * log class priors); LF-MMI uses 1 and 0.
    sequence_am_scale: float = 1.0
    sequence_prior_scale: float = 0.0  # the prior_scale in x above (0: no priors)
    # Denominator phone n-gram: order (2..4) and the count below which a history of the
    # full length is pruned (it backs off to the shorter one).
    den_ngram_order: int = 2
    den_min_count: int = 2  # count below which a full-length history is pruned
    # The model `amflow sequence` ships: dev_wer = the lowest dev WER among the CE model
    # and every epoch's (the CE model on ties; amflow/steps/sequence.py); dev_frames = the
    # lowest dev frame error (no decoding; dev_wer's fallback without the run's LM);
    # last = the last epoch's whatever dev says (before this key existed).
    sequence_select: str = "dev_wer"
    # dev_wer: the fixed subset of decode.tune_split's utterances every candidate is
    # decoded on (0 = all of them); the CE model costs a forward pass and a search per
    # decode.acwt over it, each epoch a forward pass and up to 3 searches (the acwt values
    # around the CE model's best).
    sequence_select_utts: int = 60
    # dev_wer: an epoch replaces the CE model only when its dev gain passes the paired
    # test (MAPSSWE p below this): a gain 60 utterances cannot tell from noise is not
    # shipped (the 2026-12-07 demo: dev -0.40 points at p = 0.62, test +1.76 at p = 0.003).
    # 1: the lowest dev WER ships, however small its gain.
    sequence_select_alpha: float = 0.05

    def validate(self, key: str) -> None:
        check(self.criterion in ("ce", "mmi", "smbr"), f"{key}.criterion",
               "must be ce, mmi or smbr")
        check(self.sequence_numerator in ("alignment", "flexible"),
               f"{key}.sequence_numerator", "must be alignment or flexible")
        check(self.sequence_ce_weight >= 0, f"{key}.sequence_ce_weight", "must be >= 0")
        check(self.sequence_l2 >= 0, f"{key}.sequence_l2", "must be >= 0")
        check(self.sequence_kd_weight >= 0, f"{key}.sequence_kd_weight", "must be >= 0")
        check(0 <= self.leaky_hmm < 1, f"{key}.leaky_hmm", "must be in [0, 1)")
        check(self.sequence_am_scale > 0, f"{key}.sequence_am_scale", "must be > 0")
        check(self.sequence_prior_scale >= 0, f"{key}.sequence_prior_scale", "must be >= 0")
        check(2 <= self.den_ngram_order <= 4, f"{key}.den_ngram_order", "must be 2, 3 or 4")
        check(self.den_min_count >= 1, f"{key}.den_min_count", "must be >= 1")
        check(self.sequence_select in ("dev_wer", "dev_frames", "last"),
              f"{key}.sequence_select", "must be dev_wer, dev_frames or last")
        check(self.sequence_select_utts >= 0, f"{key}.sequence_select_utts", "must be >= 0")
        check(0 < self.sequence_select_alpha <= 1, f"{key}.sequence_select_alpha",
              "must be in (0, 1]")


@dataclass
class CheckpointsConfig:
    """train.*: checkpoints, metric records and fault injection (training/loop.py)."""

    checkpoint_every: int = 200  # minibatches
    log_every: int = 10  # minibatches per metrics.jsonl record
    keep_checkpoints: int = 2  # checkpoints kept (older ones deleted)
    fail_after: int = 0  # fault injection: die once after this many minibatches (0 = off)

    def validate(self, key: str) -> None:
        check(self.checkpoint_every >= 1, f"{key}.checkpoint_every", "must be >= 1")
        check(self.log_every >= 1, f"{key}.log_every", "must be >= 1")
        check(self.keep_checkpoints >= 1, f"{key}.keep_checkpoints", "must be >= 1")


# TrainConfig's sections: attribute name -> class. A flat key `train.<k>` lives in the
# section whose class has a field <k> (TRAIN_KEYS); the others are TrainConfig's own.
TRAIN_SECTIONS: dict[str, type] = {
    "optim": OptimConfig, "passes": PassesConfig, "batches": BatchesConfig,
    "distill": DistillConfig, "masking": MaskingConfig, "algo": AlgoConfig,
    "sequence": SequenceConfig, "checkpoints": CheckpointsConfig}


@dataclass
class TrainConfig:
    """`train.*`, the user's flat keys grouped into typed sections (see TRAIN_KEYS)."""

    model: str = "student"  # teacher | student | ctc (the end-to-end student: model.ctc)
    # What the training learns from, and how. labeled: CE on hard labels; ssl: scheduled
    # learning over unlabeled soft targets; sequence: a sequence criterion
    # (train.criterion mmi | smbr) on the labeled split, starting from a CE / distilled
    # model (train.init_model), the petabyte recipe's last stage (`amflow sequence`;
    # output dir sequence[-<tag>]). Formerly train.recipe (still read, with a WARNING): a
    # recipe is now a named pipeline of runs (configs/recipes/).
    regime: str = "labeled"
    algorithm: str = "sgd"  # sgd | gtc | bmuf | htm | ma
    workers: int = 1  # data-parallel workers (Ray Train); 1: in the step's process
    seed: int = 0  # seeds initialisation, shuffling, dropout and augmentation
    # Output dir `train` (empty tag) or `train-<tag>`, so several trainings share a run.
    tag: str = ""
    threads: int = 0  # torch threads per worker; 0 = the CPUs Ray gives it (training/threads.py); more than that is a WARNING
    use_gpu: bool = False  # train on a GPU per worker (NCCL between them)
    # The model a sequence training starts from; empty = this run's train[-<tag>]/model.pt.
    # Set for the labeled / ssl regimes: training starts from it; a phone-class model is
    # grown into this run's context-dependent leaves (training/grow.py), else the classes
    # must be this run's.
    init_model: str = ""
    # train.model ctc: the pseudo-labels to train on beside the labeled split's
    # transcripts: a run id (its runs/<id>/pseudolabel/ step) or the URI of such a step's
    # dir; its kept labels (labels/*.parquet, kept = true) of utterances in the unlabeled
    # split's partitions. Empty: the labeled split alone (the CTC baseline).
    # train.recipe sequence (semi-supervised sequence training): each epoch also trains on
    # the unlabeled split's kept utterances, the teacher's top-1 target per frame the
    # reference, the sequence objective weighted by the pseudo-label's confidence.
    pseudolabels: str = ""
    # With context-dependent classes: + phone_weight x the same criterion on each frame's
    # phone (the classes' probabilities summed per phone; training/losses.py phone_loss).
    # The logged train loss includes the term; the dev loss is the classes' CE alone.
    phone_weight: float = 0.0
    # Grow inside this training (labeled and ssl regimes, context-dependent classes): first
    # the training as configured on each label's phone and the targets summed per phone (a
    # phone-class model, in train[-<tag>]/phones/), then that model grown into this run's
    # leaves trains on with train.grow_preset's values: one `amflow train` does what
    # train.init_model does with a phone-class run's model (training/launch.py
    # train_grown). A train.init_model is started from instead (grown if it has a class
    # per phone); the sequence regime starts from the grown model as from any other.
    grow: bool = False
    # train.* values of the grown stage (train.grow), over the training's own
    # (configs/presets/grow.yaml; formerly train.grow_recipe).
    grow_preset: dict[str, Any] = field(default_factory=lambda: dict(GROW_PRESET))
    # Example servers: labeled utterances re-rendered every epoch (off: the stored rendering).
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # train.* values used instead when train.model is teacher (overlays.apply_presets,
    # e.g. configs/presets/teacher.yaml; formerly train.teacher_recipe); its grow_preset,
    # a mapping, goes over train.grow_preset's values for the teacher's grown stage.
    teacher_preset: dict[str, Any] = field(default_factory=dict)
    # train.* values used instead when train.model is ctc or conformer_ctc (the end-to-end
    # students; an explicit --set train.<key> still wins), e.g. configs/presets/ctc.yaml (formerly
    # train.ctc_recipe).
    ctc_preset: dict[str, Any] = field(default_factory=dict)
    # train.* values laid over ctc_preset's when train.model is conformer_ctc (the
    # Conformer's CTC head wants a warm-up, a higher peak rate and more epochs than the GRU
    # student), e.g. configs/presets/conformer_ctc.yaml.
    conformer_ctc_preset: dict[str, Any] = field(default_factory=dict)
    # train.* values used instead when train.regime is sequence (after teacher_preset's;
    # configs/presets/sequence.yaml; formerly train.sequence_recipe).
    sequence_preset: dict[str, Any] = field(default_factory=lambda: dict(SEQUENCE_PRESET))
    optim: OptimConfig = field(default_factory=OptimConfig)
    passes: PassesConfig = field(default_factory=PassesConfig)
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)

    @property
    def recipe(self) -> str:
        """train.regime under its old name, for code not yet moved to the new one (the
        user's key train.recipe is read as train.regime by the config loader)."""
        return self.regime

    @classmethod
    def from_flat(cls, **flat: Any) -> "TrainConfig":
        """A TrainConfig from flat `train.*` keys (unchecked, like a dataclass constructor:
        tests and benchmarks build one this way; `load_config` coerces and validates)."""
        return replace_train(cls(), **flat)

    def to_flat(self) -> dict[str, Any]:
        """The user-facing `train.*` mapping: flat keys (augment a nested mapping), in the
        order the keys were declared before the sections existed (checkpoint fingerprints
        compare this form, so checkpoints of earlier versions still resume)."""
        return {k: plain(getattr(self._holder(k), k)) for k in TRAIN_KEY_ORDER}

    def _holder(self, key: str) -> Any:
        section = TRAIN_KEYS[key]
        return getattr(self, section) if section else self

    def validate(self, key: str) -> None:
        check(self.model in MODEL_FAMILIES, f"{key}.model",
              "must be a model family: " + ", ".join(sorted(MODEL_FAMILIES)))
        self._validate_ctc(key)
        check(self.regime in ("labeled", "ssl", "sequence"), f"{key}.regime",
               "must be labeled, ssl or sequence")
        check(self.algorithm in ("sgd", "gtc", "bmuf", "htm", "ma"), f"{key}.algorithm",
               "must be one of sgd, gtc, bmuf, htm, ma")
        check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        for name in TRAIN_SECTIONS:
            getattr(self, name).validate(key)
        ng = self.algo.natural_gradient
        check(not ng or self.algorithm == "ma", f"{key}.natural_gradient",
               f"is applied by the ma trainer only (train.algorithm is {self.algorithm})")
        check(not ng or self.model == "student",
               f"{key}.natural_gradient", "needs the unidirectional student (train.model)")
        check("/" not in self.tag, f"{key}.tag", "must not contain '/'")
        check(self.phone_weight >= 0, f"{key}.phone_weight", "must be >= 0")
        check(self.phone_weight == 0 or self.regime != "sequence", f"{key}.phone_weight",
               "applies to the ce regimes (labeled, ssl); the sequence regime's criterion "
               "takes none: 0 there (a config file that sets it: add phone_weight: 0 to "
               "train.sequence_preset)")
        check(not self.augment.enabled or self.regime == "labeled", f"{key}.augment.enabled",
               "augments the labeled trainings (teacher, baseline student); train.regime is "
               f"{self.regime}")
        # A sequence criterion needs hard labels and a trained model to start from: the
        # sequence regime gives both; ce there would be a CE fine-tune under another name.
        criterion = self.sequence.criterion
        check((criterion == "ce") == (self.regime != "sequence"), f"{key}.criterion",
               f"is {criterion} with train.regime={self.regime}: the sequence regime "
               "takes mmi or smbr, the labeled and ssl regimes take ce")

    def _validate_ctc(self, key: str) -> None:
        """The CTC student trains on whole transcripts (labeled + pseudo-labels), one regime.
        train.grow and train.phone_weight (phone classes) do not apply to it: ignored."""
        if self.model not in TOKEN_FAMILIES:
            check(not self.pseudolabels or self.recipe == "sequence", f"{key}.pseudolabels",
                  "are transcripts for train.model ctc or references for train.recipe "
                  f"sequence (train.model is {self.model}, train.recipe {self.recipe})")
            return
        check(self.regime == "labeled", f"{key}.regime",
              "must be labeled with train.model ctc (pseudo-labels: train.pseudolabels)")
        check(not self.augment.enabled, f"{key}.augment.enabled",
              "the example servers render frame labels; train.model ctc reads transcripts "
              "(SpecAugment: train.freq_masks / train.time_masks)")


def _section_keys() -> dict[str, str]:
    keys = {f.name: "" for f in dataclasses.fields(TrainConfig) if f.name not in TRAIN_SECTIONS}
    for section, cls in TRAIN_SECTIONS.items():
        keys.update({f.name: section for f in dataclasses.fields(cls)})
    return keys


# Flat key `train.<k>` -> the TrainConfig section holding it ("" = TrainConfig itself).
TRAIN_KEYS: dict[str, str] = _section_keys()


# The flat keys in the order TrainConfig declared them when it was one flat class.
TRAIN_KEY_ORDER: tuple[str, ...] = (
    "model", "regime", "algorithm", "workers", "epochs", "finetune_epochs", "lr", "final_lr",
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
    "sequence_prior_scale", "den_ngram_order", "den_min_count", "teacher_preset",
    "sequence_preset", "init_model", "phone_weight", "grow", "grow_preset", "pseudolabels",
    "ctc_preset", "conformer_ctc_preset", "pseudolabel_epochs", "sequence_select",
    "sequence_select_utts",
    "sequence_kd_weight", "min_updates", "sequence_select_alpha")


assert set(TRAIN_KEY_ORDER) == set(TRAIN_KEYS) and len(TRAIN_KEY_ORDER) == len(TRAIN_KEYS)


def train_key_type(key: str) -> Any:
    """The type of flat key `train.<key>` (its section field's annotation)."""
    section = TRAIN_KEYS[key]
    return typing.get_type_hints(TRAIN_SECTIONS[section] if section else TrainConfig)[key]


def replace_train(tc: TrainConfig, **flat: Any) -> TrainConfig:
    """A copy of `tc` with flat `train.*` keys replaced (dataclasses.replace for the
    user's keys), sections copied so `tc` is left as it was."""
    if "recipe" in flat:  # train.regime's old name (tests, benchmarks)
        flat = {("regime" if k == "recipe" else k): v for k, v in flat.items()}
    unknown = sorted(set(flat) - set(TRAIN_KEYS))
    if unknown:
        raise ConfigError(f"train.{unknown[0]}", "unknown key")
    by_section: dict[str, dict[str, Any]] = {}
    for k, v in flat.items():
        by_section.setdefault(TRAIN_KEYS[k], {})[k] = v
    top = by_section.pop("", {})
    sections = {s: dataclasses.replace(getattr(tc, s), **kw) for s, kw in by_section.items()}
    return dataclasses.replace(tc, **top, **sections)


def plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
