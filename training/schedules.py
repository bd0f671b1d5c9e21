"""Training schedules: which data passes run, in what mode, at which learning rate.

A training is a list of *passes* grouped into *units*; after each unit the dev set is
scored and the schedule may change the learning rate (newbob) or stop.

- recipe `labeled` (teacher, supervised student): `train.epochs` units of one pass over
  the labeled data each. Chunked BPTT first, full-sequence fine-tuning for the last
  `train.finetune_epochs`. The frame offset rotates per epoch (0, 1, 2, 0, ...).
- recipe `ssl` (scheduled learning, paper V-D): one pass (or `train.unlabeled_passes`)
  over the unlabeled data split into `train.sub_epochs` sub-epochs; each unit is a sub-epoch of unlabeled data (soft
  targets) followed by a CE pass over the labeled data at `labeled_lr_scale` times the
  current rate, with the feature offset rotating per labeled pass. The last
  `finetune_epochs` units run in full-sequence mode.

Learning rates:
- `exponential`: lr(p) = lr * (final_lr / lr) ** p, with p the fraction of the
  (unlabeled, for ssl) training done, updated every minibatch.
- `newbob`: constant within a unit; after a unit whose relative improvement of the dev
  loss (training loss when there is no dev set) is below `newbob_threshold`, the rate
  halves; when it would fall below `min_lr` the chunked phase stops and training moves
  on to the fine-tuning units (or ends, when already fine-tuning).

All state is in `LRSchedule.state_dict()`, so a resumed run continues exactly.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from core.config import TrainConfig
from training.families import get_family


@dataclass(frozen=True)
class PassInfo:
    index: int  # position in the pass list
    unit: int  # epoch (labeled recipe) or sub-epoch (ssl)
    kind: str  # labeled | unlabeled
    mode: str  # chunk | full
    offset: int  # feature frame offset (labeled data only; soft targets use 0)
    sub_epoch: int  # which slice of the unlabeled data (ssl), else 0
    sub_epochs: int  # slices in total (1 for labeled passes)
    lr_scale: float  # multiplier on the scheduled rate
    last_in_unit: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_passes(train_cfg: TrainConfig, stack: int) -> list[PassInfo]:
    """The full static list of passes for `train_cfg.recipe`."""
    tc = train_cfg
    passes: list[PassInfo] = []
    if tc.recipe in ("labeled", "sequence"):  # sequence: the labeled split, another criterion
        units = tc.passes.epochs
        # sequence: finetune_epochs counts the last epochs on whole utterances (the full
        # graph); more than `epochs` means all of them
        finetune = tc.passes.finetune_epochs
        full = min(finetune, units) if tc.recipe == "sequence" else finetune
        whole = get_family(tc.model).whole_utterances  # (the CTC student: transcripts)
        if full > units and not whole:  # whole utterances: every epoch is full-sequence
            raise ValueError(f"train.finetune_epochs ({tc.passes.finetune_epochs}) exceeds "
                             f"train.epochs ({units})")
        # sequence with train.pseudolabels: each epoch first the unlabeled split's kept
        # utterances (amflow/steps/sequence.py: semi-supervised sequence training)
        unlabeled = tc.recipe == "sequence" and bool(tc.pseudolabels)
        for u in range(units):
            # a family trained on whole utterances (the CTC student's targets are whole
            # transcripts): every pass is full-sequence
            mode = "full" if u >= units - full or whole else "chunk"
            if unlabeled:
                passes.append(PassInfo(len(passes), u, "unlabeled", mode, 0, 0, 1, 1.0, False))
            passes.append(PassInfo(len(passes), u, "labeled", mode, u % stack, 0, 1, 1.0, True))
    elif tc.recipe == "ssl":
        # The paper makes one pass over its million hours; a small unlabeled pool may be
        # visited `unlabeled_passes` times, slice after slice.
        subs = tc.passes.sub_epochs
        units = subs * tc.passes.unlabeled_passes
        if tc.passes.finetune_epochs > units:
            raise ValueError(f"train.finetune_epochs ({tc.passes.finetune_epochs}) exceeds "
                             f"train.sub_epochs x train.unlabeled_passes ({units})")
        for u in range(units):
            mode = "full" if u >= units - tc.passes.finetune_epochs else "chunk"
            passes.append(PassInfo(len(passes), u, "unlabeled", mode, 0, u % subs, subs, 1.0,
                                   False))
            passes.append(PassInfo(len(passes), u, "labeled", mode, u % stack, 0, 1,
                                   tc.optim.labeled_lr_scale, True))
    else:
        raise ValueError(f"unknown recipe {tc.recipe!r}")
    return passes


def num_units(passes: list[PassInfo]) -> int:
    return max(p.unit for p in passes) + 1


class LRSchedule:
    """Learning rate per minibatch, newbob decisions per unit, and which pass is next."""

    def __init__(self, train_cfg: TrainConfig, passes: list[PassInfo]):
        # The rates as the config resolved them (core/config: typed, coerced, validated
        # once, with the recipes laid over), read here and nowhere else.
        optim = train_cfg.optim
        self.kind = optim.schedule
        self.lr0 = optim.lr
        self.final_lr = optim.final_lr
        self.min_lr = optim.min_lr
        self.threshold = optim.newbob_threshold
        self.warmup_units = optim.lr_warmup_units
        self.warmup_start = optim.lr_warmup_start
        self.passes = passes
        self.units = num_units(passes)
        self.first_finetune_unit = min((p.unit for p in passes if p.mode == "full"),
                                       default=self.units)
        # mutable state
        self.newbob_lr = self.lr0
        self.prev_metric: float | None = None
        self.halvings = 0
        self.skip_to_unit: int | None = None
        self.stopped = False
        self.history: list[dict[str, Any]] = []

    # -- rates
    def exponential(self, progress: float) -> float:
        progress = min(max(progress, 0.0), 1.0)
        return self.lr0 * (self.final_lr / self.lr0) ** progress

    def warmup(self, position: float) -> float:
        """The warm-up factor at `position` units into training (1 once warmed up)."""
        if self.warmup_units <= 0 or position >= self.warmup_units:
            return 1.0
        return self.warmup_start + (1.0 - self.warmup_start) * position / self.warmup_units

    def lr(self, p: PassInfo, batch: int, num_batches: int) -> float:
        """The rate for minibatch `batch` of `num_batches` in pass `p`."""
        frac = batch / max(num_batches, 1)
        return self._scheduled(p, frac) * self.warmup(p.unit + frac)

    def _scheduled(self, p: PassInfo, frac: float) -> float:
        if self.kind == "newbob":
            return self.newbob_lr * p.lr_scale
        if p.kind == "labeled" and p.lr_scale != 1.0:
            # ssl's labeled pass: constant, at the rate reached at the end of the sub-epoch
            return self.exponential((p.unit + 1) / self.units) * p.lr_scale
        return self.exponential((p.unit + frac) / self.units) * p.lr_scale

    # -- unit boundaries
    def end_unit(self, unit: int, metric: float | None) -> None:
        """Record `metric` (lower is better) after `unit`; may halve the rate or stop."""
        event: dict[str, Any] = {"unit": unit, "metric": metric, "lr": self.newbob_lr}
        if self.kind == "newbob" and metric is not None and math.isfinite(metric):
            if self.prev_metric is not None:
                improvement = (self.prev_metric - metric) / max(abs(self.prev_metric), 1e-12)
                event["improvement"] = improvement
                if improvement < self.threshold:
                    if self.newbob_lr * 0.5 < self.min_lr:
                        event["action"] = "stop"
                        if unit + 1 < self.first_finetune_unit:
                            self.skip_to_unit = self.first_finetune_unit
                        else:
                            self.stopped = True
                    else:
                        self.newbob_lr *= 0.5
                        self.halvings += 1
                        event["action"] = "halve"
            self.prev_metric = metric if self.prev_metric is None else min(self.prev_metric, metric)
        self.history.append(event)

    def next_pass(self, index: int) -> int | None:
        """Index of the pass after `index` (taking newbob's stop into account), or None."""
        if self.stopped:
            return None
        nxt = index + 1
        if self.skip_to_unit is not None:
            while nxt < len(self.passes) and self.passes[nxt].unit < self.skip_to_unit:
                nxt += 1
            self.skip_to_unit = None
        return nxt if nxt < len(self.passes) else None

    # -- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {"newbob_lr": self.newbob_lr, "prev_metric": self.prev_metric,
                "halvings": self.halvings, "skip_to_unit": self.skip_to_unit,
                "stopped": self.stopped, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.newbob_lr = state["newbob_lr"]
        self.prev_metric = state["prev_metric"]
        self.halvings = state["halvings"]
        self.skip_to_unit = state["skip_to_unit"]
        self.stopped = state["stopped"]
        self.history = list(state["history"])
