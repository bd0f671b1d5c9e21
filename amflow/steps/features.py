"""`amflow features`: log-mel fbank, causal CMN, global CMVN, low frame rate for the run.

Resolves select's shards through the run layout, fans `tasks.features.process_shard` out
over Ray (or, below `ray.inline_hours` of audio, runs it in this process), then publishes
cmvn.json, phones.json and shards.json. With features.labels=align the labels are this
run's `amflow align` outputs (network-tree leaves; context.json holds the tree) instead of
the corpus CTM's phones.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from core.raycluster import map_shards, runs_inline
from core.runs import SUCCESS, StepContext, StepError
from core.config import features_dict
from tasks.features import (LABELED_SPLITS, FeaturesJob, align_label_payloads,
                            alignment_payloads, process_shard, publish)


def _plan(ctx: StepContext) -> tuple[dict[str, Any], dict[str, Any], list[dict], bool]:
    """(the plan, select's summary, select's shard index, whether any shard is labeled)."""
    st, fcfg = ctx.storage, ctx.cfg.features
    select = ctx.require("select")
    index = st.read_json(ctx.other("select", "shards.json"))["shards"]
    # Only labeled splits carry labels: features of unlabeled audio alone (a daily_data
    # interval) need no align step and no CTM, and have no classes (no phones.json).
    labeled = any(e["split"] in LABELED_SPLITS for e in index)
    # Outputs and markers of an earlier attempt are only valid for the same select output
    # and settings; a finished step with the same plan is a no-op.
    plan = {"select_finished_at": select.get("finished_at"),
            "features": {k: v for k, v in features_dict(fcfg).items()
                         if k not in ("io_threads", "batch_seconds")}}
    if fcfg.labels == "align" and labeled:  # labels from this run's align: redo when it reran
        plan["align_finished_at"] = ctx.require("align").get("finished_at")
    return plan, select, index, labeled


def unchanged(ctx: StepContext) -> dict[str, Any] | None:
    """The finished features when their plan (select's output, features.*) is unchanged:
    what `run` would hand back, found without writing anything; None otherwise."""
    try:
        plan = _plan(ctx)[0]
    except (StepError, FileNotFoundError):
        return None
    return ctx.planned_summary(plan)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    st, fcfg = ctx.storage, ctx.cfg.features
    plan, select, index, labeled = _plan(ctx)
    done = ctx.resume_plan(plan)
    if done is not None:
        return done
    if not index:
        if select.get("inputs", {}).get("interval"):  # a day with no audio: an empty partition
            return empty_interval(ctx, select)
        raise StepError("select produced no shards")
    manifests = {e["shard"]: ctx.other("select", "shards", f"{e['shard']}.parquet")
                 for e in index}
    frames: dict[str, dict] | None = None
    if not labeled:
        aligns, errs, inventory = {}, {}, []
    elif fcfg.labels == "align":
        aligns, errs = {}, {}
        frames, inventory = align_label_payloads(st, ctx.other("align"), ctx.step_uri,
                                                 manifests, index)
    else:
        aligns, errs, inventory = alignment_payloads(st, ctx.cfg.data.corpus, ctx.step_uri,
                                                     manifests, index, ctx.force)
    # hierarchical shuffle, level 1: the global order of the shard files
    order = np.random.default_rng(fcfg.seed).permutation(len(index))
    shards = []
    for i in order:
        e = index[int(i)]
        sid = e["shard"]
        shards.append((sid, {"manifest": manifests[sid],
                             "split": e["split"], "align": aligns.get(sid),
                             "ctm_errors": errs.get(sid)}))
        if frames is not None:
            shards[-1][1]["frame_align"] = frames.get(sid, {})
    t0 = time.time()

    def postfix(done: list[dict]) -> dict:
        audio = sum(s["audio_s"] for s in done)
        return {"audio_h": audio / 3600.0, "xRT": audio / max(1e-9, time.time() - t0)}

    job = FeaturesJob(ctx.cfg.storage, fcfg, ctx.step_uri)
    inline = runs_inline(ctx.cfg, select.get("metrics", {}).get("audio_hours"))
    stats = map_shards(ctx, shards, process_shard, job, unit="shards", postfix=postfix,
                       inline=inline)
    metrics, counts, nbytes = publish(st, ctx.step_uri, fcfg, stats, inventory,
                                      [sid for sid, _ in shards], time.time() - ctx.started)
    metrics["executor"] = "inline" if inline else "ray"
    return ctx.finish(inputs={"select": ctx.other("select", SUCCESS),
                              "corpus": ctx.cfg.data.corpus,
                              "select_finished_at": select.get("finished_at")},
                      counts=counts, metrics=metrics, bytes_written=nbytes)


def empty_interval(ctx: StepContext, select: dict[str, Any]) -> dict[str, Any]:
    """The features of a data interval that holds no selected audio: no shards, zero
    counts (the partition exists, and says it is empty)."""
    ctx.storage.write_json(ctx.path("shards.json"), {"order": [], "shards": []})
    return ctx.finish(inputs={"select": ctx.other("select", SUCCESS),
                              "corpus": ctx.cfg.data.corpus,
                              "select_finished_at": select.get("finished_at")},
                      counts={"in": 0, "out": 0, "rejected": 0},
                      metrics={"audio_hours": 0.0, "frames": 0, "rows": 0, "shards": 0,
                               "reject_reasons": {}})
