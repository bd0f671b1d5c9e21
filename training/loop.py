"""The per-worker training function: `train_worker(plan) -> dict`.

It runs the same way in-process (one worker, no Ray) and inside a Ray Train worker
(`training.distributed.run_distributed`), where torch.distributed is initialised and rank
and world size come from it. Its only input is the frozen `training.plan.WorkerPlan` built
by `training.launch.build_plan` (the typed config, the partitions per split, CMVN,
classes, feature dim, the starting model).

The worker is a `Trainer` with one method per phase (resume, run_pass, train_step, loss,
account, end_pass, log_block, save_checkpoint, finish). Its minibatches come from one
`training.inputs.InputSource`: the stored partitions, or with `train.augment.enabled`
the example servers (`training.example_servers`), which re-render the same worker's
labeled utterances every pass. Its criterion is cross-entropy / distillation (with
context-dependent classes plus `train.phone_weight` x the same on each frame's phone), or with
`train.recipe=sequence` a `training.sequence.SequenceCriterion` (`train.criterion` mmi or
smbr) whose denominator graph every worker estimates alike from the whole labeled split.

Each worker reads its own partitions (`partitions[rank::world]`), trains with
`train.algorithm` (built by `training.algorithms.build_algorithm`), follows the
schedule of `training.schedules`, and checkpoints every `train.checkpoint_every`
minibatches and at every pass end under `<train_dir>/checkpoints/` (model, algorithm and
optimizer state, schedule, data position, metric accumulators, RNG states). On start it
resumes from the latest complete checkpoint, if any, and then ends with the same model as
an uninterrupted run (bitwise on CPU with the same thread count).

Rank 0 writes `metrics/part-*.jsonl` at every checkpoint (so a resumed run has no
duplicate records), then `metrics.jsonl`, `learning_curve.png` and the self-describing
`model.pt` at the end. The return value (rank 0's is the step's summary) holds the final
metrics; see `_summary`.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import time
import typing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from core.config import Config, ModelConfig, TrainConfig, features_dict, replace_train
from core.model_card import context_info
from core.senones import ContextTree, silence_class
from core.progress import Progress
from core.raycluster import init_ray
from core.outcomes import StepError
from core.storage import Storage, join
from training.algorithms import build_algorithm
from training.checkpoint import Checkpointer, load_model, save_model
from training.ctc.data import read_transcripts
from training.ctc.loss import ctc_batch_loss
from training.curves import plot_learning_curve
from training.data import Batch, BatchLoader, Normalizer, PassSpec, SplitIndex, spec_augment
from training.example_servers import ExampleServers, load_clean_sources
from training.families import get_family
from training.grow import grow_output
from training.inputs import InputSource, StoredPartitions, mix_seed
from training.losses import (IGNORE, LossOut, ce_loss, distill_loss, phone_loss, phone_matrix,
                             phone_targets)
from training.models import build_model, num_parameters
from training.threads import torch_threads
from training.plan import WorkerPlan
from training.schedules import LRSchedule, PassInfo, plan_passes
from training.sequence import (NonFiniteSequenceError, SequenceCriterion,
                               pseudolabel_confidences, pseudo_references,
                               split_label_sequences)

log = logging.getLogger(__name__)

# Keys of config.train that do not change the trained model; a resumed run may differ in them.
OPERATIONAL_KEYS = {"checkpoint_every", "prefetch", "log_every", "keep_checkpoints", "threads",
                    "fail_after", "tag", "use_gpu"}
# The presets: each is applied to the train keys of the training it is for (the teacher's
# and the sequence preset when the config loads, grow_preset to train.grow's grown stage),
# so what it changes is in those keys already; as a mapping of its own it would make a
# training it does not apply to differ, e.g. the phone stage when only the grown stage's
# preset changed, or a teacher's checkpoint when only the sequence preset did. Their old
# names (*_recipe), which older fingerprints hold, are left out alike.
RECIPE_KEYS = {"teacher_preset", "ctc_preset", "conformer_ctc_preset", "sequence_preset",
               "grow_preset",
               "teacher_recipe", "ctc_recipe", "sequence_recipe", "grow_recipe"}


class InjectedFailure(RuntimeError):
    """Raised once by `train.fail_after` (fault-injection tests)."""


# ----------------------------------------------------------------- config from a dict
def dataclass_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """A flat config section from a stored dict (a model file's `features`), unknown keys
    ignored: readers of model.pt (evaluate, decode, serve) use it."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v = data[f.name]
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(v, dict):
            v = dataclass_from_dict(tp, v)
        kwargs[f.name] = v
    return cls(**kwargs)


# ----------------------------------------------------------------- torch.distributed helpers
def dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _comm_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def allreduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum/min/max of `values` over all workers (identity with one)."""
    _, world = dist_info()
    if world == 1:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    dist.all_reduce(t, op=ops[op])
    return [float(v) for v in t.cpu().tolist()]


def barrier() -> None:
    if dist_info()[1] > 1:
        dist.barrier()


# ----------------------------------------------------------------- optimizer helpers
def build_optimizer(tc: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if tc.optim.optimizer == "adam":
        return torch.optim.Adam(params, lr=tc.optim.lr)
    if tc.optim.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.optim.lr, momentum=tc.optim.momentum)
    raise ValueError(f"unknown optimizer {tc.optim.optimizer!r}")


class MaxChangeOptimizer:
    """Kaldi-style max-change around a local optimizer: after each local update, the
    change of every parameter tensor is scaled down to at most `max_change` (L2 norm).

    It wraps the optimizer the distributed algorithm steps, so only the local update is
    capped (BMUF's block update and MA's averaging are not). Everything else (param_groups,
    state_dict, zero_grad, ...) is the wrapped optimizer's.
    """

    def __init__(self, inner: torch.optim.Optimizer, max_change: float):
        self.inner = inner
        self.max_change = float(max_change)
        self.params = [p for g in inner.param_groups for p in g["params"]]
        self._before = [torch.empty_like(p) for p in self.params]
        self.capped = 0  # tensors capped, cumulative

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for b, p in zip(self._before, self.params):
            b.copy_(p)
        out = self.inner.step(closure) if closure is not None else self.inner.step()
        deltas = [p - b for p, b in zip(self.params, self._before)]
        norms = torch.stack([d.norm() for d in deltas])
        scale = (self.max_change / norms.clamp_min(1e-30)).clamp_max(1.0)
        for p, b, d, s in zip(self.params, self._before, deltas, scale):
            if s < 1.0:
                p.copy_(b.add_(d, alpha=float(s)))
        self.capped += int((scale < 1.0).sum())
        return out

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups


def set_lr(optimizer: Any, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


# ----------------------------------------------------------------- loss of one minibatch
def batch_logits(model: nn.Module, batch: Any) -> torch.Tensor:
    """The model's outputs on a minibatch (lengths matter to the bidirectional teacher only)."""
    lengths = batch.lengths if getattr(model, "bidirectional", False) else None
    return model(batch.x, lengths)


def batch_loss(model: nn.Module, batch: Any, tc: TrainConfig,
               to_phone: torch.Tensor | None = None) -> LossOut:
    """CE on hard labels or distillation from top-k targets; with `to_phone` (the
    [classes, phones] 0/1 map of `phone_matrix`) plus train.phone_weight x the same
    criterion on phones. A minibatch of transcripts (the CTC student's) is scored by CTC
    (training/ctc/loss.py)."""
    if batch.tokens is not None:
        return ctc_batch_loss(model, batch)
    logits = batch_logits(model, batch)
    fill, temperature = tc.distill.topk_fill, tc.distill.temperature
    if batch.labels is not None:
        out = ce_loss(logits, batch.labels)
    else:
        out = distill_loss(logits, batch.topk_idx, batch.topk_logit, batch.mask,
                           fill=fill, temperature=temperature)
    if to_phone is None or tc.phone_weight == 0:
        return out
    aux = phone_loss(logits, to_phone, batch.labels, batch.topk_idx, batch.topk_logit,
                     batch.mask, fill, temperature)
    return LossOut(out.loss + tc.phone_weight * aux, out.frames, out.correct)


def map_labels(labels: torch.Tensor, label_map: torch.Tensor) -> torch.Tensor:
    """Hard labels read through `label_map` (stored class -> trained class); IGNORE stays."""
    keep = labels != IGNORE
    out = labels.clone()
    out[keep] = label_map[labels[keep]]
    return out


def as_phones(batch: Batch, label_map: torch.Tensor, tc: TrainConfig) -> Batch:
    """train.grow's phone stage: a minibatch of the run's leaves as one of their phones
    (`label_map`: leaf -> phone class): hard labels mapped, top-k targets summed per phone
    (training/losses.py phone_targets)."""
    if batch.labels is not None:
        batch.labels = map_labels(batch.labels, label_map)
    if batch.topk_idx is not None:
        batch.topk_idx, batch.topk_logit = phone_targets(
            batch.topk_idx, batch.topk_logit, label_map, tc.distill.topk_fill,
            tc.distill.temperature)
    return batch


def label_classes(plan: WorkerPlan) -> list[str]:
    """The class names of the stored labels: the plan's classes, or in train.grow's phone
    stage the run's leaves."""
    if plan.label_tree:
        return ContextTree.from_dict(plan.label_tree).class_names
    return list(plan.phones)


@torch.no_grad()
def score_index(model: nn.Module, storage: Storage, index: SplitIndex, norm: Normalizer,
                tc: TrainConfig, stack: int, device: torch.device,
                batch_frames: int = 20000,
                label_map: torch.Tensor | None = None) -> dict[str, float]:
    """Summed loss, frames and correct frames of `model` over `index` (full sequences).
    Scored against hard labels when the index has them (through `label_map` when given),
    else the teacher's best class."""
    if len(index) == 0:
        return {"loss_sum": 0.0, "frames": 0.0, "correct": 0.0}
    was_training = model.training
    model.eval()
    spec = PassSpec(mode="full", offset=0, stack=stack, minibatch_frames=batch_frames,
                    shuffle=False, shuffle_partitions=max(len(index.uris), 1))
    loss_sum = frames = correct = 0.0
    tc1 = replace_train(tc, temperature=1.0)  # scored at T = 1, whatever training's T
    try:
        for b in BatchLoader(storage, index, spec, norm, prefetch=2):
            b = b.to(device)
            if label_map is not None:
                b = as_phones(b, label_map, tc1)
            out = batch_loss(model, b, tc1)
            loss_sum += float(out.loss) * out.frames
            frames += out.frames
            correct += out.correct
    finally:
        model.train(was_training)
    return {"loss_sum": loss_sum, "frames": frames, "correct": correct}


# ----------------------------------------------------------------- metrics
class MetricsLog:
    """Rank 0's metric records, published as one segment per checkpoint."""

    def __init__(self, storage: Storage, train_dir: str, enabled: bool):
        self.storage = storage
        self.dir = join(train_dir, "metrics")
        self.enabled = enabled
        self.pending: list[dict[str, Any]] = []

    def add(self, rec: dict[str, Any]) -> None:
        if self.enabled:
            self.pending.append(rec)

    def flush(self, step: int, seq: int) -> None:
        if self.enabled and self.pending:
            text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.pending)
            self.storage.write_text(join(self.dir, f"part-{step:09d}-{seq:06d}.jsonl"), text)
        self.pending = []

    def drop_after(self, seq: int) -> None:
        """Remove segments flushed after the checkpoint we resume from."""
        if not self.enabled:
            return
        for uri in self.storage.list(self.dir, suffix=".jsonl"):
            if int(uri.rsplit("-", 1)[-1].split(".")[0]) > seq:
                self.storage.delete(uri)

    def records(self) -> list[dict[str, Any]]:
        out = []
        for uri in self.storage.list(self.dir, suffix=".jsonl"):
            out += [json.loads(line) for line in self.storage.read_text(uri).splitlines() if line]
        return out


