"""The per-worker training function: `train_worker(plan) -> dict`.

It runs the same way in-process (one worker, no Ray) and inside a Ray Train worker
(`training.distributed.run_distributed`), where torch.distributed is initialised and rank
and world size come from it. Its only input is a picklable `plan` dict (built by
`training.launch.build_plan`):

    config       the full config as a dict (Config.to_dict()); train/model/storage/features
                 sections are read
    run_id       the run's id
    train_dir    URI of the output dir (`runs/<R>/train` or `runs/<R>/train-<tag>`)
    kind         "teacher" | "student"
    splits       {"labeled": [partition URIs], "unlabeled": [...], "dev": [...]}
                 (the splits the recipe needs; dev may be empty)
    cmvn         features/cmvn.json ({count, sum, sumsq}) or None
    phones       class names (features/phones.json); may be empty if num_classes is set
    num_classes  output classes
    feat_dim     input feature dim (192 for 64 mel bins stacked 3)
    stack        features.stack (frame offsets rotate over 0..stack-1)
    progress     bool, print progress on rank 0 (default True)

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

from amflow.config import FeaturesConfig, ModelConfig, StorageConfig, TrainConfig
from amflow.progress import Progress
from amflow.runs import StepError
from amflow.storage import Storage, join
from training.checkpoint import Checkpointer, fingerprint_diff, save_model
from training.data import (BatchLoader, Normalizer, PassSpec, SplitIndex, plan_pass,
                           rank_partitions, spec_augment)
from training.losses import LossOut, ce_loss, distill_loss
from training.models import build_model, num_parameters
from training.schedules import LRSchedule, PassInfo, plan_passes

log = logging.getLogger(__name__)

# Keys of config.train that do not change the trained model; a resumed run may differ in them.
OPERATIONAL_KEYS = {"checkpoint_every", "prefetch", "log_every", "keep_checkpoints", "threads",
                    "fail_after", "tag", "use_gpu"}


class InjectedFailure(RuntimeError):
    """Raised once by `train.fail_after` (fault-injection tests)."""


# ----------------------------------------------------------------- config from a dict
def dataclass_from_dict(cls: type, data: dict[str, Any]) -> Any:
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


@dataclass
class WorkerConfig:
    train: TrainConfig
    model: ModelConfig
    storage: StorageConfig
    features: FeaturesConfig
    raw: dict[str, Any]

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> "WorkerConfig":
        c = plan["config"]
        return cls(dataclass_from_dict(TrainConfig, c.get("train", {})),
                   dataclass_from_dict(ModelConfig, c.get("model", {})),
                   dataclass_from_dict(StorageConfig, c.get("storage", {})),
                   dataclass_from_dict(FeaturesConfig, c.get("features", {})), c)


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
    if tc.optimizer == "adam":
        return torch.optim.Adam(params, lr=tc.lr)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, momentum=tc.momentum)
    raise ValueError(f"unknown optimizer {tc.optimizer!r}")


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
def batch_loss(model: nn.Module, batch: Any, tc: TrainConfig) -> LossOut:
    lengths = batch.lengths if getattr(model, "bidirectional", False) else None
    logits = model(batch.x, lengths)
    if batch.labels is not None:
        return ce_loss(logits, batch.labels)
    return distill_loss(logits, batch.topk_idx, batch.topk_logit, batch.mask,
                        fill=tc.topk_fill, temperature=tc.temperature)


@torch.no_grad()
def score_index(model: nn.Module, storage: Storage, index: SplitIndex, norm: Normalizer,
                tc: TrainConfig, stack: int, device: torch.device,
                batch_frames: int = 20000) -> dict[str, float]:
    """Summed loss, frames and correct frames of `model` over `index` (full sequences).
    Scored against hard labels when the index has them, else the teacher's best class."""
    if len(index) == 0:
        return {"loss_sum": 0.0, "frames": 0.0, "correct": 0.0}
    was_training = model.training
    model.eval()
    spec = PassSpec(mode="full", offset=0, stack=stack, minibatch_frames=batch_frames,
                    shuffle=False, shuffle_partitions=max(len(index.uris), 1))
    loss_sum = frames = correct = 0.0
    try:
        for b in BatchLoader(storage, index, spec, norm, prefetch=2):
            b = b.to(device)
            out = batch_loss(model, b, dataclasses.replace(tc, temperature=1.0))
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


