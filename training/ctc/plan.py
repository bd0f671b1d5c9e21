"""The CTC student's `WorkerPlan`: what `training.launch.build_plan` resolves for
train.model ctc.

    splits   labeled: the labeled split's partitions, plus with train.pseudolabels the
             unlabeled split's (their rows with a kept pseudo-label train, the rest are
             counted as no_transcript); dev: the dev split's
    classes  the tokenizer's symbols (blank first), not phones.json
    ctc      the tokenizer and the tokenised transcripts (training/ctc/data.py)
"""
from __future__ import annotations

import math
from typing import Any

from core.config import Config
from core.outcomes import SUCCESS, Reject, StepError
from core.storage import Storage, join
from training.ctc.data import prepare_transcripts, read_transcripts
from training.data import SplitIndex, partition_uris
from training.inputs import epoch_minibatches
from training.plan import LaunchSpec, WorkerPlan


def ctc_inputs(storage, cfg: Config, pseudolabels_dir: str | None = None) -> dict[str, Any]:
    """The identity of a CTC training's transcripts (training.launch.training_inputs): the
    corpus's fingerprint and the digest of the summary of the pseudolabel step (its folder:
    `pseudolabels_dir`), so a finished training is not handed back after either was made
    again."""
    from tasks.select import corpus_fingerprint

    out: dict[str, Any] = {"corpus": corpus_fingerprint(storage, cfg.data.corpus)}
    if cfg.train.pseudolabels:
        uri = join(pseudolabels_dir, SUCCESS) if pseudolabels_dir else ""
        out["pseudolabels"] = storage.digest(uri) if uri and storage.exists(uri) else None
    return out


def _split_uris(storage: Storage, repartition_uri: str, name: str, why: str) -> list[str]:
    uris = partition_uris(storage, join(repartition_uri, name))
    if not uris:
        raise StepError(f"train.model ctc{why} needs split '{name}', but "
                        f"{join(repartition_uri, name)} has no part-*.parquet")
    return uris


def build_ctc_plan(storage: Storage, cfg: Config, run_id: str, repartition_uri: str,
                   train_dir: str, cmvn: dict, inputs: dict[str, Any], launch: LaunchSpec,
                   pseudolabels_dir: str | None = None) -> tuple[WorkerPlan, dict[str, Any]]:
    """The CTC student's plan: its transcripts tokenised (kept in `train_dir`; the
    pseudo-labels of the pseudolabel step folder `pseudolabels_dir`), the partitions of
    `repartition_uri`'s splits it trains on, and the data report."""
    tc = cfg.train
    data = prepare_transcripts(storage, cfg, train_dir, pseudolabels_dir)
    transcripts = read_transcripts(storage, data.transcripts_uri)
    out_per_row = cfg.features.stack / math.prod(cfg.model.ctc.time_strides)
    names = [tc.batches.labeled_split] + ([tc.batches.unlabeled_split] if tc.pseudolabels else [])
    report: dict[str, Any] = {"splits": {}, "rejects": [], "transcripts": data.counts}
    labeled: list[str] = []
    indexes: list[SplitIndex] = []  # what an epoch is (train.min_updates)
    feat_dim = None
    for name in names:
        uris = _split_uris(storage, repartition_uri, name,
                           " (train.pseudolabels)" if labeled else "")
        index = SplitIndex.load(storage, uris, "tokens", feat_dim, transcripts, out_per_row)
        feat_dim = feat_dim or index.feat_dim
        labeled += uris
        indexes.append(index)
        report["splits"][name] = {"partitions": len(uris), "rows": index.rows_in,
                                  "usable": len(index), "rejected": index.rejected,
                                  "frames": index.total_frames}
        report["rejects"] += [Reject(u, r, f"split {name}", name) for u, r in index.reject_ids]
    if not report["splits"][tc.batches.labeled_split]["usable"]:
        raise StepError(f"split '{tc.batches.labeled_split}' has no row with a transcript "
                        f"that fits its frames: {report['splits']}")
    if len(labeled) < tc.workers:
        raise StepError(f"{len(labeled)} partitions, fewer than train.workers={tc.workers}: "
                        "re-run repartition for that many workers")
    splits = {"labeled": labeled}
    dev = (partition_uris(storage, join(repartition_uri, tc.batches.dev_split))
           if tc.batches.dev_split else [])
    if dev:
        splits["dev"] = dev
        report["splits"][tc.batches.dev_split] = {"partitions": len(dev)}
    symbols = list(data.tokenizer["symbols"])
    if tc.passes.min_updates > 0:  # what train.min_updates divides by
        report["epoch_minibatches"] = epoch_minibatches(tc, indexes, cfg.features.stack)
    plan = WorkerPlan(cfg=cfg, run_id=run_id, train_dir=train_dir, kind=cfg.train.model,
                      splits=splits, cmvn=cmvn, phones=symbols, num_classes=len(symbols),
                      feat_dim=int(feat_dim or 0), stack=cfg.features.stack, inputs=inputs,
                      launch=launch, ctc=data)
    return plan, report