# ----------------------------------------------------------------- the training state
@dataclass
class TrainState:
    pass_index: int | None = 0
    batch: int = 0  # next minibatch within the pass
    step: int = 0  # minibatches done, all passes
    frames_seen: float = 0.0  # scored frames, all workers
    flushes: int = 0
    block: dict[str, float] = field(default_factory=lambda: _zero_acc())
    unit: dict[str, float] = field(default_factory=lambda: _zero_acc())
    last_dev: dict[str, Any] | None = None
    last_unit_train: dict[str, Any] | None = None
    train_seconds: float = 0.0
    started_step: int = 0


def _zero_acc() -> dict[str, float]:
    return {"loss_sum": 0.0, "frames": 0.0, "correct": 0.0, "steps": 0.0, "compute_s": 0.0,
            "wait_s": 0.0, "wall_s": 0.0}


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


# train.augment keys that only place or pace the example servers (same examples either way).
OPERATIONAL_AUGMENT_KEYS = {"servers", "cpus_per_server", "resources", "inflight"}


def train_fingerprint(tc: TrainConfig) -> dict[str, Any]:
    """The train.* keys that shape the model, flat as the user writes them (the form
    checkpoints have always stored, so earlier checkpoints still resume)."""
    train = {("recipe" if k == "regime" else k): v for k, v in tc.to_flat().items()
             if k not in OPERATIONAL_KEYS and k not in RECIPE_KEYS}  # regime: its stored name
    train["augment"] = {k: v for k, v in train["augment"].items()
                        if k not in OPERATIONAL_AUGMENT_KEYS}
    return train