def _fingerprint(wc: WorkerConfig, plan: dict[str, Any]) -> dict[str, Any]:
    train = {k: v for k, v in dataclasses.asdict(wc.train).items() if k not in OPERATIONAL_KEYS}
    return {"train": train, "model": dataclasses.asdict(wc.model), "kind": plan["kind"],
            "splits": plan["splits"], "num_classes": plan["num_classes"]}


# ----------------------------------------------------------------- the worker
def train_worker(plan: dict[str, Any]) -> dict[str, Any]:
    wc = WorkerConfig.from_plan(plan)
    tc = wc.train
    rank, world = dist_info()
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    # Denormal floats (a diverging model's saturated LSTM gates produce them) make CPU
    # arithmetic ~10x slower (bench trainers: htm-8 fell to 1.6k frames/s): flush to zero.
    torch.set_flush_denormal(True)
    storage = Storage(wc.storage)
    train_dir = plan["train_dir"]
    stack = int(plan.get("stack", wc.features.stack))
    kind = plan["kind"]
    device = (torch.device("cuda", torch.cuda.current_device())
              if tc.use_gpu and torch.cuda.is_available() else torch.device("cpu"))
    t_start = time.time()

    # -- model, optimizer, algorithm (identical initial weights on every rank)
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    random.seed(tc.seed)
    model = build_model(kind, int(plan["feat_dim"]), int(plan["num_classes"]), wc.model).to(device)
    if plan.get("init_model"):  # start from a given model file (e.g. a shared pre-training)
        from training.checkpoint import load_model

        model.load_state_dict(load_model(storage, plan["init_model"])[0].state_dict())
    model.train()
    optimizer = build_optimizer(tc, model)
    local_opt: Any = optimizer
    if tc.max_change > 0 and tc.algorithm != "ma":  # ma applies max-change itself
        local_opt = MaxChangeOptimizer(optimizer, tc.max_change)
    from training.algorithms import build_algorithm

    algo = build_algorithm(tc, model, local_opt, None, world_size=world)
    params = [p for p in model.parameters() if p.requires_grad]

    # -- data
    passes = plan_passes(tc, stack)
    sched = LRSchedule(tc, passes)
    norm = Normalizer.from_stats(plan.get("cmvn"), int(plan["feat_dim"]))
    splits = plan["splits"]
    kinds_needed = {p.kind for p in passes}
    indexes: dict[str, SplitIndex] = {}
    split_names = {"labeled": tc.labeled_split, "unlabeled": tc.unlabeled_split}
    for k in sorted(kinds_needed):
        uris = splits.get(k) or []
        if not uris:
            raise StepError(f"recipe '{tc.recipe}' needs the '{split_names[k]}' split, "
                            "which has no partitions")
        mine = rank_partitions(uris, rank, world, split_names[k])
        indexes[k] = SplitIndex.load(storage, mine, "labels" if k == "labeled" else "topk",
                                     int(plan["feat_dim"]))
    dev_index = None
    if splits.get("dev"):
        full_dev = SplitIndex.load(storage, splits["dev"], "auto", int(plan["feat_dim"]))
        dev_index = full_dev.subset(np.arange(len(full_dev)) % world == rank)
    right = tc.chunk_right_context
    if right < 0:
        right = getattr(model, "lookahead", None) if kind == "student" else tc.chunk_left_context

    def spec_for(p: PassInfo) -> PassSpec:
        if p.kind == "unlabeled":
            order_seed, span = (tc.seed, 1, rank), (p.sub_epoch / p.sub_epochs,
                                                    (p.sub_epoch + 1) / p.sub_epochs)
        else:
            order_seed, span = (tc.seed, 2, p.index, rank), (0.0, 1.0)
        return PassSpec(mode=p.mode, offset=p.offset if p.kind == "labeled" else 0, stack=stack,
                        chunk_frames=tc.chunk_frames, left_context=tc.chunk_left_context,
                        right_context=int(right), minibatch_frames=tc.minibatch_frames,
                        shuffle=True, shuffle_partitions=tc.shuffle_partitions,
                        seed=_mix(tc.seed, 3, p.index, rank), order_seed=_mix(*order_seed),
                        span=span)

    # Every worker runs the same number of minibatches per pass (sync algorithms need it).
    local_counts = [plan_pass(indexes[p.kind], spec_for(p)).num_batches for p in passes]
    counts = [int(c) for c in allreduce([float(c) for c in local_counts], "min")]
    totals = allreduce([sum(ix.rows_in for ix in indexes.values()),
                        sum(len(ix) for ix in indexes.values()),
                        sum(ix.num_rejected for ix in indexes.values())], "sum")
    if sum(counts) == 0:
        raise StepError("no minibatches to train on: every worker's share of the data is "
                        f"empty (rejected: { {k: ix.rejected for k, ix in indexes.items()} })")

    # -- resume
    ckpt = Checkpointer(storage, join(train_dir, "checkpoints"), rank, world,
                        keep=tc.keep_checkpoints, barrier=barrier)
    metrics = MetricsLog(storage, train_dir, enabled=(rank == 0))
    state = TrainState()
    fingerprint = _fingerprint(wc, plan)
    latest = ckpt.latest()
    if latest is not None and int(latest.get("world", 1)) != world:
        raise StepError(f"{train_dir} holds a checkpoint written by {latest.get('world')} "
                        f"workers; this training has {world}: re-run with --force to start "
                        "over, or use another train.tag")
    saved = ckpt.load(latest) if latest is not None else None
    resumed_from = None
    if saved is not None:
        diff = fingerprint_diff(saved["fingerprint"], fingerprint)
        if diff:
            raise StepError(f"{train_dir} holds a checkpoint of a different training "
                            f"(differs in: {diff}); re-run with --force to "
                            "start over, or use another train.tag")
        model.load_state_dict(saved["model"])
        algo.load_state_dict(saved["algorithm"])
        sched.load_state_dict(saved["schedule"])
        state = TrainState(**saved["train"])
        _set_rng_state(saved["rng"])
        metrics.drop_after(state.flushes)
        resumed_from = state.step
        log.info("rank %d: resumed from step %d (pass %s, minibatch %d)", rank, state.step,
                 state.pass_index, state.batch)
    state.started_step = state.step

    def save_checkpoint() -> None:
        state.flushes += 1
        metrics.flush(state.step, state.flushes)
        ckpt.save(state.step, {
            "model": model.state_dict(), "algorithm": algo.state_dict(),
            "schedule": sched.state_dict(), "train": dataclasses.asdict(state),
            "rng": _rng_state(), "fingerprint": fingerprint},
            extra={"pass_index": state.pass_index, "batch": state.batch})

    total_steps = sum(counts)
    progress = (Progress(total_steps, desc=f"train {kind}", unit="minibatches", interval_s=10)
                if rank == 0 and plan.get("progress", True) else None)
    if progress is not None:
        progress.done = min(state.step, total_steps)
    fail_marker = join(train_dir, "_fault_injected.json")

    def log_block(p: PassInfo, lr: float) -> None:
        b = state.block
        loss_sum, frames, correct, wall = allreduce(
            [b["loss_sum"], b["frames"], b["correct"], b["wall_s"]], "sum")
        st = algo.stats()
        rec = {"kind": "train", "step": state.step, "pass": p.index, "unit": p.unit,
               "data": p.kind, "mode": p.mode, "offset": p.offset,
               "loss": loss_sum / max(frames, 1.0), "frame_acc": correct / max(frames, 1.0),
               "lr": lr, "frames": frames, "frames_seen": state.frames_seen,
               "frames_per_s": frames / max(b["wall_s"], 1e-9),
               "compute_s": b["compute_s"], "data_wait_s": b["wait_s"],
               "bytes_sent": st.get("bytes_sent", 0), "comm_seconds": st.get("comm_seconds", 0.0),
               "time": time.time()}
        metrics.add(rec)
        state.block = _zero_acc()

    # -- the passes
    while state.pass_index is not None:
        p = passes[state.pass_index]
        n = counts[p.index]
        loader = BatchLoader(storage, indexes[p.kind], spec_for(p), norm, start=state.batch,
                             prefetch=tc.prefetch)
        loader.set_limit(n)
        lr = sched.lr(p, state.batch, n)
        t_last = time.perf_counter()
        wait0 = 0.0
        for batch in loader:
            lr = sched.lr(p, state.batch, n)
            set_lr(optimizer, lr)
            comm0 = algo.comm_seconds
            t0 = time.perf_counter()
            if tc.freq_masks or tc.time_masks:
                gen = torch.Generator().manual_seed(_mix(tc.seed, 5, state.step, rank))
                batch.x = spec_augment(batch.x, gen, stack, tc.freq_masks, tc.freq_mask_bins,
                                       tc.time_masks, tc.time_mask_rows)
            batch = batch.to(device)
            algo.zero_grad()
            out = batch_loss(model, batch, tc)
            if not torch.isfinite(out.loss):
                raise StepError(_nonfinite_msg("loss", float(out.loss.detach()), p, state, ckpt))
            out.loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(
                params, tc.clip_grad_norm if tc.clip_grad_norm > 0 else math.inf)
            if not torch.isfinite(gnorm):
                raise StepError(_nonfinite_msg("gradient norm", float(gnorm), p, state, ckpt))
            algo.step(num_frames=out.frames)
            t1 = time.perf_counter()
            loss_v = float(out.loss.detach())
            for acc in (state.block, state.unit):
                acc["loss_sum"] += loss_v * out.frames
                acc["frames"] += out.frames
                acc["correct"] += out.correct
                acc["steps"] += 1
            state.block["compute_s"] += (t1 - t0) - (algo.comm_seconds - comm0)
            state.block["wait_s"] += loader.wait_s - wait0
            wait0 = loader.wait_s
            now = time.perf_counter()
            state.block["wall_s"] += now - t_last
            t_last = now
            state.batch += 1
            state.step += 1
            state.frames_seen += out.frames * world
            if progress is not None:
                progress.update(1, loss=round(loss_v, 4),
                                acc=round(out.correct / max(out.frames, 1), 3), lr=lr,
                                fps=round(state.block["frames"] / max(state.block["wall_s"], 1e-9)))
            if state.step % tc.log_every == 0:
                state.train_seconds += state.block["wall_s"]
                log_block(p, lr)
                t_last = time.perf_counter()
            if state.step % tc.checkpoint_every == 0:
                save_checkpoint()
                t_last = time.perf_counter()
            if (tc.fail_after and state.step == tc.fail_after and rank == 0
                    and not storage.exists(fail_marker)):
                storage.write_json(fail_marker, {"step": state.step, "time": time.time()})
                raise InjectedFailure(f"train.fail_after={tc.fail_after}: injected failure "
                                      f"after minibatch {state.step}")
        # -- pass end
        if state.block["steps"]:
            state.train_seconds += state.block["wall_s"]
            log_block(p, lr)
        if p.last_in_unit:
            u_loss, u_frames, u_correct = allreduce(
                [state.unit["loss_sum"], state.unit["frames"], state.unit["correct"]], "sum")
            state.last_unit_train = {"unit": p.unit, "loss": u_loss / max(u_frames, 1.0),
                                     "frame_acc": u_correct / max(u_frames, 1.0)}
            state.unit = _zero_acc()
            metric = state.last_unit_train["loss"]
            if dev_index is not None:
                state.last_dev = _dev_metrics(model, storage, dev_index, norm, tc, stack,
                                              device, p.unit, state)
                metric = state.last_dev["loss"]
                metrics.add({"kind": "dev", **state.last_dev})
            sched.end_unit(p.unit, metric)
            metrics.add({"kind": "unit", "unit": p.unit, "step": state.step,
                         "frames_seen": state.frames_seen,
                         "train_loss": state.last_unit_train["loss"],
                         "train_frame_acc": state.last_unit_train["frame_acc"],
                         "schedule": sched.history[-1], "time": time.time()})
        state.pass_index = sched.next_pass(p.index)
        state.batch = 0
        save_checkpoint()

    # -- the end
    if progress is not None:
        progress.close()
    algo.finalize()
    final_dev = None
    if dev_index is not None:
        final_dev = _dev_metrics(model, storage, dev_index, norm, tc, stack, device, None, state)
    result: dict[str, Any] = {"rank": rank, "world": world}
    if rank == 0:
        metrics.add({"kind": "final", "step": state.step, "frames_seen": state.frames_seen,
                     **({"dev_loss": final_dev["loss"], "dev_frame_acc": final_dev["frame_acc"]}
                        if final_dev else {}), "time": time.time()})
        state.flushes += 1
        metrics.flush(state.step, state.flushes)
        records = metrics.records()
        storage.write_text(join(train_dir, "metrics.jsonl"),
                           "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        try:
            from training.curves import plot_learning_curve

            storage.write_bytes(join(train_dir, "learning_curve.png"),
                                plot_learning_curve(records, title=f"{kind} ({tc.recipe})"))
        except Exception as exc:  # noqa: BLE001 - a plot never fails a training
            log.warning("learning curve not written: %s", exc)
        summary = _summary(plan, wc, model, algo, state, sched, final_dev, counts, totals,
                           resumed_from, records, time.time() - t_start)
        model_uri = join(train_dir, "model.pt")
        nbytes = save_model(storage, model_uri, model, cmvn=plan.get("cmvn"),
                            phones=plan.get("phones"), features=wc.raw.get("features"),
                            info={"run_id": plan.get("run_id"), "train_dir": train_dir,
                                  "recipe": tc.recipe, "algorithm": tc.algorithm,
                                  "workers": world, "metrics": summary["metrics"]})
        summary["model_uri"] = model_uri
        summary["model_bytes"] = nbytes
        result.update(summary)
    barrier()
    return result


def _mix(*parts: Any) -> int:
    """A stable 32-bit seed from small integers."""
    ss = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts])
    return int(ss.generate_state(1)[0])


