"""One validated config schema for every step, one file per section.

The schema is a tree of dataclasses (schema.Config at the root, a section per file here).
A YAML file and `--set a.b=c` overrides are merged onto the defaults (loading.py); an
unknown key, a wrong type or an out-of-range value raises `ConfigError` naming the dotted
key. Steps receive the typed `Config` object; libraries take the section they need.
"""
from core.config.errors import ConfigError  # noqa: F401
from core.config.platform import S3Config, StorageConfig, DataConfig, RayConfig, RunnerConfig, CostConfig  # noqa: F401
from core.config.corpus import CorpusConfig, IngestConfig  # noqa: F401
from core.config.pipeline import SelectConfig, FeaturesConfig, LABEL_KEYS, features_dict, TargetsConfig, RepartitionConfig  # noqa: F401
from core.config.model import StudentConfig, TeacherConfig, ModelConfig  # noqa: F401
from core.config.train import AugmentConfig, SEQUENCE_RECIPE, GROW_RECIPE, OptimConfig, PassesConfig, BatchesConfig, DistillConfig, MaskingConfig, AlgoConfig, SequenceConfig, CheckpointsConfig, TRAIN_SECTIONS, TrainConfig, TRAIN_KEYS, TRAIN_KEY_ORDER, train_key_type, replace_train  # noqa: F401
from core.config.decode import EvaluateConfig, LmConfig, DecodeConfig, ReportConfig  # noqa: F401
from core.config.serve import ServeConfig, SimulateConfig, BenchConfig  # noqa: F401
from core.config.align import AlignConfig  # noqa: F401
from core.config.schema import Config, user_keys  # noqa: F401
from core.config.loading import parse_override, check_override, load_config, with_overrides, NOT_IN_A_GROWN_RECIPE, config_to_yaml  # noqa: F401