def plan_fingerprint(plan: WorkerPlan) -> dict[str, Any]:
    """What makes two trainings the same training: a checkpoint resumes, and train.grow's
    finished phone stage is taken, only under the same fingerprint."""
    fp = {"train": train_fingerprint(plan.cfg.train),
          "model": _model_fingerprint(plan.cfg.model, plan.kind), "kind": plan.kind,
          "splits": plan.splits, "num_classes": plan.num_classes, "inputs": plan.inputs}
    if plan.ctc is not None:  # the CTC student's targets: its tokenizer and transcripts
        fp["tokens"] = {"tokenizer": plan.ctc.tokenizer["digest"], "counts": plan.ctc.counts}
    return fp


def grows(tc: TrainConfig) -> bool:
    """Whether `amflow train` trains train.grow's phone stage first: unless a model to
    start from is given (the sequence recipe's always is)."""
    return (tc.grow and tc.recipe != "sequence" and not tc.init_model
            and get_family(tc.model).grows)


def config_fingerprint(cfg: Config, inputs: dict[str, Any]) -> dict[str, Any]:
    """What shapes the model a train step ends with: the train keys, the trained kind's
    model section, with train.grow the grown stage's recipe (its values over the train keys
    train the final model), and the `inputs` it read (training.launch.training_inputs). A
    finished step's _SUCCESS.json holds it; a rerun that differs in it is refused."""
    kind = cfg.train.model
    fp: dict[str, Any] = {"train": train_fingerprint(cfg.train),
                          "model": _model_fingerprint(cfg.model, kind), "inputs": inputs}
    if grows(cfg.train):
        fp["grow_recipe"] = dict(cfg.train.grow_preset)  # the name _SUCCESS.json files hold
    return _as_json(fp)


def _model_fingerprint(model: ModelConfig, kind: str) -> dict[str, Any]:
    section = get_family(kind).config(model)
    return {kind: dataclasses.asdict(section) if section is not None else {},
            "num_classes": model.num_classes}


def _as_json(obj: Any) -> Any:
    """As a JSON file (summary.json, _SUCCESS.json) holds it: tuples read back as lists."""
    return json.loads(json.dumps(obj))


def fingerprint_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The config keys (`train.epochs`, `model.student.hidden`, `inputs.<what>`, `splits`)
    in which two fingerprints (`plan_fingerprint`'s or `config_fingerprint`'s) differ,
    whoever wrote them:
    - a train or model key one side lacks counts as its default (a checkpoint or a step
      written before the key existed);
    - only the trained kind's model section counts (fingerprints once held every kind's);
    - the recipes, which fingerprints once held, are not compared (`RECIPE_KEYS`);
    - inputs are compared only when both sides name them (older ones did not)."""
    saved, current = _as_json(saved), _as_json(current)
    kind = current.get("train", {}).get("model", current.get("kind", "student"))
    defaults = _as_json({"train": train_fingerprint(TrainConfig()),
                         "model": _model_fingerprint(ModelConfig(), kind)})

    def part(fp: dict[str, Any], key: str) -> dict[str, Any]:
        got = fp.get(key, {})
        if key == "train":
            return {k: v for k, v in got.items() if k not in RECIPE_KEYS}
        return {k: got[k] for k in (kind, "num_classes") if k in got}

    diff = []
    for key in ("train", "model"):
        diff += _dict_changes(part(saved, key), part(current, key), defaults[key], key)
    diff = ["train.regime" if d == "train.recipe" else d for d in diff]  # the key's new name
    a, b = saved.get("inputs", {}), current.get("inputs", {})
    diff += [f"inputs.{k}" for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    diff += [("train.grow_preset" if k == "grow_recipe" else k)
             for k in sorted(set(saved) | set(current))
             if k not in ("train", "model", "inputs") and saved.get(k) != current.get(k)]
    return diff


def _dict_changes(a: dict[str, Any], b: dict[str, Any], defaults: dict[str, Any],
                  where: str) -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        x, y, d = a.get(k, defaults.get(k)), b.get(k, defaults.get(k)), defaults.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _dict_changes(x, y, d if isinstance(d, dict) else {}, f"{where}.{k}")
        elif x != y:
            out.append(f"{where}.{k}")
    return out


# ----------------------------------------------------------------- the worker
def train_worker(plan: WorkerPlan) -> dict[str, Any]:
    """Train one worker's share of `plan` (see the module doc); rank 0's result is the
    step's summary."""
    trainer = Trainer(plan)
    try:
        return trainer.run()
    finally:
        trainer.input.close()


