"""Everything a decoder needs, resolved in one place: `DecoderAssets`.

    DecoderAssets.load(storage, decode_cfg, model_uri=..., lexicon_uri=..., lm_uri=...,
                       graph_root=...) -> DecoderAssets
        model (eval mode), its bytes and `ModelCard`; the lexicon; the LM's ARPA text; the
        H o L o G graph (H o C o L o G when the card's classes are context-dependent:
        ModelCard.context) in a local directory (cached under graph_root/<key>/, i.e.
        runs/<R>/graph/<key>/); the class priors (log, for posterior / prior scores)

Used by `amflow decode`, `amflow serve` and `amflow bench decode`, so the three assemble
the same decoder. A library: typed inputs (a Storage, Config sections, URIs), no
StepContext; the step modules (amflow/steps/) resolve the run-layout paths.

The acoustic scale has ONE rule (`tuned_acwt`): the acwt `amflow decode` tuned on
decode.tune_split and recorded in its result.json, else decode.acwt[0]. (`amflow serve`
still lets serve.acwt override it: a user key.)
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from core.config import DecodeConfig
from core.model_card import ModelCard
from core.outcomes import StepError
from core.senones import ContextTree, ContextTreeError
from core.storage import join
from decoding import graph as G
from decoding.context import build_cd_graph
from decoding.lexicon import Lexicon, LexiconError, read_lexicon
from decoding.priors import model_counts
from decoding.search import log_priors
from training.checkpoint import card_from_bytes

log = logging.getLogger(__name__)

GRAPH_FILES = ("HLG.fst", "words.txt", "graph.json")


def _read(storage, uri: str, read: Mapping[str, bytes] | None) -> bytes:
    """The object's bytes: those the caller read already (`read`, by URI), else a read."""
    return read[uri] if read and uri in read else storage.read_bytes(uri)


def load_lexicon(storage, uri: str, read: Mapping[str, bytes] | None = None
                 ) -> tuple[Lexicon, str]:
    """(lexicon, its text) from a Kaldi lexicon.txt URI."""
    if not (read and uri in read) and not storage.exists(uri):
        raise StepError(f"no lexicon at {uri}: set data.lexicon to a Kaldi lexicon.txt "
                        "(`amflow corpus` writes one for the embedded corpus)")
    text = _read(storage, uri, read).decode("utf-8")
    try:
        return read_lexicon(text), text
    except LexiconError as exc:
        raise StepError(f"{uri}: {exc}") from exc


def load_lm(storage, uri: str, missing_hint: str, read: Mapping[str, bytes] | None = None
            ) -> str:
    """The ARPA text at `uri`; `missing_hint` says how to make it when it is not there."""
    if not (read and uri in read) and not storage.exists(uri):
        raise StepError(f"no LM at {uri}: {missing_hint}")
    return _read(storage, uri, read).decode("utf-8")


def check_phones(lex: Lexicon, phones: Sequence[str], lex_uri: str, model_uri: str) -> None:
    missing = sorted(lex.phones() - set(phones))
    if missing:
        raise StepError(f"the lexicon {lex_uri} uses phones that the model {model_uri} has "
                        f"no class for: {missing[:20]} (model classes: {len(phones)})")


def _copy_graph(storage, remote: str, local: str) -> None:
    os.makedirs(local, exist_ok=True)
    for n in GRAPH_FILES:
        with open(os.path.join(local, n), "wb") as f:
            f.write(storage.read_bytes(join(remote, n)))


def _build(lex: Lexicon, arpa: str, classes: Sequence[str], sil_prob: float,
           context: dict | None) -> G.DecodingGraph:
    if context:
        tree = ContextTree.from_dict(context)
        if not tree.context_free:
            return build_cd_graph(lex, arpa, tree, sil_prob)
        # one leaf per phone: H o L o G over the leaves' phones, no C (half the states)
        classes = tree.leaf_phone
    return G.build_graph(lex, arpa, classes, sil_prob)


