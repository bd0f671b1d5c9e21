"""What a model family is: the one interface training, decoding, serving, export and the
cost model use, and the registry of families by name (lhotse's `@register_...` idea).

A family is a class deriving from `ModelFamily`, registered under the name checkpoints
store as their kind (model.pt's spec["kind"], the model card's `kind`) and `train.model`
names. Everything outside `training/families/` asks the family; nothing compares kinds:

    family = get_family(card.kind)        # or family_of(model), or get_family(cfg.train.model)
    model = family.build(input_dim, num_classes, cfg.model, stack)
    family.decoder                        # "hybrid" (H o L o G over senones, with priors)
                                          # or "ctc" (T o L o G / greedy over tokens)
    family.stream_model(model, dtype, device).forward(rows, states)

The built-in families: `student` and `teacher` (training/families/lstm.py), `ctc` (the GRU
CTC student and, with model.ctc.attention_weight > 0, the joint CTC/attention student:
training/families/ctc.py). docs/how-to/add-a-model-family.md adds one.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from core.config.train import MODEL_FAMILIES, TOKEN_FAMILIES
from core.config import ModelConfig

DECODERS = ("hybrid", "ctc")


class ModelFamily:
    """The interface; defaults are what most families share. Methods take the model
    (an nn.Module the family built) rather than reading its internals elsewhere."""

    name = ""  # set by register_family: the kind a checkpoint stores
    decoder = "hybrid"  # DECODERS: which decode, serve and export flow the model goes with
    streams = False  # a streaming step exists: `amflow serve` and the streaming export
    whole_utterances = False  # every training pass is full-sequence (no chunk passes)
    grows = True  # train.grow's phone stage applies (a model over phone classes)
    regimes = ("labeled", "ssl", "sequence")  # the train.regime values it trains with

    @property
    def token_targets(self) -> bool:
        """Its outputs are tokens of transcripts (CTC over characters: trained on
        transcripts, decoded over T o L o G, no frame classes to score), not the frame
        classes of the hybrid decoder (senones, decoded over H o L o G with priors)."""
        return self.decoder == "ctc"

    # ------------------------------------------------------------------ build and save
    def config(self, model_cfg: ModelConfig) -> Any:
        """This family's section of config.model (what the train fingerprint holds)."""
        return getattr(model_cfg, self.name, None)

    def build(self, input_dim: int, num_classes: int, model_cfg: ModelConfig, stack: int = 3
              ) -> nn.Module:
        """A fresh model, sized by config.model (`stack`: features.stack)."""
        raise NotImplementedError

    def spec(self, model: nn.Module) -> dict[str, Any]:
        """What rebuilds `model` (plain JSON types; `kind` and `format` are added)."""
        raise NotImplementedError

    def from_spec(self, spec: dict[str, Any]) -> nn.Module:
        raise NotImplementedError

    # ------------------------------------------------------- timing: rates and context
    def lookahead(self, model: nn.Module) -> int:
        """Output frames of future input a frame's output waits for."""
        return int(getattr(model, "lookahead", 0))

    def subsampling(self, model: nn.Module) -> int:
        """Input rows per output frame (1: the features' rate, 33 Hz)."""
        return 1

    def chunk_right_context(self, model: nn.Module, batches: Any) -> int:
        """Right context of a chunk pass when train.chunk_right_context is < 0 (auto)."""
        return int(batches.chunk_left_context)

    # ------------------------------------------------------------------------- cost
    def num_parameters(self, model: nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())

    def flops_per_frame(self, model: nn.Module) -> int:
        """Floating point operations per output frame: two per weight (multiply, add), as
        every weight of a recurrent or feed-forward model is used once per frame."""
        return 2 * sum(p.numel() for n, p in model.named_parameters() if not n.endswith("bias"))

    # -------------------------------------------------------------- serve and export
    def stream_model(self, model: nn.Module, dtype: torch.dtype, device: str) -> Any:
        """The recognizer's streaming step (serving/recognizer.py's interface):
        `.input_dim`, `.lookahead` (outputs the session drops at an utterance's start and
        pads with zero rows at its end), `.dtype`, `.zero_state()`,
        `.forward(rows, states) -> (log posteriors per stream, states)`, and optionally
        `.utterance_end(state)` for a step that holds its look-ahead itself."""
        raise ValueError(f"a {self.name} model cannot stream")

    def streaming_signature(self, model: nn.Module) -> tuple:
        """What an exported streaming graph must agree with (serving/onnx_runtime.py)."""
        raise ValueError(f"a {self.name} model has no streaming graph")

    def export_graphs(self, model: nn.Module, card: Any) -> dict[str, bytes]:
        """`amflow export`'s ONNX graphs by file name (a hybrid's: model.onnx, the whole
        utterance to log-posteriors; model.streaming.onnx when it streams)."""
        raise ValueError(f"a {self.name} model has no ONNX export")

    def with_chunking(self, spec: dict[str, Any], chunk: int, left_chunks: int
                      ) -> dict[str, Any]:
        """The spec with another eval-mode attention chunking (decode.chunking)."""
        raise ValueError(f"a {self.name} model has no attention chunks: decode.chunking "
                         "takes a Conformer (train.model conformer or conformer_ctc)")

    def ctc_export_module(self, model: nn.Module) -> nn.Module:
        """A CTC model's encoder and CTC output as a traceable module: (x [N, T, D] rows,
        x_lens [N]) -> (log-probabilities [N, T', C], output lengths [N]); the CTC
        export's model.onnx and, behind the in-graph front end, model.sherpa.onnx."""
        raise ValueError(f"a {self.name} model has no CTC output to export")


