"""The networks: `model.*` (the teacher's and the student's shapes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.errors import check
from core.config.sizes import SIZE_NAMES

@dataclass
class StudentConfig:
    layers: int = 2  # unidirectional LSTM layers
    hidden: int = 128  # LSTM cells per layer
    lookahead: int = 3  # frames of input read before each output (the output is delayed by them)
    dropout: float = 0.0  # on the inputs, between layers and before the output layer

    def validate(self, key: str) -> None:
        check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        check(self.lookahead >= 0, f"{key}.lookahead", "must be >= 0")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class TeacherConfig:
    layers: int = 2  # bidirectional LSTM layers
    hidden: int = 128  # LSTM cells per layer and direction
    dropout: float = 0.0  # between layers

    def validate(self, key: str) -> None:
        check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class CtcConfig:
    """The end-to-end CTC student (train.model: ctc; training/ctc/model.py): DeepSpeech2's
    2-D convolutions over the fbank frames, recurrent layers, a CTC output over tokens."""

    tokens: str = "char"  # output units: char (DS2's characters) or bpe (sentencepiece)
    bpe_vocab: int = 64  # bpe: pieces to learn from the labeled transcripts (about)
    # The defaults are the embedded corpus's size (~0.6 M parameters, ~1 min an epoch of
    # its 27 labeled minutes on one core); DS2's are 32-96 channels, 7 x 1760 units.
    channels: list[int] = field(default_factory=lambda: [16, 16])  # per 2-D convolution
    # Per convolution, over the 10 ms frames: time strides (their product is the output's
    # subsampling: 3 = the 33 Hz of the hybrid student), frequency strides, time kernels.
    time_strides: list[int] = field(default_factory=lambda: [3, 1])  # per convolution
    freq_strides: list[int] = field(default_factory=lambda: [2, 2])  # per convolution, mel bins
    time_kernels: list[int] = field(default_factory=lambda: [7, 3])  # per convolution, frames
    freq_kernel: int = 11  # mel bins each convolution spans
    rnn: str = "gru"  # recurrent cell: gru, lstm or rnn (DS2's simple recurrence)
    layers: int = 3  # recurrent layers, each with sequence-wise BatchNorm on its input
    hidden: int = 128  # units per recurrent layer (per direction)
    bidirectional: bool = False  # true: bidirectional layers (not streamable)
    lookahead: int = 3  # unidirectional: row-convolution future steps (DS2 sec. 3.7)
    dropout: float = 0.0  # between layers and before the output layer
    # Joint CTC/attention (training/ctc/attention.py): > 0 adds an attention decoder over
    # the encoder, trained on (1 - w) x CTC + w x its cross-entropy; decode.ctc_search
    # rescore uses it. 0: the CTC model alone.
    attention_weight: float = 0.0
    decoder_hidden: int = 128  # the attention decoder's GRU units

    def validate(self, key: str) -> None:
        check(self.tokens in ("char", "bpe"), f"{key}.tokens", "must be char or bpe")
        check(0 <= self.attention_weight < 1, f"{key}.attention_weight", "must be in [0, 1)")
        check(self.decoder_hidden >= 1, f"{key}.decoder_hidden", "must be >= 1")
        check(self.bpe_vocab >= 8, f"{key}.bpe_vocab", "must be >= 8")
        n = len(self.channels)
        check(n >= 1 and min(self.channels) >= 1, f"{key}.channels",
              "must be a non-empty list of channel counts >= 1")
        for name in ("time_strides", "freq_strides", "time_kernels"):
            v = getattr(self, name)
            check(len(v) == n and min(v) >= 1, f"{key}.{name}",
                  f"must have one value >= 1 per convolution ({n}, as {key}.channels)")
        check(self.freq_kernel >= 1, f"{key}.freq_kernel", "must be >= 1")
        check(self.rnn in ("gru", "lstm", "rnn"), f"{key}.rnn", "must be gru, lstm or rnn")
        check(self.layers >= 1, f"{key}.layers", "must be >= 1")
        check(self.hidden >= 1, f"{key}.hidden", "must be >= 1")
        check(self.lookahead >= 0, f"{key}.lookahead", "must be >= 0")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class ConformerConfig:
    """The streaming Conformer-style student (train.model: conformer;
    training/families/conformer.py): a causal convolutional front end at the features' 33 Hz,
    Macaron blocks (half feed-forward, rotary self-attention over chunks with a left context,
    causal depthwise convolution, half feed-forward), trained with dynamic chunk sizes (WeNet
    U2) so one model decodes with any chunk. The defaults are the embedded corpus's size."""

    dim: int = 96  # model width (attention, convolution, feed-forward input)
    heads: int = 4  # attention heads; dim / heads must be even (rotary positions)
    layers: int = 4  # Conformer blocks
    ff_mult: int = 4  # feed-forward hidden units = ff_mult x dim
    conv_kernel: int = 15  # causal depthwise convolution, frames (15: 450 ms at 33 Hz)
    frontend_kernel: int = 3  # the front end's causal convolution over the rows, frames
    # decoding and streaming: attention within chunks of this many frames; a chunk's first
    # frame waits for chunk - 1 more (8: 240 ms at 33 Hz)
    chunk: int = 8
    left_chunks: int = 4  # earlier chunks a frame attends to (-1: every earlier frame)
    # training (WeNet U2): per minibatch a random chunking, so one model serves any chunk and
    # whole utterances; false: always chunk / left_chunks
    dynamic_chunks: bool = True
    max_train_chunk: int = 16  # dynamic chunks: the chunk is drawn from 1..max_train_chunk
    # dynamic chunks: the share of minibatches with full context (the rest draw a chunk and
    # a left context from 0..left_chunks, all of it with -1)
    full_context_share: float = 0.5
    dropout: float = 0.1  # in the feed-forward, attention and convolution modules

    def validate(self, key: str) -> None:
        for name in ("dim", "heads", "layers", "ff_mult", "conv_kernel", "frontend_kernel",
                     "chunk", "max_train_chunk"):
            check(getattr(self, name) >= 1, f"{key}.{name}", "must be >= 1")
        check(self.dim % (2 * self.heads) == 0, f"{key}.dim",
              f"must be a multiple of 2 x {key}.heads ({2 * self.heads}): rotary positions "
              "rotate pairs of each head's dimensions")
        check(self.left_chunks >= -1, f"{key}.left_chunks", "must be >= -1 (-1: all)")
        check(0 <= self.full_context_share <= 1, f"{key}.full_context_share",
              "must be in [0, 1]")
        check(0 <= self.dropout < 1, f"{key}.dropout", "must be in [0, 1)")


@dataclass
class ModelConfig:
    # The shapes and training budget that fit the corpus (configs/presets/sizes.yaml, one
    # row per size): auto chooses the row from the corpus's transcribed and untranscribed
    # hours, once per run; small, medium or large names one; none takes no row (the
    # schema's defaults). A key the config or --set gives keeps its value.
    size: str = "auto"
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    ctc: CtcConfig = field(default_factory=CtcConfig)  # the CTC student (train.model: ctc)
    # the streaming Conformer student (train.model: conformer)
    conformer: ConformerConfig = field(default_factory=ConformerConfig)
    # 0 = the run's phone inventory size; a larger number (e.g. 3183 senones) in config.
    num_classes: int = 0

    def validate(self, key: str) -> None:
        check(self.size in SIZE_NAMES, f"{key}.size",
              f"must be one of {', '.join(SIZE_NAMES)}, got {self.size!r}")
