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
from core.config.model import StudentConfig, TeacherConfig, CtcConfig, ModelConfig  # noqa: F401
from core.config.train import (AlgoConfig, AugmentConfig, BatchesConfig, CheckpointsConfig, DistillConfig, GROW_PRESET, MaskingConfig, OptimConfig, PassesConfig, SEQUENCE_PRESET, SequenceConfig, TRAIN_KEY_ORDER, TRAIN_KEYS, TRAIN_SECTIONS, TrainConfig, replace_train, train_key_type)  # noqa: F401
from core.config.decode import EvaluateConfig, LmConfig, DecodeConfig, ReportConfig  # noqa: F401
from core.config.pseudolabel import PseudolabelConfig  # noqa: F401
from core.config.serve import ServeConfig, SimulateConfig, BenchConfig, ExportConfig  # noqa: F401
from core.config.align import AlignConfig  # noqa: F401
from core.config.daily import DailyConfig  # noqa: F401
from core.config.schema import Config, user_keys  # noqa: F401
from core.config.loading import Resolved, check_override, config_to_yaml, grown_stage, load_config, parse_override, phone_stage, resolve_config, with_overrides  # noqa: F401
from core.config.overlays import NOT_IN_A_GROWN_PRESET, OLD_KEYS  # noqa: F401