class Trainer:
    """One worker's training, phase by phase.

    `__init__` builds the model, optimizer, distributed algorithm, schedule and input
    source (identical initial weights on every rank); `run` resumes, runs the passes and
    finishes. A pass (`run_pass`) is a loop of `train_step` (one minibatch: masking,
    `loss`, backward, algorithm step), `account` (metric accumulators, block records,
    checkpoints, fault injection) and, at its end, `end_pass` (last block record, the
    unit's dev score and schedule decision, the pass-end checkpoint).

    The order of every random draw and every collective call is that of the original
    single-function loop, so a resumed run still ends bitwise equal to an uninterrupted one.
    """

    def __init__(self, plan: WorkerPlan):
        self.plan = plan
        self.cfg = plan.cfg
        self.tc = tc = plan.cfg.train
        self.rank, self.world = dist_info()
        if tc.threads > 0 or self.world == 1:  # Ray Train workers: ray.worker_threads
            threads, why = torch_threads(tc.threads)
            torch.set_num_threads(threads)
            log.info("train: %d torch thread(s) (%s)", threads, why)
        # Denormal floats (a diverging model's saturated LSTM gates produce them) make CPU
        # arithmetic ~10x slower (bench trainers: htm-8 fell to 1.6k frames/s): flush to zero.
        torch.set_flush_denormal(True)
        self.storage = Storage(plan.cfg.storage)
        self.train_dir = plan.train_dir
        self.stack = plan.stack
        self.kind = plan.kind
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if tc.use_gpu and torch.cuda.is_available() else torch.device("cpu"))
        self.t_start = time.time()
        # train.grow's phone stage: the stored leaf labels are trained on as their phones
        self.label_map = (torch.as_tensor(ContextTree.from_dict(plan.label_tree).leaf_center,
                                          device=self.device) if plan.label_tree else None)
        self._build_model()
        self.reference = self._reference_model()
        self._build_data()
        self.criterion = self._build_criterion()
        self.to_phone = self._to_phone()
        self.ckpt = Checkpointer(self.storage, join(self.train_dir, "checkpoints"), self.rank,
                                 self.world, keep=tc.checkpoints.keep_checkpoints, barrier=barrier)
        self.metrics = MetricsLog(self.storage, self.train_dir, enabled=(self.rank == 0))
        self.state = TrainState()
        self.fingerprint = plan_fingerprint(plan)
        self.resumed_from: int | None = None
        self.progress: Progress | None = None
        self.fail_marker = join(self.train_dir, "_fault_injected.json")

    # -- setup
    def _build_model(self) -> None:
        """Model, optimizer and algorithm; seeded so that every rank starts identical."""
        tc, plan = self.tc, self.plan
        torch.manual_seed(tc.seed)
        np.random.seed(tc.seed)
        random.seed(tc.seed)
        if plan.init_model:  # start from a trained model (train.init_model)
            self.model = load_model(self.storage, plan.init_model)[0]
            if plan.grow:
                grow_output(self.model, plan.grow.sources, plan.grow.log_shares)
            self.model = self.model.to(self.device)
        else:
            self.model = build_model(self.kind, plan.feat_dim, plan.num_classes,
                                     self.cfg.model, stack=plan.stack).to(self.device)
        self.model.train()
        self.optimizer = build_optimizer(tc, self.model)
        local_opt: Any = self.optimizer
        if tc.optim.max_change > 0 and tc.algorithm != "ma":  # ma applies max-change itself
            local_opt = MaxChangeOptimizer(self.optimizer, tc.optim.max_change)
        self.algo = build_algorithm(tc, self.model, local_opt, None, world_size=self.world)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _build_data(self) -> None:
        """Passes, schedule, the input source, the dev split and the per-pass step counts."""
        tc, plan = self.tc, self.plan
        self.passes = plan_passes(tc, self.stack)
        self.sched = LRSchedule(tc, self.passes)
        self.norm = Normalizer.from_stats(plan.cmvn, plan.feat_dim)
        # the CTC student's targets: every worker reads the driver's tokenised transcripts
        self.transcripts = (read_transcripts(self.storage, plan.ctc.transcripts_uri)
                            if plan.ctc is not None else None)
        right = tc.batches.chunk_right_context
        if right < 0:
            right = get_family(self.kind).chunk_right_context(self.model, tc.batches)
        self.input = build_input(self, int(right))
        self.pseudo_weight = self._keep_pseudolabeled()
        self.dev_index = None
        if plan.splits.get("dev"):
            full_dev = SplitIndex.load(self.storage, plan.splits["dev"],
                                       "auto" if self.transcripts is None else "tokens",
                                       plan.feat_dim, self.transcripts, self.out_per_row)
            self.dev_index = full_dev.subset(np.arange(len(full_dev)) % self.world == self.rank)
        # Every worker runs the same number of minibatches per pass (sync algorithms need it).
        local_counts = [self.input.num_batches(p) for p in self.passes]
        self.counts = [int(c) for c in allreduce([float(c) for c in local_counts], "min")]
        self.totals = allreduce([float(v) for v in self.input.totals()], "sum")
        if sum(self.counts) == 0:
            hint = (" (train.augment.enabled: the example servers render from clean "
                    "sources; `--set train.augment.enabled=false` trains on the stored audio)"
                    if "no_clean_source" in str(self.input.rejected()) else "")
            raise StepError("no minibatches to train on: every worker's share of the data is "
                            f"empty (rejected: {self.input.rejected()}){hint}")

    def _build_criterion(self) -> Any:
        """The sequence criterion (train.criterion mmi | smbr), or None for CE."""
        if self.tc.sequence.criterion == "ce":
            return None
        t0 = time.perf_counter()
        seqs = split_label_sequences(self.storage, self.plan.splits["labeled"], self.stack)
        # context-dependent classes: each class's phone (sMBR)
        class_phone = (ContextTree.from_dict(self.plan.context).leaf_center
                       if self.plan.context else None)
        crit = SequenceCriterion.from_labels(seqs, self.plan.num_classes, self.tc.sequence,
                                             class_phone)
        self.graph_info = {**crit.graph_size(), "utterances": len(seqs),
                           "build_s": round(time.perf_counter() - t0, 3)}
        log.info("rank %d: %s denominator graph %s", self.rank, self.tc.sequence.criterion,
                 self.graph_info)
        return crit

    def _keep_pseudolabeled(self) -> np.ndarray | None:
        """train.pseudolabels with the sequence recipe: the unlabeled split cut to the
        utterances the pseudolabel step kept, and each one's confidence (the weight of its
        sequence objective), by row of the cut index."""
        tc = self.tc
        if tc.recipe != "sequence" or not self.plan.pseudolabels_dir:
            return None
        conf = pseudolabel_confidences(self.storage, self.plan.pseudolabels_dir)
        index = self.input.indexes["unlabeled"]
        keep = np.array([u in conf for u in index.utt_ids], bool)
        cut = index.subset(keep)  # the others count as rejected (in = out + rejected)
        self.input.indexes["unlabeled"] = dataclasses.replace(
            cut, rejected={**cut.rejected, "not_pseudolabeled": int((~keep).sum())})
        log.info("rank %d: sequence training on %d pseudo-labeled utterances of %d", self.rank,
                 int(keep.sum()), len(keep))
        return np.array([conf[u] for u in index.utt_ids if u in conf], np.float32)

    def _reference_model(self) -> nn.Module | None:
        """train.sequence_kd_weight's reference: a frozen copy of the model the sequence
        training starts from (taken before any checkpoint is resumed), in eval mode."""
        sc = self.tc.sequence
        if sc.criterion == "ce" or not sc.sequence_kd_weight:
            return None
        ref = copy.deepcopy(self.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _to_phone(self) -> torch.Tensor | None:
        """The class -> phone map for train.phone_weight (built once, not per minibatch),
        which needs context-dependent classes."""
        if self.tc.phone_weight == 0 or self.plan.ctc is not None:  # no phones in ctc
            return None
        if not self.plan.context:
            raise StepError("train.phone_weight needs context-dependent classes (the leaves "
                            "of align's tree: features.labels=align); this run's classes are "
                            "phones already")
        leaf_center = ContextTree.from_dict(self.plan.context).leaf_center
        return phone_matrix(torch.as_tensor(leaf_center)).to(self.device)

    @property
    def out_per_row(self) -> float:
        """Model outputs per stored row (the CTC model subsamples the 10 ms frames)."""
        return self.stack / getattr(self.model, "subsampling", self.stack)

    # -- phases
    def run(self) -> dict[str, Any]:
        self.resume()
        total_steps = sum(self.counts)
        if self.rank == 0 and self.plan.progress:
            self.progress = Progress(total_steps, desc=progress_label(self.plan, self.criterion),
                                     unit="minibatches", interval_s=10)
            self.progress.done = min(self.state.step, total_steps)
        while self.state.pass_index is not None:
            self.run_pass(self.passes[self.state.pass_index])
        return self.finish()

    def resume(self) -> None:
        """Continue from the latest complete checkpoint, if any (same training only)."""
        latest = self.ckpt.latest()
        if latest is not None and int(latest.get("world", 1)) != self.world:
            raise StepError(f"{self.train_dir} holds a checkpoint written by "
                            f"{latest.get('world')} workers; this training has {self.world}: "
                            "re-run with --force to start over, or use another train.tag")
        saved = self.ckpt.load(latest) if latest is not None else None
        if saved is not None:
            self._check_fingerprint(saved["fingerprint"])
            self.model.load_state_dict(saved["model"])
            self.algo.load_state_dict(saved["algorithm"])
            self.sched.load_state_dict(saved["schedule"])
            self.state = TrainState(**saved["train"])
            _set_rng_state(saved["rng"])
            self.metrics.drop_after(self.state.flushes)
            self.resumed_from = self.state.step
            log.info("rank %d: resumed from step %d (pass %s, minibatch %d)", self.rank,
                     self.state.step, self.state.pass_index, self.state.batch)
        self.state.started_step = self.state.step

    def _check_fingerprint(self, saved: dict[str, Any]) -> None:
        diff = fingerprint_changes(saved, self.fingerprint)
        if diff:
            raise StepError(f"{self.train_dir} holds a checkpoint of a different training "
                            f"(differs in: {', '.join(diff)}); re-run with --force to "
                            "start over, or use another train.tag")

    def run_pass(self, p: PassInfo) -> None:
        """The minibatches of pass `p` from the current position, then the pass end."""
        s = self.state
        n = self.counts[p.index]
        stream = self.input.open(p, s.batch, n)
        lr = self.sched.lr(p, s.batch, n)
        self._t_last = time.perf_counter()
        self._wait0 = 0.0
        self._pass_wait = self._pass_wall = 0.0
        for batch in stream:
            lr = self.sched.lr(p, s.batch, n)
            set_lr(self.optimizer, lr)
            comm0 = self.algo.comm_seconds
            t0 = time.perf_counter()
            out = self.train_step(p, batch)
            compute_s = (time.perf_counter() - t0) - (self.algo.comm_seconds - comm0)
            self.account(p, out, lr, compute_s, stream.wait_s)
        self.end_pass(p, lr)

    def train_step(self, p: PassInfo, batch: Batch) -> LossOut:
        """One minibatch: masking, loss, backward, clipping, the algorithm's update."""
        tc, s = self.tc, self.state
        if tc.masking.freq_masks or tc.masking.time_masks:
            gen = torch.Generator().manual_seed(_mix(tc.seed, 5, s.step, self.rank))
            m = tc.masking
            batch.x = spec_augment(batch.x, gen, self.stack, m.freq_masks, m.freq_mask_bins,
                                   m.time_masks, m.time_mask_rows)
        batch = batch.to(self.device)
        if self.label_map is not None:
            batch = as_phones(batch, self.label_map, tc)
        self.algo.zero_grad()
        out = self.loss(p, batch)
        if not torch.isfinite(out.loss):
            raise StepError(_nonfinite_msg("loss", float(out.loss.detach()), p, s, self.ckpt))
        out.loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(
            self.params, tc.optim.clip_grad_norm if tc.optim.clip_grad_norm > 0 else math.inf)
        if not torch.isfinite(gnorm):
            raise StepError(_nonfinite_msg("gradient norm", float(gnorm), p, s, self.ckpt))
        self.algo.step(num_frames=out.frames)
        return out

    def loss(self, p: PassInfo, batch: Batch) -> LossOut:
        """The training criterion of one minibatch: frame-level CE or distillation, or
        the sequence criterion (chunks score against the chunk graph, whole utterances
        against the full graph)."""
        if self.criterion is None:
            return batch_loss(self.model, batch, self.tc, self.to_phone)
        logits = batch_logits(self.model, batch)
        where = f"minibatch {self.state.batch} of pass {p.index}"
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = batch_logits(self.reference, batch)
        labels, weights = batch.labels, None
        if labels is None:  # pseudo-labeled utterances: teacher's top-1, confidence-weighted
            labels = pseudo_references(batch.topk_idx, batch.mask)
            weights = torch.as_tensor(self.pseudo_weight[batch.utts], device=logits.device)
        try:
            return self.criterion(logits, labels, chunked=(p.mode == "chunk"),
                                  where=where, ref_logits=ref, weights=weights)
        except NonFiniteSequenceError as exc:
            raise StepError(_nonfinite_msg(f"sequence criterion: {exc}", math.nan, p,
                                           self.state, self.ckpt)) from exc

    def account(self, p: PassInfo, out: LossOut, lr: float, compute_s: float,
                wait_s: float) -> None:
        """After a minibatch: accumulators, progress, block record, checkpoint, fault."""
        tc, s = self.tc, self.state
        loss_v = float(out.loss.detach())
        objective = getattr(out, "objective", None)  # a sequence criterion's, per block
        if objective is not None:
            s.block["objective_sum"] = s.block.get("objective_sum", 0.0) + objective * out.frames
        for acc in (s.block, s.unit):
            acc["loss_sum"] += loss_v * out.frames
            acc["frames"] += out.frames
            acc["correct"] += out.correct
            acc["steps"] += 1
        s.block["compute_s"] += compute_s
        s.block["wait_s"] += wait_s - self._wait0
        self._pass_wait += wait_s - self._wait0
        self._wait0 = wait_s
        now = time.perf_counter()
        s.block["wall_s"] += now - self._t_last
        self._pass_wall += now - self._t_last
        self._t_last = now
        s.batch += 1
        s.step += 1
        s.frames_seen += out.frames * self.world
        if self.progress is not None:
            self.progress.update(1, loss=round(loss_v, 4),
                                 acc=round(out.correct / max(out.frames, 1), 3), lr=lr,
                                 fps=round(s.block["frames"] / max(s.block["wall_s"], 1e-9)))
        if s.step % tc.checkpoints.log_every == 0:
            s.train_seconds += s.block["wall_s"]
            self.log_block(p, lr)
            self._t_last = time.perf_counter()
        if s.step % tc.checkpoints.checkpoint_every == 0:
            self.save_checkpoint()
            self._t_last = time.perf_counter()
        self._maybe_fail()

    def _maybe_fail(self) -> None:
        tc, s = self.tc, self.state
        if (tc.checkpoints.fail_after and s.step == tc.checkpoints.fail_after and self.rank == 0
                and not self.storage.exists(self.fail_marker)):
            self.storage.write_json(self.fail_marker, {"step": s.step, "time": time.time()})
            raise InjectedFailure(f"train.fail_after={tc.checkpoints.fail_after}: injected failure "
                                  f"after minibatch {s.step}")

    def end_pass(self, p: PassInfo, lr: float) -> None:
        """Last block record; at a unit's end its train/dev scores and the schedule's
        decision; then the next pass and a checkpoint."""
        s = self.state
        if s.block["steps"]:
            s.train_seconds += s.block["wall_s"]
            self.log_block(p, lr)
        self.log_input(p)
        if p.last_in_unit:
            self.end_unit(p)
        s.pass_index = self.sched.next_pass(p.index)
        s.batch = 0
        self.save_checkpoint()

    def log_input(self, p: PassInfo) -> None:
        """The input source's record of the pass (example servers: examples/s, cores used
        for augmentation per trainer) with the trainer's input-wait share of step time.
        Stored partitions report nothing (their records stay as they were)."""
        m = self.input.pass_metrics(p)
        if not m:
            return
        wait, wall = allreduce([self._pass_wait, self._pass_wall], "sum")
        self.metrics.add({"kind": "input", "step": self.state.step, "pass": p.index,
                          "unit": p.unit, **m, "input_wait_share": wait / max(wall, 1e-9),
                          "input_wait_s": wait, "step_wall_s": wall,
                          "trainer_examples_per_s": m.get("examples", 0) / max(wall, 1e-9),
                          "time": time.time()})

    def end_unit(self, p: PassInfo) -> None:
        s = self.state
        u_loss, u_frames, u_correct = allreduce(
            [s.unit["loss_sum"], s.unit["frames"], s.unit["correct"]], "sum")
        s.last_unit_train = {"unit": p.unit, "loss": u_loss / max(u_frames, 1.0),
                             "frame_acc": u_correct / max(u_frames, 1.0)}
        s.unit = _zero_acc()
        metric = s.last_unit_train["loss"]
        if self.dev_index is not None:
            s.last_dev = self.dev_metrics(p.unit)
            metric = s.last_dev["loss"]
            self.metrics.add({"kind": "dev", **s.last_dev})
        self.sched.end_unit(p.unit, metric)
        if self.criterion is not None and self.rank == 0:
            self._write_model(epoch_model_uri(self.train_dir, p.unit + 1),
                              {"epoch": p.unit + 1, "dev": s.last_dev})
        self.metrics.add({"kind": "unit", "unit": p.unit, "step": s.step,
                          "frames_seen": s.frames_seen,
                          "train_loss": s.last_unit_train["loss"],
                          "train_frame_acc": s.last_unit_train["frame_acc"],
                          "schedule": self.sched.history[-1], "time": time.time()})

    def dev_metrics(self, unit: int | None) -> dict[str, Any]:
        return _dev_metrics(self.model, self.storage, self.dev_index, self.norm, self.tc,
                            self.stack, self.device, unit, self.state, self.label_map)

    def log_block(self, p: PassInfo, lr: float) -> None:
        """One metrics record over the last block of minibatches, summed over workers."""
        s = self.state
        b = s.block
        loss_sum, frames, correct, wall = allreduce(
            [b["loss_sum"], b["frames"], b["correct"], b["wall_s"]], "sum")
        st = self.algo.stats()
        rec = {"kind": "train", "step": s.step, "pass": p.index, "unit": p.unit,
               "data": p.kind, "mode": p.mode, "offset": p.offset,
               "loss": loss_sum / max(frames, 1.0), "frame_acc": correct / max(frames, 1.0),
               "lr": lr, "frames": frames, "frames_seen": s.frames_seen,
               "frames_per_s": frames / max(b["wall_s"], 1e-9),
               "compute_s": b["compute_s"], "data_wait_s": b["wait_s"],
               "bytes_sent": st.get("bytes_sent", 0), "comm_seconds": st.get("comm_seconds", 0.0),
               "time": time.time()}
        if self.criterion is not None:  # MMI: log p_num - log p_den; sMBR: expected accuracy
            rec[f"{self.tc.sequence.criterion}_objective"] = (
                allreduce([b.get("objective_sum", 0.0)], "sum")[0] / max(frames, 1.0))
        self.metrics.add(rec)
        s.block = _zero_acc()

    def save_checkpoint(self) -> None:
        """Model, algorithm, schedule, position, accumulators and RNG states, per rank;
        rank 0's pending metric records are published with it."""
        s = self.state
        s.flushes += 1
        self.metrics.flush(s.step, s.flushes)
        self.ckpt.save(s.step, {
            "model": self.model.state_dict(), "algorithm": self.algo.state_dict(),
            "schedule": self.sched.state_dict(), "train": dataclasses.asdict(s),
            "rng": _rng_state(), "fingerprint": self.fingerprint},
            extra={"pass_index": s.pass_index, "batch": s.batch})

    def finish(self) -> dict[str, Any]:
        """Final dev score; on rank 0 metrics.jsonl, the learning curve, model.pt and the
        summary."""
        if self.progress is not None:
            self.progress.close()
        self.algo.finalize()
        final_dev = self.dev_metrics(None) if self.dev_index is not None else None
        result: dict[str, Any] = {"rank": self.rank, "world": self.world}
        if self.rank == 0:
            result.update(self._publish(final_dev))
        barrier()
        return result

    def _publish(self, final_dev: dict[str, Any] | None) -> dict[str, Any]:
        s, tc, storage = self.state, self.tc, self.storage
        self.metrics.add({"kind": "final", "step": s.step, "frames_seen": s.frames_seen,
                          **({"dev_loss": final_dev["loss"], "dev_frame_acc": final_dev["frame_acc"]}
                             if final_dev else {}), "time": time.time()})
        s.flushes += 1
        self.metrics.flush(s.step, s.flushes)
        records = self.metrics.records()
        storage.write_text(join(self.train_dir, "metrics.jsonl"),
                           "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        try:
            storage.write_bytes(join(self.train_dir, "learning_curve.png"),
                                plot_learning_curve(records, title=f"{self.kind} ({tc.recipe})"))
        except Exception as exc:  # noqa: BLE001 - a plot never fails a training
            log.warning("learning curve not written: %s", exc)
        summary = _summary(self.plan, self.model, self.algo, s, self.sched, final_dev,
                           self.counts, self.totals, self.resumed_from, records,
                           time.time() - self.t_start)
        if self.criterion is not None:
            summary["metrics"].update(
                _sequence_metrics(tc.sequence.criterion, self.graph_info, records))
        model_uri = join(self.train_dir, "model.pt")
        summary["model_bytes"] = self._write_model(model_uri, summary["metrics"])
        summary["model_uri"] = model_uri
        return summary

    def _write_model(self, uri: str, metrics: dict[str, Any]) -> int:
        """The self-describing model file of the current weights (model.pt, and the
        sequence recipe's per-epoch models that `amflow sequence` chooses among on dev)."""
        tc, plan = self.tc, self.plan
        return save_model(self.storage, uri, self.model, cmvn=plan.cmvn, phones=plan.phones,
                          features=features_dict(self.cfg.features),
                          info={"run_id": plan.run_id, "train_dir": self.train_dir,
                                "recipe": tc.recipe, "algorithm": tc.algorithm,
                                "workers": self.world, "metrics": metrics,
                                **context_info(plan.context),
                                **({"data_window": plan.data_window}
                                   if plan.data_window else {}),
                                **({"tokenizer": plan.ctc.tokenizer}
                                   if plan.ctc is not None else {})})


def epoch_model_uri(train_dir: str, epoch: int) -> str:
    """The sequence recipe's model after `epoch` (1-based) epochs: one candidate of
    `amflow sequence`'s choice on dev (amflow/steps/sequence.py)."""
    return join(train_dir, "epochs", f"epoch-{epoch}.pt")


def input_metrics(inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The example servers' sizing figures over a training's passes: the share of step
    time the trainer waited for input (all passes, and the worst one: the first pass
    starts on a cold pool), what the pool produces per core beside what the trainer
    consumes, and the cores of augmentation a trainer needs at that rate."""
    wait = sum(r.get("input_wait_s", 0.0) for r in inputs)
    wall = sum(r.get("step_wall_s", 0.0) for r in inputs)
    examples = sum(r["examples"] for r in inputs)
    cpu = sum(r["augment_cpu_s"] for r in inputs)
    per_core = examples / max(cpu, 1e-9)
    consumed = examples / max(wall, 1e-9)
    return {"input_wait_share": wait / max(wall, 1e-9),
            "input_wait_share_max_pass": max(r["input_wait_share"] for r in inputs),
            "augment_examples_per_s": float(np.median([r["examples_per_s"] for r in inputs])),
            "augment_examples_per_core_s": per_core,
            "trainer_examples_per_s": consumed,
            "augment_cores": float(np.median([r["augment_cores"] for r in inputs])),
            "augment_cores_needed": consumed / max(per_core, 1e-9),
            "augment_rejects": sum(sum(r["stream_rejects"].values()) for r in inputs)}


def build_input(trainer: Trainer, right: int) -> InputSource:
    """The trainer's input source: the stored partitions of the splits its passes need,
    or, with train.augment.enabled, the example servers re-rendering the same worker's
    share of the labeled split every pass (training/example_servers.py)."""
    t = trainer
    stored = StoredPartitions(t.storage, t.tc, t.plan.splits, {p.kind for p in t.passes},
                              t.rank, t.world, t.plan.feat_dim, t.stack, right, t.norm,
                              t.transcripts, t.out_per_row)
    if not t.tc.augment.enabled:
        return stored
    cfg = t.cfg
    corpus = cfg.data.corpus
    sources = load_clean_sources(t.storage, corpus)
    if not sources:
        raise StepError(f"train.augment.enabled: the corpus {corpus} has no clean sources "
                        "(metadata `clean_audio_uri`, or `clean: true` on a record)")
    if t.tc.augment.servers > 0:  # the pool's actors need Ray (a local one on a laptop)
        init_ray(cfg)
    cc = cfg.corpus
    babble = {"seed": cc.seed, "banks": cc.babble_banks, "language": cc.language}
    return ExampleServers(t.storage, t.tc, cfg.features, stored.indexes["labeled"], sources,
                          t.rank, t.stack, right, t.norm, storage_cfg=cfg.storage,
                          babble=babble, sil_id=silence_class(label_classes(t.plan)),
                          passes=t.passes)


_mix = mix_seed


def _dev_metrics(model, storage, dev_index, norm, tc: TrainConfig, stack, device, unit, state,
                 label_map=None) -> dict:
    s = score_index(model, storage, dev_index, norm, tc, stack, device, label_map=label_map)
    loss_sum, frames, correct = allreduce([s["loss_sum"], s["frames"], s["correct"]], "sum")
    return {"unit": unit, "step": state.step, "frames_seen": state.frames_seen,
            "loss": loss_sum / max(frames, 1.0), "frame_acc": correct / max(frames, 1.0),
            "frames": frames, "time": time.time()}


def progress_label(plan: WorkerPlan, criterion: Any = None) -> str:
    """The progress lines' name: which training, and with train.grow which of its two
    stages (each counts its own minibatches from 0 %, so the restart must say why)."""
    what = f"sequence ({plan.cfg.train.sequence.criterion})" if criterion else "train"
    if plan.label_tree:
        what += f" stage 1/2 (train.grow: {plan.num_classes} phone classes)"
    elif plan.grow is not None:
        what += f" stage 2/2 (train.grow: {plan.num_classes} leaves, from the phone model)"
    return f"{what} {plan.kind}"


def _nonfinite_msg(what: str, value: float, p: PassInfo, state: TrainState,
                   ckpt: Checkpointer) -> str:
    latest = ckpt.latest()
    where = f"checkpoint {latest['name']} (step {latest['step']})" if latest else "no checkpoint"
    return (f"non-finite {what} ({value}) at minibatch {state.batch} of pass {p.index} "
            f"({p.kind} data, {p.mode} mode, unit {p.unit}; global step {state.step + 1}); "
            f"the model was not updated. The last good state is {where}. Lower train.lr, "
            "set train.clip_grad_norm / train.max_change, or check the input features.")


def _sequence_metrics(criterion: str, graph: dict[str, Any], records: list[dict]) -> dict:
    """The criterion, its denominator graph's size and its objective at start and end."""
    key = f"{criterion}_objective"
    obj = [r[key] for r in records if r.get("kind") == "train" and key in r]
    return {"criterion": criterion, "den_states": graph["states"], "den_arcs": graph["arcs"],
            "den_order": graph["order"], "den_build_s": graph["build_s"],
            f"first_{key}": obj[0] if obj else None, f"final_{key}": obj[-1] if obj else None}


def _summary(plan, model, algo, state, sched, final_dev, counts, totals, resumed_from,
             records, wall) -> dict[str, Any]:
    train_recs = [r for r in records if r.get("kind") == "train"]
    fps = [r["frames_per_s"] for r in train_recs if r.get("frames_per_s")]
    frames_total = sum(r["frames"] for r in train_recs)
    compute = sum(r.get("compute_s", 0.0) for r in train_recs)
    metrics: dict[str, Any] = {
        "model": plan.kind, "recipe": plan.cfg.train.recipe,
        "algorithm": plan.cfg.train.algorithm,
        "workers": dist_info()[1], "parameters": num_parameters(model),
        "steps": state.step, "passes": len(counts), "frames_seen": state.frames_seen,
        "train_seconds": round(state.train_seconds, 3),
        "frames_per_s": round(frames_total / max(state.train_seconds, 1e-9), 1)
        if train_recs else 0.0,
        "frames_per_s_median_block": float(np.median(fps)) if fps else 0.0,
        "compute_s_per_minibatch": compute / max(state.step, 1),
        "final_lr": train_recs[-1]["lr"] if train_recs else None,
        "final_train_loss": state.last_unit_train["loss"] if state.last_unit_train else None,
        "final_train_frame_acc": state.last_unit_train["frame_acc"]
        if state.last_unit_train else None,
        "newbob_halvings": sched.halvings, **{f"algo_{k}": v for k, v in algo.stats().items()},
    }
    inputs = [r for r in records if r.get("kind") == "input"]
    if inputs:  # the example servers' passes
        metrics.update(input_metrics(inputs))
    if final_dev is not None:
        metrics["dev_frame_acc"] = final_dev["frame_acc"]
        metrics["dev_loss"] = final_dev["loss"]
        metrics["dev_frames"] = final_dev["frames"]
    rows_in, used, rejected = (int(v) for v in totals)
    return {"metrics": metrics, "counts": {"in": rows_in, "out": used, "rejected": rejected},
            "resumed_from_step": resumed_from, "wall_s": round(wall, 3),
            "minibatches_per_pass": counts}
