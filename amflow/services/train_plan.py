"""The run layout of a training: what `amflow train` and `amflow sequence` read and write,
resolved into the typed `training.plan.WorkerPlan` the library trains (training/launch.py).

Reads   runs/<R>/repartition/<split>/part-*.parquet (labeled, unlabeled, dev splits as
        `train.recipe` needs), runs/<R>/features/cmvn.json and phones.json (or the union's
        repartition/cmvn.json when a window of daily_data partitions is trained on).
Writes  runs/<R>/train[-<tag>]/ (the dir is `train` when `train.tag` is empty):
          model.pt            the self-describing final model (training.checkpoint)
          checkpoints/        resumable per-rank state, latest.json
          metrics/ + metrics.jsonl   per-block records (loss, frame_acc, lr, frames/s,
                              bytes_sent, comm_seconds) and dev scores per epoch
          learning_curve.png
          rejects/rejects.parquet  rows that cannot be trained on, with the reason
          phones/             train.grow's phone-class model (model.pt with priors,
                              checkpoints/, metrics, summary.json), grown into model.pt
          _SUCCESS.json       final metrics (dev frame accuracy when a dev split exists)

The sequence regime (train.regime=sequence) is the same training with a sequence criterion
(train.criterion mmi | smbr, training/sequence.py) on the labeled split, starting from
train.init_model (default: this run's train[-<tag>]/model.pt), into runs/<R>/sequence[-<tag>]/.
The labeled and ssl recipes start from train.init_model when it is set; with train.grow
they train a phone-class model themselves first (`train_grown`). A killed training resumes
from its last checkpoint when re-run; `--force` starts over (`clear_outputs`; a finished
phone stage of the same config and inputs is kept: `_finished_phone_stage`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable

from core.config import Config, Resolved, grown_stage, with_overrides
from core.runs import SUCCESS, Reject, Run, StepContext, StepError, step_dir_name
from core.senones import ContextTree
from core.storage import join
from training.ctc.plan import build_ctc_plan, ctc_inputs
from training.data import SplitIndex, partition_uris
from training.families import get_family
from training.inputs import epoch_minibatches
from training.launch import (PHONE_STAGE, phone_stage_plan, start_from, store_priors, train)
from training.loop import fingerprint_changes, plan_fingerprint
from training.models import resolve_num_classes
from training.plan import Growth, LaunchSpec, WorkerPlan

log = logging.getLogger(__name__)


def train_dir_name(tag: str = "", recipe: str = "labeled") -> str:
    """The training's output dir: train[-<tag>], or sequence[-<tag>] for the sequence
    recipe (which starts from train[-<tag>]'s model)."""
    return step_dir_name("sequence" if recipe == "sequence" else "train", tag)


def model_dir_name(tag: str = "") -> str:
    """The dir of the model that evaluate / decode with `<step>.tag=tag` score by default:
    a tag naming a sequence training (`sequence`, `sequence-<train tag>`) is that dir,
    any other tag is train[-<tag>]."""
    if tag == "sequence" or tag.startswith("sequence-"):
        return tag
    return train_dir_name(tag)


def model_uri(cfg: Config, run_id: str, tag: str | None = None) -> str:
    """Where `amflow train` leaves the final model of `run_id` (tag: train.tag)."""
    tag = cfg.train.tag if tag is None else tag
    return Run(cfg.storage.root, run_id).step(train_dir_name(tag), "model.pt")


def init_model_uri(cfg: Config, run_id: str) -> str:
    """The model a sequence training starts from."""
    return cfg.train.init_model or model_uri(cfg, run_id)


def pseudolabels_dir(cfg: Config) -> str | None:
    """train.pseudolabels: a run id (its pseudolabel step) or the step dir's URI."""
    value = cfg.train.pseudolabels
    if not value:
        return None
    if "/" in value:
        return value.rstrip("/")
    return Run(cfg.storage.root, value).step("pseudolabel")


def _split_kinds(cfg: Config) -> dict[str, str]:
    """{kind: split name} of the training data the recipe needs."""
    tc = cfg.train
    if tc.recipe == "ssl" or (tc.recipe == "sequence" and tc.pseudolabels):
        return {"unlabeled": tc.batches.unlabeled_split, "labeled": tc.batches.labeled_split}
    return {"labeled": tc.batches.labeled_split}


def training_inputs(ctx: StepContext) -> dict[str, Any]:
    """What a training reads besides its config, by identity: when the features (CMVN) and
    the repartition (the examples) it trains on finished, and the digest of the model it
    starts from. A finished training or a checkpoint is taken only for the same inputs: a
    rerun after those steps ran again, or after the model to start from was trained again,
    is told so instead of being handed the old model."""
    st = ctx.storage
    inputs: dict[str, Any] = {f"{step}_finished_at": ctx.finished_at(step)
                              for step in ("features", "repartition")}
    cfg = ctx.cfg
    if cfg.train.recipe == "sequence" or cfg.train.init_model:
        uri = init_model_uri(cfg, ctx.run_id)
        inputs["init_model"] = st.digest(uri) if st.exists(uri) else None
    if get_family(cfg.train.model).token_targets:  # the corpus's transcripts, pseudo-labels
        inputs.update(ctc_inputs(st, cfg, pseudolabels_dir(cfg)))
    elif cfg.train.recipe == "sequence" and cfg.train.pseudolabels:  # its unlabeled references
        uri = join(pseudolabels_dir(cfg), SUCCESS)
        inputs["pseudolabels"] = st.digest(uri) if st.exists(uri) else None
    return inputs


def build_plan(ctx: StepContext, train_dir: str) -> tuple[WorkerPlan, dict[str, Any]]:
    """(the plan for `training.loop.train_worker`, the data report: splits, rejects)."""
    cfg = ctx.cfg
    tc = cfg.train
    ctx.require("repartition")
    storage = ctx.storage
    cmvn_uri = cmvn_source(ctx)
    phones_uri = ctx.other("features", "phones.json")
    cmvn = storage.read_json(cmvn_uri) if storage.exists(cmvn_uri) else None
    if cmvn is None:
        raise StepError(f"{cmvn_uri} not found: the features step writes the global CMVN "
                        "stats the trainer normalises with")
    launch = LaunchSpec(storage_path=join(train_dir, "ray"),
                        name=f"{ctx.run_id}-{train_dir_name(tc.tag, tc.recipe)}-{tc.algorithm}")
    if get_family(tc.model).token_targets:  # the CTC student: transcripts, not phone classes
        plan, report = build_ctc_plan(storage, cfg, ctx.run_id, ctx.other("repartition"),
                                      train_dir, cmvn, training_inputs(ctx), launch,
                                      pseudolabels_dir(cfg))
        budget, report["min_updates"] = with_min_updates(
            cfg, lambda: report["epoch_minibatches"])
        init_model, _ = _init_model(ctx, plan)
        return dataclasses.replace(plan, cfg=budget, init_model=init_model,
                                   data_window=_data_window(ctx)), report
    phones = storage.read_json(phones_uri) if storage.exists(phones_uri) else []
    context_uri = ctx.other("features", "context.json")
    context = storage.read_json(context_uri) if storage.exists(context_uri) else None
    try:
        num_classes = resolve_num_classes(cfg.model, phones, tree_leaves=context is not None)
    except ValueError as exc:
        raise StepError(f"{exc} ({phones_uri})") from exc

    splits: dict[str, list[str]] = {}
    report: dict[str, Any] = {"splits": {}, "rejects": []}
    feat_dim = None
    labeled: list[SplitIndex] = []  # what an epoch is (train.min_updates)
    for kind, name in _split_kinds(cfg).items():
        uris = partition_uris(storage, ctx.other("repartition", name))
        if not uris:
            raise StepError(f"recipe '{tc.recipe}' needs split '{name}', but "
                            f"{ctx.other('repartition', name)} has no part-*.parquet")
        index = SplitIndex.load(storage, uris, "labels" if kind == "labeled" else "topk", feat_dim)
        if len(index) == 0:
            hint = (" (run `amflow targets` before repartition)" if kind == "unlabeled" else "")
            raise StepError(f"split '{name}' has no usable rows{hint}: rejected {index.rejected}")
        feat_dim = index.feat_dim
        labeled += [index] if kind == "labeled" else []
        splits[kind] = uris
        report["splits"][name] = {"partitions": len(uris), "rows": index.rows_in,
                                  "usable": len(index), "rejected": index.rejected,
                                  "frames": index.total_frames}
        report["rejects"] += [Reject(u, r, f"split {name}", name) for u, r in index.reject_ids]
        if len(uris) < tc.workers:
            raise StepError(f"split '{name}' has {len(uris)} partitions, fewer than "
                            f"train.workers={tc.workers}: re-run repartition for that many workers")
    dev_uris = (partition_uris(storage, ctx.other("repartition", tc.batches.dev_split))
                if tc.batches.dev_split else [])
    if dev_uris:
        splits["dev"] = dev_uris
        report["splits"][tc.batches.dev_split] = {"partitions": len(dev_uris)}
    cfg, report["min_updates"] = with_min_updates(
        cfg, lambda: epoch_minibatches(tc, labeled, cfg.features.stack))
    plan = WorkerPlan(
        cfg=cfg, run_id=ctx.run_id, train_dir=train_dir, kind=tc.model, splits=splits,
        cmvn=cmvn, phones=list(phones), num_classes=int(num_classes), feat_dim=int(feat_dim),
        stack=cfg.features.stack, context=context, inputs=training_inputs(ctx),
        data_window=_data_window(ctx), pseudolabels_dir=pseudolabels_dir(cfg),
        launch=launch)
    init_model, grow = _init_model(ctx, plan)
    return dataclasses.replace(plan, init_model=init_model, grow=grow), report


def with_min_updates(cfg: Config, count: Callable[[], int]
                     ) -> tuple[Config, dict[str, Any] | None]:
    """train.min_updates > 0 (the labeled regime): `cfg` with train.epochs raised to
    ceil(min_updates / minibatches of one epoch) when that is more (`count()`: a worker's
    minibatches in one epoch of the labeled data, training.inputs.epoch_minibatches;
    counted only here), so a small labeled set gets as many updates as a larger one; and
    what was derived, for the step's summary (None: off, or another regime: ssl passes and
    sequence epochs are trained as configured)."""
    tc = cfg.train
    wanted = tc.passes.min_updates
    if wanted <= 0 or tc.recipe != "labeled":
        return cfg, None
    per_epoch = max(count(), 1)
    epochs = max(tc.passes.epochs, math.ceil(wanted / per_epoch))
    derived = {"min_updates": wanted, "minibatches_per_epoch": per_epoch,
               "train_epochs": tc.passes.epochs, "epochs": epochs}
    if epochs == tc.passes.epochs:
        return cfg, derived
    return with_overrides(cfg, {"train.epochs": epochs}), derived


def cmvn_source(ctx: StepContext) -> str:
    """The CMVN statistics to normalise with: the union's (repartition/cmvn.json) when the
    run trains on a window of daily_data partitions too, else its features'."""
    union = ctx.other("repartition", "cmvn.json")
    return union if ctx.storage.exists(union) else ctx.other("features", "cmvn.json")


def _data_window(ctx: StepContext) -> dict[str, Any] | None:
    """The daily_data partitions repartition added (repartition/window.json): the model
    card records which intervals, with their digests, the model learned from."""
    uri = ctx.other("repartition", "window.json")
    return ctx.storage.read_json(uri) if ctx.storage.exists(uri) else None


def _init_model(ctx: StepContext, plan: WorkerPlan) -> tuple[str | None, Growth | None]:
    """The model a training starts from, checked against this run's data: the sequence
    recipe's CE model (default: this run's), or `train.init_model` for the labeled and
    ssl recipes."""
    cfg = plan.cfg
    if cfg.train.recipe != "sequence" and not cfg.train.init_model:
        return None, None
    return start_from(ctx.storage, plan, init_model_uri(cfg, ctx.run_id))


def train_grown(ctx: StepContext, plan: WorkerPlan
                ) -> tuple[WorkerPlan, dict[str, Any] | None]:
    """train.grow: train the phone stage (`phone_stage_plan`; kept and not redone once its
    summary.json is written), then (the plan of the grown stage: train.grow_recipe's
    values over the recipe's, starting from the phone model grown into the leaves, the
    phone stage's summary); (plan, None) when the classes are one per phone. The two-run
    way (`train.init_model` = a phone-class run's model) gives the same model: the phone
    tree is what align.nn_senones = the number of phones builds, and the leaves' phones
    are the same frames' phones."""
    if not plan.context or ContextTree.from_dict(plan.context).context_free:
        # a run labelled from a CTM, or a tree without questions (too few frames to split):
        # the classes are phones already, what the phone stage would train
        log.info("train.grow: this run's %d classes are one per phone: nothing to grow, "
                 "trained as they are", plan.num_classes)
        return plan, None
    first = phone_stage_plan(plan)
    summary = _finished_phone_stage(ctx, first)
    if summary is None:
        log.info("train.grow: phone stage, %d phone classes on the labels of %d leaves, "
                 "into %s", first.num_classes, plan.num_classes, first.train_dir)
        result = train(first)
        store_priors(ctx.storage, first, result["model_uri"])
        summary = {"model_uri": result["model_uri"], "classes": first.num_classes,
                   "metrics": result["metrics"], "counts": result["counts"],
                   "fingerprint": plan_fingerprint(first)}
        ctx.storage.write_json(join(first.train_dir, "summary.json"), summary)
    second = dataclasses.replace(plan, cfg=grown_stage(Resolved(plan.cfg)).config)
    uri, growth = start_from(ctx.storage, second, summary["model_uri"])
    return dataclasses.replace(second, init_model=uri, grow=growth), summary


def _finished_phone_stage(ctx: StepContext, first: WorkerPlan) -> dict[str, Any] | None:
    """The summary of train.grow's finished phone stage when it trained `first` (the same
    config and inputs: retraining it would give the same model, so even --force keeps it;
    the grown stage is what a changed grow_recipe retrains). None: it is to be trained,
    after --force cleared what another phone stage left. A different finished one without
    --force is refused, naming what differs."""
    st, summary_uri = ctx.storage, join(first.train_dir, "summary.json")
    if st.exists(summary_uri):
        summary = st.read_json(summary_uri)
        changed = fingerprint_changes(summary.get("fingerprint", {}), plan_fingerprint(first))
        if not changed:
            log.info("train.grow: the phone stage trained with this config on these inputs "
                     "is done (%s)%s", summary_uri, "; kept under --force too (remove "
                     f"{first.train_dir} to train it again)" if ctx.force else "")
            return summary
        if not ctx.force:
            raise StepError(f"{first.train_dir} holds the phone stage of a different "
                            f"training (differs in: {', '.join(changed)}); re-run with "
                            "--force to start over, or use another train.tag")
        log.info("train.grow: the phone stage differs in %s: trained again", ", ".join(changed))
    if ctx.force:
        for uri in st.list(first.train_dir, recursive=True):
            st.delete(uri)
    return None


def clear_outputs(ctx: StepContext, keep_phone_stage: bool = False) -> None:
    """--force: remove a previous training's state and outputs; train.grow's phone stage
    too unless `keep_phone_stage` (a growing training: `_finished_phone_stage` keeps it
    only when it trained the same config on the same inputs)."""
    # tokens: a CTC training's tokenizer and transcripts (training/ctc/data.py)
    subs = ("checkpoints", "metrics", "rejects", "tokens")
    for sub in subs + (() if keep_phone_stage else (PHONE_STAGE,)):
        for uri in ctx.storage.list(ctx.path(sub), recursive=True):
            ctx.storage.delete(uri)
    for name in ("model.pt", "metrics.jsonl", "learning_curve.png", "_fault_injected.json",
                 SUCCESS):
        ctx.storage.delete(ctx.path(name))
