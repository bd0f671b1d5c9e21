"""Checkpoints: the self-describing final model, and resumable training state.

Final model (`<train dir>/model.pt`), a `torch.save` dict that loads with
`weights_only=True` (tensors and plain JSON types only):

    format      "amflow.model/1"
    spec        models.model_spec(model): kind, input_dim, hidden, layers, num_classes,
                lookahead (student), bidirectional
    state_dict  the model weights (CPU tensors)
    cmvn        the run's features/cmvn.json ({count, sum, sumsq}) or None
    phones      the class names, index = class id (features/phones.json)
    features    the features config the model was trained on (config.features as a dict)
    info        run_id, recipe, algorithm, train dir, final metrics ...

`load_model(storage, uri)` returns (model in eval mode, meta = everything but the weights),
so `amflow targets` and `amflow evaluate` need nothing but the URI.

Training state (`<train dir>/checkpoints/`): every rank writes its own file
`ckpt-<step>/rank-<r>.pt` (BMUF local models, GTC residuals, MA replicas differ per rank);
after all ranks have written, rank 0 publishes `latest.json` = {step, name, world}, so a
checkpoint is only visible once it is complete on every rank. Older checkpoints beyond
`keep` are deleted. All writes go through `Storage`, so S3 works the same way.
"""
from __future__ import annotations

import io
import logging
from typing import Any, Callable

import torch
from torch import nn

from core.model_card import ModelCard
from core.storage import Storage, join
from training.models import model_from_spec, model_spec

log = logging.getLogger(__name__)

MODEL_FORMAT = "amflow.model/1"
LATEST = "latest.json"


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes, weights_only: bool = False, map_location: Any = "cpu") -> Any:
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)


def _plain(obj: Any) -> Any:
    """Make `obj` plain JSON-ish types (so the model file loads with weights_only=True)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, torch.Tensor):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def model_payload(model: nn.Module, *, cmvn: dict | None, phones: list[str] | None,
                  features: dict | None, info: dict | None = None) -> dict[str, Any]:
    state = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    return {"format": MODEL_FORMAT, "spec": model_spec(model), "state_dict": state,
            "cmvn": _plain(cmvn), "phones": list(phones or []),
            "features": _plain(features or {}), "info": _plain(info or {})}


def save_model(storage: Storage, uri: str, model: nn.Module, *, cmvn: dict | None,
               phones: list[str] | None, features: dict | None,
               info: dict | None = None) -> int:
    """Publish a self-describing model file atomically; returns its size in bytes."""
    data = to_bytes(model_payload(model, cmvn=cmvn, phones=phones, features=features, info=info))
    storage.write_bytes(uri, data)
    return len(data)


def load_model(storage: Storage, uri: str, map_location: Any = "cpu"
               ) -> tuple[nn.Module, dict[str, Any]]:
    """(model in eval mode, meta) from a `model.pt` URI; meta holds spec, cmvn, phones,
    features and info."""
    return model_from_bytes(storage.read_bytes(uri), uri, map_location)


def model_from_bytes(data: bytes, name: str = "model", map_location: Any = "cpu"
                     ) -> tuple[nn.Module, dict[str, Any]]:
    """`load_model` from a model file's bytes (already read, or sent to a Ray actor)."""
    payload = from_bytes(data, weights_only=True, map_location=map_location)
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{name} is not an amflow model file (format {found!r})")
    model = model_from_spec(payload["spec"])
    model.load_state_dict(payload["state_dict"])
    model.eval()
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return model, meta


def with_chunking(data: bytes, chunking: tuple[int, int] | None) -> bytes:
    """A model file's bytes with another eval-mode attention chunking (decode.chunking as
    core.config.decode.chunking_of gives it; None: unchanged): its family's spec says the
    (chunk, left chunks), the weights stay. Decode and serve load these bytes."""
    if chunking is None:
        return data
    from training.families import get_family

    payload = from_bytes(data, weights_only=True)
    payload["spec"] = get_family(payload["spec"]["kind"]).with_chunking(payload["spec"],
                                                                         *chunking)
    return to_bytes(payload)