def ensure_graph(storage, graph_root: str, lex: Lexicon | None, lex_text: str, arpa: str,
                 classes: Sequence[str], sil_prob: float,
                 context: dict | None = None,
                 builder: Callable[[], G.DecodingGraph] | None = None) -> tuple[str, dict]:
    """A local directory holding HLG for (lexicon, LM, classes): cached under graph_root.
    With `context` (ModelCard.context) the classes are the network tree's leaves and the
    graph is H o C o L o G (decoding/context.py). `builder`: another graph of these inputs
    (a CTC model's T o L o G, decoding/ctc_graph.py), cached the same way."""
    key_classes = list(classes) + ([json.dumps(context, sort_keys=True)] if context else [])
    key = G.graph_key(lex_text, arpa, key_classes, sil_prob)
    remote = join(graph_root, key)
    local = storage.local_path(remote) or os.path.join(tempfile.gettempdir(), "amflow-graph", key)
    if all(os.path.exists(os.path.join(local, n)) for n in GRAPH_FILES):
        return local, G.read_graph(local).info
    if all(storage.exists(join(remote, n)) for n in GRAPH_FILES):
        _copy_graph(storage, remote, local)
        return local, G.read_graph(local).info
    try:
        graph = builder() if builder else _build(lex, arpa, classes, sil_prob, context)
    except (G.GraphError, ContextTreeError) as exc:
        raise StepError(f"cannot build the decoding graph: {exc}") from exc
    tmp = tempfile.mkdtemp(prefix="amflow-graph-")
    graph.write(tmp)
    for n in GRAPH_FILES:
        with open(os.path.join(tmp, n), "rb") as f:
            storage.write_bytes(join(remote, n), f.read())
    log.info("graph %s: %s", key, graph.info)
    if not storage.local_path(remote):
        # publish into this machine's cache, where the next decode looks first
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with contextlib.suppress(OSError):  # another process published it first
            os.replace(tmp, local)
    shutil.rmtree(tmp, ignore_errors=True)
    return local, graph.info


def tuned_acwt(storage, decode_result_uri: str, default: float) -> tuple[float, str]:
    """The acwt `amflow decode` tuned for this model (its result.json), else `default`
    (decode.acwt[0]); with where it came from."""
    if storage.exists(decode_result_uri):
        return float(storage.read_json(decode_result_uri)["acwt"]), decode_result_uri
    return default, "decode.acwt[0]"


@dataclass
class DecoderAssets:
    model_uri: str
    model_bytes: bytes
    model: Any  # torch nn.Module in eval mode
    card: ModelCard
    lexicon: Lexicon
    lexicon_uri: str
    lm_uri: str
    graph_dir: str  # local directory with GRAPH_FILES
    graph_info: dict
    counts: np.ndarray  # class counts the priors come from
    prior_source: str

    @property
    def phones(self) -> list[str]:
        return list(self.card.phones)

    @property
    def log_prior(self) -> np.ndarray:
        return log_priors(self.counts)

    def graph_bytes(self) -> dict[str, bytes]:
        """The graph files' bytes (shipped to replicas on other nodes: no shared disk)."""
        return {n: open(os.path.join(self.graph_dir, n), "rb").read() for n in GRAPH_FILES}

    @classmethod
    def load(cls, storage, decode_cfg: DecodeConfig, *, model_uri: str, lexicon_uri: str,
             lm_uri: str, graph_root: str, lm_hint: str = "", require: Sequence[str] = (),
             read: Mapping[str, bytes] | None = None) -> "DecoderAssets":
        """Model + card (with the card fields in `require`), lexicon (checked against the
        model's classes), LM, graph, priors. The caller checked that model_uri exists (its
        own message says how to make one). `read`: any of those objects the caller has
        read already (by URI), used instead of a second read."""
        data = _read(storage, model_uri, read)  # once: the card here, the same bytes to actors
        model, card = card_from_bytes(data, model_uri)
        for key in require:
            if not getattr(card, key):
                raise StepError(f"{model_uri} carries no {key}: decode needs a self-describing "
                                "model.pt")
        lex, lex_text = load_lexicon(storage, lexicon_uri, read)
        check_phones(lex, card.base_phones, lexicon_uri, model_uri)
        arpa = load_lm(storage, lm_uri, lm_hint or "set decode.lm to an ARPA file", read)
        graph_dir, info = ensure_graph(storage, graph_root, lex, lex_text, arpa, card.phones,
                                       decode_cfg.sil_prob, card.context)
        try:
            counts, source = model_counts(storage, card, model_uri, len(card.phones))
        except ValueError as exc:
            raise StepError(str(exc)) from exc
        return cls(model_uri, data, model, card, lex, lexicon_uri, lm_uri, graph_dir, info,
                   counts, source)
