"""The training behind `amflow train` and `amflow sequence` (train.regime=sequence): one
run of it resolves the run's inputs (amflow.services.train_plan), trains the plan
(training/launch.py: Ray Train, priors) and closes the train[-<tag>] or sequence[-<tag>]
step folder. Both steps call `run_training`; neither imports the other."""
from __future__ import annotations

import logging
from typing import Any, Callable

from core.config import ConfigError
from core.runs import SUCCESS, StepContext, StepError, rejects_table
from amflow.model_size import size_summary
from amflow.summary_line import budget_line
from amflow.services.train_plan import (build_plan, clear_outputs, cmvn_source,
                                        train_dir_name, train_grown, training_inputs)
from training.families import get_family
from training.launch import store_priors, train
from training.loop import config_fingerprint, fingerprint_changes, grows

log = logging.getLogger(__name__)


def run_training(ctx: StepContext, args: Any = None,
                 after: Callable[[StepContext, Any, dict[str, Any]], dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """`after(ctx, plan, result)`: run once the model and its priors are stored, before the
    step is marked done; its metrics join the step's (`amflow sequence` chooses the epoch
    on dev there)."""
    cfg = ctx.cfg
    tc = cfg.train
    regimes = get_family(tc.model).regimes
    if tc.recipe not in regimes:
        raise ConfigError("train.regime", f"the {tc.model} trains with regime "
                          f"{' or '.join(regimes)}, not {tc.recipe}")
    step = train_dir_name(tc.tag, tc.recipe)
    if ctx.step != step:
        started = ctx.started
        ctx = StepContext(cfg, ctx.run_id, step, force=ctx.force)
        ctx.started = started
    if ctx.force:
        clear_outputs(ctx, keep_phone_stage=grows(tc))
    elif ctx.storage.exists(ctx.path(SUCCESS)):
        return _finished(ctx)
    plan, report = build_plan(ctx, ctx.step_uri)
    log.info("%s: model size %s", ctx.step, size_summary(ctx.storage, cfg, ctx.run_id)["why"])
    if report.get("min_updates"):
        log.info("%s: %s", ctx.step, budget_line(report["min_updates"]))
    grow = grows(tc)
    phone_stage = None
    if grow:
        plan, phone_stage = train_grown(ctx, plan)
    result = train(plan)
    if report["rejects"]:
        ctx.storage.write_parquet(ctx.path("rejects", "rejects.parquet"),
                                  rejects_table(report["rejects"]))
    if plan.ctc is None:  # class priors are for hybrid decoding; a CTC model has none
        store_priors(ctx.storage, plan, result["model_uri"])
    counts = dict(result["counts"])
    metrics = dict(result["metrics"])
    metrics["model_uri"] = result["model_uri"]
    if plan.init_model:
        metrics["init_model"] = plan.init_model
    if after is not None:
        metrics.update(after(ctx, plan, result))
    if grow:
        metrics["grown"] = phone_stage is not None
    if phone_stage is not None:
        first = phone_stage["metrics"]
        metrics["phone_stage_classes"] = phone_stage["classes"]
        metrics.update({f"phone_stage_{k}": first[k] for k in
                        ("dev_frame_acc", "dev_loss", "steps", "train_seconds") if k in first})
    if report.get("min_updates"):  # train.epochs as train.min_updates raised it
        metrics["min_updates"] = report["min_updates"]
    if plan.ctc is not None:
        metrics["tokenizer"] = {k: plan.ctc.tokenizer[k] for k in ("kind", "digest")}
        metrics["tokens"] = len(plan.ctc.tokenizer["symbols"])
        metrics["transcripts"] = plan.ctc.counts
    inputs = {"repartition": ctx.other("repartition"),
              "cmvn": cmvn_source(ctx), "splits": report["splits"]}
    if plan.data_window:  # the daily_data intervals learned from (also in the model card)
        inputs["data_window"] = [i["run_id"] for i in plan.data_window["intervals"]]
    extra = {"model_uri": result["model_uri"], "resumed_from_step": result.get("resumed_from_step"),
             "minibatches_per_pass": result.get("minibatches_per_pass"),
             "config_fingerprint": config_fingerprint(cfg, plan.inputs),
             "model_size": size_summary(ctx.storage, cfg, ctx.run_id)}
    return ctx.finish(inputs=inputs, counts=counts, metrics=metrics,
                      bytes_written=int(result.get("model_bytes", 0)), extra=extra)


def _finished(ctx: StepContext) -> dict[str, Any]:
    """The finished step's summary when this config trains the same model on the same
    inputs; a rerun never hands back a model trained with other settings (operational keys,
    e.g. train.threads, and the recipes of other trainings aside) or on inputs that have
    been made again since (training_inputs)."""
    done = ctx.storage.read_json(ctx.path(SUCCESS))
    saved = done.get("config_fingerprint")
    if saved is None:
        log.warning("%s finished before amflow kept its config in _SUCCESS.json: taken as "
                    "it is, unchecked; use --force to train again", ctx.step_uri)
        return done
    changed = fingerprint_changes(saved, config_fingerprint(ctx.cfg, training_inputs(ctx)))
    if changed:
        raise StepError(f"{ctx.step_uri} finished a different training (differs in: "
                        f"{', '.join(changed)}); re-run with --force to train again, or use "
                        "another train.tag")
    log.info("%s already finished with this config (%s); use --force to train again",
             ctx.step_uri, ctx.path(SUCCESS))
    return done
