"""Where a trainer's minibatches come from: one interface, two sources.

`InputSource` is what `training.loop.Trainer` reads a pass from:

    num_batches(p)           this worker's minibatches in pass `p`, known before the pass
                             starts (the trainer takes the minimum over the workers, so
                             that synchronous algorithms run the same number of steps)
    open(p, start, limit)    a `PassStream` over minibatches [start, limit) of pass `p`
                             (start > 0 on resume): iterable of `training.data.Batch`,
                             with `wait_s`, the seconds the consumer waited for input
    totals()                 (rows in, rows usable, rows rejected) of this worker's data
    rejected()               {reason: count} of the rows that cannot be trained on
    pass_metrics(p)          per-pass metrics of the source (example servers: examples/s,
                             CPU cores used); {} for stored partitions
    close()

`StoredPartitions` reads the repartition step's Parquet partitions (`training.data`): the
same rendering of every utterance every epoch. `training.example_servers.ExampleServers`
re-renders the labeled utterances on a CPU pool each epoch and streams them in.

Both are fully determined by (train.seed, pass, rank), which is what makes a resumed
training bitwise equal to an uninterrupted one: a pass is re-opened at the minibatch the
checkpoint recorded.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import numpy as np

from core.config import TrainConfig
from core.outcomes import StepError
from core.storage import Storage
from training.data import (Batch, BatchLoader, Normalizer, PassSpec, SplitIndex, plan_pass,
                           rank_partitions)
from training.families import get_family
from training.schedules import PassInfo


class PassStream(Protocol):
    wait_s: float

    def __iter__(self) -> Iterator[Batch]: ...


class InputSource(Protocol):
    def num_batches(self, p: PassInfo) -> int: ...

    def open(self, p: PassInfo, start: int, limit: int) -> PassStream: ...

    def totals(self) -> tuple[int, int, int]: ...

    def rejected(self) -> dict[str, int]: ...

    def pass_metrics(self, p: PassInfo) -> dict[str, Any]: ...

    def close(self) -> None: ...


def mix_seed(*parts: Any) -> int:
    """A stable 32-bit seed from small integers."""
    ss = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts])
    return int(ss.generate_state(1)[0])


def pass_spec(tc: TrainConfig, p: PassInfo, rank: int, stack: int, right: int) -> PassSpec:
    """How pass `p` cuts and shuffles a worker's data (seeded by train.seed, pass, rank)."""
    if p.kind == "unlabeled":
        order_seed, span = (tc.seed, 1, rank), (p.sub_epoch / p.sub_epochs,
                                                (p.sub_epoch + 1) / p.sub_epochs)
    else:
        order_seed, span = (tc.seed, 2, p.index, rank), (0.0, 1.0)
    b = tc.batches
    return PassSpec(mode=p.mode, offset=p.offset if p.kind == "labeled" else 0, stack=stack,
                    chunk_frames=b.chunk_frames, left_context=b.chunk_left_context,
                    right_context=int(right), minibatch_frames=b.minibatch_frames,
                    shuffle=True, shuffle_partitions=b.shuffle_partitions,
                    seed=mix_seed(tc.seed, 3, p.index, rank), order_seed=mix_seed(*order_seed),
                    span=span, sortagrad=tc.passes.sortagrad and p.unit == 0)


SPLIT_TARGETS = {"labeled": "labels", "unlabeled": "topk"}


class StoredPartitions:
    """This worker's share (`partitions[rank::world]`) of the stored training splits."""

    def __init__(self, storage: Storage, tc: TrainConfig, splits: dict[str, list[str]],
                 kinds: set[str], rank: int, world: int, feat_dim: int, stack: int,
                 right: int, norm: Normalizer,
                 transcripts: dict[str, np.ndarray] | None = None, out_per_row: float = 1.0):
        """`transcripts` (utt_id -> token ids): the CTC student's targets, for every split."""
        self.storage, self.tc, self.rank = storage, tc, rank
        self.stack, self.right, self.norm = stack, right, norm
        split_names = {"labeled": tc.batches.labeled_split, "unlabeled": tc.batches.unlabeled_split}
        self.indexes: dict[str, SplitIndex] = {}
        for k in sorted(kinds):
            uris = splits.get(k) or []
            if not uris:
                raise StepError(f"recipe '{tc.recipe}' needs the '{split_names[k]}' split, "
                                "which has no partitions")
            mine = rank_partitions(uris, rank, world, split_names[k])
            target = SPLIT_TARGETS[k] if transcripts is None else "tokens"
            self.indexes[k] = SplitIndex.load(storage, mine, target, feat_dim, transcripts,
                                              out_per_row)

    def spec(self, p: PassInfo) -> PassSpec:
        return pass_spec(self.tc, p, self.rank, self.stack, self.right)

    def num_batches(self, p: PassInfo) -> int:
        return plan_pass(self.indexes[p.kind], self.spec(p)).num_batches

    def open(self, p: PassInfo, start: int, limit: int) -> BatchLoader:
        # the sequence recipe's pseudo-labeled rows carry their utterance (its confidence)
        keep_utts = p.kind == "unlabeled" and self.tc.recipe == "sequence"
        loader = BatchLoader(self.storage, self.indexes[p.kind], self.spec(p), self.norm,
                             start=start, prefetch=self.tc.batches.prefetch, keep_utts=keep_utts)
        loader.set_limit(limit)
        return loader

    def totals(self) -> tuple[int, int, int]:
        ix = self.indexes.values()
        return (sum(i.rows_in for i in ix), sum(len(i) for i in ix),
                sum(i.num_rejected for i in ix))

    def rejected(self) -> dict[str, Any]:
        return {k: ix.rejected for k, ix in self.indexes.items()}

    def pass_metrics(self, p: PassInfo) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def epoch_minibatches(tc: TrainConfig, indexes: list[SplitIndex], stack: int) -> int:
    """A worker's minibatches in one epoch over `indexes` (the labeled data): its first
    pass as plan_pass cuts it (chunks, or whole utterances for a family trained on them),
    the partitions shared evenly by train.workers. What train.min_updates is divided by
    (amflow/services/train_plan.py)."""
    whole = get_family(tc.model).whole_utterances
    first = PassInfo(0, 0, "labeled", "full" if whole else "chunk", 0, 0, 1, 1.0, True)
    spec = pass_spec(tc, first, 0, stack, 0)  # the right context cuts no more minibatches
    total = sum(plan_pass(index, spec).num_batches for index in indexes)
    return max(1, total // tc.workers)