def _dev_metrics(model, storage, dev_index, norm, tc, stack, device, unit, state) -> dict:
    s = score_index(model, storage, dev_index, norm, tc, stack, device)
    loss_sum, frames, correct = allreduce([s["loss_sum"], s["frames"], s["correct"]], "sum")
    return {"unit": unit, "step": state.step, "frames_seen": state.frames_seen,
            "loss": loss_sum / max(frames, 1.0), "frame_acc": correct / max(frames, 1.0),
            "frames": frames, "time": time.time()}


def _nonfinite_msg(what: str, value: float, p: PassInfo, state: TrainState,
                   ckpt: Checkpointer) -> str:
    latest = ckpt.latest()
    where = f"checkpoint {latest['name']} (step {latest['step']})" if latest else "no checkpoint"
    return (f"non-finite {what} ({value}) at minibatch {state.batch} of pass {p.index} "
            f"({p.kind} data, {p.mode} mode, unit {p.unit}; global step {state.step + 1}); "
            f"the model was not updated. The last good state is {where}. Lower train.lr, "
            "set train.clip_grad_norm / train.max_change, or check the input features.")


def _summary(plan, wc, model, algo, state, sched, final_dev, counts, totals, resumed_from,
             records, wall) -> dict[str, Any]:
    train_recs = [r for r in records if r.get("kind") == "train"]
    fps = [r["frames_per_s"] for r in train_recs if r.get("frames_per_s")]
    frames_total = sum(r["frames"] for r in train_recs)
    compute = sum(r.get("compute_s", 0.0) for r in train_recs)
    metrics: dict[str, Any] = {
        "model": plan["kind"], "recipe": wc.train.recipe, "algorithm": wc.train.algorithm,
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
    if final_dev is not None:
        metrics["dev_frame_acc"] = final_dev["frame_acc"]
        metrics["dev_loss"] = final_dev["loss"]
        metrics["dev_frames"] = final_dev["frames"]
    rows_in, used, rejected = (int(v) for v in totals)
    return {"metrics": metrics, "counts": {"in": rows_in, "out": used, "rejected": rejected},
            "resumed_from_step": resumed_from, "wall_s": round(wall, 3),
            "minibatches_per_pass": counts}
