"""Serving and its measurements: `serve.*`, `simulate.*`, `bench.*`."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.errors import check

@dataclass
class ExportConfig:
    """`amflow export`: the student as ONNX graphs, and the checks that keep an export."""

    check_split: str = "test"  # the split of data.corpus whose utterances the checks run on
    check_utterances: int = 0  # at most this many of them (0: every one of the split)
    # Most log-posterior difference an fp32 graph may have from torch, in units of the
    # value's size above 1: |onnx - torch| <= tolerance x max(1, |torch|) on every frame
    # and class (float32 rounds relative to size; serving/export_checks.py scaled_diff).
    tolerance: float = 1e-4
    chunk_rows: int = 4  # rows per streaming step in the streaming graph's check (120 ms)
    streams: int = 8  # streams batched together in that check (their row counts differ)

    def validate(self, key: str) -> None:
        check(bool(self.check_split), f"{key}.check_split", "must name a corpus split")
        check(self.check_utterances >= 0, f"{key}.check_utterances", "must be >= 0 (0: all)")
        check(self.tolerance > 0, f"{key}.tolerance", "must be > 0")
        check(self.chunk_rows >= 1 and self.streams >= 1, f"{key}.chunk_rows",
              "chunk_rows and streams must be >= 1")


@dataclass
class ServeConfig:
    """`amflow serve`: the streaming recognizer on Ray Serve (serving/)."""

    host: str = "127.0.0.1"  # address the service listens on
    port: int = 8000  # port of the page, /ws and /stats
    app_name: str = "amflow-serve"  # the Ray Serve application's name
    # haproxy: Ray Serve's HAProxy ingress with direct ingress to the replicas (WebSocket
    # frames go client -> HAProxy -> replica; its RAY_SERVE_ENABLE_DIRECT_INGRESS and
    # RAY_SERVE_ENABLE_HA_PROXY must be set where Ray starts: `amflow serve` sets them
    # for the local Ray it starts; a cluster sets them on its nodes). proxy: the default
    # Python proxy actor, which relays every frame over a Ray call (~2x the CPU per stream).
    ingress: str = "haproxy"
    # Replicas of the recognizer deployment, and what each one asks Ray for: on the
    # cluster, GPU replicas on the P3 pool (num_gpus 1, resources {pool_p3: 0.01}).
    replicas: int = 1
    num_cpus: float = 1.0  # CPUs each replica asks Ray for
    num_gpus: float = 0.0  # GPUs each replica asks Ray for
    # Custom Ray resources of each replica, e.g. {pool_p3: 0.01}.
    resources: dict[str, float] = field(default_factory=dict)
    # Streams one replica admits; one more is refused with close code 1013 (try again).
    max_streams: int = 100
    max_chunk_bytes: int = 64000  # one binary message (2 s of 16 kHz s16le); more: 1009
    # Batch Dispatch: at most this many streams per forward, rows per stream per forward.
    max_batch: int = 128
    max_rows: int = 32  # rows (33 Hz frames) per stream per forward
    # How long rows of partial hypotheses may wait for other streams' rows before a
    # forward (an utterance's end never waits); 0: DeepSpeech2's eager dispatch. On a
    # CPU a forward of 1 stream costs about what one of 8 does (serving/dispatch.py).
    max_wait_ms: float = 50.0
    search_threads: int = 1  # threads of a replica's search pool
    # Model precision: auto = fp16 on GPUs before Ampere, else fp32 (amflow/precision.py);
    # fp16 | bf16 | fp32.
    dtype: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    # What runs the model: torch (model.pt) or onnxruntime (the graph `amflow export`
    # wrote, on the CPU; dtype and device are torch's). Same protocol, dispatch and metrics.
    backend: str = "torch"  # torch | onnxruntime
    # …/model.streaming.int8.onnx serves the int8 graph
    onnx_model: str = ""  # backend onnxruntime: the exported streaming graph ("" = model.streaming.onnx in the served model's export folder)
    threads: int = 1  # torch threads per replica
    # Search settings; 0 = the decode step's (decode.beam, decode.max_active), so the
    # streamed words are the offline decode's. acwt 0 = the one `amflow decode` tuned for
    # this model (its result.json), else decode.acwt[0].
    acwt: float = 0.0
    beam: float = 0.0  # 0: decode.beam
    max_active: int = 0  # 0: decode.max_active
    # Client authentication (serving/auth.py): when the environment variable this names
    # holds a token, every WebSocket must give it (`Authorization: Bearer <token>`, or a
    # "token" field in its JSON header), else it is closed with 1008. An environment
    # variable, not a key: configs are committed, a token is a secret. "" = no token.
    token_env: str = "AMFLOW_SERVE_TOKEN"
    # A serve.host other than loopback without a token is refused unless this is true.
    allow_unauthenticated: bool = False
    # A client that sends nothing for this long is closed (1001).
    idle_timeout_s: float = 30.0
    # Speech gate (tasks/speech_activity.py): frames are recognised only in speech and
    # speech_pad_s around it, so digital silence, hum and steady noise give no words (and
    # do not weigh on the speaker's mean normalisation). A frame is speech when its energy
    # (90 ms mean) is speech_threshold_db above the stream's floor: the lowest energy of
    # the last speech_floor_s, or of the last speech_steady_s when it held within
    # speech_steady_db. Chosen on the dev split: docs/results/2026-11-29-serving-faults.md.
    speech_gate: bool = True  # false: every row is recognised (the offline decode's rows)
    speech_threshold_db: float = 6.0  # dB above the stream's noise floor that is speech
    speech_floor_s: float = 3.0  # the floor: the quietest frame of this many seconds before
    speech_smooth_ms: float = 90.0  # frame energies averaged over this long (causal)
    speech_pad_s: float = 0.15  # non-speech kept before and after speech (the silence the model knows)
    speech_steady_s: float = 0.5  # energy steady this long (0: off) is the floor: a steady sound is no speech
    speech_steady_db: float = 3.0  # "steady": within this many dB
    # (never recognised, not even as padding; out of the speaker's mean normalisation)
    speech_min_dbfs: float = -80.0  # frames quieter than white noise at this level are no sound (digital silence)

    def validate(self, key: str) -> None:
        check(1 <= self.port <= 65535, f"{key}.port", "must be in [1, 65535]")
        check(self.replicas >= 1, f"{key}.replicas", "must be >= 1")
        check(self.ingress in ("haproxy", "proxy"), f"{key}.ingress", "must be haproxy or proxy")
        check(self.num_cpus >= 0 and self.num_gpus >= 0, f"{key}.num_gpus",
               "num_cpus and num_gpus must be >= 0")
        check(self.max_streams >= 1, f"{key}.max_streams", "must be >= 1")
        check(self.max_chunk_bytes >= 2, f"{key}.max_chunk_bytes", "must be >= 2")
        check(self.max_batch >= 1, f"{key}.max_batch", "must be >= 1")
        check(self.max_rows >= 1, f"{key}.max_rows", "must be >= 1")
        check(self.max_wait_ms >= 0, f"{key}.max_wait_ms", "must be >= 0")
        check(self.search_threads >= 1, f"{key}.search_threads", "must be >= 1")
        check(self.dtype in ("auto", "fp32", "fp16", "bf16"), f"{key}.dtype",
               "must be auto, fp32, fp16 or bf16")
        check(self.device in ("auto", "cpu", "cuda"), f"{key}.device", "must be auto, cpu or cuda")
        check(self.backend in ("torch", "onnxruntime"), f"{key}.backend",
              "must be torch or onnxruntime")
        check(self.threads >= 1, f"{key}.threads", "must be >= 1")
        check(self.acwt >= 0 and self.beam >= 0 and self.max_active >= 0, f"{key}.acwt",
               "acwt, beam and max_active must be >= 0 (0: the decode step's)")
        check(self.idle_timeout_s > 0, f"{key}.idle_timeout_s", "must be > 0")
        check(self.speech_threshold_db > 0, f"{key}.speech_threshold_db", "must be > 0")
        check(self.speech_floor_s > 0, f"{key}.speech_floor_s", "must be > 0")
        check(self.speech_smooth_ms > 0, f"{key}.speech_smooth_ms", "must be > 0")
        check(self.speech_pad_s >= 0, f"{key}.speech_pad_s", "must be >= 0")
        check(self.speech_steady_s >= 0 and self.speech_steady_db > 0, f"{key}.speech_steady_s",
              "speech_steady_s must be >= 0 and speech_steady_db > 0")


@dataclass
class SimulateConfig:
    """`amflow simulate`: the throughput projection (cost models in training/simulate.py)."""

    workers: list[int] = field(default_factory=lambda: [16, 32, 64, 128])  # worker counts projected
    gpus_per_host: int = 8  # GPUs per host (one NVLink island)
    intra_host_gbps: float = 300.0  # bandwidth between the GPUs of a host
    inter_host_gbps: float = 25.0  # bandwidth between hosts
    params: int = 24_000_000  # model parameters (the papers' student: 24 M)
    minibatch_frames: int = 2048  # frames per worker minibatch
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
    htm_sent_fraction: float = -1.0  # fraction HTM's in-group GTC sends; < 0 = measured
    block_size: int = 50  # bmuf, htm: minibatches per block
    group_size: int = 8  # htm: GPUs per group
    ma_samples: int = 400_000  # ma: frames between averages

    def validate(self, key: str) -> None:
        check(self.gpus_per_host >= 1, f"{key}.gpus_per_host", "must be >= 1")
        check(bool(self.workers) and all(w >= 1 for w in self.workers), f"{key}.workers",
               "must be a non-empty list of worker counts >= 1")
        check(self.intra_host_gbps > 0 and self.inter_host_gbps > 0, f"{key}.inter_host_gbps",
               "bandwidths must be > 0")
        check(self.params >= 1, f"{key}.params", "must be >= 1")
        check(self.minibatch_frames >= 1, f"{key}.minibatch_frames", "must be >= 1")
        check(self.compute_s_per_minibatch >= 0, f"{key}.compute_s_per_minibatch",
               "must be >= 0")
        check(self.block_size >= 1, f"{key}.block_size", "must be >= 1")
        check(self.group_size >= 1, f"{key}.group_size", "must be >= 1")
        check(self.codec_gbps >= 0, f"{key}.codec_gbps", "must be >= 0")
        check(self.gtc_sent_fraction <= 1 and self.htm_sent_fraction <= 1,
               f"{key}.gtc_sent_fraction", "must be <= 1")


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
    # Bench trainers: methods compared.
    algos: list[str] = field(default_factory=lambda: ["sgd", "gtc", "bmuf", "htm", "ma"])
    epochs: int = 0  # bench trainers: passes per method (0: the profile's)
    pretrain: int = 3  # bench trainers: 1-worker SGD passes of the shared start
    lr_rule: str = "tuned"  # tuned | sqrt | linear | none
    profile: str = "bench"  # bench | config
    synth_seconds: float = 1800.0  # synthetic corpus length without run data
    keep_sync: bool = False  # keep the config's BMUF/HTM sync settings
    corpus_hours: float = 2.5  # bench corpus hours
    labeled_share: float = 0.35  # bench corpus labeled share
    # bench gtc: codec minibatches (the sent fraction settles after ~gtc_tau_scale of
    # them; the second half is counted), and minibatches of the overhead comparison
    # (0 = train.block_size + 10).
    gtc_steps: int = 160
    # Bench gtc: minibatches of the overhead comparison (0: block_size + 10).
    overhead_steps: int = 0
    # bench sequence: timed minibatches per criterion.
    seq_steps: int = 20
    # bench features: audio seconds featurised, and rounds.
    seconds: float = 1200.0
    repeats: int = 3  # bench features: rounds

    def validate(self, key: str) -> None:
        check(bool(self.workers) and all(w >= 1 for w in self.workers), f"{key}.workers",
               "must be a non-empty list of worker counts >= 1")
        check(bool(self.algos), f"{key}.algos", "must name at least one method")
        check(self.epochs >= 0, f"{key}.epochs", "must be >= 0 (0: the profile's train.epochs)")
        check(self.pretrain >= 0, f"{key}.pretrain", "must be >= 0")
        check(self.lr_rule in ("tuned", "sqrt", "linear", "none"), f"{key}.lr_rule",
               "must be one of tuned, sqrt, linear, none")
        check(self.profile in ("bench", "config"), f"{key}.profile", "must be bench or config")
        check(self.synth_seconds > 0, f"{key}.synth_seconds", "must be > 0")
        check(self.corpus_hours > 0, f"{key}.corpus_hours", "must be > 0")
        check(0 < self.labeled_share < 1, f"{key}.labeled_share", "must be in (0, 1)")
        check(self.gtc_steps >= 2, f"{key}.gtc_steps", "must be >= 2")
        check(self.overhead_steps >= 0, f"{key}.overhead_steps",
               "must be >= 0 (0: train.block_size + 10)")
        check(self.seq_steps >= 1, f"{key}.seq_steps", "must be >= 1")
        check(self.seconds > 0, f"{key}.seconds", "must be > 0")
        check(self.repeats >= 1, f"{key}.repeats", "must be >= 1")
