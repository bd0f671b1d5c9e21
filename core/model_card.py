"""What a model file says about itself: the `ModelCard`.

A `model.pt` (training/checkpoint.py) holds the weights and, beside them, everything a
consumer needs to use them: the network's spec, the class names, the CMVN statistics and
the features config it was trained on, the class priors for hybrid decoding, and where it
came from. `ModelCard` is that metadata as one typed object, so readers (targets, evaluate,
decode, serve, bench) ask `card.phones` instead of `meta["phones"]`.

Plain data only (no torch): every layer may import it. On disk it is the same dict the
model file has always held (`to_meta` / `from_meta` round-trip it key for key), so older
model files load unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL_FORMAT = "amflow.model/1"


class ModelCardError(ValueError):
    pass


@dataclass(frozen=True)
class ModelCard:
    spec: dict[str, Any]  # models.model_spec: kind, input_dim, hidden, layers, num_classes, ...
    phones: list[str] = field(default_factory=list)  # class names, index = class id
    cmvn: dict[str, Any] | None = None  # {count, sum, sumsq} of the training features
    features: dict[str, Any] = field(default_factory=dict)  # config.features it was trained on
    info: dict[str, Any] = field(default_factory=dict)  # run_id, recipe, algorithm, metrics ...
    priors: dict[str, Any] | None = None  # {"counts": [...], "source": ...} (decoding/priors.py)

    @property
    def context(self) -> dict[str, Any] | None:
        """The network tree (core.senones.ContextTree's JSON form) when the classes are
        its context-dependent leaves (features.labels=align); None: one class per phone."""
        return self.info.get("context")

    @property
    def base_phones(self) -> list[str]:
        """The phones the classes stand for: the tree's phones with classes, else `phones`."""
        ctx = self.context
        if not ctx:
            return list(self.phones)
        return [ctx["phones"][int(p)] for p in sorted(ctx["roots"], key=int)]

    @property
    def tokenizer(self) -> dict[str, Any] | None:
        """A CTC model's tokenizer (training/ctc/tokens.py Tokenizer.to_dict: kind, symbols,
        digest, the sentencepiece model); None for the hybrid models, whose classes are
        `phones`. A CTC model's `phones` are the tokenizer's symbols (class 0 the blank)."""
        return self.info.get("tokenizer")

    @property
    def kind(self) -> str:
        return str(self.spec["kind"])

    @property
    def input_dim(self) -> int:
        return int(self.spec["input_dim"])

    @property
    def num_classes(self) -> int:
        return int(self.spec["num_classes"])

    @classmethod
    def from_meta(cls, meta: dict[str, Any], name: str = "model") -> "ModelCard":
        """The card of a model file's metadata (everything but `state_dict`)."""
        if not isinstance(meta, dict) or "spec" not in meta:
            raise ModelCardError(f"{name} has no model spec: not an amflow model file")
        return cls(spec=dict(meta["spec"]), phones=list(meta.get("phones") or []),
                   cmvn=meta.get("cmvn"), features=dict(meta.get("features") or {}),
                   info=dict(meta.get("info") or {}), priors=meta.get("priors"))

    def to_meta(self) -> dict[str, Any]:
        """The model file's metadata dict, keys in the order the file has always had."""
        meta: dict[str, Any] = {"format": MODEL_FORMAT, "spec": self.spec, "cmvn": self.cmvn,
                                "phones": list(self.phones), "features": self.features,
                                "info": self.info}
        if self.priors is not None:
            meta["priors"] = self.priors
        return meta

    def require(self, *fields: str, name: str = "model") -> None:
        """A clear error when the card lacks what a consumer needs (e.g. cmvn, phones)."""
        missing = [f for f in fields if not getattr(self, f)]
        if missing:
            raise ModelCardError(f"{name} stores no {', '.join(missing)}: retrain it with this "
                                 f"version of amflow")


def context_info(context: dict[str, Any] | None) -> dict[str, Any]:
    """The `info` entry of a model with context-dependent classes (ModelCard.context);
    nothing for phone classes, so their model files stay as they were."""
    return {"context": context} if context else {}
