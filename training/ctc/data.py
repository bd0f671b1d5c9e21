"""The CTC student's training data: transcripts as token ids beside the stored features.

The features are the repartition step's partitions, as for the hybrid students (the
labeled split; with train.pseudolabels also the unlabeled split); the targets are not
frame labels but each utterance's transcript, tokenised:

    prepare_transcripts(storage, cfg, train_dir, pseudolabels_dir) -> CtcData  (the driver)
        the labeled split's transcripts (corpus metadata `text`) train the tokenizer
        (model.ctc.tokens: char | bpe); those, the dev split's and the kept pseudo-labels
        (train.pseudolabels' pseudolabel step folder, which the app resolves and
        hands in: its labels/*.parquet, kept = true) are
        tokenised into <train_dir>/tokens/transcripts.parquet (utt_id, tokens, source);
        the tokenizer is kept in <train_dir>/tokens/tokenizer.json (and bpe.model), and
        reused as it is when a killed training is re-run
    read_transcripts(storage, uri) -> {utt_id: int32 token ids}   (every worker)

training/ctc/batches.py has what the loader (training/data.py) does with them.

An utterance of the labeled split keeps its own transcript over a pseudo-label.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.config import Config, CtcConfig
from core.outcomes import SUCCESS, StepError
from core.storage import Storage, join
from training.ctc.tokens import Tokenizer, TokenizerError, train_tokenizer

log = logging.getLogger(__name__)

TOKENS_DIR = "tokens"
PSEUDO_COLUMNS = ("utt_id", "text", "kept")


@dataclass(frozen=True)
class CtcData:
    """What the workers of a CTC training read besides the partitions."""

    tokenizer: dict[str, Any]  # Tokenizer.to_dict()
    transcripts_uri: str  # <train_dir>/tokens/transcripts.parquet
    counts: dict[str, int]  # transcripts per source (labeled, dev, pseudo)


def read_pseudolabels(storage: Storage, step_dir: str) -> dict[str, str]:
    """{utt_id: text} of the kept pseudo-labels of a finished pseudolabel step."""
    if not storage.exists(join(step_dir, SUCCESS)):
        raise StepError(f"train.pseudolabels: {step_dir} has no {SUCCESS} (run `amflow "
                        "pseudolabel` for that run first, or clear train.pseudolabels)")
    uris = storage.list(join(step_dir, "labels"), suffix=".parquet")
    if not uris:
        raise StepError(f"train.pseudolabels: {step_dir}/labels holds no *.parquet")
    out: dict[str, str] = {}
    for uri in uris:
        t = storage.read_parquet(uri, columns=list(PSEUDO_COLUMNS))
        t = t.filter(pc.equal(t.column("kept"), True))
        out.update(zip(t.column("utt_id").to_pylist(), t.column("text").to_pylist()))
    return {u: x for u, x in out.items() if x}


def split_texts(storage: Storage, corpus: str, split: str) -> dict[str, str]:
    from tasks.select import records_of_split

    recs, _ = records_of_split(storage, corpus, split)
    return {r.utt_id: r.text for r in recs if r.text}


def _tokenizer(storage: Storage, tok_dir: str, texts: list[str], cfg: CtcConfig) -> Tokenizer:
    """The training's tokenizer: the one kept in `tok_dir` when it was trained the same
    way on the same transcripts (a re-run of a killed training), else trained anew."""
    uri = join(tok_dir, "tokenizer.json")
    trained_with = {"tokens": cfg.tokens, "bpe_vocab": cfg.bpe_vocab,
                    "texts": hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]}
    if storage.exists(uri):
        kept = storage.read_json(uri)
        if kept.get("trained_with") == trained_with:
            return Tokenizer.from_dict(kept)
    try:
        tok = train_tokenizer(texts, cfg.tokens, cfg.bpe_vocab)
    except TokenizerError as exc:
        raise StepError(f"model.ctc.tokens: {exc}") from exc
    storage.write_json(uri, {**tok.to_dict(), "trained_with": trained_with})
    if tok.sp_model:
        storage.write_bytes(join(tok_dir, "bpe.model"), tok.sp_model)
    storage.write_text(join(tok_dir, "tokens.txt"),
                       "".join(f"{s} {i}\n" for i, s in enumerate(tok.symbols)))
    return tok


def prepare_transcripts(storage: Storage, cfg: Config, train_dir: str,
                        pseudolabels_dir: str | None = None) -> CtcData:
    """Tokenizer and tokenised transcripts of a CTC training (see the module doc);
    `pseudolabels_dir`: the folder of the pseudolabel step train.pseudolabels names."""
    tc = cfg.train
    corpus = cfg.data.corpus
    labeled = split_texts(storage, corpus, tc.batches.labeled_split)
    if not labeled:
        raise StepError(f"the corpus {corpus} has no transcripts (`text`) in split "
                        f"'{tc.batches.labeled_split}' for train.model ctc")
    tok_dir = join(train_dir, TOKENS_DIR)
    tok = _tokenizer(storage, tok_dir, [labeled[u] for u in sorted(labeled)], cfg.model.ctc)
    sources: dict[str, dict[str, str]] = {"labeled": labeled}
    if tc.batches.dev_split:
        sources["dev"] = split_texts(storage, corpus, tc.batches.dev_split)
    if tc.pseudolabels:
        if not pseudolabels_dir:
            raise StepError("train.pseudolabels is set, but no pseudolabel step folder was "
                            "handed to prepare_transcripts")
        pseudo = read_pseudolabels(storage, pseudolabels_dir)
        sources["pseudo"] = {u: x for u, x in pseudo.items() if u not in labeled}
    rows: dict[str, tuple[list[int], str]] = {}
    for source, texts in sources.items():
        for u in sorted(texts):
            ids = tok.encode(texts[u])
            if ids and u not in rows:
                rows[u] = (ids, source)
    utts = sorted(rows)
    table = pa.table({"utt_id": utts,
                      "tokens": pa.array([rows[u][0] for u in utts], pa.list_(pa.int32())),
                      "source": [rows[u][1] for u in utts]})
    uri = join(tok_dir, "transcripts.parquet")
    storage.write_parquet(uri, table)
    counts = {s: sum(1 for u in utts if rows[u][1] == s) for s in sources}
    log.info("ctc transcripts: %s, %d %s tokens", counts, tok.num_classes, tok.kind)
    return CtcData(tok.to_dict(), uri, counts)


def read_transcripts(storage: Storage, uri: str) -> dict[str, np.ndarray]:
    t = storage.read_parquet(uri, columns=["utt_id", "tokens"])
    return {u: np.asarray(v, np.int64) for u, v in
            zip(t.column("utt_id").to_pylist(), t.column("tokens").to_pylist())}
