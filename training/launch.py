"""Training a model from a typed plan: the library behind `amflow train` and `amflow
sequence` (their steps, amflow/steps/train.py and amflow/services/train_plan.py, resolve the
run layout into a `training.plan.WorkerPlan`).

`train` runs a plan on one worker in this process, or with `train.workers` > 1 on Ray Train
through `training.distributed.run_distributed`. `start_from` checks the model a training
starts from against the plan's classes, growing a phone-class model into context-dependent
leaves (training/grow.py); `phone_stage_plan` is train.grow's first stage, one class per
phone; `store_priors` counts the class priors hybrid decoding divides by.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from core.config import Resolved, phone_stage
from core.model_card import ModelCard
from core.outcomes import StepError
from core.senones import ContextTree
from core.storage import Storage, join
from training.checkpoint import load_model
from training.distributed import run_distributed
from training.grow import GrowError, class_phones, leaf_log_shares, output_sources
from training.loop import train_worker
from training.plan import Growth, WorkerPlan
from training.priors import attach_priors, class_counts

log = logging.getLogger(__name__)


def start_from(storage: Storage, plan: WorkerPlan, uri: str) -> tuple[str, Growth | None]:
    """(uri, None) when the model at `uri` has this run's classes; a phone-class model
    starting a run whose classes are context-dependent leaves is grown into them
    (training/grow.py): (uri, its Growth)."""
    cfg = plan.cfg
    num_classes, feat_dim, phones = plan.num_classes, plan.feat_dim, plan.phones
    if not storage.exists(uri):
        hint = (f"(run `amflow train` with train.tag={cfg.train.tag!r} first, or set "
                "train.init_model)" if cfg.train.regime == "sequence" else "")
        raise StepError(f"train.init_model {uri} not found {hint}".rstrip())
    model, meta = load_model(storage, uri)
    card = ModelCard.from_meta(meta, uri)
    if card.kind != cfg.train.model or model.input_dim != feat_dim:
        raise StepError(f"train.init_model {uri} is a {card.kind} with {model.input_dim} "
                        f"input dims; this run trains a {cfg.train.model} on {feat_dim} dims")
    if model.num_classes == num_classes and list(card.phones) == list(phones):
        return uri, None
    if cfg.train.regime == "sequence" or not plan.context:
        raise StepError(f"train.init_model {uri} has {model.num_classes} classes; this run "
                        f"has {num_classes}{' (phones.json)' if phones else ''}: only a "
                        "phone-class model can seed other classes, the leaves of a "
                        "context tree (features.labels=align)")
    try:
        sources = output_sources(class_phones(card.phones, card.context),
                                 class_phones(phones, plan.context))
    except GrowError as exc:
        raise StepError(f"train.init_model {uri}: {exc}") from exc
    # the labeled split's hard labels only: an ssl run's unlabeled top-k targets would be
    # read and decoded on the driver for the same shares
    counts = class_counts(storage, plan.splits["labeled"], num_classes)
    shares = leaf_log_shares(counts, sources)
    log.info("train.init_model %s: %d phone classes grown into %d leaves", uri,
             model.num_classes, num_classes)
    return uri, Growth(tuple(sources), tuple(shares))


# train.grow's phone-class model (its checkpoints, metrics, model.pt, summary.json) lives
# in this sub-dir of the training's dir.
PHONE_STAGE = "phones"


def phone_stage_plan(plan: WorkerPlan) -> WorkerPlan:
    """train.grow's first stage: `plan`'s training with one class per phone (the run's
    tree's `phone_tree()`), each stored leaf label trained on as its phone and each top-k
    target as the teacher's posterior summed per phone, into <train_dir>/phones/, with the
    config the config layer gives that stage (core.config.phone_stage: no phone term)."""
    tree = ContextTree.from_dict(plan.context)
    phones = tree.phone_tree()
    out = join(plan.train_dir, PHONE_STAGE)
    return dataclasses.replace(
        plan, cfg=phone_stage(Resolved(plan.cfg)).config, train_dir=out,
        phones=phones.class_names, num_classes=phones.num_leaves, context=phones.to_dict(),
        label_tree=plan.context,
        launch=dataclasses.replace(plan.launch, storage_path=join(out, "ray"),
                                   name=f"{plan.launch.name}-{PHONE_STAGE}"))


def train(plan: WorkerPlan) -> dict[str, Any]:
    """Run the plan's training: one worker here, or `train.workers` on Ray Train; rank 0's
    summary (metrics, counts, model_uri, ...)."""
    cfg = plan.cfg
    if cfg.train.workers > 1:
        result = run_distributed(train_worker, plan, cfg, plan.launch)
    else:
        result = train_worker(plan)
    if "metrics" not in result:
        raise StepError(f"the training workers returned no summary from rank 0: {result}")
    return result


def store_priors(storage: Storage, plan: WorkerPlan, model_uri: str) -> None:
    """Class priors (for hybrid decoding: posterior / prior) counted over the training
    targets the model saw, stored in model.pt (training/priors.py)."""
    if plan.label_tree:  # train.grow's phone stage: the leaves' counts summed per phone
        tree = ContextTree.from_dict(plan.label_tree)
        leaves = class_counts(storage, plan.training_uris(), tree.num_leaves)
        counts = np.bincount(tree.leaf_center, weights=leaves, minlength=plan.num_classes)
    else:
        counts = class_counts(storage, plan.training_uris(), plan.num_classes)
    attach_priors(storage, model_uri, counts, "training targets")