def load_model_card(storage: Storage, uri: str, map_location: Any = "cpu"
                    ) -> tuple[nn.Module, ModelCard]:
    """`load_model` with the metadata as a typed `ModelCard` (load_model keeps returning
    the plain dict so its other callers work unchanged)."""
    model, meta = load_model(storage, uri, map_location)
    return model, ModelCard.from_meta(meta, uri)


def card_from_bytes(data: bytes, name: str = "model", map_location: Any = "cpu"
                    ) -> tuple[nn.Module, ModelCard]:
    """`model_from_bytes` with the metadata as a `ModelCard`."""
    model, meta = model_from_bytes(data, name, map_location)
    return model, ModelCard.from_meta(meta, name)


class Checkpointer:
    """Per-rank training checkpoints under `<dir>`, published by a `latest.json`."""

    def __init__(self, storage: Storage, dir_uri: str, rank: int = 0, world: int = 1,
                 keep: int = 2, barrier: Callable[[], None] | None = None):
        self.storage = storage
        self.dir = dir_uri
        self.rank = rank
        self.world = world
        self.keep = max(1, keep)
        self.barrier = barrier or (lambda: None)

    def latest(self) -> dict[str, Any] | None:
        uri = join(self.dir, LATEST)
        return self.storage.read_json(uri) if self.storage.exists(uri) else None

    def load(self, info: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """This rank's state from the latest (or the given) checkpoint, or None."""
        info = info or self.latest()
        if info is None:
            return None
        if int(info.get("world", 1)) != self.world:
            raise ValueError(f"checkpoint {info['name']} was written by {info.get('world')} "
                             f"workers; this training has {self.world}")
        uri = join(self.dir, info["name"], f"rank-{self.rank}.pt")
        return from_bytes(self.storage.read_bytes(uri), weights_only=False)

    def save(self, step: int, state: dict[str, Any], extra: dict[str, Any] | None = None
             ) -> str:
        """Every rank calls this at the same step. Returns the checkpoint name.

        Names are unique per save, not per step: an end-of-pass save can fall on the step
        of a periodic one, and rewriting a published checkpoint's files in place mixes two
        states when a rank dies half-way (rank 0 resumed at minibatch 10 of pass 0, rank 1
        at pass 1: the rehearsal's node loss). Every rank reads the same latest.json (it is
        published before the barrier that ends each save), so they agree on the name."""
        latest = self.latest()
        seq = int(latest.get("seq", 0)) + 1 if latest else 0
        name = f"ckpt-{step:09d}-{seq:06d}"
        self.storage.write_bytes(join(self.dir, name, f"rank-{self.rank}.pt"), to_bytes(state))
        self.barrier()
        if self.rank == 0:
            self.storage.write_json(join(self.dir, LATEST),
                                    {"step": step, "name": name, "seq": seq,
                                     "world": self.world, **(extra or {})})
            self._prune(name)
        self.barrier()
        return name

    def _prune(self, current: str) -> None:
        """Delete checkpoints older than the newest `keep` up to `current`. Newer ones
        (left by an attempt that died before publishing them) are overwritten later."""
        names = sorted({u[len(self.dir) + 1:].split("/", 1)[0]
                        for u in self.storage.list(self.dir, recursive=True)
                        if u[len(self.dir) + 1:].startswith("ckpt-")})
        upto = [n for n in names if n <= current]
        for n in upto[:-self.keep]:
            for u in self.storage.list(join(self.dir, n), recursive=True):
                self.storage.delete(u)
            self.storage.delete_dir(join(self.dir, n))

    def clear(self) -> None:
        """Remove every checkpoint (a forced fresh start)."""
        if self.rank == 0:
            self.storage.delete(join(self.dir, LATEST))
            for u in self.storage.list(self.dir, recursive=True):
                self.storage.delete(u)
        self.barrier()
