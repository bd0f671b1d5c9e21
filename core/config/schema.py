"""The root of the schema: `Config`, one field per section, and its cross-section checks."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from core.config.align import AlignConfig
from core.config.corpus import CorpusConfig, IngestConfig
from core.config.daily import DailyConfig
from core.config.decode import DecodeConfig, EvaluateConfig, LmConfig, ReportConfig
from core.config.errors import check
from core.config.model import ModelConfig
from core.config.pipeline import FeaturesConfig, RepartitionConfig, SelectConfig, TargetsConfig
from core.config.pseudolabel import PseudolabelConfig
from core.config.platform import CostConfig, DataConfig, RayConfig, RunnerConfig, StorageConfig
from core.config.serve import BenchConfig, ExportConfig, ServeConfig, SimulateConfig
from core.config.train import TRAIN_KEYS, TRAIN_KEY_ORDER, TrainConfig, train_key_type

@dataclass
class Config:
    storage: StorageConfig = field(default_factory=StorageConfig)
    data: DataConfig = field(default_factory=DataConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    targets: TargetsConfig = field(default_factory=TargetsConfig)
    repartition: RepartitionConfig = field(default_factory=RepartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    lm: LmConfig = field(default_factory=LmConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    pseudolabel: PseudolabelConfig = field(default_factory=PseudolabelConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    align: AlignConfig = field(default_factory=AlignConfig)
    daily: DailyConfig = field(default_factory=DailyConfig)

    def validate(self, key: str) -> None:
        """What no one section can check: with features.labels=align the network's classes
        are the leaves of its tree, and the tree alone counts them (align.nn_senones bounds
        the leaves align grows; a tree taken from a teacher has its own count), so
        model.num_classes saying the number a second time is refused."""
        check(self.features.labels != "align" or self.model.num_classes == 0,
              "model.num_classes",
              f"must be 0 with features.labels=align, got {self.model.num_classes}: the "
              "classes are the network tree's leaves and the tree counts them (align."
              "nn_senones says how many to grow at most); remove the key")

    def to_dict(self) -> dict[str, Any]:
        """The user-facing mapping (`train.*` flat, as YAML spells it): load_config of it
        gives this config back."""
        return to_data(self)

    def get(self, dotted: str) -> Any:
        """The value of a user key, e.g. `train.lr` (found in its section)."""
        node: Any = self
        for part in dotted.split("."):
            if isinstance(node, TrainConfig) and part in TRAIN_KEYS:
                node = node._holder(part)
            node = getattr(node, part)
        return node


def to_data(obj: Any) -> Any:
    """A config dataclass as the plain mapping a user writes (TrainConfig: flat keys)."""
    if isinstance(obj, TrainConfig):
        return obj.to_flat()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_data(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_data(v) for k, v in obj.items()}
    return obj


def user_keys() -> list[tuple[str, bool]]:
    """Every key a user may set (YAML, `--set`, a DAG's overrides), dotted as they write it
    (`train.lr`: train's flat keys, not its internal sections), and whether it holds a
    mapping (`runner.env`: any sub-key, `runner.env.X`, may be set)."""
    def walk(cls: type, prefix: str) -> list[tuple[str, bool]]:
        if cls is TrainConfig:
            fields = [(k, train_key_type(k)) for k in TRAIN_KEY_ORDER]
        else:
            hints = typing.get_type_hints(cls)
            fields = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
        out = []
        for name, tp in fields:
            key = f"{prefix}{name}"
            if dataclasses.is_dataclass(tp):
                out += walk(tp, key + ".")
            else:
                out.append((key, typing.get_origin(tp) is dict or tp is Any))
        return out

    return walk(Config, "")
