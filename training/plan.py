"""What every training worker receives: the typed `WorkerPlan`.

`training.launch.build_plan` resolves a training's inputs once, on the driver (partitions
per split, CMVN, classes, feature dim, the starting model), into one frozen `WorkerPlan`.
The same object reaches `training.loop.train_worker` in-process (one worker), through
`spawn_local` (tests, benchmarks) and as Ray Train's `train_loop_config` (Ray pickles
dataclasses), so the config stays the typed `Config` all the way: no dict round trips.

Plain data only (no torch, no Ray), so the driver can build a plan cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config import Config


@dataclass(frozen=True)
class LaunchSpec:
    """How `training.distributed.run_distributed` runs the workers on Ray Train."""

    storage_path: str = ""  # Ray Train's persistent storage: <train_dir>/ray (set by training.launch)
    name: str = ""  # the Ray Train experiment name; "" = <run_id>-<algorithm>
    max_failures: int = 2  # worker-group restarts (FailureConfig)
    num_to_keep: int = 2  # reported checkpoints kept (CheckpointConfig)
    cpus_per_worker: float = 0.0  # 0 = min(1, cluster CPUs / train.workers)


@dataclass(frozen=True)
class Growth:
    """How a phone-class init model's output layer becomes this run's leaves
    (training/grow.py): for each leaf, the init model's class of its phone and the log of
    the leaf's share of that phone's labeled frames (added to the copied bias)."""

    sources: tuple[int, ...]
    log_shares: tuple[float, ...]


@dataclass(frozen=True)
class WorkerPlan:
    """One training, as every worker runs it (rank and world size come from
    torch.distributed inside the worker)."""

    cfg: Config  # train, model, storage, features, data, corpus and ray sections are read
    run_id: str
    train_dir: str  # URI of the output dir: runs/<R>/train[-<tag>] or sequence[-<tag>]
    kind: str  # teacher | student
    # {"labeled": [partition URIs], "unlabeled": [...], "dev": [...]}: the splits the
    # recipe needs (dev absent when there is none).
    splits: dict[str, list[str]]
    cmvn: dict[str, Any] | None  # features/cmvn.json ({count, sum, sumsq})
    phones: list[str]  # class names (features/phones.json); may be empty
    num_classes: int
    feat_dim: int  # input feature dim (192 for 64 mel bins stacked 3)
    stack: int  # features.stack (frame offsets rotate over 0..stack-1)
    # model.pt URI to start from (the sequence recipe's CE model, or train.init_model)
    init_model: str | None = None
    grow: Growth | None = None  # its output layer grown into this run's leaves
    # features/context.json (features.labels=align): the network tree the classes are the
    # leaves of; the model card carries it (ModelCard.context). None: phone classes.
    context: dict[str, Any] | None = None
    # train.grow's phone stage: the stored labels are this tree's leaves (the run's
    # features/context.json), each trained on as its phone, the class of `context` (the
    # tree's phone_tree()). None: the labels are the plan's classes.
    label_tree: dict[str, Any] | None = None
    # what the training reads besides its config, by identity (training.launch.
    # training_inputs): a checkpoint resumes only into a training of the same inputs
    inputs: dict[str, Any] = field(default_factory=dict)
    # train.model ctc: the tokenizer and the tokenised transcripts (training/ctc/data.py)
    ctc: Any = None  # training.ctc.data.CtcData
    # the folder of the pseudolabel step train.pseudolabels names (the app resolves it):
    # the CTC student's extra transcripts, the sequence regime's unlabeled references
    pseudolabels_dir: str | None = None
    progress: bool = True  # print progress on rank 0
    # repartition/window.json: the daily_data partitions (intervals, digests) trained on
    # beside the run's own data; the model card records it. None: no window.
    data_window: dict[str, Any] | None = None
    launch: LaunchSpec = field(default_factory=LaunchSpec)

    def training_uris(self) -> list[str]:
        """The partitions trained on (every split but dev)."""
        return [u for kind, uris in self.splits.items() if kind != "dev" for u in uris]