class TorchStream:
    """A streaming step from a family's pure torch step, for families without a tuned one:
    `step(x [B, T, D], states) -> (logits [B, T, C], states)`, one state tensor per
    stream and name (`zero_state()` -> a list of arrays). Streams are run one at a time,
    so padding never reaches a state."""

    def __init__(self, model: nn.Module, step: Callable, zero_state: Callable,
                 dtype: torch.dtype, device: str, lookahead: int = 0):
        self.model = model.to(device=device, dtype=dtype).eval()
        self.step, self._zero = step, zero_state
        self.dtype, self.device, self.lookahead = dtype, device, lookahead
        self.input_dim = int(model.input_dim)

    def zero_state(self) -> list[np.ndarray]:
        return [np.asarray(t, np.float32) for t in self._zero()]

    def forward(self, rows: list[np.ndarray], states: list) -> tuple[list, list]:
        outs, new = [], []
        with torch.inference_mode():
            for r, s in zip(rows, states):
                x = torch.from_numpy(np.asarray(r, np.float32))[None].to(self.device, self.dtype)
                st = [torch.from_numpy(t).to(self.device, self.dtype) for t in s]
                y, st = self.step(self.model, x, st)
                outs.append(torch.log_softmax(y[0].float(), -1).cpu().numpy())
                new.append([t.float().cpu().numpy() for t in st])
        return outs, new


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(name: str) -> Callable[[type], type]:
    """Class decorator: `@register_family("student")` makes the class the family of that
    name (the kind its checkpoints store, the value of train.model that trains it)."""
    def add(cls: type) -> type:
        if name in _FAMILIES and type(_FAMILIES[name]) is not cls:
            raise ValueError(f"model family {name!r} is registered twice "
                             f"({type(_FAMILIES[name]).__name__}, {cls.__name__})")
        family = cls()
        family.name = name
        if family.decoder not in DECODERS:
            raise ValueError(f"model family {name!r}: decoder {family.decoder!r} is not one "
                             f"of {', '.join(DECODERS)}")
        _FAMILIES[name] = family
        MODEL_FAMILIES.add(name)  # train.model accepts it (core/config/train.py)
        if family.token_targets:  # and validates it as a transcript-trained model
            TOKEN_FAMILIES.add(name)
        return cls
    return add


def get_family(name: str) -> ModelFamily:
    if name not in _FAMILIES:
        raise ValueError(f"unknown model kind {name!r} (model families: "
                         f"{', '.join(sorted(_FAMILIES))})")
    return _FAMILIES[name]


def family_of(model: nn.Module) -> ModelFamily:
    """The family of a model built by one (its class's `kind`)."""
    return get_family(str(getattr(model, "kind", "")))


def family_names() -> list[str]:
    return sorted(_FAMILIES)
